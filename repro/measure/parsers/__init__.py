"""Training-log parsers: the registry, format detection and the one place that opens log files.

``parse_file`` reads a file in blocks of whole lines (memory stays flat whatever the file size;
the records' too when it is given the protocol they are for), tolerates damaged bytes
(:mod:`repro.measure.parsers.text`), and hands the blocks to the parser, which ignores any line no rule
knows (NCCL chatter, warnings, tracebacks).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from repro.errors import ParseError
from repro.measure.model import LogParser, ParseResult, Record, Series
from repro.measure.parsers.text import Damage, check_file, read_blocks
from repro.measure.protocol import Protocol, Tally
from repro.registry import Registry

__all__ = ["PARSERS", "LogParser", "ParseResult", "Record", "Series", "detect", "parse_file"]

#: Built-in parsers, in detection order (first match wins).
PARSERS = Registry[LogParser](
    "parser",
    [
        "repro.measure.parsers.paddleclas",
        "repro.measure.parsers.ngc_pytorch",
        "repro.measure.parsers.ngc_tf1",
        "repro.measure.parsers.ngc_mxnet",
        "repro.measure.parsers.tf2_keras",
        "repro.measure.parsers.tf_cnn",
        "repro.measure.parsers.step_time",
        "repro.measure.parsers.oneflow_bert",
        "repro.measure.parsers.ngc_pytorch_bert",
        "repro.measure.parsers.oneflow",
        "repro.measure.parsers.ngc_mxnet_ranks",
        "repro.measure.parsers.gluoncv",
        "repro.measure.parsers.tf2_bert",
        "repro.measure.parsers.paddle_bert",
    ],
)

HEAD_LINES = 200  # what detection looks at first
DEEP_HEAD_LINES = 5000  # second look when the first lines are all preamble


def detect(head: Sequence[str]) -> type[LogParser]:
    """The first registered parser whose ``detect`` accepts these head lines."""
    for cls in PARSERS.plugins():
        if cls.detect(head):
            return cls
    raise ParseError(
        f"not a log format the kit knows (known parsers: {', '.join(PARSERS.names())})",
        hint="name the parser explicitly if the log is in one of these formats",
    )


def parse_file(path: str | os.PathLike[str], parser: str | None = None,
               protocol: Protocol | None = None) -> ParseResult:
    """Parse one log file; ``parser=None`` detects the format from the head of the file. With a
    ``protocol`` (the one the series will be measured by), each run's records are folded into
    what that protocol needs as they are read, and not kept (:class:`repro.measure.protocol.Tally`)."""
    p = Path(path)
    check_file(p)
    cls = PARSERS.get(parser) if parser is not None else detect_file(p)
    damage = Damage()
    inst, blocks = cls(), read_blocks(p, damage)
    if hasattr(inst, "parse_blocks"):  # the built-in engine reads blocks of lines
        result = inst.parse_blocks(blocks, partial(Tally, protocol) if protocol else None)
    else:
        result = inst.parse(line for block in blocks for line in block.splitlines(keepends=True))
    result.issues[:0] = damage.issues()
    return result


def detect_file(p: Path) -> type[LogParser]:
    """The format of a log file, from its first lines."""
    check_file(p)
    head: list[str] = []
    for block in read_blocks(p, Damage(), size=1 << 16):
        head += block.splitlines(keepends=True)
        if len(head) >= DEEP_HEAD_LINES:
            break
    for cls in PARSERS.plugins():
        if cls.detect(head[:HEAD_LINES]):
            return cls
    try:
        return detect(head[:DEEP_HEAD_LINES])
    except ParseError as e:
        raise ParseError(f"{p}: {e.message}", hint=e.hint) from None
