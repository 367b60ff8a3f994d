"""Render compared tables: the published layout side by side with the reproduction.

Pure functions from TableResult objects to text: a terminal form that fits 120 columns
(colour on request), full-width markdown, tidy long-form CSV and JSON records (one row per
table, target and cell), JUnit XML (one testcase per cell) and a self-contained HTML page;
the CLI prints them. ``plot_report`` draws the chart with matplotlib's non-interactive backend.
Several publications stay separate tables, each under its own citation.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from repro.redact import shown
from repro.verdict.reproduce import MATCH, CellResult, TableResult, non_monotonic
from repro.verdict.rules import (
    DEVIATES,
    FASTER,
    INCONCLUSIVE,
    INTERVAL,
    MEASURED,
    NEW_RUN,
    NOT_PUBLISHED,
    NOT_RUN,
    NOT_DERIVABLE,
    REDERIVATION,
    REPRODUCED,
    SLOWER,
    Check,
    exit_code,
)


def tabulate(*args: Any, **kwargs: Any) -> str:
    """``tabulate.tabulate``, imported on first use (it costs ``repro parse`` a fifth of its start-up)."""
    from tabulate import tabulate as render

    return render(*args, **kwargs)


WIDTH = 120  # the terminal form's widest line
GOOD, BAD, UNSURE = {MATCH, REPRODUCED, MEASURED}, {SLOWER, FASTER, DEVIATES, NOT_DERIVABLE}, {INCONCLUSIVE, NOT_RUN}
ANSI = {**{v: "32" for v in GOOD}, **{v: "31" for v in BAD}, **{v: "33" for v in UNSURE}}
HTML_COLOUR = {**{v: "#d8f0d8" for v in GOOD}, **{v: "#f8d0d0" for v in BAD}, **{v: "#fbeec2" for v in UNSURE}}
COLUMNS = ("table", "target", "framework", "kind", "nodes", "gpus", "device", "precision", "batch_size", "published",
           "reproduced", "interval_low", "interval_high", "repeats", "spread_pct", "delta_pct", "verdict", "reason",
           "unit", "tolerance_pct", "tolerance_reason", "published_speedup", "speedup", "efficiency", "log")


def _fmt(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def is_cpu(r: TableResult) -> bool:
    """A target that measures CPU workers (no publication, no GPU model expected)."""
    return r.table is None and "gpu_model" not in r.manifest.expect


def row_label(c: CellResult, cpu: bool = False) -> str:
    unit = "worker" if cpu else "GPU"
    return (f"{c.gpus} {unit}" + ("s" if c.gpus > 1 else "")
            + f" ({c.nodes} node{'s' if c.nodes > 1 else ''})")


def _paint(text: str, verdict: str, colour: bool) -> str:
    return f"\x1b[{ANSI[verdict]}m{text}\x1b[0m" if colour and verdict in ANSI else text


def cell_text(c: CellResult, colour: bool = False) -> str:
    verdict = _paint(c.verdict, c.verdict, colour)
    spread = ""
    if c.low is not None and c.high is not None and c.reproduced:
        spread = f" ±{(c.high - c.low) / 2 / c.reproduced:.1%}"
    if c.published is None:
        if c.reproduced is None:
            return f"— ({verdict})" if c.verdict != NOT_RUN else "—"
        n = len(c.repeats)
        return f"{c.reproduced:.2f}{spread}" + (f" (median of {n})" if n > 1 else "")
    if c.reproduced is None:
        return f"{c.published} → — ({verdict})"
    if c.kind == NEW_RUN:
        n = len(c.repeats)
        return f"{c.published} → {c.reproduced:.2f}{spread} ({c.delta_pct:+.2f}%, n={n}) {verdict}"
    digits = len(c.published.partition(".")[2]) + 1  # one digit more than printed shows the rounding
    delta = "exact" if c.exact else f"{c.delta_pct:+.2f}%"
    return f"{c.published} → {c.reproduced:.{digits}f} ({delta}) {verdict}"


def _groups(results: Sequence[TableResult]) -> list[list[TableResult]]:
    """One group per publication (or per measured-only target), in the order given."""
    out: dict[str, list[TableResult]] = {}
    for r in results:
        out.setdefault(r.table.id if r.table else f"target:{r.manifest.id}", []).append(r)
    return list(out.values())


def _yaml(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, default_flow_style=True, sort_keys=False, width=10**6).strip()


def protocol_text(r: TableResult) -> str:
    """The target's measure: block in its manifest's own YAML terms."""
    m = r.manifest.measure
    text = f"{r.manifest.id}: parser {m.parser}, protocol {_yaml(dict(m.protocol))}"
    text += "".join(f"; when {_yaml(dict(w))}: {_yaml(dict(p))}" for w, p in m.overrides)
    return text + (f"; repeats {_yaml(dict(m.repeats))}" if m.repeats else "")


def _kind_text(group: Sequence[TableResult]) -> str:
    kinds = {c.kind for r in group for c in r.cells if c.verdict != NOT_RUN}
    if not kinds or group[0].table is None:
        return ""
    if kinds == {NEW_RUN}:
        tol = next((c for r in group for c in r.cells if c.kind == NEW_RUN and c.tolerance_pct is not None), None)
        why = f" Tolerance ±{tol.tolerance_pct:g}% ({tol.tolerance_reason})." if tol else ""
        return ("Compared as a new run: your repeats against the published figure; the estimate is the repeats' "
                f"aggregate, ± the half-width of the {INTERVAL}.{why}")
    if kinds == {NEW_RUN} or NEW_RUN in kinds:
        return "Compared as a new run where your logs were given, by re-derivation where the publication's were."
    return ("Compared by re-derivation: each published figure from the publication's own log, exact at the published "
            "precision, or not derivable with the reason.")


def sources_line(group: Sequence[TableResult]) -> str:
    """Which cells were judged on which logs: yours (a new run), the publication's, or none (not run)."""
    cells = [c for r in group for c in r.cells if c.verdict != NOT_PUBLISHED or c.logs]
    ran = [c for c in cells if c.logs]
    counts = [(sum(c.kind == NEW_RUN for c in ran), "from your logs (new run)"),
              (sum(c.kind == REDERIVATION for c in ran), "from the publication's logs (re-derivation)"),
              (len(cells) - len(ran), "with no log (not run)")]
    return "Cells: " + ", ".join(f"{n} {what}" for n, what in counts if n) + "."


