"""What a log parser returns, the parser interface, and the engine the built-in parsers share.

A built-in parser is a table of :class:`Rule` objects (a regular expression plus what to do with
a match) and a few small handler methods. :class:`PatternParser` runs the table over the raw
bytes of the log in large blocks of whole lines, and nothing runs per line in Python:

* a record rule is applied to the whole block at once and gives columns (line numbers, values,
  iterations, epochs), not objects: natively, PCRE2 with its JIT and an exact decimal reader
  (see ``_scan.c``); in Python, ``re.split`` on bytes with ``map`` into ``array`` columns, the
  iteration and epoch digits kept joined until first read;
* every other rule (run boundaries, summaries, facts; a few lines per run) scans the block, and
  only its matches reach Python: each is handed to the rule's handler in file order with its
  line. Natively, one call scans the block for all of a parser's rules and gives each match's
  line and a match object holding its spans (a group's text is cut when read); a rule is
  skipped at once in a block that lacks its longest literal, and tried only where one of its
  start texts occurs when it has them (both found by a SIMD literal search). The Python engine
  uses ``finditer`` (or ``str.find`` on a literal prefix) on the decoded block. Records before a
  match are moved into the current series when the handler touches the series (a new run, a
  summary), so a run boundary splits the records where it occurs; a series keeps them as parts
  of the block's columns until it is read;
* CRLF endings and MPI output tags are removed from the block first, except tags that open their
  lines in a parser whose rules read past them (``mpi_tags_in_place``).

A record rule must not match a newline, and a number that ends a record has to be followed by
something (a unit, a space, the newline). The last line of a cut-off file has no newline, so a
number cut in half there never matches and never becomes a wrong record. Other rules may span
lines; a parser whose rules read a structure across lines (a config dump) says which lines
continue one (``block_continues``), and no block ends inside it. A record rule counts once per
match; when a record and another rule's match share one line, the other match is handled first.
"""

from __future__ import annotations

import abc
import gc
import math
import os
import re
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Any, ClassVar, overload

if TYPE_CHECKING:
    from repro.parsers import _scan

try:
    from repro.parsers._scan import (
        PCRE2_VERSION,
        Found,
        Scanner,
        contains,
        fsum,
        misplaced_tag,
        param,
        scan,
        strip_tags,
        value_range,
    )
except ImportError:  # not built (no compiler or PCRE2 at install): the Python engine does it all
    Found = Scanner = contains = fsum = misplaced_tag = param = scan = None  # type: ignore[assignment,misc]
    strip_tags = value_range = None  # type: ignore[assignment]
    PCRE2_VERSION = ""

#: the engine rules run on: "native (PCRE2 <version>)" or "python"
ENGINE = (
    f"native (PCRE2 {PCRE2_VERSION.split()[0]})"
    if Scanner is not None and os.environ.get("REPRO_PARSE_ENGINE", "") != "python"
    else "python"
)

#: A decimal number as training scripts print it (``394.81086``, ``1e-05``, ``12671.899230200308``).
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"

#: Bytes read and scanned at once. Larger blocks gain little (the per-block work is a handful of
#: calls); this size keeps the transient memory of a parse (block, its cleaned and decoded
#: copies, one block of record columns) at a few MB.
BLOCK_BYTES = 1 << 20
BLOCK_CHARS = BLOCK_BYTES  # the name before blocks were bytes

_MPI_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_MPI_STAMP = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"  # --timestamp-output
_MPI_STAMPED_TAG = re.compile(_MPI_STAMP + _MPI_TAG.pattern)
_MPI_TAG_B = re.compile(_MPI_TAG.pattern.encode())
_MPI_STAMPED_TAG_B = re.compile(_MPI_STAMPED_TAG.pattern.encode())

#: An optional MPI tag (timestamped or not), for rules that read from a line start or across a
#: newline in a parser with ``mpi_tags_in_place`` (see :class:`PatternParser`).
MPI_PREFIX = rf"(?:(?:{_MPI_STAMP})?{_MPI_TAG.pattern})?"


@cache  # the native check answers where it is built: compiled only when the Python engine asks
def _misplaced_tag(stamped: bool) -> re.Pattern[bytes]:
    """A tag that does not open its line, or is not in the usual form (``[J,R]`` with up to 3 and
    4 digits; with the timestamp when ``stamped``). The scan looks for the literal end of a tag
    and checks what precedes it with fixed-width lookbehinds, so it runs at a few times the speed
    of the substitution that removes tags."""
    end = r"\]<std(?:out|err)>:"
    heads = sorted((r"\[" + r"\d" * j + "," + r"\d" * r for j in (1, 2, 3) for r in (1, 2, 3, 4)), key=len)
    stamp = _MPI_STAMP if stamped else ""
    return re.compile((end + "".join(rf"(?<!(?<![^\n]){stamp}{h}{end})" for h in heads)).encode())


@dataclass(frozen=True, slots=True)
class Record:
    """One throughput observation in a log."""

    value: float  # images/s as printed (per GPU for PaddleClas, global otherwise)
    iteration: int | None = None  # step / iteration number if the line has one
    epoch: int | None = None
    line: int = 0  # 1-based line number in the file


# ---------------------------------------------------------------------------------------------
# series: records kept as columns

#: stands for "no iteration/epoch number" in an int64 column (numbers in logs are never negative)
_MISSING = -1
_INT64 = 1 << 63
#: ``map(_UNMISS, col, col)`` turns the missing marker back into None, in C
_UNMISS = {_MISSING: None}.get


def _int_col(items: Iterable[int | None] = ()) -> array[int] | list[int | None]:
    """An int64 column (None stored as -1), or a plain list where a value does not fit."""
    items = list(items)
    if all(type(x) is int and 0 <= x < _INT64 for x in items if x is not None):
        return array("q", [_MISSING if x is None else x for x in items])
    return items


def _as_list(col: array[int] | list[int | None]) -> list[int | None]:
    return col if isinstance(col, list) else list(map(_UNMISS, col, col))


