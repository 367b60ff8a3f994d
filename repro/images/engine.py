"""Connections to Docker engines: this machine's and each node's, with SDK errors translated.

A node is reached the way its inventory entry says: ``docker_host`` (unix://, tcp://,
ssh://) or, by default, ``ssh://user@address`` to the engine its SSH login sees. SSH goes
through paramiko with host keys verified against known_hosts (``~/.ssh/known_hosts``
plus any ``UserKnownHostsFile`` of the ssh config, ``@cert-authority`` lines included); an
unknown host is refused, never added; ProxyJump and ssh-agent keys work as with ``ssh``.
Each API connection to a node is an SSH channel running ``docker system dial-stdio``; one that
the node has closed while it sat in the pool is replaced, never reused.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from pathlib import Path
from typing import Any

import docker
import paramiko
from docker.transport import SSHHTTPAdapter
from docker.transport.sshconn import SSHConnectionPool

from repro.errors import EnvironmentUnavailable
from repro.nodes import ssh as nodes
from repro.spec.hosts import Node

log = logging.getLogger(__name__)

#: API version spoken to engines over SSH (Docker 20.10 and every later engine accept it).
SSH_API_VERSION = "1.41"
TIMEOUT_S = 600

START_HINT = ("start the engine: `sudo systemctl start docker` (or `sudo dockerd &`), or point DOCKER_HOST "
              "at a running one; for the test cluster: scripts/test-cluster up")


def connect(docker_host: str | None = None, *, where: str = "this machine") -> docker.DockerClient:
    """A client for ``docker_host`` (default: DOCKER_HOST or the local socket) that has answered a ping."""
    try:
        if docker_host and docker_host.startswith("ssh://"):
            raise ValueError("use node_client for ssh:// engines")
        client = (docker.DockerClient(base_url=docker_host, timeout=TIMEOUT_S) if docker_host
                  else docker.from_env(timeout=TIMEOUT_S))
        client.ping()
        return client
    except docker.errors.DockerException as e:
        target = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        raise EnvironmentUnavailable(f"the Docker engine of {where} ({target}) is not answering",
                                     hint=START_HINT) from e


class _LiveChannelPool(SSHConnectionPool):
    """docker-py's pool of SSH channels, which hands out a pooled one unchecked. The node closes
    idle ones: dockerd ends an API connection that has waited 5 minutes for its next request (the
    header timeout of its API server), dial-stdio exits and sshd closes the channel. Reusing such a
    channel fails with "Socket is closed" (after a long cell: the inspect and remove of cleanup), so
    a channel the node has closed, or begun to close, is dropped and a new one opened instead."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)
        channel = conn.sock
        if channel is not None and (channel.closed or channel.eof_received):
            conn.close()
            return self._new_conn()
        return conn


