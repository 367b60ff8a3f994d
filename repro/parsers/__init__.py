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


def _blocks(raw: IO[bytes], continues: re.Pattern[bytes] | None = None) -> Iterator[bytearray]:
    """Blocks of whole lines as raw bytes; the last one keeps a missing final newline missing.

    A block is the whole lines among the next ``BLOCK_BYTES`` bytes of the file (a longer line
    makes a block of its own); the partial line after them opens the next block. A newline byte
    never occurs inside a UTF-8 sequence, so no character is ever cut in two. With ``continues``
    (a parser's :attr:`~repro.parsers.base.PatternParser.block_continues`), a block also takes
    every following line that pattern matches, up to ``BLOCK_BYTES`` more.

    Every block is the same buffer, refilled: a block is valid until the next one is asked for.
    A fresh object for each block would cost more than reading it: the allocator maps new pages
    for most allocations of this size, and the kernel zeroes each page at its first touch (a page
    fault, ~6 us on the benchmark's virtual machine: as long as parsing the page).
    """
    buf = bytearray(BLOCK_BYTES)
    held = 0  # bytes at the start of the buffer read already: the partial line of the last block
    while True:
        if len(buf) < BLOCK_BYTES:  # refill to a block (within the buffer's allocation)
            buf += _ZEROS[: BLOCK_BYTES - len(buf)]
        elif len(buf) > max(BLOCK_BYTES, held):  # grown for a long line
            del buf[max(BLOCK_BYTES, held) :]
        n = _read_into(raw, buf, held)
        if n < len(buf):  # the stream has ended
            if n:
                del buf[n:]
                yield buf
            return
        cut = buf.rfind(b"\n") + 1
        if not cut:  # a line longer than a block
            buf += raw.readline()
            cut = len(buf)
        if continues is not None:
            cut = _continued(raw, buf, cut, continues)
        tail = buf[cut:]
        del buf[cut:]
        yield buf
        buf[: len(tail)] = tail
        held = len(tail)


#: zeros that refill the block buffer to its size (a view: no copy is made to slice it)
_ZEROS = memoryview(bytes(BLOCK_BYTES))


def _read_into(raw: IO[bytes], buf: bytearray, start: int) -> int:
    """Read into ``buf`` from ``start`` until it is full or the stream ends; the end reached."""
    n = start
    with memoryview(buf) as view:
        while n < len(view) and (got := raw.readinto(view[n:])):  # type: ignore[attr-defined]
            n += got
    return n


def _continued(raw: IO[bytes], buf: bytearray, cut: int, continues: re.Pattern[bytes]) -> int:
    """Where a block that would end at ``cut`` ends when it takes the lines after it that
    ``continues`` matches, up to ``BLOCK_BYTES`` more (``buf`` grows where such a line runs past
    what was read)."""
    limit = cut + BLOCK_BYTES
    while cut < limit:
        end = buf.find(b"\n", cut) + 1
        if not end:  # the line runs past what was read: complete it
            more = raw.readline()
            if more:
                buf += more
                continue
            end = len(buf)  # the last line of the stream, without a newline
            if end == cut:
                break
        if not continues.match(buf[cut:end]):
            break
        cut = end
    return cut


def _clean_lines(f: IO[str]) -> Iterator[str]:
    for line in f:
        yield clean_text(line)
