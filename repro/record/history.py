"""``repro history``: each cell of a table or target over the recorded runs, beside the published figure.

Pure functions from the store's rows (:meth:`repro.record.store.Store.history`) to a text table per cell,
tidy records (CSV, JSON: one a cell and run) and, in :mod:`repro.record.history_chart`, a chart.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from repro.errors import UsageError
from repro.verdict.report import spreadsheet_safe

RECORD_COLUMNS = ("run", "run_id", "when", "cluster", "table", "target", "cell", "nodes", "gpus", "precision",
                  "batch_size", "unit", "published", "value", "interval_low", "interval_high", "repeats",
                  "spread_pct", "delta_pct", "verdict", "tolerance_pct", "source")


@dataclass
class CellHistory:
    """One cell of one table and target: its published figure and one row per recorded run."""

    table: str
    target: str
    cell: str
    title: str
    published: str | None
    unit: str
    runs: list[Mapping[str, Any]] = field(default_factory=list)


def parse_since(text: str) -> str:
    """``--since``: a date (``2026-11-01``) or a UTC time (``2026-11-01T12:00``, ``...Z``), as the store
    writes times (``2026-11-01T00:00:00Z``)."""
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2})?)Z?)?", text.strip())
    try:
        if not m:
            raise ValueError(text)
        when = datetime.fromisoformat(f"{m.group(1)}T{m.group(2) or '00:00'}")
    except ValueError:
        raise UsageError(f"--since {text!r}: not a date",
                         hint="give a date, YYYY-MM-DD, or a UTC time, YYYY-MM-DDTHH:MM") from None
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def cell_title(row: Mapping[str, Any]) -> str:
    unit = "worker" if row["device"] == "CPU" else "GPU"
    gpus, nodes = row["gpus"], row["nodes"]
    return (f"{row['target']} {gpus} {unit}{'s' if gpus != 1 else ''} "
            f"({nodes} node{'s' if nodes != 1 else ''}) "
            f"{row['precision']} bs{row['batch_size']}")


def group(rows: Sequence[Mapping[str, Any]]) -> list[CellHistory]:
    """The store's rows (sorted by cell, then time) as one history per cell."""
    out: dict[tuple[str, str, str], CellHistory] = {}
    for row in rows:
        key = (row["tbl"], row["target"], row["cell"])
        h = out.get(key)
        if h is None:
            h = out[key] = CellHistory(row["tbl"], row["target"], row["cell"], cell_title(row),
                                       row["published"],
                                       row["unit"] or "")
        h.runs.append(row)
    return list(out.values())


def _num(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _row_cells(run: Mapping[str, Any]) -> list[str]:
    interval = (f"{run['low']:.2f} .. {run['high']:.2f}" if run["low"] is not None and run["high"] is not None
                else "—")
    n = len(json.loads(run["repeats"])) if isinstance(run["repeats"], str) else len(run["repeats"])
    delta = "—" if run["delta_pct"] is None else f"{run['delta_pct']:+.2f}%"
    return [f"#{run['run_no']}", run["started"].replace("T", " ").rstrip("Z"), run["cluster"] or "—",
            _num(run["value"]), interval, str(n), delta, run["verdict"]]


HEADERS = ["run", "when (UTC)", "cluster", "figure", "interval", "n", "vs published", "verdict"]


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-style table, columns padded to their widest entry (fast for thousands of rows)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def render_text(histories: Sequence[CellHistory]) -> str:
    out = []
    for h in histories:
        published = f"published {h.published} {h.unit}" if h.published else f"no published figure ({h.unit})"
        where = f"{h.table}: " if h.table else ""
        out += [f"## {where}{h.title}: {published}", "",
                aligned(HEADERS, [_row_cells(r) for r in h.runs]), ""]
        values = [r["value"] for r in h.runs if r["value"] is not None]
        if values:
            out += [f"{len(h.runs)} run(s); figures {min(values):.2f} .. {max(values):.2f}; latest "
                    f"{_num(h.runs[-1]['value'])} ({h.runs[-1]['verdict']}).", ""]
    return "\n".join(out)


def records(histories: Sequence[CellHistory]) -> list[dict[str, Any]]:
    """Tidy long form: one record per cell and run; the same columns in CSV and JSON."""
    out = []
    for h in histories:
        for r in h.runs:
            repeats = json.loads(r["repeats"]) if isinstance(r["repeats"], str) else r["repeats"]
            out.append({"run": r["run_no"], "run_id": r["run_id"], "when": r["started"],
                        "cluster": r["cluster"],
                        "table": h.table or None, "target": h.target, "cell": h.cell, "nodes": r["nodes"],
                        "gpus": r["gpus"], "precision": r["precision"], "batch_size": r["batch_size"],
                        "unit": h.unit, "published": float(h.published) if h.published else None,
                        "value": r["value"], "interval_low": r["low"], "interval_high": r["high"],
                        "repeats": len(repeats), "spread_pct": r["spread_pct"], "delta_pct": r["delta_pct"],
                        "verdict": r["verdict"], "tolerance_pct": r["tolerance_pct"], "source": r["source"]})
    return out


def render_json(histories: Sequence[CellHistory]) -> str:
    return json.dumps(records(histories), indent=1) + "\n"


def render_csv(histories: Sequence[CellHistory]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(RECORD_COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows({k: spreadsheet_safe(v) for k, v in rec.items()} for rec in records(histories))
    return buf.getvalue()


RENDERERS = {"text": render_text, "json": render_json, "csv": render_csv}
