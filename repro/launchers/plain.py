from repro.launchers import LAUNCHERS
from repro.launchers.base import SameCommandOnEveryNode


@LAUNCHERS.register("plain")
class PlainLauncher(SameCommandOnEveryNode):
    """The command as written, on every node of the cell (usually one)."""
