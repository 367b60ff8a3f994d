"""Logs that hold several runs: DLE MXNet's ``benchmark.py -n 1,8`` (DLE 99b1c89, NGC 19.07).

``benchmark.py`` appends one run per GPU count to one log: each run starts with its ``Namespace(...)``
arguments line (every horovod rank prints it, tagged ``[1,r]``), whose ``batch_size`` is the global
batch (runner multiplies ``-b`` by ``-n``: 1024 = 8 x 128) and whose ``gpus`` lists every GPU of the run;
then one ``train.total_ips`` table row per GPU count. The logs are wanghuancoder/PerformanceReport@b517482's
(bundled under logs/published, see its README), whose figures the MXNet README at cfc5f34 prints.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from parsers_helpers import PUBLISHED

from repro.measure.parsers import parse_file
from repro.verdict.reproduce import MATCH, reproduce_table, resolve_tables

B517482 = PUBLISHED / "wanghuancoder-PerformanceReport@b517482/ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs"

#: the train.total_ips table of each log (the MXNet README at cfc5f34 prints these eight figures)
TABLES = {
    ("fp32", 128): {1: 381.46, 8: 2948.2},
    ("fp32", 256): {1: 384.72, 8: 2987.9},
    ("amp", 128): {1: 1316.7, 8: 9500.5},
    ("amp", 256): {1: 1412.0, 8: 10440.0},
}
PRECISION = {"fp32": "fp32", "amp": "fp16"}  # the logs' "amp" is --dtype float16 without --amp
_ARGS = "Start with arguments Namespace("
_ONE_GPU_ROW = re.compile(r"^ +1 +\|")


def log_of(prec: str, bs: int) -> Path:
    return B517482 / f"mxnet_gpu1_gpu8_{prec}_bs{bs}.txt"


def runs_of(path: Path) -> tuple[list[str], list[str]]:
    """The file's lines split where the 8-GPU run begins (the first arguments line after the 1-GPU run's
    records): the 1-GPU run, and the 8-GPU run with the tables after it."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    second = next(i for i, line in enumerate(lines) if i and _ARGS in line)
    return lines[:second], lines[second:]


def eight_gpu_run_alone(path: Path, out: Path) -> Path:
    """What ``benchmark.py -n 8`` writes: the 8-GPU run and tables that hold its row only."""
    _, eight = runs_of(path)
    out.write_text("".join(line for line in eight if not _ONE_GPU_ROW.match(line)), encoding="utf-8")
    return out


@pytest.mark.parametrize(("prec", "bs"), TABLES, ids=lambda x: str(x))
def test_each_run_of_a_two_run_log_is_its_own(prec: str, bs: int) -> None:
    result = parse_file(log_of(prec, bs))
    assert result.issues == []
    assert [(s.gpus, s.summary) for s in result.series] == list(TABLES[prec, bs].items())
    # 25 Speedometer lines in each of 3 epochs, printed by every rank of the run
    assert [len(s) for s in result.series] == [75, 8 * 75]
    for s in result.series:  # the printed batch is global: 1024 on 8 GPUs is 128 per GPU
        assert (s.facts["batch_size"], s.facts["precision"]) == (bs, PRECISION[prec])
    assert result.facts["batch_size"] == bs and "gpus" not in result.facts  # two GPU counts: no file-wide one


@pytest.mark.parametrize(("prec", "bs"), TABLES, ids=lambda x: str(x))
def test_the_8_gpu_run_cut_out_alone_gives_its_figure(prec: str, bs: int, tmp_path: Path) -> None:
    alone = eight_gpu_run_alone(log_of(prec, bs), tmp_path / "gpu8.txt")
    result = parse_file(alone)
    assert result.issues == []
    (s,) = result.series
    assert (s.gpus, s.summary, len(s)) == (8, TABLES[prec, bs][8], 8 * 75)
    assert {k: result.facts[k] for k in ("gpus", "batch_size", "precision")} == {
        "gpus": 8, "batch_size": bs, "precision": PRECISION[prec]}


