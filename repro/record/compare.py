"""``repro compare BASELINE RUN...``: runs against a baseline cell by cell, a verdict you can gate on, and the
facts that differ.

Cells are matched by their shape: GPUs, nodes, precision, batch size and model (the model from the target's
manifest), so two targets (Paddle and NGC PyTorch on one cluster) compare as readily as two runs of one;
where a run holds several cells of one shape (a table of four frameworks), a cell pairs with the same target's
first and by shape only where that is unambiguous. Per cell: both figures with their intervals, the ratio of
run to baseline with its 95% interval (the delta method on the means of the repeats, Welch-Satterthwaite's
degrees of freedom), Welch's t-test of the two sets of repeats, and a verdict in the report's words
(repro.verdict.rules): ``reproduced`` within the tolerance (the run's cell's, else the kit's default),
``slower`` / ``faster`` beyond the tolerance and beyond the noise (or, with one repeat on either side, beyond
the tolerance alone: no spread known), ``inconclusive`` beyond the tolerance but within the noise, ``not run``
where the run has no figure for a baseline cell. ``--fail-on`` and the exit codes are the report's.

The facts are :func:`repro.record.diff.fact_rows`, `repro diff`'s own code path, ordered by how directly each
sets a throughput figure (:data:`CAUSES`); a tree of logs records none beyond what its logs print, and that
is said as such.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from repro.record.diff import Side, fact_rows
from repro.record.history import aligned
from repro.record.store import Snapshot
from repro.verdict.report import spreadsheet_safe
from repro.verdict.rules import (DEFAULT_RUN_TOLERANCE, FASTER, INCONCLUSIVE, NOT_RUN, REPRODUCED, SLOWER,
                                 exit_code)

CONFIDENCE = 0.95
#: facts in the order they are most likely to move a throughput figure
CAUSES = ("gpu_model", "gpus_per_node", "nodes", "gpu_memory_gb", "nccl_transport", "interconnect",
          "ib_rate_gbps", "driver", "cuda", "cudnn", "nccl", "image", "base image", "framework version",
          "source commit", "manifest sha256", "cpu", "kernel", "os", "docker", "python", "kit", "cluster",
          "target")
BEYOND, WITHIN, UNKNOWN = "beyond the noise", "within the noise", "no spread known"
MATCHED_BY = "GPUs, nodes, precision, batch size and model"


@dataclass(frozen=True)
class CellDelta:
    title: str
    unit: str
    a: Mapping[str, Any] | None  # the baseline's cell
    b: Mapping[str, Any] | None  # the run's
    delta_pct: float | None
    ratio: tuple[float, float | None, float | None] | None  # run / baseline, its interval
    noise: str  # BEYOND, WITHIN, UNKNOWN, or "" (a cell in one run only)
    p_value: float | None
    verdict: str  # the report's words; "" for a cell of the run the baseline does not have
    detail: str = ""


@dataclass(frozen=True)
class Comparison:
    a: Snapshot
    b: Snapshot
    cells: list[CellDelta]
    facts: list[list[str]]  # [fact, A's, B's, note], most likely cause first; only those that differ
    facts_note: str = ""    # where a side records no facts: said as such

    @property
    def shared(self) -> int:
        return sum(1 for d in self.cells if d.a is not None and d.b is not None)


def side(s: Snapshot) -> Side:
    return Side(s.label, "run", dict(s.facts.get("env") or {}), dict(s.facts.get("pins") or {}))


def records_facts(s: Snapshot) -> bool:
    """Whether a run records any fact of its environment or pins (a tree of logs: only what logs print)."""
    env, pins = s.facts.get("env") or {}, s.facts.get("pins") or {}
    return any(v for k, v in env.items() if k != "cluster") or any(v for k, v in pins.items() if k != "kit")


def differing_facts(a: Snapshot, b: Snapshot) -> tuple[list[list[str]], str]:
    """The facts that differ, most likely cause first; and, where a side records none, that said."""
    missing = [name for name, s in (("the baseline", a), ("the run", b)) if not records_facts(s)]
    if missing:
        which = " nor ".join(missing) if len(missing) == 2 else missing[0]
        neither = "neither " if len(missing) == 2 else ""
        return [], (f"No facts recorded: {neither}{which} records its environment (a tree of logs, or a run "
                    "without its provenance.json, records only the NCCL transport its logs print; a `repro "
                    "up` run records the rest in provenance.json), so no fact is compared.")
    sa, sb = side(a), side(b)
    rows = [r for section in ("env", "pins") for r in fact_rows(sa, sb, section) if r[3]]
    return sorted(rows, key=lambda r: CAUSES.index(r[0]) if r[0] in CAUSES else len(CAUSES)), ""


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


def ratio(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float | None, float | None]:
    """The run's figure over the baseline's, with the 95% interval of the ratio of the repeats' means (the
    delta method; Welch-Satterthwaite degrees of freedom); no interval with one repeat on either side."""
    r = b["value"] / a["value"]
    xa, xb = a["repeats"], b["repeats"]
    if len(xa) < 2 or len(xb) < 2:
        return r, None, None
    ta = statistics.variance(xa) / len(xa) / statistics.fmean(xa) ** 2  # relative variance of each mean
    tb = statistics.variance(xb) / len(xb) / statistics.fmean(xb) ** 2
    if ta + tb == 0:
        return r, r, r
    from scipy.stats import t

    df = (ta + tb) ** 2 / (ta ** 2 / (len(xa) - 1) + tb ** 2 / (len(xb) - 1))
    half = float(t.ppf(0.5 + CONFIDENCE / 2, df)) * math.sqrt(ta + tb) * r
    return r, r - half, r + half


def judge(a: Mapping[str, Any], b: Mapping[str, Any], tolerance: float) -> tuple[float, str, float | None,
                                                                                   str, str]:
    """(delta %, noise, p-value, verdict, why) of a run's cell against the baseline's."""
    delta = (b["value"] - a["value"]) / a["value"] * 100
    said, p = noise(a["repeats"], b["repeats"])
    off, side_ = abs(delta) > tolerance, (SLOWER if delta < 0 else FASTER)
    where = f"{delta:+.2f}% from the baseline, tolerance ±{tolerance:g}%"
    if said == UNKNOWN:
        return delta, said, p, (side_ if off else REPRODUCED), where + "; no spread known (one repeat)"
    if not off:
        return delta, said, p, REPRODUCED, where
    if said == BEYOND:
        return delta, said, p, side_, f"{where}, beyond the noise"
    return delta, said, p, INCONCLUSIVE, f"{where}, but within the noise: more repeats would tell"


@cache
def model_of(target: str) -> str:
    """The model a target trains (its manifest's), or the target's own name where no manifest is found."""
    from repro.errors import UsageError
    from repro.spec.manifest import find_target

    try:
        return find_target(target).model or target
    except (UsageError, OSError, ValueError):
        return target


def shape(c: Mapping[str, Any]) -> tuple[Any, ...]:
    return c["gpus"], c["nodes"], c["precision"], c["batch_size"], model_of(c["target"])


def pairs(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
          ) -> list[tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]]:
    """Baseline and run cells paired: the same target's cell of a shape first, then a shape that each side
    has once; the rest alone (the baseline's in its order, then the run's)."""
    used: set[int] = set()
    out: list[tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]] = []
    for x in a:
        alike = [i for i, y in enumerate(b) if i not in used and shape(y) == shape(x)]
        same = [i for i in alike if b[i]["target"] == x["target"]]
        once = len(alike) == 1 and sum(shape(z) == shape(x) for z in a) == 1
        pick = same[0] if same else alike[0] if once else None
        if pick is not None:
            used.add(pick)
        out.append((x, b[pick] if pick is not None else None))
    return out + [(None, y) for i, y in enumerate(b) if i not in used]


def title(x: Mapping[str, Any] | None, y: Mapping[str, Any] | None) -> str:
    c = x or y
    assert c is not None
    unit = "worker" if c.get("device") == "CPU" else "GPU"
    gpus, nodes = c["gpus"], c["nodes"]
    return (f"{gpus} {unit}{'s' if gpus != 1 else ''} ({nodes} node{'s' if nodes != 1 else ''}) "
            f"{c['precision']} bs{c['batch_size']}")


def targets(d: CellDelta) -> str:
    return " / ".join(dict.fromkeys(z["target"] for z in (d.a, d.b) if z is not None))


def _delta(x: Mapping[str, Any] | None, y: Mapping[str, Any] | None) -> CellDelta:
    c = x or y
    assert c is not None
    if x is None:
        return CellDelta(title(x, y), c.get("unit") or "", x, y, None, None, "", None, "",
                         "not in the baseline")
    if y is None or y["value"] is None or not x["value"]:
        why = ("no cell of this shape in the run" if y is None else f"the run has no figure ({y['verdict']})"
               if y["value"] is None else "the baseline has no figure")
        return CellDelta(title(x, y), c.get("unit") or "", x, y, None, None, "", None, NOT_RUN, why)
    tol = next((float(z["tolerance_pct"]) for z in (y, x) if z.get("tolerance_pct") is not None),
               float(DEFAULT_RUN_TOLERANCE["pct"]))  # type: ignore[arg-type]
    delta, said, p, verdict, why = judge(x, y, tol)
    return CellDelta(title(x, y), c.get("unit") or "", x, y, delta, ratio(x, y), said, p, verdict, why)


def compare(a: Snapshot, b: Snapshot) -> Comparison:
    facts, note = differing_facts(a, b)
    return Comparison(a, b, [_delta(x, y) for x, y in pairs(a.cells, b.cells)], facts, note)


def compare_all(baseline: Snapshot, runs: Sequence[Snapshot]) -> list[Comparison]:
    return [compare(baseline, r) for r in runs]


def status(comparisons: Sequence[Comparison], fail_on: set[str] | None) -> int:
    """The exit status, as `repro report` gives it, of every run's verdicts against the baseline."""
    return exit_code((d.verdict for c in comparisons for d in c.cells if d.verdict), fail_on)


# ----------------------------------------------------------------------------------------- outputs
def _figure(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "—"
    if c["value"] is None:
        return f"— ({c['verdict']})"
    text = f"{c['value']:.2f}"
    if c["low"] is not None and c["high"] is not None:
        text += f" [{c['low']:.2f} .. {c['high']:.2f}]"
    return text + f" n={len(c['repeats'])}"


def _ratio(d: CellDelta) -> str:
    if d.ratio is None:
        return "—"
    r, low, high = d.ratio
    return f"{r:.3f}" + (f" [{low:.3f} .. {high:.3f}]" if low is not None and high is not None else "")


def _verdict(d: CellDelta) -> str:
    if not d.verdict:
        return d.detail
    if d.verdict == NOT_RUN:
        return f"not run: {d.detail}"
    if d.noise == UNKNOWN:
        return f"{d.verdict} (one repeat)"
    return d.verdict + (f" (Welch p={d.p_value:.3g})" if d.p_value is not None else "")


def _run_line(name: str, s: Snapshot) -> str:
    of = ", ".join(dict.fromkeys(c["target"] for c in s.cells)) or "no cell"
    return f"{name}: {s.label} ({of}; {s.kind}; {s.cluster or 'cluster not named'}; ran {s.started})"


def _section(i: int, cmp: Comparison, several: bool) -> list[str]:
    name = f"run {i}" if several else "the run"
    out = [f"## {name.capitalize()} against the baseline: cells matched by {MATCHED_BY}", ""]
    if not cmp.shared:
        mine = "; ".join(sorted({title(c, None) for c in cmp.b.cells})) or "none"
        theirs = "; ".join(sorted({title(c, None) for c in cmp.a.cells})) or "none"
        out += [textwrap.fill(f"The runs share no cell. The baseline has: {theirs}. {name.capitalize()} has: "
                              f"{mine}.", 120), ""]
    one = all(len({c["target"] for c in s.cells}) <= 1 for s in (cmp.a, cmp.b))  # the lines above name them
    rows = [[d.title if one else f"{targets(d)} {d.title}", _figure(d.a), _figure(d.b), _ratio(d),
             "—" if d.delta_pct is None else f"{d.delta_pct:+.2f}%", _verdict(d)] for d in cmp.cells]
    if rows and cmp.shared:
        out += [aligned(["cell", "baseline", name, "ratio [95%]", "delta", "verdict"], rows), ""]
    out += ["### Facts that differ from the baseline's, most likely cause first", ""]
    if cmp.facts_note:
        out += [textwrap.fill(cmp.facts_note, 120), ""]
    elif cmp.facts:
        out += [aligned(["fact", "baseline", name, ""], cmp.facts), ""]
    else:
        out += ["No recorded fact differs between the two runs.", ""]
    return out


def render_text(comparisons: Sequence[Comparison]) -> str:
    several = len(comparisons) > 1
    out = ["# repro compare", "", _run_line("Baseline", comparisons[0].a)]
    out += [_run_line(f"Run {i}" if several else "Run", c.b) for i, c in enumerate(comparisons, 1)] + [""]
    for i, cmp in enumerate(comparisons, 1):
        out += _section(i, cmp, several)
    counted = [d.verdict for c in comparisons for d in c.cells if d.verdict]
    tally = ", ".join(f"{counted.count(v)} {v}" for v in dict.fromkeys(counted))
    out += [f"Verdict: {tally or 'no cell compared'} ({len(counted)} baseline cell(s) in {len(comparisons)} "
            f"run(s)).", ""]
    return "\n".join(out)


def records(comparisons: Sequence[Comparison]) -> list[dict[str, Any]]:
    """One record per run and cell (the facts that differ repeat on each, as ``facts``)."""
    out = []
    for cmp in comparisons:
        facts = "; ".join(f"{k}: {x} -> {y}" for k, x, y, _ in cmp.facts) or cmp.facts_note or None
        for d in cmp.cells:
            c = d.a or d.b
            assert c is not None
            rec: dict[str, Any] = {"cell": f"{targets(d)} {d.title}", "gpus": c["gpus"], "nodes": c["nodes"],
                                   "precision": c["precision"], "batch_size": c["batch_size"],
                                   "unit": d.unit, "run_a": cmp.a.label, "run_b": cmp.b.label}
            for name, x in (("a", d.a), ("b", d.b)):
                rec |= {f"{name}_table": (x["tbl"] or None) if x else None,
                        f"{name}_target": x["target"] if x else None,
                        f"{name}_value": x["value"] if x else None, f"{name}_low": x["low"] if x else None,
                        f"{name}_high": x["high"] if x else None,
                        f"{name}_repeats": len(x["repeats"]) if x else 0,
                        f"{name}_verdict": x["verdict"] if x else None}
            r = d.ratio or (None, None, None)
            rec |= {"ratio": r[0], "ratio_low": r[1], "ratio_high": r[2], "delta_pct": d.delta_pct,
                    "noise": d.noise or None, "p_value": d.p_value, "verdict": d.verdict or None,
                    "reason": d.detail or None, "facts_differ": facts}
            out.append(rec)
    return out


def render_json(comparisons: Sequence[Comparison]) -> str:
    import json

    return json.dumps({"baseline": comparisons[0].a.label, "runs": [c.b.label for c in comparisons],
                       "cells": records(comparisons),
                       "facts": [{"run": c.b.label, "fact": k, "a": x, "b": y, "note": n}
                                 for c in comparisons for k, x, y, n in c.facts]}, indent=1) + "\n"


def render_csv(comparisons: Sequence[Comparison]) -> str:
    import csv
    import io

    rows = records(comparisons)
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows({k: spreadsheet_safe(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


RENDERERS = {"text": render_text, "json": render_json, "csv": render_csv}
