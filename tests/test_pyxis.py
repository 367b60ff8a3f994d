"""The pyxis runner's pure parts: each rank's own environment in its --multi-prog line, the per-run image
import step and the cell steps that start from its squashfs, as exact text."""

from __future__ import annotations

from repro.run.plan import plan_cell, select_cells
from repro.run.schedulers.slurm import pyxis_head, pyxis_step
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import find_target

DIGEST = "sha256:" + "a" * 64
PADDLE = ("python /opt/repro/with_node_address.py 10.0.0.1,10.0.0.2 python -m paddle.distributed.launch "
          "--ips=10.0.0.1,10.0.0.2 --nnodes=2 --nproc_per_node 1 --start_port=6070 /opt/repro/rn50_paddle_cpu.py "
          "-b 8 --steps 15 --image-size 64 --precision fp32")


def two_nodes() -> Hosts:
    return Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)),
                 env={"GLOO_SOCKET_IFNAME": "eth0"})


def cell_of(target: str, nodes: int):
    m = find_target(target)
    return m, [c for c in select_cells(m) if c.nodes == nodes][-1]


def test_each_paddle_rank_gets_its_own_pod_ip_not_the_first_ranks():
    """The Paddle launcher ranks a node by its POD_IP: the variables that differ between ranks go on each
    rank's --multi-prog line; only the shared ones go through srun's environment."""
    m, cell = cell_of("paddle-rn50-cpu", 2)
    argv, env, conf = pyxis_step(m, cell, plan_cell(m, cell, two_nodes()), "127.0.0.1:5000/repro/cpu-paddle@" + DIGEST,
                                 pyxis_head("42", ["n1", "n2"], "repro-2n1g-fp32-bs8"), "/runs/r/multi-prog.conf")
    assert env == {"GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
    assert "--container-env=GLOO_SOCKET_IFNAME,PYTHONUNBUFFERED" in argv
    assert conf == (f"0 env POD_IP=10.0.0.1 {PADDLE}\n"
                    f"1 env POD_IP=10.0.0.2 {PADDLE}\n")
