"""``repro up`` under the test cluster's real Slurm (scripts/test-cluster: slurmctld on the bridge,
one slurmd per namespace node, each node's own Docker engine), with ``container: docker``.

- torch-rn50-cpu across 2 nodes: Slurm's time limit ends the job while the cell runs -> the
  repeat is recorded as stopped by Slurm (TIMEOUT), no container is left, and --resume
  finishes it in a new allocation; both allocations are in the provenance.
- mpi-rn50-cpu across 2 nodes (mpirun inside the allocation): Ctrl-C while the cell runs ->
  exit 130, the job is cancelled, no container is left; --resume finishes the cell.
- bad input (unknown partition, too few nodes, a time limit shorter than a repeat, pyxis
  without the plugin (a slurm.conf with an empty plugin stack), Slurm down): a clear error and
  nothing submitted.

The image is the one the session's cpu_torch fixture built (the same as tests/integration/test_up.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
import yaml

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "SLURM_CONF": cluster["slurm_conf"], "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def inventory(cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's SSH inventory (preflight, images, provenance) with a Slurm section."""
    f = tmp_path_factory.mktemp("slurm") / "hosts.yaml"
    f.write_text(Path(cluster["hosts_file"]).read_text()
                 + "scheduler: {kind: slurm, partition: debug, time: 15, container: docker}\n")
    return f


