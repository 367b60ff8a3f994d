"""Draw compared tables as a chart with matplotlib's non-interactive backend.

Per publication three panels: published vs reproduced as paired bars per cell with interval
whiskers, not-derivable and missing cells marked; the delta of each cell against its tolerance;
the scaling efficiency of each column, reproduced and published.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.redact import shown
from repro.verdict.report import BAD, GOOD, groups, is_cpu
from repro.verdict.reproduce import CellResult, TableResult
from repro.verdict.rules import INTERVAL, NOT_RUN

PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
BAR_COLOUR = {**{v: "#2f855a" for v in GOOD}, **{v: "#c53030" for v in BAD}}
OTHER_COLOUR = "#d69e2e"  # inconclusive, not run
Column = tuple[str, str]


def plot_format(path: Path) -> str | None:
    """The chart format a file name asks for (None: one the kit does not write)."""
    return PLOT_FORMATS.get(path.suffix.lower())


def plot_report(results: Sequence[TableResult], path: Path | io.BytesIO, fmt: str = "png") -> None:
    """Per publication: published vs reproduced as paired bars per cell with interval whiskers,
    not-derivable and missing cells marked; the delta of each cell against its tolerance; the
    scaling efficiency of each column, reproduced and published."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = groups(results)
    fig, axes = plt.subplots(3 * len(found), 1, figsize=(13, 10.5 * len(found)), dpi=150,
                             gridspec_kw={"height_ratios": [3, 2, 2] * len(found)}, squeeze=False)
    for gi, group in enumerate(found):
        _draw_group(group, axes[3 * gi][0], axes[3 * gi + 1][0], axes[3 * gi + 2][0])
    plain_text(fig)
    fig.tight_layout(h_pad=3)
    try:
        fig.savefig(path, format=fmt)
    finally:
        plt.close(fig)


def _draw_group(group: Sequence[TableResult], ax: Any, dev: Any, eff: Any) -> None:
    """One publication's three panels: figures (``ax``), deltas (``dev``), scaling efficiency (``eff``)."""
    cpu = is_cpu(group[0])
    cells = [c for r in group for c in r.cells]
    cols = list(dict.fromkeys((c.column, c.column_key) for c in cells))
    rows = sorted({(c.gpus, c.nodes) for c in cells})
    pos, labels = _draw_cells(ax, dev, cells, cols, rows, cpu)
    _delta_axes(ax, dev, pos, labels)
    _column_names(ax, cells, cols, pos)
    _figure_axes(ax, group, cells)
    _efficiency_lines(eff, cells, cols)
    _say_why_empty(dev, eff)
    _efficiency_axes(eff, rows, cpu)


def _draw_cells(ax: Any, dev: Any, cells: Sequence[CellResult], cols: Sequence[Column],
                rows: Sequence[tuple[int, int]], cpu: bool) -> tuple[list[float], list[str]]:
    """Each cell's bars and delta, column by column, a gap between columns: the x positions and labels."""
    x, labels, pos = 0.0, [], []
    for col in cols:
        for gpus, nodes in rows:
            c = next((c for c in cells
                      if (c.column, c.column_key) == col and (c.gpus, c.nodes) == (gpus, nodes)), None)
            if c is None:
                continue
            _cell_bars(ax, c, x)
            _cell_delta(dev, c, x)
            labels.append(f"{gpus}{'w' if cpu else 'g'}")
            pos.append(x)
            x += 1
        x += 0.6
    return pos, labels


def _cell_bars(ax: Any, c: CellResult, x: float) -> None:
    """The published bar, the reproduced bar with its interval, the verdict above a cell that does not
    match."""
    figures = [v for v in (float(c.published) if c.published else None, c.reproduced) if v is not None]
    top = max(figures) if (c.published or c.reproduced is not None) else 0
    if c.published:
        ax.bar(x - 0.2, float(c.published), 0.4, color="#9aa5b1", edgecolor="#52606d")
    if c.reproduced is not None:
        err = None
        if c.low is not None and c.high is not None:
            err = [[max(c.reproduced - c.low, 0)], [max(c.high - c.reproduced, 0)]]
        ax.bar(x + 0.2, c.reproduced, 0.4, color=BAR_COLOUR.get(c.verdict, OTHER_COLOUR), yerr=err, capsize=3,
               ecolor="black")
    if c.verdict not in GOOD:  # above the bars; a cell without a figure: from the panel's foot
        ax.annotate(c.verdict, (x + 0.2, top) if top else (x + 0.2, 0),
                    xycoords="data" if top else ("data", "axes fraction"), xytext=(0, 4),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7, rotation=90,
                    color="#c53030" if c.verdict in BAD else "#975a16")


def _cell_delta(dev: Any, c: CellResult, x: float) -> None:
    """The cell's delta with its interval and tolerance band; a cell without one says why."""
    if c.delta_pct is not None and c.published:
        pub = float(c.published)
        err = None
        if c.low is not None and c.high is not None:
            err = [[max(c.delta_pct - (c.low - pub) / pub * 100, 0)],
                   [max((c.high - pub) / pub * 100 - c.delta_pct, 0)]]
        dev.errorbar([x], [c.delta_pct], yerr=err, fmt="o", color=BAR_COLOUR.get(c.verdict, OTHER_COLOUR),
                     ecolor="black", capsize=3)
        if c.tolerance_pct is not None:
            dev.fill_between([x - 0.45, x + 0.45], -c.tolerance_pct, c.tolerance_pct, color="#2f855a",
                             alpha=0.12, linewidth=0)
    elif c.verdict not in GOOD and c.verdict != NOT_RUN:  # amid the panel, whatever its range
        dev.annotate(c.verdict, (x, 0.5), xycoords=("data", "axes fraction"), ha="center", fontsize=7,
                     rotation=90, va="center", color="#975a16")


