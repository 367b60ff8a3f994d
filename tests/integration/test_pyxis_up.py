"""``repro up`` under the test cluster's Slurm with ``container: pyxis`` (scripts/test-cluster builds pyxis and
enroot), for real, across its 2 nodes:

- torch-rn50-cpu: the run's image is imported once per node (enroot's own "Fetching image manifest" line,
  counted in each node's import log), every cell step starts from that squashfs (pyxis imports nothing),
  each rank's output lands in its own log in the run directory, and at the end the squashfs is gone from
  both nodes and no enroot container of the job is left; the telemetry sampler's own job step samples both
  hosts' CPUs while the cell runs, into the repeat's telemetry files and summary (and the results store),
  and stops with the cell;
- mpi-rn50-cpu: the ranks start through Slurm's PMIx (``mpi: pmix``; Debian's Open MPI in the image is
  built against PMIx and has no PMI-2 client), from the image variant without the sshd layer;
- Ctrl-C while a cell runs: exit 130, the job cancelled, no enroot container or sampler left, the kept
  squashfs kept, the repeat pending, and ``--resume`` finishes it;
- a kept squashfs whose recorded digest is not the run's lock fails the run before any cell.
- paddle-rn50-cpu: each task's POD_IP from its own --multi-prog line, so every rank finds its own node's
  address (a rank given rank 0's environment would take itself for rank 0) and the replicas stay identical.

The session imports each image once: the torch run checks the removal at its end (``keep_image: no``); the
mpi runs keep their squashfs (``keep_image: yes``) in a folder of this session's own, removed at the end.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from cluster_helpers import cpu_summary, job_processes, repeat_files
from docs_examples import assert_cluster_example
from repro.nodes.telemetry import parse_stream

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slurm, pytest.mark.pyxis]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    """The login node's environment: enroot on the PATH srun passes to job steps, as a site installs it."""
    enroot_dir = str(Path(cluster["pyxis"]["enroot"]).parent)
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "SLURM_CONF": cluster["slurm_conf"], "PYTHONUNBUFFERED": "1",
            "PATH": f"{enroot_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@pytest.fixture(scope="module")
def image_dir(cluster: dict):
    """A node-local folder of this session's own (each node sees its own under the same path)."""
    name = f"repro-test-pyxis-{uuid.uuid4().hex[:8]}"
    yield f"{cluster['pyxis']['node_local']}/tmp/{name}"
    for node in cluster["nodes"]:
        shutil.rmtree(Path(cluster["work_dir"]) / "nodes" / node["name"] / "local" / "tmp" / name,
                      ignore_errors=True)


def on_node(cluster: dict, node: str, path: str) -> Path:
    """What ``path`` (under the node-local folder) is on ``node``, seen from here."""
    local = cluster["pyxis"]["node_local"]
    assert path.startswith(local + "/")
    return Path(cluster["work_dir"]) / "nodes" / node / "local" / path[len(local) + 1:]


def inventory(cluster: dict, folder: Path, image_dir: str, keep: bool, **more: str) -> Path:
    f = folder / f"hosts-{'keep' if keep else 'once'}.yaml"
    section = {"kind": "slurm", "partition": "debug", "time": "15", "container": "pyxis",
               "image_dir": image_dir, "keep_image": "yes" if keep else "no", **more}
    f.write_text(Path(cluster["hosts_file"]).read_text() + "scheduler: " + json.dumps(section) + "\n")
    return f