def _header(group: Sequence[TableResult]) -> list[str]:
    first = group[0]
    if first.table is None:
        out = [f"# {first.manifest.id}: {first.manifest.title}", "",
               "Measured only: this target reproduces no publication (images/s).",
               f"Measured from: {', '.join(sorted({r.source for r in group}))}."]
        if any(c.low is not None for r in group for c in r.cells):
            out.append(f"± is the half-width of the {INTERVAL}, as a share of the median.")
    else:
        cite = first.table.cite
        out = [f"# {first.table.id}: {cite['title']}", "",
               f"Published in {cite['repository']} @ {cite['commit'][:12]} `{cite['path']}` ({first.table.unit}).",
               f"Reproduced from: {', '.join(sorted({r.source for r in group}))}."]
        kind = _kind_text(group)
        out += [kind] if kind else []
        out.append(sources_line(group))
    return [*out, "", "Protocols (each manifest's measure):", "", *[f"- {protocol_text(r)}" for r in group]]


def _grid(group: Sequence[TableResult], text: Any) -> tuple[list[str], list[tuple[str, list[str]]], list[str]]:
    """(row labels, [(framework, [column headers])], ...) and the cells as text: {(row, header): text}."""
    cpu = is_cpu(group[0])
    several = len(group) > 1
    rows: dict[tuple[int, int], str] = {}
    frameworks: dict[str, list[str]] = {}
    cells: dict[tuple[str, str], str] = {}
    for r in group:
        for c in r.cells:
            label = row_label(c, cpu)
            rows[(c.gpus, c.nodes)] = label
            fw = c.column
            head = f"{fw} {c.column_key}" if several else c.column_key
            frameworks.setdefault(fw, [])
            if head not in frameworks[fw]:
                frameworks[fw].append(head)
            cells[(label, head)] = text(c)
    labels = [rows[k] for k in sorted(rows)]
    return labels, list(frameworks.items()), cells  # type: ignore[return-value]


