"""What a log parser returns: records, the runs (series) that hold them, and the parse result."""

from __future__ import annotations

import abc
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol


class RecordSink(Protocol):
    """What a series folds its records into (:class:`repro.measure.protocol.Tally`: what one protocol
    needs)."""

    count: int

    def take(self, series: Series) -> None: ...


#: stands for "no number" in an int32 column (numbers in logs are never negative)
_NONE = -(1 << 31)
#: the columns of a series that holds no records (made on the first one)
_NO_COLUMNS: tuple = ((), (), (), ())


@dataclass(frozen=True, slots=True)
class Record:
    """One throughput observation in a log."""

    value: float  # as printed, in the parser's unit (per GPU for PaddleClas, global otherwise)
    iteration: int | None = None  # step / iteration number if the line has one
    epoch: int | None = None
    line: int = 0  # 1-based line number in the file


class Series:
    """All records of one run inside a log.

    Records are kept as four columns (value, iteration, epoch, line), 20 bytes a record;
    :attr:`records` makes :class:`Record` objects when asked. A series with a ``tally`` (a
    :class:`repro.measure.protocol.Tally`: what one protocol needs of the records) keeps only the records
    since its last :meth:`settle`, which folds them into the tally: memory stays flat however
    many records the run has, and its :attr:`records` are only those not yet folded.
    """

    __slots__ = ("_cols", "_narrow", "facts", "gpus", "per_gpu", "summaries", "summary", "tally")

    def __init__(self, gpus: int | None, records: Iterable[Record] = (), summary: float | None = None,
                 per_gpu: bool = False, tally: RecordSink | None = None,
                 facts: dict[str, object] | None = None, summaries: dict[str, float] | None = None) -> None:
        self.gpus = gpus  # GPU count of that run if the log says it, else None
        self.summary = summary  # the figure the log itself prints as its result, if any
        # the figures of the printed summary by name (the parser's own among them where it names it)
        self.summaries: dict[str, float] = summaries if summaries is not None else {}
        self.per_gpu = per_gpu  # True when values are per GPU (PaddleClas rank-0 ips)
        self.tally = tally
        self.facts: dict[str, object] = facts if facts is not None else {}  # what the log says about this run
        self._cols: list | tuple = _NO_COLUMNS
        self._narrow = True  # the columns are arrays
        for r in records:
            self.append(r)

    def append(self, r: Record) -> None:
        self.add(r.value, r.iteration, r.epoch, r.line)

    def add(self, value: float, iteration: int | None, epoch: int | None, line: int) -> None:
        cols = self._cols
        if self._narrow:
            try:
                cols[0].append(value)
                cols[1].append(_NONE if iteration is None else iteration)
                cols[2].append(_NONE if epoch is None else epoch)
                cols[3].append(line)
                return
            except AttributeError:  # the first record
                self._cols = cols = [array("d"), array("i"), array("i"), array("i")]
                return self.add(value, iteration, epoch, line)
            except (TypeError, OverflowError):  # not a float / past int32: plain lists from now on
                n = len(cols[3])
                for col in cols:
                    del col[n:]
                self._cols = cols = [self._column(k) for k in range(4)]
                self._narrow = False
        for col, x in zip(cols, (value, iteration, epoch, line)):
            col.append(x)

    def _column(self, k: int) -> list:
        col = self._cols[k]
        if k == 0 or not self._narrow:
            return list(col)
        return [None if x == _NONE else x for x in col]

    @property
    def values(self) -> Sequence[float]:
        return self._cols[0]

    @property
    def iterations(self) -> list[int | None]:
        return self._column(1)

    @property
    def epochs(self) -> list[int | None]:
        return self._column(2)

    @property
    def lines(self) -> list[int]:
        return self._column(3)

    @property
    def records(self) -> list[Record]:
        """The records, made afresh (a copy: add records with :meth:`append`)."""
        return list(map(Record, *map(self._column, range(4))))

    def settle(self) -> None:
        """Fold the records held into the tally and let them go (a series without one keeps them)."""
        if self.tally is not None and len(self._cols[0]):
            self.tally.take(self)
            self._cols, self._narrow = _NO_COLUMNS, True

    def __len__(self) -> int:
        """Records of the run (those folded into a tally included)."""
        return len(self._cols[0]) + (self.tally.count if self.tally is not None else 0)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Series):
            return NotImplemented
        return (self.gpus, self.summary, self.summaries, self.per_gpu, self.records) == (
            other.gpus, other.summary, other.summaries, other.per_gpu, other.records)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Series(gpus={self.gpus!r}, records={list(self.records)!r}, summary={self.summary!r}, " \
               f"per_gpu={self.per_gpu!r})"


@dataclass
class ParseResult:
    parser: str
    series: list[Series]
    # what the log says about its runs, only keys actually found: with several runs, the facts every run
    # states alike (each run's own are its series' facts)
    facts: dict[str, object]
    issues: list[str]  # non-fatal problems: contradictions, truncation, damaged bytes, bad values
    lines: int  # lines read
    refused: str | None = None  # why no figure of this log can be trusted (impossible values), if so


class LogParser(abc.ABC):
    """One log format. Subclasses register themselves in :data:`repro.measure.parsers.PARSERS`."""

    name: ClassVar[str]  # set by the registry
    #: fewest usable records a figure may come from (a protocol may ask for more)
    min_records: ClassVar[int] = 1
    #: what the format's throughput counts (``repro parse`` prints it; a manifest's measure.unit says it for
    #: a target)
    unit: ClassVar[str] = "images/s"
    #: the figures of the format's printed summary a protocol may name (``summary_metric``)
    summary_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def detect(cls, head: Sequence[str]) -> bool:
        """Cheap check on the first lines: is this log in my format?"""
        return False

    @abc.abstractmethod
    def parse(self, lines: Iterable[str]) -> ParseResult:
        """Read every line; never raise on a bad line and never open files."""