def test_facts_of_one_run_never_reach_the_next(tmp_path: Path) -> None:
    """An FP32 bs128 1-GPU run followed by an FP16 bs256 8-GPU run: each run has its own facts, the file
    keeps only those both state alike, and neither is a contradiction."""
    one, _ = runs_of(log_of("fp32", 128))
    path = tmp_path / "two.txt"
    path.write_text("".join(one) + eight_gpu_run_alone(log_of("amp", 256), tmp_path / "8.txt").read_text(),
                    encoding="utf-8")
    result = parse_file(path)
    assert result.issues == []
    first, second = result.series
    assert (first.gpus, first.summary, second.gpus, second.summary) == (1, None, 8, 10440.0)
    assert {k: first.facts[k] for k in ("batch_size", "dtype", "precision")} == {
        "batch_size": 128, "dtype": "float32", "precision": "fp32"}
    assert {k: second.facts[k] for k in ("batch_size", "dtype", "precision")} == {
        "batch_size": 256, "dtype": "float16", "precision": "fp16"}
    assert not {"batch_size", "dtype", "precision", "gpus"} & set(result.facts)
    assert result.facts["data_backend"] == "dali-gpu" and result.facts["amp"] is False


def test_a_table_row_of_a_run_the_log_lacks_is_still_said(tmp_path: Path) -> None:
    """The 1-GPU run cut away but its table row kept: the row has no run, the 8-GPU row has its own."""
    _, eight = runs_of(log_of("fp32", 128))
    path = tmp_path / "cut.txt"
    path.write_text("".join(eight), encoding="utf-8")
    result = parse_file(path)
    assert [(s.gpus, s.summary) for s in result.series] == [(8, 2948.2)]
    assert any("figure for 1 GPU(s), batch 128 but the log has no such run" in i for i in result.issues)


def test_the_two_run_table_re_derives_every_cell_from_its_logs() -> None:
    """perfreport-ngc-mxnet-19.07-v100-cfc5f34: 1 and 8 GPUs from the same four files."""
    (result,) = [reproduce_table(m, t) for m, t in resolve_tables(["perfreport-ngc-mxnet-19.07-v100-cfc5f34"])]
    got = {(c.gpus, c.precision, c.batch_size): c for c in result.cells}
    assert {k: c.reproduced for k, c in got.items()} == {
        (g, PRECISION[p], b): v for (p, b), row in TABLES.items() for g, v in row.items()}
    assert all(c.verdict == MATCH and c.exact and c.kind == "re-derivation" for c in got.values()), \
        [(k, c.verdict, c.detail) for k, c in got.items()]
    assert all("log says batch size" not in c.detail for c in got.values())


def test_a_cell_is_checked_against_the_facts_of_its_own_run(tmp_path: Path) -> None:
    """The 8-GPU run of a two-run file whose 1-GPU run says another batch: the 8-GPU cell is judged by the
    8-GPU run's facts only."""
    from repro.spec.manifest import find_target
    from repro.verdict.reproduce import _contradictions

    one, _ = runs_of(log_of("fp32", 256))
    path = tmp_path / "two.txt"
    path.write_text("".join(one) + eight_gpu_run_alone(log_of("fp32", 128), tmp_path / "8.txt").read_text(),
                    encoding="utf-8")
    result = parse_file(path)
    cell = next(c for c in find_target("ngc-mxnet-rn50-v100-19.07").published[1].cells
                if (c.gpus, c.precision, c.batch_size) == (8, "fp32", 128))
    assert _contradictions(result, cell) == []
    one_gpu = next(c for c in find_target("ngc-mxnet-rn50-v100-19.07").published[1].cells
                   if (c.gpus, c.precision, c.batch_size) == (1, "fp32", 128))
    assert _contradictions(result, one_gpu) == ["log says batch size 256/GPU, the cell says 128"]


def test_every_parser_that_splits_runs_keeps_facts_per_run(tmp_path: Path) -> None:
    """The same engine for the DLLogger formats: two NGC PyTorch logs end to end (1 GPU FP32 bs128, then
    8 GPUs AMP bs256) are two runs with their own facts, not one run that contradicts itself."""
    logs = PUBLISHED / "wanghuancoder-PerformanceReport@03bffd5/ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs"
    path = tmp_path / "two.txt"
    path.write_bytes((logs / "pytorch_gpu1_fp32_bs128.txt").read_bytes()
                     + (logs / "pytorch_gpu8_amp_bs256.txt").read_bytes())
    result = parse_file(path)
    assert not [i for i in result.issues if "contradicting" in i]
    assert [(s.gpus, s.summary, s.facts["batch_size"], s.facts["precision"]) for s in result.series] == [
        (1, 356.77, 128, "fp32"), (8, 6007.61, 256, "amp")]
    assert not {"batch_size", "precision", "gpus"} & set(result.facts)
