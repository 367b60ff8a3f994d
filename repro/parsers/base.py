"""What a log parser returns, the parser interface, and the engine the built-in parsers share.

A built-in parser is a table of :class:`Rule` objects (a regular expression plus what to do with
a match) and a few small handler methods. :class:`PatternParser` runs the table over the text in
large blocks of whole lines: every rule's expression scans the block in C (``finditer``), the
matches are put back in file order, and each is handed to its handler together with its 1-based
line number. Lines no rule matches (most of a log) never reach Python code, so the cost of a
parse is the scan plus the work per matched line.

Rules must not match across a newline, and a number that ends a record has to be followed by
something (a unit, a space, the newline). The last line of a cut-off file has no newline, so a
number cut in half there never matches and never becomes a wrong record.
"""

from __future__ import annotations

import abc
import gc
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import ClassVar

#: A decimal number as training scripts print it (``394.81086``, ``1e-05``, ``12671.899230200308``).
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"

#: Characters handed to the rules at once; large enough that the per-block overhead vanishes.
BLOCK_CHARS = 1 << 20

_MPI_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_MPI_STAMPED_TAG = re.compile(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}" + _MPI_TAG.pattern)


@dataclass(frozen=True, slots=True)
class Record:
    """One throughput observation in a log."""

    value: float  # images/s as printed (per GPU for PaddleClas, global otherwise)
    iteration: int | None = None  # step / iteration number if the line has one
    epoch: int | None = None
    line: int = 0  # 1-based line number in the file


@dataclass
class Series:
    """All records of one run inside a log."""

    gpus: int | None  # GPU count of that run if the log says it, else None
    records: list[Record]
    summary: float | None = None  # the figure the log itself prints as its result, if any
    per_gpu: bool = False  # True when values are per GPU (PaddleClas rank-0 ips)


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


def blocks_from_lines(lines: Iterable[str], size: int = BLOCK_CHARS) -> Iterator[str]:
    """Join an iterable of lines into blocks of whole lines.

    Items may carry their line ending or not (``str.splitlines()`` output). When the earlier
    items did end in a newline and the last one does not, the last one is kept unterminated:
    that is how a cut-off file looks, and the rules treat it accordingly.
    """
    buf: list[str] = []
    held = 0
    terminated = False
    prev: str | None = None
    for line in lines:
        if prev is not None:
            if prev.endswith("\n"):
                terminated = True
            else:
                prev += "\n"
            buf.append(prev)
            held += len(prev)
            if held >= size:
                yield "".join(buf)
                buf, held = [], 0
        prev = line
    if prev is not None:
        if not prev.endswith("\n") and not terminated:
            prev += "\n"
        buf.append(prev)
    if buf:
        yield "".join(buf)


