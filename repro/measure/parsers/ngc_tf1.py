"""NVIDIA DeepLearningExamples TensorFlow 1.x ConvNets (``main.py``), DLLogger text output.

Records are ``(epoch, step) total_ips : x`` (``--mode=training_benchmark``, logged every
``display_every`` steps after the warm-up) or ``imgs_per_sec : x`` (``--mode=train``); both are
global images/s. The summary is ``() train_throughput : x``, the mean of every post-warm-up step.
The ``PARAMETER`` line gives batch size per GPU and the AMP, XLA and DALI switches.
"""

from __future__ import annotations

import functools
import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, params_of, to_bool, to_int


@PARSERS.register("ngc-tf1")
class NgcTf1(PatternParser):
    min_records = 5  # fewest records a figure may come from
    record_hints = ("total_ips", "imgs_per_sec", "train_throughput")
    detect_any = (
        re.compile(r"\(\d+, \d+\) (?:total_ips|imgs_per_sec) : "),
        re.compile(r"\(\) train_throughput : "),
        re.compile(r"PARAMETER [^\n]* xla : (?:True|False)"),
    )
    rules = (
        Rule(
            rf"\((?P<epoch>\d+), (?P<iteration>\d+)\) (?:total_ips|imgs_per_sec) : (?P<value>{NUM})(?=\s)",
            "record",
        ),
        Rule(rf"\(\) train_throughput : (?P<value>{NUM})(?=\s)", "summary"),
        Rule(r"PARAMETER (arch : [^\n]*)", "on_params"),
        Rule(r"Num GPUs (\d+)\n", "fact:gpus", to_int),
        Rule(r"Per-GPU Batch Size (\d+)\n", "fact:batch_size", to_int),
    )

    def on_params(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.new_run()
        b.facts_at(_facts(m.group(1)), line)


@functools.lru_cache(maxsize=256)  # the runs of a log repeat a few PARAMETER lines: each read once
def _facts(params: str) -> tuple[tuple[str, object], ...]:
    """The facts of a PARAMETER line (from ``arch :`` on: no timestamp)."""
    batch, amp, xla, dali, data_format, mode = params_of(params).pick(
        "batch_size", "amp", "xla", "dali", "data_format", "mode"
    )
    out: list[tuple[str, object]] = [("batch_size", to_int(batch or ""))]
    if amp is not None:
        on = bool(to_bool(amp))
        out += [("amp", on), ("precision", "amp" if on else "fp32")]
    out += [(key, to_bool(value)) for key, value in (("xla", xla), ("dali", dali)) if value is not None]
    out += [("data_format", data_format), ("mode", mode)]
    return tuple(out)
