"""TensorFlow Model Garden BERT pretraining (``official/nlp/bert/run_pretraining.py``, r2.3.0) as DLPerf ran
it.

``model_training_utils.run_customized_training_loop`` logs one line per training loop through absl logging
(``steps_per_loop`` 1: one line per step): ``I0924 02:10:08.123456 1401... model_training_utils.py:NNN]
Train Step: K/N / loss = ...``. The lines carry no throughput and no batch: DLPerf's
``extract_tensorflow_logs_time.py`` takes the clock of the 20th and the 120th ``Train Step:`` line and
prints global batch x 100 / seconds. A record here is one step's rate in steps per second from the clock of
its line and the line before (1 / seconds, at step K); the harmonic mean of the records of steps 21 to 120
times the cell's global batch (``scale: global_batch``) is DLPerf's figure. The clock has no date: a line
earlier than the one before is read as the next day.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import Builder, PatternParser, Rule

#: absl's prefix: severity, MMDD, the time to the microsecond, thread id, file:line]
_STAMP = r"[IWEF]\d{4} (\d\d:\d\d:\d\d\.\d{6})\s+\d+ [\w.]+:\d+\] "


@PARSERS.register("tf2-bert")
class Tf2Bert(PatternParser):
    unit = "sentences/s"
    min_records = 1
    step_rates = True
    record_hints = ("Train Step:",)
    detect_any = (re.compile(rf"{_STAMP}Train Step: \d+/\d+ +/ loss = "),)
    rules = (Rule(rf"{_STAMP}Train Step: (\d+)/\d+ +/ loss = ", "on_step"),)

    def on_step(self, b: Builder, m: re.Match[str], line: int) -> None:
        clock, step = datetime.strptime(m.group(1), "%H:%M:%S.%f"), int(m.group(2))
        prev = b.scratch.get("prev")
        b.scratch["prev"] = (step, clock)
        if not isinstance(prev, tuple):
            b.last_record_line = line
            return
        if step <= prev[0]:
            b.issue(f"line {line}: step {step} does not follow step {prev[0]}; not used")
            return
        seconds = (clock - prev[1]).total_seconds()
        if seconds < 0:
            seconds = (clock + timedelta(days=1) - prev[1]).total_seconds()
        b.record((step - prev[0]) / seconds if seconds > 0 else -1.0, step, None, line)