def _tables(group: Sequence[TableResult], text: Any, width: int | None) -> list[str]:
    """The group's grid as one markdown table, or (``width``) as several that each fit it."""
    labels, frameworks, cells = _grid(group, text)
    if not any(cells.values()):
        return []
    first = "workers" if is_cpu(group[0]) else "GPUs"

    def render(heads: list[str]) -> str:
        body = [[lab, *(cells.get((lab, h), "") for h in heads)] for lab in labels]
        body = [row for row in body if any(row[1:])]
        return tabulate(body, headers=[first, *heads], tablefmt="github", disable_numparse=True)

    if width is None:
        return [render([h for _, heads in frameworks for h in heads]), ""]
    def fits(heads: list[str]) -> bool:
        return max(map(_visible_len, render(heads).splitlines())) <= width

    out: list[str] = []
    chunk: list[str] = []
    for _, heads in frameworks:  # whole frameworks side by side while they fit; a wide one column by column
        if fits([*chunk, *heads]):
            chunk += heads
            continue
        if chunk:
            out += [render(chunk), ""]
            chunk = []
        for h in heads:
            if chunk and not fits([*chunk, h]):
                out += [render(chunk), ""]
                chunk = []
            chunk.append(h)
    return out + [render(chunk), ""]


def _visible_len(line: str) -> int:
    return len(re.sub(r"\x1b\[[0-9;]*m", "", line))


def _scaling_text(c: CellResult) -> str:
    if c.speedup is None:
        return f"published x{c.published_speedup}" if c.published_speedup else ""
    pub = f"; published x{c.published_speedup}" if c.published_speedup else ""
    return f"x{c.speedup:.2f} ({c.efficiency:.0%} of linear{pub})"


def _notes(group: Sequence[TableResult]) -> list[str]:
    notes = []
    for r in group:
        cpu = is_cpu(r)
        for c in r.cells:
            where = f"{c.target} {row_label(c, cpu).split(' (')[0]} {c.column_key}"
            if len(c.repeats) > 1:
                notes.append(f"{where}: per-repeat values {', '.join(f'{v:.2f}' for v in c.repeats)}")
            if c.verdict not in (MATCH, MEASURED, REPRODUCED) and c.detail:
                notes.append(f"{where}: {c.verdict}: {c.detail}")
            notes += [f"{where}: log contradicts manifest: {f}" for f in c.flags]
        notes += [f"non-monotonic scaling: {n}" for n in non_monotonic(r.cells, "workers" if cpu else "GPUs")]
    return ["Notes:", "", *[f"- {n}" for n in notes], ""] if notes else []


def verdict_line(cells: Sequence[CellResult]) -> str:
    counts = Counter(c.verdict for c in cells)
    return "Verdict: " + ", ".join(f"{n} {v}" for v, n in counts.most_common()) + f" of {len(cells)} cells."


def _document(results: Sequence[TableResult], width: int | None, colour: bool) -> str:
    out: list[str] = []
    for group in _groups(results):
        legend = ("Each cell: published → reproduced (delta) verdict." if group[0].table
                  else "Each cell: measured images/s.")
        out += [*_header(group), "", legend, ""]
        out += _tables(group, lambda c: cell_text(c, colour), width)
        scaling = _tables(group, _scaling_text, width)
        if scaling:
            out += ["Speedup over the base cell and scaling efficiency:", "", *scaling]
        out += _notes(group)
        out += [verdict_line([c for r in group for c in r.cells]), ""]
    if width is not None:
        out = [_wrap(line, width) for line in out]
    return "\n".join(out).rstrip("\n") + "\n"


def _wrap(line: str, width: int) -> str:
    if line.startswith("|") or _visible_len(line) <= width:
        return line
    import textwrap

    indent = "  " if line.startswith("- ") else ""
    return "\n".join(textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False))


def render_markdown(results: Sequence[TableResult]) -> str:
    """Full width: one table per publication."""
    return _document(results, None, False)


def render_text(results: Sequence[TableResult], *, colour: bool = False, width: int = WIDTH) -> str:
    """For a terminal: tables split by framework to fit ``width``; verdicts coloured on request."""
    return _document(results, width, colour)


def _rel(paths: Sequence[str], bases: Iterable[Path]) -> str:
    """A cell's logs as one reference: the log, or the folder its repeats share, relative where possible."""
    if not paths:
        return ""
    ref = Path(paths[0]) if len(paths) == 1 else Path(os.path.commonpath(paths))
    if not ref.is_absolute():
        return ref.as_posix()
    for base in bases:
        try:
            return ref.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return ref.name


