"""The launcher interface: render what each node runs for one cell.

Rendering is pure: a manifest's launch section, a cell and the nodes in rank order go
in; one NodeCommand per node comes out. Commands are token lists handed to the
container runtime as argv, never joined into a shell string (``shlex.join`` is for
display only), so a manifest value with shell metacharacters stays one literal argument.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from repro.spec.hosts import Node
from repro.spec.manifest import Cell, Launch, Manifest

IB_DEVICE_DIR = "/dev/infiniband"


@dataclass(frozen=True)
class NodeCommand:
    node: Node
    rank: int
    role: str  # worker | ps+worker (tf-ps) | mpi-head | mpi-sshd
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)  # container path -> text the kit writes there


def placeholder_values(launch: Launch, cell: Cell, nodes: Sequence[Node], rank: int,
                       job_name: str = "worker") -> dict[str, str]:
    return {**_cell_values(launch, cell, nodes), "node_rank": str(rank), "node_addr": nodes[rank].rendezvous,
            "job_name": job_name,
            "task_index": str(launch.ps_ranks(cell).index(rank) if job_name == "ps" else rank)}


#: the last cell's rank-independent values: a launcher fills them for every rank, and with thousands of
#: nodes computing the host lists again for each rank would cost time quadratic in the nodes
_LAST_CELL: list[tuple[Launch, Cell, Sequence[Node], dict[str, str]]] = []


def _cell_values(launch: Launch, cell: Cell, nodes: Sequence[Node]) -> dict[str, str]:
    for seen_launch, seen_cell, seen_nodes, values in _LAST_CELL:
        if seen_launch is launch and seen_cell is cell and seen_nodes is nodes:
            return values
    worker_port, ps_port = launch.master_port, launch.master_port + 1
    ps_ranks = launch.ps_ranks(cell)
    values = {
        "batch_size": str(cell.batch_size),
        "global_batch_size": str(cell.batch_size * cell.gpus),
        "node_batch_size": str(cell.batch_size * cell.gpus_per_node),
        "gpus_per_node": str(cell.gpus_per_node),
        "gpus": str(cell.gpus),
        "gpu_list": ",".join(str(i) for i in range(cell.gpus_per_node)),
        "nnodes": str(cell.nodes),
        "master_addr": nodes[0].rendezvous,
        "master_port": str(launch.master_port),
        "hosts": ",".join(n.rendezvous for n in nodes),
        "host_ports": ",".join(f"{n.rendezvous}:{launch.master_port}" for n in nodes),
        "worker_hosts": ",".join(f"{n.rendezvous}:{worker_port}" for n in nodes),
        "ps_hosts": ",".join(f"{nodes[r].rendezvous}:{ps_port}" for r in ps_ranks),
        "precision": cell.precision,
    }
    _LAST_CELL[:] = [(launch, cell, nodes, values)]
    return values


def fill(tokens: Sequence[str], launch: Launch, cell: Cell, nodes: Sequence[Node], rank: int,
         job_name: str = "worker") -> tuple[str, ...]:
    """The command tokens with every placeholder filled for one node (and TensorFlow job)."""
    values = placeholder_values(launch, cell, nodes, rank, job_name)
    out: list[str] = []
    for tok in tokens:
        if tok == "{precision_args}":
            out.extend(t.format_map(values) for t in launch.precision_args.get(cell.precision, ()))
        elif tok == "{cell_args}":
            out.extend(a.format_map(values)
                       for when, args in launch.cell_args if cell.matches(when) for a in args)
        else:
            out.append(tok.format_map(values))
    return tuple(out)


def rdma_container_options(manifest: Manifest, cell: Cell) -> dict[str, Any]:
    """What a multi-node cell of an RDMA target adds to its containers: the HCAs' device nodes, the
    right to pin memory for them and no limit on how much (verbs registers every buffer it sends)."""
    if cell.nodes < 2 or manifest.rdma_strategy is None:
        return {}
    return {"devices": [f"{IB_DEVICE_DIR}:{IB_DEVICE_DIR}"], "cap_add": ["IPC_LOCK"],
            "ulimits": {"memlock": -1}}


class Launcher(abc.ABC):
    """How one launcher kind starts a cell on its nodes."""

    name: ClassVar[str]

    @abc.abstractmethod
    def render(self, launch: Launch, cell: Cell, nodes: Sequence[Node],
               env: Mapping[str, str]) -> list[NodeCommand]:
        """One NodeCommand per node, in rank order; ``env`` is the cell's resolved environment."""


class SameCommandOnEveryNode(Launcher):
    """The framework's own launcher runs on every node and finds its peers from the arguments."""

    def render(self, launch: Launch, cell: Cell, nodes: Sequence[Node],
               env: Mapping[str, str]) -> list[NodeCommand]:
        return [NodeCommand(node, rank, "worker", fill(launch.command, launch, cell, nodes, rank), dict(env))
                for rank, node in enumerate(nodes)]