def params_of(text: str) -> dict[str, str]:
    """``key : value  key : value`` (DLLogger PARAMETER lines) -> dict of strings.

    Items are separated by two spaces; values may hold single spaces (``gpus : [0, 1, 2]``).
    """
    out: dict[str, str] = {}
    for item in text.split("  "):
        key, sep, value = item.strip().partition(" : ")
        if sep:
            out[key] = value.strip()
        elif item.strip().endswith(" :"):
            out[item.strip()[:-2]] = ""
    return out


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
    name of a handler method ``(self, b, m, line)`` on the parser class.
    """

    pattern: str
    action: str
    convert: Callable[[str], object] = str
    flags: int = 0
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern, self.flags))


class Builder:
    """Mutable state of one parse; handlers only talk to this."""

    MAX_ISSUES = 50

    def __init__(self, per_gpu: bool) -> None:
        self.per_gpu = per_gpu
        self.series: list[Series] = []
        self.facts: dict[str, object] = {}
        self.issues: list[str] = []
        self.scratch: dict[str, object] = {}  # per-parser working state
        self._fact_line: dict[str, int] = {}
        self._summaries = 0
        self._dropped = 0
        self.last_record_line = 0

    # series -------------------------------------------------------------------------------
    def current(self) -> Series:
        if not self.series:
            self.series.append(Series(gpus=None, records=[], per_gpu=self.per_gpu))
        return self.series[-1]

    def new_run(self, gpus: int | None = None) -> Series:
        """A new run starts here; reuse the current series while it is still empty."""
        s = self.series[-1] if self.series else None
        if s is None or s.records or s.summary is not None:
            s = Series(gpus=None, records=[], per_gpu=self.per_gpu)
            self.series.append(s)
        if gpus is not None:
            s.gpus = gpus
        return s

    def record(self, value: float, iteration: int | None, epoch: int | None, line: int) -> None:
        self.current().records.append(_new_record(value, iteration, epoch, line))
        self.last_record_line = line

    def summary(self, value: float, line: int, series: Series | None = None) -> None:
        s = series or self.current()
        if s.summary is not None:
            self._summaries += 1
        s.summary = value
        self.last_record_line = line

    # facts and issues ------------------------------------------------------------------------
    def fact(self, key: str, value: object, line: int) -> None:
        if value is None:
            return
        old = self.facts.get(key)
        if old is not None and old != value:
            self.issue(
                f"contradicting {key}: {old!r} (line {self._fact_line[key]}) and {value!r} (line {line}); "
                f"keeping the first"
            )
            return
        if old is None:
            self.facts[key] = value
            self._fact_line[key] = line

    def issue(self, text: str) -> None:
        if text in self.issues:
            return
        if len(self.issues) < self.MAX_ISSUES:
            self.issues.append(text)
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

    @classmethod
    def detect(cls, head: Sequence[str]) -> bool:
        text = clean_text("\n".join(line.rstrip("\n") for line in head))
        return any(p.search(text) for p in cls.detect_any)

    def parse(self, lines: Iterable[str]) -> ParseResult:
        return self.parse_blocks(blocks_from_lines(lines))

    def parse_blocks(self, blocks: Iterable[str]) -> ParseResult:
        """Run the rules over blocks of whole lines (the last block may end without a newline)."""
        b = Builder(self.per_gpu)
        # A long log yields millions of small objects that never form cycles; the cyclic GC
        # would only re-walk them over and over, so it is paused for the scan.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            lines, tail = self._scan(b, blocks)
        finally:
            if gc_was_on:
                gc.enable()
        if tail and not tail.endswith("\n"):
            self._check_cut_line(b, tail[tail.rfind("\n") + 1 :], lines)
        self.finish(b)
        return b.finish(self.name, lines)

    def _scan(self, b: Builder, blocks: Iterable[str]) -> tuple[int, str]:
        """Count lines and dispatch every match in file order; returns (lines, last block)."""
        record_rules = [(r.regex, _record_layout(r.regex)) for r in self.rules if r.action == "record"]
        other_rules = [(r.regex, self._action(r)) for r in self.rules if r.action != "record"]
        actions = [a for _, a in other_rules]
        base = 0  # newlines before the current block
        tail = ""
        for raw in blocks:
            block = clean_text(raw)
            others: list[tuple[int, int, re.Match[str]]] = []
            for i, (rx, _) in enumerate(other_rules):
                others += [(m.start(), i, m) for m in rx.finditer(block)]
            others.sort()  # file order; (start, rule) is unique, so matches are never compared
            base = self._dispatch(b, block, base, _record_matches(block, record_rules), others, actions)
            if block:
                tail = block
        if tail and not tail.endswith("\n"):
            base += 1
        return base, tail

    @staticmethod
    def _dispatch(
        b: Builder,
        block: str,
        base: int,
        records: Iterator[tuple[re.Match[str], _Layout]],
        others: list[tuple[int, int, re.Match[str]]],
        actions: list[Callable],
    ) -> int:
        """The hot loop: walk record matches and the (few) other matches merged by position.

        Records are the bulk of the matches, so they are handled inline, without building an
        event per match or calling a handler; the current series can only change in a handler.
        """
        count = block.count
        pos, n = 0, base
        k, n_others = 0, len(others)
        next_other = others[0][0] if others else -1
        recs = b.current().records if b.series else None
        ints = _INTS
        for m, (names, it, ep) in records:
            start = m.start()
            while 0 <= next_other < start:
                _, i, om = others[k]
                n += count("\n", pos, next_other)
                pos = next_other
                actions[i](b, om, n + 1)
                k += 1
                next_other = others[k][0] if k < n_others else -1
                recs = None
            n += count("\n", pos, start)
            pos = start
            g = m.group(*names)
            iteration = g[it] if it else None  # digit strings -> shared ints (see _INTS)
            if iteration:
                iteration = ints.get(iteration) or _int_of(iteration)
            epoch = g[ep] if ep else None
            if epoch:
                epoch = ints.get(epoch) or _int_of(epoch)
            if recs is None:
                recs = b.current().records
            recs.append(_new_record(float(g[0]), iteration, epoch, n + 1))
            b.last_record_line = n + 1
        for start, i, om in others[k:]:
            n += count("\n", pos, start)
            pos = start
            actions[i](b, om, n + 1)
        return n + count("\n", pos)

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

    def _action(self, rule: Rule) -> Callable[[Builder, re.Match[str], int], None] | None:
        act = rule.action
        if act == "record":
            return None  # handled inline by _scan
        if act == "summary":
            return _on_summary
        if act.startswith("fact:"):
            key, conv = act[5:], rule.convert
            return lambda b, m, line: b.fact(key, conv(m.group(1)), line)
        return getattr(self, act)

    def _check_cut_line(self, b: Builder, text: str, line: int) -> None:
        if any(h in text for h in self.record_hints) and b.last_record_line != line:
            b.issue(f"line {line} is cut off (file ends without a newline) and was not used: {text[:120]!r}")


def _new_record(value: float, iteration: int | None, epoch: int | None, line: int) -> Record:
    """``Record(...)`` without the frozen-dataclass ``__init__``, which costs twice as much.

    The slots are filled through their descriptors; the object is the same as one built by the
    constructor (tests compare both). Hot: called once per record line.
    """
    r = _object_new(Record)
    _set_value(r, value)
    _set_iteration(r, iteration)
    _set_epoch(r, epoch)
    _set_line(r, line)
    return r


def _int_of(text: str) -> int:
    """``int(text)``, remembered in :data:`_INTS` while that holds fewer than 65536 numbers."""
    value = int(text)
    if len(_INTS) < 1 << 16:
        _INTS[text] = value
    return value


#: digit string -> int, shared by all records: step and epoch numbers repeat from run to run, and
#: one int object per distinct number (instead of per record) saves memory on long logs
_INTS: dict[str, int] = {}


_object_new = object.__new__
_set_value, _set_iteration, _set_epoch, _set_line = (
    Record.__dict__[f].__set__ for f in ("value", "iteration", "epoch", "line")
)


_Layout = tuple[tuple[str, ...], int, int]


def _record_matches(
    block: str, rules: list[tuple[re.Pattern[str], _Layout]]
) -> Iterator[tuple[re.Match[str], _Layout]]:
    """Record matches of all record rules in file order (one rule: straight from the scan)."""
    if len(rules) == 1:
        rx, layout = rules[0]
        return zip(rx.finditer(block), repeat(layout))
    found = [(m.start(), i, m) for i, (rx, _) in enumerate(rules) for m in rx.finditer(block)]
    found.sort()
    return ((m, rules[i][1]) for _, i, m in found)


def _record_layout(regex: re.Pattern[str]) -> _Layout:
    """For a record rule: the group names to fetch (always two or more, so ``m.group`` returns a
    tuple) and the positions of iteration and epoch in that tuple (0 when the rule has none)."""
    extra = tuple(g for g in ("iteration", "epoch") if g in regex.groupindex)
    names = ("value",) + (extra or ("value",))
    return (
        names,
        names.index("iteration") if "iteration" in extra else 0,
        names.index("epoch") if "epoch" in extra else 0,
    )


def _on_summary(b: Builder, m: re.Match[str], line: int) -> None:
    b.summary(float(m.group("value")), line)
