"""NVIDIA DeepLearningExamples MXNet RN50v1.5 driven by ``benchmark.py``.

``benchmark.py`` runs ``train.py`` once per GPU count and appends all runs to one log. Each run
starts with its DLLogger ``PARAMETER`` line (``gpus : [0, 1, ...]``, global ``batch_size``,
``dtype``, ``amp``), so every ``PARAMETER`` line opens a new series and the epoch lines after it
belong to that run. Records are the per-epoch lines ``Epoch: E  train.ips : x`` (global
images/s); the per-iteration lines (``Epoch: E Iteration: I ...``) are progress output and are
not records. At the end ``benchmark.py`` prints its result table, one row per GPU count and one
column per batch size; those cells are the series summaries.

The older code of DLE 99b1c89 (NGC 19.07) prints no DLLogger lines: each run starts with
``Start with arguments Namespace(...)``, which every horovod rank prints (``[1,r]``-tagged), so a
run's first arguments line after another run's records opens the next run. Its ``runner`` passes
``--gpus 0,...,n-1`` and ``--batch-size`` ``-b`` x ``n``: the listed GPUs are the run's GPU count and
the printed batch is global (1024 on 8 GPUs is 128 per GPU). Its records are MXNet's Speedometer
lines ``Epoch[E] Batch [a-b]  Speed: x samples/sec`` (the global batch over the time: every rank
prints the run's global figure), and its result table is headed ``train.total_ips``.

Every run has its own facts (the engine keeps them per run), and each table row goes to the run
with its GPU count and batch per GPU.
"""

from __future__ import annotations

import functools
import math
import re

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import (
    NUM,
    Builder,
    PatternParser,
    Rule,
    Series,
    clean_text,
    params_of,
    to_bool,
    to_int,
)


#: what a run's arguments line says: its GPU count, batch size per GPU and facts
_RunArgs = tuple[int | None, int | None, tuple[tuple[str, object], ...]]


@PARSERS.register("ngc-mxnet")
class NgcMxnet(PatternParser):
    min_records = 2  # fewest records a figure may come from (one record is no throughput figure)
    record_hints = ("train.ips : ",)
    detect_any = (
        re.compile(r"PARAMETER [^\n]*\bkv_store : "),
        re.compile(r"Epoch: \d+ +(?:Iteration: \d+ +)?train\.loss : \S+ +train\.ips : "),
        re.compile(r"Start with arguments Namespace\([^\n]*\bkv_store="),
    )
    rules = (
        Rule(rf"Epoch: (?P<epoch>\d+) +train\.loss : \S+ +train\.ips : (?P<value>{NUM})(?=\s)", "record"),
        Rule(rf"Epoch\[(?P<epoch>\d+)\] Batch \[\d+-(?P<iteration>\d+)\]\s+"
             rf"Speed: (?P<value>{NUM}) samples/sec", "record"),
        Rule(r"PARAMETER (arch : [^\n]*)", "on_params"),
        Rule(r"Start with arguments Namespace\(([^\n]*)\)[ \t]*\n", "on_namespace"),
        Rule(r"(?m)^train\.(\w+)[ \t]*\n", "on_table"),
        Rule(r"\|((?: +[^\s|]+ +\|)+)[ \t]*\n", "on_table_row"),
    )

    def on_params(self, b: Builder, m: re.Match[str], line: int) -> None:
        self._run(b, _run_of(m.group(1)), line)

    def on_namespace(self, b: Builder, m: re.Match[str], line: int) -> None:
        self._run(b, _run_of_namespace(m.group(1)), line)

    @staticmethod
    def _run(b: Builder, run: _RunArgs, line: int) -> None:
        """A run's arguments line: a new run unless it is another rank's line of the one just begun."""
        gpus, per_gpu, facts = run
        s = b.new_run(gpus)
        runs: list[tuple[Series, int | None]] = b.scratch.setdefault("runs", [])  # type: ignore[assignment]
        if not runs or runs[-1][0] is not s:
            runs.append((s, per_gpu))
        b.scratch.pop("table", None)
        b.facts_at(facts, line)

    def on_table(self, b: Builder, m: re.Match[str], line: int) -> None:
        """A result table: ``train.ips`` (DLLogger code) or ``train.total_ips`` (19.07) holds the figures;
        the latency tables after it do not."""
        if m.group(1) in ("ips", "total_ips"):
            b.scratch["table"] = []  # batch-size columns, filled by the header row
        else:
            b.scratch.pop("table", None)

    def on_table_row(self, b: Builder, m: re.Match[str], line: int) -> None:
        cols = b.scratch.get("table")
        if not isinstance(cols, list):
            return
        text = m.string
        label = clean_text(text[text.rfind("\n", 0, m.start()) + 1 : m.start()]).strip()
        cells = [c.strip() for c in m.group(1).split("|") if c.strip()]
        if not label:
            cols[:] = [to_int(c) for c in cells]
            return
        gpus = to_int(label)
        if gpus is None:
            return
        for bs, cell in zip(cols or [None] * len(cells), cells):
            self._table_cell(b, gpus, bs, cell, line)

    def _table_cell(self, b: Builder, gpus: int, bs: int | None, cell: str, line: int) -> None:
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        runs: list[tuple[Series, int | None]] = b.scratch.get("runs", [])  # type: ignore[assignment]
        # the latest matching run, searched from the end: the table follows its own runs, and a
        # log of many runs would otherwise cost runs x cells
        fits = [s for s, per_gpu in reversed(runs) if bs is None or per_gpu in (None, bs)]
        # a run whose arguments name no GPUs takes its count from the table's row
        match = (next((s for s in fits if s.gpus == gpus), None)
                 or next((s for s in fits if s.gpus is None), None))
        if match is not None and match.gpus is None:
            match.gpus = gpus
        where = f"{gpus} GPU(s)" + (f", batch {bs}" if bs is not None else "")
        if match is None:
            b.issue(f"result table (line {line}) has a figure for {where} but the log has no such run")
        elif math.isnan(value):
            b.issue(f"result table (line {line}) prints {cell!r} for {where}; no summary for that run")
        else:
            b.summary(value, line, match)


