"""Telemetry during a real cell: ``repro up`` of torch-rn50-cpu on the namespace nodes samples every node's CPU
load while the cell runs, and the sampler goes with the cell, on a normal end and on Ctrl-C.

The nodes have no GPU, so the sampler finds no nvidia-smi and samples /proc alone (the GPU lines are
parsed in tests/test_telemetry.py from real captured nvidia-smi output).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import docker
import pytest
from cluster_helpers import cpu_summary, repeat_files
from docs_examples import assert_cluster_example

from repro.nodes.telemetry import parse_stream, summary

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def manifest(cluster: dict, cpu_torch: dict, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch-rn50-cpu as the session built it, on a port of its own (other runs may use these nodes meanwhile)
    and with 32-pixel images, a quarter of the work: the cell only has to run long enough to be sampled."""
    path = tmp_path_factory.mktemp("telemetry-target") / "torch-rn50-cpu.yaml"
    text = cpu_torch["manifest"].read_text()
    assert text.count("master_port: 29500") == 1 and text.count('--image-size, "64"') == 1
    path.write_text(text.replace("master_port: 29500", "master_port: 29561")
                    .replace('--image-size, "64"', '--image-size, "32"'))
    subprocess.run([sys.executable, "-m", "repro", "lock", str(path)], check=True, capture_output=True, cwd=ROOT,
                   env=env)
    return path


def up_argv(cluster: dict, manifest: Path, out: Path, *extra: str) -> list[str]:
    build = ["--wheels", str(WHEELS), "--push", f"{cluster['registry']}/repro-test"]
    build += ["--ca-bundle", str(CA)] if CA.is_file() else []
    return [sys.executable, "-m", "repro", "up", str(manifest), "--hosts", cluster["hosts_file"], "--out", str(out),
            "--json-logs", *build, *extra]


def left_on_nodes(cluster: dict, run_id: str) -> list[str]:
    """Every container of the run still on a node, samplers included (they carry the run's label)."""
    out = []
    for n in cluster["nodes"]:
        c = docker.DockerClient(base_url=n["docker_host"])
        out += [x.name for x in c.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"})]
        c.close()
    return out


def epochs(path: Path) -> list[float]:
    return [float(line.split()[1]) for line in path.read_text().splitlines() if line.startswith("loadavg ")]


def iso(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_every_node_samples_cpu_load_while_the_cell_runs_and_the_sampler_stops_with_it(cluster, manifest, env,
                                                                                         tmp_path):
    proc = subprocess.run(up_argv(cluster, manifest, tmp_path, "--cells", "nodes=2", "--repeats", "1"),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    rep = run / "cells" / "2n1g-fp32-bs8" / "r1"
    assert sorted(p.name for p in rep.glob("telemetry-*.txt")) == ["telemetry-rc-node1.txt", "telemetry-rc-node2.txt"]
    record = json.loads((run / "provenance.json").read_text())
    ran = {c["node"]: c for c in record["commands"] if c["cell"] == "2n1g-fp32-bs8"}
    for node in ("rc-node1", "rc-node2"):
        path = rep / f"telemetry-{node}.txt"
        stream = parse_stream(node, path.open())
        assert stream.no_gpu and stream.gpu == []
        assert len(stream.load) >= 3 and len(stream.stat) == len(stream.load)
        assert len(stream.containers) == 1  # the cell's container on that node, by id
        times = epochs(path)
        start, end = iso(ran[node]["started"]), iso(ran[node]["ended"])
        # sampled while the rank ran: from before its start (the sampler starts first) to about its end
        assert times[0] <= start + 2 and times[-1] >= end - 3 and times[-1] <= end + 5, (times, start, end)
    assert left_on_nodes(cluster, run.name) == []
    saved = json.loads((rep / "telemetry.json").read_text())
    assert saved["rc-node1"]["cpu"]["samples"] >= 3 and saved["rc-node1"]["gpu"] is None
    cell = summary(run, "2n1g-fp32-bs8")
    assert cell is not None and cell["cpu"]["load1_max"] > 0 and 0 < cell["cpu"]["busy_share"] <= 1
    assert cell["gpu"] is None
    assert_cluster_example("telemetry-ssh", repeat_files(run, "2n1g-fp32-bs8", "rc-node1", 7, cpu_summary(run, "2n1g-fp32-bs8")))


def test_ctrl_c_during_a_cell_leaves_no_sampler_on_any_node(cluster, manifest, env, tmp_path):
    proc = subprocess.Popen(up_argv(cluster, manifest, tmp_path, "--cells", "nodes=2", "--repeats", "1"),
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stderr is not None
    run_dir = None
    for line in proc.stderr:
        ev = json.loads(line) if line.startswith("{") else {}
        run_dir = ev.get("run_dir", run_dir)
        if ev.get("kind") == "cell":
            break
    rep = Path(run_dir) / "cells" / "2n1g-fp32-bs8" / "r1"
    node1 = rep / "telemetry-rc-node1.txt"
    for _ in range(100):  # until the sampler has written a few samples
        if node1.is_file() and len(epochs(node1)) >= 2:
            break
        proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert left_on_nodes(cluster, Path(run_dir).name) == []
    assert len(epochs(node1)) >= 2


def samplers_running() -> list[str]:
    """Sampler processes on this machine, where the namespace nodes' processes run too (its source is in
    its argv: ``python3 -c <source>``)."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if "The telemetry sampler: one per node" in line]


@pytest.mark.slurm
def test_under_slurm_the_agent_samples_beside_its_rank_and_stops_with_it(cluster, manifest, env, tmp_path):
    slurm_env = {**env, "SLURM_CONF": cluster["slurm_conf"]}
    out = tmp_path / "runs"
    proc = subprocess.run(up_argv(cluster, manifest, out, "--cells", "nodes=1", "--repeats", "1", "--scheduler",
                                  "slurm:partition=debug,time=15,container=docker"),
                          capture_output=True, text=True, env=slurm_env, cwd=ROOT, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = next(p for p in out.iterdir() if p.is_dir())
    rep = run / "cells" / "1n1g-fp32-bs8" / "r1"
    (path,) = rep.glob("telemetry-*.txt")  # the node Slurm gave
    node = path.name[len("telemetry-"):-len(".txt")]
    stream = parse_stream(node, path.open())
    assert stream.no_gpu and len(stream.load) >= 3 and len(stream.containers) == 1
    assert "##repro" not in (rep / f"0-{node}.log").read_text()  # the rank's log holds the rank's lines only
    assert json.loads((rep / "telemetry.json").read_text())[node]["cpu"]["samples"] == len(stream.load)
    assert samplers_running() == []
