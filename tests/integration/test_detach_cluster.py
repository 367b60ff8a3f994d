"""``repro up --detach`` on the test cluster's real Slurm (scripts/test-cluster), ``container: docker``.

torch-rn50-cpu's 2-node cell, its image pushed to the cluster's registry (``--push``): the submitting process
exits while the job is still queued or running; the job pulls the image by digest on both nodes, checks that
both see the run directory, runs the cell and writes everything into the run directory; ``repro status``
shows it done from the run directory alone; ``repro report RUN_DIR`` judges it and seals its provenance;
``repro audit`` verifies that. No container of the run is left on a node, and the job's inputs (the agent's
spec) are gone once it was judged.

The image is the one the session's cpu_torch fixture built; the manifest is a copy named for this test
(``detach-torch-rn50-cpu``: the Slurm job carries it) on ports of its own, since other tests may run the same
target on these nodes at the same time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
CA = Path("/etc/ssl/certs/ca-certificates.crt")
TARGET = "detach-torch-rn50-cpu"


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "SLURM_CONF": cluster["slurm_conf"], "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def target(cpu_torch: dict, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("detach-target")
    text = cpu_torch["manifest"].read_text()
    assert text.count("id: torch-rn50-cpu\n") == 1 and text.count("master_port: 29500") == 1
    path = d / f"{TARGET}.yaml"
    path.write_text(text.replace("id: torch-rn50-cpu\n", f"id: {TARGET}\n")
                    .replace("master_port: 29500", "master_port: 29566"))
    subprocess.run([sys.executable, "-m", "repro", "lock", str(path)], check=True, capture_output=True, cwd=ROOT,
                   env=env)
    return path


def repro(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def job_state(env: dict[str, str], job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env,
                         timeout=30).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t).get("JobState", "")


def containers(cluster: dict, run_id: str) -> list[str]:
    out = []
    for n in cluster["nodes"]:
        c = docker.DockerClient(base_url=n["docker_host"])
        out += [f"{n['name']}:{x.name}" for x in c.containers.list(all=True,
                                                                    filters={"label": f"repro.run={run_id}"})]
        c.close()
    return out


def test_submit_walk_away_status_report_audit(cluster, env, target, tmp_path):
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(Path(cluster["hosts_file"]).read_text()
                         + "scheduler: {kind: slurm, partition: debug, time: 30, container: docker}\n")
    out = tmp_path / "runs"
    up = repro(env, "up", str(target), "--hosts", str(inventory), "--detach", "--cells", "nodes=2", "--repeats",
               "1", "--out", str(out), "--wheels", str(WHEELS), "--push", f"{cluster['registry']}/repro-test",
               *(["--ca-bundle", str(CA)] if CA.is_file() else []), timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    lines = up.stdout.splitlines()
    assert lines[0].startswith("submitted Slurm job ") and lines[1].startswith("run directory ")
    job, run = lines[0].split()[-1], Path(lines[1].split(" ", 2)[2])
    # the submitting process is gone; the job is not over yet (a 2-node torch cell takes tens of seconds)
    assert job_state(env, job) in ("PENDING", "CONFIGURING", "RUNNING"), job_state(env, job)
    assert run.parent == out and (run / "job" / "batch.sbatch").is_file()
    assert oct((run / "job" / "in" / "2n1g-fp32-bs8.json").stat().st_mode & 0o777) == "0o600"

    deadline = time.monotonic() + 1800  # the queue is shared with the other tests' jobs
    while True:
        status = repro(env, "status", str(run), "--format", "json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        if doc["over"]:
            break
        assert time.monotonic() < deadline, doc
        time.sleep(2)
    assert doc["job_id"] == job and doc["shared"] is True and doc["end"][0] == 0, doc
    assert [n for n, _ in doc["nodes"]] == ["rc-node1", "rc-node2"]
    assert [(r["cell"], r["repeat"], r["status"]) for r in doc["repeats"]] == [("2n1g-fp32-bs8", 1, "done")]
    text = repro(env, "status", str(run)).stdout
    assert f"job {job} " in text and "1 done, 0 running, 0 failed, 0 pending of 1 repeat(s)" in text

    logs = run / "cells" / "2n1g-fp32-bs8" / "r1"
    assert sorted(p.name for p in logs.iterdir()) == ["0-rc-node1.log", "1-rc-node2.log"]
    assert "##repro" not in (logs / "0-rc-node1.log").read_text()  # the agent's marks went to job/steps
    assert containers(cluster, run.name) == []

    report = repro(env, "report", str(run), timeout=300)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    row = next(ln for ln in report.stdout.splitlines() if ln.startswith("| 2 workers (2 nodes)"))
    assert float(row.split("|")[2]) > 0
    assert "1 repeat(s) done, 0 failed" in report.stdout
    assert not (run / "job" / "in").exists() and not (run / "job" / "run").exists()
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["scheduler"][0]["job_id"] == job and prov["scheduler"][0]["allocation"] == "detached"
    assert [(c["rank"], c["node"], c["exit_code"]) for c in prov["commands"]] == [
        (0, "rc-node1", 0), (1, "rc-node2", 0)]
    assert [n["image"]["digest"] for n in prov["nodes"]] == [up_digest(run)] * 2

    audit = repro(env, "audit", str(run), timeout=300)
    assert audit.returncode == 0, audit.stdout[-3000:]
    assert " 0 drift, " in audit.stdout and " 0 tampered " in audit.stdout
    # sealed now: read as any run directory, every cell of the target judged (the 1-node cell this run left out
    # is "not run": exit 8, as `repro report` of an attached `repro up --cells nodes=2` run)
    again = repro(env, "report", str(run))
    assert again.returncode == 8 and row in again.stdout and "Verdict: 1 not run, 1 measured of 2 cells." in again.stdout


def up_digest(run: Path) -> str:
    return json.loads((run / "job" / "submitted.json").read_text())["image"].partition("@")[2]