def records(results: Sequence[TableResult]) -> list[dict[str, Any]]:
    """Tidy long form: one record per (table, target, cell); the same columns in CSV and JSON."""
    from repro.paths import data_root

    out = []
    for r in results:
        bases = [Path(r.source), data_root(), Path.cwd()]
        cpu = is_cpu(r)
        for c in r.cells:
            out.append({
                "table": r.table.id if r.table else None, "target": c.target, "framework": c.column,
                "kind": c.kind if c.verdict != NOT_RUN else None, "nodes": c.nodes, "gpus": c.gpus,
                "device": "CPU" if cpu else "GPU", "precision": c.precision, "batch_size": c.batch_size,
                "published": float(c.published) if c.published is not None else None, "reproduced": c.reproduced,
                "interval_low": c.low, "interval_high": c.high, "repeats": len(c.repeats),
                "spread_pct": c.spread_pct, "delta_pct": c.delta_pct, "verdict": c.verdict, "reason": c.detail,
                "unit": r.table.unit if r.table else "images/s", "tolerance_pct": c.tolerance_pct,
                "tolerance_reason": c.tolerance_reason or None,
                "published_speedup": float(c.published_speedup) if c.published_speedup else None,
                "speedup": c.speedup, "efficiency": c.efficiency, "log": _rel(c.logs, bases) or None})
    return out


def render_json(results: Sequence[TableResult]) -> str:
    """JSON records (``pandas.read_json(..., orient="records")`` reads them back)."""
    return json.dumps(records(results), indent=1) + "\n"


#: what makes a spreadsheet read a cell as a formula (OWASP's CSV injection list)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A text cell a spreadsheet would evaluate, prefixed with ``'`` as OWASP recommends (numbers stay
    numbers: only text is touched); the raw value is the text after the ``'``."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def render_csv(results: Sequence[TableResult]) -> str:
    import pandas as pd

    rows = [{k: spreadsheet_safe(v) for k, v in rec.items()} for rec in records(results)]
    return pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False)


