from repro.run.launchers import LAUNCHERS
from repro.run.launchers.base import SameCommandOnEveryNode


@LAUNCHERS.register("plain")
class PlainLauncher(SameCommandOnEveryNode):
    """The command as written, on every node of the cell (usually one)."""
