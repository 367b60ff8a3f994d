"""What `repro explain` sets a cell beside: the publication's own log of the cell, and the same target's
1-GPU cell.

A deviation is only as meaningful as its baseline. Where the published figure comes from its log, the run is
judged against that figure and the log's input share is the right comparison. Where it does not (the figure
lies outside every record of the log: ``not derivable``, or re-derives outside the table's tolerance:
``deviates``), the first thing to say is whether the run agrees with that log, which the kit can check; and an
input pipeline that takes as much of a step in the run as in the publication's log is no evidence either way,
while against the same target at 1 GPU it shows a run bound by its input as more GPUs share one reader.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.verdict.rules import MATCH, REDERIVATION, REPRODUCED, estimate, judge_new_run, run_tolerance

PADDLE = re.compile(r"batch_cost: ([0-9.]+) s, reader_cost: ([0-9.]+) s")
DLE = re.compile(r"train\.compute_ips : ([0-9.]+) images/s train\.total_ips : ([0-9.]+) images/s")
MAX_LINES = 2_000_000  # lines read of one log for the input pipeline
INPUT_BOUND = 0.05     # a share of each step that goes to input from which a run is called input-bound
GAP = 0.03             # more than this above its baseline (1 GPU, or the publication's log) counts


def input_share(lines: Iterable[str]) -> tuple[str, float, int] | None:
    """The share of each step a log says went to input: PaddleClas ``reader_cost / batch_cost`` (means over
    the records), DLE PyTorch ``1 - total_ips / compute_ips``; (what was read, share, records) or None."""
    paddle: list[tuple[float, float]] = []
    dle: list[tuple[float, float]] = []
    for n, line in enumerate(lines):
        if n >= MAX_LINES:
            break
        if "reader_cost" in line and (m := PADDLE.search(line)):
            paddle.append((float(m[1]), float(m[2])))
        elif "total_ips" in line and (m := DLE.search(line)):
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


def share_of(paths: Sequence[Path]) -> tuple[str, float, int] | None:
    """The input share over several logs (the mean of theirs), what was read, and the records it came from."""
    found = []
    for p in paths:
        try:
            with Path(p).open(encoding="utf-8", errors="replace") as f:
                got = input_share(f)
        except OSError:
            continue
        if got is not None:
            found.append(got)
    if not found:
        return None
    return found[0][0], statistics.fmean(s for _, s, _ in found), sum(n for _, _, n in found)


@dataclass
class Baselines:
    """A judged table (repro.verdict.reproduce.TableResult) and what its cells are set beside; ``root``: where
    the cells' relative log paths are (a run directory), or None where they are absolute."""

    table: Any
    root: Path | None = None
    _rederived: dict[str, Any] = field(default_factory=dict)

    def logs(self, c: Any) -> list[Path]:
        return [self.root / p if self.root is not None else Path(p) for p in c.logs]

    def published_cell(self, c: Any) -> Any:
        if self.table.table is None:
            return None
        return next((pc for pc in self.table.table.cells if (pc.nodes, pc.gpus, pc.precision, pc.batch_size)
                     == (c.nodes, c.gpus, c.precision, c.batch_size)), None)

    def rederived(self, c: Any) -> Any:
        """The cell re-derived from the publication's own log (itself, where it is that), or None."""
        if c.kind == REDERIVATION:
            return c
        key = f"{c.nodes}/{c.gpus}/{c.precision}/{c.batch_size}"
        if key not in self._rederived:
            from repro.verdict.reproduce import reproduce_cell

            pc = self.published_cell(c)
            ok = pc is not None and pc.value != "-" and pc.logs and all(Path(p).is_file() for p in pc.logs)
            self._rederived[key] = (reproduce_cell(self.table.manifest, self.table.table, pc, list(pc.logs),
                                                   REDERIVATION) if ok else None)
        return self._rederived[key]

    def one_gpu(self, c: Any) -> Any:
        """The same target's 1-GPU cell of this table (same precision and batch), or None (a 1-GPU cell)."""
        if c.gpus == 1:
            return None
        return next((o for o in self.table.cells if o.gpus == 1 and o.nodes == 1 and o.column == c.column
                     and (o.precision, o.batch_size) == (c.precision, c.batch_size)), None)

    def from_its_log(self, c: Any) -> bool:
        """Whether the published figure of the cell comes from the publication's log (or no log says)."""
        rd = self.rederived(c)
        return rd is None or rd.reproduced is None or rd.verdict == MATCH


