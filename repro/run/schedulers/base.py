"""The scheduler interface: how ``repro up``, ``repro preflight`` and ``repro plan`` get nodes and run cells.

A scheduler is made for one run (its settings, the target, the selected cells and the inventory) and
used in this order: ``check`` (everything it can refuse before anything is built or submitted), ``open``
(the nodes), ``preflight`` (one report per node), ``launch_cell`` per cell and repeat, ``facts`` (what
the provenance records of it) and ``close`` (on every path out). Class attributes tell ``up`` what it
needs to know, so it never branches on a scheduler's name.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.errors import UsageError
from repro.events import Event
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Cell, Manifest

if TYPE_CHECKING:
    from repro.images import ImagesOptions
    from repro.nodes.preflight import NodeReport
    from repro.run.cell import CellJob, NodeResult


class Scheduler(abc.ABC):
    name: str                   # set by the registry
    #: the scheduler takes its nodes from somewhere else than the inventory (the run directory then records
    #: the nodes it got, and the image is made before any node is held)
    allocates: bool = False

    def __init__(self, config: Mapping[str, str], manifest: Manifest | None, cells: Sequence[Cell],
                 hosts: Hosts, progress: Callable[[Event], None] | None = None) -> None:
        self.cfg, self.manifest, self.cells, self.inventory = dict(config), manifest, cells, hosts
        self.progress = progress or (lambda e: None)

    @property
    def engines(self) -> bool:
        """Whether each node's Docker engine runs the containers (the image goes to every engine, and the kit
        holds a client per node); False where the nodes' own runtime pulls the image (pyxis/enroot)."""
        return True

    @abc.abstractmethod
    def check(self, need: int, *, preflight: bool = False) -> None:
        """Raise UsageError or EnvironmentUnavailable for anything that would stop a run of ``need`` nodes,
        before anything is built or submitted; ``preflight``: for a preflight alone."""

    @abc.abstractmethod
    def open(self, need: int, *, preflight: bool = False) -> Hosts:
        """The ``need`` nodes the run uses, in rank order, with the inventory's settings."""

    @abc.abstractmethod
    def preflight(self, nodes: Sequence[Node], *, accept_new_host_keys: bool = False,
                  dataset: Any = None) -> list[NodeReport]:
        """One report per node, from preflight's node script run where this scheduler runs things."""

    @abc.abstractmethod
    def launch_cell(self, job: CellJob) -> list[NodeResult]:
        """Run one repeat of ``job.cell`` on ``job.hosts``: one result per rank; raise CellFailed if any
        failed, and leave nothing running on any path out."""

    def image_options(self, options: ImagesOptions) -> ImagesOptions:
        """How this scheduler needs the image made (e.g. without the sshd layer where Slurm's PMI starts an
        mpi target's ranks); by default as given."""
        return options

    def facts(self) -> dict[str, Any] | None:
        """What the provenance records of the scheduler (None: nothing beyond the nodes)."""
        return None

    def close(self, interrupted: bool = False) -> None:
        """Release what ``open`` took (called on every path out; twice is harmless)."""

    def check_detach(self) -> None:
        """Raise UsageError where this scheduler cannot run ``detach`` (before anything is built)."""
        raise UsageError(f"--detach needs a scheduler that queues the run as a batch job; {self.name} does "
                         "not", hint="--scheduler slurm (or kind: slurm in the hosts file's scheduler: "
                                     "section)")

    def detach(self, run: Path, image: str, *, repeats: int | None = None, fail_fast: bool = False) -> str:
        """Submit the whole run as one batch job that writes everything it does into the run directory
        ``run``, and return the job's id (``repro up --detach``; the caller then exits)."""
        self.check_detach()
        raise NotImplementedError

    @classmethod
    def detached_script(cls, cfg: Mapping[str, str], manifest: Manifest, hosts: Hosts, cells: Sequence[Cell],
                        image: str, repeats: int | None = None) -> str:
        """The batch script ``detach`` submits, as exact text (``repro plan --script``)."""
        raise UsageError(f"--script prints a batch script; scheduler {cls.name} submits none",
                         hint="--scheduler slurm (or kind: slurm in the hosts file's scheduler: section)")

    @classmethod
    def job_state(cls, job_id: str) -> str | None:
        """What the scheduler says of a detached run's job (None: nothing it can tell)."""
        return None

    @classmethod
    def runtime(cls, cfg: Mapping[str, Any]) -> str:
        """What starts the containers under these settings: ``docker`` (the nodes' engines), or a runtime the
        scheduler starts itself (``repro plan`` then shows no ``docker run`` line)."""
        return "docker"

    @classmethod
    def plan_text(cls, cfg: Mapping[str, str], manifest: Manifest, hosts: Hosts,
                  cells: Sequence[Cell]) -> tuple[Hosts, str]:
        """What ``repro plan`` adds for this scheduler (the nodes it shows, and its text)."""
        return hosts, ""
