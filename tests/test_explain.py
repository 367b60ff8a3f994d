"""``repro explain``: on fabricated runs, each with one cause planted, the planted cause ranks first.

The runs are the publications' real logs scaled (as tests/test_verdicts.py makes them), plus: telemetry
in the sampler's format made of the real H100 capture's rows with the clock and the clock event reasons
changed (throttling), the real capture's compute processes (other processes on the GPUs), a real NCCL log
of a socket fallback (tests/data/nccl/socket-channels.log) before the rank-0 log of a 4-node cell, or a
PaddleClas log whose ``reader_cost`` is raised to a fifth of each step.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli
from test_verdicts import scaled_run

from repro.run.rundir import DONE, RunDir
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Cell, find_target
from repro.verdict.explain import LOGS, explain_run, explain_table, input_share, render_text
from repro.verdict.reproduce import reproduce_run, reproduce_table
from repro.verdict.rules import Check

DATA = Path(__file__).parent / "data"
ONE = "1n1g-fp32-bs256"
FOUR = "4n8g-fp32-bs256"


AMP = "1n1g-amp-bs256"
EIGHT = "1n8g-fp32-bs256"


def explained(run: RunDir, key: str, table=None, **kw):
    found = explain_run(run.path, table or reproduce_run(run.path), only=key, **kw)
    assert len(found) == 1, [e.cell for e in found]
    return found[0]


def gpu_rows(n: int, throttled: int) -> list[str]:
    """``n`` samples from the real H100 load row, the first ``throttled`` of them with the SM clock at 1410
    MHz, 88 C and sw_thermal_slowdown (0x20) active, as nvidia-smi would print them."""
    header, row = (DATA / "telemetry" / "h100-590.48.01-query-gpu-load.csv").read_text().splitlines()
    names = [c.strip() for c in next(csv.reader([header], skipinitialspace=True))]
    values = next(csv.reader([row], skipinitialspace=True))
    out = [header]
    for i in range(n):
        v = list(values)
        if i < throttled:
            v[names.index("clocks.current.sm [MHz]")] = "1410 MHz"
            v[names.index("temperature.gpu")] = "88"
            v[names.index("clocks_event_reasons.active")] = "0x0000000000000020"
        out.append(", ".join(v))
    return out


def plant_telemetry(run: RunDir, key: str, lines: list[str]) -> None:
    for d in sorted((run.path / "cells" / key).glob("r*")):
        (d / "telemetry-node0.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunDir, Any]:
    """Five repeats 3% slower than published, with a cause planted in three cells: throttling telemetry in
    1n1g-fp32, other processes on the GPU in 1n1g-amp, NCCL over sockets in 4n8g-fp32; 1n8g-fp32 has none."""
    run = slow_run(tmp_path_factory.mktemp("explain"))
    return run, reproduce_run(run.path)


def slow_run(root: Path) -> RunDir:
    """The run of ``slow`` (the docs' `repro explain` example is made by it too)."""
    run = scaled_run(root, 0.97, 0.003)
    plant_telemetry(run, ONE, ["gpu " + x for x in gpu_rows(50, 30)])
    apps = (DATA / "telemetry" / "h100-590.48.01-compute-apps-load.csv").read_text().splitlines()
    ours = "c" * 64
    lines = [f"containers {ours}"] + ["gpu " + x for x in gpu_rows(20, 0)] + ["apps " + x for x in apps]
    lines += ["cgroup 11327 -", "cgroup 11328 " + "d" * 64, f"cgroup 11345 {ours}"]
    plant_telemetry(run, AMP, lines)
    socket = (DATA / "nccl" / "socket-channels.log").read_bytes()
    for k in range(1, 6):
        log = run.rank0_log(FOUR, k)
        assert log is not None
        log.write_bytes(socket + log.read_bytes())
    return run


def test_throttling_ranks_first(slow) -> None:
    e = explained(*slow[:1], ONE, slow[1])
    assert e.verdict == "slower" and e.evidence[0].kind == "throttling"
    assert e.evidence[0].text.startswith("GPUs throttled in 60% of 250 busy samples (sw_thermal_slowdown 60%)")
    assert "up to 88 C" in e.evidence[0].text
    assert "SM clock 1638 MHz on average against a maximum of 1980" in e.evidence[0].text


def test_other_processes_on_the_gpus_rank_first(slow) -> None:
    e = explained(slow[0], AMP, slow[1])
    assert e.evidence[0].kind == "other-processes"
    assert e.evidence[0].text == ("2 process(es) of no container of this cell on its GPUs: "
                                  "pid 11327 /root/tools/memhog (2566 MiB), pid 11328 /root/tools/memhog (1542 MiB)")
    assert any(x.startswith("telemetry: clocks at their maximum in 100% of 100 busy samples") for x in e.checked)


def test_nccl_over_sockets_where_infiniband_was_published_ranks_first(slow) -> None:
    e = explained(slow[0], FOUR, slow[1])
    assert e.verdict == "slower" and e.evidence[0].kind == "nccl-socket"
    assert e.evidence[0].text.startswith("NCCL used Socket, not InfiniBand, in 5 of 5 node logs "
                                         f"(cells/{FOUR}/r1/0-node0.log: ")


def paddle_run(root: Path, reader_share: float, factor: float = 0.8, repeats: int = 3) -> RunDir:
    """A paddle-rn50-v100 run of the 1-GPU FP32 cell: the publication's log with ips x ``factor`` (1 + N(0,
    0.3%)) per repeat, batch_cost / the same, and reader_cost set to ``reader_share`` of batch_cost."""
    m = find_target("paddle-rn50-v100")
    m = dataclasses.replace(m, matrix={**m.matrix, "repeats": repeats})
    run = RunDir.create(root, m, Hosts((Node("node0", "10.0.0.1", user="root"),)))
    pc = next(c for c in m.table().cells if c.gpus == 1 and c.precision == "fp32")
    text = pc.logs[0].read_text()
    rng = random.Random(5)
    pattern = re.compile(r"batch_cost: ([0-9.]+) s, reader_cost: ([0-9.]+) s, ips: ([0-9.]+)")
    for k in range(1, repeats + 1):
        f = factor * (1 + rng.gauss(0, 0.003))

        def scale(mt: re.Match[str], f: float = f) -> str:
            batch = float(mt[1]) / f
            return f"batch_cost: {batch:.5f} s, reader_cost: {batch * reader_share:.5f} s, ips: {float(mt[3]) * f:.5f}"

        run.write_log(Cell(1, 1, "fp32", 256), k, 0, "node0", pattern.sub(scale, text).encode())
        run.set_status(Cell(1, 1, "fp32", 256), k, DONE)
    return run


def test_a_paddle_run_with_a_high_reader_cost_is_input_bound(tmp_path: Path) -> None:
    run = paddle_run(tmp_path, 0.2)
    published = find_target("paddle-rn50-v100").table().cells[0].logs
    assert [e.cell for e in explain_run(run.path, reproduce_run(run.path))] == [ONE]  # the others: not run
    e = explained(run, ONE)
    assert e.verdict == "slower" and e.evidence[0].kind == "input-bound"
    with published[0].open() as f:
        theirs = input_share(f)
    assert theirs is not None and theirs[1] < 0.01
    assert e.evidence[0].text.startswith("input-bound: reader_cost of batch_cost is 20.0% over ")
    assert e.evidence[0].text.endswith(f"3 repeat(s); the publication's log: {theirs[1] * 100:.1f}%")


def test_environment_drift_ranks_first_when_nothing_else_is_found(slow) -> None:
    drift = [Check("environment", "driver", "drift", "418.67", "470.82.01"),
             Check("environment", "gpu_model", "ok", "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB")]
    e = explained(slow[0], EIGHT, slow[1], environment=drift)
    assert [x.kind for x in e.evidence] == ["environment"]
    assert e.evidence[0].text == "environment differs from the publication's: driver 470.82.01 (published 418.67)"


def test_too_few_repeats_for_the_spread_explains_an_inconclusive_cell(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 1.0, 0.0, factors=[0.94, 1.06, 0.97, 1.03, 1.00])
    e = explained(run, ONE)
    assert e.verdict == "inconclusive" and e.evidence[0].kind == "repeats"
    assert e.evidence[0].text.startswith("5 repeats spread 4.")


def test_nothing_explains_it_and_says_what_was_looked_at(slow) -> None:
    e = explained(slow[0], EIGHT, slow[1])
    assert e.evidence == []
    text = render_text([e], "RUN")
    assert "  nothing in the run explains it; looked at:" in text
    assert "     - telemetry: no GPU samples recorded" in text
    assert "     - NCCL transport: a one-node cell (no network between ranks)" in text


def test_the_cli_ranks_the_evidence_and_report_points_to_it(slow) -> None:
    run = slow[0]
    got = run_cli("explain", str(run.path), ONE)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[0].startswith("ngc-pytorch-rn50-v100 1 GPU (1 node) fp32 bs256: slower, ")
    assert got.stdout.splitlines()[1].startswith("  1. [throttling] GPUs throttled in 60% of 250 busy samples")
    doc = json.loads(run_cli("explain", str(run.path), "--format", "json").stdout)
    assert len(doc) == 6 and doc[0]["evidence"][0]["kind"] == "throttling"
    bad = run_cli("explain", str(run.path), "9n9g-fp32-bs1")
    assert bad.returncode == 2 and "9n9g-fp32-bs1: no such cell" in bad.stderr and "Traceback" not in bad.stderr
    assert run_cli("explain", "no-such-target").returncode == 2
    report = run_cli("report", str(run.path))
    assert f"Why: `repro explain {run.path}` ranks the evidence for the 6 slower, faster or inconclusive" \
        in report.stdout.replace("\n    ", " ")


def test_the_cli_reads_the_environment_from_the_runs_provenance(tmp_path: Path) -> None:
    from test_provenance import make_run

    run = make_run(tmp_path, driver_on_last="470.82.01")  # one node of four on another driver
    log = run.rank0_log(ONE, 1)
    assert log is not None
    log.write_bytes(re.sub(rb"(_ips : )(\d+\.\d+)", lambda m: m[1] + b"%.2f" % (float(m[2]) * 0.9),
                           log.read_bytes()))
    got = run_cli("explain", str(run.path), ONE)
    assert got.returncode == 0, got.stderr
    text = got.stdout.replace("\n      ", " ")  # the wrapped lines joined
    first, second = text.splitlines()[1:3]
    assert first.startswith("  1. [environment] environment differs from the publication's: driver ")
    assert "470.82.01" in first and "(published 525.60.11)" in first
    assert second.startswith("  2. [repeats] one repeat: no spread known")


# ------------------------------------------------------------------ the right baselines
A100 = "paddle-rn50-a100"


@pytest.fixture(scope="module")
def a100(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """A new run of paddle-rn50-a100 made from the committed logs: every record x 0.993 (1 + N(0, 0.3%))."""
    return scaled_run(tmp_path_factory.mktemp("a100"), 0.993, 0.003, target=A100)


def test_a_run_that_matches_the_publications_log_says_so_first(a100: RunDir) -> None:
    """The 8-GPU FP32 cell is published as 5333.558, which its committed log cannot give (P10 x 8: 4388.65):
    a run like that log is `slower` against the figure, and the first thing to say is that it matches the log,
    and that both are input-bound against 1 GPU; the reader's share beside the publication's log alone (the
    same 27.8%) said nothing."""
    e = explained(a100, EIGHT)
    assert e.verdict == "slower" and e.figures == "5333.558 → 4355.27 (-18.34%, n=5)"
    first, second = e.evidence[:2]
    assert first.kind == "published-log"
    assert first.text.startswith("the run matches the publication's own log: 4355.27 against the 4388.65 its log "
                                 "gives (-0.76%, tolerance ±2%); the published 5333.558 does not come from that "
                                 "log (not derivable: published 5333.558 (666.695 per GPU) lies above every record")
    assert second.kind == "input-bound"
    assert second.text == ("input-bound: reader_cost of batch_cost is 27.8% over 620 records of 5 repeat(s), against "
                           "3.0% at 1 GPU (this run's 1n1g-fp32-bs256); the publication's log: 27.8%")


def test_a_cell_whose_figure_comes_from_its_log_is_judged_against_the_figure(a100: RunDir) -> None:
    """Where the published figure is the log's (the 1-GPU cell), the log is no separate baseline, and a run as
    input-bound as the publication's own log is not, by that, explained."""
    table = reproduce_run(a100.path)
    assert [e.cell for e in explain_run(a100.path, table)] == [EIGHT]  # the other three: reproduced


def test_a_tree_of_logs_is_explained_and_says_what_logs_cannot_show(a100: RunDir, tmp_path: Path) -> None:
    for log in sorted(a100.path.glob("cells/*/r*/0-node0.log")):
        dest = tmp_path / "mine" / log.parent.parent.name / log.parent.name / "train.log"
        dest.parent.mkdir(parents=True)
        dest.write_bytes(log.read_bytes())
    m = find_target(A100)
    found = explain_table(reproduce_table(m, m.table(), tmp_path / "mine"), LOGS)
    assert [e.cell for e in found] == [EIGHT]
    assert [x.kind for x in found[0].evidence] == ["published-log", "input-bound"]
    assert "(your logs' 1n1g-fp32-bs256)" in found[0].evidence[1].text
    assert found[0].checked[0].startswith("telemetry: a tree of logs holds none")
    got = run_cli("explain", A100, "--from-logs", str(tmp_path / "mine"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[1].startswith("  1. [published-log] the run matches the publication's own log")
    assert "environment: a tree of logs records none" in got.stdout


def test_a_published_table_explains_why_a_cell_does_not_come_from_its_log() -> None:
    got = run_cli("explain", "perf-2.5-a100")
    assert got.returncode == 0, got.stderr
    text = got.stdout.replace("\n      ", " ")  # the wrapped lines joined
    lines = text.splitlines()
    assert lines[0] == "paddle-rn50-a100 8 GPUs (1 node) fp32 bs256: not derivable, 5333.558 → 4388.65 from its log (-17.72%)"
    assert lines[1].startswith("  1. [not-derivable] published 5333.558 (666.695 per GPU) lies above every record")
    assert lines[2] == ("  2. [input-bound] input-bound: reader_cost of batch_cost is 27.8% over 124 records of the "
                        "log, against 3.0% at 1 GPU (the publication's 1-GPU log)")
    assert lines[3] == ("  3. [scaling] scaling: the log gives 4388.65 = 60.4% of 8 x its 1-GPU 908.25; the published "
                        "5333.558 would be 73.4% of 8 x the published 908.244")
    assert text.count(": not derivable, ") == 1  # every other cell of the four frameworks re-derives
    assert run_cli("explain", "perf-2.5-a100", "9n9g-fp32-bs1").returncode == 2
