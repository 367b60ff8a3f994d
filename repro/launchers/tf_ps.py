"""The ``tf-ps`` launcher: TensorFlow parameter-server jobs, a ps and a worker task on every node.

Worker tasks listen on launch.master_port and parameter servers on the port above it, on every
node ({worker_hosts}, {ps_hosts}); {task_index} is the node's rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from repro.hosts import Node
from repro.launchers import LAUNCHERS
from repro.launchers.base import Launcher, NodeCommand, fill
from repro.manifest import Cell, Launch

#: where each container gets the ps/worker pair runner (repro/launchers/tf_ps_pair.py)
PAIR_PATH = "/tmp/repro-tf-ps-pair.py"


@LAUNCHERS.register("tf-ps")
class TfParameterServerLauncher(Launcher):
    """TensorFlow between-graph replication with parameter servers (tf_cnn_benchmarks
    ``--variable_update=distributed_replicated``): every node runs a parameter-server task and a
    worker task side by side, as the TensorFlow benchmarks did ("EC2 instances running worker
    servers also ran parameter servers"). The command is written once, with ``{job_name}``,
    ``{ps_hosts}``, ``{worker_hosts}`` and ``{task_index}``; the node's container runs it as
    ``ps`` and as ``worker`` through a small runner the kit writes into it."""

    def render(self, launch: Launch, cell: Cell, nodes: Sequence[Node], env: Mapping[str, str]) -> list[NodeCommand]:
        runner = Path(__file__).with_name("tf_ps_pair.py").read_text(encoding="utf-8")
        out = []
        for rank, node in enumerate(nodes):
            ps, worker = (fill(launch.command, launch, cell, nodes, rank, job_name=job) for job in ("ps", "worker"))
            out.append(NodeCommand(node, rank, "worker", (launch.command[0], PAIR_PATH, str(len(ps)), *ps, *worker),
                                   dict(env), {PAIR_PATH: runner}))
        return out
