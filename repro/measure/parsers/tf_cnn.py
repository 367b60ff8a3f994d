"""tensorflow/benchmarks ``tf_cnn_benchmarks.py``.

Each display step prints ``<step>\\timages/sec: <x> +/- <u> (jitter = <j>)\\t<loss>...``; the
run ends with ``total images/sec: <x>``, which is the summary. Facts come from the header block
(``TensorFlow:``, ``Batch size: N global`` / ``M per device``, ``Devices: [...]``).
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import MPI_PREFIX, NUM, Builder, PatternParser, Rule, to_int


@PARSERS.register("tf-cnn-benchmarks")
class TfCnnBenchmarks(PatternParser):
    min_records = 2  # fewest records a figure may come from (one record is no throughput figure)
    record_hints = ("images/sec: ",)
    detect_any = (
        re.compile(rf"(?m)^\d+\timages/sec: {NUM} \+/- {NUM} \(jitter = {NUM}\)"),
        re.compile(rf"(?m)^total images/sec: {NUM}"),
        re.compile(r"(?m)^TensorFlow: +\S+\nModel: +\S+"),
    )
    rules = (
        # the step number is the whole text before the tab (spaces around it allowed)
        Rule(
            rf"^{MPI_PREFIX}[ \t]*(?P<iteration>\d+)[ \t]*\timages/sec: (?P<value>{NUM}) \+/- {NUM} "
            rf"\(jitter = {NUM}\)",
            "record",
            flags=re.M,
        ),
        Rule(rf"total images/sec: (?P<value>{NUM})(?=\s)", "summary"),
        Rule(r"TensorFlow: +(\S+)\n", "on_header"),
        Rule(rf"Batch size: +\d+ global\n{MPI_PREFIX} +(\d+) per device", "fact:batch_size", to_int),
        Rule(r"Devices: +\[([^\]\n]*)\]", "on_devices"),
    )

    def on_header(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.new_run()
        b.fact("framework_version", m.group(1), line)

    def on_devices(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.fact("gpus", len([d for d in m.group(1).split(",") if d.strip()]), line)
