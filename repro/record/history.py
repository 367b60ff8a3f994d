"""``repro history``: each cell of a table or target over the recorded runs, beside the published figure.

Pure functions from the store's rows (:meth:`repro.record.store.Store.history`) to a text table per cell,
tidy records (CSV, JSON: one a cell and run) and, in :mod:`repro.record.history_chart`, a chart; :func:`read`
reads what each needs of the store (the text: only each cell's latest runs, ``Store.history_latest``).
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
from repro.record.store import HISTORY_COLUMNS, CellRuns, Store

RECORD_COLUMNS = ("run", "run_id", "when", "cluster", "table", "target", "cell", "nodes", "gpus", "precision",
                  "batch_size", "unit", "published", "value", "interval_low", "interval_high", "repeats",
                  "spread_pct", "delta_pct", "verdict", "tolerance_pct", "source")


#: the names of the store's history rows' fields (plain tuples, in HISTORY_COLUMNS' order)
FIELDS = tuple(c.split(" AS ")[-1].split(".")[-1] for c in HISTORY_COLUMNS)
(RUN_NO, RUN_ID, SOURCE, STARTED, CLUSTER, TBL, TARGET, CELL, DEVICE, NODES, GPUS, PRECISION, BATCH_SIZE,
 UNIT, PUBLISHED, VALUE, LOW, HIGH, N, SPREAD_PCT, DELTA_PCT, VERDICT, TOLERANCE_PCT) = range(len(FIELDS))


@dataclass
class CellHistory:
    """One cell of one table and target: its published figure and one row per recorded run (a tuple of
    FIELDS; :meth:`run` gives it as a mapping)."""

    table: str
    target: str
    cell: str
    title: str
    published: str | None
    unit: str
    runs: list[tuple[Any, ...]] = field(default_factory=list)
    #: where ``runs`` holds only the latest runs (:func:`latest`): how many there are, their lowest and
    #: highest figure (None: none has one)
    count: int | None = None
    span: tuple[float, float] | None = None

    @staticmethod
    def run(row: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(FIELDS, row))


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


def group(rows: Sequence[tuple[Any, ...]]) -> list[CellHistory]:
    """The store's rows as one history per cell, each cell's runs oldest first; the cells in the order the
    first run recorded them (its table's order)."""
    out: dict[tuple[str, str, str], CellHistory] = {}
    for row in rows:
        key = (row[TBL], row[TARGET], row[CELL])
        h = out.get(key)
        if h is None:
            h = out[key] = CellHistory(row[TBL], row[TARGET], row[CELL], cell_title(CellHistory.run(row)),
                                       row[PUBLISHED], row[UNIT] or "")
        h.runs.append(row)
    for h in out.values():  # recorded mostly in time order already: a near-linear sort
        h.runs.sort(key=lambda r: (r[STARTED], r[RUN_NO]))
    return list(out.values())


def read(store: Store, name: str, *, cluster: str | None = None, since: str | None = None,
         last: int = 0) -> list[CellHistory]:
    """Each cell of table or target ``name`` over its recorded runs: with ``last`` > 0 only each cell's
    latest ``last`` runs, and how many there are and their figures' range (what the text shows, read
    without reading every run); 0: every run (CSV, JSON, the chart, ``--last 0``)."""
    if last:
        return latest(store.history_latest(name, last, cluster=cluster, since=since))
    return group(store.history(name, cluster=cluster, since=since))


def latest(cells: Sequence[CellRuns]) -> list[CellHistory]:
    """The cells as :meth:`repro.record.store.Store.history_latest` reads them: each cell's latest runs
    oldest first, titled by its first recorded row as :func:`group` titles it; what the text shows of
    every run, without reading them all."""
    out = []
    for c in cells:
        h = CellHistory(c.first[TBL], c.first[TARGET], c.first[CELL], cell_title(CellHistory.run(c.first)),
                        c.first[PUBLISHED], c.first[UNIT] or "", c.latest[::-1], count=c.count,
                        span=None if c.low is None or c.high is None else (c.low, c.high))
        out.append(h)
    return out


def _num(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


HEADERS = ("run", "when (UTC)", "cluster", "figure", "interval", "n", "vs published", "verdict")


def _row_cells(runs: Sequence[tuple[Any, ...]]) -> list[tuple[str, ...]]:
    """The text table's cells of each run (the loop 10,000 runs go through: kept plain)."""
    out = []
    for r in runs:
        low, high, value, delta, started = r[LOW], r[HIGH], r[VALUE], r[DELTA_PCT], r[STARTED]
        out.append((f"#{r[RUN_NO]}", f"{started[:10]} {started[11:19]}", r[CLUSTER] or "—",
                    "—" if value is None else f"{value:.2f}",
                    "—" if low is None or high is None else f"{low:.2f} .. {high:.2f}", str(r[N]),
                    "—" if delta is None else f"{delta:+.2f}%", r[VERDICT]))
    return out


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-style table, columns padded to their widest entry (fast for thousands of rows)."""
    widths = [max(len(h), max(map(len, col), default=0)) for h, col in zip(headers, zip(*rows))] if rows \
        else [len(h) for h in headers]
    line = ("| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |").format
    return "\n".join([line(*headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(*r) for r in rows)])


#: the runs of each cell the text shows by default: the latest (CSV and JSON hold every one)
LAST = 20


def render_text(histories: Sequence[CellHistory], last: int = LAST) -> str:
    """A table per cell of its ``last`` latest runs (0: every run), and a line over all of them."""
    out = []
    for h in histories:
        published = f"published {h.published} {h.unit}" if h.published else f"no published figure ({h.unit})"
        where = f"{h.table}: " if h.table else ""
        shown = h.runs[-last:] if last else h.runs
        out += [f"## {where}{h.title}: {published}", "", aligned(HEADERS, _row_cells(shown)), ""]
        count, span = _glance(h)
        summary = f"{count} run(s)"
        summary += f", the latest {len(shown)} shown (--last 0: all)" if count > len(shown) else ""
        if span:
            summary += (f"; figures {span[0]:.2f} .. {span[1]:.2f}; latest {_num(h.runs[-1][VALUE])} "
                        f"({h.runs[-1][VERDICT]})")
        out += [summary + ".", ""]
    return "\n".join(out)


def _glance(h: CellHistory) -> tuple[int, tuple[float, float] | None]:
    """How many runs a cell has, and their lowest and highest figure."""
    if h.count is not None:
        return h.count, h.span
    values = [r[VALUE] for r in h.runs if r[VALUE] is not None]
    return len(h.runs), (min(values), max(values)) if values else None


def records(histories: Sequence[CellHistory]) -> list[dict[str, Any]]:
    """Tidy long form: one record per cell and run; the same columns in CSV and JSON."""
    out = []
    for h in histories:
        for r in map(h.run, h.runs):
            out.append({"run": r["run_no"], "run_id": r["run_id"], "when": r["started"],
                        "cluster": r["cluster"],
                        "table": h.table or None, "target": h.target, "cell": h.cell, "nodes": r["nodes"],
                        "gpus": r["gpus"], "precision": r["precision"], "batch_size": r["batch_size"],
                        "unit": h.unit, "published": float(h.published) if h.published else None,
                        "value": r["value"], "interval_low": r["low"], "interval_high": r["high"],
                        "repeats": r["n"], "spread_pct": r["spread_pct"], "delta_pct": r["delta_pct"],
                        "verdict": r["verdict"], "tolerance_pct": r["tolerance_pct"], "source": r["source"]})
    return out


def render_json(histories: Sequence[CellHistory]) -> str:
    return json.dumps(records(histories), indent=1) + "\n"


def render_csv(histories: Sequence[CellHistory]) -> str:
    from repro.verdict.report import spreadsheet_safe  # here: the text's import path stays short

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(RECORD_COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows({k: spreadsheet_safe(v) for k, v in rec.items()} for rec in records(histories))
    return buf.getvalue()


RENDERERS = {"text": render_text, "json": render_json, "csv": render_csv}