def _delta_axes(ax: Any, dev: Any, pos: list[float], labels: list[str]) -> None:
    ax.set_xticks(pos, labels, fontsize=8)
    dev.set_xticks(pos, labels, fontsize=8)
    dev.set_xlim(ax.get_xlim())
    dev.axhline(0, color="grey", linewidth=1)
    dev.set_ylabel("reproduced − published (%)")
    dev.set_title("Delta from the published figure; whiskers: the interval, green band: the tolerance",
                  fontsize=10)
    dev.grid(True, axis="y", alpha=0.3)


def _column_names(ax: Any, cells: Sequence[CellResult], cols: Sequence[Column], pos: list[float]) -> None:
    """Framework and precision under each group of bars."""
    starts = 0
    for col in cols:
        n = sum(1 for c in cells if (c.column, c.column_key) == col)
        if n:
            mid = (pos[starts] + pos[starts + n - 1]) / 2
            name = "\n".join([*textwrap.wrap(col[0], 14), col[1]])  # a narrow group's name never runs wide
            ax.annotate(name, (mid, 0), xytext=(0, -22), textcoords="offset points",
                        xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=7)
            starts += n


def _figure_axes(ax: Any, group: Sequence[TableResult], cells: Sequence[CellResult]) -> None:
    from matplotlib.patches import Patch

    ax.set_yscale("log")
    values = [v for c in cells for v in (float(c.published) if c.published else None, c.reproduced) if v]
    if values:
        ax.set_ylim(min(values) / 2, max(values) * 6)  # room for the marks above the bars
    ax.set_ylabel(group[0].manifest.unit + " (log scale)")
    ax.set_title(_title(group), fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(handles=[Patch(color="#9aa5b1", label="published"),
                       Patch(color="#2f855a", label="reproduced / match"),
                       Patch(color="#c53030", label="slower, faster, deviates,\nnot derivable"),
                       Patch(color=OTHER_COLOUR, label="inconclusive"),
                       Patch(color="white", label="\n".join(textwrap.wrap(f"whiskers: {INTERVAL}", 28)))],
              fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1))  # beside the panel: the marks above the bars never run into it


def _efficiency_lines(eff: Any, cells: Sequence[CellResult], cols: Sequence[Column]) -> None:
    """Per column the reproduced scaling efficiency (solid) and the publication's own (dashed)."""
    for col in cols:
        pts = sorted((c.gpus, c.efficiency) for c in cells
                     if (c.column, c.column_key) == col and c.efficiency is not None)
        pub = sorted((c.gpus, float(c.published)) for c in cells
                     if (c.column, c.column_key) == col and c.published)
        colour = None
        if len(pts) > 1:
            line, = eff.plot([p[0] for p in pts], [p[1] * 100 for p in pts], "o-", label=f"{col[0]} {col[1]}")
            colour = line.get_color()
        if len(pub) > 1:  # the publication's own scaling, with or without a reproduced one beside it
            g0, v0 = pub[0]
            eff.plot([g for g, _ in pub], [v / v0 / (g / g0) * 100 for g, v in pub], "--", color=colour,
                     alpha=0.6, label=None if colour else f"{col[0]} {col[1]} (published)")


def _say_why_empty(dev: Any, eff: Any) -> None:
    """Say why a panel is empty, once, instead of a label per cell."""
    no_delta = not dev.collections and not dev.lines[1:] and not dev.texts  # texts: each cell says why
    for panel, empty in ((dev, no_delta), (eff, not eff.lines)):
        if empty:
            panel.text(0.5, 0.5, "no reproduced figure: every cell is not run (no log)",
                       transform=panel.transAxes, ha="center", va="center", fontsize=9, color="#975a16")


def _efficiency_axes(eff: Any, rows: Sequence[tuple[int, int]], cpu: bool) -> None:
    ticks = sorted({g for g, _ in rows})
    eff.set_xscale("log", base=2)
    eff.set_xticks(ticks, [str(t) for t in ticks])
    eff.minorticks_off()
    eff.axhline(100, color="grey", linestyle=":", linewidth=1)
    eff.set_ylabel("scaling efficiency (% of linear)")
    eff.set_xlabel("workers" if cpu else "GPUs")
    eff.set_title("Scaling efficiency: reproduced (solid), published (dashed)", fontsize=10)
    eff.grid(True, alpha=0.3)
    if [ln for ln in eff.lines if not ln.get_label().startswith("_")]:
        eff.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


def _title(group: Sequence[TableResult]) -> str:
    t = group[0].table
    text = f"{t.cite['title']} ({t.id})" if t else f"{group[0].manifest.title}"
    return "\n".join(textwrap.wrap(text, 100))


def plain_text(fig: Any) -> None:
    """Titles, axis labels, marks and legends come from manifests and logs: drawn as plain text, never
    parsed as math (``$...$`` would be; a bad formula stops the drawing), secrets and control characters
    removed. Tick labels keep math (log axes)."""
    for ax in fig.axes:
        legend = ax.get_legend()
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts, *(legend.get_texts() if legend else [])]
        for t in texts:
            t.set_parse_math(False)
            t.set_text(shown(t.get_text()))
