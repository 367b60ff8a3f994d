"""Measurement protocols, repeat aggregation and speedups: DLPerf's real logs end to end, the
published per-repeat vectors, and the protocol semantics on small hand-made series."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from parsers_helpers import DLPERF, DLPERF_LOGS, PUBLISHED, D

from repro.measure.protocol import Measurement, Protocol, aggregate_repeats, measure, speedup
from repro.measure.parsers import Record, Series, parse_file

# ---------------------------------------------------------------------------------------------
# DLPerf TF 2.x Keras: 30 real logs -> 30 per-repeat values -> 6 medians -> speedups


def _dlperf_repeats(case: str) -> list[float]:
    values = []
    for k in range(1, 6):
        result = parse_file(PUBLISHED / DLPERF_LOGS / case / f"rn50_b128_fp32_{k}.log")
        assert result.parser == "tf2-keras" and not result.issues
        (series,) = result.series
        assert [r.iteration for r in series.records] == [100, 200, 300, 400, 500, 600]
        m = measure(series, D)
        assert m.records_used == 5 and m.value is not None
        values.append(m.value)
    return values


@pytest.mark.parametrize("case,gpus,repeats,median,_speedup", DLPERF, ids=[c[0] for c in DLPERF])
def test_dlperf_per_repeat_values_and_median(
    case: str, gpus: int, repeats: list[str], median: str, _speedup: str
) -> None:
    values = _dlperf_repeats(case)
    assert sorted(values) == [float(v) for v in repeats]
    assert aggregate_repeats(values) == float(median)


def test_dlperf_speedups() -> None:
    medians = {case: aggregate_repeats(_dlperf_repeats(case)) for case, *_ in DLPERF}
    for case, _, _, median, published in DLPERF:
        assert medians[case] == float(median)
        assert speedup(medians[case], medians["1n1g"]) == float(published)
    assert speedup(medians["4n8g"], medians["1n1g"]) == 29.27


def test_dlperf_time_based_result_json_is_a_different_rule() -> None:
    """DLPerf's own result JSON holds the timestamp-based medians, not the published ones."""
    import json

    data = json.loads(
        (
            PUBLISHED / "DLPerf@e36df2e/tf2-keras/Tensorflow/resnet50v1.5/result/resnet50_result.json"
        ).read_text()
    )
    assert data["rn50"]["4n8g"]["median_speed"] == 9415.85
    assert data["rn50"]["4n8g"]["speedup"] == 29.27
    assert aggregate_repeats(_dlperf_repeats("4n8g")) == 9418.44


# ---------------------------------------------------------------------------------------------
# published per-repeat vectors (DLPerf READMEs, domain notes section 2.2): numpy rounding


@pytest.mark.parametrize(
    "values,how,expected",
    [
        # NGC PyTorch AMP bs256
        ([802.4, 803.69, 802.9, 803.66, 793.9], "median", 802.9),
        ([3137.67, 3129.63, 3144.55, 3137.44, 3119.23], "median", 3137.44),
        ([6173.05, 6135.08, 6160.56, 6154.66, 6130.69], "median", 6154.66),
        ([11991.94, 11964.81, 11896.95, 11999.35, 12046.71], "median", 11991.94),
        ([22978.13, 22053.98, 22551.16, 23049.75, 22364.13], "median", 22551.16),
        ([22978.13, 22053.98, 22551.16, 23049.75, 22364.13], "mean", 22599.43),
        # NGC TF1 FP32 bs128, six repeats: the .xx5 midpoints need numpy's rule
        ([362.05, 362.43, 362.28, 362.78, 362.45, 362.45], "median", 362.44),
        ([2737.81, 2696.33, 2718.0, 2715.18, 2725.96, 2727.71], "median", 2721.98),
        ([5097.79, 5018.54, 5063.02, 5107.27, 5125.81, 5101.06], "median", 5099.42),
        ([9403.78, 9477.39, 9574.57, 9551.9, 9631.24, 9342.6], "median", 9514.64),
        # NGC MXNet FP32 bs128, seven repeats
        ([11434.12, 11305.35, 11461.68, 11331.93, 11429.36, 11313.33, 11283.49], "median", 11331.93),
        # Paddle 1.8 FP32 bs128, six repeats
        ([354.32, 352.08, 354.71, 353.04, 352.39, 352.07], "median", 352.72),
        ([9256.12, 9353.71, 9349.71, 9359.18, 9306.93, 9346.64], "median", 9348.17),
        # OneFlow 0.1.9 FP32 bs128, seven repeats
        ([383.81, 384.86, 385.07, 384.91, 383.75, 384.85, 382.31], "median", 384.85),
        ([11651.92, 11797.74, 11613.26, 11746.48, 11749.22, 11682.19, 11711.18], "median", 11711.18),
    ],
)
def test_published_repeat_vectors(values: list[float], how: str, expected: float) -> None:
    assert aggregate_repeats(values, how) == expected


