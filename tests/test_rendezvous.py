"""``rendezvous_address``: where the other ranks reach a node (e.g. its InfiniBand interface),
used for the master address, Paddle's --ips and POD_IP, the MPI hostfile, the workers' sshd and its known_hosts; SSH
keeps using ``address``."""

from __future__ import annotations

from pathlib import Path

from repro.spec.hosts import load_hosts
from repro.run.launchers.base import placeholder_values
from repro.spec.manifest import load_manifest
from repro.run.plan import plan_cell

DATA = Path(__file__).resolve().parent / "data"


def hosts_file(tmp_path: Path) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text("schema_version: 1\ndata: /datasets\nnodes:\n" + "".join(
        f"  - {{name: node{i}, address: 10.0.0.{i}, rendezvous_address: 192.168.7.{i}}}\n" for i in range(1, 4))
        + "  - {name: node4, address: 10.0.0.4}\n")
    return p


def test_paddle_ips_and_pod_ip_use_the_rendezvous_address(tmp_path: Path) -> None:
    m = load_manifest(DATA / "good" / "paddle-multinode.yaml")
    hosts = load_hosts(hosts_file(tmp_path))
    plans = plan_cell(m, m.cells()[0], hosts)
    assert [p.command.node.address for p in plans] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert [p.command.env["POD_IP"] for p in plans] == ["192.168.7.1", "192.168.7.2", "192.168.7.3", "10.0.0.4"]
    assert "--ips=192.168.7.1,192.168.7.2,192.168.7.3,10.0.0.4" in plans[0].command.command


def test_master_addr_is_the_first_node_rendezvous_address(tmp_path: Path) -> None:
    m = load_manifest(DATA / "good" / "minimal.yaml")
    nodes = load_hosts(hosts_file(tmp_path)).nodes
    values = placeholder_values(m.launch, m.cells()[0], nodes[:2], 1)
    assert (values["master_addr"], values["hosts"]) == ("192.168.7.1", "192.168.7.1,192.168.7.2")


def test_mpi_hostfile_sshd_and_known_hosts_use_the_rendezvous_address(tmp_path: Path) -> None:
    """mpirun dials the hostfile's names: each worker's sshd listens there and known_hosts pins the key there."""
    from repro.run.launch import mpi_files
    from repro.run.launchers.mpi import MPI_DIR

    m = load_manifest(DATA / "good" / "mpi-ngc-tf1.yaml")
    hosts = load_hosts(hosts_file(tmp_path))
    plans = plan_cell(m, m.cells()[-1], hosts)
    head, *workers = [p.command for p in plans]
    assert head.files == {f"{MPI_DIR}/hostfile": "192.168.7.1 slots=8\n192.168.7.2 slots=8\n"
                                                 "192.168.7.3 slots=8\n10.0.0.4 slots=8\n"}
    assert [w.files[f"{MPI_DIR}/sshd_config"].split("\n")[:2] for w in workers] == [
        ["Port 10000", "ListenAddress 192.168.7.2"], ["Port 10000", "ListenAddress 192.168.7.3"],
        ["Port 10000", "ListenAddress 10.0.0.4"]]
    known = mpi_files(plans, 10000)[f"{MPI_DIR}/known_hosts"][0].decode().splitlines()
    assert [line.split(" ")[0] for line in known] == ["[192.168.7.1]:10000", "[192.168.7.2]:10000",
                                                      "[192.168.7.3]:10000", "[10.0.0.4]:10000"]
    assert [p.command.node.address for p in plans] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]  # SSH's


def test_slurm_head_waits_for_the_workers_sshd_at_their_rendezvous_address(tmp_path: Path) -> None:
    from repro.run.schedulers.slurm import step_spec

    m = load_manifest(DATA / "good" / "mpi-ngc-tf1.yaml")
    cell = m.cells()[-1]
    spec = step_spec(plan_cell(m, cell, load_hosts(hosts_file(tmp_path))), "RUN", cell, "img", {}, 10000)
    assert spec["ranks"][0]["wait_for"] == [["192.168.7.2", 10000], ["192.168.7.3", 10000], ["10.0.0.4", 10000]]
