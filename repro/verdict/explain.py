"""Why a new run's cell deviates: ranked evidence from the run itself, each item with its numbers.

For every cell judged ``slower``, ``faster`` or ``inconclusive`` (repro.verdict.rules), each source of
evidence the run holds is read and scored by how much it could move the figure:

- telemetry (repro.nodes.telemetry): clock event reasons that slow a busy GPU (power, thermal, hardware
  slowdown) for a share of the cell's samples, or SM clocks below their maximum without a reason; compute
  processes on the cell's GPUs that belong to no container of the cell;
- NCCL's transport from the ranks' logs (repro.measure.nccl): sockets between nodes where the target was
  published over InfiniBand;
- the input pipeline, where the logs print it: PaddleClas ``reader_cost`` against ``batch_cost``, NGC
  PyTorch (DLE) ``train.total_ips`` against ``train.compute_ips``; beside the publication's own log where
  the cell has one;
- the environment against the publication's (driver, CUDA, image, framework: the audit's environment checks
  of the run's provenance, given by the caller);
- the repeats: too few for their spread, or one.

The score is a rough prior (0..1) of how much each kind of evidence could explain the deviation, scaled by
how much of the cell it covers; the ranking is what the reader sees first. A cell with no evidence says so,
and what was looked at.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.fit import fit_line, fit_text
from repro.measure import nccl
from repro.nodes.telemetry import summary as telemetry_summary
from repro.verdict.report import row_label
from repro.verdict.rules import FASTER, INCONCLUSIVE, NEW_RUN, SLOWER

DEVIATING = (SLOWER, FASTER, INCONCLUSIVE)
_PADDLE = re.compile(r"batch_cost: ([0-9.]+) s, reader_cost: ([0-9.]+) s")
_DLE = re.compile(r"train\.compute_ips : ([0-9.]+) images/s train\.total_ips : ([0-9.]+) images/s")
MAX_LINES = 2_000_000  # lines read of one log for the input pipeline


@dataclass(frozen=True)
class Evidence:
    kind: str    # throttling | clocks | other-processes | nccl-socket | input-bound | environment | repeats
    score: float
    text: str


@dataclass
class Explanation:
    target: str
    cell: str     # the matrix cell's key, e.g. 1n8g-fp32-bs256
    label: str    # as the report's table names it
    verdict: str
    figures: str  # published → reproduced (delta, n)
    evidence: list[Evidence] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "cell": self.cell, "label": self.label, "verdict": self.verdict,
                "figures": self.figures, "evidence": [e.__dict__ for e in self.evidence],
                "checked": self.checked}


def cell_key(c: Any) -> str:
    return f"{c.nodes}n{c.gpus // max(1, c.nodes)}g-{c.precision}-bs{c.batch_size}"


def explain_run(run_dir: Path, table: Any, *, environment: Sequence[Any] = (), only: str | None = None,
                published_logs: Mapping[str, Sequence[Path]] | None = None) -> list[Explanation]:
    """One explanation per deviating cell of ``table`` (reproduce_run's TableResult of ``run_dir``), or of
    the cell ``only`` names (its key). ``environment``: the audit's environment checks of the run (objects
    with ``item``, ``status``, ``expected``, ``observed``); ``published_logs``: the publication's log of a
    cell, by its key, to set the run's input pipeline beside."""
    out = []
    for c in table.cells:
        key = cell_key(c)
        if only is not None and only != key:
            continue
        if c.kind != NEW_RUN or c.verdict not in DEVIATING:
            continue
        e = Explanation(c.target, key, f"{row_label(c)} {c.precision} bs{c.batch_size}", c.verdict,
                        _figures(c))
        logs = [run_dir / p for p in c.logs]
        for source in (_telemetry, _transport, _input, _repeats):
            source(e, run_dir, c, logs, table.manifest, (published_logs or {}).get(key, ()))
        _environment(e, environment)
        e.evidence.sort(key=lambda x: -x.score)
        out.append(e)
    return out


def _figures(c: Any) -> str:
    got = "—" if c.reproduced is None else f"{c.reproduced:.2f}"
    delta = "" if c.delta_pct is None else f"{c.delta_pct:+.2f}%, "
    return f"{c.published} → {got} ({delta}n={len(c.repeats)})"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


# ----------------------------------------------------------------------------------------- telemetry
def _telemetry(e: Explanation, run_dir: Path, c: Any, logs: Sequence[Path], manifest: Any,
               published: Sequence[Path]) -> None:
    found = telemetry_summary(run_dir, e.cell)
    if (found or {}).get("skipped"):
        e.checked.append(f"telemetry: {found['skipped']} bad sample line(s) skipped")  # type: ignore[index]
    if (found or {}).get("misshapen"):
        e.checked.append(f"telemetry: {found['misshapen']} telemetry.json file(s) of the wrong shape, "  # type: ignore[index]
                         "read from the samples")
    gpu = (found or {}).get("gpu")
    if not gpu:
        e.checked.append("telemetry: no GPU samples recorded" if found is None or not found.get("cpu")
                         else "telemetry: CPU samples only (no GPU on the nodes)")
        return
    _clocks(e, gpu)
    _others(e, gpu.get("other_processes") or [])


