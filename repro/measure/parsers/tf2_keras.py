"""TensorFlow 2.x Keras image classification (tensorflow/models ``classifier_trainer.py``), as run
by DLPerf.

Records are the ``TimeHistory`` callback lines, ``<t> seconds, <x> examples/second between
steps A and B`` (global examples/s over the interval); the record's iteration is B. Facts come
from the ``Final model parameters`` dump (the ``Base params`` dump before it holds defaults
only): per-replica batch size, dtype, mixed precision, XLA, worker hosts, plus the
``runtime.num_gpus=N`` override (GPUs per worker).
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, to_bool, to_int

_STEPS = r"between steps \d+ and (?P<iteration>\d+)(?=\s)"


@PARSERS.register("tf2-keras")
class Tf2Keras(PatternParser):
    min_records = 3  # fewest records a figure may come from
    record_hints = ("examples/second",)
    detect_any = (
        re.compile(rf"TimeHistory: {NUM} seconds, {NUM} examples/second"),
        re.compile(r"classifier_trainer\.py:\d+\] (?:Base params|Final model parameters|Overriding params)"),
    )
    rules = (
        Rule(rf"TimeHistory: {NUM} seconds, (?P<value>{NUM}) examples/second {_STEPS}", "record"),
        Rule(r"\] (Base params|Final model parameters): ", "on_dump"),
        Rule(r"'(train_dataset|validation_dataset)': ", "on_section"),
        Rule(
            r"'(batch_size|dtype|mixed_precision_dtype|enable_xla|worker_hosts)': "
            r"(?:'([^'\n]*)'|([^,}\n]*))",
            "on_key",
        ),
        Rule(r"Overriding params: runtime\.num_gpus=(\d+)", "on_num_gpus"),
    )

    def on_dump(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["final"] = m.group(1) == "Final model parameters"
        b.scratch["section"] = None
        if not b.scratch["final"]:
            b.new_run()

    def on_section(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["section"] = m.group(1)

    def on_key(self, b: Builder, m: re.Match[str], line: int) -> None:
        if not b.scratch.get("final"):
            return
        key, quoted, bare = m.groups()
        value = (quoted if quoted is not None else bare).strip()
        section = b.scratch.get("section")
        if key == "batch_size" and section == "train_dataset":
            b.fact("batch_size", to_int(value), line)
        elif key == "dtype" and section == "train_dataset":
            b.fact("dtype", value, line)
        elif key == "mixed_precision_dtype":
            b.scratch["mixed"] = None if value == "None" else value
        elif key == "enable_xla":
            b.fact("xla", to_bool(value), line)
        elif key == "worker_hosts" and value != "None":
            b.fact("nodes", len([h for h in value.split(",") if h.strip()]), line)

    def on_num_gpus(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["per_node"] = int(m.group(1))

    def finish(self, b: Builder) -> None:
        per_node = b.scratch.get("per_node")
        if isinstance(per_node, int) and per_node > 0:
            nodes = b.facts.get("nodes", 1)
            b.facts.setdefault("gpus", per_node * (nodes if isinstance(nodes, int) else 1))
        mixed, dtype = b.scratch.get("mixed"), b.facts.get("dtype")
        if mixed:
            b.facts.update(amp=True, precision="amp")
        elif dtype:
            b.facts.update(
                amp=False, precision={"float16": "fp16", "bfloat16": "bf16"}.get(str(dtype), "fp32")
            )
