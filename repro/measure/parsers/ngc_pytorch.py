"""NVIDIA DeepLearningExamples PyTorch ConvNets (``main.py``), DLLogger text output.

Records are the per-iteration ``train.total_ips`` of ``Epoch: E Iteration: I`` lines (global
images/s, data time included), in ``images/s`` (2023) or ``img/s`` (2020-2022) units. The
summary is ``Summary: ... train.total_ips``, the mean over all iterations of the epoch; the
Summary's ``train.compute_ips`` (compute time only) is kept by name, for a table that printed
that figure instead (a protocol's ``summary_metric``). The
main ``PARAMETER`` line starts a run and gives batch size per GPU, world size, AMP and the data
backend.
"""

from __future__ import annotations

import functools
import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, params_of, to_bool, to_int

_IPS = rf"[^\n]*train\.total_ips : (?P<value>{NUM}) (?:images|img)/s"
_COMPUTE_IPS = rf"[^\n]*train\.compute_ips : (?P<value>{NUM}) (?:images|img)/s"


@PARSERS.register("ngc-pytorch")
class NgcPyTorch(PatternParser):
    min_records = 10  # fewest records a figure may come from
    record_hints = ("train.total_ips",)
    summary_name = "train.total_ips"
    detect_any = (
        re.compile(rf"Iteration: \d+ [^\n]*train\.total_ips : {NUM} (?:images|img)/s"),
        re.compile(r"PARAMETER [^\n]*\bdata_backend : [^\n]*\bworld_size : \d+"),
    )
    rules = (
        Rule(rf"Epoch: (?P<epoch>\d+) Iteration: (?P<iteration>\d+) {_IPS}", "record"),
        Rule(rf"Summary: {_IPS}", "summary"),
        Rule(rf"Summary: {_COMPUTE_IPS}", "summary:train.compute_ips"),
        Rule(r"PARAMETER (data : [^\n]*)", "on_params"),
    )

    def on_params(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.new_run()
        b.facts_at(_facts(m.group(1)), line)


@functools.lru_cache(maxsize=256)  # the runs of a log repeat a few PARAMETER lines: each read once
def _facts(params: str) -> tuple[tuple[str, object], ...]:
    """The facts of a PARAMETER line (from ``data :`` on: no timestamp)."""
    batch, world, amp, fp16, backend, memory_format = params_of(params).pick(
        "batch_size", "world_size", "amp", "fp16", "data_backend", "memory_format"
    )
    out: list[tuple[str, object]] = [("batch_size", to_int(batch or "")), ("gpus", to_int(world or ""))]
    if amp is not None or fp16 is not None:
        on = bool(to_bool(amp or ""))
        out += [("amp", on), ("precision", "amp" if on else "fp16" if to_bool(fp16 or "") else "fp32")]
    if backend:
        out += [("data_backend", backend), ("dali", backend.startswith("dali"))]
    out.append(("memory_format", memory_format))
    return tuple(out)