@pytest.fixture(scope="module")
def targets(cpu_torch: dict, cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """torch-rn50-cpu and mpi-rn50-cpu on the fixture's base and image recipe (so its build is reused), on ports
    of their own: other tests may run the same targets on these nodes over SSH at the same time."""
    d = tmp_path_factory.mktemp("slurm-targets")
    base = next(line for line in cpu_torch["manifest"].read_text().splitlines() if "base: {ref:" in line)
    out = {}
    for key, name, port in (("torch", "torch-rn50-cpu", "master_port: 29500"), ("mpi", "mpi-rn50-cpu", "ssh_port: 12345")):
        text = (ROOT / "manifests" / f"{name}.yaml").read_text().replace(port, port[:-2] + "77")
        if key == "torch":  # a cell that outlasts the one-minute time limit the time-limit test sets
            assert text.count('--prof, "10"') == 1
            text = text.replace('--prof, "10"', '--prof, "60"')
        lines = text.splitlines()
        path = d / f"{name}.yaml"
        path.write_text("\n".join(base if "base: {ref:" in ln else ln for ln in lines) + "\n")
        subprocess.run([sys.executable, "-m", "repro", "lock", str(path)], check=True, capture_output=True, cwd=ROOT,
                       env={**os.environ, "DOCKER_HOST": cluster["docker_host"]})
        out[key] = path
    return out


def slurm(env: dict[str, str], *args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, env=env, check=True, timeout=30).stdout


def jobs(env: dict[str, str]) -> dict[str, str]:
    """Every job slurmctld knows (running or ended within MinJobAge): id -> state."""
    out = slurm(env, "scontrol", "show", "jobs", "-o")
    return {f["JobId"]: f["JobState"] for f in (dict(t.split("=", 1) for t in ln.split() if "=" in t)
                                                for ln in out.splitlines() if ln.startswith("JobId="))}


def containers(cluster: dict, **labels: str) -> list[str]:
    out = []
    for n in cluster["nodes"]:
        c = docker.DockerClient(base_url=n["docker_host"])
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        out += [f"{n['name']}:{x.name}:{x.status}" for x in c.containers.list(all=True, ignore_removed=True, filters=filters)]
        c.close()
    return out


def build_args(cluster: dict) -> list[str]:
    return ["--wheels", str(WHEELS), "--push", f"{cluster['registry']}/repro-test",
            *(["--ca-bundle", str(CA)] if CA.is_file() else [])]


def up_argv(target: Path, inventory: Path, out: Path, cluster: dict) -> list[str]:
    return [sys.executable, "-m", "repro", "up", str(target), "--hosts", str(inventory), "--out", str(out),
            "--json-logs", "--cells", "nodes=2", "--repeats", "1", *build_args(cluster)]


def resume(run: Path, inventory: Path, cluster: dict, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """--resume with the inventory the run directory recorded: its scheduler section brings Slurm back."""
    recorded = yaml.safe_load((run / "hosts.yaml").read_text())
    assert recorded["scheduler"] == {"kind": "slurm", "partition": "debug", "time": "15", "container": "docker"}
    return subprocess.run([sys.executable, "-m", "repro", "up", "--resume", str(run),
                           "--cells", "nodes=2", "--repeats", "1", *build_args(cluster)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)


class Up:
    """A running `repro up`: its JSON progress read as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=ROOT)
        self.events: list[dict] = []
        self.job: str | None = None

    def until(self, predicate, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            self.events.append(ev)
            text = ev.get("message") or ev.get("text") or ""
            if text.startswith("Slurm job ") and self.job is None:
                self.job = text.split()[2].rstrip(":")
            if predicate(ev):
                return ev
        raise AssertionError(f"no such event in {timeout} s; last: {self.events[-5:]}")

    def finish(self, timeout: float) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


def run_dir_of(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def statuses(run: Path) -> dict:
    state = json.loads((run / "state.json").read_text())
    return {k: {n: (r["status"], r["why"]) for n, r in c["repeats"].items()}
            for k, c in state["cells"].items()}


def wait_for_containers(cluster: dict, target: str, n: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([c for c in containers(cluster, **{"repro.target": target}) if c.endswith(":running")]) >= n:
            return
        time.sleep(0.5)
    raise AssertionError(f"{target}: {n} running containers did not appear")


def test_time_limit_kill_is_recorded_and_resumes(cluster, env, inventory, targets, tmp_path):
    up = Up(up_argv(targets["torch"], inventory, tmp_path, cluster), env)
    up.until(lambda e: e.get("kind") == "cell", 600)
    job = up.job
    assert job and jobs(env)[job] == "RUNNING"
    wait_for_containers(cluster, "torch-rn50-cpu", 2)
    # the scheduler's own time limit: one minute, already reached or reached within the minute
    slurm(env, "scontrol", "update", f"JobId={job}", "TimeLimit=1")
    rc, _, err = up.finish(180)
    assert rc != 0 and f"Slurm ended job {job} (TIMEOUT)" in err, err[-2000:]
    assert "repro up --resume" in err
    assert jobs(env)[job] == "TIMEOUT"
    run = run_dir_of(tmp_path)
    assert containers(cluster, **{"repro.run": run.name}) == []
    status, why = statuses(run)["2n1g-fp32-bs8"]["1"]
    assert status == "pending" and why.startswith(f"stopped: Slurm ended job {job} (TIMEOUT) while cell 2n1g-fp32-bs8 ran")
    assert json.loads((run / "state.json").read_text())["cells"]["2n1g-fp32-bs8"]["repeats"]["1"]["attempts"] == 1

    before = set(jobs(env))
    done = resume(run, inventory, cluster, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 workers (2 nodes) |" in done.stdout and "| 2 workers (2 nodes) | —" not in done.stdout
    second = set(jobs(env)) - before
    assert len(second) == 1 and jobs(env)[second.pop()] == "CANCELLED"  # released at the end of the run
    prov = json.loads((run / "provenance.json").read_text())
    assert [a["job_id"] for a in prov["scheduler"]][0] == job and len(prov["scheduler"]) == 2
    for a in prov["scheduler"]:
        assert a["partition"] == "debug" and a["nodes"] == ["rc-node1", "rc-node2"]
        assert (run / f"slurm-{a['job_id']}.sbatch").read_text() == a["sbatch_script"]
        assert "#SBATCH --time=15\n" in a["sbatch_script"]
    assert sorted(p.name for p in (run / "cells" / "2n1g-fp32-bs8" / "r1").glob("*.log")) == [
        "0-rc-node1.log", "1-rc-node2.log"]
    assert containers(cluster, **{"repro.run": run.name}) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_mpi_ctrl_c_or_kill_cancels_the_job_and_resumes(cluster, env, inventory, targets, tmp_path, sig):
    up = Up(up_argv(targets["mpi"], inventory, tmp_path, cluster), env)
    up.until(lambda e: e.get("kind") == "cell", 600)
    job = up.job
    wait_for_containers(cluster, "mpi-rn50-cpu", 2)
    up.proc.send_signal(sig)
    rc, _, err = up.finish(120)
    assert rc == 128 + sig, err[-2000:]
    assert jobs(env)[job] == "CANCELLED"
    run = run_dir_of(tmp_path)
    assert containers(cluster, **{"repro.run": run.name}) == []
    assert statuses(run)["2n1g-fp32-bs8"]["1"] == ("pending", "interrupted")

    done = resume(run, inventory, cluster, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 workers (2 nodes) |" in done.stdout and "| 2 workers (2 nodes) | —" not in done.stdout
    head = (run / "cells" / "2n1g-fp32-bs8" / "r1" / "0-rc-node1.log").read_text()
    assert "rank 1 of 2" in head and "slurmstepd" not in head
    assert "Server listening on 10.77.0.12" in (run / "cells" / "2n1g-fp32-bs8" / "r1" / "1-rc-node2.log").read_text()
    assert containers(cluster, **{"repro.run": run.name}) == []


def without_pyxis(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The cluster as a login node without pyxis sees it: its slurm.conf with an empty plugin stack
    (the test cluster installs pyxis; srun reads PlugStackConfig)."""
    empty = tmp_path / "plugstack-empty.conf"
    empty.write_text("")
    conf = tmp_path / "slurm.conf"
    conf.write_text(Path(env["SLURM_CONF"]).read_text() + f"PlugStackConfig={empty}\n")
    return {**env, "SLURM_CONF": str(conf)}


@pytest.mark.parametrize("scheduler,message,hint", [
    ("slurm:partition=nope", "--scheduler partition: no partition 'nope' in this cluster (it has: debug)",
     "hint: set scheduler.partition"),
    ("slurm:time=5", "--scheduler time: 5 (300 s) is shorter than one repeat of torch-rn50-cpu may take "
     "(launch.timeout_s 900 s)", "hint: give at least time=15 (minutes)"),
    ("slurm:container=pyxis", "--scheduler container: pyxis, but `srun --help` here shows no --container-image",
     "hint: use container: docker"),
    # sbatch --test-only judges what only Slurm knows (accounts where accounting is enforced, features, limits)
    ("slurm:constraint=v100,time=20", "--scheduler constraint: Slurm refuses the job: allocation failure: "
     "Invalid feature specification", "nothing was submitted"),
])
def test_bad_slurm_settings_submit_nothing(cluster, env, tmp_path, scheduler, message, hint):
    env = without_pyxis(env, tmp_path) if "pyxis" in scheduler else env
    inv = tmp_path / "hosts.yaml"
    inv.write_text("schema_version: 1\nscheduler: {kind: slurm}\n")
    before = jobs(env)
    proc = subprocess.run([sys.executable, "-m", "repro", "up", "torch-rn50-cpu", "--hosts", str(inv),
                           "--scheduler", scheduler, "--out", str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {message}") and hint in proc.stderr and "Traceback" not in proc.stderr
    assert set(jobs(env)) <= set(before) and not any(tmp_path.glob("*/state.json"))


def three_node_target(tmp_path: Path) -> Path:
    """torch-rn50-cpu with a 3-node cell: more nodes than the test cluster's partition has."""
    manifest = tmp_path / "three.yaml"
    manifest.write_text((ROOT / "manifests" / "torch-rn50-cpu.yaml").read_text().replace("nodes: [1, 2]",
                                                                                          "nodes: [1, 3]"))
    return manifest


def test_too_few_nodes_in_the_partition(cluster, env, tmp_path):
    manifest = three_node_target(tmp_path)
    inv = tmp_path / "hosts.yaml"
    inv.write_text("schema_version: 1\nscheduler: {kind: slurm, partition: debug, time: '1:00:00'}\n")
    before = jobs(env)
    proc = subprocess.run([sys.executable, "-m", "repro", "up", str(manifest), "--hosts", str(inv)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {inv}: scheduler.partition: the matrix needs 3 nodes, partition debug has 2",
        "hint: choose a larger partition, or filter the cells: --cells nodes=2"]
    assert set(jobs(env)) <= set(before)


def test_slurm_down_is_an_environment_error(cluster, env, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(Path(cluster["slurm_conf"]).read_text() + "SlurmctldPort=6899\n")  # nobody listens there
    inv = tmp_path / "hosts.yaml"
    inv.write_text("schema_version: 1\nscheduler: {kind: slurm}\n")
    proc = subprocess.run([sys.executable, "-m", "repro", "up", "torch-rn50-cpu", "--hosts", str(inv)],
                          capture_output=True, text=True, env={**env, "SLURM_CONF": str(conf)}, cwd=ROOT, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("error: Slurm does not answer: Slurmctld(primary) at ")
    assert proc.stderr.splitlines()[0].endswith(" is DOWN")
    assert "hint: start slurmctld, or set SLURM_CONF to this cluster's slurm.conf" in proc.stderr


def preflight(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", "preflight", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120, check=False)


def test_preflight_runs_as_a_job_step_on_a_short_allocation(cluster, env, tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("schema_version: 1\nenv: {GLOO_SOCKET_IFNAME: eth0}\nscheduler: {kind: slurm, partition: debug}\n")
    before = jobs(env)
    proc = preflight(env, "torch-rn50-cpu", "--hosts", str(inv), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [n["node"] for n in report["nodes"]] == ["rc-node1", "rc-node2"]
    assert [n["address"] for n in report["nodes"]] == ["10.77.0.11", "10.77.0.12"]
    for n in report["nodes"]:  # the full probe, from inside the job step on that node
        assert n["ssh"] == {"value": None, "reason": None, "detail": "srun"}
        assert n["docker"]["value"] and n["docker"]["reason"] is None
        assert n["disk"]["value"] > 0 and n["interfaces"]["value"] and "eth0" in n["interfaces"]["value"]
        assert abs(n["clock"]["value"]) < 1
    assert report["problems"] == []
    new = {j: s for j, s in jobs(env).items() if j not in before}
    assert list(new.values()) == ["CANCELLED"]  # the short allocation, released
    job = slurm(env, "scontrol", "show", "job", "-o", next(iter(new)))
    assert "JobName=repro-preflight " in job and "TimeLimit=00:05:00 " in job and "NumNodes=2 " in job


def test_preflight_inside_an_allocation_uses_it(cluster, env, tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("schema_version: 1\nscheduler: {kind: slurm}\n")
    job = slurm(env, "sbatch", "--parsable", "--nodes=2", "--job-name=repro-test-holder", "--output=/dev/null",
                "--wrap", "sleep 300").strip()
    try:
        deadline = time.monotonic() + 30
        while jobs(env)[job] != "RUNNING":
            assert time.monotonic() < deadline, jobs(env)[job]
            time.sleep(0.2)
        before = jobs(env)
        proc = preflight({**env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "rc-node[1-2]"}, "--hosts", str(inv))
        assert proc.returncode == 0, proc.stderr
        assert f"inside Slurm allocation {job} (rc-node[1-2])" in proc.stderr
        rows = proc.stdout.splitlines()[2:4]
        assert [r.split()[:2] for r in rows] == [["rc-node1", "srun"], ["rc-node2", "srun"]]
        assert set(jobs(env)) == set(before) and jobs(env)[job] == "RUNNING"  # nothing submitted, the allocation kept
    finally:
        slurm(env, "scancel", job)


@pytest.mark.parametrize("scheduler,message", [
    ("slurm:partition=nope", "--scheduler partition: no partition 'nope' in this cluster (it has: debug)"),
    ("slurm:constraint=v100", ("--scheduler constraint: Slurm refuses the job: allocation failure: "
                               "Invalid feature specification")),
    ("slurm:container=pyxis", "--scheduler container: pyxis, but `srun --help` here shows no --container-image"),
])
def test_preflight_bad_slurm_settings_submit_nothing(cluster, env, tmp_path, scheduler, message):
    env = without_pyxis(env, tmp_path) if "pyxis" in scheduler else env
    inv = tmp_path / "hosts.yaml"
    inv.write_text("schema_version: 1\nscheduler: {kind: slurm}\n")
    before = jobs(env)
    proc = preflight(env, "torch-rn50-cpu", "--hosts", str(inv), "--scheduler", scheduler)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {message}"), proc.stderr
    # no job submitted (an earlier test's job may end meanwhile)
    assert "Traceback" not in proc.stderr and set(jobs(env)) <= set(before)


def test_preflight_too_few_nodes_and_slurm_down(cluster, env, tmp_path):
    manifest = three_node_target(tmp_path)
    inv = tmp_path / "hosts.yaml"
    inv.write_text("schema_version: 1\nscheduler: {kind: slurm, partition: debug}\n")
    before = jobs(env)
    proc = preflight(env, str(manifest), "--hosts", str(inv))
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: {inv}: scheduler.partition: the matrix needs 3 nodes, partition debug has 2",
        "hint: choose a larger partition, or filter the cells: --cells nodes=2"], proc.stderr
    assert set(jobs(env)) <= set(before)
    conf = tmp_path / "slurm.conf"
    conf.write_text(Path(cluster["slurm_conf"]).read_text() + "SlurmctldPort=6899\n")  # nobody listens there
    proc = preflight({**env, "SLURM_CONF": str(conf)}, "--hosts", str(inv))
    assert proc.returncode == 3 and proc.stderr.startswith("error: Slurm does not answer: "), proc.stderr
    assert "Traceback" not in proc.stderr


def test_node_failure_is_recorded_and_resumes(cluster, env, inventory, targets, tmp_path):
    up = Up(up_argv(targets["mpi"], inventory, tmp_path, cluster), env)
    up.until(lambda e: e.get("kind") == "cell", 600)
    job = up.job
    # the image was ready before Slurm was asked for nodes: no allocation is held while it is built
    messages = [e.get("message", "") for e in up.events]
    ready = next(i for i, m in enumerate(messages) if m.startswith("repro/cpu-torch-mpi") and " engine(s)" in m)
    assert ready < next(i for i, m in enumerate(messages) if m.startswith(f"Slurm job {job}: waiting"))
    wait_for_containers(cluster, "mpi-rn50-cpu", 2)
    try:
        slurm(env, "scontrol", "update", "NodeName=rc-node2", "State=DOWN", "Reason=repro-test-node-failure")
        rc, _, err = up.finish(180)
    finally:  # the node back in service (the cluster's ReturnToService=2 may have done it already: then refused)
        subprocess.run(["scontrol", "update", "NodeName=rc-node2", "State=RESUME"], env=env, capture_output=True,
                       timeout=30, check=False)
    assert rc != 0 and f"Slurm ended job {job} (NODE_FAIL)" in err, err[-2000:]
    assert jobs(env)[job] == "NODE_FAIL"
    run = run_dir_of(tmp_path)
    assert containers(cluster, **{"repro.run": run.name}) == []
    status, why = statuses(run)["2n1g-fp32-bs8"]["1"]
    assert status == "pending" and why.startswith(f"stopped: Slurm ended job {job} (NODE_FAIL) while cell")
    deadline = time.monotonic() + 60
    while "idle" not in slurm(env, "sinfo", "-h", "-n", "rc-node2", "-o", "%T"):
        assert time.monotonic() < deadline, slurm(env, "sinfo", "-h", "-n", "rc-node2", "-o", "%T")
        time.sleep(0.5)
    done = resume(run, inventory, cluster, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 workers (2 nodes) |" in done.stdout and "| 2 workers (2 nodes) | —" not in done.stdout
    assert containers(cluster, **{"repro.run": run.name}) == []
