"""The engine the built-in parsers share: a table of rules run over blocks of whole lines.

A built-in parser is a table of :class:`Rule` objects (a regular expression plus what to do with a
match) and a few small handler methods. :class:`PatternParser` runs every rule over each block of
clean text (see :mod:`repro.measure.parsers.text`) with ``re.finditer`` and hands the matches over in file
order: by line, and on one line the other rules' matches before a record's (a run boundary or a
fact then applies to the record beside it).

A record rule must not match a newline, and a number that ends a record has to be followed by
something (a unit, a space, the newline): the last line of a cut-off file has no newline, so a
number cut in half there never becomes a wrong record. Other rules may span lines; a parser whose
rules read a structure across lines (a config dump) says which lines continue one
(``block_continues``), and such a structure is never split between blocks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from repro.measure.model import LogParser, ParseResult, Record, Series
from repro.measure.parsers.text import BLOCK_BYTES, MPI_PREFIX, clean_text

if TYPE_CHECKING:
    from repro.measure.protocol import Tally

__all__ = ["MPI_PREFIX", "NUM", "BLOCK_BYTES", "Builder", "LogParser", "ParseResult", "PatternParser",
           "Record", "Rule", "Series", "clean_text", "params_of", "to_bool", "to_int"]

#: A decimal number as training scripts print it (``394.81086``, ``1e-05``, ``12671.899230200308``),
#: and the words Python's ``float`` reads as infinity or not-a-number (an impossible figure to report).
NUM = r"(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan|Infinity|NaN)\b)"


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


class Params(Mapping[str, str]):
    """The items of a DLLogger ``PARAMETER`` line, ``key : value  key : value``, as a mapping:
    items are separated by two spaces, values may hold single spaces, a repeated key keeps its
    last value."""

    def __init__(self, text: str) -> None:
        self._items: dict[str, str] = {}
        for item in text.split("  "):
            key, sep, value = item.strip().partition(" : ")
            if sep:
                self._items[key] = value.strip()
            elif key.endswith(" :"):  # "key :" with nothing after it
                self._items[key[:-2]] = ""

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def pick(self, *keys: str) -> tuple[str | None, ...]:
        return tuple(map(self._items.get, keys))


params_of = Params


@dataclass(frozen=True)
class Rule:
    """``pattern`` plus what a match means.

    ``action`` is ``"record"`` (named groups ``value`` and optionally ``iteration``/``epoch``),
    ``"summary"`` (group ``value``: the parser's summary, kept under its ``summary_name`` too),
    ``"summary:<name>"`` (group ``value``: another figure of the printed summary, kept by name only),
    ``"fact:<key>"`` (group 1 converted by ``convert``), or the
    name of a handler method ``(self, b, m, line)`` on the parser class. ``\\d``, ``\\w`` and
    ``\\s`` are ASCII.
    """

    pattern: str
    action: str
    convert: Callable[[str], object] = str
    flags: int = 0
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern, self.flags | re.ASCII))


class Builder:
    """Mutable state of one parse; handlers only talk to this."""

    MAX_ISSUES = 50

    def __init__(self, per_gpu: bool, new_tally: Callable[[], Tally] | None = None) -> None:
        self.per_gpu = per_gpu
        # makes each series' tally (records folded as they come), or None: keep them
        self.new_tally = new_tally
        self.series: list[Series] = []
        self.facts: dict[str, object] = {}
        self.issues: list[str] = []
        self.scratch: dict[str, object] = {}  # per-parser working state
        self._fact_line: dict[str, int] = {}
        self._summaries = 0
        self._dropped = 0
        self._bad = 0  # impossible values, the first one kept
        self._first_bad: tuple[int, str] = (0, "")
        self.last_record_line = 0

    # series -------------------------------------------------------------------------------
    def current(self) -> Series:
        if not self.series:
            self.series.append(self._series())
        return self.series[-1]

    def _series(self) -> Series:
        return Series(gpus=None, per_gpu=self.per_gpu, tally=self.new_tally() if self.new_tally else None)

    def new_run(self, gpus: int | None = None) -> Series:
        """A new run starts here; reuse the current series while it is still empty (its facts stay:
        every rank of one run may print its arguments). The facts stated so far are the previous run's,
        and none of them carries into the new one."""
        s = self.series[-1] if self.series else None
        if s is None or len(s) or s.summary is not None or s.summaries:
            if s is not None:
                s.settle()
                s.facts = self.facts
                self.facts, self._fact_line = {}, {}
            s = self._series()
            self.series.append(s)
        if gpus is not None:
            s.gpus = gpus
        return s

    def record(self, value: float, iteration: int | None, epoch: int | None, line: int) -> None:
        self.last_record_line = line
        if not (value > 0 and value != math.inf):  # <= 0, inf, NaN: no throughput can be that
            self.bad(line, repr(value))
            return
        self.current().add(value, iteration, epoch, line)

    def bad(self, line: int, value: str) -> None:
        """An impossible value (<= 0, inf, NaN) on ``line``: the log cannot give a figure."""
        if not self._bad:
            self._first_bad = (line, value)
        self._bad += 1

    def summary(self, value: float, line: int, series: Series | None = None, name: str | None = None) -> None:
        self.last_record_line = line
        if not (value > 0 and value != math.inf):
            self.bad(line, f"summary {value!r}")
            return
        s = series or self.current()
        if s.summary is not None:
            self._summaries += 1
        s.summary = value
        if name is not None:
            s.summaries[name] = value

    def named_summary(self, name: str, value: float, line: int) -> None:
        """Another figure of the run's printed summary than the parser's own (the last one printed stays);
        an impossible one is not kept, and says so, but refuses no figure read elsewhere."""
        self.last_record_line = line
        if value > 0 and value != math.inf:
            self.current().summaries[name] = value
        else:
            self.issue(f"line {line}: impossible summary {name} {value!r}, not kept")

    # facts and issues ------------------------------------------------------------------------
    def fact(self, key: str, value: object, line: int) -> None:
        """What the log says about the run it is in (``facts``: the current run's); the first value of
        a key stays, a different later one in the same run is an issue. None says nothing."""
        if value is None:
            return
        old = self.facts.get(key)
        if old is None:
            self.facts[key] = value
            self._fact_line[key] = line
        elif old != value:
            self.issue(f"contradicting {key}: {old!r} (line {self._fact_line[key]}) "
                       f"and {value!r} (line {line}); keeping the first")

    def facts_at(self, items: Iterable[tuple[str, object]], line: int) -> None:
        """:meth:`fact` for each ``(key, value)`` of one line (a run's parameters)."""
        for key, value in items:
            self.fact(key, value, line)

    def issue(self, text: str) -> None:
        if text in self.issues:
            return
        if len(self.issues) < self.MAX_ISSUES:
            self.issues.append(text)
        else:
            self._dropped += 1

    def finish(self, parser: str, lines: int) -> ParseResult:
        refused = None
        if self._bad:
            (line, value), n = self._first_bad, self._bad
            refused = (f"impossible throughput: {n} value(s) that are zero, negative, infinite or "
                       f"not a number (first {value} on line {line}); the log cannot give a figure")
            self.issues.insert(0, refused)
        if self._summaries:
            self.issue(f"{self._summaries + 1} printed summaries for one run; the last one is used")
        if self.series:
            self.series[-1].facts = self.facts
        for s in self.series:
            s.settle()
            gpus = s.facts.get("gpus")
            if s.gpus is None and isinstance(gpus, int):
                s.gpus = gpus
            if s.gpus is not None:
                s.facts.setdefault("gpus", s.gpus)
        if self._dropped:
            self.issues.append(f"... and {self._dropped} more issues")
        facts = _common([s.facts for s in self.series]) if self.series else self.facts
        return ParseResult(parser, self.series, facts, self.issues, lines, refused)


def _common(runs: list[dict[str, object]]) -> dict[str, object]:
    """The facts every run states alike (a log of one run: all of its facts)."""
    first, *rest = runs
    return {k: v for k, v in first.items() if all(k in f and f[k] == v for f in rest)}


class PatternParser(LogParser):
    """A parser described by tables: ``detect_any`` for detection, ``rules`` for parsing."""

    detect_any: ClassVar[tuple[re.Pattern[str], ...]] = ()
    rules: ClassVar[tuple[Rule, ...]] = ()
    per_gpu: ClassVar[bool] = False
    #: records are steps per second (1 / step time), not images/s: a figure needs the global batch
    step_rates: ClassVar[bool] = False
    #: the name the format prints its summary under (a protocol's ``summary_metric`` may name it)
    summary_name: ClassVar[str | None] = None
    #: substrings of record and summary lines; used to report a cut-off last line
    record_hints: ClassVar[tuple[str, ...]] = ()
    #: lines that continue the structure of the lines before them (an indented line of a config
    #: dump): a block never ends inside such a structure
    block_continues: ClassVar[re.Pattern[str] | None] = None

    @classmethod
    def detect(cls, head: Sequence[str]) -> bool:
        text = clean_text("\n".join(line.rstrip("\n") for line in head))
        return any(p.search(text) for p in cls.detect_any)

    def parse(self, lines: Iterable[str]) -> ParseResult:
        return self.parse_blocks(_blocks_of_lines(lines))

    def parse_blocks(self, blocks: Iterable[str],
                     new_tally: Callable[[], Tally] | None = None) -> ParseResult:
        """Run the rules over blocks of whole lines of clean text (the last one may end without a
        newline: a cut-off line). With ``new_tally``, each run's records are folded block by block
        into a tally it makes (see :class:`Series`)."""
        b = Builder(self.per_gpu, new_tally)
        records = [_RecordRule(r.regex) for r in self.rules if r.action == "record"]
        others = [(r.regex, self._action(r)) for r in self.rules if r.action != "record"]
        base = 0  # lines before the block
        text = ""
        for text in self._whole_structures(blocks):
            _scan(b, records, others, text, base)
            if b.series:
                b.series[-1].settle()
            base += text.count("\n")
        tail = text[text.rfind("\n") + 1 :]
        if tail:  # the last line, cut off (it has no newline)
            base += 1
            if any(h in tail for h in self.record_hints) and b.last_record_line != base:
                b.issue(f"line {base} is cut off (file ends without a newline) and was not used: "
                        f"{tail[:120]!r}")
        self.finish(b)
        return b.finish(self.name, base)

    def _whole_structures(self, blocks: Iterable[str]) -> Iterator[str]:
        """The blocks, with a structure that runs past a block's end moved into the next one."""
        cont = self.block_continues
        if cont is None:
            yield from blocks
            return
        held = ""
        for block in blocks:
            text = held + block if held else block
            cut = _structure_start(text, cont)
            if not cut and len(text) >= 4 * BLOCK_BYTES:  # a structure this long is no config dump
                cut = len(text)
            held = text[cut:]
            if cut:
                yield text[:cut]
        if held:
            yield held

    def _action(self, rule: Rule) -> Callable[[Builder, re.Match[str], int], None]:
        act, rx = rule.action, rule.regex
        if act == "summary":
            value, name = rx.groupindex["value"], self.summary_name
            return lambda b, m, line: b.summary(float(m.group(value)), line, name=name)
        if act.startswith("summary:"):
            value, name = rx.groupindex["value"], act[8:]
            return lambda b, m, line: b.named_summary(name, float(m.group(value)), line)
        if act.startswith("fact:"):
            key, conv = act[5:], rule.convert
            return lambda b, m, line: b.fact(key, conv(m.group(1)), line)
        return getattr(self, act)

    def finish(self, b: Builder) -> None:
        """Hook: derive facts that need the whole log."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        named = [r.action[8:] for r in cls.rules if r.action.startswith("summary:")]
        cls.summary_names = tuple(dict.fromkeys([cls.summary_name, *named] if cls.summary_name else named))
        for r in cls.rules:  # fail at import, not in the middle of a log
            valued = r.action in ("record", "summary") or r.action.startswith("summary:")
            if valued and "value" not in r.regex.groupindex:
                raise TypeError(f"{cls.__name__}: {r.action} rule {r.pattern!r} has no 'value' group")
            if (not valued and not r.action.startswith("fact:")
                    and not callable(getattr(cls, r.action, None))):
                raise TypeError(f"{cls.__name__}: no handler method {r.action!r}")


class _RecordRule:
    """A record rule and where its groups are."""

    def __init__(self, rx: re.Pattern[str]) -> None:
        self.rx = rx
        self.value = rx.groupindex["value"]
        self.iteration = rx.groupindex.get("iteration")
        self.epoch = rx.groupindex.get("epoch")


def _scan(b: Builder, records: list[_RecordRule], others: list, text: str, base: int) -> None:
    """Hand every match of the block over in file order; on one line, other rules' matches come
    before a record's (a run that starts there takes the record)."""
    hits = [(m.start(), i, m) for i, (rx, _) in enumerate(others) for m in rx.finditer(text)]
    hits.sort(key=_start_and_rule)
    found = [(rule, list(rule.rx.finditer(text))) for rule in records]
    found = [(rule, ms) for rule, ms in found if ms]
    if len(found) > 1:  # a log in two record formats: one list in file order
        found = [(None, sorted(((m, rule) for rule, ms in found for m in ms), key=_match_start))]  # type: ignore[misc]
    rule, matches = found[0] if found else (None, [])
    at = _Lines(text, base)
    k = 0  # records handed over so far
    for start, i, m in hits:
        k = _records(b, rule, matches, k, text.rfind("\n", 0, start) + 1, at)  # records of the lines before
        others[i][1](b, m, at.line(start))
    _records(b, rule, matches, k, len(text) + 1, at)


class _Lines:
    """Line numbers of offsets of a block, asked in increasing order."""

    __slots__ = ("line_at", "pos", "text")

    def __init__(self, text: str, base: int) -> None:
        self.text, self.pos, self.line_at = text, 0, base + 1

    def line(self, offset: int) -> int:
        if offset > self.pos:
            self.line_at += self.text.count("\n", self.pos, offset)
            self.pos = offset
        return self.line_at


def _records(b: Builder, rule: _RecordRule | None, matches: list, k: int, before: int, at: _Lines) -> int:
    """Add the records ``matches[k:]`` that start before offset ``before``; the next ``k``."""
    n = len(matches)
    if k >= n or (matches[k] if rule else matches[k][0]).start() >= before:
        return k
    series = b.current()
    add = series.add
    text, pos, line = at.text, at.pos, at.line_at
    count = text.count
    while k < n:
        if rule is None:
            m, r = matches[k]
        else:
            m, r = matches[k], rule
        start = m.start()
        if start >= before:
            break
        line += count("\n", pos, start)
        pos = start
        value = float(m.group(r.value))
        if value > 0 and value != _INF:
            it = m.group(r.iteration) if r.iteration else None
            ep = m.group(r.epoch) if r.epoch else None
            add(value, None if it is None else int(it), None if ep is None else int(ep), line)
        else:  # zero, negative, infinite or not a number: no throughput can be that
            b.bad(line, repr(value))
        k += 1
    at.pos, at.line_at = pos, line
    b.last_record_line = line
    return k


_INF = math.inf


def _start_and_rule(hit: tuple) -> tuple[int, int]:
    return hit[0], hit[1]


def _match_start(item: tuple) -> int:
    return item[0].start()  # type: ignore[no-any-return]


def _structure_start(text: str, cont: re.Pattern[str]) -> int:
    """Where the last structure of ``text`` starts (the lines after it may continue it): the
    start of the last line that continues nothing; 0 when every line continues one."""
    if not text.endswith("\n"):
        return len(text)  # the last block of the file: nothing follows
    start = len(text) - 1
    while start:
        start = text.rfind("\n", 0, start - 1) + 1
        if not cont.match(text, start):
            return start
    return 0


def _blocks_of_lines(lines: Iterable[str], size: int = BLOCK_BYTES) -> Iterator[str]:
    """Join lines (with or without their line endings) into clean blocks of whole lines. When the
    earlier lines end in a newline and the last one does not, it stays unterminated: that is how
    a cut-off file looks."""
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
                yield clean_text("".join(buf))
                buf, held = [], 0
        prev = line
    if prev is not None:
        if not prev.endswith("\n") and not terminated:
            prev += "\n"
        buf.append(prev)
    if buf:
        yield clean_text("".join(buf))
