"""The oneflow-bert parser and DLPerf's OneFlow BERT rule; a sentences/s target through the shared verdict code.

The real log lines are the ones DLPerf quotes in OneFlow/LanguageModeling/BERT/extract_bert_result.py
(Oneflow-Inc/DLPerf@c89430b, the docstring of extract_info_from_file); the argument lines are what
OneFlow-Benchmark v0.2.0 config.py print_args writes. DLPerf's figure for a log is
global batch x (119 - 19) / (T[119] - T[19]) (extract_util.py compute_throughput, start_iter 19, end_iter 119).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.measure.parsers import PARSERS, detect, parse_file
from repro.measure.protocol import Protocol, measure
from repro.spec.manifest import find_target
from repro.verdict.reproduce import parse_and_measure

HEAD = """==================================================================
Running BERT Pretrain: num_gpu_per_node = {g}, num_nodes = {n}.
==================================================================
batch_size_per_device = {b}
gpu_num_per_node = {g}
num_nodes = {n}
use_fp16 = {fp16}
seq_length = 128
------------------------------------------------------------------
"""
#: DLPerf's quoted lines (1 node, 1 GPU, 24 sentences per GPU)
STEP_19 = "step: 19, total_loss: 9.725, mlm_loss: 8.960, nsp_loss: 0.766, throughput: 54.982 1598056519.8844702\n"
STEP_119 = "step: 119, total_loss: 8.010, mlm_loss: 7.331, nsp_loss: 0.679, throughput: 139.896 1598056537.0029895\n"
#: the OneFlow targets' protocol: the records after step 19, five of them (to step 119), harmonic mean
BERT = Protocol(from_iteration=20, window=5, aggregate="harmonic", min_records=5)


def dlperf(batch: int, t19: float, t119: float) -> float:
    """DLPerf extract_util.py compute_throughput."""
    return batch * (119 - 19) / (t119 - t19)


def log(tmp_path: Path, body: str, n: int = 1, g: int = 1, b: int = 24, fp16: str = "False") -> Path:
    p = tmp_path / "bert_b24_fp32_0.log"
    p.write_text(HEAD.format(n=n, g=g, b=b, fp16=fp16) + body)
    return p


def test_registered_and_detected_by_name() -> None:
    assert PARSERS.get("oneflow-bert").unit == "sentences/s"
    assert detect([STEP_19]).name == "oneflow-bert"
    assert detect(HEAD.format(n=1, g=8, b=96, fp16="True").splitlines(keepends=True)).name == "oneflow-bert"


def test_dlperf_quoted_lines_give_dlperfs_figure(tmp_path: Path) -> None:
    result = parse_file(log(tmp_path, STEP_19 + STEP_119))
    (s,) = result.series
    assert result.facts == {"batch_size": 24, "nodes": 1, "gpus": 1, "amp": False, "precision": "fp32",
                            "seq_length": 128}
    assert [(r.iteration, r.line) for r in s.records] == [(119, 11)]
    m = measure(s, Protocol(from_iteration=20))
    assert m.value == pytest.approx(dlperf(24, 1598056519.8844702, 1598056537.0029895), rel=1e-12)
    assert f"{m.value:.2f}" == "140.20"
    assert not result.issues


def test_five_printed_intervals_are_dlperfs_window(tmp_path: Path) -> None:
    """A 140-step run prints steps 19, 39, ..., 139; the figure uses 19 and 119 only, whatever the others."""
    stamps = {19: 1000.0, 39: 1003.1, 59: 1005.9, 79: 1009.4, 99: 1012.0, 119: 1015.3, 139: 1040.0}
    body = "".join(f"step: {k}, total_loss: 9.0, mlm_loss: 8.0, nsp_loss: 0.7, throughput: 1.0 {t}\n"
                   for k, t in stamps.items())
    (s,) = parse_file(log(tmp_path, body, n=4, g=8, b=96, fp16="True")).series
    m = measure(s, BERT)
    assert m.records_used == 5
    assert m.value == pytest.approx(dlperf(4 * 8 * 96, 1000.0, 1015.3), rel=1e-12)
    assert s.facts["gpus"] == 32 and s.facts["precision"] == "amp"


def test_too_few_steps_give_no_figure(tmp_path: Path) -> None:
    (s,) = parse_file(log(tmp_path, STEP_19 + STEP_119)).series
    m = measure(s, BERT)
    assert m.value is None and m.issues


def test_steps_before_the_arguments_give_no_record(tmp_path: Path) -> None:
    p = tmp_path / "cut.log"
    p.write_text(STEP_19 + STEP_119)
    result = parse_file(p, "oneflow-bert")
    assert sum(len(s) for s in result.series) == 0


def test_a_clock_that_stands_still_refuses_the_log(tmp_path: Path) -> None:
    same = STEP_119.replace("1598056537.0029895", "1598056519.8844702")
    result = parse_file(log(tmp_path, STEP_19 + same))
    assert result.refused and "impossible throughput" in result.refused


def test_repro_parse_prints_the_parsers_unit(tmp_path: Path) -> None:
    out = parse_and_measure(log(tmp_path, STEP_19 + STEP_119), from_iteration=20)
    assert out["unit"] == "sentences/s" and out["parser"] == "oneflow-bert"
    from repro.verdict.report import render_parse_text

    assert "140.199 sentences/s from 1 of 1 records" in render_parse_text(out)


@pytest.mark.parametrize("target", ["dlperf-oneflow-bert-v100", "dlperf-oneflow-bert-noclip-v100"])
def test_the_oneflow_targets_measure_with_dlperfs_rule(target: str) -> None:
    m = find_target(target)
    assert (m.model, m.unit, m.measure.parser) == ("bert-base", "sentences/s", "oneflow-bert")
    proto = Protocol.from_dict(m.measure.protocol)
    assert proto == BERT
    assert dict(m.measure.repeats) == {"aggregate": "median", "round": 2} and m.repeats == 7
