"""Preflight and SSH fan-out against the test cluster's namespace nodes (real sshd, real dockerd).

The cluster pins one host key for every node in its own known_hosts, named by its ssh
config; tests that need an unknown host use a fresh HOME with an empty known_hosts.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml
from click.testing import CliRunner

from repro.cli import cli
from repro.errors import InputError
from repro.spec.hosts import load_hosts
from repro.nodes.ssh import HostKeyChanged, NodeTimedOut, NodeUnreachable, fingerprint, run_on_all
from repro.nodes.preflight import NodeReport, run_preflight

pytestmark = pytest.mark.ssh


def write_hosts(path: Path, cluster: dict, extra: list[dict[str, Any]] = (), **overrides: Any) -> Path:
    nodes = [{"name": n["name"], "address": n["address"], **overrides} for n in cluster["nodes"]] + list(extra)
    doc = {"schema_version": 1, "defaults": {"user": "root", "identity": cluster["ssh"]["key"]}, "nodes": nodes}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def ghost_address(cluster: dict) -> str:
    """An address on the cluster's bridge subnet that no node answers."""
    subnet = cluster["nodes"][0]["address"].rsplit(".", 1)[0]
    return f"{subnet}.250"


def host_key(cluster: dict) -> paramiko.PKey:
    line = (Path(cluster["ssh"]["known_hosts"]).read_text().splitlines()[0]).split()
    return paramiko.PKey.from_type_string(line[1], __import__("base64").b64decode(line[2]))