@functools.lru_cache(maxsize=256)  # the runs of a log repeat a few PARAMETER lines: each read once
def _run_of(params: str) -> _RunArgs:
    """A PARAMETER line's GPU count, batch size per GPU and facts."""
    listed, batch, dtype, amp_text, backend = params_of(params).pick(
        "gpus", "batch_size", "dtype", "amp", "data_backend"
    )
    gpus = len(listed.strip("[]").split(",")) if listed and listed.strip("[] ") else None
    total = to_int(batch or "")
    per_gpu = total // gpus if total is not None and gpus else None
    facts: list[tuple[str, object]] = [("batch_size", per_gpu)]
    amp = to_bool(amp_text or "")
    if dtype:
        facts += [("dtype", dtype), ("precision", "amp" if amp else "fp16" if dtype == "float16" else "fp32")]
    if amp_text is not None:
        facts.append(("amp", amp))
    if backend:
        facts += [("data_backend", backend), ("dali", backend.startswith("dali"))]
    return gpus, per_gpu, tuple(facts)


_NAMESPACE_ITEM = re.compile(r"(\w+)=('[^']*'|\[[^\]]*\]|[^,]*)")


@functools.lru_cache(maxsize=256)
def _run_of_namespace(args: str) -> _RunArgs:
    """A ``Namespace(...)`` line's GPU count (the ``gpus`` list: runner passes every GPU of the run, and
    the line is printed before horovod narrows it to the rank's own), batch size per GPU (the printed
    batch is global) and facts."""
    items = {k: v.strip().strip("'") for k, v in _NAMESPACE_ITEM.findall(args)}
    listed = items.get("gpus", "").strip("[] ")
    count = len(listed.split(",")) if listed else None
    total = to_int(items.get("batch_size", ""))
    per_gpu = total // count if total is not None and count else None
    facts: list[tuple[str, object]] = [("batch_size", per_gpu)]
    dtype, amp = items.get("dtype"), to_bool(items.get("amp", ""))
    if dtype:
        facts += [("dtype", dtype), ("precision", "amp" if amp else "fp16" if dtype == "float16" else "fp32")]
    if "amp" in items:
        facts.append(("amp", amp))
    backend = items.get("data_backend")
    if backend:
        facts += [("data_backend", backend), ("dali", backend.startswith("dali"))]
    return count, per_gpu, tuple(facts)
