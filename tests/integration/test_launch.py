"""One cell on the real namespace nodes: containers through each node's own engine over SSH.

Covers the launch building block of ``repro up``: ranks and master filled per node,
output streamed to per-node logs, a failure / timeout / killed container stopping the
cell everywhere, argv safety, Ctrl-C, and every launcher kind for real on CPU: plain,
torch (gloo DDP with torchrun) and mpi (mpirun + per-run sshd); paddle in its own test.
No container may survive any test.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import pytest

from repro.spec.hosts import load_hosts
from repro.run.cell import CellJob
from repro.run.launch import CellFailed, launch_cell
from repro.spec.manifest import load_manifest

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
DATA = Path(__file__).resolve().parents[1] / "data" / "launch"


@pytest.fixture(scope="module")
def base_on_nodes(cluster: dict, clients) -> str:
    ref = f"{cluster['base_image']}@{cluster['base_digest']}"
    for c in clients.values():
        c.images.pull(ref)
    return ref


def leftovers(node_engines: list[docker.DockerClient], run_id: str) -> list[str]:
    return [c.name for e in node_engines for c in e.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"})]


def cell_of(manifest, **want):
    return next(c for c in manifest.cells() if c.matches(want))


def echo():
    return load_manifest(DATA / "echo.yaml")


def test_plain_two_nodes_ranks_logs_and_cleanup(hosts_file, clients, base_on_nodes, node_engines, tmp_path):
    m = echo()
    events = []
    results = launch_cell(CellJob(m, cell_of(m, nodes=2, precision="fp32"), load_hosts(hosts_file), tmp_path, run_id="t-plain",
                          clients=clients, image=base_on_nodes, on_event=events.append))
    assert [(r.rank, r.exit_code, r.ok) for r in results] == [(0, 0, True), (1, 0, True)]
    for r in results:
        assert Path(r.log).read_text() == (f"rank {r.rank} of 2, master 10.77.0.11, hosts 10.77.0.11,10.77.0.12\n"
                                           "done\n")
        assert r.tail[-1] == "done" and r.started and r.ended
    starts = sorted(e[2] for e in events if e[0] == "started")
    assert len(starts) == 2
    assert leftovers(node_engines, "t-plain") == []


def test_failure_on_one_node_stops_the_cell_everywhere(hosts_file, clients, base_on_nodes, node_engines, tmp_path):
    m = echo()
    t0 = time.monotonic()
    with pytest.raises(CellFailed) as e:
        launch_cell(CellJob(m, cell_of(m, nodes=2, precision="amp"), load_hosts(hosts_file), tmp_path, run_id="t-fail",
                    clients=clients, image=base_on_nodes))
    assert time.monotonic() - t0 < 30, "rank 0 sleeps 60 s; it must have been stopped"
    by_rank = {r.rank: r for r in e.value.results}
    assert by_rank[1].exit_code == 3 and by_rank[1].error is None
    assert by_rank[0].error == "stopped: the cell ended on another node"
    assert "rank 1 on rc-node2: exit code 3" in str(e.value)
    assert all(Path(r.log).read_text().startswith("start") for r in e.value.results), "logs written so far are kept"
    assert leftovers(node_engines, "t-fail") == []


def test_deadline_stops_the_cell(hosts_file, clients, base_on_nodes, node_engines, tmp_path):
    m = echo()
    with pytest.raises(CellFailed) as e:
        launch_cell(CellJob(m, cell_of(m, nodes=2, precision="fp16"), load_hosts(hosts_file), tmp_path, run_id="t-deadline",
                    clients=clients, image=base_on_nodes, timeout_s=3))
    assert all(r.error == "timed out after 3 s" for r in e.value.results)
    assert leftovers(node_engines, "t-deadline") == []


def test_container_killed_mid_cell(hosts_file, clients, base_on_nodes, node_engines, tmp_path):
    m = echo()

    def kill_rank1(ev):
        if ev[0] == "line" and ev[1] == "rc-node2" and ev[2] == "start":
            threading.Thread(target=lambda: [c.kill() for c in node_engines[1].containers.list(
                filters={"label": "repro.run=t-killed"}, ignore_removed=True)]).start()

    with pytest.raises(CellFailed) as e:
        launch_cell(CellJob(m, cell_of(m, nodes=2, precision="fp16"), load_hosts(hosts_file), tmp_path, run_id="t-killed",
                    clients=clients, image=base_on_nodes, on_event=kill_rank1, timeout_s=50))
    by_rank = {r.rank: r for r in e.value.results}
    assert by_rank[1].exit_code == 137
    assert by_rank[0].error == "stopped: the cell ended on another node"
    assert leftovers(node_engines, "t-killed") == []


def test_values_with_shell_metacharacters_stay_literal(hosts_file, clients, base_on_nodes, tmp_path):
    m = echo()
    results = launch_cell(CellJob(m, cell_of(m, nodes=1, precision="bf16"), load_hosts(hosts_file), tmp_path,
                          run_id="t-meta", clients=clients, image=base_on_nodes))
    out = Path(results[0].log).read_text().splitlines()
    assert out[1] == "; rm -rf / # literal"
    assert results[0].command[:2] == ("sh", "-c")


def test_ctrl_c_removes_every_container_and_keeps_logs(cluster, hosts_file, base_on_nodes, node_engines, tmp_path):
    script = f"""
