"""Turn the records of one run into the figure a publisher would print.

How a publisher got from log lines to a table cell is data (:class:`Protocol`), not code: skip
the warm-up (a number of records, or everything before an iteration), optionally keep a window,
aggregate (mean, median, harmonic mean, or the summary the log printed itself), scale per-GPU
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
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from repro.parsers.model import Series

AGGREGATES = ("mean", "median", "harmonic", "summary")
SCALES = ("global", "per_gpu")


@dataclass(frozen=True)
class Protocol:
    skip_records: int = 0  # drop the first N records
    from_iteration: int | None = None  # or: keep records with iteration >= K
    window: int | None = None  # then keep at most this many records
    aggregate: str = "mean"  # mean | median | harmonic | summary (the log's printed summary)
    scale: str = "global"  # global | per_gpu (multiply by the cell's GPU count)
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
        if self.skip_records and self.from_iteration is not None:
            raise ValueError("protocol: skip_records and from_iteration exclude each other; use one")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"protocol aggregate {self.aggregate!r} is not one of {', '.join(AGGREGATES)}")
        if self.scale not in SCALES:
            raise ValueError(f"protocol scale {self.scale!r} is not one of {', '.join(SCALES)}")

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
            if (
                not isinstance(skip, Mapping)
                or len(skip) != 1
                or not set(skip) <= {"records", "from_iteration"}
            ):
                raise ValueError(
                    f"protocol skip must be {{records: N}} or {{from_iteration: K}}, not {skip!r}"
                )
            ((kind, n),) = skip.items()
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
    low: float | None  # min of ALL records of the series, scaled like value
    high: float | None  # max of ALL records of the series, scaled like value
    issues: list[str] = field(default_factory=list)


def measure(series: Series, protocol: Protocol, gpus: int | None = None, floor: int = 1) -> Measurement:
    """Apply ``protocol`` to one run. ``gpus`` (the cell's GPU count) wins over ``series.gpus``;
    ``floor`` is the fewest records a figure of the log's format may come from (its parser's
    ``min_records``), whatever the protocol allows."""
    issues: list[str] = []
    count = gpus if gpus is not None else series.gpus
    factor: float | None = 1.0
    if protocol.scale == "per_gpu":
        if count is None:
            factor = None
            issues.append(
                "per-GPU values need the run's GPU count; the log does not say it and none was given"
            )
        else:
            factor = float(count)
    values = series.values  # the value column: no Record objects are made here
    span = series.value_range() if factor is not None else None
    low, high = (span[0] * factor, span[1] * factor) if span is not None else (None, None)  # type: ignore[operator]

    if protocol.aggregate == "summary":
        raw, used = series.summary, 0
        if raw is None:
            issues.append("no printed summary in the log")
    else:
        chosen, need = _select(series, protocol, issues)
        used = len(chosen)
        raw = None
        if used < protocol.min_records:
            issues.append(f"insufficient records: found {len(values)}, need {need}")
        elif used < floor:
            issues.append(f"too few records for a figure: {used} used, a log of this format needs at least {floor}")
        else:
            raw = _aggregate(chosen, protocol.aggregate, issues)
    value = None
    if raw is not None and factor is not None:
        value = raw * factor
        if protocol.round_each is not None:
            value = _round(value, protocol.round_each)
    return Measurement(count, value, used, low, high, issues)


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


def _select(series: Series, p: Protocol, issues: list[str]) -> tuple[Sequence[float], int]:
    """Values of the records the protocol uses, and how many records the series needs for that."""
    values = series.values
    if p.from_iteration is not None:
        iterations = series.iterations
        if values and iterations.count(None) == len(iterations):
            issues.append("records carry no iteration numbers; from_iteration cannot select any")
        k = p.from_iteration
        kept = [v for v, it in zip(values, iterations) if it is not None and it >= k]
        before = len(values) - len(kept)
        need = before + max(p.min_records, 1)
    else:
        kept = values[p.skip_records :] if p.skip_records else values  # read only: no copy needed
        need = p.skip_records + max(p.min_records, 1)
    if p.window is not None:
        kept = kept[: p.window]
    return kept, need


def _aggregate(values: Sequence[float], how: str, issues: list[str]) -> float | None:
    if how == "mean":
        return math.fsum(values) / len(values)
    if how == "median":
        return float(statistics.median(values))
    if any(v <= 0 for v in values):
        issues.append("harmonic mean needs positive values; a record is zero or negative")
        return None
    return len(values) / math.fsum(1.0 / v for v in values)


def _round(x: float, digits: int) -> float:
    """``numpy.round(x, digits)`` for ``digits >= 0``, without importing numpy.

    numpy multiplies by ``10.0 ** digits``, rounds half to even (``rint``) and divides again;
    Python's ``round(y)`` on a float is the same half-to-even rounding of the same product.
    """
    scale = 10.0**digits
    return round(x * scale) / scale