@pytest.fixture
def pinned(cluster: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The cluster's own ssh config: identity and known_hosts with the nodes' pinned key."""
    monkeypatch.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
    return cluster


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME whose ~/.ssh knows no host, and no ssh config that names the cluster's known_hosts."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh" / "known_hosts").write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("REPRO_SSH_CONFIG", raising=False)
    return home


def preflight_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["preflight", *args], catch_exceptions=False)


def test_every_node_reported(pinned: dict, tmp_path: Path) -> None:
    hosts = load_hosts(write_hosts(tmp_path / "hosts.yaml", pinned))
    reports = run_preflight(hosts.nodes, timeout=60)
    assert [r.node for r in reports] == [n["name"] for n in pinned["nodes"]]
    for r, n in zip(reports, pinned["nodes"]):
        assert isinstance(r, NodeReport) and r.reachable, r.ssh.reason
        assert r.docker.value and r.docker.detail == f"{pinned['work_dir']}/nodes/{n['name']}/data"
        assert r.gpus.value == () and r.gpus.detail == "no nvidia-smi"
        assert r.infiniband.value == () and r.infiniband.detail == "no /dev/infiniband"
        assert r.disk.value > 0
        assert abs(r.clock.value) < 0.25, r.clock  # the namespaces share this machine's clock


def test_nodes_run_in_parallel(pinned: dict, tmp_path: Path) -> None:
    hosts = load_hosts(write_hosts(tmp_path / "hosts.yaml", pinned))

    def span(s: Any) -> tuple[float, float]:
        t0 = time.monotonic()
        s.run("sleep 1", hide=True, in_stream=False)
        return t0, time.monotonic()

    spans = run_on_all(hosts.nodes, span, timeout=60)
    starts, ends = zip(*spans.values())
    assert max(starts) < min(ends), spans  # every node's command was running at one moment


def test_unreachable_node_gets_its_own_row(pinned: dict, tmp_path: Path) -> None:
    ghost = {"name": "ghost", "address": ghost_address(pinned)}
    hosts_file = write_hosts(tmp_path / "hosts.yaml", pinned, extra=[ghost])
    r = preflight_cli("--hosts", str(hosts_file))
    assert r.exit_code == 3, r.output
    lines = r.output.splitlines()
    for n in pinned["nodes"]:
        row = next(ln for ln in lines if ln.startswith(n["name"] + " "))
        assert "failed" not in row and " ms " in row
    assert next(ln for ln in lines if ln.startswith("ghost ")).split()[1] == "failed"
    assert f"  ghost: cannot reach node ghost ({ghost['address']})" in r.output or \
        f"  ghost: node ghost ({ghost['address']}) did not answer in time" in r.output
    assert "error: 1 of 3 node(s) cannot run a target" in r.output


def test_json_output(pinned: dict, tmp_path: Path) -> None:
    r = preflight_cli("--hosts", str(write_hosts(tmp_path / "hosts.yaml", pinned)), "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [n["node"] for n in doc["nodes"]] == [n["name"] for n in pinned["nodes"]]
    assert doc["problems"] == [] and doc["deviations"] == []


def test_target_deviations_warn_then_fail_under_strict(pinned: dict, tmp_path: Path) -> None:
    hosts_file = str(write_hosts(tmp_path / "hosts.yaml", pinned))
    r = preflight_cli("dlperf-ngc-pytorch-rn50-v100", "--hosts", hosts_file)
    assert r.exit_code == 0, r.output
    assert f"  {pinned['nodes'][0]['name']}: gpu_model: expected Tesla V100-SXM2-16GB, found no GPU" in r.output
    assert f"  {pinned['nodes'][0]['name']}: interconnect: expected infiniband, found no /dev/infiniband" in r.output
    strict = preflight_cli("dlperf-ngc-pytorch-rn50-v100", "--hosts", hosts_file, "--strict")
    assert strict.exit_code == 3
    assert strict.output.startswith(r.output.split("\n", 2)[0])  # the table is still printed
    assert "deviation(s) from the target's expected hardware (--strict)" in strict.output


def test_per_node_timeout_keeps_the_others(pinned: dict, tmp_path: Path) -> None:
    hosts = load_hosts(write_hosts(tmp_path / "hosts.yaml", pinned))
    slow = hosts.nodes[0].name
    t0 = time.monotonic()
    out = run_on_all(hosts.nodes, lambda s: s.run("sleep 30" if s.node.name == slow else "hostname", hide=True,
                                                  in_stream=False).stdout.strip(), timeout=4)
    assert time.monotonic() - t0 < 15
    assert isinstance(out[slow], NodeTimedOut)
    assert [out[n.name] for n in hosts.nodes[1:]] == [n.name for n in hosts.nodes[1:]]


def test_unknown_host_key_refused_with_the_fix(cluster: dict, fresh_home: Path, tmp_path: Path) -> None:
    r = preflight_cli("--hosts", str(write_hosts(tmp_path / "hosts.yaml", cluster)))
    assert r.exit_code == 3, r.output
    key = host_key(cluster)
    first = cluster["nodes"][0]["address"]
    assert f"presents an unknown {key.get_name()} host key {fingerprint(key)}" in r.output
    assert f"`ssh-keyscan -p 22 {first} >> {fresh_home}/.ssh/known_hosts`" in r.output
    assert "--accept-new-host-keys" in r.output
    assert (fresh_home / ".ssh" / "known_hosts").read_text() == ""  # nothing added behind the user's back


def test_accept_new_host_keys_records_new_keys_only(cluster: dict, fresh_home: Path, tmp_path: Path) -> None:
    hosts_file = str(write_hosts(tmp_path / "hosts.yaml", cluster))
    r = preflight_cli("--hosts", hosts_file, "--accept-new-host-keys")
    assert r.exit_code == 0, r.output
    known = fresh_home / ".ssh" / "known_hosts"
    key = host_key(cluster)
    assert sorted(known.read_text().splitlines()) == sorted(
        f"{n['address']} {key.get_name()} {key.get_base64()}" for n in cluster["nodes"])
    assert preflight_cli("--hosts", hosts_file).exit_code == 0  # now known, no flag needed

    # a different key recorded for the first node: refused even with the flag, and the file kept as it was
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    first = cluster["nodes"][0]["address"]
    lines = [ln if not ln.startswith(first + " ") else f"{first} {other.with_suffix('.pub').read_text().split()[0]} "
             f"{other.with_suffix('.pub').read_text().split()[1]}" for ln in known.read_text().splitlines()]
    known.write_text("\n".join(lines) + "\n")
    before = known.read_text()
    hosts = load_hosts(Path(hosts_file))
    out = run_on_all(hosts.nodes, lambda s: "ok", timeout=30, accept_new_host_keys=True)
    assert isinstance(out[hosts.nodes[0].name], HostKeyChanged)
    assert fingerprint(key) in str(out[hosts.nodes[0].name])
    assert all(out[n.name] == "ok" for n in hosts.nodes[1:])
    assert known.read_text() == before


def test_metacharacters_in_names_and_addresses_are_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.yaml"
    bad.write_text(yaml.safe_dump({"schema_version": 1, "nodes": [
        {"name": "n1;touch /tmp/x", "address": "10.0.0.1"}, {"name": "n2", "address": "10.0.0.2$(id)"}]}))
    with pytest.raises(InputError) as e:
        load_hosts(bad)
    assert [(p.field, p.message.partition(" does not")[0]) for p in e.value.problems] == [
        ("nodes[0].name", "'n1;touch /tmp/x'"), ("nodes[1].address", "'10.0.0.2$(id)'")]


def test_metacharacters_in_docker_host_never_run(pinned: dict, tmp_path: Path) -> None:
    marker = Path(f"/tmp/repro-preflight-pwned-{uuid.uuid4().hex}")
    sock = pinned["nodes"][0]["docker_host"]
    nasty = f"{sock};touch${{IFS}}{marker};`touch${{IFS}}{marker}`;$(touch${{IFS}}{marker})"
    with pytest.raises(InputError, match="docker_host"):  # the schema refuses it ...
        load_hosts(write_hosts(tmp_path / "bad.yaml", pinned, docker_host=nasty))
    good = load_hosts(write_hosts(tmp_path / "hosts.yaml", pinned))  # ... and preflight would not run it either
    reports = run_preflight([dataclasses.replace(n, docker_host=nasty) for n in good.nodes], timeout=60)
    assert not marker.exists()  # the nodes share this machine's file system
    for r in reports:
        assert r.reachable and r.docker.value is None
        # the whole value reached docker as one -H argument
        assert f"{sock.removeprefix('unix://')};touch${{IFS}}/tmp/repro-preflight-pwned-" in r.docker.reason


def test_ghost_alone_is_unreachable(pinned: dict) -> None:
    from repro.spec.hosts import Node
    out = run_on_all([Node("ghost", ghost_address(pinned), user="root")], lambda s: "ok", timeout=20)
    assert isinstance(out["ghost"], NodeUnreachable)
    assert out["ghost"].hint


def hosts_with_env(path: Path, cluster: dict, env: dict[str, str]) -> Path:
    write_hosts(path, cluster)
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "env": env}, sort_keys=False))
    return path


def test_socket_interfaces_named_in_the_env_are_checked_on_every_node(pinned: dict, tmp_path: Path) -> None:
    names = [n["name"] for n in pinned["nodes"]]
    good = preflight_cli("--hosts", str(hosts_with_env(tmp_path / "good.yaml", pinned, {
        "NCCL_SOCKET_IFNAME": "^docker,lo", "GLOO_SOCKET_IFNAME": "eth0"})), "--format", "json")
    assert good.exit_code == 0, good.output
    doc = json.loads(good.output)
    assert doc["problems"] == []
    assert all("eth0" in n["interfaces"]["value"] for n in doc["nodes"])
    have = {n["node"]: ", ".join(n["interfaces"]["value"]) for n in doc["nodes"]}
    bad = preflight_cli("--hosts", str(hosts_with_env(tmp_path / "bad.yaml", pinned, {
        "NCCL_SOCKET_IFNAME": "xgbe0", "GLOO_SOCKET_IFNAME": "eth0,ib0"})))
    assert bad.exit_code == 3, bad.output
    for name in names:
        assert (f"  {name}: GLOO_SOCKET_IFNAME=eth0,ib0 names ib0, not there (it has {have[name]}); set "
                "GLOO_SOCKET_IFNAME in the hosts file's env to this cluster's interface") in bad.output
        assert (f"  {name}: NCCL_SOCKET_IFNAME=xgbe0 matches no interface there (it has {have[name]}); set "
                "NCCL_SOCKET_IFNAME in the hosts file's env to this cluster's interface") in bad.output
    assert f"error: {len(names)} of {len(names)} node(s) cannot run a target" in bad.output


def test_target_env_and_rdma_host_side(pinned: dict, tmp_path: Path) -> None:
    """ngc-tf1-rn50-v100: 4-node cells over MLNX_OFED; the nodes have no mlx5 driver, and the site names eth0."""
    hosts_file = hosts_with_env(tmp_path / "hosts.yaml", pinned, {"NCCL_SOCKET_IFNAME": "=eth0"})
    r = preflight_cli("ngc-tf1-rn50-v100", "--hosts", str(hosts_file))
    assert r.exit_code == 0, r.output
    for n in pinned["nodes"]:
        assert f"  {n['name']}: rdma_driver: expected mlx5_core loaded, found mlx5_core not loaded" in r.output
    assert "NCCL_SOCKET_IFNAME" not in r.output
