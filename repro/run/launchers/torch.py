from repro.run.launchers import LAUNCHERS
from repro.run.launchers.base import SameCommandOnEveryNode


@LAUNCHERS.register("torch")
class TorchLauncher(SameCommandOnEveryNode):
    """DLE ``multiproc.py`` / ``torchrun`` style: every node runs the launcher with its own
    ``{node_rank}`` and the shared ``{master_addr}:{master_port}``; the kit assigns the ranks
    in hosts-file order, so nobody edits a rank by hand."""
