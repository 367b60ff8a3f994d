"""Turn the records of one run into the figure a publisher would print.

How a publisher got from log lines to a table cell is data (:class:`Protocol`), not code: skip
the warm-up (a number of records, everything before an iteration, or both: a number of the records
from that iteration on), optionally keep a window,
aggregate (mean, median, harmonic mean, or the summary the log printed itself, by default the
one its parser reads, or another figure of the summary by name), scale per-GPU
figures to the cell's GPU count, and round the way the publisher's script did. Rounding uses
numpy's half-to-even-after-scaling rule because DLPerf's scripts call ``round`` on numpy floats;
Python's own ``round`` gives different last digits on several published numbers.

``measure`` itself needs no numpy (parsing a log should not pay for importing it): its rounding
reproduces numpy's exactly (scale by 10**n, round half to even, scale back; the tests compare
the two), and sums are ``math.fsum``'s. ``aggregate_repeats``
calls numpy as DLPerf did.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from repro.measure.model import Series

AGGREGATES = ("mean", "median", "harmonic", "summary")
SCALES = ("global", "per_gpu", "global_batch")


@dataclass(frozen=True)
class Protocol:
    skip_records: int = 0  # drop the first N records
    from_iteration: int | None = None  # or: keep records with iteration >= K
    window: int | None = None  # then keep at most this many records
    aggregate: str = "mean"  # mean | median | harmonic | summary (the log's printed summary)
    summary_metric: str | None = None  # with summary: the printed summary of this name, not the parser's
    scale: str = "global"  # global | per_gpu (x the cell's GPUs) | global_batch (steps/s x its global batch)
    round_each: int | None = None  # round each log's value to N decimals (numpy half-to-even)
    min_records: int = 1  # fewer usable records than this -> insufficient

    def __post_init__(self) -> None:
        for name in ("skip_records", "min_records"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise ValueError(f"protocol {name} must be a whole number >= 0, not {v!r}")
        if self.min_records < 1:
            raise ValueError("protocol min_records must be at least 1")
        for name in ("from_iteration", "window", "round_each"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < (1 if name == "window" else 0)):
                raise ValueError(
                    f"protocol {name} must be a whole number{' >= 1' if name == 'window' else ' >= 0'}, "
                    f"not {v!r}"
                )
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"protocol aggregate {self.aggregate!r} is not one of {', '.join(AGGREGATES)}")
        if self.scale not in SCALES:
            raise ValueError(f"protocol scale {self.scale!r} is not one of {', '.join(SCALES)}")
        if self.summary_metric is not None:
            if not isinstance(self.summary_metric, str) or not self.summary_metric:
                raise ValueError(f"protocol summary_metric must name a printed summary figure "
                                 f"(e.g. train.compute_ips), not {self.summary_metric!r}")
            if self.aggregate != "summary":
                raise ValueError(f"protocol summary_metric {self.summary_metric} needs aggregate: summary, "
                                 f"not {self.aggregate}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Protocol:
        """Field names as keys, plus ``skip: {records: N}`` or ``skip: {from_iteration: K}``."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names) - {"skip"})
        if unknown:
            raise ValueError(
                f"unknown protocol key(s) {', '.join(map(repr, unknown))}; "
                f"expected {', '.join(names + ['skip'])}"
            )
        kw = {k: v for k, v in d.items() if k != "skip"}
        if "skip" in d:
            skip = d["skip"]
            if not isinstance(skip, Mapping) or not skip or not set(skip) <= {"records", "from_iteration"}:
                raise ValueError(
                    f"protocol skip must be {{records: N}}, {{from_iteration: K}} or both (records from "
                    f"iteration K on, then the first N of those dropped), not {skip!r}"
                )
            for kind, n in skip.items():
                key = "skip_records" if kind == "records" else "from_iteration"
                if key in kw and kw[key] != n:
                    raise ValueError(f"protocol gives both skip.{kind} and {key} with different values")
                kw[key] = n
        return cls(**kw)


@dataclass(frozen=True)
class Measurement:
    gpus: int | None
    value: float | None  # None when not derivable (never a made-up number)
    records_used: int
    low: float | None  # min of the records the protocol may use (those after its skip), scaled like value
    high: float | None  # their max: a figure of the log under this protocol lies in [low, high]
    issues: list[str] = field(default_factory=list)