def render_junit(results: Sequence[TableResult], fail_on: set[str] | None = None) -> str:
    """JUnit XML: a testsuite per publication, a testcase per cell; a counted verdict is a failure."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="repro")
    for group in _groups(results):
        name = group[0].table.id if group[0].table else group[0].manifest.id
        suite = ET.SubElement(root, "testsuite", name=name)
        cells = [(r, c) for r in group for c in r.cells]
        failures = 0
        for r, c in cells:
            case = ET.SubElement(suite, "testcase", classname=f"{name}.{c.target}",
                                 name=f"{row_label(c, is_cpu(r))} {c.precision} bs{c.batch_size}")
            if exit_code([c.verdict], fail_on):
                failures += 1
                why = c.detail or cell_text(c)
                fail = ET.SubElement(case, "failure", message=f"{c.verdict}: {why}"[:500], type=c.verdict)
                fail.text = cell_text(c) + (f"\n{c.detail}" if c.detail else "")
            else:
                ET.SubElement(case, "system-out").text = cell_text(c)
        suite.set("tests", str(len(cells)))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
    root.set("tests", str(sum(int(s.get("tests", 0)) for s in root)))
    root.set("failures", str(sum(int(s.get("failures", 0)) for s in root)))
    ET.indent(root)
    return xml_safe('<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n")


#: characters XML 1.0 forbids (ElementTree writes them as they are, which makes the file unreadable)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """XML text without the characters XML forbids (control characters, lone surrogates, U+FFFE/U+FFFF);
    the markup holds none, so the whole serialised document may be cleaned at once."""
    return _NOT_XML.sub("", text)


RENDERERS = {"md": render_markdown, "json": render_json, "csv": render_csv}


# ------------------------------------------------------------------ plots
def _title(group: Sequence[TableResult]) -> str:
    import textwrap

    t = group[0].table
    text = f"{t.cite['title']} ({t.id})" if t else f"{group[0].manifest.title}"
    return "\n".join(textwrap.wrap(text, 100))


PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


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
    from matplotlib.patches import Patch

    groups = _groups(results)
    fig, axes = plt.subplots(3 * len(groups), 1, figsize=(13, 10.5 * len(groups)), dpi=150,
                             gridspec_kw={"height_ratios": [3, 2, 2] * len(groups)}, squeeze=False)
    for gi, group in enumerate(groups):
        ax, dev, eff = axes[3 * gi][0], axes[3 * gi + 1][0], axes[3 * gi + 2][0]
        cpu = is_cpu(group[0])
        cells = [c for r in group for c in r.cells]
        cols = list(dict.fromkeys((c.column, c.column_key) for c in cells))
        rows = sorted({(c.gpus, c.nodes) for c in cells})
        x, labels, pos = 0.0, [], []
        for col in cols:
            for gpus, nodes in rows:
                c = next((c for c in cells if (c.column, c.column_key) == col and (c.gpus, c.nodes) == (gpus, nodes)),
                         None)
                if c is None:
                    continue
                top = max(v for v in (float(c.published) if c.published else None, c.reproduced) if v is not None) \
                    if (c.published or c.reproduced is not None) else 0
                colour = {**{v: "#2f855a" for v in GOOD}, **{v: "#c53030" for v in BAD}}.get(c.verdict, "#d69e2e")
                if c.published:
                    ax.bar(x - 0.2, float(c.published), 0.4, color="#9aa5b1", edgecolor="#52606d")
                if c.reproduced is not None:
                    err = None
                    if c.low is not None and c.high is not None:
                        err = [[max(c.reproduced - c.low, 0)], [max(c.high - c.reproduced, 0)]]
                    ax.bar(x + 0.2, c.reproduced, 0.4, color=colour, yerr=err, capsize=3, ecolor="black")
                if c.verdict not in GOOD:
                    ax.annotate(c.verdict, (x + 0.2, top or 1),
                                xytext=(0, 4), textcoords="offset points",
                                ha="center", va="bottom", fontsize=7, rotation=90,
                                color="#c53030" if c.verdict in BAD else "#975a16")
                if c.delta_pct is not None and c.published:
                    pub = float(c.published)
                    err = None
                    if c.low is not None and c.high is not None:
                        err = [[max(c.delta_pct - (c.low - pub) / pub * 100, 0)],
                               [max((c.high - pub) / pub * 100 - c.delta_pct, 0)]]
                    dev.errorbar([x], [c.delta_pct], yerr=err, fmt="o", color=colour, ecolor="black", capsize=3)
                    if c.tolerance_pct is not None:
                        dev.fill_between([x - 0.45, x + 0.45], -c.tolerance_pct, c.tolerance_pct, color="#2f855a",
                                         alpha=0.12, linewidth=0)
                elif c.verdict not in GOOD and c.verdict != NOT_RUN:
                    dev.annotate(c.verdict, (x, 0), ha="center", fontsize=7,
                                 rotation=90, va="center", color="#975a16")
                labels.append(f"{gpus}{'w' if cpu else 'g'}")
                pos.append(x)
                x += 1
            x += 0.6
        ax.set_xticks(pos, labels, fontsize=8)
        dev.set_xticks(pos, labels, fontsize=8)
        dev.set_xlim(ax.get_xlim())
        dev.axhline(0, color="grey", linewidth=1)
        dev.set_ylabel("reproduced − published (%)")
        dev.set_title("Delta from the published figure; whiskers: the interval, green band: the tolerance",
                      fontsize=10)
        dev.grid(True, axis="y", alpha=0.3)
        # framework and precision under each group of bars
        starts = 0
        for col in cols:
            n = sum(1 for c in cells if (c.column, c.column_key) == col)
            if n:
                mid = (pos[starts] + pos[starts + n - 1]) / 2
                ax.annotate(f"{col[0]}\n{col[1]}", (mid, 0), xytext=(0, -22), textcoords="offset points",
                            xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=7)
                starts += n
        ax.set_yscale("log")
        values = [v for c in cells for v in (float(c.published) if c.published else None, c.reproduced) if v]
        if values:
            ax.set_ylim(min(values) / 2, max(values) * 6)  # room for the marks above the bars
        ax.set_ylabel((group[0].table.unit if group[0].table else "images/s") + " (log scale)")
        ax.set_title(_title(group), fontsize=11)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(handles=[Patch(color="#9aa5b1", label="published"),
                           Patch(color="#2f855a", label="reproduced / match"),
                           Patch(color="#c53030", label="slower, faster, deviates, not derivable"),
                           Patch(color="#d69e2e", label="inconclusive"),
                           Patch(color="white", label=f"whiskers: {INTERVAL}")], fontsize=7, loc="upper left")
        for col in cols:
            pts = sorted((c.gpus, c.efficiency) for c in cells
                         if (c.column, c.column_key) == col and c.efficiency is not None)
            pub = sorted((c.gpus, float(c.published)) for c in cells if (c.column, c.column_key) == col and c.published)
            colour = None
            if len(pts) > 1:
                line, = eff.plot([p[0] for p in pts], [p[1] * 100 for p in pts], "o-", label=f"{col[0]} {col[1]}")
                colour = line.get_color()
            if len(pub) > 1:  # the publication's own scaling, with or without a reproduced one beside it
                g0, v0 = pub[0]
                eff.plot([g for g, _ in pub], [v / v0 / (g / g0) * 100 for g, v in pub], "--", color=colour,
                         alpha=0.6, label=None if colour else f"{col[0]} {col[1]} (published)")
        for panel, empty in ((dev, not dev.collections and not dev.lines[1:]), (eff, not eff.lines)):
            if empty:  # say why the panel is empty, once, instead of a label per cell
                panel.text(0.5, 0.5, "no reproduced figure: every cell is not run (no log)", transform=panel.transAxes,
                           ha="center", va="center", fontsize=9, color="#975a16")
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
    _plain_text(fig)
    fig.tight_layout(h_pad=3)
    try:
        fig.savefig(path, format=fmt, bbox_inches="tight")
    finally:
        plt.close(fig)


def _plain_text(fig: Any) -> None:
    """Titles, axis labels, marks and legends come from manifests and logs: drawn as plain text, never
    parsed as math (``$...$`` would be; a bad formula stops the drawing), secrets and control characters
    removed. Tick labels keep math (log axes)."""
    for ax in fig.axes:
        legend = ax.get_legend()
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts, *(legend.get_texts() if legend else [])]
        for t in texts:
            t.set_parse_math(False)
            t.set_text(shown(t.get_text()))


# ------------------------------------------------------------------ HTML
HTML_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#1a202c}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #cbd5e0;padding:3px 8px;text-align:right}th{background:#edf2f7}
td.l,th.l{text-align:left}img{max-width:100%}code{background:#f4f4f4;padding:0 3px}
"""


