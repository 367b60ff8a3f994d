"""``repro clean``: remove what a run left on its nodes after a crash, a kill -9 or a lost link.

Every container the kit starts carries the labels of ``repro.labels`` (``clean --all`` finds those
of probes started outside any run). A run's per-run state - the MPI keys, the sshd it starts,
its logs in flight - lives only in those containers, so removing them removes it.
Cleaning is idempotent and goes node by node: one node that cannot be reached is reported
and never stops the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from repro.errors import ReproError, UsageError
from repro.labels import label_filters
from repro.spec.hosts import Hosts, Node, load_hosts, local_hosts

@dataclass
class NodeCleaned:
    node: str
    removed: list[str] = field(default_factory=list)
    error: str | None = None


def remove_containers(client: docker.DockerClient, run_id: str | None) -> list[str]:
    """Force-remove the run's (or, with None, all of the kit's) containers on one engine; their names."""
    removed: list[str] = []
    seen: set[str] = set()
    for filters in label_filters(run_id):
        for c in client.containers.list(all=True, filters=filters, ignore_removed=True):
            if c.id in seen:
                continue
            seen.add(c.id)
            try:
                c.remove(force=True)
            except docker.errors.NotFound:  # gone meanwhile (another clean, the run's own cleanup)
                continue
            removed.append(c.name)
    return sorted(removed)


def clean_clients(clients: Mapping[str, docker.DockerClient], run_id: str | None) -> list[NodeCleaned]:
    """``remove_containers`` on engines already connected, in parallel; one result per node."""

    def one(name: str) -> NodeCleaned:
        try:
            return NodeCleaned(name, remove_containers(clients[name], run_id))
        except docker.errors.DockerException as e:
            return NodeCleaned(name, error=f"the engine refused: {e}")

    with ThreadPoolExecutor(max(1, min(len(clients), 32))) as pool:
        return list(pool.map(one, list(clients)))


def clean_nodes(nodes: Sequence[Node], run_id: str | None,
                connect: Callable[[Node], docker.DockerClient] | None = None) -> list[NodeCleaned]:
    """Connect to every node's engine (as ``repro up`` does) and clean it; one result per node."""
    if connect is None:
        from repro.images.engine import node_client as connect

    def one(node: Node) -> NodeCleaned:
        try:
            client = connect(node)
        except ReproError as e:
            return NodeCleaned(node.name, error=str(e) + (f" (hint: {e.hint})" if e.hint else ""))
        try:
            return NodeCleaned(node.name, remove_containers(client, run_id))
        except docker.errors.DockerException as e:
            return NodeCleaned(node.name, error=f"the engine refused: {e}")
        finally:
            client.close()

    with ThreadPoolExecutor(max(1, min(len(nodes), 32))) as pool:
        return list(pool.map(one, nodes))


def resolve(run: str | None, all_runs: bool, hosts_file: Path | None) -> tuple[str | None, Hosts]:
    """The run id to clean (None: every run) and the inventory to clean it on.

    ``run`` is a run directory (its recorded hosts.yaml is the default inventory) or a run id.
    """
    if all_runs == (run is not None):
        raise UsageError("give a run directory (or run id), or --all",
                         hint="repro clean logs/<run-id> | repro clean --all --hosts FILE")
    if run is None:
        return None, load_hosts(hosts_file)
    path = Path(run)
    if path.is_dir():
        from repro.run.rundir import HOSTS, RunDir

        rundir = RunDir.open(path)
        recorded = rundir.file(HOSTS)
        if hosts_file is None and not recorded.is_file():
            raise UsageError(f"{path} records no inventory ({HOSTS})", hint="give --hosts FILE")
        if (hosts_file is None
                and "no --hosts file" in recorded.read_text(encoding="utf-8").partition("\n")[0]):
            return rundir.run_id, local_hosts()  # the run ran on this machine alone
        return rundir.run_id, load_hosts(hosts_file or recorded)
    from repro.run.rundir import RUN_ID

    if not RUN_ID.match(run):
        raise UsageError(f"{run!r} is neither a run directory nor a run id",
                         hint="run ids read like 20261122T111500Z-target-0a1b2c (the name of logs/<run-id>/)")
    return run, load_hosts(hosts_file)


def summary(results: Sequence[NodeCleaned]) -> str:
    lines = []
    for r in results:
        if r.error:
            lines.append(f"{r.node}: FAILED: {r.error}")
        elif r.removed:
            lines.append(f"{r.node}: removed {len(r.removed)} container(s): {', '.join(r.removed)}")
        else:
            lines.append(f"{r.node}: nothing to remove")
    return "\n".join(lines) + "\n"


def as_json(results: Sequence[NodeCleaned]) -> list[dict[str, Any]]:
    return [{"node": r.node, "removed": r.removed, "error": r.error} for r in results]