def test_numpy_rounding_differs_from_python_on_published_midpoints() -> None:
    tf1_2n8g = [5097.79, 5018.54, 5063.02, 5107.27, 5125.81, 5101.06]
    tf1_4n8g = [9403.78, 9477.39, 9574.57, 9551.9, 9631.24, 9342.6]
    assert (
        aggregate_repeats(tf1_2n8g) == 5099.42
        and round(aggregate_repeats(tf1_2n8g, digits=None), 2) == 5099.43
    )
    assert (
        aggregate_repeats(tf1_4n8g) == 9514.64
        and round(aggregate_repeats(tf1_4n8g, digits=None), 2) == 9514.65
    )
    # Paddle 1n4g: only the published result 1358.64 is known; its midpoint rounds the numpy way
    assert aggregate_repeats([1358.635]) == 1358.64 and round(1358.635, 2) == 1358.63


@pytest.mark.parametrize(
    "value,base,expected",
    [
        (9514.64, 362.44, 26.25),
        (22551.16, 802.9, 28.09),
        (11331.93, 392.24, 28.89),
        (9348.17, 352.72, 26.50),
        (11711.18, 384.85, 30.43),
        (9418.44, 321.8, 29.27),
    ],
)
def test_published_speedups(value: float, base: float, expected: float) -> None:
    assert speedup(value, base) == expected


def test_aggregate_and_speedup_errors() -> None:
    with pytest.raises(ValueError, match="no repeat values"):
        aggregate_repeats([])
    with pytest.raises(ValueError, match="median, mean"):
        aggregate_repeats([1.0], "mode")
    with pytest.raises(ValueError, match="non-zero"):
        speedup(1.0, 0.0)
    assert aggregate_repeats([1.0, 2.0], digits=None) == 1.5


def test_round_each_matches_numpy_everywhere() -> None:
    """measure() rounds without numpy; it must agree with numpy.round bit for bit, midpoints included."""
    np = pytest.importorskip("numpy")
    from repro.measure.protocol import _round

    rnd = random.Random(0)
    for _ in range(20000):
        digits = rnd.randrange(0, 5)
        x = round(rnd.uniform(0, 50000), digits + 1) + rnd.choice([0.0, 0.5, -0.5]) * 10.0**-digits
        assert _round(x, digits) == float(np.round(np.float64(x), digits)), (x, digits)
    for x in (5099.425, 9514.645, 1358.635, 0.125, 2.5, 3.5, 22599.425):
        assert _round(x, 2) == float(np.round(x, 2)) and _round(x, 0) == float(np.round(x))
    s = Series(gpus=1, records=[Record(1358.635)])
    assert measure(s, Protocol(round_each=2)).value == 1358.64


# ---------------------------------------------------------------------------------------------
# protocol semantics on small series


def _series(
    values: list[float], start: int = 1, gpus: int | None = None, summary: float | None = None
) -> Series:
    return Series(
        gpus=gpus, records=[Record(v, start + i, 0, 10 + i) for i, v in enumerate(values)], summary=summary
    )


