"""Parsers against the real publisher logs in logs/published, damaged copies of them, and bad input.

Every bundled log is parsed with format detection, its publisher's rule is applied as a
Protocol, and the result must print as the published figure (or, for the four Paddle 2.5 cells
that no rule reproduces, as the documented re-derived value).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from parsers_helpers import (
    ALL_CASES,
    CASES,
    P_9881,
    P_C1AD,
    PERFREPORT,
    PUBLISHED,
    Case,
    crlf,
    cut_inside_line,
    full,
    mpi_tagged,
    parameter_lines,
    reference_logs,
    representative_logs,
    spliced_tags,
    with_junk,
)

from repro.errors import ParseError, UnknownPlugin
from repro.measure.protocol import Protocol, measure
from repro.measure.parsers import PARSERS, ParseResult, Record, Series, detect, parse_file
from repro.measure.parsers.base import params_of


def series_of(result: ParseResult, gpus: int) -> Series:
    """The run for this GPU count (multi-run logs), else the only run."""
    hits = [s for s in result.series if s.gpus == gpus]
    if len(hits) == 1:
        return hits[0]
    assert len(result.series) == 1, [s.gpus for s in result.series]
    return result.series[0]


def figure(result: ParseResult, case: Case) -> float | None:
    return measure(series_of(result, case.gpus), case.rule, gpus=case.gpus).value


# ---------------------------------------------------------------------------------------------
# the published figures


PERFREPORT_MX = "wanghuancoder-PerformanceReport@d53a112/ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs"


def test_registered_parser_names() -> None:
    assert PARSERS.names() == sorted(
        ["paddleclas", "ngc-pytorch", "ngc-tf1", "ngc-mxnet", "tf2-keras", "tf-cnn-benchmarks", "pytorch-examples",
         "paddlecv-18", "oneflow-bert", "ngc-pytorch-bert", "oneflow-cnns", "ngc-mxnet-ranks",
         "gluoncv-imagenet", "tf2-bert", "paddle-bert"]
    )


def test_every_bundled_log_has_a_published_figure_case() -> None:
    covered = {PUBLISHED / c.path for c in ALL_CASES}
    assert set(reference_logs()) == covered
    assert len(covered) == 92


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_published_figure(case: Case) -> None:
    result = parse_file(PUBLISHED / case.path)
    assert result.parser == case.parser
    assert not result.issues
    value = figure(result, case)
    assert value is not None
    expected = float(case.rederived or case.published)
    assert round(value, case.digits) == expected or case.via_3_decimals or case.truncated
    assert case.printed(value) == (case.rederived or case.published)


def test_paddle_2_5_fp16_1gpu_published_figure_is_not_derivable() -> None:
    """1438.518 lies above every ips in the log, so no averaging rule can produce it."""
    path = (
        PUBLISHED
        / P_C1AD
        / "paddle/ResNet50V1.5/logs/V100-LOG/PaddleClas_ResNet50_bs256_pure_fp16_DP_N1C1_log"
    )
    m = measure(parse_file(path).series[0], Protocol(skip_records=10, scale="per_gpu"), gpus=1)
    assert m.high is not None and 1438.518 > m.high
    assert round(m.high, 5) == 1434.84254
    assert m.low is not None and m.low <= m.value <= m.high


@pytest.mark.parametrize("case", [c for c in CASES if not c.exact], ids=lambda c: c.id)
def test_paddle_2_5_published_figures_differ_from_rule(case: Case) -> None:
    value = figure(parse_file(PUBLISHED / case.path), case)
    assert value is not None
    assert round(value, 3) != float(case.published)
    assert abs(value - float(case.published)) / float(case.published) < 0.005


def test_log_with_two_runs_gives_one_series_per_gpu_count() -> None:
    path = PUBLISHED / P_9881 / "ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs/mxnet_gpu1_gpu8_amp_bs256.txt"
    result = parse_file(path)
    assert [s.gpus for s in result.series] == [1, 8]
    assert [[r.epoch for r in s.records] for s in result.series] == [[0, 1, 2], [0, 1, 2]]
    assert [s.summary for s in result.series] == [1359.4, 10494.0]
    # only per-epoch lines are records, never the per-iteration progress lines
    assert result.series[1].records[0].value == pytest.approx(10504.639056766617)
    assert "gpus" not in result.facts


def test_summaries_and_record_units() -> None:
    old = PUBLISHED / P_9881 / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs"
    r2022 = parse_file(old / "pytorch_gpu1_fp32_bs256.txt")  # "img/s"
    r2023 = parse_file(
        PUBLISHED
        / P_C1AD
        / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs/V100-LOG"
        / "pytorch_gpu1_fp32_bs256.txt"
    )  # "images/s"
    for r, summary in ((r2022, 360.59), (r2023, 366.74)):
        s = r.series[0]
        assert [x.iteration for x in s.records] == list(range(1, 100))
        assert s.summary == summary
    assert r2022.series[0].records[1] == Record(364.43, 2, 0, r2022.series[0].records[1].line)
    tf = parse_file(
        PUBLISHED / P_9881 / "ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs/tf_gpu32_fp32_bs256.txt"
    )
    assert [r.iteration for r in tf.series[0].records] == list(range(200, 500))
    assert tf.series[0].summary == 12671.899230200308


def test_dllogger_summaries_keep_each_printed_figure_by_name() -> None:
    """The DLLogger Summary prints train.total_ips and train.compute_ips (2020-2022: on two lines; 2023: on
    one); the parser's summary is total_ips, and each is kept under its name for a protocol that names it."""
    e15 = PUBLISHED / f"{PERFREPORT}@e15dece/ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs"
    c1a = PUBLISHED / P_C1AD / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs/V100-LOG"
    for path, total, compute in ((e15 / "pytorch_gpu1_amp_bs256.txt", 794.40, 797.38),
                                 (c1a / "pytorch_gpu1_amp_bs256.txt", 782.08, 785.06)):
        (s,) = parse_file(path).series
        assert s.summary == total
        assert s.summaries == {"train.total_ips": total, "train.compute_ips": compute}


