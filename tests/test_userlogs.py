"""``repro report --from-logs``: logs from anywhere go to the cells their content fits.

The tree is PaddlePaddle/Perf@c1ad14b as the publisher lays it out (A100 and V100 logs side by
side), or the same files renamed and flattened, so that only their content can tell them apart.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_cli
from parsers_helpers import P_C1AD, PUBLISHED

from repro.verdict.reproduce import MATCH, NO_LOG, reproduce_table, resolve_tables
from repro.verdict.rules import REPRODUCED
from repro.measure.userlogs import cell_key, parse_maps, scan_logs

ROOT = Path(__file__).resolve().parent.parent


def cells(name: str, from_logs: Path | None = None, maps: dict | None = None) -> dict:
    out = {}
    for m, t in resolve_tables([name]):
        for c in reproduce_table(m, t, from_logs, maps).cells:
            out[(c.target, c.gpus, c.precision)] = c
    return out


@pytest.fixture(scope="module")
def perf_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The publisher's own layout, A100 and V100 folders side by side, plus files that are no logs."""
    root = tmp_path_factory.mktemp("perf") / "Perf"
    shutil.copytree(PUBLISHED / P_C1AD, root)
    (root / "README.md").write_text("# results\n")
    (root / "notes.txt").write_text("throughput was fine\n" * 20)
    os.mkfifo(root / "live.log")  # a run still writing through a pipe: passed over, never opened
    return root


@pytest.fixture(scope="module")
def scrambled_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same logs, renamed run-NN.log in one folder: no name or path says anything."""
    root = tmp_path_factory.mktemp("scrambled")
    files = sorted(p for p in (PUBLISHED / P_C1AD).rglob("*") if p.is_file())
    random.Random(4).shuffle(files)
    for i, p in enumerate(files):
        shutil.copy(p, root / f"run-{i:02d}.log")
    return root


def test_a100_and_v100_logs_in_one_tree_go_to_the_v100_cells(perf_tree: Path) -> None:
    bundled = cells("perf-2.5-v100")
    got = cells("perf-2.5-v100", perf_tree)
    assert got.keys() == bundled.keys() and len(got) == 22
    for key, c in got.items():
        if key[1] == 32:  # bundled from the 2.3 generation's logs, which are not in this tree
            assert c.verdict == NO_LOG and c.logs == [] and "fits this cell" in c.detail
            continue
        assert [Path(p).name for p in c.logs] == [Path(p).name for p in bundled[key].logs], key
        assert all("V100" in p for p in c.logs), (key, c.logs)
        assert (c.reproduced, c.verdict) == (bundled[key].reproduced, bundled[key].verdict), key


def test_paddle_logs_are_told_apart_by_content_alone(scrambled_tree: Path) -> None:
    """PaddleClas logs print the GPU's compute capability: 7.0 is a V100, 8.0 an A100."""
    bundled = cells("paddle-rn50-v100")
    got = cells("paddle-rn50-v100", scrambled_tree)
    for key, c in got.items():
        if key[1] == 32:  # the 2.3 generation's logs, not in this tree
            assert c.logs == [] and c.detail.startswith("no paddleclas log under ")
            continue
        (log,) = c.logs
        assert Path(log).read_bytes() == Path(bundled[key].logs[0]).read_bytes()
        assert c.reproduced == bundled[key].reproduced
    a100 = cells("paddle-rn50-a100", scrambled_tree)
    figures = {(c.gpus, c.precision): f"{c.reproduced:.3f}" for c in a100.values()}
    assert figures == {(1, "fp32"): "908.246", (8, "fp32"): "4388.648", (1, "fp16"): "2602.554",
                       (8, "fp16"): "17598.478"}
    one = a100[("paddle-rn50-a100", 1, "fp32")]
    # read as text, figure intact: a match once the manifest lists these logs as the publication's, until then a
    # new run within the run tolerance
    assert one.verdict in (MATCH, REPRODUCED) and "NUL/control byte" not in one.detail


