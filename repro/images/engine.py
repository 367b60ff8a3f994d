"""Connections to Docker engines: this machine's and each node's, with SDK errors translated.

A node is reached the way its inventory entry says: ``docker_host`` (unix://, tcp://,
ssh://) or, by default, ``ssh://user@address`` to the engine its SSH login sees. SSH goes
through paramiko with host keys verified against known_hosts (``~/.ssh/known_hosts``
plus any ``UserKnownHostsFile`` of the ssh config); an unknown host is refused, never
added.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import docker
import paramiko
from docker.transport import SSHHTTPAdapter

from repro.errors import EnvironmentUnavailable
from repro import nodes
from repro.hosts import Node

log = logging.getLogger(__name__)

#: API version spoken to engines over SSH (Docker 20.10 and every later engine accept it).
SSH_API_VERSION = "1.41"
TIMEOUT_S = 600

START_HINT = ("start the engine: `sudo systemctl start docker` (or `sudo dockerd &`), or point DOCKER_HOST at "
              "a running one; for the test cluster: scripts/test-cluster up")


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


class _VerifiedSSH(SSHHTTPAdapter):
    """docker-py's paramiko transport, plus the inventory's identity and known_hosts files."""

    def __init__(self, base_url: str, *, identity: str | None, ssh_config: Path, timeout: int) -> None:
        self._identity = identity
        self._ssh_config = ssh_config
        super().__init__(base_url, timeout=timeout, shell_out=False)

    def _create_paramiko_client(self, base_url: str) -> None:
        super()._create_paramiko_client(base_url)
        host = self.ssh_params["hostname"]
        conf = paramiko.SSHConfig.from_path(str(self._ssh_config)) if self._ssh_config.is_file() else None
        found = conf.lookup(host) if conf else {}
        for key, param in (("hostname", "hostname"), ("user", "username"), ("identityfile", "key_filename")):
            if key in found and not (key == "user" and self.ssh_params.get("username")):
                self.ssh_params[param] = found[key]
        if not self.ssh_params.get("port"):
            self.ssh_params["port"] = int(found.get("port", 22))
        for known in found.get("userknownhostsfile", "").split():
            path = Path(os.path.expanduser(known))
            if path.is_file():
                self.ssh_client.load_system_host_keys(str(path))
        if self._identity:
            self.ssh_params["key_filename"] = os.path.expanduser(self._identity)
            self.ssh_params["look_for_keys"] = False
        self.ssh_params.update(timeout=15, banner_timeout=15, auth_timeout=15, allow_agent=True)


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
    except paramiko.BadHostKeyException as e:
        raise EnvironmentUnavailable(f"node {node.name} ({node.address}) presents a different host key than "
                                     "known_hosts records", hint="find out why before trusting it") from e
    except paramiko.SSHException as e:
        hint = ("add the node's host key to known_hosts (ssh-keyscan, checked out of band)"
                if "not found in known_hosts" in str(e) else "check the inventory and `ssh` to the node by hand")
        raise EnvironmentUnavailable(f"cannot open SSH to node {node.name} ({url})", hint=hint) from e
    except OSError as e:
        raise EnvironmentUnavailable(f"cannot reach node {node.name} ({url})",
                                     hint="is the node up and sshd listening?") from e
    # built with the shell-out transport (which connects lazily), then given the verified one
    client = docker.DockerClient(base_url=url, version=SSH_API_VERSION, timeout=TIMEOUT_S, use_ssh_client=True)
    client.api.mount("http+docker://ssh", adapter)
    client.api._custom_adapter = adapter  # noqa: SLF001 - so that close() closes it
    try:
        client.ping()
    except docker.errors.DockerException as e:
        client.close()
        raise EnvironmentUnavailable(f"node {node.name}: no Docker engine answers over {url}",
                                     hint=f"on the node: {START_HINT}") from e
    return client