def render_html(results: Sequence[TableResult], *, environment: Sequence[Check] = (),
                fail_on: set[str] | None = None) -> str:
    """One self-contained page: citations, tables with verdict colours, the chart (embedded),
    environment and deviations from the published hardware, links to the logs."""
    def e(text: Any) -> str:  # every text from a manifest, log or record: secrets blanked, control removed
        return html.escape(shown(str(text)))

    names = ", ".join(g[0].table.id if g[0].table else g[0].manifest.id for g in _groups(results))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(names)}: repro report</title>"
             f"<style>{HTML_STYLE}</style></head><body>"]
    for group in _groups(results):
        t = group[0].table
        if t:
            cite = t.cite
            url = (f"{cite['repository']}/blob/{cite['commit']}/{cite['path']}"
                   if _is_web(cite["repository"]) and "github.com" in cite["repository"] else "")
            parts.append(f"<h1>{e(t.id)}: {e(cite['title'])}</h1><p>Published in "
                         + (f"<a href='{e(url)}'>{e(cite['repository'])}</a>" if url else e(cite["repository"]))
                         + f" @ <code>{e(cite['commit'][:12])}</code> <code>{e(cite['path'])}</code>"
                         + f" ({e(t.unit)}).</p>")
            parts.append(f"<p>{e(_kind_text(group))}</p>")
        else:
            parts.append(f"<h1>{e(group[0].manifest.id)}: {e(group[0].manifest.title)}</h1>"
                         "<p>Measured only: this target reproduces no publication.</p>")
        parts.append("<ul>" + "".join(f"<li><code>{e(protocol_text(r))}</code></li>" for r in group) + "</ul>")
        recs = records(group)
        heads = ["target", "cell", "published", "reproduced", "interval", "repeats", "delta %", "verdict", "reason",
                 "log"]
        rows = []
        for rec, c in zip(recs, (c for r in group for c in r.cells)):
            interval = (f"{rec['interval_low']:.2f} .. {rec['interval_high']:.2f}"
                        if rec["interval_low"] is not None else "")
            unit = "worker" if rec["device"] == "CPU" else "GPU"
            log = rec["log"]
            delta = "" if rec["delta_pct"] is None else f"{rec['delta_pct']:+.2f}"
            link = f"<a href='{e(_relative_href(log))}'>{e(Path(log).name)}</a>" if log else ""
            digits = 2 if rec["kind"] != REDERIVATION or c.published is None else len(c.published.partition(".")[2]) + 1
            reproduced = _fmt(rec["reproduced"], digits) if rec["reproduced"] is not None else ""
            published = "" if rec["published"] is None else rec["published"]
            rows.append(
                f"<tr style='background:{HTML_COLOUR.get(rec['verdict'], '#fff')}'>"
                f"<td class=l>{e(rec['target'])}</td>"
                f"<td class=l>{rec['gpus']} {unit}{'s' if rec['gpus'] > 1 else ''}, {rec['nodes']} node(s), "
                f"{e(rec['precision'])} bs{rec['batch_size']}</td><td>{published}</td><td>{reproduced}</td>"
                f"<td>{interval}</td><td>{rec['repeats']}</td><td>{delta}</td>"
                f"<td class=l><b>{e(rec['verdict'])}</b></td><td class=l>{e(rec['reason'] or '')}</td>"
                f"<td class=l>{link}</td></tr>")
        parts.append("<table><tr>" + "".join(f"<th class=l>{h}</th>" for h in heads) + "</tr>" + "".join(rows)
                     + "</table>")
        parts.append(f"<p>{e(verdict_line([c for r in group for c in r.cells]))}</p>")
        notes = _notes(group)[2:]
        if notes:
            parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{e(n[2:])}</li>" for n in notes if n) + "</ul>")
        parts.append(_chart_html(group))
    if environment:
        parts.append("<h2>Environment and deviations from the published hardware</h2><table><tr>"
                     + "".join(f"<th class=l>{h}</th>" for h in ("check", "status", "published", "observed", "detail"))
                     + "</tr>")
        for ch in environment:
            colour = {"ok": "#d8f0d8", "drift": "#f8d0d0"}.get(ch.status, "#fbeec2")
            parts.append(f"<tr style='background:{colour}'>" + "".join(
                f"<td class=l>{e(str(v))}</td>" for v in (ch.item, ch.status, ch.expected, ch.observed, ch.detail))
                + "</tr>")
        parts.append("</table>")
    code = exit_code((c.verdict for r in results for c in r.cells), fail_on)
    parts.append(f"<p>Exit status of this report: {code}.</p></body></html>")
    return "\n".join(parts) + "\n"


