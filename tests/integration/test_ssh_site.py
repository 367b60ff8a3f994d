"""SSH as HPC sites set it up, on the namespace nodes: a host key signed by a site CA and
trusted through ``@cert-authority`` only, a login key held only by ssh-agent, and a node
reached through a ``ProxyJump`` host named in the ssh config - both for commands (fabric)
and for the node's Docker engine (docker over SSH).

An sshd of this test's own (its own port, host key, certificate and authorized key) runs in
rc-node1's network namespace; rc-node2's own sshd is reached through it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from repro.nodes import ssh as nodes
from repro.spec.hosts import Node
from repro.images.engine import node_client

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]


def sh(*argv: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def wait_port(ns: str, host: str, port: int) -> None:
    for _ in range(100):
        probe = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"],
                               capture_output=True)
        if probe.returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"sshd on {host}:{port} did not start")


@pytest.fixture(scope="module")
def site(cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    d = tmp_path_factory.mktemp("site-ssh")
    node1, node2 = cluster["nodes"][0], cluster["nodes"][1]
    for name in ("ca", "host", "user", "other_ca"):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(d / name))
    port = random.randint(20000, 29999)
    # the host certificate names the node's address, valid for an hour
    sh("ssh-keygen", "-q", "-s", str(d / "ca"), "-I", "rc-node1-site", "-h", "-n", node1["address"], "-V", "-5m:+1h",
       str(d / "host.pub"))
    (d / "authorized_keys").write_text((d / "user.pub").read_text() + Path(cluster["ssh"]["key"] + ".pub").read_text())
    sshd = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{node1['netns']}", "/usr/sbin/sshd", "-D", "-e", "-f", "/dev/null",
         "-p", str(port), "-o", f"ListenAddress={node1['address']}", "-o", f"HostKey={d / 'host'}",
         "-o", f"HostCertificate={d / 'host-cert.pub'}", "-o", f"AuthorizedKeysFile={d / 'authorized_keys'}",
         "-o", "PermitRootLogin=prohibit-password", "-o", "UsePAM=no", "-o", "StrictModes=no",
         "-o", f"PidFile={d / 'sshd.pid'}", "-o", f"SetEnv=DOCKER_HOST={node1['docker_host']}",
         "-o", "AllowTcpForwarding=yes"], stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "w"))
    agent_sock = d / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_sock)], stdout=subprocess.DEVNULL)
    try:
        wait_port(node1["netns"], node1["address"], port)
        for _ in range(50):
            if agent_sock.exists():
                break
            time.sleep(0.1)
        sh("ssh-add", str(d / "user"), env={**os.environ, "SSH_AUTH_SOCK": str(agent_sock)})
        (d / "user").unlink()  # the login key now lives only in the agent
        ca_line = f"@cert-authority [{node1['address']}]:{port} {(d / 'ca.pub').read_text().split(' ', 2)[0]} " \
                  f"{(d / 'ca.pub').read_text().split(' ', 2)[1]}\n"
        (d / "known_hosts").write_text(ca_line)
        config = d / "ssh_config"
        config.write_text(
            f"Host site-ca\n  HostName {node1['address']}\n  Port {port}\n  User root\n"
            f"  UserKnownHostsFile {d / 'known_hosts'}\n"
            f"Host site-behind\n  HostName {node2['address']}\n  User root\n  ProxyJump site-ca\n"
            f"  IdentityFile {cluster['ssh']['key']}\n  UserKnownHostsFile {cluster['ssh']['known_hosts']} "
            f"{d / 'known_hosts'}\n")
        yield {"dir": d, "port": port, "config": config, "agent": agent_sock, "node1": node1, "node2": node2}
    finally:
        sshd.terminate()
        agent.terminate()
        sshd.wait(timeout=30)
        agent.wait(timeout=30)


@pytest.fixture()
def site_env(site: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("REPRO_SSH_CONFIG", str(site["config"]))
    monkeypatch.setenv("SSH_AUTH_SOCK", str(site["agent"]))
    monkeypatch.setenv("HOME", str(site["dir"]))  # no ~/.ssh of this machine's user takes part
    return site


def test_ca_signed_host_with_agent_only_key_and_a_node_behind_proxyjump(site_env: dict) -> None:
    ca_node, behind = Node("site-ca", "site-ca"), Node("site-behind", "site-behind")
    out = nodes.run_on_all([ca_node, behind], lambda s: s.run("printenv DOCKER_HOST", hide=True, in_stream=False).stdout.strip(),
                           timeout=60)
    assert out == {"site-ca": site_env["node1"]["docker_host"], "site-behind": site_env["node2"]["docker_host"]}, out
    for node, engine_name in ((ca_node, "rc-node1"), (behind, "rc-node2")):
        client = node_client(node)
        try:
            assert client.info()["Name"] == engine_name
        finally:
            client.close()


def test_a_certificate_from_an_untrusted_ca_is_refused_with_the_reason(site_env: dict) -> None:
    d = site_env["dir"]
    good = (d / "known_hosts").read_text()
    other = (d / "other_ca.pub").read_text().split(" ")
    (d / "known_hosts").write_text(f"@cert-authority [{site_env['node1']['address']}]:{site_env['port']} "
                                   f"{other[0]} {other[1]}\n")
    try:
        with pytest.raises(nodes.HostKeyUnknown, match="signed by a CA that no @cert-authority line trusts"):
            nodes.connect(Node("site-ca", "site-ca"), timeout=30)
    finally:
        (d / "known_hosts").write_text(good)


def test_repro_clean_reaches_both_site_nodes(site_env: dict, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("schema_version: 1\nnodes:\n  - {name: site-ca, address: site-ca}\n"
                     "  - {name: site-behind, address: site-behind}\n")
    res = subprocess.run([sys.executable, "-m", "repro", "clean", "20261125T000000Z-site-ssh-000000", "--hosts",
                          str(hosts)], capture_output=True, text=True, cwd=ROOT, timeout=300, env=os.environ.copy())
    assert (res.returncode, res.stdout) == (0, "site-ca: nothing to remove\nsite-behind: nothing to remove\n"), \
        res.stderr

