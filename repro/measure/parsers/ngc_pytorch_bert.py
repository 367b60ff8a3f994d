"""NVIDIA DeepLearningExamples PyTorch BERT pretraining (``run_pretraining.py``, 5cc03caa) as DLPerf ran it.

The main process logs through DLLogger's stdout backend, one line per step (``--log_freq`` 1):
``DLL <date> <time> - Training Epoch: E Training Iteration: K  average_loss : ... step_loss : ...``, after
``DLL ... - PARAMETER batch_size_per_gpu : B``. The lines carry no throughput: DLPerf's
``extract_pytorch_logs_time.py`` takes the wall clock of the 20th and the 120th step line after iteration 5
(iterations 25 and 125) and prints global batch x 100 / seconds. A record here is one step's per-GPU
sentences/s from the clock of its line and the line before (B / seconds, at iteration K); the harmonic mean of
the records from iteration 26 to 125, times the cell's GPUs, is DLPerf's figure.
"""

from __future__ import annotations

import re
from datetime import datetime

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import Builder, PatternParser, Rule, to_bool, to_int

#: DLLogger's prefix: the time as Python's str(datetime) writes it (no fraction when the microseconds are 0)
_STAMP = r"DLL (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?) - "


@PARSERS.register("ngc-pytorch-bert")
class NgcPytorchBert(PatternParser):
    unit = "sentences/s"
    per_gpu = True
    min_records = 1
    record_hints = ("average_loss",)
    detect_any = (
        re.compile(r"Training Epoch: \d+ Training Iteration: \d+ {1,2}average_loss : "),
        re.compile(r"PARAMETER batch_size_per_gpu : \d+"),
    )
    rules = (
        Rule(r"PARAMETER batch_size_per_gpu : (\d+)", "on_batch"),
        Rule(r"16-bits training: (True|False)", "on_fp16"),
        Rule(rf"{_STAMP}Training Epoch: (\d+) Training Iteration: (\d+) {{1,2}}average_loss : ", "on_step"),
    )

    def on_batch(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["batch"] = to_int(m.group(1))
        b.fact("batch_size", to_int(m.group(1)), line)

    def on_fp16(self, b: Builder, m: re.Match[str], line: int) -> None:
        on = bool(to_bool(m.group(1)))
        b.facts_at((("amp", on), ("precision", "amp" if on else "fp32")), line)

    def on_step(self, b: Builder, m: re.Match[str], line: int) -> None:
        stamp = datetime.fromisoformat(m.group(1).ljust(26, "0") if "." in m.group(1) else m.group(1))
        step = int(m.group(3))
        prev, batch = b.scratch.get("prev"), b.scratch.get("batch")
        b.scratch["prev"] = (step, stamp)
        if not isinstance(prev, tuple) or not isinstance(batch, int) or batch <= 0:
            b.last_record_line = line
            return
        steps, seconds = step - prev[0], (stamp - prev[1]).total_seconds()
        if steps <= 0:
            b.issue(f"line {line}: iteration {step} does not follow iteration {prev[0]}; not used")
            return
        b.record(batch * steps / seconds if seconds > 0 else 0.0, step, int(m.group(2)), line)
