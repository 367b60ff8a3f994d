"""``repro report --from-logs``: logs from anywhere go to the cells their content fits.

The tree is PaddlePaddle/Perf@c1ad14b as the publisher lays it out (A100 and V100 logs side by
side), or the same files renamed and flattened, so that only their content can tell them apart.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_cli
from parsers_helpers import P_C1AD, PUBLISHED

from repro.verdict.reproduce import MATCH, NOT_RUN, reproduce_table, resolve_tables
from repro.verdict.rules import REPRODUCED
from repro.measure.userlogs import cell_key, parse_maps, scan_logs

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(rb"((?:_ips|throughput) : |ips: )(\d+\.\d+)")  # NGC records and summaries, PaddleClas ips


def scaled_copy(src: Path, dst: Path, factor: float) -> Path:
    """A new run made of a publisher's log: every throughput figure multiplied by ``factor``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(FIGURE.sub(lambda m: m[1] + b"%.6f" % (float(m[2]) * factor), src.read_bytes()))
    return dst


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
            assert c.verdict == NOT_RUN and c.logs == [] and "fits this cell" in c.detail
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
            assert c.logs == [] and c.detail.startswith("no log of yours under ")
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


def test_copies_of_the_publication_logs_are_re_derived_however_named(scrambled_tree: Path) -> None:
    """NGC logs do not name their GPU: an A100 and a V100 log of one configuration state the same facts, yet a
    copy of the publication's own log is the publication, never a repeat of another cell's."""
    got = cells("ngc-pytorch-rn50-v100", scrambled_tree)
    bundled = cells("ngc-pytorch-rn50-v100")
    one = got[("ngc-pytorch-rn50-v100", 1, "fp32")]
    assert one.verdict == MATCH and one.kind == "re-derivation" and len(one.logs) == 1
    assert Path(one.logs[0]).read_bytes() == Path(bundled[("ngc-pytorch-rn50-v100", 1, "fp32")].logs[0]).read_bytes()
    a100 = cells("ngc-pytorch-rn50-a100", scrambled_tree)[("ngc-pytorch-rn50-a100", 1, "fp32")]
    assert a100.verdict == MATCH and a100.logs != one.logs


def test_copies_of_one_log_are_one_log(tmp_path: Path) -> None:
    """Two copies of one PaddleClas publication log: the same bytes, one re-derivation."""
    log = PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/V100-LOG/PaddleClas_ResNet50_bs256_fp32_DP_N1C1_log"
    for name in ("a.log", "b.log"):
        shutil.copy(log, tmp_path / name)
    one = cells("paddle-rn50-v100", tmp_path)[("paddle-rn50-v100", 1, "fp32")]
    assert (one.verdict, one.kind, [Path(p).name for p in one.logs]) == (MATCH, "re-derivation", ["a.log"])