def test_record_line_numbers_point_at_the_line() -> None:
    path = PUBLISHED / P_9881 / "paddle/ResNet50V1.5/logs/paddle_gpu1_fp32_bs256.txt"
    lines = path.read_text().splitlines()
    for rec in parse_file(path).series[0].records:
        assert f"train step:{rec.iteration}" in lines[rec.line - 1]
        assert f"ips: {rec.value:.5f}" in lines[rec.line - 1]


# ---------------------------------------------------------------------------------------------
# facts


def test_facts_mxnet_amp_logs_are_pure_fp16() -> None:
    for path in (PUBLISHED / P_9881).glob("ngc-mxnet/**/*amp*.txt"):
        facts = parse_file(path).facts
        assert facts["dtype"] == "float16" and facts["amp"] is False and facts["precision"] == "fp16"
        assert facts["batch_size"] == 256 and facts["dali"] is True
    for path in (PUBLISHED / P_C1AD).glob("ngc-mxnet/**/*amp*.txt"):
        assert parse_file(path).facts["dtype"] == "float16"
        assert parse_file(path).facts["amp"] is False
    fp32 = parse_file(
        PUBLISHED
        / P_C1AD
        / "ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs/V100_LOG/mxnet_gpu8_fp32_bs128.txt"
    )
    assert fp32.facts["batch_size"] == 128 and fp32.facts["gpus"] == 8 and fp32.facts["precision"] == "fp32"


def test_facts_mxnet_19_07_logs_have_no_dllogger_lines() -> None:
    """DLE 99b1c89 (NGC 19.07): a Namespace line, Speedometer records, a train.total_ips table."""
    path = PUBLISHED / PERFREPORT_MX / "mxnet_gpu1_gpu8_fp32_bs128.txt"
    result = parse_file(path)
    assert result.parser == "ngc-mxnet" and not result.issues
    assert {k: result.facts[k] for k in ("batch_size", "dtype", "precision", "amp", "gpus")} == {
        "batch_size": 128, "dtype": "float32", "precision": "fp32", "amp": False, "gpus": 1}
    (s,) = result.series
    assert (s.gpus, s.summary, len(s)) == (1, 376.18, 75)  # 25 Speedometer lines in each of 3 epochs
    assert s.records[0].value == 153.37767480559918 and s.records[0].epoch == 0 and s.records[0].iteration == 19
    amp = parse_file(PUBLISHED / PERFREPORT_MX / "mxnet_gpu1_gpu8_amp_bs256.txt")
    assert amp.facts["precision"] == "fp16" and amp.series[0].summary == 1398.8  # the latency tables are not it


