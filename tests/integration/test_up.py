"""``repro up`` end to end on the namespace nodes with the CPU target torch-rn50-cpu.

The image is built once for the module (the kit's own build: debootstrap base from the
local registry, the torch CPU wheel from --wheels); then the full matrix runs and prints
its table; a run interrupted by a signal leaves no container and --resume finishes
exactly the missing repeats; a repeat whose container is killed is retried; a run whose
lock does not match refuses to start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import docker
import pytest
from cluster_helpers import plain_lines
from docs_examples import assert_cluster_example

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def target(cpu_torch: dict) -> Path:
    """torch-rn50-cpu on this cluster's base, its image already built and on the nodes."""
    return cpu_torch["manifest"]


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "PYTHONUNBUFFERED": "1"}


def repro(env: dict[str, str], *args: str, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def up_args(cluster: dict, target: Path, out: Path, *extra: str) -> list[str]:
    build = ["--wheels", str(WHEELS), "--push", f"{cluster['registry']}/repro-test"]
    build += ["--ca-bundle", str(CA)] if CA.is_file() else []
    return ["up", str(target), "--hosts", cluster["hosts_file"], "--out", str(out), "--json-logs", *build, *extra]


def containers_of(cluster: dict, run_id: str) -> list[str]:
    out = []
    for n in cluster["nodes"]:
        c = docker.DockerClient(base_url=n["docker_host"])
        out += [x.name for x in c.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"})]
        c.close()
    return out


def state_of(run: Path) -> dict:
    return json.loads((run / "state.json").read_text())


def statuses(run: Path) -> dict[str, list[str]]:
    return {k: [r["status"] for _, r in sorted(c["repeats"].items())] for k, c in state_of(run)["cells"].items()}


@pytest.fixture(scope="module")
def locked(target: Path) -> Path:
    lock = target.with_name("torch-rn50-cpu.lock.json")
    assert lock.is_file()
    return lock


def test_full_matrix_runs_and_prints_the_table(cluster, target, locked, env, tmp_path):
    store = tmp_path.parent / f"{tmp_path.name}-results.sqlite"
    env = {**env, "REPRO_RESULTS": str(store)}
    proc = repro(env, *up_args(cluster, target, tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 1
    run = runs[0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [f"{run.name}.tar.gz",
                                                                          f"{run.name}.tar.gz.sha256"]
    assert statuses(run) == {"1n1g-fp32-bs8": ["done"] * 3, "2n1g-fp32-bs8": ["done"] * 3}
    for key in ("1n1g-fp32-bs8", "2n1g-fp32-bs8"):
        for k in (1, 2, 3):
            logs = sorted(p.name for p in (run / "cells" / key / f"r{k}").glob("*.log"))
            assert logs == (["0-rc-node1.log"] if key.startswith("1n") else ["0-rc-node1.log", "1-rc-node2.log"])
    assert "| 1 worker (1 node)" in proc.stdout and "| 2 workers (2 nodes)" in proc.stdout
    assert "(median of 3)" in proc.stdout and "Verdict: 2 measured of 2 cells." in proc.stdout
    assert_cluster_example("ssh-docker-up", plain_lines(proc.stderr), proc.stdout)
    report = json.loads((run / "report.json").read_text())
    assert all(c["reproduced"] > 0 and c["repeats"] == 3 and c["device"] == "CPU" for c in report)
    assert "<img alt='published vs reproduced' src='data:image/png;base64," in (run / "report.html").read_text()
    assert (run / "report.md").is_file() and (run / "report.csv").is_file() and (run / "report.png").is_file()
    assert containers_of(cluster, run.name) == []
    # the finished run is in the results store, once: its figures as the report gives them
    assert f"recorded in {store} as run #1" in proc.stderr
    history = json.loads(repro(env, "history", "torch-rn50-cpu", "--format", "json").stdout)
    assert {(h["gpus"], h["value"], h["repeats"]) for h in history} == \
        {(c["gpus"], c["reproduced"], 3) for c in report}
    assert {h["run_id"] for h in history} == {run.name} and {h["verdict"] for h in history} == {"measured"}
    again = repro(env, "report", str(run))
    assert "already recorded" in again.stderr and "as run #1" in again.stderr
    # the per-rank checksums prove data parallelism kept the two replicas identical
    two = run / "cells" / "2n1g-fp32-bs8" / "r1"
    sums = [line.split("checksum ")[1] for p in sorted(two.glob("*.log")) for line in p.read_text().splitlines()
            if "parameter checksum" in line]
    assert len(sums) == 2 and sums[0] == sums[1]


def test_interrupted_run_leaves_no_container_and_resume_runs_exactly_the_rest(cluster, target, locked, env,
                                                                              tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "repro", *up_args(cluster, target, tmp_path, "--cells", "nodes=1")],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stderr is not None
    run_dir = None
    for line in proc.stderr:
        ev = json.loads(line) if line.startswith("{") else {}
        run_dir = ev.get("run_dir", run_dir)
        if ev.get("kind") == "throughput" and run_dir and statuses(Path(run_dir))["1n1g-fp32-bs8"][0] == "done":
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    run = Path(run_dir)
    assert containers_of(cluster, run.name) == []
    before = statuses(run)["1n1g-fp32-bs8"]
    assert before[0] == "done" and before[1] == "pending" and before[2] == "pending"
    assert state_of(run)["cells"]["1n1g-fp32-bs8"]["repeats"]["2"]["why"] == "interrupted"
    kept = (run / "cells" / "1n1g-fp32-bs8" / "r1" / "0-rc-node1.log").read_bytes()

    resumed = repro(env, "up", "--resume", str(run), "--hosts", cluster["hosts_file"], "--json-logs",
                    "--wheels", str(WHEELS), "--cells", "nodes=1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ran = [json.loads(x)["cell"] + f" r{json.loads(x)['repeat']}" for x in resumed.stderr.splitlines()
           if x.startswith("{") and json.loads(x)["kind"] == "cell"]
    assert ran == ["1n1g-fp32-bs8 r2", "1n1g-fp32-bs8 r3"]
    assert statuses(run)["1n1g-fp32-bs8"] == ["done"] * 3
    assert (run / "cells" / "1n1g-fp32-bs8" / "r1" / "0-rc-node1.log").read_bytes() == kept
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == [run], "resume appends to the same run directory"


def test_a_repeat_whose_container_is_killed_is_retried(cluster, target, locked, env, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "repro", *up_args(cluster, target, tmp_path, "--cells", "nodes=2",
                                                                    "--repeats", "1")],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stderr is not None
    killed = False
    lines = []
    for line in proc.stderr:
        lines.append(line)
        ev = json.loads(line) if line.startswith("{") else {}
        # rank 0 reports throughput while both ranks train; kill rank 1's container then
        if not killed and ev.get("kind") == "throughput":
            run_id = Path(next(json.loads(x)["run_dir"] for x in lines if '"run_dir"' in x)).name
            node2 = docker.DockerClient(base_url=cluster["nodes"][1]["docker_host"])
            threading.Thread(target=lambda: [c.kill() for c in node2.containers.list(
                filters={"label": f"repro.run={run_id}"}, ignore_removed=True)]).start()
            killed = True
    out, err = proc.communicate(timeout=600)
    assert killed and proc.returncode == 0, "".join(lines)[-3000:]
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    entry = state_of(run)["cells"]["2n1g-fp32-bs8"]["repeats"]["1"]
    assert entry["status"] == "done" and entry["attempts"] == 2
    r1 = run / "cells" / "2n1g-fp32-bs8" / "r1"
    assert sorted(p.name for p in r1.iterdir()) == ["0-rc-node1.attempt1", "0-rc-node1.log", "1-rc-node2.attempt1",
                                                    "1-rc-node2.log", "telemetry-rc-node1.txt",
                                                    "telemetry-rc-node2.txt", "telemetry.json"]
    assert any("attempt 1/2 failed" in x and "retrying" in x for x in lines)
    assert containers_of(cluster, run.name) == []


def test_a_run_whose_lock_does_not_match_refuses_to_start(cluster, target, locked, env, tmp_path):
    """The manifest pins one base digest, its lock file another: nothing starts, both digests are named."""
    other = tmp_path / "t"
    other.mkdir()
    real = cluster["base_digest"]
    fake = "sha256:" + "0" * 64
    text = target.read_text()
    pinned = text.replace(f'base: {{ref: "{cluster["base_image"]}", digest: ""}}',
                          f'base: {{ref: "{cluster["base_image"]}", digest: "{real}"}}')
    assert pinned != text
    (other / target.name).write_text(pinned)
    (other / locked.name).write_text(locked.read_text().replace(real, fake))
    proc = repro(env, *up_args(cluster, other / target.name, tmp_path / "runs"))
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert real in proc.stderr and fake in proc.stderr and "--update-lock" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert '"preflight' not in proc.stderr, "the lock is checked before any node is touched"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
