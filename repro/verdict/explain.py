"""Why a cell deviates: ranked evidence, each item with its numbers, beside the right baselines.

Three things can be explained (:data:`RUN`, :data:`LOGS`, :data:`PUBLISHED`): a ``repro up`` run directory
(or archive), a tree of your logs (``--from-logs``), and a published table (why a published figure deviates
from the publication's own log). For every cell judged ``slower``, ``faster`` or ``inconclusive``
(repro.verdict.rules), or for a published table ``deviates`` or ``not derivable``, each source of evidence is
read and scored by how much it could move the figure:

- the publication's own log of the cell (repro.verdict.baselines), first: where the published figure does
  not come from that log, whether the run agrees with the figure the log gives;
- telemetry (repro.nodes.telemetry, a run only): clock event reasons that slow a busy GPU (power, thermal,
  hardware slowdown) for a share of the cell's samples, or SM clocks below their maximum without a reason;
  compute processes on the cell's GPUs that belong to no container of the cell;
- NCCL's transport from the ranks' logs (repro.measure.nccl): sockets between nodes where the target was
  published over InfiniBand;
- the input pipeline, where the logs print it: PaddleClas ``reader_cost`` against ``batch_cost``, NGC
  PyTorch (DLE) ``train.total_ips`` against ``train.compute_ips``; against the same target's 1-GPU cell and
  the publication's own log;
- a published table's multi-GPU cell: the scaling its log gives over the 1-GPU log;
- the environment against the publication's (the audit's environment checks of a run's provenance);
- the repeats: too few for their spread, or one.

The score is a rough prior (0..1) of how much each kind of evidence could explain the deviation, scaled by
how much of the cell it covers; the ranking is what the reader sees first. A cell with no evidence says so,
and what was looked at; a tree of logs and a publication's log say what they cannot show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.fit import fit_line, fit_text
from repro.measure import nccl
from repro.nodes.telemetry import summary as telemetry_summary
from repro.verdict.baselines import (Baselines, against_published_log, input_share, judge_input, scaling,
                                     share_of)
from repro.verdict.report import row_label
from repro.verdict.rules import DEVIATES, FASTER, INCONCLUSIVE, NEW_RUN, NOT_DERIVABLE, REDERIVATION, SLOWER

__all__ = ["DEVIATING", "Evidence", "Explanation", "explain_run", "explain_table", "input_share", "pointer",
           "render_text"]

DEVIATING = (SLOWER, FASTER, INCONCLUSIVE)
RUN, LOGS, PUBLISHED = "run", "logs", "published"  # what is explained: a run directory, a log tree, a table


@dataclass(frozen=True)
class Evidence:
    kind: str    # published-log | throttling | clocks | other-processes | nccl-socket | input-bound | ...
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


@dataclass
class Context:
    kind: str  # RUN, LOGS or PUBLISHED
    base: Baselines

    def logs(self, c: Any) -> list[Path]:
        return self.base.logs(c)


def cell_key(c: Any) -> str:
    return f"{c.nodes}n{c.gpus // max(1, c.nodes)}g-{c.precision}-bs{c.batch_size}"


def explain_run(run_dir: Path, table: Any, *, environment: Sequence[Any] = (),
                only: str | None = None) -> list[Explanation]:
    """One explanation per deviating cell of ``table`` (reproduce_run's TableResult of ``run_dir``), or of
    the cell ``only`` names (its key). ``environment``: the audit's environment checks of the run (objects
    with ``item``, ``status``, ``expected``, ``observed``)."""
    return explain_table(table, RUN, root=run_dir, environment=environment, only=only)


def explain_table(table: Any, kind: str, *, root: Path | None = None, environment: Sequence[Any] = (),
                  only: str | None = None) -> list[Explanation]:
    """One explanation per deviating cell of a judged table: a run's (``root``: its directory), a tree of
    logs' (reproduce_table with ``from_logs``) or a published table's re-derivation."""
    ctx = Context(kind, Baselines(table, root))
    out = []
    for c in table.cells:
        key = cell_key(c)
        if (only is not None and only != key) or not _deviates(c, kind):
            continue
        e = Explanation(c.target, key, f"{row_label(c)} {c.precision} bs{c.batch_size}", c.verdict,
                        _figures(c))
        sources = (_published_log, _telemetry, _transport, _input, _scaling, _repeats, _environment)
        for source in sources:
            source(e, c, ctx, environment)
        e.evidence.sort(key=lambda x: -x.score)
        out.append(e)
    return out


def _deviates(c: Any, kind: str) -> bool:
    if kind == PUBLISHED:
        return c.kind == REDERIVATION and c.verdict in (DEVIATES, NOT_DERIVABLE) and c.reproduced is not None
    return c.kind == NEW_RUN and c.verdict in DEVIATING


def _figures(c: Any) -> str:
    got = "—" if c.reproduced is None else f"{c.reproduced:.2f}"
    delta = "" if c.delta_pct is None else f"{c.delta_pct:+.2f}%, "
    if c.kind == REDERIVATION:
        return f"{c.published} → {got} from its log ({delta.rstrip(', ')})"
    return f"{c.published} → {got} ({delta}n={len(c.repeats)})"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


# ----------------------------------------------------------------------------------------- baselines
def _published_log(e: Explanation, c: Any, ctx: Context, environment: Sequence[Any]) -> None:
    if ctx.kind == PUBLISHED:
        e.evidence.append(Evidence(c.verdict.replace(" ", "-"), 1.0, c.detail))
        return
    found = against_published_log(c, ctx.base)
    if found is not None:
        e.evidence.append(Evidence("published-log", *found))
    elif ctx.base.rederived(c) is None:
        e.checked.append("the publication's log: none bundled for this cell")
    else:
        e.checked.append("the publication's log: it gives the published figure (the run is judged on it)")


def _scaling(e: Explanation, c: Any, ctx: Context, environment: Sequence[Any]) -> None:
    if ctx.kind == PUBLISHED and (found := scaling(c, ctx.base)) is not None:
        e.evidence.append(Evidence("scaling", *found))


# ----------------------------------------------------------------------------------------- telemetry
def _telemetry(e: Explanation, c: Any, ctx: Context, environment: Sequence[Any]) -> None:
    if ctx.kind != RUN or ctx.base.root is None:
        e.checked.append("telemetry: " + ("a tree of logs holds none" if ctx.kind == LOGS
                                          else "a publication's log holds none")
                         + " (GPU clocks, throttling, other processes on the GPUs: `repro up` samples them)")
        return
    found = telemetry_summary(ctx.base.root, e.cell)
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


def _transport(e: Explanation, c: Any, ctx: Context, environment: Sequence[Any]) -> None:
    manifest, logs = ctx.base.table.manifest, ctx.logs(c)
    if c.nodes < 2:
        e.checked.append("NCCL transport: a one-node cell (no network between ranks)")
        return
    if manifest.expect.get("interconnect") not in ("infiniband", "roce"):
        e.checked.append("NCCL transport: the publication names no InfiniBand")
        return
    # a run's every node log of the repeats; a tree's or a publication's: the logs the cell was judged on
    sockets, unknown, files = [], 0, _node_logs(logs) if ctx.kind == RUN else logs
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
            f"({_shown(path, ctx)}: {s.evidence!r})"
            + (f"; libibverbs found no driver for {s.missing_driver}" if s.missing_driver else "")))
    elif unknown == len(files):
        e.evidence.append(Evidence("nccl-unknown", 0.15, f"no NCCL_DEBUG=INFO line in the {len(files)} node "
                                                         "logs tells which transport NCCL used"))
    else:
        e.checked.append(f"NCCL transport: InfiniBand in {len(files) - unknown} of {len(files)} node logs")


# ----------------------------------------------------------------------------------------- input
def _input(e: Explanation, c: Any, ctx: Context, environment: Sequence[Any]) -> None:
    logs = ctx.logs(c)
    ours = share_of(logs)
    if ours is None:
        e.checked.append("input pipeline: the logs print no reader or data-loader time")
        return
    what, share, records = ours
    score, beside = judge_input(c, ctx.base, share)
    whose = "the log" if ctx.kind == PUBLISHED else f"{len(logs)} repeat(s)"
    text = f"{what} is {share * 100:.1f}% over {records} records of {whose}"
    text += (", " if beside.startswith("against") else "; ") + beside if beside else ""
    if score is not None:
        e.evidence.append(Evidence("input-bound", score, "input-bound: " + text))
    else:
        e.checked.append(f"input pipeline: {what} {share * 100:.1f}%" + (f"; {beside}" if beside else ""))


def _shown(path: Path, ctx: Context) -> str:
    root = ctx.base.root
    return path.relative_to(root).as_posix() if root is not None and path.is_relative_to(root) else str(path)


# ----------------------------------------------------------------------------------------- the rest
def _repeats(e: Explanation, c: Any, ctx: Context, environment: Sequence[Any]) -> None:
    if ctx.kind == PUBLISHED:
        return
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


def _environment(e: Explanation, c: Any, ctx: Context, checks: Sequence[Any]) -> None:
    if ctx.kind != RUN:
        e.checked.append("environment: " + ("a tree of logs records none" if ctx.kind == LOGS else
                                            "a publication's log records none beyond the manifest's expect")
                         + " (driver, CUDA, image: a run's provenance.json records them)")
        return
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


def render_text(explanations: Sequence[Explanation], run: str, kind: str = RUN) -> str:
    """The explanations for a reader, 120 columns: each cell, its evidence ranked, what showed nothing."""
    if not explanations:
        what = ("deviates from its log or is not derivable" if kind == PUBLISHED
                else "is slower, faster or inconclusive")
        return f"{run}: no cell {what}; nothing to explain.\n"
    out = []
    for e in explanations:
        out.append(f"{e.target} {e.label}: {e.verdict}, {e.figures}")
        if not e.evidence:
            out.append(f"  nothing in the {'logs' if kind != RUN else 'run'} explains it; looked at:")
        for i, ev in enumerate(e.evidence, 1):
            out.append(f"  {i}. [{ev.kind}] {ev.text}")
        if e.evidence and e.checked:
            out.append("  found nothing in:")
        out += [f"     - {x}" for x in e.checked]
        out.append("")
    return fit_text("\n".join(out))