def test_facts_tf1_runs_had_dali_off_and_xla_on() -> None:
    paths = [p for p in PUBLISHED.glob("*/ngc-tf1/**/*.txt") if "gpu32" not in p.name and "A100" not in str(p)
             and "PerformanceReport" not in str(p)]
    assert len(paths) == 8
    for path in paths:
        facts = parse_file(path).facts
        assert facts["dali"] is False and facts["xla"] is True and facts["batch_size"] == 256
        assert facts["amp"] is ("amp" in path.name)
        assert facts["precision"] == ("amp" if "amp" in path.name else "fp32")
        assert facts["gpus"] == (8 if "gpu8" in path.name else 1)


def test_facts_pytorch_and_paddle() -> None:
    pt = parse_file(
        PUBLISHED / P_9881 / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs/pytorch_gpu32_amp_bs256.txt"
    )
    assert {k: pt.facts[k] for k in ("batch_size", "gpus", "amp", "precision", "data_backend", "dali")} == {
        "batch_size": 256,
        "gpus": 32,
        "amp": True,
        "precision": "amp",
        "data_backend": "dali-cpu",
        "dali": True,
    }
    fp16 = parse_file(PUBLISHED / P_9881 / "paddle/ResNet50V1.5/logs/paddle_gpu32_pure_fp16_bs256.txt")
    assert {k: fp16.facts[k] for k in ("batch_size", "gpus", "nodes", "amp_level", "precision", "dali")} == {
        "batch_size": 256,
        "gpus": 32,
        "nodes": 4,
        "amp_level": "O2",
        "precision": "fp16",
        "dali": True,
    }
    fp32 = parse_file(
        PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/V100-LOG/PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log"
    )
    assert fp32.facts["precision"] == "fp32" and fp32.facts["amp"] is False and fp32.facts["gpus"] == 8
    assert fp32.series[0].per_gpu is True and fp32.series[0].gpus == 8
    one = parse_file(PUBLISHED / P_9881 / "paddle/ResNet50V1.5/logs/paddle_gpu1_fp32_bs256.txt")
    assert "gpus" not in one.facts and one.series[0].gpus is None  # a single-process run says nothing


def test_facts_tf2_keras_multi_node() -> None:
    from parsers_helpers import DLPERF_LOGS

    facts = parse_file(PUBLISHED / DLPERF_LOGS / "4n8g/rn50_b128_fp32_3.log").facts
    assert {k: facts[k] for k in ("gpus", "nodes", "batch_size", "precision", "xla", "dtype")} == {
        "gpus": 32,
        "nodes": 4,
        "batch_size": 128,
        "precision": "fp32",
        "xla": False,
        "dtype": "float32",
    }


# ---------------------------------------------------------------------------------------------
# damaged copies of the real logs: same figures


def _baseline(path: Path) -> ParseResult:
    return parse_file(path)


def _shape(result: ParseResult) -> list[tuple]:
    return [
        (s.gpus, s.summary, s.per_gpu, [(r.value, r.iteration, r.epoch) for r in s.records])
        for s in result.series
    ]


VARIANTS = {
    "crlf": crlf,
    "mpi-tags": mpi_tagged,
    "mpi-timestamped-tags": lambda d: mpi_tagged(d, timestamp=True),
    "junk": lambda d: with_junk(d, seed=len(d)),
    "crlf+tags+junk": lambda d: crlf(mpi_tagged(with_junk(d, seed=7))),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("path", representative_logs(), ids=lambda p: str(p.relative_to(PUBLISHED)))
def test_variant_parses_to_the_same_runs(path: Path, variant: str, tmp_path: Path) -> None:
    base = _baseline(path)
    damaged = tmp_path / path.name
    damaged.write_bytes(VARIANTS[variant](path.read_bytes()))
    got = parse_file(damaged)
    assert got.parser == base.parser
    assert _shape(got) == _shape(base)
    assert got.facts == base.facts
    assert got.issues == base.issues  # junk lines are not issues


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ALL_CASES[::3], ids=lambda c: c.id)
def test_variant_gives_the_same_figure(case: Case, variant: str, tmp_path: Path) -> None:
    path = PUBLISHED / case.path
    damaged = tmp_path / path.name
    damaged.write_bytes(VARIANTS[variant](path.read_bytes()))
    assert figure(parse_file(damaged), case) == figure(parse_file(path), case)