def _clocks(e: Explanation, gpu: Mapping[str, Any]) -> None:
    busy = gpu.get("busy_samples") or 0
    slowed, below = gpu.get("slowed_share") or 0.0, gpu.get("below_max_share") or 0.0
    clock = (f"SM clock {gpu['sm_mhz_mean_busy']:.0f} MHz on average against a maximum of "
             f"{gpu['sm_max_mhz']:.0f}" if gpu.get("sm_mhz_mean_busy") and gpu.get("sm_max_mhz") else "")
    extra = "; ".join(x for x in (
        clock, f"up to {gpu['temperature_max_c']:.0f} C" if gpu.get("temperature_max_c") else "",
        f"power at {_pct(gpu['power_of_limit_mean'])} of its limit on average"
        if gpu.get("power_of_limit_mean") is not None else "") if x)
    if slowed >= 0.02:
        named = ", ".join(f"{k} {_pct(v)}" for k, v in sorted(gpu["reasons"].items(), key=lambda kv: -kv[1])
                          if k != "gpu_idle" and v)
        e.evidence.append(Evidence("throttling", 0.5 + 0.5 * slowed,
                                   f"GPUs throttled in {_pct(slowed)} of {busy} busy samples ({named}); "
                                   + extra))
    elif below >= 0.1:
        e.evidence.append(Evidence("clocks", 0.3 + 0.4 * below,
                                   f"SM clock below 97% of its maximum in {_pct(below)} of {busy} busy "
                                   f"samples with no clock event reason; {extra}"))
    else:
        e.checked.append(f"telemetry: clocks at their maximum in {_pct(1 - below)} of {busy} busy samples, "
                         "no throttling")


def _others(e: Explanation, others: Sequence[Mapping[str, Any]]) -> None:
    if not others:
        e.checked.append("telemetry: no other process on the cell's GPUs")
        return
    named = ", ".join(f"pid {a['pid']} {a['name']}" + (f" ({a['memory_mib']:.0f} MiB)" if a.get("memory_mib")
                                                       else "") for a in others[:4])
    more = f" and {len(others) - 4} more" if len(others) > 4 else ""
    e.evidence.append(Evidence("other-processes", 0.85,
                               f"{len(others)} process(es) of no container of this cell on its GPUs: "
                               f"{named}{more}"))


# ----------------------------------------------------------------------------------------- transport
def _node_logs(logs: Sequence[Path]) -> list[Path]:
    """Every node's log of the repeats whose rank-0 log the cell used."""
    return sorted({p for log in logs for p in log.parent.glob("*.log")})


def _transport(e: Explanation, run_dir: Path, c: Any, logs: Sequence[Path], manifest: Any,
               published: Sequence[Path]) -> None:
    if c.nodes < 2:
        e.checked.append("NCCL transport: a one-node cell (no network between ranks)")
        return
    if manifest.expect.get("interconnect") not in ("infiniband", "roce"):
        e.checked.append("NCCL transport: the publication names no InfiniBand")
        return
    sockets, unknown, files = [], 0, _node_logs(logs)
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as f:
            s = nccl.scan(f)
        if s.transport not in (None, nccl.IB):
            sockets.append((path, s))
        elif s.transport is None:
            unknown += 1
    if sockets:
        path, s = sockets[0]
        e.evidence.append(Evidence(
            "nccl-socket", 0.9,
            f"NCCL used {s.transport}, not InfiniBand, in {len(sockets)} of {len(files)} node logs "
            f"({path.relative_to(run_dir).as_posix()}: {s.evidence!r})"
            + (f"; libibverbs found no driver for {s.missing_driver}" if s.missing_driver else "")))
    elif unknown == len(files):
        e.evidence.append(Evidence("nccl-unknown", 0.15, f"no NCCL_DEBUG=INFO line in the {len(files)} node "
                                                         "logs tells which transport NCCL used"))
    else:
        e.checked.append(f"NCCL transport: InfiniBand in {len(files) - unknown} of {len(files)} node logs")