def test_skip_window_mean_median_harmonic() -> None:
    s = _series([1.0, 100.0, 200.0, 300.0, 600.0])
    assert measure(s, Protocol(skip_records=1)).value == 300.0
    assert measure(s, Protocol(skip_records=1, window=2)).value == 150.0
    assert measure(s, Protocol(skip_records=1, aggregate="median")).value == 250.0
    assert measure(s, Protocol(skip_records=1, window=3, aggregate="harmonic")).value == pytest.approx(
        3 / (1 / 100 + 1 / 200 + 1 / 300)
    )
    m = measure(s, Protocol(skip_records=1, window=2))
    # the range a figure of this log may take under the protocol: the records after its skip, window or not
    assert (m.records_used, m.low, m.high, m.issues) == (2, 100.0, 600.0, [])


def test_the_range_is_that_of_the_records_the_protocol_may_use() -> None:
    """A warm-up record the protocol skips cannot make a published figure derivable (PaddleClas P10)."""
    s = _series([900.0, 880.0, 600.0, 590.0, 602.0])
    m = measure(s, Protocol(skip_records=2, scale="per_gpu"), gpus=8)
    assert (m.low, m.high) == (590.0 * 8, 602.0 * 8)
    m = measure(_series([1.0, 2.0, 3.0, 4.0, 5.0], start=7), Protocol(from_iteration=9))
    assert (m.low, m.high) == (3.0, 5.0)
    m = measure(_series([1.0, 2.0]), Protocol(skip_records=5))
    assert (m.value, m.low, m.high) == (None, None, None)


def test_from_iteration() -> None:
    s = _series([1.0, 2.0, 3.0, 4.0, 5.0], start=7)  # iterations 7..11
    m = measure(s, Protocol(from_iteration=9))
    assert (m.value, m.records_used) == (4.0, 3)
    assert measure(s, Protocol(from_iteration=9, window=2)).value == 3.5


def test_per_gpu_scale_uses_the_cell_then_the_series_gpu_count() -> None:
    s = _series([10.0, 20.0, 30.0], gpus=8)
    assert measure(s, Protocol(scale="per_gpu")).value == 160.0
    m = measure(s, Protocol(scale="per_gpu"), gpus=32)
    assert (m.value, m.gpus, m.low, m.high) == (640.0, 32, 320.0, 960.0)
    m = measure(_series([10.0]), Protocol(scale="per_gpu"))
    assert m.value is None and m.low is None and "GPU count" in m.issues[0]


def test_summary() -> None:
    assert (
        measure(_series([1.0], summary=12671.899230200308), Protocol(aggregate="summary")).value
        == 12671.899230200308
    )
    m = measure(_series([1.0, 2.0]), Protocol(aggregate="summary"))
    assert m == Measurement(None, None, 0, 1.0, 2.0, ["no printed summary in the log"])
    m = measure(
        _series([5.0], gpus=4, summary=2.0), Protocol(aggregate="summary", scale="per_gpu", round_each=0)
    )
    assert (m.value, m.low, m.high) == (8.0, 20.0, 20.0)


def test_a_named_summary_is_the_figure_the_log_printed_under_that_name() -> None:
    s = Series(gpus=1, summary=794.40, summaries={"train.total_ips": 794.40, "train.compute_ips": 797.38})
    named = Protocol(aggregate="summary", summary_metric="train.compute_ips")
    assert measure(s, named).value == 797.38
    assert measure(s, Protocol(aggregate="summary", summary_metric="train.total_ips")).value == 794.40
    assert measure(s, Protocol(aggregate="summary")).value == 794.40  # the parser's own summary
    m = measure(Series(gpus=1, summary=794.40, summaries={"train.total_ips": 794.40}), named)
    assert m == Measurement(1, None, 0, None, None,
                            ["no printed summary train.compute_ips in the log (it prints: train.total_ips)"])
    m = measure(_series([1.0, 2.0]), named)
    assert m.value is None and m.issues == ["no printed summary train.compute_ips in the log (it prints none)"]


def test_insufficient_records() -> None:
    m = measure(_series([1.0] * 6), Protocol(skip_records=10))
    assert m.value is None and m.issues == ["insufficient records: found 6, need 11"]
    m = measure(_series([1.0] * 12), Protocol(skip_records=10, min_records=5))
    assert m.issues == ["insufficient records: found 12, need 15"]
    m = measure(_series([1.0] * 30, start=1), Protocol(from_iteration=25, window=100, min_records=100))
    assert m.issues == ["insufficient records: found 30, need 124"]
    m = measure(_series([]), Protocol())
    assert m == Measurement(None, None, 0, None, None, ["insufficient records: found 0, need 1"])
    assert measure(_series([1.0] * 11), Protocol(skip_records=10)).value == 1.0