@pytest.mark.parametrize("path", representative_logs(), ids=lambda p: str(p.relative_to(PUBLISHED)))
def test_cut_inside_the_last_record_line_never_yields_a_wrong_record(path: Path, tmp_path: Path) -> None:
    base = _baseline(path)
    records = [r for s in base.series for r in s.records]
    last = max(records, key=lambda r: r.line)
    before = [r for r in records if r.line < last.line]
    data = path.read_bytes()
    for keep in (0.3, 0.6, 0.9, 0.97):
        cut = tmp_path / f"{keep}-{path.name}"
        cut.write_bytes(cut_inside_line(data, last.line, keep))
        got = parse_file(cut)
        got_records = [r for s in got.series for r in s.records]
        # the cut line is either ignored or, when the cut falls after the complete figure and
        # its unit, read as exactly the original record
        assert got_records in (before, before + [last])
        kept = cut.read_bytes().rsplit(b"\n", 1)[-1].decode()
        hints = PARSERS.get(base.parser).record_hints  # type: ignore[attr-defined]
        if got_records == before and any(h in kept for h in hints):  # it looked like a record: say so
            assert any(f"line {last.line} is cut off" in i for i in got.issues), got.issues


@pytest.mark.parametrize("path", reference_logs(), ids=lambda p: str(p.relative_to(PUBLISHED)))
def test_cut_last_line_is_as_if_the_line_were_missing(path: Path, tmp_path: Path) -> None:
    data = path.read_bytes().rstrip(b"\n")
    head, _, last = data.rpartition(b"\n")
    cut, without = tmp_path / "cut.log", tmp_path / "without.log"
    cut.write_bytes(data[: len(data) - max(1, len(last) // 2)])
    without.write_bytes(head + b"\n")
    assert _shape(parse_file(cut)) == _shape(parse_file(without))


def test_cut_last_line_gives_the_figure_of_the_log_without_it(tmp_path: Path) -> None:
    """Cutting the file's last line mid-way never invents a number: each figure is the one the log
    gives without that line, which for most logs is the published one (the exceptions end on a
    record line or on the printed summary itself)."""
    changed = []
    for case in CASES:
        path = PUBLISHED / case.path
        data = path.read_bytes().rstrip(b"\n")
        head, _, last = data.rpartition(b"\n")
        cut, without = tmp_path / "cut.log", tmp_path / "without.log"
        cut.write_bytes(data[: len(data) - max(1, len(last) // 2)])
        without.write_bytes(head + b"\n")
        after = figure(parse_file(cut), case)
        assert after == figure(parse_file(without), case), case.id
        if after != figure(parse_file(path), case):
            changed.append(Path(case.path).name)
    # logs whose last line is a record (the four Paddle 2.5 logs and one 32-GPU Paddle log) or
    # the printed train_throughput (both TF1 32-GPU logs, the six 20.06 TF1 logs and the two of e15decee)
    tf_20_06 = [f"tf_gpu{g}_{p}.txt" for g in (1, 8) for p in ("fp32_bs128", "amp_bs128", "amp_bs256")]
    assert sorted(changed) == sorted(
        [
            *tf_20_06,
            "tf_gpu1_fp32_bs128.txt",
            "tf_gpu1_amp_bs256.txt",
            "PaddleClas_ResNet50_bs256_fp32_DP_N1C1_log",
            "PaddleClas_ResNet50_bs256_pure_fp16_DP_N1C1_log",
            "PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log",
            "PaddleClas_ResNet50_bs256_pure_fp16_DP_N1C8_log",
            "paddle_gpu32_pure_fp16_bs256.txt",
            "tf_gpu32_fp32_bs256.txt",
            "tf_gpu32_amp_bs256.txt",
        ]
    )


def test_generated_variants_keep_line_numbers(tmp_path: Path) -> None:
    path = PUBLISHED / P_9881 / "ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs/tf_gpu8_amp_bs256.txt"
    base = _baseline(path)
    p = tmp_path / "x.txt"
    p.write_bytes(crlf(mpi_tagged(path.read_bytes())))
    got = parse_file(p)
    assert [r.line for r in got.series[0].records] == [r.line for r in base.series[0].records]
    assert got.lines == base.lines


# ---------------------------------------------------------------------------------------------
# too few records, bad files


def test_fewer_records_than_the_rule_skips(tmp_path: Path) -> None:
    path = PUBLISHED / P_9881 / "paddle/ResNet50V1.5/logs/paddle_gpu1_fp32_bs256.txt"
    lines = path.read_text().splitlines(keepends=True)
    first_records = [i for i, line in enumerate(lines) if "train step:" in line][:6]
    short = tmp_path / "short.txt"
    short.write_text("".join(lines[: first_records[-1] + 1]))
    m = measure(parse_file(short).series[0], Protocol(skip_records=10, scale="per_gpu"), gpus=1)
    assert m.value is None
    assert m.issues == ["insufficient records: found 6, need 11"]
    assert m.records_used == 0


def test_too_few_iterations_for_the_window(tmp_path: Path) -> None:
    """Like NVIDIA DLE issue 834 (--prof 121 with a 25..125 window gave 0 img/s): no number at all."""
    path = (
        PUBLISHED / P_9881 / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs/pytorch_gpu1_fp32_bs256.txt"
    )
    proto = Protocol.from_dict(
        {"skip": {"from_iteration": 25}, "window": 100, "round_each": 2, "min_records": 100}
    )
    m = measure(parse_file(path).series[0], proto, gpus=1)
    assert m.value is None
    assert m.issues == ["insufficient records: found 99, need 124"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="no such file"):
        parse_file(tmp_path / "nope.log")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="is a directory"):
        parse_file(tmp_path)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_empty_file(content: bytes, tmp_path: Path) -> None:
    p = tmp_path / "empty.log"
    p.write_bytes(content)
    with pytest.raises(ParseError, match="empty"):
        parse_file(p)


def test_binary_file(tmp_path: Path) -> None:
    p = tmp_path / "model.ckpt"
    p.write_bytes(b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00" + bytes(range(256)) * 40)
    with pytest.raises(ParseError, match="binary"):
        parse_file(p)


def test_text_that_is_no_training_log(tmp_path: Path) -> None:
    p = tmp_path / "README.md"
    p.write_text("# notes\n\nThroughput was good (about 400 ips) on Monday.\n" * 50)
    with pytest.raises(ParseError) as e:
        parse_file(p)
    assert "not a log format the kit knows" in str(e.value)
    for name in PARSERS.names():
        assert name in str(e.value)


def test_errors_are_clear_without_traceback_text(tmp_path: Path) -> None:
    with pytest.raises(ParseError) as e:
        parse_file(tmp_path / "missing.log")
    assert "Traceback" not in str(e.value) and str(tmp_path / "missing.log") in str(e.value)


def test_unknown_parser_name() -> None:
    with pytest.raises(UnknownPlugin, match="paddleclas"):
        parse_file(
            PUBLISHED / P_9881 / "paddle/ResNet50V1.5/logs/paddle_gpu1_fp32_bs256.txt", parser="paddle"
        )


def test_explicit_parser_skips_detection(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_text("hello\n(0, 10) total_ips : 100.5 \n(0, 20) total_ips : 101.5 \n")
    assert [r.value for r in parse_file(p, parser="ngc-tf1").series[0].records] == [100.5, 101.5]


def test_non_utf8_bytes_are_replaced_not_fatal(tmp_path: Path) -> None:
    src = PUBLISHED / P_9881 / "ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs/tf_gpu1_fp32_bs256.txt"
    p = tmp_path / "latin1.txt"
    p.write_bytes(b"caf\xe9 \xff\xfe warm-up\n" + src.read_bytes())
    assert _shape(parse_file(p)) == _shape(parse_file(src))


# ---------------------------------------------------------------------------------------------
# detection and the line-level interface


def test_detect_picks_the_first_matching_parser_and_lists_known_ones() -> None:
    assert (
        detect(["DLL 2022-06-07 08:21:14.819665 - (0, 200) total_ips : 9067.540062153763 "]).name == "ngc-tf1"
    )
    assert (
        detect(["I0826 15:48:34.674365 1401 classifier_trainer.py:180] Base params: {"]).name == "tf2-keras"
    )
    with pytest.raises(ParseError, match="known parsers: gluoncv-imagenet, ngc-mxnet, ngc-mxnet-ranks, ngc-pytorch"):
        detect(["just some text"])


def test_parse_from_lines_matches_parse_file() -> None:
    for path in representative_logs()[::4]:
        text = path.read_text(encoding="utf-8", errors="replace")
        cls = PARSERS.get(parse_file(path).parser)
        with_ends = cls().parse(text.splitlines(keepends=True))
        without = cls().parse(text.splitlines())
        assert _shape(with_ends) == _shape(without) == _shape(parse_file(path))


def test_long_file_is_streamed_in_constant_memory(tmp_path: Path) -> None:
    """30 MB of log with few records: memory stays far below the file size."""
    src = (
        PUBLISHED / P_9881 / "ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs/mxnet_gpu1_gpu8_fp32_bs256.txt"
    ).read_bytes()
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        for _ in range(30 * 2**20 // len(src) + 1):
            f.write(src)
    tracemalloc.start()
    result = parse_file(big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert big.stat().st_size > 30 * 2**20
    assert len(result.series) > 1000
    assert peak < 12 * 2**20


# ---------------------------------------------------------------------------------------------
# formats without a real log in the reference set: text built from the documented line formats


def test_tf_cnn_benchmarks_synthetic() -> None:
    """No real tf_cnn_benchmarks log is in the reference set. This text follows the format given
    in the domain notes (step line '%i\\timages/sec: %.1f +/- %.1f (jitter = %.1f)\\t<loss>', then
    'total images/sec: %.2f'); the numbers are invented for the test."""
    text = (
        "TensorFlow:  1.15\nModel:       resnet50\nDataset:     imagenet (synthetic)\nMode:        training\n"
        "Batch size:  256 global\n             64 per device\nNum batches: 100\n"
        "Devices:     ['/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3']\nData format: NCHW\n==========\n"
        "Step\tImg/sec\ttotal_loss\n"
        "1\timages/sec: 1093.2 +/- 0.0 (jitter = 0.0)\t7.750\n"
        "10\timages/sec: 1094.2 +/- 1.0 (jitter = 2.8)\t7.804\n"
        "20\timages/sec: 1095.0 +/- 0.6 (jitter = 2.1)\t7.713\n"
        "----------------------------------------------------------------\n"
        "total images/sec: 1093.18\n"
        "----------------------------------------------------------------\n"
    )
    lines = text.splitlines(keepends=True)
    assert detect(lines[:200]).name == "tf-cnn-benchmarks"
    result = PARSERS.get("tf-cnn-benchmarks")().parse(lines)
    s = result.series[0]
    assert [(r.iteration, r.value, r.line) for r in s.records] == [
        (1, 1093.2, 12),
        (10, 1094.2, 13),
        (20, 1095.0, 14),
    ]
    assert s.summary == 1093.18 and s.gpus == 4
    assert result.facts == {"framework_version": "1.15", "batch_size": 64, "gpus": 4}
    assert measure(s, Protocol(aggregate="summary")).value == 1093.18
    assert measure(s, Protocol(skip_records=1)).value == pytest.approx(1094.6)
    tagged = [f"[1,0]<stdout>:{line}" for line in lines]
    assert _shape(PARSERS.get("tf-cnn-benchmarks")().parse(tagged)) == _shape(result)


def test_paddleclas_other_line_formats_synthetic() -> None:
    """The dynamic-engine and pre-2022 PaddleClas formats (from the domain notes); values invented."""
    lines = [
        (
            "[2021/12/20 10:00:00] root INFO: [Train][Epoch 1/120][Iter: 10/5005]lr: 0.10000, top1: 0.00000, "
            "CELoss: 6.90, loss: 6.90, batch_cost: 0.30040s, reader_cost: 0.00020, "
            "ips: 852.06235 samples/s, eta: 2 days"
        ),
        (
            "[2021/12/20 10:00:03] root INFO: [Train][Epoch 1/120][Iter: 20/5005]lr: 0.10000, top1: 0.00000, "
            "CELoss: 6.88, loss: 6.88, batch_cost: 0.30000s, reader_cost: 0.00020, "
            "ips: 853.33333 samples/s, eta: 2 days"
        ),
        (
            "[2022/01/10 10:00:00] ppcls INFO: epoch:0   train step:10   lr: 0.100000, loss:  8.3496 "
            "top1:  0.0000 top5: -0.0156 batch_cost: 0.75000 s, reader_cost: 0.00067 s, "
            "ips: 341.33333 images/sec."
        ),
        (
            "[2022/01/10 10:30:00] ppcls INFO: END epoch:0   train  loss:  5.6825 top1:  0.0565 "
            "top5:  0.0243 batch_cost: 0.75518 s, reader_cost: 0.00070 s, batch_cost_sum: 163.42611 s, "
            "ips: 338.98347 images/sec."
        ),
    ]
    assert detect(lines).name == "paddleclas"
    s = PARSERS.get("paddleclas")().parse(lines).series[0]
    assert [(r.epoch, r.iteration, r.value) for r in s.records] == [
        (1, 10, 852.06235),
        (1, 20, 853.33333),
        (0, 10, 341.33333),
    ]
    assert s.per_gpu is True  # the END-of-epoch figure is an epoch mean, not a record


def test_record_objects_equal_constructed_ones() -> None:
    path = PUBLISHED / P_9881 / "ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs/tf_gpu1_fp32_bs256.txt"
    rec = parse_file(path).series[0].records[0]
    assert rec == Record(rec.value, rec.iteration, rec.epoch, rec.line)
    assert hash(rec) == hash(Record(rec.value, rec.iteration, rec.epoch, rec.line))
    with pytest.raises(AttributeError):
        rec.value = 1.0  # type: ignore[misc]


def test_ngc_tf1_train_mode_and_pytorch_2020_lines_synthetic() -> None:
    """Line formats quoted in the domain notes with no bundled log: TF1 ``--mode=train``
    (``imgs_per_sec``, DLPerf) and the 2020 PyTorch line without ``compute_ips``."""
    tf1 = [
        (
            "DLL 2020-09-01 06:41:11.984949 - (3, 16135) imgs_per_sec : 1146.8574254443538  cross_entropy : "
            "3.4489827156066895  l2_loss : 0.6694231629371643  total_loss : 4.118405818939209  learning_rate : "
            "0.10318145900964737"
        ),
    ]
    assert detect(tf1).name == "ngc-tf1"
    assert PARSERS.get("ngc-tf1")().parse(tf1).series[0].records == [Record(1146.8574254443538, 16135, 3, 1)]
    pt = [
        "DLL 2020-09-15 14:29:14.427490 - Epoch: 0 Iteration: 2  train.loss : 6.93504  train.total_ips : 4294.91 img/s"
    ]
    assert detect(pt).name == "ngc-pytorch"
    assert PARSERS.get("ngc-pytorch")().parse(pt).series[0].records == [Record(4294.91, 2, 0, 1)]


# ---------------------------------------------------------------------------------------------
# MPI tags: left in place where they open their lines, removed where they are spliced in


@pytest.mark.parametrize("timestamp", [False, True], ids=["plain", "timestamped"])
@pytest.mark.parametrize("path", representative_logs()[::2], ids=lambda p: str(p.relative_to(PUBLISHED)))
def test_tags_spliced_into_lines_are_removed(path: Path, timestamp: bool, tmp_path: Path) -> None:
    """A tag in the middle of a line (ranks writing at once) is cut out before the rules run, so a
    record line it splits still counts."""
    base = _baseline(path)
    p = tmp_path / path.name
    p.write_bytes(spliced_tags(path.read_bytes(), seed=len(path.name), timestamp=timestamp))
    got = parse_file(p)
    assert _shape(got) == _shape(base)
    assert got.facts == base.facts and got.issues == base.issues
    lines = [[r.line for r in s.records] for s in got.series]
    assert lines == [[r.line for r in s.records] for s in base.series]


def test_tf_cnn_benchmarks_timestamped_tags_in_place() -> None:
    """Rules that read from a line start or across a newline allow a tag there (MPI_PREFIX)."""
    text = (
        "TensorFlow:  1.15\nModel:       resnet50\nBatch size:  256 global\n             64 per device\n"
        "Devices:     ['/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3']\n"
        "10\timages/sec: 1094.2 +/- 1.0 (jitter = 2.8)\t7.804\n"
        "20\timages/sec: 1095.0 +/- 0.6 (jitter = 2.1)\t7.713\n"
        "total images/sec: 1093.18\n"
    )
    plain = PARSERS.get("tf-cnn-benchmarks")().parse(text.splitlines(keepends=True))
    stamped = [f"Mon Jun 13 17:45:27 2022[1,3]<stdout>:{line}" for line in text.splitlines(keepends=True)]
    got = PARSERS.get("tf-cnn-benchmarks")().parse(stamped)
    assert full(got) == full(plain)
    assert got.facts["batch_size"] == 64 and [r.iteration for r in got.series[0].records] == [10, 20]


# ---------------------------------------------------------------------------------------------
# records are kept as columns; Series.records is a list-like view


def test_iteration_numbers_past_int64_are_read_exactly() -> None:
    lines = [
        "DLL 2020-09-01 06:41:11.984949 - (3, 99999999999999999999) imgs_per_sec : 1146.8 ",
        "DLL 2020-09-01 06:41:12.984949 - (3, 16135) imgs_per_sec : 1146.9 ",
    ]
    s = PARSERS.get("ngc-tf1")().parse(lines).series[0]
    assert s.records == [Record(1146.8, 99999999999999999999, 3, 1), Record(1146.9, 16135, 3, 2)]


def test_run_boundaries_split_a_block_of_records() -> None:
    """Runs start in the middle of a block: each record lands in the series of its run, and the
    iteration numbers (converted only when read) follow them."""
    path = PUBLISHED / P_9881 / "ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs/tf_gpu1_fp32_bs256.txt"
    one = parse_file(path).series[0]
    text = path.read_text()
    many = PARSERS.get("ngc-tf1")().parse((text * 40).splitlines(keepends=True))
    assert len(many.series) == 40
    for k, s in enumerate(many.series):
        assert [(r.value, r.iteration, r.epoch) for r in s.records] == [
            (r.value, r.iteration, r.epoch) for r in one.records
        ]
        assert s.records[0].line == one.records[0].line + k * len(text.splitlines())
        late = Protocol(from_iteration=300)
        assert measure(s, late).value == measure(one, late).value


def _params_by_split(text: str) -> dict[str, str]:
    """What a DLLogger PARAMETER line means: items split on two spaces, ``key : value``."""
    out = {}
    for item in text.split("  "):
        key, sep, value = item.strip().partition(" : ")
        if sep:
            out[key] = value.strip()
        elif key.endswith(" :"):
            out[key[:-2]] = ""
    return out


def test_parameter_lines_read_by_key_as_split_whole() -> None:
    keys = ["amp", "xamp", "amp_x", "a", "batch_size", "gpus", "mode", "dali"]
    for text in parameter_lines():
        want, got = _params_by_split(text), params_of(text)
        assert dict(got) == want, text
        for key in keys + [k for k in want if " : " not in k]:
            assert (got.get(key), key in got) == (want.get(key), key in want), (text, key)


@pytest.mark.parametrize("before", [40, 400, 4000])
def test_config_dump_across_a_block_boundary_keeps_its_facts(before: int, tmp_path: Path) -> None:
    """The first block ends ``before`` bytes into the DataLoader section of the second run's config
    dump: the block takes the rest of the section, so its batch size is still read, in both
    block readers."""
    from repro.measure.parsers.base import BLOCK_BYTES

    log = PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/V100-LOG/PaddleClas_ResNet50_bs256_fp32_DP_N1C1_log"
    text = log.read_text()
    second = text.replace("batch_size : 256", "batch_size : 128")  # a run whose dump differs
    at = second.index("ppcls INFO: DataLoader : ")
    filler_len = BLOCK_BYTES - len(text) - at - before
    filler = "".join(f"filler line {i:07d}\n" for i in range(filler_len // 20 + 1))[:filler_len]
    filler = filler[: filler.rfind("\n") + 1]
    path = tmp_path / "two-runs.log"
    path.write_text(text + filler + second)
    assert path.stat().st_size > BLOCK_BYTES + before
    whole = parse_file(path)
    assert whole.facts["batch_size"] == 256
    assert any("contradicting batch_size: 256" in i and "128" in i for i in whole.issues), whole.issues
    lines = PARSERS.get("paddleclas")().parse(path.read_text().splitlines(keepends=True))
    assert full(lines) == full(whole)


def test_contradicting_facts_are_kept_counted_and_never_repeated() -> None:
    """Facts keep their first value; each later different value is an issue naming both lines.
    Past the issue limit the rest are counted, a repeat of a kept issue never (one fact given
    twice on one line): the same list, through fact() and facts_at(), as issue() on every text."""
    import random

    from repro.measure.parsers.base import Builder

    rng = random.Random(5)
    calls = [(rng.choice("abc"), rng.choice([1, 2, 3]), rng.randrange(1, 40) * 10) for _ in range(400)]
    calls.sort(key=lambda c: c[2])  # lines in file order; several facts on one line
    # 49 issues, then the 50th (kept) given again on its line, and a new one there (counted)
    start = [("z", 0, 1), *((f"k{i}", 0, 1) for i in range(49)), *((f"k{i}", 1, 2) for i in range(49))]
    calls = [*start, ("z", 1, 3), ("z", 1, 3), ("z", 2, 3), *calls]
    built, by_items, want = Builder(False), Builder(False), Builder(False)
    first: dict[str, tuple[int, int]] = {}
    for key, value, line in calls:
        built.fact(key, value, line)
        by_items.facts_at([(key, value)], line)
        if key not in first:
            first[key] = (value, line)
        elif first[key][0] != value:
            old, at = first[key]
            want.issue(f"contradicting {key}: {old!r} (line {at}) and {value!r} (line {line}); keeping the first")
    assert len(want.issues) == Builder.MAX_ISSUES and want._dropped > 0
    wanted = want.finish("x", 0).issues
    for b in (built, by_items):
        assert b.finish("x", 0).issues == wanted
        assert b.facts == {k: v for k, (v, _) in first.items()}
