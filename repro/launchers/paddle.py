from repro.launchers import LAUNCHERS
from repro.launchers.base import SameCommandOnEveryNode


@LAUNCHERS.register("paddle")
class PaddleLauncher(SameCommandOnEveryNode):
    """``python -m paddle.distributed.launch --ips={hosts}``: the identical command runs on
    every node and Paddle derives the node rank by finding the local address in ``--ips``,
    so the kit's rank is the position of the node in the hosts file."""
