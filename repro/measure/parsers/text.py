"""Reading a log file as text: whatever a training run wrote, within reason.

Only regular files are read (a FIFO, device or directory is refused from its ``stat``, before any
open could block). A file that is mostly not text (more than :data:`BINARY_SHARE` of its first
bytes are control bytes or invalid UTF-8) is refused; stray NUL or control bytes and invalid UTF-8
inside a text log are read past (invalid sequences become U+FFFD) and counted as an issue.
CRLF endings and MPI output tags are removed; in a file whose lines end in CR alone (an old Mac
file, a progress bar that never printed a newline) a CR ends a line.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from repro.errors import ParseError

BLOCK_BYTES = 1 << 20  # read at once; a block is whole lines
MAX_LINE = 1 << 22  # a longer "line" is read in pieces of this size (and said so)
PROBE_BYTES = 64 * 1024
BINARY_SHARE = 0.3

#: bytes no text log holds on purpose (tab, newline, CR and ESC of colour codes are fine)
_CONTROL = bytes([*range(0, 9), 11, 12, *range(14, 27), *range(28, 32), 127])

_MPI_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_MPI_STAMP = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"  # --timestamp-output
_MPI_STAMPED_TAG = re.compile(_MPI_STAMP + _MPI_TAG.pattern)
#: an optional MPI tag (timestamped or not), for rules that read across a newline
MPI_PREFIX = rf"(?:(?:{_MPI_STAMP})?{_MPI_TAG.pattern})?"


def clean_text(text: str) -> str:
    """Drop CRs of CRLF endings and the MPI output tags orterun/mpirun put on lines, wherever they
    occur (ranks writing at once splice them into the middle of other lines), a
    ``--timestamp-output`` prefix with its tag. The number of newlines never changes, so line
    numbers stay those of the file."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if "]<std" in text:
        text = _MPI_TAG.sub("", _MPI_STAMPED_TAG.sub("", text))
    return text


class Damage:
    """Bytes of a text log that are not text, counted while it is read."""

    def __init__(self) -> None:
        self.control = 0
        self.invalid = 0
        self.pieces = 0  # over-long lines read in pieces
        self.first_line: int | None = None

    def issues(self) -> list[str]:
        out = []
        if self.control or self.invalid:
            what = [f"{n} {name}" for n, name in ((self.control, "NUL/control byte(s)"),
                                                   (self.invalid, "invalid UTF-8 sequence(s)")) if n]
            out.append(f"{' and '.join(what)} in the text (first on line {self.first_line}); read past them")
        if self.pieces:
            out.append(f"{self.pieces} line(s) longer than {MAX_LINE >> 20} MiB were read in pieces")
        return out


def check_file(p: Path) -> None:
    """Refuse what is not a regular, non-empty text file, without blocking on it."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ParseError(f"{p}: no such file") from None
    except OSError as e:
        raise ParseError(f"{p}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ParseError(f"{p}: is a directory, not a log file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or \
            stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
        raise ParseError(f"{p}: is {kind}, not a log file", hint="copy the log into a regular file first")
    with _open(p) as f:
        probe = f.read(PROBE_BYTES)
    if not probe.strip():
        raise ParseError(f"{p}: the file is empty", hint="the run may have failed before it logged anything")
    bad = (len(probe) - len(probe.translate(None, _CONTROL))
           + _invalid(probe, probe.decode("utf-8", "replace")))
    if bad > BINARY_SHARE * len(probe):
        raise ParseError(f"{p}: looks like a binary file "
                         f"({bad} of its first {len(probe)} bytes are not text), not a text log")


def _open(p: Path):  # type: ignore[no-untyped-def]
    """Open for reading without blocking (a file swapped for a FIFO after its stat)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ParseError(f"{p}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ParseError(f"{p}: is not a regular file, not a log file")
    return os.fdopen(fd, "rb")


def _invalid(data: bytes, text: str) -> int:
    """Invalid UTF-8 sequences in ``data`` (each became one U+FFFD in ``text``)."""
    return text.count("\ufffd") - data.count(b"\xef\xbf\xbd") if "\ufffd" in text else 0


def read_blocks(p: Path, damage: Damage, size: int = BLOCK_BYTES) -> Iterator[str]:
    """The file as blocks of whole lines of clean text (see :func:`clean_text`); the last block
    keeps a missing final newline missing. Memory stays at a few blocks whatever the file size."""
    base = 0  # newlines before the current block
    rest = b""
    long_line = False  # the last block was a piece of a long line
    with _open(p) as f:
        while True:
            chunk = f.read(size)
            data = rest + chunk if rest else chunk
            if not chunk:
                if data:
                    yield _decode(data, base, damage)
                return
            cut = data.rfind(b"\n") + 1
            if not cut and b"\r" in data:  # lines ended by CR alone
                data = data.replace(b"\r", b"\n")
                cut = data.rfind(b"\n") + 1
            if not cut:
                if len(data) <= MAX_LINE:
                    rest = data
                    continue
                damage.pieces += not long_line
                long_line = True
                cut = MAX_LINE
                while cut > MAX_LINE - 4 and data[cut] & 0xC0 == 0x80:  # not inside a character
                    cut -= 1
            else:
                long_line = False
            block, rest = data[:cut], data[cut:]
            text = _decode(block, base, damage)  # a piece of a long line goes on in the next block
            base += text.count("\n")
            yield text


def _decode(block: bytes, base: int, damage: Damage) -> str:
    text = block.decode("utf-8", "replace")
    control = len(block) - len(block.translate(None, _CONTROL))
    invalid = _invalid(block, text)
    if control or invalid:
        if damage.first_line is None:
            lines = []
            if control:
                at = re.search(b"[" + re.escape(_CONTROL) + b"]", block).start()  # type: ignore[union-attr]
                lines.append(clean_text(block[:at].decode("utf-8", "replace")).count("\n"))
            if invalid:
                lines.append(clean_text(text[: text.find("\ufffd")]).count("\n"))
            damage.first_line = base + min(lines) + 1
        damage.control += control
        damage.invalid += invalid
    return clean_text(text)