import os, signal, sys
os.environ["REPRO_SSH_CONFIG"] = {cluster['ssh']['config']!r}
from pathlib import Path
from repro.spec.hosts import load_hosts
from repro.images.engine import node_client
from repro.run.cell import CellJob
from repro.run.launch import launch_cell
from repro.spec.manifest import load_manifest
m = load_manifest(Path({str(DATA / 'echo.yaml')!r}))
hosts = load_hosts(Path({str(hosts_file)!r}))
clients = {{n.name: node_client(n) for n in hosts.nodes}}
cell = next(c for c in m.cells() if c.nodes == 2 and c.precision == "fp16")
def ev(e):
    if e[0] == "line":
        print("LINE", e[1], e[2], flush=True)
try:
    launch_cell(CellJob(m, cell, hosts, Path({str(tmp_path)!r}), run_id="t-sigint", clients=clients, image={base_on_nodes!r},
                on_event=ev))
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the CLI does: a Ctrl-C after cleanup ends nothing more
    print("INTERRUPTED", flush=True)
    sys.exit(130)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        seen += line.startswith("LINE")
        if seen == 2:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)  # a second Ctrl-C during cleanup changes nothing
            break
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, rest
    assert leftovers(node_engines, "t-sigint") == []
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["0-rc-node1.log", "1-rc-node2.log"]
    assert all(p.read_text() == "start\n" for p in tmp_path.glob("*.log"))


def test_torch_gloo_ddp_across_two_nodes(hosts_file, clients, cpu_torch, node_engines, tmp_path):
    m = load_manifest(DATA / "torch-ddp.yaml")
    results = launch_cell(CellJob(m, cell_of(m, nodes=2), load_hosts(hosts_file), tmp_path, run_id="t-ddp", clients=clients,
                          image=cpu_torch["image"], timeout_s=600))
    assert [r.exit_code for r in results] == [0, 0]
    sums = [ln.split("checksum ")[1] for r in results for ln in Path(r.log).read_text().splitlines()
            if "parameter checksum" in ln]
    assert len(sums) == 2 and sums[0] == sums[1], "both replicas must hold the same weights"
    rank0 = Path(results[0].log).read_text()
    assert "world_size : 2" in rank0 and "Summary: " in rank0
    assert leftovers(node_engines, "t-ddp") == []


@pytest.mark.parametrize(("placement", "ps_ranks"), [(None, [0, 1]), ("[0]", [0]), ("[1]", [1])],
                         ids=["every-node", "node1-only", "node2-only"])
