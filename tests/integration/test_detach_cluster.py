"""``repro up --detach`` on the test cluster's real Slurm (scripts/test-cluster), ``container: docker`` and
``container: pyxis``.

torch-rn50-cpu's 2-node cell, its image pushed to the cluster's registry (``--push``): the submitting process
exits while the job is still queued or running; the job pulls the image by digest on both nodes, checks that
both see the run directory, runs the cell and writes everything into the run directory; ``repro status``
shows it done from the run directory alone; ``repro report RUN_DIR`` judges it and seals its provenance;
``repro audit`` verifies that. No container of the run is left on a node, and the job's inputs (the agent's
spec) are gone once it was judged.

Under ``container: pyxis`` (scripts/test-cluster builds pyxis and enroot), the same target and cell, 2
repeats: the job imports the image once on each node for the whole run (enroot's own "Fetching image
manifest" line, counted in each node's import log), both repeats start from that squashfs, the squashfs and
every enroot container of the job are gone at the end, and the sealed provenance holds what each node's
image step said (the digest it imported, its enroot).

The image is the one the session's cpu_torch fixture built; the manifest is a copy named for this test
(``detach-torch-rn50-cpu``: the Slurm job carries it) on ports of its own, since other tests may run the same
target on these nodes at the same time, at image size 32 (faster steps). The pyxis test imports the image
itself: it counts that import, which no other test's kept squashfs (named after its own target) can stand in for.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import shutil
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import docker
import pytest

from cluster_helpers import job_processes
from docs_examples import assert_cluster_example
from repro.nodes.telemetry import parse_stream

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
CA = Path("/etc/ssl/certs/ca-certificates.crt")
TARGET = "detach-torch-rn50-cpu"


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    """The login node's environment; where the cluster has pyxis, enroot on the PATH the job's steps get, as
    a site installs it."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    if cluster.get("pyxis"):
        path = f"{Path(cluster['pyxis']['enroot']).parent}:{path}"
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "SLURM_CONF": cluster["slurm_conf"], "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), "PATH": path}


