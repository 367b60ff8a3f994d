"""Training-log parsers: the registry, format detection and the one place that opens log files.

``parse_file`` streams a file in blocks of whole lines read as raw bytes (memory stays flat
whatever the file size, apart from the records themselves, 32 bytes each), decodes UTF-8 with
replacement characters where text is needed, accepts CRLF, strips MPI output tags and ignores any
line no rule knows (NCCL chatter, warnings, tracebacks).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from repro.errors import ParseError
from repro.parsers.base import (
    BLOCK_BYTES,
    LogParser,
    ParseResult,
    PatternParser,
    Record,
    Series,
    clean_text,
)
from repro.registry import Registry

__all__ = ["PARSERS", "LogParser", "ParseResult", "Record", "Series", "detect", "parse_file"]

#: Built-in parsers, in detection order (first match wins).
PARSERS = Registry[LogParser](
    "parser",
    [
        "repro.parsers.paddleclas",
        "repro.parsers.ngc_pytorch",
        "repro.parsers.ngc_tf1",
        "repro.parsers.ngc_mxnet",
        "repro.parsers.tf2_keras",
        "repro.parsers.tf_cnn",
    ],
)

HEAD_LINES = 200  # what detect() looks at first
DEEP_HEAD_LINES = 5000  # second look when the first 200 lines are all preamble
_BINARY_PROBE = 64 * 1024


def detect(head: Sequence[str]) -> type[LogParser]:
    """The first registered parser whose ``detect`` accepts these head lines."""
    for cls in PARSERS.plugins():
        if cls.detect(head):
            return cls
    raise ParseError(
        f"not a log format the kit knows (known parsers: {', '.join(PARSERS.names())})",
        hint="name the parser explicitly if the log is in one of these formats",
    )


def parse_file(path: str | os.PathLike[str], parser: str | None = None) -> ParseResult:
    """Parse one log file; ``parser=None`` detects the format from the head of the file."""
    p = Path(path)
    _check_file(p)
    if parser is not None:
        cls = PARSERS.get(parser)
    else:
        cls = _detect_file(p)
    inst = cls()
    if isinstance(inst, PatternParser):
        with p.open("rb") as raw:
            return inst.parse_blocks(_blocks(raw, inst.block_continues))
    with _open(p) as f:
        return inst.parse(_clean_lines(f))


# ---------------------------------------------------------------------------------------------


def _check_file(p: Path) -> None:
    try:
        with p.open("rb") as f:
            probe = f.read(_BINARY_PROBE)
    except FileNotFoundError:
        raise ParseError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ParseError(f"{p}: is a directory, not a log file") from None
    except OSError as e:
        raise ParseError(f"{p}: cannot read: {e.strerror or e}") from None
    if not probe.strip():
        raise ParseError(f"{p}: the file is empty", hint="the run may have failed before it logged anything")
    if b"\0" in probe:
        raise ParseError(f"{p}: looks like a binary file (NUL bytes), not a text log")


def _open(p: Path) -> IO[str]:
    return p.open("r", encoding="utf-8", errors="replace")


def _detect_file(p: Path) -> type[LogParser]:
    with _open(p) as f:
        head = _head(f, HEAD_LINES)
        for cls in PARSERS.plugins():
            if cls.detect(head):
                return cls
        head += _head(f, DEEP_HEAD_LINES - HEAD_LINES)
    try:
        return detect(head)
    except ParseError as e:
        raise ParseError(f"{p}: {e.message}", hint=e.hint) from None


def _head(f: IO[str], n: int) -> list[str]:
    out: list[str] = []
    for line in f:
        out.append(line)
        if len(out) >= n:
            break
    return out


def _blocks(raw: IO[bytes], continues: re.Pattern[bytes] | None = None) -> Iterator[bytes]:
    """Blocks of whole lines as raw bytes; the last one keeps a missing final newline missing.

    A block is the whole lines among the next ``BLOCK_BYTES`` bytes of the file (a longer line
    makes a block of its own). The partial line after them is read again with the next block
    (a seek back over a few bytes): gluing it onto either block would copy a whole block, and
    blocks of varying sizes make the allocator map and zero fresh pages each time.
    A newline byte never occurs inside a UTF-8 sequence, so no character is ever cut in two.
    With ``continues`` (a parser's :attr:`~repro.parsers.base.PatternParser.block_continues`),
    a block also takes every following line that pattern matches, up to ``BLOCK_BYTES`` more.
    A stream that cannot seek carries the partial line over instead.
    """
    seekable = raw.seekable()
    carry = b""

    def give_back(tail: bytes) -> None:  # the next block starts with ``tail``
        nonlocal carry
        if seekable:
            raw.seek(-len(tail), os.SEEK_CUR)
        else:
            carry = tail

    while True:
        data = raw.read(max(BLOCK_BYTES - len(carry), 1))
        if carry:
            data, carry = carry + data, b""
        if not data:
            return
        cut = data.rfind(b"\n") + 1
        if not cut:  # a line longer than a block, or the unterminated last one
            data += raw.readline()
        elif cut < len(data):
            give_back(data[cut:])
            data = data[:cut]
        if continues is not None and data.endswith(b"\n"):
            parts, extra = [data], 0
            while (line := raw.readline()) and continues.match(line) and extra < BLOCK_BYTES:
                parts.append(line)
                extra += len(line)
            if line:
                give_back(line)
            data = b"".join(parts)
        yield data


def _clean_lines(f: IO[str]) -> Iterator[str]:
    for line in f:
        yield clean_text(line)
