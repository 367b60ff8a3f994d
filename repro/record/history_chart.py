"""``repro history --plot``: each cell over time, one panel a cell (figures of 1 and 32 GPUs differ too much
to read on one axis): one series a cluster (runs of different clusters are different machines: never joined
into one line), each run's figure with its interval (95% Student-t interval of the mean of its repeats) as an
error bar, the published figure as a dashed line inside its tolerance band (the run tolerance the runs were
judged with). Drawn with matplotlib's non-interactive backend, text as plain text (as the report's chart:
:func:`repro.verdict.chart.plain_text`); one legend above the panels, its rows counted so that it never
runs into the title or the panels."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from repro.record.history import CellHistory
from repro.verdict.chart import plain_text
from repro.verdict.rules import DEFAULT_RUN_TOLERANCE, INTERVAL

PUBLISHED, BAND = "#4a5568", "#a0aec0"
#: one colour a cluster (colour-blind safe, Okabe-Ito), in the order the clusters first appear
COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442")
NO_CLUSTER = "no cluster named"
LEGEND_COLUMNS = 3


def _when(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")


def clusters(histories: Sequence[CellHistory]) -> list[str]:
    """Every cluster the runs were recorded under, in the order they first appear."""
    return list(dict.fromkeys(r["cluster"] or NO_CLUSTER for h in histories for r in map(h.run, h.runs)))


def history_figure(histories: Sequence[CellHistory], title: str = "") -> Any:
    """The chart as a matplotlib figure (the caller saves and closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = clusters(histories)
    colour = {c: COLOURS[i % len(COLOURS)] for i, c in enumerate(names)}
    cols = 1 if len(histories) == 1 else 2
    rows = math.ceil(len(histories) / cols)
    legend_rows = math.ceil((len(names) + 3) / LEGEND_COLUMNS)  # the clusters, interval, published, band
    top = 0.4 + 0.2 * legend_rows  # inches above the panels: the title and the legend
    height = top + 3.0 * rows
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, height), dpi=130, squeeze=False, sharex=True)
    for ax, h in zip(axes.flat, histories):
        _draw_cell(ax, h, colour)
    for i, ax in enumerate(axes.flat):
        if i >= len(histories):
            ax.set_visible(False)
        elif i + cols >= len(histories):  # no panel below it: its dates are shown under it
            ax.xaxis.set_tick_params(labelbottom=True)
    fig.suptitle(title or "Each cell over time beside its published figure", fontsize=11,
                 y=1 - 0.08 / height)
    _legend(fig, axes, top=1 - 0.4 / height)
    plain_text(fig)
    fig.tight_layout(rect=(0, 0, 1, 1 - top / height))
    return fig


def plot_history(histories: Sequence[CellHistory], path: Path | io.BytesIO, fmt: str = "png",
                 title: str = "") -> None:
    import matplotlib.pyplot as plt

    fig = history_figure(histories, title)
    try:
        fig.savefig(path, format=fmt, bbox_inches="tight")
    finally:
        plt.close(fig)


def tolerance(h: CellHistory) -> float:
    """The run tolerance the cell's runs were judged with (the latest recorded), else the kit's default."""
    for r in reversed([h.run(x) for x in h.runs]):
        if r.get("tolerance_pct") is not None:
            return float(r["tolerance_pct"])
    return float(DEFAULT_RUN_TOLERANCE["pct"])  # type: ignore[arg-type]


def _draw_cell(ax: Any, h: CellHistory, colour: dict[str, str]) -> None:
    import matplotlib.dates as mdates

    runs = [r for r in map(h.run, h.runs) if r["value"] is not None]
    for name in colour:
        mine = [r for r in runs if (r["cluster"] or NO_CLUSTER) == name]
        if not mine:
            continue
        xs, ys = [_when(r["started"]) for r in mine], [r["value"] for r in mine]
        ax.plot(xs, ys, "o-", color=colour[name], markersize=4, linewidth=1.4, label=name)
        banded = [(x, r) for x, r in zip(xs, mine) if r["low"] is not None and r["high"] is not None]
        if banded:
            below = [r["value"] - r["low"] for _, r in banded]
            above = [r["high"] - r["value"] for _, r in banded]
            ax.errorbar([x for x, _ in banded], [r["value"] for _, r in banded], yerr=[below, above],
                        fmt="none", ecolor=colour[name], elinewidth=1, capsize=3, label=f"bar: {INTERVAL}")
    if h.published:
        pub, tol = float(h.published), tolerance(h)
        ax.axhspan(pub * (1 - tol / 100), pub * (1 + tol / 100), color=BAND, alpha=0.25, linewidth=0,
                   label=f"tolerance band: published ±{tol:g}%")
        ax.axhline(pub, color=PUBLISHED, linestyle="--", linewidth=1.2, label="published figure")
    else:
        ax.text(0.5, 0.92, "no published figure", transform=ax.transAxes, ha="center", fontsize=8)
    name = f"{h.table}: {h.title}" if h.table else h.title
    ax.set_title("\n".join(textwrap.wrap(name, 72)), fontsize=9)
    ax.set_ylabel(h.unit or "images/s", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.tick_params(labelsize=7)


def _legend(fig: Any, axes: Any, top: float) -> None:
    """One legend for every panel: each label once (the clusters, the interval, the published figure and
    its band), in the order drawn."""
    seen: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper center", ncol=LEGEND_COLUMNS, fontsize=8,
                   bbox_to_anchor=(0.5, top), frameon=False)
