"""Scheduler plugins: how ``repro up`` gets its nodes and starts each cell on them.

``ssh`` (the default) runs on the inventory's nodes and starts containers through their
engines; ``slurm`` takes an allocation from Slurm and starts every cell as a job step.
Chosen by the inventory's ``scheduler:`` section or ``--scheduler KIND[:KEY=VALUE,...]``
(which wins, key by key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.events import Event
from repro.registry import Registry
from repro.run.plan import plan_hosts
from repro.run.schedulers.base import Scheduler
from repro.spec.hosts import Hosts
from repro.spec.manifest import Cell, Manifest
from repro.spec.scheduler import SETTINGS, problems

SCHEDULERS: Registry[Scheduler] = Registry("scheduler",
                                            ["repro.run.schedulers.ssh", "repro.run.schedulers.slurm"])
KEYS = tuple(SETTINGS)


def parse_spec(text: str) -> dict[str, str]:
    """``slurm:partition=gpu,time=2:00:00`` -> {"kind": "slurm", "partition": "gpu", "time": "2:00:00"}."""
    kind, _, rest = text.partition(":")
    out = {"kind": kind.strip()}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in KEYS[1:]:
            raise UsageError(f"--scheduler {text}: {item!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(KEYS[1:])}",
                             hint="e.g. --scheduler slurm:partition=debug,time=30,container=docker")
        out[key] = value
    for key, why, fix, _ in problems({k: v for k, v in out.items() if k != "kind"}):
        raise UsageError(f"--scheduler {key}: {why}", hint=f"{fix} (--scheduler {out['kind']}:{key}=...)")
    return out


def scheduler_config(inventory: Mapping[str, Any] | None, option: str | None) -> dict[str, str]:
    """The inventory's section with the command line's keys laid over it; kind ``ssh`` when neither says."""
    cfg = {k: v if SETTINGS.get(k, SETTINGS["kind"]).many else str(v) for k, v in (inventory or {}).items()}
    if option:
        spec = parse_spec(option)
        if spec["kind"] != cfg.get("kind"):
            cfg = {}
        cfg.update(spec)
        cfg["_option"] = ",".join(spec)  # which keys the command line gave, for error messages
    cfg.setdefault("kind", "ssh")
    SCHEDULERS.get(cfg["kind"])  # an unknown kind is a usage error naming the known ones
    return cfg


def make_scheduler(hosts: Hosts, manifest: Manifest | None, cells: Sequence[Cell], option: str | None,
                   progress: Callable[[Event], None] | None = None) -> Scheduler:
    """The scheduler the inventory's section and ``--scheduler`` choose, made for this run."""
    cfg = scheduler_config(hosts.scheduler, option)
    return SCHEDULERS.get(cfg["kind"])(cfg, manifest, cells, hosts, progress)


def scheduled_preflight(hosts: Hosts, manifest: Manifest | None, option: str | None, *,
                        accept_new_host_keys: bool = False, dataset: Any = None,
                        progress: Callable[[Event], None] | None = None) -> tuple[list[Any], int]:
    """Preflight where the scheduler runs things: the inventory's nodes over SSH, or every node of an
    allocation (the one the kit runs in, else a short one of the nodes the target needs, released at the
    end). Returns the reports and the node count."""
    cells = manifest.cells() if manifest else []
    sched = make_scheduler(hosts, manifest, cells, option, progress)
    if not sched.allocates:
        return sched.preflight(hosts.nodes, accept_new_host_keys=accept_new_host_keys,
                               dataset=dataset), len(hosts.nodes)
    need = max((c.nodes for c in cells), default=len(hosts.nodes) or 1)
    try:
        used = sched.open(need, preflight=True)
        return sched.preflight(used.nodes, dataset=dataset), len(used.nodes)
    finally:
        sched.close()


def scheduled_plan(manifest: Manifest, cells: Sequence[Cell], hosts_file: Path | None,
                   option: str | None) -> tuple[Hosts, str]:
    """The inventory a dry run shows and the scheduler's own text (under Slurm, what ``repro up`` submits)."""
    hosts = plan_hosts(manifest, cells, hosts_file)
    cfg = scheduler_config(hosts.scheduler, option)
    cfg.pop("_option", None)
    shown, text = SCHEDULERS.get(cfg["kind"]).plan_text(cfg, manifest, hosts, cells)
    return replace(shown, placeholder=shown.placeholder or (shown is not hosts and hosts_file is None)), text


def scheduled_script(manifest: Manifest, cells: Sequence[Cell], hosts_file: Path | None,
                     option: str | None, repeats: int | None = None) -> str:
    """The batch script ``repro up --detach`` submits for these cells (``repro plan --script``): the image by
    the lock's digest; a built image as ``REGISTRY/TAG@DIGEST`` (``up`` knows both once ``--push`` pushed
    it)."""
    from repro.images import lock

    hosts = plan_hosts(manifest, cells, hosts_file)
    cfg = scheduler_config(hosts.scheduler, option)
    cfg.pop("_option", None)
    image = manifest.image_reference
    if "build" in manifest.image:
        image = f"REGISTRY/{image}@DIGEST"
    elif "@" not in image:
        pins = lock.read_lock(lock.lock_path(manifest))
        if not pins or not pins.images.get("image") or not pins.images["image"].digest:
            raise UsageError(f"{manifest.id}: no lock pins its image {image} ({lock.lock_path(manifest)})",
                             hint=f"run `repro lock {manifest.id}`: a batch script runs its image by digest")
        image = pins.images["image"].pinned
    return SCHEDULERS.get(cfg["kind"]).detached_script(cfg, manifest, hosts, cells, image, repeats)


def plan_runtime(hosts: Hosts, option: str | None) -> str:
    """What starts the containers of a dry run's cells (``docker``, ``pyxis``, ``apptainer``)."""
    cfg = scheduler_config(hosts.scheduler, option)
    return SCHEDULERS.get(cfg["kind"]).runtime(cfg)
