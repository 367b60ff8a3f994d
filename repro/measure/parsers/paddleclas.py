"""PaddleClas training logs (static and dynamic engine), as in PaddlePaddle/Perf.

Records are the ``ips: <x> samples/sec`` figures (``images/sec`` before 2022). PaddleClas prints
them from rank 0 only and per GPU, so ``per_gpu`` is set and a table value for N GPUs is the mean
times N. Each figure is already a running mean since step 5 of its epoch. Facts come from the
config dump at the top (``DataLoader.Train.sampler.batch_size``, ``AMP.level``,
``Global.use_dali``) and from the launcher's lines (GPU and node counts).
"""

from __future__ import annotations

import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, PatternParser, Rule, to_bool, to_int

_IPS = rf"[^\n]*ips: (?P<value>{NUM}) (?:samples|images)/s"

# The config dump at the top of a run: "ppcls INFO: " then four spaces per level of nesting, a
# section header ("DataLoader : ") or a "key : value" line. A section runs until the next config
# line at its own level or above; lines of other programs may come in between.
_CONFIG = "ppcls INFO: "


def _inside(depth: int) -> str:
    """A line inside a section of level ``depth - 1``: deeper config lines and foreign lines."""
    return rf"(?:[^\n]*?{_CONFIG}{' ' * 4 * depth}[^\n]*\n|(?![^\n]*{_CONFIG})[^\n]*\n)"


def _config_value(*path: str) -> str:
    """The value of the config key ``path[-1]`` inside the nested sections ``path[:-1]``."""
    rx = rf"{_CONFIG}{path[0]} : ?\n"
    for depth, name in enumerate(path[1:], 1):
        rx += rf"{_inside(depth)}*?[^\n]*?{_CONFIG}{' ' * 4 * depth}{name} : "
        rx += r"(?P<value>[^\n]*)" if depth == len(path) - 1 else r"?\n"
    return rx


@PARSERS.register("paddleclas")
class PaddleClas(PatternParser):
    min_records = 2  # fewest records a figure may come from (one record is no throughput figure)
    per_gpu = True
    record_hints = ("ips: ",)
    # an indented config line continues its section: a block never ends inside one
    block_continues = re.compile(rf"[^\n]*?{_CONFIG}  ")
    detect_any = (
        re.compile(r"ppcls INFO: "),
        re.compile(rf"\bips: {NUM} (?:samples|images)/s(?:ec)?\b"),
        re.compile(r"\[Train\]\[Epoch \d+/\d+\]\[Iter: \d+/\d+\]"),
    )
    rules = (
        # static engine: "epoch:0   train step:10   lr: ... ips: 394.81086 samples/sec."
        Rule(rf"epoch:(?P<epoch>\d+) +train step:(?P<iteration>\d+){_IPS}", "record"),
        # dynamic engine: "[Train][Epoch 1/120][Iter: 10/5005]lr: ... ips: 852.06 samples/s, eta: ..."
        Rule(rf"\[Train\]\[Epoch (?P<epoch>\d+)/\d+\]\[Iter: (?P<iteration>\d+)/\d+\]{_IPS}", "record"),
        # facts from the config dump, each read where it sits: one match a run, not one a line
        Rule(rf"{_CONFIG}Arch : ?\n", "on_config"),  # every dump has a model
        Rule(rf"{_CONFIG}AMP : ?\n", "on_amp_section"),  # its values say whether AMP is on
        Rule(_config_value("DataLoader", "Train", "sampler", "batch_size"), "on_batch_size"),
        Rule(_config_value("AMP", "level"), "on_amp_level"),
        Rule(_config_value("Arch", "data_format"), "on_data_format"),
        # switches read at any depth (indents of up to 40 spaces)
        Rule(
            "use_(?:" + "|".join(rf"(?<={_CONFIG}{' ' * n}use_)" for n in range(41)) + ")"
            r"(?P<key>amp|pure_fp16|dali) : (?P<value>[^\n]*)",
            "on_switch",
        ),
        Rule(r"PADDLE_TRAINERS_NUM +(\d+)", "fact:gpus", to_int),
        Rule(r" nnodes: (\d+)", "fact:nodes", to_int),
        Rule(r"Run Pod: \S+, replicas (\d+)", "on_replicas"),
        Rule(r"LAUNCH INFO [^\n]*? devices: (\d+(?:,\d+)*)\n", "on_devices"),
        Rule(r"GPU Compute Capability: (\d+\.\d+)", "fact:compute_capability"),
    )

    def on_config(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["config"] = True

    def _config_fact(self, b: Builder, m: re.Match[str], line: int, key: str, value: object) -> None:
        b.scratch["config"] = True
        b.fact(key, value, line + m.group().count("\n"))  # the line of the key, not of its section

    def on_batch_size(self, b: Builder, m: re.Match[str], line: int) -> None:
        self._config_fact(b, m, line, "batch_size", to_int(m.group("value")))

    def on_amp_level(self, b: Builder, m: re.Match[str], line: int) -> None:
        self._config_fact(b, m, line, "amp_level", m.group("value").strip())

    def on_data_format(self, b: Builder, m: re.Match[str], line: int) -> None:
        self._config_fact(b, m, line, "data_format", m.group("value").strip())

    def on_amp_section(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["config"] = b.scratch["amp_section"] = True

    def on_switch(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["config"] = True
        key, value = m.group("key"), m.group("value").strip()
        if key == "dali":
            b.fact("dali", to_bool(value), line)
        else:
            b.scratch["use_amp" if key == "amp" else "pure_fp16"] = to_bool(value)

    def on_replicas(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch["per_node"] = int(m.group(1))

    def on_devices(self, b: Builder, m: re.Match[str], line: int) -> None:
        b.scratch.setdefault("per_node", len(m.group(1).split(",")))

    def finish(self, b: Builder) -> None:
        per_node = b.scratch.get("per_node")
        if "gpus" not in b.facts and isinstance(per_node, int):
            nodes = b.facts.get("nodes", 1)
            b.facts["gpus"] = per_node * (nodes if isinstance(nodes, int) else 1)
        if not b.scratch.get("config"):
            return
        # AMP is on where a switch says so (``use_amp``, ``use_pure_fp16``); older dumps have no
        # switch and list an AMP section only when AMP is on. O2 is pure FP16 with FP32 master
        # weights, O1 the usual mixed precision.
        level = b.facts.get("amp_level")
        switches = [b.scratch.get(k) for k in ("use_amp", "pure_fp16") if b.scratch.get(k) is not None]
        amp = any(switches) if switches else bool(b.scratch.get("amp_section"))
        pure = level == "O2" or bool(b.scratch.get("pure_fp16"))
        b.facts["amp"] = amp
        b.facts["precision"] = "fp16" if amp and pure else "amp" if amp else "fp32"
