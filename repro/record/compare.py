"""``repro compare A B``: two recorded runs cell by cell, and the facts that differ between them.

Per cell: both figures with their intervals, the delta from A to B, and whether it lies beyond the noise:
with two repeats or more on each side, Welch's t-test of the two sets of repeats at the 95% level (the
spread each run measured, unequal variances allowed); with one repeat on either side no spread is known and
the delta is only a figure. The facts are :func:`repro.record.diff.fact_rows`, `repro diff`'s own code path,
ordered by how directly each one sets a throughput figure (:data:`CAUSES`): the GPUs and their count first,
the network and the NCCL transport, the driver and the CUDA stack, the image and framework, then the rest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from repro.record.diff import Side, fact_rows
from repro.record.history import aligned, cell_title
from repro.record.store import Snapshot
from repro.verdict.report import spreadsheet_safe

CONFIDENCE = 0.95
#: facts in the order they are most likely to move a throughput figure
CAUSES = ("gpu_model", "gpus_per_node", "nodes", "gpu_memory_gb", "nccl_transport", "interconnect",
          "ib_rate_gbps", "driver", "cuda", "cudnn", "nccl", "image", "base image", "framework version",
          "source commit", "manifest sha256", "cpu", "kernel", "os", "docker", "python", "kit", "cluster",
          "target")
BEYOND, WITHIN, UNKNOWN = "beyond the noise", "within the noise", "no spread known"


@dataclass(frozen=True)
class CellDelta:
    key: tuple[str, str, str]
    title: str
    unit: str
    a: Mapping[str, Any] | None
    b: Mapping[str, Any] | None
    delta_pct: float | None
    noise: str  # BEYOND, WITHIN, UNKNOWN, or "" (a cell in one run only)
    p_value: float | None


@dataclass(frozen=True)
class Comparison:
    a: Snapshot
    b: Snapshot
    cells: list[CellDelta]
    facts: list[list[str]]  # [fact, A's, B's, note], most likely cause first; only those that differ


def side(s: Snapshot) -> Side:
    return Side(s.label, "run", dict(s.facts.get("env") or {}), dict(s.facts.get("pins") or {}))


def differing_facts(a: Snapshot, b: Snapshot) -> list[list[str]]:
    sa, sb = side(a), side(b)
    rows = [r for section in ("env", "pins") for r in fact_rows(sa, sb, section) if r[3]]
    return sorted(rows, key=lambda r: CAUSES.index(r[0]) if r[0] in CAUSES else len(CAUSES))


def noise(a: Sequence[float], b: Sequence[float]) -> tuple[str, float | None]:
    """Whether two runs' repeats differ beyond their own spread (Welch's t-test), and its p-value."""
    if len(a) < 2 or len(b) < 2:
        return UNKNOWN, None
    va, vb = statistics.variance(a), statistics.variance(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if va == 0 and vb == 0:
        return (WITHIN, 1.0) if diff == 0 else (BEYOND, 0.0)
    from scipy.stats import ttest_ind

    p = float(ttest_ind(b, a, equal_var=False).pvalue)
    if math.isnan(p):
        return UNKNOWN, None
    return (BEYOND if p < 1 - CONFIDENCE else WITHIN), p


def compare(a: Snapshot, b: Snapshot) -> Comparison:
    by_a = {(c["tbl"], c["target"], c["cell"]): c for c in a.cells}
    by_b = {(c["tbl"], c["target"], c["cell"]): c for c in b.cells}
    cells = []
    for key in [*by_a, *(k for k in by_b if k not in by_a)]:
        x, y = by_a.get(key), by_b.get(key)
        either = x or y
        assert either is not None
        delta, verdict, p = None, "", None
        if x and y and x["value"] and y["value"] is not None:
            delta = (y["value"] - x["value"]) / x["value"] * 100
            verdict, p = noise(x["repeats"], y["repeats"])
        cells.append(CellDelta(key, cell_title(either), either.get("unit") or "", x, y, delta, verdict, p))
    return Comparison(a, b, cells, differing_facts(a, b))


def _figure(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "— (not in this run)"
    if c["value"] is None:
        return f"— ({c['verdict']})"
    text = f"{c['value']:.2f}"
    if c["low"] is not None and c["high"] is not None:
        text += f" [{c['low']:.2f} .. {c['high']:.2f}]"
    return text + f" n={len(c['repeats'])}"


def _noise_text(d: CellDelta) -> str:
    if d.p_value is None or d.noise == UNKNOWN:
        return d.noise + (" (one repeat)" if d.noise == UNKNOWN else "")
    return f"{d.noise} (Welch p={d.p_value:.3g})"


def _run_line(name: str, s: Snapshot) -> str:
    return f"{name}: {s.label} ({s.kind}; {s.cluster or 'cluster not named'}; ran {s.started})"


def render_text(cmp: Comparison) -> str:
    out = ["# repro compare", "", _run_line("A", cmp.a), _run_line("B", cmp.b), "",
           "## Cells: A and B with their intervals, B vs A", ""]
    rows = [[(f"{d.key[0]}: " if d.key[0] else "") + d.title, _figure(d.a), _figure(d.b),
             "—" if d.delta_pct is None else f"{d.delta_pct:+.2f}%", _noise_text(d)] for d in cmp.cells]
    out += [aligned(["cell", "A", "B", "B vs A", "noise"], rows) if rows else "(no cell in either run)", ""]
    out += ["## Facts that differ, most likely cause first", ""]
    if cmp.facts:
        out += [aligned(["fact", "A", "B", ""], cmp.facts), ""]
    else:
        out += ["No recorded fact differs between the two runs.", ""]
    return "\n".join(out)


def records(cmp: Comparison) -> list[dict[str, Any]]:
    """One record per cell (the facts that differ repeat on each, as ``facts``)."""
    facts = "; ".join(f"{k}: {x} -> {y}" for k, x, y, _ in cmp.facts) or None
    out = []
    for d in cmp.cells:
        rec: dict[str, Any] = {"table": d.key[0] or None, "target": d.key[1], "cell": d.key[2],
                               "unit": d.unit,
                               "run_a": cmp.a.label, "run_b": cmp.b.label}
        for name, c in (("a", d.a), ("b", d.b)):
            rec |= {f"{name}_value": c["value"] if c else None, f"{name}_low": c["low"] if c else None,
                    f"{name}_high": c["high"] if c else None,
                    f"{name}_repeats": len(c["repeats"]) if c else 0,
                    f"{name}_verdict": c["verdict"] if c else None}
        rec |= {"delta_pct": d.delta_pct, "noise": d.noise or None, "p_value": d.p_value,
                "facts_differ": facts}
        out.append(rec)
    return out


def render_json(cmp: Comparison) -> str:
    import json

    return json.dumps({"a": cmp.a.label, "b": cmp.b.label, "cells": records(cmp),
                       "facts": [{"fact": k, "a": x, "b": y, "note": n} for k, x, y, n in cmp.facts]},
                      indent=1) + "\n"


def render_csv(cmp: Comparison) -> str:
    import csv
    import io

    rows = records(cmp)
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows({k: spreadsheet_safe(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


RENDERERS = {"text": render_text, "json": render_json, "csv": render_csv}