def _is_web(url: str) -> bool:
    """An http(s) URL with a host: the only kind of absolute link the page holds."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _relative_href(path: str) -> str:
    """A log's path as a relative link, percent-encoded: a file named ``javascript:...`` stays a file."""
    from urllib.parse import quote

    return quote(path.lstrip("/"), safe="/")


def _chart_html(group: Sequence[TableResult]) -> str:
    """The group's chart as an embedded image; a chart that cannot be drawn is said so on the page."""
    buf = io.BytesIO()
    try:
        plot_report(group, buf)
    except Exception as err:  # noqa: BLE001 - matplotlib raises many kinds; the page matters more
        return f"<p>The chart could not be drawn: {html.escape(shown(str(err)))}</p>"
    data = base64.b64encode(buf.getvalue()).decode()
    return f"<img alt='published vs reproduced' src='data:image/png;base64,{data}'>"


def render_parse_text(out: dict[str, Any]) -> str:
    how = "detected" if out["detected"] else "given"
    lines = [f"{out['file']}: parser {out['parser']} ({how}), {out['lines']} lines"]
    if out["facts"]:
        lines.append("  log says: " + ", ".join(f"{k}={v}" for k, v in out["facts"].items()))
    for r in out["results"]:
        figure = _fmt(r["throughput"]) + " images/s" if r["throughput"] is not None else "no figure"
        lines.append(f"  {r['gpus'] or '?'} GPU(s): {figure} from {r['records_used']} of {r['records']} records"
                     + (f" (log's own summary: {r['summary']})" if r["summary"] is not None else ""))
    lines += [f"  issue: {i}" for i in out["issues"]]
    return "\n".join(lines)
