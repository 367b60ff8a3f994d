"""`repro compare BASELINE RUN...`: a gate with the report's words and exit codes, cells matched by shape
across targets, ratios with intervals, and what cannot be compared said as such.

The runs are the publications' real logs scaled (tests/test_verdicts.py's ``scaled_run``): x1.00 and x0.95 of
NGC PyTorch on V100, and x1.00 of Paddle on V100, five repeats each with 0.3% noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli
from test_store import factors, log_tree
from test_verdicts import scaled_run

from repro.record.compare import compare, compare_all, ratio, render_text, status
from repro.record.store import Snapshot
from repro.verdict.rules import EXIT_DIFFERS, EXIT_OK, EXIT_UNSETTLED, parse_fail_on

PYTORCH, PADDLE = "ngc-pytorch-rn50-v100", "paddle-rn50-v100"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("compare")
    made = {}
    for name, target, factor, seed in (("base", PYTORCH, 1.0, 17), ("again", PYTORCH, 1.0, 23),
                                       ("slow", PYTORCH, 0.95, 17), ("paddle", PADDLE, 1.0, 17)):
        (root / name).mkdir()
        made[name] = str(scaled_run(root / name, factor, 0.003, seed=seed, target=target).path)
    return made


@pytest.fixture()
def store(tmp_path: Path) -> dict[str, str]:
    import os

    return {**os.environ, "REPRO_RESULTS": str(tmp_path / "results.sqlite")}


def test_fail_on_slower_exits_7_on_a_scaled_down_run(runs: dict[str, str], store: dict[str, str]) -> None:
    got = run_cli("compare", runs["base"], runs["slow"], "--fail-on", "slower", env=store)
    assert got.returncode == EXIT_DIFFERS, got.stderr
    assert got.stdout.count("| slower (Welch p=") == 6
    assert "Verdict: 6 slower (6 baseline cell(s) in 1 run(s))." in got.stdout
    assert run_cli("compare", runs["base"], runs["slow"], "--fail-on", "faster", env=store).returncode == EXIT_OK
    same = run_cli("compare", runs["base"], runs["again"], env=store)
    assert same.returncode == EXIT_OK and same.stdout.count("| reproduced (Welch p=") == 6
    both = run_cli("compare", runs["base"], runs["again"], runs["slow"], env=store)  # one baseline, two runs
    assert both.returncode == EXIT_DIFFERS and "## Run 2 against the baseline" in both.stdout
    bad = run_cli("compare", runs["base"], runs["slow"], "--fail-on", "missing", env=store)
    assert bad.returncode == 2 and "--fail-on: unknown verdict 'missing'" in bad.stderr


def test_a_paddle_run_and_an_ngc_pytorch_run_compare_per_cell_with_ratios_and_intervals(
        runs: dict[str, str], store: dict[str, str]) -> None:
    got = run_cli("compare", runs["paddle"], runs["base"], "--format", "json", "--fail-on", "faster", env=store)
    assert got.returncode == EXIT_OK, got.stderr
    cells = json.loads(got.stdout)["cells"]
    matched = [c for c in cells if c["a_target"] == PADDLE and c["b_target"] == PYTORCH]
    assert [(c["gpus"], c["precision"]) for c in matched] == [(1, "fp32"), (8, "fp32"), (32, "fp32")]
    for c in matched:
        assert c["ratio"] == pytest.approx(c["b_value"] / c["a_value"])
        assert c["ratio_low"] < c["ratio"] < c["ratio_high"] and c["ratio_high"] - c["ratio_low"] < 0.02
        assert c["verdict"] == "slower" and c["p_value"] < 1e-6
    # 1 GPU: published 370.194 (NGC PyTorch) against 393.561 (Paddle)
    assert matched[0]["ratio"] == pytest.approx(370.194 / 393.561, rel=0.01)
    # Paddle's pure FP16 and NGC PyTorch's AMP are not one precision: each side's, alone, said so
    assert {c["reason"] for c in cells if c["b_target"] is None} == {"no cell of this shape in the run"}
    assert {c["reason"] for c in cells if c["a_target"] is None} == {"not in the baseline"}
    text = run_cli("compare", runs["paddle"], runs["base"], env=store).stdout
    assert "| 1 GPU (1 node) fp32 bs256 " in text and " | 0.94" in text


def test_the_ratio_interval_is_the_delta_methods() -> None:
    a = {"value": 100.0, "repeats": [99.0, 100.0, 101.0]}
    b = {"value": 50.0, "repeats": [49.0, 50.0, 51.0]}
    r, low, high = ratio(a, b)
    # relative variance of each mean: (1/3)/100^2 and (1/3)/50^2; df by Welch-Satterthwaite
    ta, tb = 1 / 3 / 100**2, 1 / 3 / 50**2
    df = (ta + tb) ** 2 / (ta**2 / 2 + tb**2 / 2)
    from scipy.stats import t

    half = t.ppf(0.975, df) * (ta + tb) ** 0.5 * 0.5
    assert r == 0.5 and low == pytest.approx(0.5 - half) and high == pytest.approx(0.5 + half)
    assert ratio({"value": 2.0, "repeats": [2.0]}, b)[1:] == (None, None)


def _snap(label: str, cells: list[tuple[int, str, int]], kind: str = "logs") -> Snapshot:
    rows = [{"tbl": "", "target": "ngc-pytorch-rn50-v100", "cell": f"{g}", "device": "GPU", "nodes": 1, "gpus": g,
             "precision": p, "batch_size": bs, "unit": "images/s", "value": 100.0, "low": None, "high": None,
             "repeats": [100.0], "verdict": "measured", "tolerance_pct": None} for g, p, bs in cells]
    return Snapshot(label, kind, None, label, "2026-12-01T00:00:00Z", None,
                    {"env": {"nccl_transport": None}, "pins": {"kit": "0.1.0"}}, rows)


def test_runs_that_share_no_cell_say_so_plainly() -> None:
    got = compare(_snap("a", [(1, "fp32", 256)]), _snap("b", [(8, "amp", 128)]))
    text = render_text([got])
    assert "The runs share no cell. The baseline has: 1 GPU (1 node) fp32 bs256. The run has: 8 GPUs (1 node) " \
           "amp bs128." in text
    assert status([got], parse_fail_on(None)) == EXIT_UNSETTLED  # the baseline's cell is not run
    assert status([got], parse_fail_on("slower")) == EXIT_OK


def test_no_facts_recorded_is_said_as_such(tmp_path: Path, store: dict[str, str]) -> None:
    for i, name in enumerate(("sep", "oct"), 1):
        tree = log_tree(tmp_path / name, factors(1.0, 0.003, i), f"2026-{8 + i:02d}-01")
        assert run_cli("report", PYTORCH, "--from-logs", tree, env=store).returncode in (0, 8)
    got = run_cli("compare", "1", "2", env=store)
    assert got.returncode == EXIT_OK, got.stderr
    assert "No facts recorded: neither the baseline nor the run records its environment" in got.stdout
    assert "No recorded fact differs" not in got.stdout
    assert compare_all(_snap("a", [(1, "fp32", 256)]), [_snap("b", [(1, "fp32", 256)])])[0].shared == 1