@pytest.fixture(scope="module")
def targets(cpu_torch: dict, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> dict[str, Path]:
    """torch-rn50-cpu and mpi-rn50-cpu on the session's cpu-torch base (its build is reused), on ports of their
    own; the torch cell runs 60 steps, long enough to be interrupted."""
    d = tmp_path_factory.mktemp("pyxis-targets")
    base = next(line for line in cpu_torch["manifest"].read_text().splitlines() if "base: {ref:" in line)
    out = {}
    for key, name, port in (("torch", "torch-rn50-cpu", "master_port: 29500"),
                            ("mpi", "mpi-rn50-cpu", "ssh_port: 12345")):
        text = (ROOT / "manifests" / f"{name}.yaml").read_text().replace(port, port[:-2] + "88")
        path = d / f"{name}.yaml"
        path.write_text("\n".join(base if "base: {ref:" in ln else ln for ln in text.splitlines()) + "\n")
        subprocess.run([sys.executable, "-m", "repro", "lock", str(path)], check=True, capture_output=True,
                       cwd=ROOT, env=env)
        out[key] = path
    return out


def up(target: Path, hosts: Path, out: Path, cluster: dict, env: dict[str, str], *more: str,
       timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "repro", "up", str(target), "--hosts", str(hosts), "--out", str(out),
            "--cells", "nodes=2", "--repeats", "1", "--wheels", str(WHEELS),
            "--push", f"{cluster['registry']}/repro-test", *(["--ca-bundle", str(CA)] if CA.is_file() else []),
            *more]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def run_dir_of(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def enroot_containers(cluster: dict, job: str) -> list[str]:
    """The enroot containers pyxis made for ``job`` (``pyxis_JOB.STEP``) still on the nodes."""
    out = []
    for node in cluster["nodes"]:
        data = Path(cluster["work_dir"]) / "nodes" / node["name"] / "local" / "enroot" / "data" / "user-0"
        out += [f"{node['name']}:{p.name}" for p in data.glob(f"pyxis_{job}.*")] if data.is_dir() else []
    return out


def samplers_of(job: str) -> list[str]:
    """The telemetry sampler processes of Slurm job ``job`` still running (its source is in their argv)."""
    return job_processes(job, b"The telemetry sampler: one per node")


def iso(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def check_telemetry(run: Path, cell: str, job: str) -> None:
    """Both hosts sampled by the sampler's step from about the cell's start to its end, summarised beside the
    samples and in the results store, and no sampler of the job left."""
    rep = run / "cells" / cell / "r1"
    assert sorted(p.name for p in rep.glob("telemetry-*.txt")) == ["telemetry-rc-node1.txt", "telemetry-rc-node2.txt"]
    prov = json.loads((run / "provenance.json").read_text())
    step = next(s for s in prov["scheduler"][0]["steps"] if s["cell"] == cell)
    assert step["telemetry"]["sampled"] == ["rc-node1", "rc-node2"], step["telemetry"]
    assert step["telemetry"]["srun"][-4] == "<repro/nodes/sampler.py>"
    assert not any(a.startswith("--container") for a in step["telemetry"]["srun"])  # on the host itself
    ran = {c["node"]: c for c in prov["commands"] if c["cell"] == cell}
    saved = json.loads((rep / "telemetry.json").read_text())
    for node in ("rc-node1", "rc-node2"):
        path = rep / f"telemetry-{node}.txt"
        stream = parse_stream(node, path.open())
        assert stream.no_gpu and stream.gpu == [] and stream.containers == []
        assert len(stream.load) >= 3 and len(stream.stat) == len(stream.load)
        times = [float(ln.split()[1]) for ln in path.read_text().splitlines() if ln.startswith("loadavg ")]
        start, end = iso(ran[node]["started"]), iso(ran[node]["ended"])
        assert times[0] <= start + 2 and end - 3 <= times[-1] <= end + 1, (times[0], times[-1], start, end)
        assert saved[node]["cpu"]["samples"] == len(stream.load) and saved[node]["gpu"] is None
    with sqlite3.connect(f"file:{os.environ['REPRO_RESULTS']}?mode=ro", uri=True) as db:
        (stored,) = db.execute("SELECT c.telemetry FROM cells c JOIN runs r ON r.id = c.run WHERE r.run_id = ? "
                               "AND c.cell = ?", (run.name, cell)).fetchone()
    assert json.loads(stored)["cpu"]["samples"] == sum(saved[n]["cpu"]["samples"] for n in saved)
    assert samplers_of(job) == []


def imports_per_node(run: Path) -> dict[str, int]:
    """enroot's own line, once per import, in each node's image step log."""
    return {p.stem.split("-", 1)[1]: sum(1 for ln in p.read_text().splitlines()
                                         if ln.rstrip().endswith("Fetching image manifest"))
            for p in sorted((run / "image").glob("*.log"))}


def test_torch_two_nodes_one_import_per_node_and_nothing_left(cluster, env, targets, image_dir, tmp_path):
    hosts = inventory(cluster, tmp_path, image_dir, keep=False)
    done = up(targets["torch"], hosts, tmp_path / "runs", cluster, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 workers (2 nodes) |" in done.stdout and "| 2 workers (2 nodes) | —" not in done.stdout
    run = run_dir_of(tmp_path / "runs")
    assert imports_per_node(run) == {"rc-node1": 1, "rc-node2": 1}
    prov = json.loads((run / "provenance.json").read_text())
    alloc = prov["scheduler"][0]
    image = alloc["image"]
    digest = image["image"].rpartition("@")[2]
    assert [(n["node"], n["action"], n["digest"], n["enroot"]) for n in image["nodes"]] == [
        ("rc-node1", "imported", digest, "4.1.2"), ("rc-node2", "imported", digest, "4.1.2")]
    step = next(s for s in alloc["steps"] if s["cell"] == "2n1g-fp32-bs8")
    assert f"--container-image={image['file']}" in step["srun"]
    logs = run / "cells" / "2n1g-fp32-bs8" / "r1"
    assert sorted(p.name for p in logs.glob("*.log")) == ["0-rc-node1.log", "1-rc-node2.log"]
    srun_lines = logs / "srun-output.txt"  # srun's own lines, where it printed any
    assert not srun_lines.exists() or "pyxis: imported" not in srun_lines.read_text()
    # removed from both nodes at the end; no container of the job left
    for node in ("rc-node1", "rc-node2"):
        assert not on_node(cluster, node, image["file"]).exists()
    assert enroot_containers(cluster, alloc["job_id"]) == []
    check_telemetry(run, "2n1g-fp32-bs8", str(alloc["job_id"]))
    assert_cluster_example("pyxis-torch", done.stderr, done.stdout)
    assert_cluster_example("telemetry-pyxis", repeat_files(run, "2n1g-fp32-bs8", "rc-node2", 3, json.dumps(
        prov["scheduler"][0]["steps"][0]["telemetry"]), cpu_summary(run, "2n1g-fp32-bs8")))


def test_mpi_ranks_start_through_pmix_without_sshd(cluster, env, targets, image_dir, tmp_path):
    hosts = inventory(cluster, tmp_path, image_dir, keep=True, mpi="pmix")
    done = up(targets["mpi"], hosts, tmp_path / "runs", cluster, env)
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir_of(tmp_path / "runs")
    assert json.loads((run / "manifest.lock.json").read_text())["variant"] == "pmi"
    prov = json.loads((run / "provenance.json").read_text())
    assert [n["image"]["labels"]["repro.mpi.variant"] for n in prov["nodes"]] == ["pmi", "pmi"]
    step = next(s for s in prov["scheduler"][0]["steps"] if s["cell"] == "2n1g-fp32-bs8")
    assert step["srun"][:2] == ["srun", "--mpi=pmix"] and "mpirun" not in step["srun"]
    # before the first MPI step, a task in each node's container saw the PMIx server
    assert prov["scheduler"][0]["pmi"] == {"mpi": "pmix", "seen_on": ["rc-node1", "rc-node2"]}
    head = (run / "cells" / "2n1g-fp32-bs8" / "r1" / "0-rc-node1.log").read_text()
    assert "rank 0 of 2" in head, head[-2000:]
    assert "rank 1 of 2" in (run / "cells" / "2n1g-fp32-bs8" / "r1" / "1-rc-node2.log").read_text()
    assert_cluster_example("pyxis-mpi", done.stderr, done.stdout)


def test_ctrl_c_cancels_the_job_leaves_no_container_and_resumes(cluster, env, targets, image_dir, tmp_path):
    """On the squashfs the mpi test kept (no second import in the session): Ctrl-C while the cell runs."""
    hosts = inventory(cluster, tmp_path, image_dir, keep=True, mpi="pmix")
    argv = [sys.executable, "-m", "repro", "up", str(targets["mpi"]), "--hosts", str(hosts), "--out",
            str(tmp_path / "runs"), "--json-logs", "--cells", "nodes=2", "--repeats", "1", "--wheels", str(WHEELS),
            "--push", f"{cluster['registry']}/repro-test", *(["--ca-bundle", str(CA)] if CA.is_file() else [])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    job, lines = None, []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        ev = json.loads(line) if line.startswith("{") else {}
        text = ev.get("message") or ""
        if text.startswith("Slurm job ") and job is None:
            job = text.split()[2].rstrip(":")
        if text.startswith("image ready"):  # the image on both nodes, the cell's step starting
            assert "reused" in text and "imported" not in text, text
            break
    else:
        raise AssertionError("".join(lines[-20:]))
    time.sleep(20)  # pyxis makes the step's containers
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    state = subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True, text=True, env=env,
                           timeout=30).stdout
    assert "JobState=CANCELLED" in state
    run = run_dir_of(tmp_path / "runs")
    status = json.loads((run / "state.json").read_text())["cells"]["2n1g-fp32-bs8"]["repeats"]["1"]
    assert (status["status"], status["why"]) == ("pending", "interrupted")
    assert enroot_containers(cluster, str(job)) == []
    assert samplers_of(str(job)) == []
    sampled = run / "cells" / "2n1g-fp32-bs8" / "r1" / "telemetry-rc-node1.txt"  # until the interruption
    assert parse_stream("rc-node1", sampled.open()).load, sampled.read_text()[-2000:]
    for node in ("rc-node1", "rc-node2"):  # kept, as asked
        assert on_node(cluster, node, f"{image_dir}/repro-mpi-rn50-cpu.sqsh").is_file()
    done = subprocess.run([sys.executable, "-m", "repro", "up", "--resume", str(run), "--cells", "nodes=2",
                           "--repeats", "1", "--wheels", str(WHEELS), "--push", f"{cluster['registry']}/repro-test",
                           *(["--ca-bundle", str(CA)] if CA.is_file() else [])],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 workers (2 nodes) |" in done.stdout and "| 2 workers (2 nodes) | —" not in done.stdout


def test_a_kept_image_of_another_digest_fails_the_run(cluster, env, targets, image_dir, tmp_path):
    """The squashfs the mpi test kept, its record on one node changed to another digest."""
    hosts = inventory(cluster, tmp_path, image_dir, keep=True)
    kept = on_node(cluster, "rc-node2", f"{image_dir}/repro-mpi-rn50-cpu.sqsh.digest")
    if not kept.exists():
        pytest.fail("the mpi test keeps the squashfs this test changes (run them together)")
    real = kept.read_text()
    kept.write_text("sha256:" + "0" * 64 + "\n")
    try:
        done = up(targets["mpi"], hosts, tmp_path / "runs", cluster, env)
    finally:
        kept.write_text(real)
    assert done.returncode != 0
    assert (f"rc-node2: {image_dir}/repro-mpi-rn50-cpu.sqsh holds sha256:{'0' * 64} (imported earlier and "
            f"kept), the run locks {real.strip()}") in done.stderr, done.stderr[-2000:]
    assert "rc-node1:" not in done.stderr.split("enroot):")[1].split("hint:")[0]
    assert "Traceback" not in done.stderr
    recorded = yaml.safe_load((run_dir_of(tmp_path / "runs") / "hosts.yaml").read_text())
    assert recorded["scheduler"]["keep_image"] == "yes"


@pytest.fixture(scope="module")
def paddle_target(cpu_torch: dict, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Path:
    """paddle-rn50-cpu on the session's pinned base, 10 steps of 2 32x32 images, its lock made."""
    base = next(line for line in cpu_torch["manifest"].read_text().splitlines() if "base: {ref:" in line)
    text = (ROOT / "manifests" / "paddle-rn50-cpu.yaml").read_text(encoding="utf-8")
    for old, new in {'--steps, "15"': '--steps, "10"', '--image-size, "64"': '--image-size, "32"',
                     "batch_size: [8]": "batch_size: [2]"}.items():
        assert text.count(old) == 1, f"the shipped manifest changed: {old!r}"
        text = text.replace(old, new)
    path = tmp_path_factory.mktemp("pyxis-paddle") / "paddle-rn50-cpu.yaml"
    path.write_text("\n".join(base if "base: {ref:" in ln else ln for ln in text.splitlines()) + "\n")
    subprocess.run([sys.executable, "-m", "repro", "lock", str(path)], check=True, capture_output=True,
                   cwd=ROOT, env=env)
    return path


def test_paddle_ranks_each_get_their_own_address(cluster, env, paddle_target, image_dir, tmp_path):
    """Each task's POD_IP comes from its own --multi-prog line: every rank finds its node's address in --ips
    (a rank given the first rank's environment would take itself for rank 0)."""
    hosts = inventory(cluster, tmp_path, image_dir, keep=False)
    done = up(paddle_target, hosts, tmp_path / "runs", cluster, env)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = run_dir_of(tmp_path / "runs") / "cells" / "2n1g-fp32-bs2" / "r1"
    checksums = []
    for rank, node in enumerate(cluster["nodes"]):
        log = (logs / f"{rank}-{node['name']}.log").read_text(encoding="utf-8")
        assert f"rank {rank} of 2 on {node['name']}, endpoint {node['address']}:" in log, log[-3000:]
        checksums += re.findall(rf"^rank {rank} of 2: parameter checksum (\S+)$", log, re.MULTILINE)
    assert len(checksums) == 2 and checksums[0] == checksums[1], "data parallelism keeps the replicas identical"