def measure(series: Series, protocol: Protocol, gpus: int | None = None, floor: int = 1,
            batch: int | None = None) -> Measurement:
    """Apply ``protocol`` to one run. ``gpus`` (the cell's GPU count) wins over ``series.gpus``;
    ``floor`` is the fewest records a figure of the log's format may come from (its parser's
    ``min_records``), whatever the protocol allows; ``batch`` is the cell's batch per GPU (scale
    ``global_batch``). A series read with a :class:`Tally` (see
    :func:`repro.measure.parsers.parse_file`) is measured from it, by the protocol it was read for."""
    issues: list[str] = []
    count = gpus if gpus is not None else series.gpus
    factor = _factor(protocol.scale, count, batch, issues)
    t = series.tally
    if t is None:
        t = Tally(protocol)
        t.take(series)
    elif t.serves(protocol):
        series.settle()  # records added since the last fold
    else:
        raise ValueError(f"the series was read for another protocol ({t.protocol}), not {protocol}")
    low, high = (t.low * factor, t.high * factor) if t.ranged and factor is not None else (None, None)

    if protocol.aggregate == "summary":
        raw, used = _summary(series, protocol.summary_metric, issues), 0
    else:
        used, raw = t.used, None
        if protocol.from_iteration is not None:
            if t.count and not t.numbered:
                issues.append("records carry no iteration numbers; from_iteration cannot select any")
            need = t.passed + max(protocol.min_records, 1)
        else:
            need = protocol.skip_records + max(protocol.min_records, 1)
        if used < protocol.min_records:
            issues.append(f"insufficient records: found {t.count}, need {need}")
        elif used < floor:
            issues.append(f"too few records for a figure: {used} used, "
                          f"a log of this format needs at least {floor}")
        else:
            raw = t.result(issues)
    value = None
    if raw is not None and factor is not None:
        value = raw * factor
        if protocol.round_each is not None:
            value = _round(value, protocol.round_each)
    return Measurement(count, value, used, low, high, issues)


def _factor(scale: str, count: int | None, batch: int | None, issues: list[str]) -> float | None:
    """What the aggregate of the records is multiplied by: 1, the GPU count (per-GPU records) or the
    global batch (records in steps per second); None, with the reason, where the run does not say."""
    if scale == "global":
        return 1.0
    if count is None:
        issues.append("per-GPU values need the run's GPU count; the log does not say it and none was given"
                      if scale == "per_gpu" else
                      "figures from step times need the run's GPU count; the log does not say it")
        return None
    if scale == "per_gpu":
        return float(count)
    if batch is None:
        issues.append("figures from step times need the run's batch size per GPU; the log does not say it "
                      "and none was given")
        return None
    return float(count * batch)


def _summary(series: Series, name: str | None, issues: list[str]) -> float | None:
    """The summary the log printed: the parser's own, or the one of that name."""
    raw = series.summary if name is None else series.summaries.get(name)
    if raw is None and name is None:
        issues.append("no printed summary in the log")
    elif raw is None:
        printed = f": {', '.join(series.summaries)}" if series.summaries else " none"
        issues.append(f"no printed summary {name} in the log (it prints{printed})")
    return raw