@pytest.fixture(scope="module")
def target(cpu_torch: dict, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("detach-target")
    text = cpu_torch["manifest"].read_text()
    assert text.count("id: torch-rn50-cpu\n") == 1 and text.count("master_port: 29500") == 1
    assert text.count('--image-size, "64"') == 1
    path = d / f"{TARGET}.yaml"
    path.write_text(text.replace("id: torch-rn50-cpu\n", f"id: {TARGET}\n")
                    .replace("master_port: 29500", "master_port: 29566")
                    .replace('--image-size, "64"', '--image-size, "32"'))  # a quarter of the pixels: faster steps
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
        out += [f"{n['name']}:{x.name}" for x in c.containers.list(all=True, ignore_removed=True,
                                                                    filters={"label": f"repro.run={run_id}"})]
        c.close()
    return out


def submit(cluster: dict, env: dict[str, str], target: Path, tmp_path: Path, section: str,
           repeats: int = 1) -> tuple[str, Path]:
    """``repro up --detach`` of the 2-node cell with the hosts file's ``scheduler:`` ``section``: the job id
    and the run directory, once the submitting process exited."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(Path(cluster["hosts_file"]).read_text() + f"scheduler: {section}\n")
    out = tmp_path / "runs"
    up = repro(env, "up", str(target), "--hosts", str(inventory), "--detach", "--cells", "nodes=2", "--repeats",
               str(repeats), "--out", str(out), "--wheels", str(WHEELS),
               "--push", f"{cluster['registry']}/repro-test", *(["--ca-bundle", str(CA)] if CA.is_file() else []),
               timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    lines = up.stdout.splitlines()
    assert lines[0].startswith("submitted Slurm job ") and lines[1].startswith("run directory ")
    job, run = lines[0].split()[-1], Path(lines[1].split(" ", 2)[2])
    # the submitting process is gone; the job is not over yet (a 2-node torch cell takes tens of seconds)
    assert job_state(env, job) in ("PENDING", "CONFIGURING", "RUNNING"), job_state(env, job)
    assert run.parent == out and (run / "job" / "batch.sbatch").is_file()
    return job, run


def wait_over(env: dict[str, str], run: Path) -> dict:
    """``repro status RUN_DIR --format json`` until the job is over."""
    deadline = time.monotonic() + 1800  # the queue is shared with the other tests' jobs
    while True:
        status = repro(env, "status", str(run), "--format", "json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        if doc["over"]:
            return doc
        assert time.monotonic() < deadline, doc
        time.sleep(2)


def test_submit_walk_away_status_report_audit(cluster, env, target, tmp_path):
    job, run = submit(cluster, env, target, tmp_path, "{kind: slurm, partition: debug, time: 30, container: docker}")
    assert oct((run / "job" / "in" / "2n1g-fp32-bs8.json").stat().st_mode & 0o777) == "0o600"
    doc = wait_over(env, run)
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
    check_telemetry(run, "2n1g-fp32-bs8", 1, job)

    audit = repro(env, "audit", str(run), timeout=300)
    assert audit.returncode == 0, audit.stdout[-3000:]
    assert " 0 drift, " in audit.stdout and " 0 tampered " in audit.stdout
    # sealed now: read as any run directory, every cell of the target judged (the 1-node cell this run left out
    # is "not run": exit 8, as `repro report` of an attached `repro up --cells nodes=2` run)
    again = repro(env, "report", str(run))
    assert again.returncode == 8 and row in again.stdout and "Verdict: 1 not run, 1 measured of 2 cells." in again.stdout


def samplers_of(job: str) -> list[str]:
    """The telemetry sampler processes of Slurm job ``job`` still running (its script is in their argv)."""
    return job_processes(job, b"job/sampler.py")


def check_telemetry(run: Path, cell: str, repeats: int, job: str) -> None:
    """Each repeat's directory holds both hosts' samples from the sampler's job step until the cell's step
    ended, summarised beside them as the attached path does, the cell's summary in the results store, and no
    sampler of the job left."""
    prov = json.loads((run / "provenance.json").read_text())
    total = 0
    for r in range(1, repeats + 1):
        rep = run / "cells" / cell / f"r{r}"
        assert sorted(p.name for p in rep.glob("telemetry-*.txt")) == [
            "telemetry-rc-node1.txt", "telemetry-rc-node2.txt"]
        saved = json.loads((rep / "telemetry.json").read_text())
        ran = {c["node"]: c for c in prov["commands"] if c["cell"] == cell and c["repeat"] == r}
        for node in ("rc-node1", "rc-node2"):
            path = rep / f"telemetry-{node}.txt"
            stream = parse_stream(node, path.open())
            assert stream.no_gpu and stream.gpu == [] and len(stream.load) >= 3, path.read_text()[:2000]
            times = [float(ln.split()[1]) for ln in path.read_text().splitlines() if ln.startswith("loadavg ")]
            end = datetime.fromisoformat(ran[node]["ended"]).timestamp()  # the job's event: whole seconds
            assert end - 3 <= times[-1] <= end + 2, (times[0], times[-1], end)
            assert saved[node]["cpu"]["samples"] == len(stream.load) and saved[node]["gpu"] is None
            total += len(stream.load)
    with sqlite3.connect(f"file:{os.environ['REPRO_RESULTS']}?mode=ro", uri=True) as db:
        (stored,) = db.execute("SELECT c.telemetry FROM cells c JOIN runs r ON r.id = c.run WHERE r.run_id = ? "
                               "AND c.cell = ?", (run.name, cell)).fetchone()
    assert json.loads(stored)["cpu"]["samples"] == total
    assert samplers_of(job) == []


def up_digest(run: Path) -> str:
    return json.loads((run / "job" / "submitted.json").read_text())["image"].partition("@")[2]


@pytest.fixture
def image_dir(cluster: dict):
    """A node-local folder of this test's own (each node sees its own under the same path), removed after."""
    name = f"repro-test-detach-{uuid.uuid4().hex[:8]}"
    yield f"{cluster['pyxis']['node_local']}/tmp/{name}"
    for node in cluster["nodes"]:
        shutil.rmtree(node_path(cluster, node["name"], "tmp", name), ignore_errors=True)


def node_path(cluster: dict, node: str, *parts: str) -> Path:
    """A node's node-local folder, seen from here."""
    return Path(cluster["work_dir"]).joinpath("nodes", node, "local", *parts)


@pytest.mark.pyxis
def test_pyxis_walk_away_one_import_per_node(cluster, env, target, image_dir, tmp_path):
    section = json.dumps({"kind": "slurm", "partition": "debug", "time": "30", "container": "pyxis",
                          "image_dir": image_dir, "mpi": "pmix"})
    job, run = submit(cluster, env, target, tmp_path, section, repeats=2)
    assert oct((run / "job" / "in" / "2n1g-fp32-bs8.env").stat().st_mode & 0o777) == "0o600"
    doc = wait_over(env, run)
    assert doc["job_id"] == job and doc["shared"] is True and doc["end"][0] == 0, (
        doc, (run / "job" / f"batch-{job}.out").read_text()[-3000:])
    assert [(r["cell"], r["repeat"], r["status"]) for r in doc["repeats"]] == [
        ("2n1g-fp32-bs8", 1, "done"), ("2n1g-fp32-bs8", 2, "done")]
    assert_cluster_example("detached-pyxis-status", repro(env, "status", str(run)).stdout)
    # one import per node for the run: enroot's own line, once per import, in each node's image step log
    logs = sorted((run / "job" / "image").glob("*.log"))
    assert [p.name for p in logs] == ["0-rc-node1.log", "1-rc-node2.log"]
    assert [sum(ln.rstrip().endswith("Fetching image manifest") for ln in p.read_text().splitlines())
            for p in logs] == [1, 1]
    for r in (1, 2):  # each repeat's step started every rank from the squashfs, and pyxis imported nothing
        ranks = run / "cells" / "2n1g-fp32-bs8" / f"r{r}"
        assert sorted(p.name for p in ranks.glob("*.log")) == ["0-rc-node1.log", "1-rc-node2.log"]
        assert "pyxis: importing" not in (run / "job" / "steps" / "2n1g-fp32-bs8" / f"r{r}a1.srun").read_text()
    squashfs = f"{image_dir}/repro-{run.name}.sqsh"
    local = cluster["pyxis"]["node_local"]
    for node in ("rc-node1", "rc-node2"):  # removed from both nodes; no enroot container of the job left
        assert not node_path(cluster, node, squashfs[len(local) + 1:]).exists()
        data = node_path(cluster, node, "enroot", "data", "user-0")
        assert sorted(data.glob(f"pyxis_{job}[._]*")) == []

    report = repro(env, "report", str(run), timeout=300)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    row = next(ln for ln in report.stdout.splitlines() if ln.startswith("| 2 workers (2 nodes)"))
    assert float(row.split("|")[2].split()[0]) > 0 and "(median of 2)" in row  # e.g. "1.59 ±131.3% (median of 2)"
    assert "2 repeat(s) done, 0 failed" in report.stdout
    prov = json.loads((run / "provenance.json").read_text())
    alloc = prov["scheduler"][0]
    assert alloc["job_id"] == job and alloc["container"] == "pyxis"
    digest = up_digest(run)
    assert alloc["image"]["file"] == squashfs and alloc["image"]["kept"] is False
    assert [(n["node"], n["action"], n["digest"], n["enroot"]) for n in alloc["image"]["nodes"]] == [
        ("rc-node1", "imported", digest, "4.1.2"), ("rc-node2", "imported", digest, "4.1.2")]
    check_telemetry(run, "2n1g-fp32-bs8", 2, job)
    audit = repro(env, "audit", str(run), timeout=300)
    assert audit.returncode == 0, audit.stdout[-3000:]