def test_records_without_iterations_cannot_use_from_iteration() -> None:
    s = Series(gpus=1, records=[Record(1.0), Record(2.0)])
    m = measure(s, Protocol(from_iteration=1))
    assert m.value is None
    assert m.issues == [
        "records carry no iteration numbers; from_iteration cannot select any",
        "insufficient records: found 2, need 3",
    ]


def test_harmonic_mean_needs_positive_values() -> None:
    m = measure(_series([1.0, 0.0]), Protocol(aggregate="harmonic"))
    assert m.value is None and "positive" in m.issues[0]


# ---------------------------------------------------------------------------------------------
# Protocol.from_dict


def test_from_dict_field_names_and_skip_forms() -> None:
    assert Protocol.from_dict({}) == Protocol()
    assert Protocol.from_dict({"skip": {"records": 10}, "scale": "per_gpu"}) == Protocol(
        skip_records=10, scale="per_gpu"
    )
    assert Protocol.from_dict(
        {
            "skip": {"from_iteration": 25},
            "window": 100,
            "aggregate": "mean",
            "round_each": 2,
            "min_records": 100,
        }
    ) == Protocol(from_iteration=25, window=100, round_each=2, min_records=100)
    assert Protocol.from_dict({"skip_records": 5}) == Protocol(skip_records=5)
    assert Protocol.from_dict({"skip": {"records": 5}, "skip_records": 5}) == Protocol(skip_records=5)
    # a manifest override on top of a default: the skip stays, the summary is used
    assert Protocol.from_dict({"skip": {"from_iteration": 10}, "aggregate": "summary"}).aggregate == "summary"


