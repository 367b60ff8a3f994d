"""Logs that print each training step's time, not a throughput: the PyTorch examples ImageNet
``main.py`` and Paddle 1.8 PaddleCV ``image_classification/train.py``, as DLPerf ran them.

A record is the step's rate in steps per second (1 / the printed time), so the mean a publisher
took of the times is the harmonic mean of the records, and its images/s is that rate times the
global batch: the manifests measure these logs with ``scale: global_batch``, which multiplies by
the cell's batch per GPU x GPUs (neither log prints the global batch).
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, to_bool


def _step(b: Builder, m: re.Match[str], line: int) -> None:
    """One step's record: its rate (1 / time); a time of zero or less cannot be a step's."""
    seconds = float(m.group("value"))
    if not seconds > 0 or seconds == float("inf"):
        b.record(-1.0, None, None, line)  # refused as an impossible value, like any other
        return
    b.record(1.0 / seconds, int(m.group("iteration")), int(m.group("epoch")), line)


@PARSERS.register("pytorch-examples")
class PyTorchExamples(PatternParser):
    """``ProgressMeter`` lines of ``train()``: ``Epoch: [E][ I/N]<tab>Time  T ( avg)<tab>Data ...``
    (``T`` is that step's wall time on one rank, data loading included). With
    ``--multiprocessing-distributed`` every rank of the node prints its own lines into the one
    log, interleaved; they are one series in file order, as DLPerf's script reads them. The
    ``Test:`` lines of validation are not training steps and are not read."""

    min_records = 10
    step_rates = True
    record_hints = ("Epoch: [",)
    detect_any = (re.compile(rf"Epoch: \[\d+\]\[\s*\d+/\s*\d+\]\s+Time\s+{NUM} \(\s*{NUM}\)"),)
    rules = (
        Rule(rf"Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<iteration>\d+)/\s*\d+\]\s+Time\s+(?P<value>{NUM}) \(",
             "on_step"),
    )

    def on_step(self, b: Builder, m: re.Match[str], line: int) -> None:
        _step(b, m, line)


@PARSERS.register("paddlecv-18")
class PaddleCv18(PatternParser):
    """``print_info`` lines of trainer 0, ``[Pass E, train batch I] <tab>loss ..., elapse T sec``
    (``T`` is the step's time, reader wait included), and the ``Configuration Arguments`` dump
    (``%25s : %s`` lines) for the precision (``use_fp16``) and DALI (``use_dali``). The dump's
    ``batch_size`` is the batch of all the node's GPUs, not one GPU's, so it is not a fact here.
    ``test batch`` lines (``--validate=True``) are not training steps and are not read."""

    min_records = 10
    step_rates = True
    record_hints = ("train batch",)
    detect_any = (re.compile(rf"\[Pass \d+, train batch \d+\]\s+loss [^\n]*elapse {NUM} sec"),)
    rules = (
        Rule(rf"\[Pass (?P<epoch>\d+), train batch (?P<iteration>\d+)\][ \t]+loss [^\n]*?elapse "
             rf"(?P<value>{NUM}) sec", "on_step"),
        Rule(r"-------------  Configuration Arguments -------------", "on_dump"),
        Rule(r"(?m)^[^\n]*?\s(use_fp16|use_dali) : (\S+)$", "on_arg"),
    )

    def on_step(self, b: Builder, m: re.Match[str], line: int) -> None:
        _step(b, m, line)

    def on_dump(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.new_run()

    def on_arg(self, b: Builder, m: re.Match[str], line: int) -> None:
        on = to_bool(m.group(2))
        if m.group(1) == "use_fp16":
            b.fact("amp", on, line)
            b.fact("precision", None if on is None else "amp" if on else "fp32", line)
        else:
            b.fact("dali", on, line)