class _Digits:
    """One block's iteration (or epoch) numbers, kept as their digits joined by spaces (a few
    bytes a record) and converted to an int column when first read: measure() reads them only
    for a protocol that selects by iteration, and joining costs a seventh of ``int()``. The
    conversion happens once for all the series that hold part of the block."""

    __slots__ = ("_blob", "_ints")

    def __init__(self, blob: bytes) -> None:
        self._blob = blob
        self._ints: array[int] | list[int | None] | None = None

    def ints(self) -> array[int] | list[int | None]:
        if self._ints is None:
            self._ints = _ints(self._blob.split())
            self._blob = b""
        return self._ints


def _eager(col: Sequence[int | None] | _Digits) -> Sequence[int | None]:
    return col.ints() if isinstance(col, _Digits) else col


#: the columns of a series without records, shared until a series appends to them
_NO_RECORDS = (array("q"), array("d"), array("q"), array("q"))


class Series:
    """All records of one run inside a log.

    The records are kept as columns (``array('d')`` values, ``array('q')`` iterations, epochs and
    line numbers: 32 bytes a record); :attr:`records` is a list-like view that makes
    :class:`Record` objects when they are asked for. :attr:`values` is the value column itself.

    Records a parse moves in from a block stay in the block's columns, as parts ``(columns, lo,
    hi)``, until a column is read, and each column is copied out on its own: measuring a run
    reads its values only, so the other three columns of most runs are never copied.
    """

    __slots__ = ("_cols", "_done", "_parts", "gpus", "per_gpu", "summary")

    def __init__(
        self,
        gpus: int | None,
        records: Iterable[Record] = (),
        summary: float | None = None,
        per_gpu: bool = False,
    ) -> None:
        self.gpus = gpus  # GPU count of that run if the log says it, else None
        self.summary = summary  # the figure the log itself prints as its result, if any
        self.per_gpu = per_gpu  # True when values are per GPU (PaddleClas rank-0 ips)
        # lines, values, iterations, epochs (the order of _Columns); a column becomes a list
        # where a value does not fit its array
        self._cols: list[array[int] | array[float] | list[int | None] | list[float]] = list(_NO_RECORDS)
        self._parts: list[tuple[_Columns, int, int]] = []  # records not yet in the columns
        self._done = [0, 0, 0, 0]  # parts already copied into each column
        if records != ():
            self.records = records  # type: ignore[assignment]

    # the record view ------------------------------------------------------------------------
    @property
    def records(self) -> Records:
        return Records(self)

    @records.setter
    def records(self, records: Iterable[Record]) -> None:
        recs = list(records)
        values = [r.value for r in recs]
        lines = [r.line for r in recs]
        self._parts, self._done = [], [0, 0, 0, 0]
        self._cols = [
            array("q", lines) if all(type(x) is int and 0 <= x < _INT64 for x in lines) else lines,
            array("d", values) if all(type(v) is float for v in values) else values,
            _int_col(r.iteration for r in recs),
            _int_col(r.epoch for r in recs),
        ]

    @property
    def values(self) -> Sequence[float]:
        """The record values in file order (an ``array('d')``; do not modify)."""
        return self._own(1)  # type: ignore[return-value]

    def value_range(self) -> tuple[float, float] | None:
        """``(min(values), max(values))``, None without records (one native pass where it can)."""
        v = self._column(1)
        if not len(v):
            return None
        if _NATIVE_RANGE and v.__class__ is array:
            return _NATIVE_RANGE(v)  # type: ignore[no-any-return]
        return min(v), max(v)  # type: ignore[type-var]

    @property
    def iterations(self) -> list[int | None]:
        return _as_list(self._column(2))  # type: ignore[arg-type]

    @property
    def epochs(self) -> list[int | None]:
        return _as_list(self._column(3))  # type: ignore[arg-type]

    @property
    def lines(self) -> list[int]:
        return list(self._column(0))  # type: ignore[arg-type]

    def append(self, record: Record) -> None:
        self._add(record.value, record.iteration, record.epoch, record.line)

    def _add(self, value: float, iteration: int | None, epoch: int | None, line: int) -> None:
        lines, values, its, eps = map(self._own, range(4))
        if type(value) is not float and values.__class__ is not list:
            self._cols[1] = values = list(values)
        values.append(value)  # type: ignore[arg-type]
        for k, col, x in ((2, its, iteration), (3, eps, epoch)):
            if col.__class__ is list:
                col.append(x)  # type: ignore[arg-type]
            elif x is None:
                col.append(_MISSING)  # type: ignore[arg-type]
            elif type(x) is int and 0 <= x < _INT64:
                col.append(x)  # type: ignore[arg-type]
            else:
                self._cols[k] = [*_as_list(col), x]  # type: ignore[arg-type]
        if lines.__class__ is not list and not (type(line) is int and 0 <= line < _INT64):
            self._cols[0] = lines = list(lines)
        lines.append(line)  # type: ignore[arg-type]

    def _extend(self, cols: _Columns, lo: int, hi: int) -> None:
        """Append records ``lo:hi`` of a block's columns (see :func:`_record_columns`)."""
        self._parts.append((cols, lo, hi))

    def _column(self, k: int) -> array[int] | array[float] | list[int | None] | list[float]:
        """Column ``k`` (lines, values, iterations, epochs) with every part copied in."""
        parts, done = self._parts, self._done[k]
        if done == len(parts):
            return self._cols[k]
        col = self._cols[k]
        for cols, lo, hi in parts[done:]:
            part = _eager(cols[k])[lo:hi]  # type: ignore[index]
            if not len(col):  # the slice is a new column of its own
                col = part
            elif col.__class__ is part.__class__ is array:
                col.extend(part)  # type: ignore[arg-type]
            elif k < 2:  # lines, values: a list takes the numbers as they are
                col = [*col, *part]
            else:  # iterations, epochs: the missing marker is None in a list
                col = [*_as_list(col), *_as_list(part)]  # type: ignore[arg-type]
        self._cols[k] = col
        self._done[k] = len(parts)
        if self._done.count(len(parts)) == 4:  # every column has them: the blocks can go
            self._parts, self._done = [], [0, 0, 0, 0]
        return col

    def _own(self, k: int) -> array[int] | array[float] | list[int | None] | list[float]:
        """Column ``k``, settled, and this series' own to append to."""
        col = self._column(k)
        if col is _NO_RECORDS[k]:
            col = self._cols[k] = col[:]
        return col

    def _count(self) -> int:
        return len(self._cols[1]) + sum(hi - lo for _, lo, hi in self._parts[self._done[1] :])

    def _record(self, i: int) -> Record:
        lines, values, its, eps = map(self._column, range(4))
        it, ep = its[i], eps[i]
        if its.__class__ is not list and it == _MISSING:
            it = None
        if eps.__class__ is not list and ep == _MISSING:
            ep = None
        return _new_record(values[i], it, ep, lines[i])  # type: ignore[arg-type]

    def _iter_records(self) -> Iterator[Record]:
        lines, values, its, eps = map(self._column, range(4))
        its_ = its if its.__class__ is list else map(_UNMISS, its, its)
        eps_ = eps if eps.__class__ is list else map(_UNMISS, eps, eps)
        return map(_new_record, values, its_, eps_, lines)  # type: ignore[arg-type]

    # dataclass-like behaviour ------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        o: Series = other  # type: ignore[assignment]
        return (self.gpus, self.summary, self.per_gpu) == (o.gpus, o.summary, o.per_gpu) and list(
            self._iter_records()
        ) == list(o._iter_records())

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        return (
            f"Series(gpus={self.gpus!r}, records={self.records!r}, summary={self.summary!r}, "
            f"per_gpu={self.per_gpu!r})"
        )


