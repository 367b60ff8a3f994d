"""NVIDIA DeepLearningExamples PyTorch ConvNets (``main.py``), DLLogger text output.

Records are the per-iteration ``train.total_ips`` of ``Epoch: E Iteration: I`` lines (global
images/s, data time included), in ``images/s`` (2023) or ``img/s`` (2020-2022) units. The
summary is ``Summary: ... train.total_ips``, the mean over all iterations of the epoch. The
main ``PARAMETER`` line starts a run and gives batch size per GPU, world size, AMP and the data
backend.
"""

from __future__ import annotations

import re

from repro.parsers import PARSERS
from repro.parsers.base import NUM, Builder, PatternParser, Rule, params_of, to_bool, to_int

_IPS = rf"[^\n]*train\.total_ips : (?P<value>{NUM}) (?:images|img)/s"


@PARSERS.register("ngc-pytorch")
class NgcPyTorch(PatternParser):
    record_hints = ("train.total_ips",)
    mpi_tags_in_place = True
    detect_any = (
        re.compile(rf"Iteration: \d+ [^\n]*train\.total_ips : {NUM} (?:images|img)/s"),
        re.compile(r"PARAMETER [^\n]*\bdata_backend : [^\n]*\bworld_size : \d+"),
    )
    rules = (
        Rule(rf"Epoch: (?P<epoch>\d+) Iteration: (?P<iteration>\d+) {_IPS}", "record"),
        Rule(rf"Summary: {_IPS}", "summary"),
        Rule(r"PARAMETER (data : [^\n]*)", "on_params"),
    )

    def on_params(self, b: Builder, m: re.Match[str], line: int) -> None:
        p = params_of(m.group(1))
        b.new_run()
        b.fact("batch_size", to_int(p.get("batch_size", "")), line)
        b.fact("gpus", to_int(p.get("world_size", "")), line)
        if "amp" in p or "fp16" in p:
            amp = bool(to_bool(p.get("amp", "")))
            fp16 = bool(to_bool(p.get("fp16", "")))
            b.fact("amp", amp, line)
            b.fact("precision", "amp" if amp else "fp16" if fp16 else "fp32", line)
        backend = p.get("data_backend")
        if backend:
            b.fact("data_backend", backend, line)
            b.fact("dali", backend.startswith("dali"), line)
        if "memory_format" in p:
            b.fact("memory_format", p["memory_format"], line)