def test_mismatches_are_reported_per_cell(tmp_path: Path) -> None:
    for p in (PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/A100-LOG").iterdir():
        scaled_copy(p, tmp_path / p.name, 1.0 + 1e-6)  # your A100 run, not the publication's bytes
    got = cells("paddle-rn50-v100", tmp_path)
    c = got[("paddle-rn50-v100", 8, "fp32")]
    assert c.verdict == NOT_RUN and c.logs == []
    assert c.detail.startswith("no log fits this cell: PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log says "
                               "GPU A100, the target V100")
    text = (tmp_path / "PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log").read_text(errors="replace")
    (tmp_path / "PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log").write_text(text.replace("batch_size : 256", "batch_size : 128"))
    c = cells("paddle-rn50-a100", tmp_path)[("paddle-rn50-a100", 8, "fp32")]
    assert c.verdict == NOT_RUN and "says batch 128/GPU, the cell 256" in c.detail


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
    assert "Verdict: 3 match, 2 not run, 1 not derivable of 6 cells." in proc.stdout
    assert proc.returncode == 7, proc.stderr  # the not-derivable 1-GPU fp16 cell fails the gate
    bad = run_cli(*run, "--map", "nonsense", cwd=ROOT)
    assert bad.returncode == 2 and "expected CELL=FILE" in bad.stderr and "Traceback" not in bad.stderr


def test_scan_passes_over_files_that_are_no_logs(perf_tree: Path) -> None:
    tree = scan_logs(perf_tree)
    names = {p.path.name for p in tree.logs}
    assert not {"README.md", "notes.txt", "live.log"} & names
    assert len(tree.logs) == 30  # 16 V100 + 14 A100


# ------------------------------------------------------------------ a new run judges only your logs
NGC_PT = PUBLISHED / P_C1AD / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs"
TF1_9881 = PUBLISHED / "PaddlePaddle-Perf@9881d04/ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs"
FACTORS = (0.998, 1.001, 1.003, 0.999, 1.002)  # five repeats within 0.3 % of the publisher's run


def test_map_of_one_cell_leaves_the_others_not_run(tmp_path: Path) -> None:
    mine = scaled_copy(NGC_PT / "V100-LOG/pytorch_gpu1_fp32_bs256.txt", tmp_path / "mine.log", 1.0)
    got = cells("ngc-pytorch-rn50-v100", None, parse_maps([f"1n1g-fp32-bs256={mine}"]))
    one = got.pop(("ngc-pytorch-rn50-v100", 1, "fp32"))
    assert one.verdict == REPRODUCED and one.logs == [str(mine)]
    assert {c.verdict for c in got.values()} == {NOT_RUN} and all(c.reproduced is None for c in got.values())
    assert all(c.detail.startswith("no --map names ngc-pytorch-rn50-v100/") for c in got.values())
    run = ["report", "ngc-pytorch-rn50-v100", "--map", f"1n1g-fp32-bs256={mine}"]
    proc = run_cli(*run, cwd=ROOT)
    assert proc.returncode == 8, proc.stdout + proc.stderr  # not run counts as unsettled
    assert f"Verdict: {len(got)} not run, 1 reproduced of {len(got) + 1} cells." in proc.stdout
    assert "--map" in proc.stdout.split("Reproduced from:")[1].splitlines()[0]
    ok = run_cli(*run, "--fail-on", "slower,faster", cwd=ROOT)
    assert ok.returncode == 0, ok.stdout


def test_five_repeat_logs_in_a_tree_are_one_cell_with_n_5(tmp_path: Path) -> None:
    for k, f in enumerate(FACTORS, 1):
        scaled_copy(NGC_PT / "V100-LOG/pytorch_gpu1_fp32_bs256.txt", tmp_path / f"rep{k}" / "train.log", f)
    got = cells("ngc-pytorch-rn50-v100", tmp_path)
    one = got.pop(("ngc-pytorch-rn50-v100", 1, "fp32"))
    assert (one.verdict, one.kind, len(one.repeats)) == (REPRODUCED, "new run", 5), one.detail
    assert sorted(Path(p).parent.name for p in one.logs) == [f"rep{k}" for k in range(1, 6)]
    assert one.low is not None and one.low < float(one.published) < one.high
    assert {c.verdict for c in got.values()} == {NOT_RUN}


def test_truncated_32_gpu_tails_are_never_repeats_of_a_1_gpu_cell(tmp_path: Path) -> None:
    """The publisher's 32-GPU TF1 logs are tails that state no fact; beside complete 1-GPU logs (your run)."""
    for name in ("tf_gpu1_fp32_bs256.txt", "tf_gpu1_amp_bs256.txt", "tf_gpu32_fp32_bs256.txt",
                 "tf_gpu32_amp_bs256.txt"):
        scaled_copy(TF1_9881 / name, tmp_path / name, 1.0 + 1e-6)
    got = cells("ngc-tf1-rn50-v100-2.3", tmp_path)
    for prec in ("fp32", "amp"):
        one = got[("ngc-tf1-rn50-v100-2.3", 1, prec)]
        assert [Path(p).name for p in one.logs] == [f"tf_gpu1_{prec}_bs256.txt"], one
        assert one.verdict == REPRODUCED
        tail = got[("ngc-tf1-rn50-v100-2.3", 32, prec)]
        assert tail.verdict == NOT_RUN and "states none of the cell's facts" in tail.detail


def test_a100_and_v100_runs_of_one_configuration_are_never_repeats_of_each_other(tmp_path: Path) -> None:
    for gpu in ("V100-LOG", "A100-LOG"):
        scaled_copy(NGC_PT / gpu / "pytorch_gpu1_fp32_bs256.txt", tmp_path / gpu / "pytorch_gpu1_fp32_bs256.txt", 1.001)
    v100 = cells("ngc-pytorch-rn50-v100", tmp_path)[("ngc-pytorch-rn50-v100", 1, "fp32")]
    a100 = cells("ngc-pytorch-rn50-a100", tmp_path)[("ngc-pytorch-rn50-a100", 1, "fp32")]
    assert [Path(p).parent.name for p in v100.logs] == ["V100-LOG"] and v100.verdict == REPRODUCED
    assert [Path(p).parent.name for p in a100.logs] == ["A100-LOG"] and a100.verdict == REPRODUCED


def test_a_new_runs_speedup_never_borrows_a_base_cell(tmp_path: Path) -> None:
    scaled_copy(NGC_PT / "V100-LOG/pytorch_gpu8_fp32_bs256.txt", tmp_path / "eight.log", 1.0)
    got = cells("ngc-pytorch-rn50-v100", tmp_path)
    eight = got[("ngc-pytorch-rn50-v100", 8, "fp32")]
    assert eight.reproduced is not None and eight.speedup is None and eight.efficiency is None
    assert "no speedup: its base cell (1 GPU) has no figure (not run)" in eight.detail
    scaled_copy(NGC_PT / "V100-LOG/pytorch_gpu1_fp32_bs256.txt", tmp_path / "one.log", 1.0)
    both = cells("ngc-pytorch-rn50-v100", tmp_path)
    eight, one = both[("ngc-pytorch-rn50-v100", 8, "fp32")], both[("ngc-pytorch-rn50-v100", 1, "fp32")]
    assert eight.speedup == pytest.approx(eight.reproduced / one.reproduced, rel=1e-12)