@pytest.mark.parametrize(
    "d,message",
    [
        ({"skp": {"records": 1}}, "unknown protocol key"),
        ({"skip": {"steps": 1}}, "skip must be"),
        ({"skip": {}}, "skip must be"),
        ({"skip": 3}, "skip must be"),
        ({"skip": {"records": 5}, "skip_records": 6}, "different values"),
        ({"aggregate": "max"}, "aggregate"),
        ({"scale": "node"}, "scale"),
        ({"window": 0}, "window"),
        ({"min_records": 0}, "min_records"),
        ({"skip_records": -1}, "skip_records"),
        ({"round_each": 1.5}, "round_each"),
        ({"skip_records": True}, "skip_records"),
        ({"summary_metric": "train.compute_ips"}, "summary_metric train.compute_ips needs aggregate: summary"),
        ({"aggregate": "summary", "summary_metric": ""}, "summary_metric must name"),
        ({"aggregate": "summary", "summary_metric": 3}, "summary_metric must name"),
    ],
)
def test_from_dict_rejects(d: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Protocol.from_dict(d)


def test_dlperf_ngc_pytorch_harmonic_mean_is_the_reports_timestamp_rule(tmp_path) -> None:
    """DLPerf's extract_pytorch_logs_time.py: global batch x 100 / (time of iteration 125 - time of iteration 25).
    DLE logs total_ips = global batch / it_time with it_times that tile the time line, so the manifest's harmonic
    mean over iterations 26-125 is that figure, up to the 2-dp printing of total_ips."""
    import datetime

    from repro.spec.manifest import find_target

    m = find_target("dlperf-ngc-pytorch-rn50-v100")
    batch, t = 128 * 8, datetime.datetime(2020, 9, 15, 14, 29, 13)
    rng = random.Random(7)
    lines, stamps = [], {}
    for it in range(1, 151):
        it_time = 0.33 + rng.random() * 0.08 + (2.0 if it < 3 else 0.0)
        t += datetime.timedelta(seconds=it_time)
        stamps[it] = t
        lines.append(f"DLL {t:%Y-%m-%d %H:%M:%S.%f} - Epoch: 0 Iteration: {it}  train.loss : 6.9  "
                     f"train.total_ips : {batch / it_time:.2f} img/s")
    log = tmp_path / "r50_b128_fp32_1.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = round(batch * 100 / (stamps[125] - stamps[25]).total_seconds(), 2)
    (series,) = parse_file(log, "ngc-pytorch").series
    got = measure(series, Protocol.from_dict(m.measure.protocol), gpus=8)
    assert got.records_used == 100
    assert abs(got.value - report) <= 0.01, (got.value, report)
    mean = measure(series, Protocol.from_dict({**m.measure.protocol, "aggregate": "mean"}), gpus=8)
    assert abs(mean.value - report) > 1, "the arithmetic mean of the same records is not the report's figure"


# ---------------------------------------------------------------------------------------------
# a log read for a protocol folds its records as they come: the same figures as the whole list


def _after_skip(values: list[float], iterations: list[int | None], p: Protocol) -> list[float]:
    """The records the protocol may use: those after its skip (or from its iteration)."""
    if p.from_iteration is not None:
        return [v for v, it in zip(values, iterations) if it is not None and it >= p.from_iteration]
    return values[p.skip_records :]


def _old_rule(values: list[float], iterations: list[int | None], p: Protocol) -> float:
    """The protocol applied to the whole list of values, as plainly as it reads."""
    import statistics

    kept = _after_skip(values, iterations, p)
    kept = kept[: p.window] if p.window else kept
    if p.aggregate == "median":
        return statistics.median(kept)
    if p.aggregate == "harmonic":
        return len(kept) / math.fsum(1.0 / v for v in kept)
    return math.fsum(kept) / len(kept)


FOLDED = [
    Protocol(),
    Protocol(skip_records=7),
    Protocol(skip_records=3, window=25000),
    Protocol(from_iteration=26, window=100, aggregate="harmonic", min_records=100),
    Protocol(from_iteration=10, aggregate="harmonic"),
    Protocol(skip_records=1, aggregate="median"),
    Protocol(from_iteration=500, window=30001, aggregate="median"),
]


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """Two runs of 3 MiB each (several 1 MiB blocks each), values of wide range and many digits, and the
    whole list of its records, read once for every protocol below."""
    rnd = random.Random(7)
    lines = []
    for _ in range(2):
        lines.append("DLL 2023-01-01 00:00:00.0 - PARAMETER data : /d  data_backend : dali  batch_size : 256  "
                     "world_size : 1  amp : False\n")
        for k in range(40000):
            value = rnd.choice([rnd.uniform(1, 1e5), rnd.uniform(1e-3, 1), 1e9 * rnd.random()])
            lines.append(f"DLL 2023-01-01 00:00:00.0 - Epoch: {k // 1000} Iteration: {k % 1000}  "
                         f"train.loss : 6.9  train.total_ips : {value!r} images/s\n")
    log = tmp_path_factory.mktemp("folded") / "big.log"
    log.write_text("".join(lines))
    return log, parse_file(log, "ngc-pytorch")


@pytest.mark.parametrize("p", FOLDED, ids=map(repr, range(len(FOLDED))))
def test_folded_records_give_the_figures_of_the_whole_list(big_log: tuple[Path, Any], monkeypatch: Any,
                                                          p: Protocol) -> None:
    log, whole = big_log
    folded = parse_file(log, "ngc-pytorch", p)
    assert len(folded.series) == len(whole.series) == 2
    for a, b in zip(whole.series, folded.series):
        values, iterations = list(a.values), a.iterations
        want = _old_rule(values, iterations, p)
        assert len(b) == len(a) == 40000 and not b.records  # folded: no record is kept
        got = measure(b, p)
        after = _after_skip(values, iterations, p)
        assert (got.value, got.low, got.high, got.issues) == (want, min(after), max(after), [])
        monkeypatch.setattr("repro.measure.protocol._PIECE", 999)  # the whole list summed in pieces
        assert measure(a, p) == got
    with pytest.raises(ValueError, match="another protocol"):
        measure(folded.series[0], Protocol(skip_records=p.skip_records + 1))