def test_tf_ps_workers_on_each_node_and_parameter_servers_as_placed(placement, ps_ranks, hosts_file, clients,
                                                                    cpu_torch, node_engines, tmp_path):
    """The tf-ps kind for real: a worker on both nodes and a ps of the same command beside it on the nodes
    placed (by default both; launch.parameter_servers: node 1 only); each worker reaches every parameter
    server, on its own node and the other, and each ps is stopped once its node's worker is done."""
    text = (DATA / "tf-ps.yaml").read_text().replace("/replaced/by/the/test", str(DATA))
    if placement:
        assert text.count("  master_port: 42310\n") == 1
        text = text.replace("  master_port: 42310\n",
                            f"  parameter_servers: [{{when: {{nodes: 2}}, ranks: {placement}}}]\n  master_port: 42310\n")
    (tmp_path / "tf-ps.yaml").write_text(text)
    m = load_manifest(tmp_path / "tf-ps.yaml")
    hosts = load_hosts(hosts_file)
    run_id = "t-tfps-" + "".join(map(str, ps_ranks))
    results = launch_cell(CellJob(m, cell_of(m, nodes=2), hosts, tmp_path / "logs", run_id=run_id, clients=clients,
                          image=cpu_torch["image"], timeout_s=240))
    assert [(r.rank, r.role, r.exit_code) for r in results] == [
        (rank, "ps+worker" if rank in ps_ranks else "worker", 0) for rank in (0, 1)]
    for r in results:
        log = Path(r.log).read_text()
        assert ("Running parameter server" in log) == (r.rank in ps_ranks), log
        if r.rank in ps_ranks:
            assert f"Running parameter server {ps_ranks.index(r.rank)} on port 42311" in log, log
        answers = [ln for ln in log.splitlines() if f"worker {r.rank}: " in ln and " answered: " in ln]
        assert sorted(answers) == sorted(
            f"worker {r.rank}: {hosts.nodes[rank].address}:42311 answered: ps {task} got worker {r.rank} of 2"
            for task, rank in enumerate(ps_ranks)), log
    assert leftovers(node_engines, run_id) == []


def test_mpi_allreduce_across_two_nodes_with_per_run_sshd(hosts_file, clients, cpu_torch, node_engines, tmp_path):
    m = load_manifest(DATA / "mpi.yaml")
    results = launch_cell(CellJob(m, cell_of(m, nodes=2), load_hosts(hosts_file), tmp_path, run_id="t-mpi", clients=clients,
                          image=cpu_torch["image"], timeout_s=300))
    head, worker = results
    assert head.role == "mpi-head" and head.exit_code == 0
    assert worker.role == "mpi-sshd" and worker.ok
    out = Path(head.log).read_text()
    assert "rank 0 of 2: allreduce sum 3" in out and "rank 1 of 2: allreduce sum 3" in out
    assert "hosts ['rc-node1', 'rc-node2']" in out
    assert "Server listening on 10.77.0.12 port 12345" in Path(worker.log).read_text()
    assert leftovers(node_engines, "t-mpi") == []


def test_rdma_cell_stops_before_training_when_the_container_sees_no_hca(hosts_file, clients, base_on_nodes,
                                                                      node_engines, tmp_path):
    """A 2-node cell of an RDMA target on nodes without InfiniBand: the ibv_devinfo check in a container like
    rank 0's fails, names the node and the cause, and no training container is created on any node."""
    import dataclasses

    from repro.errors import EnvironmentUnavailable

    from repro.spec.manifest import Rdma

    m = dataclasses.replace(echo(), rdma=Rdma("inbox"))
    cell = cell_of(m, nodes=2, precision="fp32")
    first = load_hosts(hosts_file).nodes[0].name
    with pytest.raises(EnvironmentUnavailable) as err:
        launch_cell(CellJob(m, cell, load_hosts(hosts_file), tmp_path, run_id="t-rdma", clients=clients, image=base_on_nodes))
    text = str(err.value)
    assert text.startswith(f"cell {cell.key}: RDMA is not usable in the container on {first}: "), text
    assert "/dev/infiniband" in text, text
    assert "ibstat" in err.value.hint
    assert leftovers(node_engines, "t-rdma") == []
    assert not list(tmp_path.glob("*.log"))
