"""PaddleNLP BERT pretraining (PaddlePaddle/models release/1.8
``PaddleNLP/pretrain_language_models/BERT/train.py``) as DLPerf ran it.

Trainer 0 prints one line per ``--skip_steps`` steps (DLPerf: 1): ``epoch: E, progress: F/N, step: K, loss:
..., ppl: ..., next_sent_acc: ..., speed: S steps/s, file: ...``, where S is ``skip_steps x trainers /
seconds``: the steps of all the nodes' trainers since the line before. With ``--is_distributed true`` the
log names the trainers first (``worker_endpoints:[...] trainers_num:T current_endpoint:...``). DLPerf's
``extract_paddle_logs.py`` takes S x the GPUs of one node x the batch per GPU for each line and means the
21st to the 120th. A record here is one node's steps per second, S / T, so that the cell's global batch
(``scale: global_batch``, every node's GPUs) gives that figure.
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, to_bool


@PARSERS.register("paddle-bert")
class PaddleBert(PatternParser):
    min_records = 1
    step_rates = True
    unit = "sentences/s"
    record_hints = ("steps/s, file:",)
    detect_any = (re.compile(rf"epoch: \d+, progress: \d+/\d+, step: \d+, loss: [^\n]*speed: {NUM} steps/s"),)
    rules = (
        Rule(r"(?m)^use_fp16: (True|False)$", "on_fp16"),
        Rule(r"trainers_num:(\d+) current_endpoint:", "on_trainers"),
        Rule(rf"epoch: (\d+), progress: \d+/\d+, step: (\d+), loss: [^\n]*?speed: ({NUM}) steps/s",
             "on_step"),
    )

    def on_fp16(self, b: Builder, m: re.Match[str], line: int) -> None:
        on = to_bool(m.group(1))
        b.facts_at((("amp", on), ("precision", "amp" if on else "fp32")), line)

    def on_trainers(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["trainers"] = int(m.group(1))
        b.fact("nodes", int(m.group(1)), line)

    def on_step(self, b: Builder, m: re.Match[str], line: int) -> None:
        trainers = b.scratch.get("trainers", 1)
        speed = float(m.group(3))
        if not isinstance(trainers, int) or trainers <= 0 or not speed > 0:
            b.record(-1.0, int(m.group(2)), int(m.group(1)), line)  # refused as an impossible value
            return
        b.record(speed / trainers, int(m.group(2)), int(m.group(1)), line)
