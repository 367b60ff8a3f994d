"""Render re-derived tables: the published layout side by side with the reproduction.

Pure functions from TableResult objects to text (markdown, CSV, JSON); the CLI prints
them. ``plot_scaling`` writes the scaling chart with matplotlib's non-interactive backend.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.reproduce import MATCH, CellResult, TableResult, non_monotonic

if TYPE_CHECKING:
    import pandas as pd


def tabulate(*args: Any, **kwargs: Any) -> str:
    """``tabulate.tabulate``, imported on first use (it costs ``repro parse`` a fifth of its start-up)."""
    from tabulate import tabulate as render

    return render(*args, **kwargs)


JSON_KEYS = ("nodes", "gpus", "precision", "batch_size", "published", "reproduced", "delta_pct", "verdict")


def _fmt(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def cell_text(c: CellResult) -> str:
    if c.published is None:
        if c.reproduced is None:
            return f"— ({c.verdict})" if c.verdict != "no log" else "—"
        n = len(c.repeats)
        return f"{c.reproduced:.2f}" + (f" (median of {n})" if n > 1 else "")
    if c.reproduced is None:
        return f"{c.published} → — ({c.verdict})"
    digits = len(c.published.partition(".")[2]) + 1  # one digit more than printed shows the rounding
    delta = "exact" if c.exact else f"{c.delta_pct:+.2f}%"
    return f"{c.published} → {c.reproduced:.{digits}f} ({delta}) {c.verdict}"


def _frame(results: Sequence[TableResult]) -> pd.DataFrame:
    import pandas as pd  # tables only: `repro parse` never pays for importing it
    several = len({r.manifest.id for r in results}) > 1
    rows = []
    for r in results:
        for c in r.cells:
            col = f"{c.column} {c.column_key}" if several else c.column_key
            rows.append({"row": f"{c.gpus} GPU" + ("s" if c.gpus > 1 else "") + f" ({c.nodes} node{'s' if c.nodes > 1 else ''})",
                         "gpus": c.gpus, "col": col, "text": cell_text(c), "cell": c})
    return pd.DataFrame(rows)


def _pivot(df: pd.DataFrame, value: str) -> list[list[Any]]:
    order = list(dict.fromkeys(df["col"]))
    wide = df.pivot_table(index=["gpus", "row"], columns="col", values=value, aggfunc="first").reindex(columns=order)
    return [[row, *("" if v != v or v is None else v for v in vals)] for (_, row), vals in zip(wide.index, wide.values)], order


def render_markdown(results: Sequence[TableResult]) -> str:
    first = results[0]
    if first.table is None:
        out = [f"# {first.manifest.id}: {first.manifest.title}", "",
               "Measured only: this target reproduces no publication (images/s).",
               f"Measured from: {', '.join(sorted({r.source for r in results}))}.", ""]
    else:
        cite = first.table.cite
        out = [f"# {first.table.id}: {cite['title']}", "",
               f"Published in {cite['repository']} @ {cite['commit'][:12]} `{cite['path']}` ({first.table.unit}).",
               f"Reproduced from: {', '.join(sorted({r.source for r in results}))}.", ""]
    for r in results:
        out.append(f"- {r.manifest.id}: parser `{r.manifest.measure.parser}`, protocol {dict(r.manifest.measure.protocol)}"
                   + "".join(f"; when {dict(w)}: {dict(p)}" for w, p in r.manifest.measure.overrides))
    df = _frame(results)
    body, cols = _pivot(df, "text")
    legend = "Each cell: published → reproduced (delta) verdict." if first.table else "Each cell: measured images/s."
    out += ["", legend, "",
            tabulate(body, headers=["GPUs", *cols], tablefmt="github", disable_numparse=True), ""]
    out += _scaling_section(df)
    out += _notes_section(results)
    cells = [c for r in results for c in r.cells]
    counts = Counter(c.verdict for c in cells)
    out += ["", "Verdict: " + ", ".join(f"{n} {v}" for v, n in counts.most_common()) + f" of {len(cells)} cells."]
    return "\n".join(out) + "\n"


def _scaling_section(df: pd.DataFrame) -> list[str]:
    def text(c: CellResult) -> str:
        if c.speedup is None:
            return f"published {c.published_speedup}" if c.published_speedup else ""
        pub = f"published {c.published_speedup}, " if c.published_speedup else ""
        return f"{pub}reproduced {c.speedup:.2f} ({c.efficiency:.0%} of linear)"

    df = df.assign(scaling=[text(c) for c in df["cell"]])
    if not df["scaling"].any():
        return []
    body, cols = _pivot(df, "scaling")
    return ["Speedup over the base cell and scaling efficiency:", "",
            tabulate(body, headers=["GPUs", *cols], tablefmt="github", disable_numparse=True), ""]


def _notes_section(results: Sequence[TableResult]) -> list[str]:
    notes = []
    for r in results:
        for c in r.cells:
            where = f"{c.target} {c.gpus} GPU {c.column_key}"
            if len(c.repeats) > 1:
                notes.append(f"{where}: per-repeat values {', '.join(f'{v:.2f}' for v in c.repeats)}")
            if c.verdict != MATCH and c.detail:
                notes.append(f"{where}: {c.verdict}: {c.detail}")
            notes += [f"{where}: log contradicts manifest: {f}" for f in c.flags]
        notes += [f"non-monotonic scaling: {n}" for n in non_monotonic(r.cells)]
    return ["Notes:", "", *[f"- {n}" for n in notes]] if notes else []


def cell_record(c: CellResult) -> dict[str, Any]:
    rec: dict[str, Any] = {k: getattr(c, k) for k in JSON_KEYS}
    rec["published"] = float(c.published) if c.published is not None else None
    rec["published_text"] = c.published
    rec.update(target=c.target, column=c.column, exact=c.exact, repeats=c.repeats, detail=c.detail, flags=c.flags,
               published_speedup=c.published_speedup, speedup=c.speedup, efficiency=c.efficiency, logs=c.logs,
               records_used=c.records_used, label=c.label)
    return rec


def render_json(results: Sequence[TableResult]) -> str:
    t = results[0].table
    doc = {"table": t.id if t else None, "cite": dict(t.cite) if t else None, "unit": t.unit if t else "images/s",
           "targets": [r.manifest.id for r in results], "source": sorted({r.source for r in results}),
           "cells": [cell_record(c) for r in results for c in r.cells],
           "non_monotonic": [n for r in results for n in non_monotonic(r.cells)]}
    return json.dumps(doc, indent=2) + "\n"


def render_csv(results: Sequence[TableResult]) -> str:
    import pandas as pd
    recs = [cell_record(c) for r in results for c in r.cells]
    for rec in recs:
        rec["repeats"] = " ".join(f"{v:.2f}" for v in rec["repeats"])
        rec["flags"] = "; ".join(rec["flags"])
        rec["logs"] = " ".join(Path(p).name for p in rec["logs"])
        rec["records_used"] = " ".join(map(str, rec["records_used"]))
    return pd.DataFrame(recs).to_csv(index=False)


RENDERERS = {"md": render_markdown, "json": render_json, "csv": render_csv}


def plot_scaling(results: Sequence[TableResult], path: Path) -> None:
    """Throughput vs GPUs per column: published, reproduced, and the ideal linear line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    df = _frame(results)
    for i, (col, group) in enumerate(df.groupby("col", sort=False)):
        cells = sorted(group["cell"], key=lambda c: c.gpus)
        color = f"C{i % 10}"
        gpus = [c.gpus for c in cells]
        ax.plot(gpus, [float(c.published) if c.published else float("nan") for c in cells], "o-", color=color, label=col)
        rep = [c.reproduced if c.reproduced is not None else float("nan") for c in cells]
        ax.plot(gpus, rep, "x", color=color, markersize=10, markeredgewidth=2)
        base = cells[0]
        first = float(base.published) if base.published else base.reproduced
        if first:
            ax.plot(gpus, [first / base.gpus * g for g in gpus], ":", color=color, alpha=0.6)
    styles = [Line2D([], [], color="k", marker="o", label="published"),
              Line2D([], [], color="k", marker="x", linestyle="", markersize=10, label="reproduced"),
              Line2D([], [], color="k", linestyle=":", label="linear from the smallest cell")]
    first = ax.legend(handles=styles, loc="upper left", fontsize=8)
    ax.add_artist(first)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title="column", title_fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({c.gpus for r in results for c in r.cells})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    t = results[0].table
    ax.set_ylabel(t.unit if t else "images/s")
    ax.set_title(f"{t.id}: published vs reproduced" if t else f"{results[0].manifest.id}: measured", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


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
