"""The ``tf-ps`` launcher: TensorFlow parameter-server jobs, a worker task on every node and a ps
task beside it on the nodes launch.parameter_servers names for the cell (by default every node).

Worker tasks listen on launch.master_port of every node ({worker_hosts}), parameter servers on the
port above it of their nodes ({ps_hosts}, in ps task order); {task_index} is a worker's rank and a
parameter server's place in ps_hosts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from repro.spec.hosts import Node
from repro.run.launchers import LAUNCHERS
from repro.run.launchers.base import Launcher, NodeCommand, fill
from repro.spec.manifest import Cell, Launch

#: where each container gets the ps/worker pair runner (repro/run/launchers/tf_ps_pair.py)
PAIR_PATH = "/tmp/repro-tf-ps-pair.py"

#: what a ps task runs under: no GPU visible, as the upstream harness starts ps tasks ("Don't let ps or
#: controller processes use the gpu": tensorflow/benchmarks scripts/tf_cnn_benchmarks/
#: benchmark_cnn_distributed_test.py line 225 at 8fb7907); a ps that sees the node's GPUs takes their memory
#: beside the worker's. ``env`` (coreutils) sets it as argv, for the ps process alone.
PS_NO_GPU = ("env", "CUDA_VISIBLE_DEVICES=")


@LAUNCHERS.register("tf-ps")
class TfParameterServerLauncher(Launcher):
    """TensorFlow between-graph replication with parameter servers (tf_cnn_benchmarks
    ``--variable_update=distributed_replicated``): every node runs a worker task, and the nodes
    that carry a parameter server run it beside their worker, as the TensorFlow benchmarks did
    ("EC2 instances running worker servers also ran parameter servers"). The command is written
    once, with ``{job_name}``, ``{ps_hosts}``, ``{worker_hosts}`` and ``{task_index}``; a node
    with a ps runs it as ``ps`` and as ``worker`` through a small runner the kit writes into its
    container, a node without one runs the worker alone. The ps task sees no GPU (``PS_NO_GPU``)."""

    def render(self, launch: Launch, cell: Cell, nodes: Sequence[Node],
               env: Mapping[str, str]) -> list[NodeCommand]:
        runner = Path(__file__).with_name("tf_ps_pair.py").read_text(encoding="utf-8")
        ps_ranks = launch.ps_ranks(cell)
        out = []
        for rank, node in enumerate(nodes):
            worker = fill(launch.command, launch, cell, nodes, rank, job_name="worker")
            if rank not in ps_ranks:
                out.append(NodeCommand(node, rank, "worker", worker, dict(env)))
                continue
            ps = (*PS_NO_GPU, *fill(launch.command, launch, cell, nodes, rank, job_name="ps"))
            out.append(NodeCommand(node, rank, "ps+worker",
                                   (launch.command[0], PAIR_PATH, str(len(ps)), *ps, *worker),
                                   dict(env), {PAIR_PATH: runner}))
        return out