def against_published_log(c: Any, b: Baselines) -> tuple[float, str] | None:
    """Where the published figure does not come from its log: (score, text) saying whether the run agrees
    with the figure that log gives, with the numbers; None where it does come from it (or there is none)."""
    rd = b.rederived(c)
    if b.from_its_log(c) or c.reproduced is None:
        return None
    tol = c.tolerance_pct if c.tolerance_pct is not None else run_tolerance(None)[0]
    verdict, why = judge_new_run(estimate(c.reproduced, c.repeats), rd.reproduced, tol)
    delta = (c.reproduced - rd.reproduced) / rd.reproduced * 100
    not_from = f"the published {c.published} does not come from that log ({rd.verdict}: {rd.detail})"
    if verdict == REPRODUCED:
        return 1.0, (f"the run matches the publication's own log: {c.reproduced:.2f} against the "
                     f"{rd.reproduced:.2f} its log gives ({delta:+.2f}%, tolerance ±{tol:g}%); "
                     + not_from)
    return 1.0, (f"the run is {verdict} against the publication's own log too: {c.reproduced:.2f} against "
                 f"the {rd.reproduced:.2f} its log gives ({why}); {not_from}")


def input_baselines(c: Any, b: Baselines) -> tuple[tuple[float, str] | None, tuple[float, str] | None]:
    """The input share of the publication's log of the cell, and of the same target's 1-GPU cell (this
    run's where it ran, else the publication's 1-GPU log): each (share, where it was read), or None."""
    rd = b.rederived(c)
    theirs = share_of(rd.logs) if rd is not None and rd is not c else None
    one, at_one = b.one_gpu(c), None
    if one is not None and one.logs and one.kind == c.kind:
        got = share_of(b.logs(one))
        whose = "this run's" if b.root is not None else "your logs'"
        where = "the publication's 1-GPU log" if c.kind == REDERIVATION else f"{whose} {_key(one)}"
        at_one = (got[1], where) if got else None
    if at_one is None and one is not None and c.kind != REDERIVATION:
        rd1 = b.rederived(one)
        got = share_of(rd1.logs) if rd1 is not None else None
        at_one = (got[1], "the publication's 1-GPU log") if got else None
    return ((theirs[1], "the publication's log") if theirs else None), at_one


def _key(c: Any) -> str:
    return f"{c.nodes}n{c.gpus // max(1, c.nodes)}g-{c.precision}-bs{c.batch_size}"


def judge_input(c: Any, b: Baselines, share: float) -> tuple[float | None, str]:
    """Whether a share of ``share`` makes the cell input-bound, against the publication's log and the same
    target at 1 GPU: (score, the baselines in words); score None where it is not input-bound."""
    theirs, at_one = input_baselines(c, b)
    words = [f"against {at_one[0] * 100:.1f}% at 1 GPU ({at_one[1]})" if at_one else "",
             f"{theirs[1]}: {theirs[0] * 100:.1f}%" if theirs else ""]
    said = "; ".join(w for w in words if w)
    gap_pub = share - theirs[0] if theirs else None
    gap_one = share - at_one[0] if at_one else None
    if share < INPUT_BOUND:
        return None, said
    if gap_pub is not None and gap_pub >= GAP:
        return min(0.95, 0.4 + gap_pub), said
    if gap_one is not None and gap_one >= GAP:
        if c.kind == REDERIVATION or not b.from_its_log(c):  # why the log (and a run like it) falls short
            return min(0.9, 0.4 + gap_one), said
        return 0.2, said + "; as much as in the publication's log, so not by itself why the run deviates"
    if gap_pub is None and gap_one is None:
        return 0.4, said
    return None, said


def scaling(c: Any, b: Baselines) -> tuple[float, str] | None:
    """A re-derived multi-GPU cell: the scaling its log gives over the 1-GPU log, against the published."""
    one = b.one_gpu(c)
    if c.gpus < 2 or one is None or c.reproduced is None or one.reproduced is None or not one.published:
        return None
    got = c.reproduced / (one.reproduced * c.gpus)
    pub = float(c.published) / (float(one.published) * c.gpus)
    return 0.3, (f"scaling: the log gives {c.reproduced:.2f} = {got * 100:.1f}% of {c.gpus} x its 1-GPU "
                 f"{one.reproduced:.2f}; the published {c.published} would be {pub * 100:.1f}% of "
                 f"{c.gpus} x the published {one.published}")