class Records(Sequence[Record]):
    """The records of a :class:`Series` as a list-like sequence, made on demand.

    Indexing, slicing (gives a list), iteration, ``len``, ``==`` with a list of records and
    ``append`` behave as on the list this replaces.
    """

    __slots__ = ("_s",)

    def __init__(self, series: Series) -> None:
        self._s = series

    def __len__(self) -> int:
        return self._s._count()

    @overload
    def __getitem__(self, i: int) -> Record: ...

    @overload
    def __getitem__(self, i: slice) -> list[Record]: ...

    def __getitem__(self, i: int | slice) -> Record | list[Record]:
        n = self._s._count()
        if isinstance(i, slice):
            return [self._s._record(k) for k in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("record index out of range")
        return self._s._record(i)

    def __iter__(self) -> Iterator[Record]:
        return self._s._iter_records()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Records):
            other = list(other)
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    def append(self, record: Record) -> None:
        self._s.append(record)


@dataclass
class ParseResult:
    parser: str
    series: list[Series]
    facts: dict[str, object]  # what the log says about its run; only keys actually found
    issues: list[str]  # non-fatal problems: contradictions, truncation, unusable summaries
    lines: int  # lines read


class LogParser(abc.ABC):
    """One log format. Subclasses register themselves in :data:`repro.parsers.PARSERS`."""

    name: ClassVar[str]  # set by the registry

    @classmethod
    def detect(cls, head: Sequence[str]) -> bool:
        """Cheap check on the first ~200 lines: is this log in my format?"""
        return False

    @abc.abstractmethod
    def parse(self, lines: Iterable[str]) -> ParseResult:
        """Read every line; never raise on a bad line and never open files."""


# ---------------------------------------------------------------------------------------------
# text hygiene shared by every parser


