"""OneFlow-Benchmark BERT pretraining (``LanguageModeling/BERT/run_pretraining.py``, v0.2.0) as DLPerf ran it.

The script prints its arguments first (``name = value``, one a line: ``batch_size_per_device``,
``gpu_num_per_node``, ``num_nodes``, ``use_fp16``, ``seq_length``), then every
``loss_print_every_n_iter`` steps a line ``step: S, total_loss: ..., throughput: X T`` whose last field
``T`` is the wall clock (unix seconds) when it was printed.

DLPerf's figure is not the printed ``throughput`` but the wall clock between two printed steps
(``extract_util.py``: global batch x steps / (T[end] - T[start])). So a record here is the interval
from the previous printed step to this one: global batch x (S - S_prev) / (T - T_prev), global
sentences/s, at iteration S. The first printed step gives no record (nothing before it). The harmonic
mean of the records after step A up to step B is then exactly global batch x (B - A) / (T[B] - T[A]),
DLPerf's rule; a record needs the global batch, so lines before the three arguments give none.
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, to_bool, to_int

_ARGS = ("batch_size_per_device", "gpu_num_per_node", "num_nodes")


@PARSERS.register("oneflow-bert")
class OneflowBert(PatternParser):
    unit = "sentences/s"
    min_records = 1
    record_hints = ("throughput: ",)
    detect_any = (
        re.compile(rf"^step: \d+, total_loss: {NUM}, mlm_loss: {NUM}, nsp_loss: {NUM}, throughput: {NUM} ",
                   re.M),
        re.compile(r"^Running BERT Pretrain: num_gpu_per_node = \d+, num_nodes = \d+\.$", re.M),
    )
    rules = (
        Rule(r"^Running BERT Pretrain: num_gpu_per_node = \d+, num_nodes = \d+\.$", "on_start", flags=re.M),
        Rule(r"^(batch_size_per_device|gpu_num_per_node|num_nodes|seq_length) = (\d+)$", "on_arg",
             flags=re.M),
        Rule(r"^use_fp16 = (True|False)$", "on_fp16", flags=re.M),
        Rule(rf"^step: (\d+), [^\n]*throughput: {NUM} (\d+(?:\.\d+)?)$", "on_step", flags=re.M),
    )

    def on_start(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.new_run()
        b.scratch.clear()

    def on_arg(self, b: Builder, m: re.Match[str], line: int) -> None:
        key, value = m.group(1), to_int(m.group(2))
        b.scratch[key] = value
        if key == "batch_size_per_device":
            b.fact("batch_size", value, line)
        elif key == "seq_length":
            b.fact("seq_length", value, line)
        per_node, nodes = b.scratch.get("gpu_num_per_node"), b.scratch.get("num_nodes")
        if isinstance(per_node, int) and isinstance(nodes, int):
            b.fact("nodes", nodes, line)
            b.fact("gpus", per_node * nodes, line)

    def on_fp16(self, b: Builder, m: re.Match[str], line: int) -> None:
        on = bool(to_bool(m.group(1)))
        b.facts_at((("amp", on), ("precision", "amp" if on else "fp32")), line)

    def on_step(self, b: Builder, m: re.Match[str], line: int) -> None:
        step, stamp = int(m.group(1)), float(m.group(2))
        prev = b.scratch.get("prev")
        b.scratch["prev"] = (step, stamp)
        sizes = [b.scratch.get(k) for k in _ARGS]
        if not isinstance(prev, tuple) or not all(isinstance(s, int) and s > 0 for s in sizes):
            b.last_record_line = line
            return
        batch, per_node, nodes = sizes
        steps, seconds = step - prev[0], stamp - prev[1]
        if steps <= 0:
            b.issue(f"line {line}: step {step} does not follow step {prev[0]}; not used")
            return
        b.record(batch * per_node * nodes * steps / seconds if seconds > 0 else 0.0, step, None, line)