class Tally:
    """What one protocol needs of a run's records, folded as they come, so that memory stays flat
    however many records a run holds: their count and range, how many the protocol passed over
    and used, and for the aggregate the exact sum of the used values (mean) or of their
    reciprocals (harmonic) as a few floats, or the used values themselves (median: 8 bytes a
    record, twice that while the median is taken; at most ``window`` records where the protocol
    has one). Figures are those of the whole list of values: the same ``math.fsum``, the same
    median."""

    __slots__ = ("count", "high", "kept", "low", "nonpositive", "numbered", "passed", "protocol", "ranged",
                 "skipped", "sums", "used")

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self.count = 0  # records seen
        self.low = self.high = 0.0  # the range of the records after the skip (when ranged), window or not
        self.ranged = False
        self.passed = 0  # records the protocol skipped (or found before from_iteration)
        self.skipped = 0  # of those, records at or after from_iteration dropped by skip_records
        self.used = 0  # records it uses
        self.numbered = False  # whether a record carries an iteration number
        self.nonpositive = False  # whether a used value is <= 0
        self.sums: list[float] = []  # floats whose exact sum is that of the used values (or reciprocals)
        self.kept = array("d") if protocol.aggregate == "median" else None  # median: the used values

    def serves(self, p: Protocol) -> bool:
        """Whether ``p`` selects and aggregates the records as this tally's protocol does."""
        a = self.protocol
        return (a.skip_records, a.from_iteration, a.window, a.aggregate) == (
            p.skip_records, p.from_iteration, p.window, p.aggregate)

    def take(self, series: Series) -> None:
        """Fold the records ``series`` holds (those after the ones taken before)."""
        values, n = series.values, len(series.values)
        if not n:
            return
        p = self.protocol
        self.count += n
        if p.from_iteration is not None:
            k, its = p.from_iteration, series.iterations
            self.numbered = self.numbered or its.count(None) < n
            used = [v for v, it in zip(values, its) if it is not None and it >= k]
            self.passed += n - len(used)
            skip = min(len(used), p.skip_records - self.skipped)  # then the first N of those (DLPerf PyTorch)
            self.skipped += skip
            self.passed += skip
            used = used[skip:]
        else:
            skip = min(n, p.skip_records - self.passed)
            self.passed += skip
            used = values[skip:]
        if len(used):
            low, high = min(used), max(used)
            self.low, self.high = (min(low, self.low), max(high, self.high)) if self.ranged else (low, high)
            self.ranged = True
        if p.window is not None:
            used = used[: p.window - self.used]
        if not len(used):
            return
        self.used += len(used)
        self.nonpositive = self.nonpositive or min(used) <= 0
        if self.kept is not None:
            self.kept.extend(used)
        elif p.aggregate == "mean" or (p.aggregate == "harmonic" and not self.nonpositive):
            for i in range(0, len(used), _PIECE):
                piece = used[i : i + _PIECE]
                self.sums = _exact([*self.sums,
                                    *(piece if p.aggregate == "mean" else (1.0 / v for v in piece))])

    def result(self, issues: list[str]) -> float | None:
        """The aggregate of the used values (``used`` > 0)."""
        how = self.protocol.aggregate
        if how == "mean":
            return math.fsum(self.sums) / self.used
        if how == "median":
            import numpy as np  # only here: a median sorts a copy of the values, 8 bytes each

            return float(np.median(np.frombuffer(self.kept, dtype=float)))  # type: ignore[arg-type]
        if self.nonpositive:
            issues.append("harmonic mean needs positive values; a record is zero or negative")
            return None
        return self.used / math.fsum(self.sums)


_PIECE = 1 << 16  # values summed at once


def _exact(xs: list[float]) -> list[float]:
    """A few floats whose sum is exactly the sum of ``xs``: each is ``math.fsum`` (the correctly
    rounded sum) of what the ones before leave over, so ``math.fsum`` of them is ``math.fsum(xs)``."""
    out: list[float] = []
    while s := math.fsum(xs):
        out.append(s)
        if not math.isfinite(s):
            break
        xs.append(-s)
    return out


def aggregate_repeats(values: Sequence[float], how: str = "median", digits: int | None = 2) -> float:
    """Combine per-repeat figures the DLPerf way: ``round(np.median(v), 2)`` (or the mean)."""
    import numpy as np

    if len(values) == 0:
        raise ValueError("no repeat values to aggregate")
    if how not in ("median", "mean"):
        raise ValueError(f"repeat aggregate {how!r} is not one of median, mean")
    x = (np.median if how == "median" else np.mean)(np.asarray(values, dtype=float))
    return float(x) if digits is None else float(round(np.float64(x), digits))


def speedup(value: float, base: float, digits: int | None = 2) -> float:
    """``value / base``, rounded like DLPerf's ``round(median / median_1n1g, 2)``."""
    if not base:
        raise ValueError("speedup base must be non-zero")
    x = value / base
    return x if digits is None else _round(x, digits)


# ---------------------------------------------------------------------------------------------


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _round(x: float, digits: int) -> float:
    """``numpy.round(x, digits)`` for ``digits >= 0``, without importing numpy.

    numpy multiplies by ``10.0 ** digits``, rounds half to even (``rint``) and divides again;
    Python's ``round(y)`` on a float is the same half-to-even rounding of the same product.
    """
    scale = 10.0**digits
    return round(x * scale) / scale