class _VerifiedSSH(SSHHTTPAdapter):
    """docker-py's paramiko transport, reaching the node as ``ssh`` would: the ssh config's
    HostName, Port, User, IdentityFile, ProxyJump and ProxyCommand, ssh-agent keys, and host
    keys checked against every known_hosts file (``@cert-authority`` lines included)."""

    def __init__(self, base_url: str, *, identity: str | None, ssh_config: Path, timeout: int) -> None:
        self._identity = identity
        self._ssh_config = ssh_config
        self._jump: Any = None
        super().__init__(base_url, timeout=timeout, shell_out=False)

    def _create_paramiko_client(self, base_url: str) -> None:
        url = urllib.parse.urlparse(base_url)
        conf = paramiko.SSHConfig.from_path(str(self._ssh_config)) if self._ssh_config.is_file() else None
        found = conf.lookup(url.hostname) if conf else {}
        self.ssh_client = paramiko.SSHClient()
        self.ssh_params = {"hostname": found.get("hostname", url.hostname),
                           "port": url.port or int(found.get("port", 22)),
                           "username": url.username or found.get("user"),
                           "timeout": 15, "banner_timeout": 15, "auth_timeout": 15, "allow_agent": True,
                           "transport_factory": nodes.preferring_certificates}
        if "identityfile" in found:
            self.ssh_params["key_filename"] = found["identityfile"]
        if self._identity:
            self.ssh_params.update(key_filename=os.path.expanduser(self._identity), look_for_keys=False)
        trusted, record_to = nodes.known_hosts_files(found)
        checked = [p for p in trusted if p.is_file()]
        known = nodes.load_known_hosts(self.ssh_client, checked)
        self.ssh_client.set_missing_host_key_policy(nodes.HostKeyPolicy(False, record_to, checked, known))
        if "proxyjump" in found:
            self._jump = nodes.jump_connection(url.hostname, url.port, url.username)
            self.ssh_params["sock"] = self._jump.open_gateway()
        elif "proxycommand" in found:
            self.ssh_params["sock"] = paramiko.ProxyCommand(found["proxycommand"])

    def get_connection(self, url: str, proxies: Any = None) -> SSHConnectionPool:
        """The pool for ``url`` (docker-py keeps one per URL), one that never hands out a closed channel."""
        with self.pools.lock:
            pool = self.pools.get(url)
            if pool is None:
                if self.ssh_client.get_transport() is None:
                    self._connect()
                pool = _LiveChannelPool(ssh_client=self.ssh_client, timeout=self.timeout,
                                        maxsize=self.max_pool_size, host=self.ssh_host)
                self.pools[url] = pool
        return pool

    def close(self) -> None:
        super().close()
        if self._jump is not None:
            self._jump.close()


def ssh_config_path() -> Path:
    """The ssh config paramiko reads: ``REPRO_SSH_CONFIG`` as repro.nodes resolves it, else ~/.ssh/config."""
    return nodes.ssh_config_path() or Path("~/.ssh/config").expanduser()


def node_url(node: Node) -> str:
    if node.docker_host:
        return node.docker_host
    user = f"{node.user}@" if node.user else ""
    port = f":{node.port}" if node.port else ""
    return f"ssh://{user}{node.address}{port}"


def node_client(node: Node, local: docker.DockerClient | None = None) -> docker.DockerClient:
    """A client for the node's engine; a ``local`` node reuses this machine's client."""
    if node.local:
        return local or connect()
    url = node_url(node)
    if not url.startswith("ssh://"):
        return connect(url, where=f"node {node.name}")
    try:
        adapter = _VerifiedSSH(url, identity=node.identity, ssh_config=ssh_config_path(), timeout=TIMEOUT_S)
    except nodes.Unknown as e:
        raise nodes.translate(node, e) from None
    except paramiko.BadHostKeyException as e:
        raise EnvironmentUnavailable(f"node {node.name} ({node.address}) presents a different host key than "
                                     "known_hosts records", hint="find out why before trusting it") from e
    except paramiko.SSHException as e:
        hint = ("add the node's host key to known_hosts (ssh-keyscan, checked out of band)"
                if "not found in known_hosts" in str(e)
                else "check the inventory and `ssh` to the node by hand")
        raise EnvironmentUnavailable(f"cannot open SSH to node {node.name} ({url})", hint=hint) from e
    except OSError as e:
        raise EnvironmentUnavailable(f"cannot reach node {node.name} ({url})",
                                     hint="is the node up and sshd listening?") from e
    # built with the shell-out transport (which connects lazily), then given the verified one
    client = docker.DockerClient(base_url=url, version=SSH_API_VERSION, timeout=TIMEOUT_S,
                                 use_ssh_client=True)
    client.api.mount("http+docker://ssh", adapter)
    client.api._custom_adapter = adapter  # noqa: SLF001 - so that close() closes it
    try:
        client.ping()
    except docker.errors.DockerException as e:
        client.close()
        raise EnvironmentUnavailable(f"node {node.name}: no Docker engine answers over {url}",
                                     hint=f"on the node: {START_HINT}") from e
    return client
