from collections.abc import Mapping, Sequence

from repro.spec.hosts import Node
from repro.run.launchers import LAUNCHERS
from repro.run.launchers.base import NodeCommand, SameCommandOnEveryNode
from repro.spec.manifest import Cell, Launch


@LAUNCHERS.register("paddle")
class PaddleLauncher(SameCommandOnEveryNode):
    """``python -m paddle.distributed.launch --ips={hosts}``: the identical command runs on
    every node and Paddle derives the node rank by finding the local address in ``--ips``,
    so the kit's rank is the position of the node in the hosts file.

    Paddle finds "the local address" by resolving the host name; where names do not resolve
    (or resolve to another interface) every node silently takes rank 0. The kit knows each
    node's address, so it hands it over in ``POD_IP``, which the launcher prefers.
    """

    def render(self, launch: Launch, cell: Cell, nodes: Sequence[Node],
               env: Mapping[str, str]) -> list[NodeCommand]:
        return [NodeCommand(c.node, c.rank, c.role, c.command, {**c.env, "POD_IP": c.node.rendezvous},
                            c.files)
                for c in super().render(launch, cell, nodes, env)]
