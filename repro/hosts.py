"""The hosts inventory: which nodes a target runs on, in rank order.

Node 0 is the master. SSH settings not given here come from ``~/.ssh/config``
(fabric reads it when it connects), so a file may name nodes by their aliases only.
With no file, the target runs on this machine alone.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from repro.errors import InputError, Problem
from repro.schema import read_yaml, validate


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    gpus: int | None = None
    docker_host: str | None = None
    local: bool = False


@dataclass(frozen=True)
class Hosts:
    nodes: tuple[Node, ...]
    path: Path | None = None
    data: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    scheduler: Mapping[str, str] | None = None  # the inventory's scheduler section (repro.schedulers)

    def take(self, n: int) -> tuple[Node, ...]:
        """The first ``n`` nodes, in rank order."""
        if n > len(self.nodes):
            where = str(self.path) if self.path else "the local machine (no --hosts file)"
            raise InputError([_short(where, n, len(self.nodes))])
        return self.nodes[:n]


def _short(where: str, need: int, have: int) -> Problem:
    return Problem(where, None, "nodes", f"the cell needs {need} nodes, the inventory has {have}",
                   "add nodes to the hosts file or filter the cells with --cells")


def local_hosts() -> Hosts:
    return Hosts((Node(name=socket.gethostname(), address="127.0.0.1", local=True),))


def load_hosts(path: Path | None) -> Hosts:
    if path is None:
        return local_hosts()
    doc = read_yaml(path)
    problems = validate(doc, "hosts.v1")
    if not problems and not doc.data.get("nodes") and (doc.data.get("scheduler") or {}).get("kind") != "slurm":
        problems.append(doc.problem(["nodes"], "no nodes: only a Slurm inventory may leave them to the scheduler",
                                    "list the nodes, or add scheduler: {kind: slurm, partition: NAME}"))
    if not problems:
        seen: dict[tuple[str, str], int] = {}
        for i, n in enumerate(doc.data.get("nodes", [])):
            for key in ("name", "address"):
                if key in n and (key, n[key]) in seen:
                    problems.append(doc.problem(["nodes", i, key], f"duplicate node {key} {n[key]!r}",
                                                "each node may appear once"))
                if key in n:
                    seen[(key, n[key])] = i
    if problems:
        raise InputError(problems)
    defaults = doc.data.get("defaults", {})
    nodes = tuple(Node(**{"name": n.get("name", n["address"]), **defaults, **n}) for n in doc.data.get("nodes", []))
    return Hosts(nodes, path, doc.data.get("data"), dict(doc.data.get("env", {})), doc.data.get("scheduler"))
