"""gluon-cv ``scripts/classification/imagenet/train_horovod.py`` (f9a8a28), as DLPerf ran it.

Rank 0 alone logs (``logging.basicConfig`` at INFO, so each line starts ``INFO:root:``): first the
arguments, ``Namespace(...)`` (``batch_size`` per GPU, ``dtype``, ``model``), then every
``--log-interval`` batches ``Epoch[E] Batch[B]\\tSpeed: X samples/sec``, X being all ranks' samples
(``num_workers x batch_size x log_interval``) over the time since the previous such line. Those are the
records (iteration B). At f9a8a28 that line is commented out; the DLPerf target's patch puts it back as
written. The epoch's closing ``Epoch[E]\\tSpeed:`` line and the ``Loss``/``Rank`` lines are not records.
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, to_int

_SPEED = rf"Epoch\[(?P<epoch>\d+)\] Batch\[(?P<iteration>\d+)\]\s+Speed: (?P<value>{NUM}) samples/sec"
_ITEM = re.compile(r"(\w+)=('[^']*'|[^,]*)")


@PARSERS.register("gluoncv-imagenet")
class GluoncvImagenet(PatternParser):
    min_records = 2  # fewest records a figure may come from (one record is no throughput figure)
    record_hints = ("samples/sec",)
    detect_any = (re.compile(_SPEED),)
    rules = (
        Rule(_SPEED, "record"),
        Rule(r"Namespace\(([^\n]*\bdtype=[^\n]*)\)[ \t]*\n", "on_namespace"),
    )

    def on_namespace(self, b: Builder, m: re.Match[str], line: int) -> None:
        items = {k: v.strip().strip("'") for k, v in _ITEM.findall(m.group(1))}
        facts: list[tuple[str, object]] = [("batch_size", to_int(items.get("batch_size", "")))]
        dtype = items.get("dtype")
        if dtype:
            precision = {"float16": "fp16", "float32": "fp32"}.get(dtype)
            facts += [("dtype", dtype)] + ([("precision", precision)] if precision else [])
        if items.get("model"):
            facts.append(("model", items["model"]))
        b.new_run()
        b.facts_at(facts, line)
