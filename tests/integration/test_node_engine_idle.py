"""A node's engine over SSH after a long quiet spell: dockerd closes a keep-alive API
connection that has waited 5 minutes for its next request (its API server's header
timeout), so the ``docker system dial-stdio`` behind that pooled SSH channel exits and sshd
closes the channel. A cell that runs longer than that leaves such channels in the client's
pools (one per URL: the container's inspect URL among them); cleanup must still reach the
engine through them.

The test does not wait 5 minutes: it makes the node end each idle pooled channel the same
way, by ending the request stream of dial-stdio (EOF on its stdin), so that dockerd closes
the connection, dial-stdio exits and sshd closes the channel from the node's side.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker
import pytest

from repro.images.engine import node_client
from repro.spec.hosts import load_hosts

pytestmark = [pytest.mark.ssh, pytest.mark.docker]


@pytest.fixture
def client(cluster: dict, hosts_file: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
    c = node_client(load_hosts(hosts_file).nodes[0])
    yield c
    c.close()


def idle_channels(client: docker.DockerClient) -> list[Any]:
    """The paramiko channels waiting in the client's connection pools."""
    adapter = client.api.get_adapter("http+docker://ssh")
    pools = [adapter.pools[k] for k in list(adapter.pools.keys())]
    return [conn.sock for p in pools for conn in list(p.pool.queue) if conn is not None and conn.sock is not None]


def node_closes(channels: list[Any]) -> None:
    for chan in channels:
        chan.shutdown_write()
    deadline = time.monotonic() + 20
    while not all(ch.closed for ch in channels):
        assert time.monotonic() < deadline, "the node did not close the channels"
        time.sleep(0.05)


def test_cleanup_works_after_the_node_closed_the_pooled_channels(cluster, client, node_engines, track) -> None:
    ref = f"{cluster['base_image']}@{cluster['base_digest']}"
    client.images.pull(ref)
    name = f"repro-sshpool-idle-{track.run_id}"
    container = client.containers.create(ref, ["sleep", "300"], name=name, labels=track.labels)
    container.start()
    container.reload()
    assert container.status == "running"
    channels = idle_channels(client)
    assert channels, "the client pooled no connection"
    node_closes(channels)

    container.reload()  # the inspect URL's pooled channel is among the closed ones
    assert container.status == "running"
    container.kill()
    assert container.wait(timeout=30)["StatusCode"] == 137
    container.remove(force=True)
    assert node_engines[0].containers.list(all=True, ignore_removed=True, filters={"name": name}) == []
    assert client.ping()
