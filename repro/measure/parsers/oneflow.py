"""OneFlow-Benchmark ``Classification/cnns`` (``of_cnn_train_val.py``), as run by DLPerf.

The run starts with the argument dump of ``config.print_args``: ``Running <model>: num_gpu_per_node = G,
num_nodes = N.`` and then one ``name = value`` line per argument (``batch_size_per_device``, ``use_fp16``,
...). Every ``loss_print_every_n_iter`` iterations the ``Metric`` callback prints
``train: epoch E, iter I, loss: ..., top_1: ..., top_k: ..., samples/s: X T``: X is the global samples
over the time since the previous such line and T the unix time it was printed. Those are the records
(iteration I); validation lines are not.
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, to_int


@PARSERS.register("oneflow-cnns")
class OneflowCnns(PatternParser):
    min_records = 2  # fewest records a figure may come from (one record is no throughput figure)
    record_hints = ("samples/s: ",)
    detect_any = (
        re.compile(rf"train: epoch \d+, iter \d+, loss: {NUM}, top_1: {NUM}, top_k: {NUM}, "
                   rf"samples/s: {NUM} {NUM}"),
        re.compile(r"Running \w+: num_gpu_per_node = \d+, num_nodes = \d+\."),
    )
    rules = (
        Rule(
            rf"train: epoch (?P<epoch>\d+), iter (?P<iteration>\d+), loss: {NUM}, top_1: {NUM}, "
            rf"top_k: {NUM}, samples/s: (?P<value>{NUM}) {NUM}(?=\s)",
            "record",
        ),
        Rule(r"Running (\w+): num_gpu_per_node = (\d+), num_nodes = (\d+)\.", "on_running"),
        Rule(r"(?m)^batch_size_per_device = (\d+)[ \t]*$", "fact:batch_size", to_int),
        Rule(r"(?m)^use_fp16 = (\w+)[ \t]*$", "on_fp16"),
    )

    def on_running(self, b: Builder, m: re.Match[str], line: int) -> None:
        per_node, nodes = int(m.group(2)), int(m.group(3))
        b.new_run(per_node * nodes)
        b.facts_at((("model", m.group(1)), ("nodes", nodes), ("gpus", per_node * nodes)), line)

    def on_fp16(self, b: Builder, m: re.Match[str], line: int) -> None:
        on = m.group(1) == "True"  # the flag's default is None: not given is FP32
        b.facts_at((("amp", on), ("precision", "amp" if on else "fp32")), line)
