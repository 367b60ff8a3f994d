"""PaddleClas training logs (static and dynamic engine), as in PaddlePaddle/Perf.

Records are the ``ips: <x> samples/sec`` figures (``images/sec`` before 2022). PaddleClas prints
them from rank 0 only and per GPU, so ``per_gpu`` is set and a table value for N GPUs is the mean
times N. Each figure is already a running mean since step 5 of its epoch. Facts come from the
config dump at the top (``DataLoader.Train.sampler.batch_size``, ``AMP.level``,
``Global.use_dali``) and from the launcher's lines (GPU and node counts).
"""

from __future__ import annotations

import re

from repro.parsers import PARSERS
from repro.parsers.base import NUM, Builder, PatternParser, Rule, to_bool, to_int

_IPS = rf"[^\n]*ips: (?P<value>{NUM}) (?:samples|images)/s"


@PARSERS.register("paddleclas")
class PaddleClas(PatternParser):
    per_gpu = True
    record_hints = ("ips: ",)
    mpi_tags_in_place = True
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
        # config dump, one "key : value" per line, nesting shown by 4-space indents; only the
        # section headers (to know the path) and the keys the kit reads are matched. Most lines
        # of a PaddleClas log start with "ppcls INFO: "; the possessive " *+" and "\w*+" (what
        # follows them can never match a space or a word character, so they give the same
        # matches) spare the backtracking on every one of them and halve the cost of this scan.
        Rule(
            r"ppcls INFO: (?P<indent> *+)(?:(?P<section>[A-Za-z_]\w*+) : ?\n|"
            r"(?P<key>batch_size|level|use_amp|use_pure_fp16|use_dali|data_format) : (?P<value>[^\n]*))",
            "on_config",
        ),
        Rule(r"PADDLE_TRAINERS_NUM +(\d+)", "fact:gpus", to_int),
        Rule(r" nnodes: (\d+)", "fact:nodes", to_int),
        Rule(r"Run Pod: \S+, replicas (\d+)", "on_replicas"),
        Rule(r"LAUNCH INFO [^\n]*? devices: (\d+(?:,\d+)*)\n", "on_devices"),
    )

    def on_config(self, b: Builder, m: re.Match[str], line: int) -> None:
        depth = len(m.group("indent")) // 4
        path: list[str] = b.scratch.setdefault("path", [])  # type: ignore[assignment]
        del path[depth:]
        b.scratch["config"] = True
        section = m.group("section")
        if section:
            path.append(section)
            if path == ["AMP"]:
                b.scratch["amp_section"] = True
            return
        key, value = m.group("key"), m.group("value").strip()
        dotted = ".".join(path + [key])
        if dotted == "DataLoader.Train.sampler.batch_size":
            b.fact("batch_size", to_int(value), line)
        elif dotted == "AMP.level":
            b.fact("amp_level", value, line)
        elif key == "use_amp":
            b.scratch["use_amp"] = to_bool(value)
        elif key == "use_pure_fp16":
            b.scratch["pure_fp16"] = to_bool(value)
        elif key == "use_dali":
            b.fact("dali", to_bool(value), line)
        elif dotted == "Arch.data_format":
            b.fact("data_format", value, line)

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
        # The config dump lists an AMP section only when AMP is on; O2 is pure FP16 with FP32
        # master weights, O1 the usual mixed precision.
        level = b.facts.get("amp_level")
        amp = bool(b.scratch.get("amp_section") or b.scratch.get("use_amp") or b.scratch.get("pure_fp16"))
        pure = level == "O2" or bool(b.scratch.get("pure_fp16"))
        b.facts["amp"] = amp
        b.facts["precision"] = "fp16" if amp and pure else "amp" if amp else "fp32"
