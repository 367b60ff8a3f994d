"""Verdicts: the two kinds of comparison, the statistics of repeats, and the exit codes they give.

*Re-derivation* compares a published figure with the figure its own published log gives under
the manifest's protocol: exact at the published precision, within the table's (tiny)
tolerance, or not derivable at all (see :func:`repro.verdict.reproduce._judge`).

*New run* compares your repeats with the published figure. The estimate is the manifest's
repeat aggregate (median unless it says otherwise); the interval is a 95 % Student-t
interval of the mean of the repeats; the tolerance is the target's declared run tolerance.
The published figure is ``reproduced`` when it lies within the tolerance of the estimate and
the interval is narrow enough to tell; ``slower`` / ``faster`` when it lies outside the
tolerance and outside the interval; otherwise ``inconclusive``, with how many more repeats
would make the interval as narrow as the tolerance. One repeat gives a verdict on the
figure alone, saying that no spread is known.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

REDERIVATION, NEW_RUN = "re-derivation", "new run"

# verdicts of a re-derivation, of a new run, and of either
MATCH, DEVIATES, NOT_DERIVABLE = "match", "deviates", "not derivable"
REPRODUCED, SLOWER, FASTER, INCONCLUSIVE = "reproduced", "slower", "faster", "inconclusive"
NOT_RUN = "not run"  # no log to judge: none of yours for the cell (a new run), none bundled (a re-derivation)
MEASURED = "measured"  # a target that reproduces no publication: its figure only
NOT_PUBLISHED = "not published"  # the table prints a dash where this cell would be
#: every verdict a report gives, in the words every output uses
VERDICTS = (MATCH, NOT_DERIVABLE, DEVIATES, REPRODUCED, SLOWER, FASTER, INCONCLUSIVE, NOT_RUN, NOT_PUBLISHED,
            MEASURED)

CONFIDENCE = 0.95
INTERVAL = "95% Student-t interval of the mean of the repeats"

# a new run's tolerance when its manifest declares none
DEFAULT_RUN_TOLERANCE = {
    "pct": 2.0,
    "reason": "kit default: about the run-to-run spread of DLPerf's five published repeats per cell "
              "(standard deviation 0.3-1.9 % of the mean)",
}

# exit codes of `repro report` and `repro up` (2-6 and 130 are the kit's error codes)
EXIT_OK, EXIT_DIFFERS, EXIT_UNSETTLED = 0, 7, 8


def fail_on_name(verdict: str) -> str:
    """A verdict as ``--fail-on`` names it: its words, hyphenated (``not run`` -> ``not-run``)."""
    return verdict.replace(" ", "-")


# --fail-on names -> verdicts; the first group exits EXIT_DIFFERS, the second EXIT_UNSETTLED
DIFFERS = {fail_on_name(v): v for v in (SLOWER, FASTER, DEVIATES, NOT_DERIVABLE)}
UNSETTLED = {fail_on_name(v): v for v in (INCONCLUSIVE, NOT_RUN)}
FAIL_ON = (*DIFFERS, *UNSETTLED)
EXIT_HELP = (f"Exit status: {EXIT_OK} when every cell is reproduced, re-derived (match) or only measured; "
             f"{EXIT_DIFFERS} when any cell is slower, faster, deviates or is not derivable; "
             f"{EXIT_UNSETTLED} when none of those but a cell is inconclusive or not run (no log to judge); "
             "2-6 as for every command (bad input, environment, image, run, provenance). "
             "--fail-on chooses which verdicts count (default: all of them).")


@dataclass(frozen=True)
class Estimate:
    """What a cell's repeats say: the figure, their spread, an interval (None with one repeat)."""

    value: float
    n: int
    low: float | None = None
    high: float | None = None
    stdev: float | None = None

    @property
    def spread_pct(self) -> float | None:
        return None if self.stdev is None else self.stdev / self.value * 100


def _t(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.5 + CONFIDENCE / 2, n - 1))


def estimate(value: float, repeats: Sequence[float]) -> Estimate:
    """``value`` (the repeats' aggregate) with the t interval of the repeats' mean."""
    n = len(repeats)
    if n < 2:
        return Estimate(value, n)
    mean, sd = statistics.fmean(repeats), statistics.stdev(repeats)
    half = _t(n) * sd / math.sqrt(n)
    return Estimate(value, n, mean - half, mean + half, sd)


def repeats_needed(sd: float, half_width: float, have: int, most: int = 1000) -> int | None:
    """The fewest repeats whose t interval, with this spread, is no wider than ``half_width`` each side."""
    if sd == 0:
        return have
    for n in range(max(have, 2), most + 1):
        if _t(n) * sd / math.sqrt(n) <= half_width:
            return n
    return None


def judge_new_run(est: Estimate, published: float, tolerance_pct: float) -> tuple[str, str]:
    """(verdict, reason) of a new run's estimate against the published figure."""
    delta = (est.value - published) / published * 100
    tol = tolerance_pct / 100 * published
    off = abs(est.value - published) > tol
    side = SLOWER if delta < 0 else FASTER
    where = f"{delta:+.2f}% from published, tolerance ±{tolerance_pct:g}%"
    if est.n < 2 or est.low is None or est.high is None or est.stdev is None:
        return (side if off else REPRODUCED), f"{where}; no spread known (1 repeat): run more for an interval"
    interval = f"interval {est.low:.2f} .. {est.high:.2f}"
    if off and not est.low <= published <= est.high:
        return side, f"{where}, published outside the {interval}"
    half = (est.high - est.low) / 2
    if half > tol:
        need = repeats_needed(est.stdev, tol, est.n)
        more = (f"about {need - est.n} more repeat(s) would narrow it to the tolerance" if need
                else "more repeats alone will not narrow it to the tolerance")
        return INCONCLUSIVE, f"{where}; the {interval} is wider than the tolerance: {more}"
    if not off:
        return REPRODUCED, f"{where}, {interval}"
    return INCONCLUSIVE, (f"{where}, yet published lies inside the {interval}: the repeats disagree with "
                          "their median")


def run_tolerance(declared: Mapping[str, object] | None) -> tuple[float, str]:
    """A target's new-run tolerance (percent) and its reason."""
    d = declared or DEFAULT_RUN_TOLERANCE
    return float(d["pct"]), str(d["reason"])  # type: ignore[arg-type]


def parse_fail_on(text: str | None) -> set[str]:
    """``slower,inconclusive`` -> the verdicts that make the exit status non-zero."""
    from repro.errors import UsageError

    names = FAIL_ON if text is None else [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in FAIL_ON]
    if bad:
        renamed = " (`missing` is now `not-run`)" if "missing" in bad else ""
        raise UsageError(f"--fail-on: unknown verdict {', '.join(map(repr, bad))}",
                         hint=f"use a comma-separated list of {', '.join(FAIL_ON)}{renamed}")
    table = {**DIFFERS, **UNSETTLED}
    return {table[n] for n in names}


def exit_code(verdicts: Iterable[str], fail_on: set[str] | None = None) -> int:
    """The gating exit status of a set of cell verdicts."""
    default = set(DIFFERS.values()) | set(UNSETTLED.values())
    counted = set(verdicts) & (default if fail_on is None else fail_on)
    if counted & set(DIFFERS.values()):
        return EXIT_DIFFERS
    if counted & set(UNSETTLED.values()):
        return EXIT_UNSETTLED
    return EXIT_OK


@dataclass(frozen=True)
class Check:
    """One comparison of a run's environment with what the manifest expects (``repro audit``, the report)."""

    area: str
    item: str
    status: str
    expected: str = ""
    observed: str = ""
    detail: str = ""