# ----------------------------------------------------------------------------------------- input
def input_share(lines: Iterable[str]) -> tuple[str, float, int] | None:
    """The share of each step a log says went to input: PaddleClas ``reader_cost / batch_cost`` (means over
    the records), DLE PyTorch ``1 - total_ips / compute_ips``; (what was read, share, records) or None."""
    paddle: list[tuple[float, float]] = []
    dle: list[tuple[float, float]] = []
    for n, line in enumerate(lines):
        if n >= MAX_LINES:
            break
        if "reader_cost" in line and (m := _PADDLE.search(line)):
            paddle.append((float(m[1]), float(m[2])))
        elif "total_ips" in line and (m := _DLE.search(line)):
            dle.append((float(m[1]), float(m[2])))
    if paddle:
        batch = statistics.fmean(b for b, _ in paddle)
        return ("reader_cost of batch_cost", statistics.fmean(r for _, r in paddle) / batch if batch else 0.0,
                len(paddle))
    if dle:
        compute = statistics.fmean(x for x, _ in dle)
        return ("time outside compute (1 - total_ips / compute_ips)",
                1 - statistics.fmean(t for _, t in dle) / compute if compute else 0.0, len(dle))
    return None


def _share_of(paths: Sequence[Path]) -> tuple[str, float, int] | None:
    found = []
    for p in paths:
        with Path(p).open(encoding="utf-8", errors="replace") as f:
            if (got := input_share(f)) is not None:
                found.append(got)
    if not found:
        return None
    return found[0][0], statistics.fmean(s for _, s, _ in found), sum(n for _, _, n in found)


def _input(e: Explanation, run_dir: Path, c: Any, logs: Sequence[Path], manifest: Any,
           published: Sequence[Path]) -> None:
    ours = _share_of(logs)
    if ours is None:
        e.checked.append("input pipeline: the logs print no reader or data-loader time")
        return
    what, share, records = ours
    theirs = _share_of(published) if published else None
    beside = f"; the publication's log: {theirs[1] * 100:.1f}%" if theirs else ""
    gap = share - (theirs[1] if theirs else 0.0)
    if share >= 0.05 and gap >= 0.03:
        e.evidence.append(Evidence("input-bound", min(0.95, 0.4 + gap),
                                   f"input-bound: {what} is {share * 100:.1f}% over {records} records of "
                                   f"{len(logs)} repeat(s){beside}"))
    else:
        e.checked.append(f"input pipeline: {what} {share * 100:.1f}%{beside}")


# ----------------------------------------------------------------------------------------- the rest
def _repeats(e: Explanation, run_dir: Path, c: Any, logs: Sequence[Path], manifest: Any,
             published: Sequence[Path]) -> None:
    n, spread, tol = len(c.repeats), c.spread_pct, c.tolerance_pct
    if n == 1:
        e.evidence.append(Evidence("repeats", 0.3, "one repeat: no spread known, so noise cannot be told "
                                                   "from a deviation (run more with --repeats)"))
    elif c.verdict == INCONCLUSIVE:
        e.evidence.append(Evidence("repeats", 0.6, f"{n} repeats spread {spread:.1f}% (standard deviation) "
                                                   f"against a tolerance of ±{tol:g}%: {c.detail}"))
    elif spread is not None and tol is not None and spread > tol / 2:
        e.evidence.append(Evidence("repeats", 0.25, f"{n} repeats spread {spread:.1f}%, more than half the "
                                                    f"tolerance ±{tol:g}%"))
    else:
        e.checked.append(f"repeats: {n}, spread {spread:.2f}% within the tolerance ±{tol:g}%"
                         if spread is not None and tol is not None else f"repeats: {n}")


def _environment(e: Explanation, checks: Sequence[Any]) -> None:
    drift = [x for x in checks if getattr(x, "status", "") == "drift"]
    if drift:
        e.evidence.append(Evidence("environment", 0.35, "environment differs from the publication's: "
                                   + "; ".join(f"{x.item} {x.observed} (published {x.expected})"
                                               for x in drift)))
    elif checks:
        e.checked.append(f"environment: {len(checks)} facts as published")
    else:
        e.checked.append("environment: no provenance record to compare")


def pointer(run: str, cells: Iterable[Any]) -> str | None:
    """The line ``repro report`` of a run adds when some of its cells deviate."""
    n = sum(1 for c in cells if c.kind == NEW_RUN and c.verdict in DEVIATING)
    if not n:
        return None
    return fit_line(f"Why: `repro explain {run}` ranks the evidence for the {n} slower, faster or "
                    "inconclusive " + ("cell." if n == 1 else "cells."))


def render_text(explanations: Sequence[Explanation], run: str) -> str:
    """The explanations for a reader, 120 columns: each cell, its evidence ranked, what showed nothing."""
    if not explanations:
        return f"{run}: no cell is slower, faster or inconclusive; nothing to explain.\n"
    out = []
    for e in explanations:
        out.append(f"{e.target} {e.label}: {e.verdict}, {e.figures}")
        if not e.evidence:
            out.append("  nothing in the run explains it; looked at:")
        for i, ev in enumerate(e.evidence, 1):
            out.append(f"  {i}. [{ev.kind}] {ev.text}")
        if e.evidence and e.checked:
            out.append("  found nothing in:")
        out += [f"     - {x}" for x in e.checked]
        out.append("")
    return fit_text("\n".join(out))