def test_logs_that_only_a_file_name_could_tell_apart_are_reported_not_chosen(scrambled_tree: Path) -> None:
    """NGC logs do not name their GPU: an A100 and a V100 log of one configuration are ambiguous."""
    got = cells("ngc-pytorch-rn50-v100", scrambled_tree)
    one = got[("ngc-pytorch-rn50-v100", 1, "fp32")]
    assert one.verdict == NO_LOG and one.reproduced is None
    assert one.detail == (
        "ambiguous: 2 logs fit this cell equally (run-03.log, run-28.log); ngc-pytorch logs do not print the GPU "
        "model, so this V100 run cannot be told by content from the same configuration run on another GPU; name "
        "the one to use with --map ngc-pytorch-rn50-v100/1n1g-fp32-bs256=FILE, or put the GPU model in its file or "
        "folder name (e.g. V100_LOG/)")
    tf = cells("ngc-tf1-rn50-v100", scrambled_tree)
    assert tf[("ngc-tf1-rn50-v100", 8, "fp32")].verdict == MATCH  # the only 8-GPU TF1 log is a V100 one
    assert "ngc-tf1 logs do not print the GPU model" in tf[("ngc-tf1-rn50-v100", 1, "fp32")].detail
    mx = cells("ngc-mxnet-rn50-a100", scrambled_tree)
    assert "ngc-mxnet logs do not print the GPU model, so this A100 run" in mx[("ngc-mxnet-rn50-a100", 8, "fp16")].detail
    assert mx[("ngc-mxnet-rn50-a100", 8, "fp32")].verdict == MATCH  # the V100 fp32 runs are bs128: told apart


def test_logs_that_state_the_same_facts_are_reported_not_chosen(tmp_path: Path) -> None:
    """Two copies of one PaddleClas log (it names its GPU) for a cell of one log: no fact tells them apart."""
    log = PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/V100-LOG/PaddleClas_ResNet50_bs256_fp32_DP_N1C1_log"
    for name in ("a.log", "b.log"):
        shutil.copy(log, tmp_path / name)
    one = cells("paddle-rn50-v100", tmp_path)[("paddle-rn50-v100", 1, "fp32")]
    assert one.verdict == NO_LOG and one.detail == (
        "ambiguous: 2 logs fit this cell equally (a.log, b.log); they state the same facts (1 GPU(s), batch 256, "
        "precision fp32, GPU V100) and the cell takes 1 log(s); name the one(s) to use with "
        "--map paddle-rn50-v100/1n1g-fp32-bs256=FILE")


def test_mismatches_are_reported_per_cell(tmp_path: Path) -> None:
    for p in (PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/A100-LOG").iterdir():
        shutil.copy(p, tmp_path / p.name)
    got = cells("paddle-rn50-v100", tmp_path)
    c = got[("paddle-rn50-v100", 8, "fp32")]
    assert c.verdict == NO_LOG and c.logs == []
    assert c.detail.startswith("no log fits this cell: PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log says GPU A100, "
                               "the target V100")
    text = (tmp_path / "PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log").read_text(errors="replace")
    (tmp_path / "PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log").write_text(text.replace("batch_size : 256", "batch_size : 128"))
    c = cells("paddle-rn50-a100", tmp_path)[("paddle-rn50-a100", 8, "fp32")]
    assert c.verdict == NO_LOG and "says batch 128/GPU, the cell 256" in c.detail


def test_map_names_a_cells_log(scrambled_tree: Path) -> None:
    v100 = PUBLISHED / P_C1AD / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs/V100-LOG/pytorch_gpu1_fp32_bs256.txt"
    m, _ = resolve_tables(["ngc-pytorch-rn50-v100"])[0]
    key = cell_key(m, m.table().cells[0])
    assert key == "ngc-pytorch-rn50-v100/1n1g-fp32-bs256"
    got = cells("ngc-pytorch-rn50-v100", scrambled_tree, parse_maps([f"1n1g-fp32-bs256={v100}"]))
    one = got[("ngc-pytorch-rn50-v100", 1, "fp32")]
    assert one.verdict == MATCH and one.logs == [str(v100)] and "log named by --map" in one.detail


def test_cli_from_logs_and_map(scrambled_tree: Path) -> None:
    run = ["report", "paddle-rn50-v100", "--from-logs", str(scrambled_tree)]
    proc = run_cli(*run, cwd=ROOT)
    assert "Verdict: 3 match, 2 no log, 1 not derivable of 6 cells." in proc.stdout
    assert proc.returncode == 7, proc.stderr  # the not-derivable 1-GPU fp16 cell fails the gate
    bad = run_cli(*run, "--map", "nonsense", cwd=ROOT)
    assert bad.returncode == 2 and "expected CELL=FILE" in bad.stderr and "Traceback" not in bad.stderr


def test_scan_passes_over_files_that_are_no_logs(perf_tree: Path) -> None:
    tree = scan_logs(perf_tree)
    names = {p.path.name for p in tree.logs}
    assert not {"README.md", "notes.txt", "live.log"} & names
    assert len(tree.logs) == 30  # 16 V100 + 14 A100
