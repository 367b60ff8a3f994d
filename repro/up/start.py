"""What the attached and the detached run share before any cell runs: the options, the result, the target
and its selected cells (chosen once, here), the scheduler made for them, the pins held against the lock,
the image made before any node is held, the new run directory with the run's lock beside its manifest, and
the image's facts for the provenance record."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.events import Event, Progress
from repro.images import ImagesOptions, ImagesResult, check_pins, lock, prepare
from repro.run.rundir import MANIFEST, RunDir
from repro.run.schedulers import Scheduler, make_scheduler
from repro.spec.hosts import Hosts
from repro.spec.manifest import Cell, Manifest, find_target, synthetic


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the matrix: every container is gone; the run directory can be resumed."""

    def __init__(self, run_path: Path) -> None:
        super().__init__(str(run_path))
        self.run_path = run_path


@dataclass(frozen=True)
class UpOptions:
    hosts_file: Path | None = None
    cells: Sequence[Mapping[str, Any]] = ()
    repeats: int | None = None
    resume: Path | None = None
    fail_fast: bool = False
    out: Path = Path("logs")
    strict: bool = False
    accept_new_host_keys: bool = False
    skip_preflight: bool = False
    synthetic: bool = False  # the synthetic-data run the manifest declares (dataset.synthetic)
    scheduler: str | None = None  # --scheduler KIND[:KEY=VALUE,...] (repro.run.schedulers)
    images: ImagesOptions = field(default_factory=ImagesOptions)


@dataclass
class UpResult:
    run: RunDir
    manifest: Manifest
    record: dict[str, Any] = field(default_factory=dict)  # the provenance record being filled
    done: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cell_seconds: float = 0.0
    verdicts: list[str] = field(default_factory=list)  # one per cell this invocation ran, once finished
    cells: Sequence[Cell] = ()  # the cells this invocation ran (--cells): what its exit status speaks of
    table: Any = None  # the run's judged table (a TableResult), once finished: what the results store keeps


@dataclass
class Start:
    """A run about to start: its target, the inventory, the cells it runs (the ``--cells`` selection, made
    once), the scheduler made for them, the options and where progress goes."""

    manifest: Manifest
    hosts: Hosts
    cells: list[Cell]
    sched: Scheduler
    opts: UpOptions
    progress: Progress

    @property
    def need(self) -> int:
        """The nodes the largest selected cell needs."""
        return max(c.nodes for c in self.cells)


def target_manifest(target: str | None, opts: UpOptions) -> Manifest:
    """A new run's target (``--synthetic``: its synthetic-data variant)."""
    if not target:
        raise UsageError("give a TARGET, or --resume RUN_DIR")
    manifest = find_target(target)
    return synthetic(manifest) if opts.synthetic else manifest


def start(manifest: Manifest, hosts: Hosts, opts: UpOptions, progress: Progress) -> Start:
    """The cells ``--cells`` selects (none is a usage error) and the scheduler made for them."""
    cells = manifest.select(opts.cells)
    if not cells:
        raise UsageError(f"no cell of {manifest.id} matches the --cells filter")
    sched = make_scheduler(hosts, manifest, cells, opts.scheduler, progress)
    return Start(manifest, hosts, cells, sched, opts, progress)


def before_nodes(s: Start, *, detached: bool = False) -> ImagesResult | None:
    """What a run does before any node is held, refusals first, in the order each path has them: whether the
    scheduler can queue a ``detached`` run and the registry a built image needs then, the scheduler's
    checks, the pins against the lock file, the registry an attached run's nodes pull from where no engine
    of theirs runs the containers. Then the image where the nodes cannot take it from the kit's hand:
    before the allocation (the scheduler allocates), or before the job is submitted (detached); None where
    it goes to the nodes once they are held."""
    sched, manifest, opts, progress = s.sched, s.manifest, s.opts, s.progress
    builds = "build" in manifest.image and not opts.images.push
    if detached:
        sched.check_detach()
        if builds:
            raise _needs_push(manifest, "a detached run's nodes pull it by digest from a registry: nothing "
                                        "streams it to them while you are away")
    sched.check(s.need)  # what the scheduler can refuse, before anything is built or submitted
    progress(Event("step", "checking the pins against the lock file"))
    check_pins(manifest, opts.images, progress=progress)
    if builds and not sched.engines:
        raise _needs_push(manifest, f"{sched.runtime(sched.cfg)} takes images from a registry by digest")
    if not (detached or sched.allocates):
        return None
    # no allocation is held while the image is built and pushed; the nodes are known only once Slurm
    # allocates them, so the transfer to them (a pull by digest with --push) is done inside it
    progress(Event("step", f"the image, before {'the job is submitted' if detached else 'the allocation'}"))
    return prepare(manifest, no_nodes(s.hosts), opts.images, progress=progress)


def _needs_push(manifest: Manifest, because: str) -> UsageError:
    return UsageError(f"{manifest.id} builds its image, and {because}",
                      hint="give --push REGISTRY (a registry the cluster's nodes can pull from)")


def no_nodes(hosts: Hosts) -> Hosts:
    """The inventory without its nodes: the image made here alone (built, pulled, pushed)."""
    return replace(hosts, nodes=(), scheduler=None, gpus=None)


def new_run(s: Start, hosts: Hosts, run_id: str, pins: lock.Pins) -> RunDir:
    """The run directory (``hosts``: the inventory it keeps for --resume) with the run's lock beside its
    manifest (what --resume runs again)."""
    run = RunDir.create(s.opts.out, s.manifest, hosts, run_id=run_id)
    lock.write_lock(lock.lock_beside(run.file(MANIFEST)), s.manifest, pins)
    s.progress(Event("info", f"run directory {run.path}", data={"run_dir": str(run.path)}))
    return run


def probe_image(engine: Any, manifest: Manifest, reference: str, run_id: str) -> Any:
    """The image's facts from a probe container of it on ``engine``, labelled with the run's id."""
    from repro.nodes import facts as probes

    sources = [manifest.source["path"]] if manifest.source else []
    return probes.probe_container(engine, reference, sources=sources, run_id=run_id)


def image_record(img: Any, ref: str, digest: str | None) -> dict[str, Any]:
    """What the provenance records of the image ``img`` (a docker-py Image) the nodes run as ``ref``."""
    return {"ref": ref, "id": img.id, "repo_digests": img.attrs.get("RepoDigests") or [], "digest": digest,
            "labels": img.labels}
