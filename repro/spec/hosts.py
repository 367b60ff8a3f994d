"""The hosts inventory: which nodes a target runs on, in rank order.

Node 0 is the master. SSH settings not given here come from ``~/.ssh/config``
(fabric reads it when it connects), so a file may name nodes by their aliases only.
With no file, the target runs on this machine alone.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from repro.errors import InputError, Problem
from repro.spec.scheduler import problems as scheduler_problems
from repro.spec.schema import read_yaml, validate


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
    rendezvous_address: str | None = None

    @property
    def rendezvous(self) -> str:
        """Where the other ranks reach this node (master address, host lists): ``rendezvous_address`` or the
        SSH address."""
        return self.rendezvous_address or self.address


@dataclass(frozen=True)
class Hosts:
    nodes: tuple[Node, ...]
    path: Path | None = None
    data: str | Mapping[str, str] | None = None  # one directory, or one per dataset format
    env: Mapping[str, str] = field(default_factory=dict)
    placeholder: bool = False  # made up for a dry run without a hosts file
    scheduler: Mapping[str, str] | None = None  # the inventory's scheduler section (repro.run.schedulers)
    gpus: int | None = None  # GPUs of every node: ``defaults.gpus``, else the fewest any listed node has
    prelude: tuple[str, ...] = ()  # the site's shell lines before the kit's job steps (Slurm), verbatim
    modules: tuple[str, ...] = ()  # ``module load NAME`` each, after the prelude

    def data_dir(self, fmt: str) -> str | None:
        """The directory holding dataset format ``fmt`` on every node; a single ``data:`` path serves any
        format."""
        if isinstance(self.data, str):
            return self.data
        return (self.data or {}).get(fmt)

    def need_data_dir(self, fmt: str, target: str) -> str:
        """``data_dir``, or a clear error saying what to add to which file."""
        found = self.data_dir(fmt)
        if found is None:
            where = str(self.path) if self.path else "the local machine (no --hosts file)"
            have = f" (it has {', '.join(sorted(self.data))})" if isinstance(self.data, Mapping) else ""
            raise InputError([Problem(where, None, "data", f"{target} reads dataset format {fmt}, and the "
                                      f"inventory names no directory for it{have}",
                                      f"add `data: {{{fmt}: /path/on/every/node}}` to the hosts file"
                                      + ("" if self.path else " and give it with --hosts FILE"))])
        return found

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


def placeholder_hosts(nodes: int, formats: Sequence[str] = ()) -> Hosts:
    """Stand-ins for a dry run without a hosts file: node1..nodeN and /path/to/FORMAT, marked as such."""
    return Hosts(tuple(Node(name=f"node{i}", address=f"node{i}") for i in range(1, nodes + 1)),
                 data={f: f"/path/to/{f}" for f in formats}, placeholder=True)


def load_hosts(path: Path | None) -> Hosts:
    if path is None:
        return local_hosts()
    doc = read_yaml(path)
    problems = validate(doc, "hosts.v1")
    if (not problems and not doc.data.get("nodes")
            and (doc.data.get("scheduler") or {}).get("kind") != "slurm"):
        problems.append(doc.problem(["nodes"],
                                    "no nodes: only a Slurm inventory may leave them to the scheduler",
                                    "list the nodes, or add scheduler: {kind: slurm, partition: NAME}"))
    if not problems:
        problems += [doc.problem(["scheduler", p.key] + ([] if p.item is None else [p.item]), p.why, p.fix)
                     for p in scheduler_problems(doc.data.get("scheduler") or {})]
        problems += [doc.problem([key, i], "holds a line break or NUL: each entry is one line of the script",
                                 "split it into entries, one line each")
                     for key in ("prelude", "modules") for i, line in enumerate(doc.data.get(key, []))
                     if any(c in line for c in "\n\r\0")]
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
    nodes = tuple(Node(**{"name": n.get("name", n["address"]), **defaults, **n})
                  for n in doc.data.get("nodes", []))
    counts = [n.gpus for n in nodes]
    gpus = defaults.get("gpus", min(counts) if counts and None not in counts else None)
    return Hosts(nodes, path, doc.data.get("data"), dict(doc.data.get("env", {})),
                 scheduler=doc.data.get("scheduler"), gpus=gpus, prelude=tuple(doc.data.get("prelude", [])),
                 modules=tuple(doc.data.get("modules", [])))