def clean_text(text: str) -> str:
    """Drop CRs of CRLF endings and the MPI output tags orterun/mpirun put on lines.

    Tags are removed wherever they occur, not only at line starts: when several ranks write at
    once, Open MPI splices ``[1,0]<stderr>:`` into the middle of other lines. A
    ``--timestamp-output`` prefix (``Mon Jun 13 17:45:27 2022[1,0]<stdout>:``) goes with its tag.
    The number of newlines never changes, so line numbers stay those of the file.
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if "]<std" in text:
        # --timestamp-output is all or nothing for a run, so the first tag tells; this spares
        # the slower timestamp scan on the (common) logs without it.
        m = _MPI_TAG.search(text)
        if m and _MPI_STAMPED_TAG.match(text, max(0, m.start() - 24)) is not None:
            text = _MPI_STAMPED_TAG.sub("", text)
        if "]<std" in text:
            text = _MPI_TAG.sub("", text)
    return text


def clean_block(block: bytes, in_place: bool = False, out: bytearray | None = None) -> bytes | bytearray:
    """:func:`clean_text` for a block of raw bytes (the same result).

    ``in_place``: when every tag of the block opens its line (the usual case: each rank writes
    whole lines), the block is left as it is; the parser's rules are written to read past a tag
    at a line start (``mpi_tags_in_place``). A tag anywhere else (ranks writing at once splice
    tags into lines) makes the block go through the full removal.

    ``out``: a buffer the removal may write into and return (valid until its next use), so that
    a scan does not allocate a fresh block for every block it strips.
    """
    if b"\r" in block:
        block = block.replace(b"\r\n", b"\n")
    if not _has(block, b"]<std"):
        return block
    m = _MPI_TAG_B.search(block)
    if m is None:
        return block
    stamped = _MPI_STAMPED_TAG_B.match(block, max(0, m.start() - 24)) is not None
    if in_place and not _misplaced(block, stamped):
        return block
    if stamped:
        block = _strip_tags(block, True, out)
        if not _has(block, b"]<std"):
            return block
    return _strip_tags(block, False, out)


def _has(block: bytes, text: bytes) -> bool:
    """``text in block``, by the native literal search where it is built."""
    return _NATIVE_CONTAINS(block, text) if _NATIVE_CONTAINS else text in block


def _misplaced(block: bytes, stamped: bool) -> bool:
    """Does a tag not open its line, or not have the usual form? (:func:`_misplaced_tag`)"""
    if _NATIVE_MISPLACED:
        return _NATIVE_MISPLACED(block, stamped)
    return _misplaced_tag(stamped).search(block) is not None


def _strip_tags(block: bytes, stamped: bool, out: bytearray | None = None) -> bytes | bytearray:
    """The block without its MPI tags (only the timestamped ones when ``stamped``); the native
    removal writes it into ``out`` when given (which may be ``block``)."""
    if _NATIVE_STRIP:
        return _NATIVE_STRIP(block, stamped, out)
    return (_MPI_STAMPED_TAG_B if stamped else _MPI_TAG_B).sub(b"", block)


def blocks_from_lines(
    lines: Iterable[str], size: int = BLOCK_CHARS, continues: re.Pattern[bytes] | None = None
) -> Iterator[str]:
    """Join an iterable of lines into blocks of whole lines.

    Items may carry their line ending or not (``str.splitlines()`` output). When the earlier
    items did end in a newline and the last one does not, the last one is kept unterminated:
    that is how a cut-off file looks, and the rules treat it accordingly. A block never ends
    before a line ``continues`` matches (see ``parsers._blocks``), within ``size`` more.
    """
    buf: list[str] = []
    held = 0
    terminated = False
    prev: str | None = None

    def ends_before(line: str) -> bool:  # the block has its size, and ``line`` continues nothing
        return held >= size and (
            continues is None
            or held >= 2 * size
            or not continues.match(line.encode("utf-8", "surrogatepass"))
        )

    for line in lines:
        if prev is not None:
            if prev.endswith("\n"):
                terminated = True
            else:
                prev += "\n"
            if ends_before(prev):
                yield "".join(buf)
                buf, held = [], 0
            buf.append(prev)
            held += len(prev)
        prev = line
    if prev is not None:
        if not prev.endswith("\n") and not terminated:
            prev += "\n"
        if ends_before(prev):
            yield "".join(buf)
            buf = []
        buf.append(prev)
    if buf:
        yield "".join(buf)


class Params(Mapping[str, str]):
    """The items of a DLLogger ``PARAMETER`` line, ``key : value  key : value``, as a mapping.

    Items are separated by two spaces; values may hold single spaces (``gpus : [0, 1, 2]``); a
    key given twice keeps its last value. Such a line holds about a hundred items and a handler
    reads five, so a lookup finds its own key (``str.rfind`` from the end, then a check that the
    key opens an item; natively for ASCII lines, all the keys a handler reads in one call:
    :meth:`pick`) instead of splitting the whole line; iterating splits it. Keys are names: a key
    holding " : " is not looked up.
    """

    __slots__ = ("_all", "_found", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._all: dict[str, str] | None = None
        self._found: dict[str, str | None] = {}  # keys looked up so far ("in", then "[]")

    def _find(self, key: str) -> str | None:
        found = self._found
        if key not in found:
            self.pick(key)
        return found[key]

    def pick(self, *keys: str) -> tuple[str | None, ...]:
        """The value of each key (None where absent): one native search for all of them."""
        found = self._found
        if not found and _NATIVE_PARAM:  # a handler's first look at the line: no bookkeeping
            values: tuple[str | None, ...] | None = _NATIVE_PARAM(self._text, keys)
            if values is not None:
                found.update(zip(keys, values))
                return values
        new = tuple(k for k in keys if k not in found)
        if new:
            values = _NATIVE_PARAM(self._text, new) if _NATIVE_PARAM else None
            found.update(zip(new, values if values is not None else map(self._search, new)))
        return tuple(map(found.__getitem__, keys))

    def _search(self, key: str) -> str | None:
        text, needle = self._text, key + " :"
        end = len(text)
        while (at := text.rfind(needle, 0, end)) >= 0:
            end = at + len(needle) - 1
            start = at  # back over the blanks before the key
            while start and text[start - 1].isspace():
                start -= 1
            # an item starts here: nothing but blanks before, or blanks holding a separator
            if not start or (start < at - 1 and "  " in text[start:at]):
                stop = text.find("  ", at)
                item = text[at : stop if stop >= 0 else len(text)].strip()
                name, sep, value = item.partition(" : ")
                if sep and name == key:
                    return value.strip()
                if item == needle:  # "key :" with nothing after it
                    return ""
        return None

    def __getitem__(self, key: str) -> str:
        value = self._find(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        value = self._find(key)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def _items(self) -> dict[str, str]:
        if self._all is None:
            self._all = {}
            for key, sep, value in map(
                str.partition, map(str.strip, self._text.split("  ")), repeat(" : ")
            ):
                if sep:
                    self._all[key] = value.strip()
                elif key.endswith(" :"):  # "key :" with nothing after it
                    self._all[key[:-2]] = ""
        return self._all


params_of = Params
#: :meth:`Params._search` in C, for ASCII lines; ``bytes.__contains__`` by a SIMD literal search;
#: the misplaced tag search without lookbehinds, and tag removal, from each tag's end; min and max
#: of a value column in one pass
_NATIVE_PARAM = param if ENGINE != "python" else None
_NATIVE_CONTAINS = contains if ENGINE != "python" else None
_NATIVE_MISPLACED = misplaced_tag if ENGINE != "python" else None
_NATIVE_STRIP = strip_tags if ENGINE != "python" else None
_NATIVE_SCAN = scan if ENGINE != "python" else None
_NATIVE_FSUM = fsum if ENGINE != "python" else None
_NATIVE_RANGE = value_range if ENGINE != "python" else None


def exact_sum(values: Iterable[float]) -> float:
    """``math.fsum(values)``; natively for an ``array('d')`` (a series' value column), without a
    float object per value."""
    if _NATIVE_FSUM and values.__class__ is array:
        total = _NATIVE_FSUM(values)
        if total is not None:
            return total  # type: ignore[no-any-return]
    return math.fsum(values)


def to_bool(text: str) -> bool | None:
    low = text.strip().strip("'\"").lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off", "none", ""):
        return False
    return None


def to_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# the declarative engine


@dataclass(frozen=True)
class Rule:
    """``pattern`` plus what a match means.

    ``action`` is ``"record"`` (named groups ``value`` and optionally ``iteration``/``epoch``),
    ``"summary"`` (group ``value``), ``"fact:<key>"`` (group 1 converted by ``convert``), or the
    name of a handler method ``(self, b, m, line)`` on the parser class. Record rules run on the
    raw bytes (``\\d`` and ``\\s`` are ASCII there); handlers get ``str`` matches.
    """

    pattern: str
    action: str
    convert: Callable[[str], object] = str
    flags: int = 0
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # ASCII classes (\d, \w, \s) on text as on bytes, and in both engines
        object.__setattr__(self, "regex", re.compile(self.pattern, self.flags | re.ASCII))

    @cached_property
    def bregex(self) -> re.Pattern[bytes]:
        """The pattern for raw bytes (record rules run on those)."""
        return re.compile(self.pattern.encode(), self.flags)

    @cached_property
    def native(self) -> _scan.Scanner | None:
        """The pattern compiled by the native scanner, or None (Python engine; see :data:`ENGINE`)."""
        return _native_scanner(self.pattern, self.flags)


#: one block's records as columns: line numbers, values, iterations, epochs (file order)
_Columns = tuple[
    Sequence[int], Sequence[float], "Sequence[int | None] | _Digits", "Sequence[int | None] | _Digits"
]


class Builder:
    """Mutable state of one parse; handlers only talk to this."""

    MAX_ISSUES = 50

    def __init__(self, per_gpu: bool) -> None:
        self.per_gpu = per_gpu
        self.series: list[Series] = []
        self.facts: dict[str, object] = {}
        self.issues: list[str] = []
        self._issued: set[str] = set()  # the issues kept, to find a repeated one at once
        self.scratch: dict[str, object] = {}  # per-parser working state
        self._fact_line: dict[str, int] = {}
        self._contradiction_lines: set[int] = set()  # lines named by a contradiction issue
        self._summaries = 0
        self._dropped = 0
        self.last_record_line = 0
        # records of the current block not yet in a series, and the line being handled
        self._pending: _Columns | None = None
        self._taken = 0
        self._at = 0

    # series -------------------------------------------------------------------------------
    def current(self) -> Series:
        self._sync()
        return self._current()

    def _current(self) -> Series:
        if not self.series:
            self.series.append(Series(gpus=None, records=(), per_gpu=self.per_gpu))
        return self.series[-1]

    def new_run(self, gpus: int | None = None) -> Series:
        """A new run starts here; reuse the current series while it is still empty."""
        self._sync()
        s = self.series[-1] if self.series else None
        if s is None or s._parts or len(s._cols[1]) or s.summary is not None:  # not empty
            s = Series(gpus=None, records=(), per_gpu=self.per_gpu)
            self.series.append(s)
        if gpus is not None:
            s.gpus = gpus
        return s

    def record(self, value: float, iteration: int | None, epoch: int | None, line: int) -> None:
        self._sync()
        self._current()._add(value, iteration, epoch, line)
        self.last_record_line = line

    def summary(self, value: float, line: int, series: Series | None = None) -> None:
        self._sync()
        s = series or self._current()
        if s.summary is not None:
            self._summaries += 1
        s.summary = value
        self.last_record_line = line

    def _sync(self, upto: int | None = None) -> None:
        """Move the pending records that come before line ``upto`` (default: the line being
        handled) into the current series."""
        cols = self._pending
        if cols is None:
            return
        lines = cols[0]
        lo = self._taken
        hi = bisect_left(lines, self._at if upto is None else upto, lo)
        if hi > lo:
            self._current()._extend(cols, lo, hi)
            self.last_record_line = lines[hi - 1]
            self._taken = hi

    # facts and issues ------------------------------------------------------------------------
    def fact(self, key: str, value: object, line: int) -> None:
        """What the log says about its run; the first value of a key stays, a different later
        one is an issue. None says nothing."""
        self.facts_at(((key, value),), line)

    def facts_at(self, items: Iterable[tuple[str, object]], line: int) -> None:
        """:meth:`fact` for each ``(key, value)`` of one line (a run's parameters)."""
        facts = self.facts
        for key, value in items:
            if value is None:
                continue
            old = facts.get(key)
            if old is None:
                facts[key] = value
                self._fact_line[key] = line
            elif old != value:
                self._contradicts(key, old, value, line)

    def _contradicts(self, key: str, old: object, value: object, line: int) -> None:
        if len(self.issues) >= self.MAX_ISSUES and line not in self._contradiction_lines:
            self._dropped += 1  # the text is new (it names this line) and would not be kept
            return
        self._contradiction_lines.add(line)
        self.issue(
            f"contradicting {key}: {old!r} (line {self._fact_line[key]}) and {value!r} (line {line}); "
            f"keeping the first"
        )

    def issue(self, text: str) -> None:
        if text in self._issued:
            return
        if len(self.issues) < self.MAX_ISSUES:
            self.issues.append(text)
            self._issued.add(text)
        else:
            self._dropped += 1

    def finish(self, parser: str, lines: int) -> ParseResult:
        if self._summaries:
            self.issue(f"{self._summaries + 1} printed summaries for one run; the last one is used")
        counts = {s.gpus for s in self.series if s.gpus is not None}
        if "gpus" not in self.facts and len(counts) == 1:
            self.facts["gpus"] = next(iter(counts))
        gpus = self.facts.get("gpus")
        for s in self.series:
            if s.gpus is None and isinstance(gpus, int):
                s.gpus = gpus
        if self._dropped:
            self.issues.append(f"... and {self._dropped} more issues")
        return ParseResult(parser, self.series, self.facts, self.issues, lines)


class PatternParser(LogParser):
    """A parser described by tables: ``detect_any`` for detection, ``rules`` for parsing."""

    detect_any: ClassVar[tuple[re.Pattern[str], ...]] = ()
    rules: ClassVar[tuple[Rule, ...]] = ()
    per_gpu: ClassVar[bool] = False
    #: substrings of record and summary lines; used to report a cut-off last line
    record_hints: ClassVar[tuple[str, ...]] = ()
    #: True when every rule matches the same whether or not its line opens with an MPI tag
    #: (``[1,0]<stdout>:``, optionally timestamped), so that blocks whose tags all open their
    #: lines need not be cleaned: no rule may start inside a tag or read the text before its
    #: start (``^``, lookbehind, ``m.string``) without allowing for one (:data:`MPI_PREFIX`,
    #: :func:`clean_text`), and a rule that continues past a newline allows one there too.
    #: Tags elsewhere in a line are always removed first. False: every tagged block is cleaned.
    mpi_tags_in_place: ClassVar[bool] = False
    #: Lines that continue the structure of the lines before them (an indented line of a config
    #: dump): a block never ends just before one, so a rule that reads a structure across lines
    #: sees all of it. Matched against raw lines (bytes, MPI tags and CR still in place).
    block_continues: ClassVar[re.Pattern[bytes] | None] = None

    @classmethod
    def detect(cls, head: Sequence[str]) -> bool:
        text = clean_text("\n".join(line.rstrip("\n") for line in head))
        return any(p.search(text) for p in cls.detect_any)

    def parse(self, lines: Iterable[str]) -> ParseResult:
        return self.parse_blocks(blocks_from_lines(lines, continues=self.block_continues))

    def parse_blocks(self, blocks: Iterable[bytes | bytearray | str]) -> ParseResult:
        """Run the rules over blocks of whole lines (the last block may end without a newline).

        Blocks are raw bytes (UTF-8; bad sequences are replaced where text is decoded) or text. A
        block is not kept after its turn: the file reader hands the same buffer over refilled.
        """
        b = Builder(self.per_gpu)
        # The parse makes few objects that live, but the cyclic GC would still run on the many
        # short-lived ones (match objects, split parts); it is paused for the scan.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            lines, tail = self._scan(b, blocks)
        finally:
            if gc_was_on:
                gc.enable()
        if tail:  # the last line, cut off (it has no newline)
            self._check_cut_line(b, clean_text(tail.decode("utf-8", "replace")), lines)
        self.finish(b)
        return b.finish(self.name, lines)

    def _scan(self, b: Builder, blocks: Iterable[bytes | bytearray | str]) -> tuple[int, bytes]:
        """Count lines and hand every match over in file order; returns (lines, the last line
        when the blocks end without a newline, else b"")."""
        record_rules = [_RecordRule(r.bregex, r.native) for r in self.rules if r.action == "record"]
        other = [r for r in self.rules if r.action != "record"]
        other_rules = [_OtherRule(r.regex, self._action(r)) for r in other]
        for i, r in enumerate(other_rules):
            r.index = i
        natives = tuple(r.native for r in other) if all(r.native is not None for r in other) else None
        patterns = tuple(r.regex for r in other)
        in_place = self.mpi_tags_in_place
        stripped = bytearray()  # blocks without their tags, one buffer refilled (see clean_block)
        base = 0  # newlines before the current block
        tail = b""
        for raw in blocks:
            if isinstance(raw, str):
                raw = raw.encode("utf-8", "surrogatepass")
            block = clean_block(raw, in_place, stripped)
            if not block:
                continue
            cols, newlines = _record_columns(record_rules, block, base)
            if other_rules:
                text = _Text(block)
                hits = _other_matches(other_rules, natives, patterns, text, base)
                if hits:
                    b._pending, b._taken = cols, 0
                    _dispatch(b, hits, other_rules, text, base)
                    b._sync(upto=1 << 62)  # the rest of the block's records
                    b._pending = None
                    cols = None
            if cols is not None and len(cols[0]):
                b._current()._extend(cols, 0, len(cols[0]))
                b.last_record_line = cols[0][-1]
            base += newlines
            # a block is not kept past its turn (the file reader refills it): only a cut-off line
            tail = b"" if block.endswith(b"\n") else bytes(block[block.rfind(b"\n") + 1 :])
        if tail:
            base += 1
        return base, tail

    def finish(self, b: Builder) -> None:
        """Hook: derive facts that need the whole log."""

    # ------------------------------------------------------------------------------------------
    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for r in cls.rules:  # fail at import, not in the middle of a log
            if r.action in ("record", "summary") and "value" not in r.regex.groupindex:
                raise TypeError(f"{cls.__name__}: {r.action} rule {r.pattern!r} has no 'value' group")
            if (
                r.action not in ("record", "summary")
                and not r.action.startswith("fact:")
                and not callable(getattr(cls, r.action, None))
            ):
                raise TypeError(f"{cls.__name__}: no handler method {r.action!r}")

    def _action(self, rule: Rule) -> Callable[[Builder, re.Match[str], int], None]:
        act = rule.action
        if act == "summary":
            value = rule.regex.groupindex["value"]  # by number: a name costs a lookup a match
            return lambda b, m, line: b.summary(float(m.group(value)), line)
        if act.startswith("fact:"):
            key, conv = act[5:], rule.convert
            return lambda b, m, line: b.fact(key, conv(m.group(1)), line)
        return getattr(self, act)

    def _check_cut_line(self, b: Builder, text: str, line: int) -> None:
        if any(h in text for h in self.record_hints) and b.last_record_line != line:
            b.issue(f"line {line} is cut off (file ends without a newline) and was not used: {text[:120]!r}")


# ---------------------------------------------------------------------------------------------
# the scan


class _RecordRule:
    """A record rule's bytes pattern and where its groups land in ``re.split`` output."""

    __slots__ = ("epoch", "iteration", "native", "rx", "stride", "value")

    def __init__(self, rx: re.Pattern[bytes], native: _scan.Scanner | None = None) -> None:
        self.rx = rx
        self.native = native
        self.stride = rx.groups + 1  # text before the match, then every group of the match
        self.value = rx.groupindex["value"]
        self.iteration = rx.groupindex.get("iteration", 0)
        self.epoch = rx.groupindex.get("epoch", 0)

    def columns(self, block: bytes, base: int) -> tuple[_Columns, int]:
        """This rule's records in ``block`` as columns, and the number of newlines in the block."""
        if self.native is not None:
            found = self.native.records(block, base, self.value, self.iteration, self.epoch)
            if found is not None:
                *raw, newlines = found
                lines, values, its, eps = array("q"), array("d"), array("q"), array("q")
                for col, data in zip((lines, values, its, eps), raw):
                    col.frombytes(data)
                return (lines, values, its, eps), newlines
        return self._columns(block, base)

    def _columns(self, block: bytes, base: int) -> tuple[_Columns, int]:
        """:meth:`columns` in Python.

        ``split`` gives [text before match 1, groups of 1, text between 1 and 2, groups of 2, ...,
        text after the last match]; newlines are counted in the text around the matches, which
        covers the whole block because a record never holds a newline.
        """
        parts = self.rx.split(block)
        step = self.stride
        # line of the first line of the block, then of each record, then one past the block
        lines = array("q", accumulate(map(bytes.count, parts[::step], repeat(b"\n")), initial=base + 1))
        newlines = lines.pop() - base - 1
        del lines[0]
        n = len(lines)
        if not n:
            return (lines, array("d"), array("q"), array("q")), newlines
        values = array("d", map(float, parts[self.value :: step]))
        missing = array("q", (_MISSING,)) * n
        its = _digits(parts[self.iteration :: step]) if self.iteration else missing
        eps = _digits(parts[self.epoch :: step]) if self.epoch else missing
        return (lines, values, its, eps), newlines


def _digits(digits: list[bytes | None]) -> _Digits | array[int] | list[int | None]:
    try:
        return _Digits(b" ".join(digits))
    except TypeError:  # a group that took no part (None)
        return _ints(digits)


def _ints(digits: list[bytes | None]) -> array[int] | list[int | None]:
    try:
        return array("q", map(int, digits))
    except (TypeError, OverflowError):  # a group that took no part, or a number past int64
        return [None if d is None else int(d) for d in digits]


def _record_columns(rules: list[_RecordRule], block: bytes, base: int) -> tuple[_Columns | None, int]:
    """All record rules over ``block``, merged in file order, and the block's newline count."""
    if not rules:
        return None, block.count(b"\n")
    found = [rule.columns(block, base) for rule in rules]
    newlines = found[0][1]
    hit = [cols for cols, _ in found if len(cols[0])]
    if not hit:
        return None, newlines
    if len(hit) == 1:
        return hit[0], newlines
    # several rules matched in one block (rare: a log in two line formats): merge by line
    rows = sorted(
        (cols[0][k], r, k) for r, cols in enumerate(hit) for k in range(len(cols[0]))
    )  # (line, rule, index): unique, so columns are never compared
    cols = [
        [c[0] for c in hit],
        [c[1] for c in hit],
        [_as_list(_eager(c[2])) for c in hit],  # type: ignore[arg-type]
        [_as_list(_eager(c[3])) for c in hit],  # type: ignore[arg-type]
    ]
    lines, values, its, eps = ([col[r][k] for _, r, k in rows] for col in cols)
    return (array("q", lines), array("d", values), _int_col(its), _int_col(eps)), newlines


#: (start, rule index, 1-based line, spans) as the native scan gives a match, or (start, rule
#: index, 0, match) for one ``re`` found, whose line is counted when it is handled
_Hit = tuple[int, int, int, "tuple[int, ...] | re.Match[str]"]


class _OtherRule:
    """A non-record rule, its handler, and how the Python engine finds its matches in a block of
    text (the native scanners find those of all rules at once: :func:`_other_matches`).

    ``finditer`` searches with sre's own loop. A pattern that starts with a distinctive literal
    (``PARAMETER ``, ``Num GPUs ``) is found faster by ``str.find`` on that literal, with the
    pattern then tried at each place found: the same matches (a match can only start where its
    literal prefix does), at two to three times the speed when the literal is rare, as such lines
    are. When a block shows the literal is common after all, the rule goes back to ``finditer``.
    """

    __slots__ = ("act", "index", "prefix", "rx")

    MIN_PREFIX = 4  # shorter literals (a quote, "] ") are too common for find to pay
    MAX_TRIES = 256  # places per block tried before the literal counts as common

    def __init__(self, rx: re.Pattern[str], act: Callable[[Builder, re.Match[str], int], None]) -> None:
        self.rx = rx
        self.act = act
        self.index = 0  # the rule's place in its parser's table (orders hits at one offset)
        prefix = _literal_prefix(rx)
        self.prefix = prefix if len(prefix) >= self.MIN_PREFIX else ""

    def matches(self, text: str) -> Iterable[re.Match[str]]:
        prefix = self.prefix
        if not prefix:
            return self.rx.finditer(text)
        found: list[re.Match[str]] = []
        find, match = text.find, self.rx.match
        pos = tries = 0
        while (at := find(prefix, pos)) >= 0:
            m = match(text, at)
            if m is None:
                pos = at + 1
                tries += 1
                if tries > self.MAX_TRIES:  # common literal, rare match: finditer is faster
                    self.prefix = ""
                    return found + list(self.rx.finditer(text, pos))
            else:
                found.append(m)
                pos = m.end()
        return found


@cache  # every parse builds its rule table: the patterns are read once a process
def _parsed(pattern: str, flags: int) -> Any:
    """``re``'s parse of a pattern, None when case-blind or not understood (a private module: if
    it changes, no literal shortcut is taken)."""
    if flags & re.IGNORECASE:
        return None
    try:
        parsed = re._parser.parse(pattern, flags)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return None
    return None if parsed.state.flags & re.IGNORECASE else parsed


@cache
def _literal_runs(pattern: str, flags: int) -> tuple[str, ...]:
    """The runs of literal text at the top level of a pattern, in order; the first is the
    pattern's literal prefix ("" if it has none). No runs when case-blind or not understood."""
    parsed = _parsed(pattern, flags)
    if parsed is None:
        return ()
    runs = [""]
    for op, arg in parsed:
        if op is re._constants.LITERAL:  # type: ignore[attr-defined]
            runs[-1] += chr(arg)
        else:
            runs.append("")
    return tuple(runs)


@cache
def _start_literals(pattern: str, flags: int) -> tuple[str, ...]:
    """Literal texts one of which every match of ``pattern`` starts with, after any zero-width
    assertions (lookarounds, ``^``, ``\\b``): each as long as the pattern fixes it, through groups
    and alternations of literals. () when unknown, case-blind, or not worth a search (a text
    shorter than :data:`_START_MIN`, more than :data:`_STARTS_MAX` of them)."""
    parsed = _parsed(pattern, flags)
    if parsed is None:
        return ()
    c = re._constants  # type: ignore[attr-defined]
    zero_width = (c.ASSERT, c.ASSERT_NOT, c.AT)

    def heads(items: Iterable[tuple[object, object]], opening: bool) -> tuple[list[str], bool]:
        """(texts a match of ``items`` starts with, whether they are the whole of every match)"""
        outs = [""]
        for op, arg in items:
            if op is c.LITERAL:
                outs = [o + chr(arg) for o in outs]  # type: ignore[call-overload]
                continue
            if opening and outs == [""] and op in zero_width:
                continue
            if op is c.SUBPATTERN and not arg[1] & re.IGNORECASE:  # type: ignore[index]
                sub, whole = heads(arg[3], opening and outs == [""])  # type: ignore[index]
            elif op is c.BRANCH:
                alts = [heads(alt, opening and outs == [""]) for alt in arg[1]]  # type: ignore[index]
                sub, whole = [h for hs, _ in alts for h in hs], all(w for _, w in alts)
            else:
                return outs, False
            longer = {o + h for o in outs for h in sub}
            if len(longer) > _STARTS_MAX:
                return outs, False
            outs = sorted(longer)
            if not whole:
                return outs, False
        return outs, True

    found = sorted(set(heads(parsed, True)[0]))  # a text comes after the texts it starts with
    starts = [s for i, s in enumerate(found) if not any(s.startswith(t) for t in found[:i])]
    if any(len(s) < _START_MIN for s in starts):
        return ()
    return tuple(starts)


#: shorter start texts are found as fast by PCRE2's own search for a first character; the native
#: scanner takes up to 8 start texts
_START_MIN = 2
_STARTS_MAX = 8


def _literal_prefix(rx: re.Pattern[str]) -> str:
    """The literal text every match of ``rx`` starts with ("" when unknown or case-blind)."""
    return next(iter(_literal_runs(rx.pattern, rx.flags)), "")


#: a match the native scan found, read as a ``re.Match`` by handlers (``_scan.Found``: group,
#: ``[g]``, groups, groupdict, start, end, span, string, re); it holds the spans of the match and its
#: groups and cuts a group's text from the block when it is read, so nothing is matched twice
_Found = Found


class _Text:
    """A block decoded once, when a rule first needs the text."""

    __slots__ = ("block", "text")

    def __init__(self, block: bytes) -> None:
        self.block = block
        self.text: str | None = None

    def get(self) -> str:
        if self.text is None:
            self.text = self.block.decode("utf-8", "replace")
        return self.text


def _other_matches(
    rules: list[_OtherRule],
    natives: tuple[_scan.Scanner, ...] | None,
    patterns: tuple[re.Pattern[str], ...],
    text: _Text,
    base: int,
) -> list[_Hit]:
    """Matches of the non-record rules in a block, in file order (ties in rule order). The native
    scanners (``natives``, one a rule) find all of them in one call, with their lines (``base``
    lines before the block) and spans, in an ASCII block, where byte offsets are text offsets;
    elsewhere ``re`` finds them in the decoded text."""
    found = _NATIVE_SCAN(natives, text.block, base, patterns, text) if natives is not None else None
    if found is not None:
        return found  # type: ignore[no-any-return]
    hits: list[_Hit] = [(m.start(), r.index, 0, m) for r in rules for m in r.matches(text.get())]
    hits.sort(key=_start_and_rule)
    return hits


def _start_and_rule(hit: _Hit) -> tuple[int, int]:
    return hit[0], hit[1]


#: what the native scanner reads as Python does: re flags it maps, and no construct whose meaning
#: differs between the two (``\Z``, ``{,n}``, ``\N{...}``, ``\u``, octal ``\0``, inline flags,
#: conditionals) - any such rule just stays with the Python engine
_NATIVE_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE | re.ASCII
_NATIVE_UNSAFE = re.compile(r"\\[ZNuU0]|\{,|\(\?[aiLmsux-]|\(\?\(")


def _native_scanner(pattern: str, flags: int) -> _scan.Scanner | None:
    if ENGINE == "python" or flags & ~_NATIVE_FLAGS or not pattern.isascii():
        return None
    if _NATIVE_UNSAFE.search(pattern):
        return None
    starts = tuple(s.encode() for s in _start_literals(pattern, flags))
    try:
        return Scanner(pattern.encode(), int(flags), _required_literal(pattern, flags).encode(), starts)
    except ValueError:
        return None


def _required_literal(pattern: str, flags: int) -> str:
    """The longest run of literal text at the top level of ``pattern``: every match holds it, so
    the scanner skips a block without it in one ``memmem`` ("" when unknown or case-blind)."""
    return max(_literal_runs(pattern, flags), key=len, default="")


def _dispatch(b: Builder, hits: list[_Hit], rules: list[_OtherRule], text: _Text, base: int) -> None:
    """Call the handlers in file order, each with its match (``re``'s, or the native scan's
    :data:`_Found`) and its 1-based line (counted here where the scan did not give it)."""
    pos, n = 0, base
    for start, i, line, m in hits:
        if not line:  # found by re: count the lines to it (every hit of the block is then)
            n += text.get().count("\n", pos, start)
            pos = start
            line = n + 1
        b._at = line
        rules[i].act(b, m, line)  # type: ignore[arg-type]


def _new_record(value: float, iteration: int | None, epoch: int | None, line: int) -> Record:
    """``Record(...)`` without the frozen-dataclass ``__init__``, which costs twice as much.

    The slots are filled through their descriptors; the object is the same as one built by the
    constructor (tests compare both).
    """
    r = _object_new(Record)
    _set_value(r, value)
    _set_iteration(r, iteration)
    _set_epoch(r, epoch)
    _set_line(r, line)
    return r


_object_new = object.__new__
_set_value, _set_iteration, _set_epoch, _set_line = (
    Record.__dict__[f].__set__ for f in ("value", "iteration", "epoch", "line")
)
