"""``repro clean`` and stale containers, on the namespace nodes: a ``repro up`` killed with
SIGKILL (no cleanup can run) leaves its containers; ``repro up --resume`` removes the stale
ones of its run before it starts; ``repro clean RUN_DIR`` removes them on every node of the
run's inventory, reports per node, and a second clean finds nothing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "PYTHONUNBUFFERED": "1"}


def containers_of(cluster: dict, run_id: str) -> dict[str, list[str]]:
    out = {}
    for n in cluster["nodes"]:
        c = docker.DockerClient(base_url=n["docker_host"])
        out[n["name"]] = sorted(x.name for x in c.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"}))
        c.close()
    return out


def start_and_kill(cmd: list[str], env: dict[str, str], cluster: dict) -> tuple[Path, list[str]]:
    """Run ``repro`` until the containers of a 2-node cell exist, then SIGKILL it; the run dir and its events."""
    proc = subprocess.Popen([sys.executable, "-m", "repro", *cmd], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env=env, cwd=ROOT)
    assert proc.stderr is not None
    run_dir, lines = None, []
    deadline = time.monotonic() + 600
    try:
        for line in proc.stderr:
            lines.append(line)
            ev = json.loads(line) if line.startswith("{") else {}
            run_dir = ev.get("run_dir", run_dir)
            if ev.get("kind") == "cell" and run_dir:
                while time.monotonic() < deadline:  # both ranks' containers created
                    if all(containers_of(cluster, Path(run_dir).name).values()):
                        break
                    time.sleep(0.2)
                proc.send_signal(signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "".join(lines[-20:])
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(lines[-20:])
    assert run_dir, "".join(lines[-20:])
    return Path(run_dir), lines


def test_kill_9_leaves_containers_that_resume_and_clean_remove(cluster, cpu_torch, env, tmp_path):
    up = ["up", str(cpu_torch["manifest"]), "--hosts", cluster["hosts_file"], "--out", str(tmp_path), "--json-logs",
          "--wheels", str(WHEELS), "--cells", "nodes=2", "--repeats", "1"]
    run, _ = start_and_kill(up, env, cluster)
    left = containers_of(cluster, run.name)
    assert all(left.values()), left  # nothing could clean up after SIGKILL

    # a resumed run removes its stale containers before it starts (and is killed again)
    resume = ["up", "--resume", str(run), "--hosts", cluster["hosts_file"], "--json-logs", "--wheels", str(WHEELS),
              "--cells", "nodes=2", "--repeats", "1"]
    _, lines = start_and_kill(resume, env, cluster)
    stale = [json.loads(x) for x in lines if x.startswith("{") and "stale container" in x]
    assert sorted(e["node"] for e in stale) == ["rc-node1", "rc-node2"], "".join(lines[-20:])
    for e in stale:  # each rank's container, and the node's telemetry sampler where it had started
        named = sorted(e["message"].split(": ", 1)[1].split(", "))
        assert named == left[e["node"]], e["message"]
        assert f"removed {len(named)} stale container(s) of this run: " in e["message"]
    second = containers_of(cluster, run.name)
    assert all(second.values())  # the second attempt's, killed in turn

    # repro clean RUN_DIR: the run's recorded inventory, every node, one line each
    done = subprocess.run([sys.executable, "-m", "repro", "clean", str(run), "--format", "json"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(r["node"], sorted(r["removed"]), r["error"]) for r in report] == [
        ("rc-node1", second["rc-node1"], None), ("rc-node2", second["rc-node2"], None)]
    assert containers_of(cluster, run.name) == {"rc-node1": [], "rc-node2": []}

    again = subprocess.run([sys.executable, "-m", "repro", "clean", str(run)], capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=300)
    assert (again.returncode, again.stdout) == (0, "rc-node1: nothing to remove\nrc-node2: nothing to remove\n")


def test_clean_run_removes_the_runs_probe_containers(cluster, cpu_torch, env):
    """The image probe ``repro up`` starts on each node carries the run id: ``repro clean RUN_ID`` finds it
    while it runs (as after a kill -9) and removes it; the probe then reports why it has no document."""
    import threading

    from repro.nodes.facts import probe_container
    from repro.run.rundir import make_run_id

    run_id = make_run_id("clean-probe")
    node = cluster["nodes"][0]
    client = docker.DockerClient(base_url=node["docker_host"])
    out: dict = {}
    probe = threading.Thread(target=lambda: out.update(p=probe_container(client, cpu_torch["image"], run_id=run_id)))
    probe.start()
    try:
        deadline = time.monotonic() + 120
        while not containers_of(cluster, run_id)[node["name"]]:
            assert probe.is_alive() and time.monotonic() < deadline, out
            time.sleep(0.05)
        labels = client.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"})[0].labels
        assert labels["repro.probe"] == "container"
        done = subprocess.run([sys.executable, "-m", "repro", "clean", run_id, "--hosts", cluster["hosts_file"],
                               "--format", "json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stderr
        assert [(r["node"], len(r["removed"])) for r in json.loads(done.stdout)] == [("rc-node1", 1), ("rc-node2", 0)]
    finally:
        probe.join(timeout=300)
        client.close()
    assert out["p"]["value"] is None and out["p"]["reason"], out
    assert containers_of(cluster, run_id) == {"rc-node1": [], "rc-node2": []}


def test_a_container_removed_while_clean_lists_them_is_skipped(cluster: dict, engine: docker.DockerClient) -> None:
    """docker-py's ``containers.list`` inspects each container it listed; one removed in between (the run's own
    cleanup, another ``repro clean``) must not fail the clean: the race that flaked CI, made certain here by
    removing the first listed container just before its inspection."""
    from repro.run.clean import remove_containers

    run_id = f"race{os.getpid()}"
    made = [engine.containers.create(cluster["base_image_local"], ["true"], entrypoint=[],
                                     labels={"repro.run": run_id}, name=f"{run_id}-{i}").name for i in (0, 1)]
    other = docker.DockerClient(base_url=cluster["docker_host"])
    client = docker.DockerClient(base_url=cluster["docker_host"])
    inspect, gone = client.api.inspect_container, []

    def inspect_after_removal(container: str) -> dict:
        if not gone:
            other.containers.get(container).remove(force=True)
            gone.append(container)
        return inspect(container)

    client.api.inspect_container = inspect_after_removal
    try:
        removed = remove_containers(client, run_id)
        assert len(gone) == 1 and len(removed) == 1 and removed[0] in made, removed
        assert engine.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"}) == []
    finally:
        for name in made:
            with contextlib.suppress(docker.errors.NotFound):
                engine.containers.get(name).remove(force=True)
        other.close()
        client.close()
