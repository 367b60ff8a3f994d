"""Scheduler plugins: how ``repro up`` gets its nodes and starts each cell on them.

``ssh`` (the default) runs on the inventory's nodes and starts containers through their
engines; ``slurm`` takes an allocation from Slurm and starts every cell as a job step.
Chosen by the inventory's ``scheduler:`` section or ``--scheduler KIND[:KEY=VALUE,...]``
(which wins, key by key).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repro.errors import UsageError
from repro.registry import Registry
from repro.schedulers.settings import SETTINGS, problems

SCHEDULERS: Registry[Any] = Registry("scheduler", ["repro.schedulers.ssh", "repro.schedulers.slurm"])
KEYS = tuple(SETTINGS)


def parse_spec(text: str) -> dict[str, str]:
    """``slurm:partition=gpu,time=2:00:00`` -> {"kind": "slurm", "partition": "gpu", "time": "2:00:00"}."""
    kind, _, rest = text.partition(":")
    out = {"kind": kind.strip()}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in KEYS[1:]:
            raise UsageError(f"--scheduler {text}: {item!r} is not KEY=VALUE with KEY one of {', '.join(KEYS[1:])}",
                             hint="e.g. --scheduler slurm:partition=debug,time=30,container=docker")
        out[key] = value
    for key, why, fix in problems({k: v for k, v in out.items() if k != "kind"}):
        raise UsageError(f"--scheduler {key}: {why}", hint=f"{fix} (--scheduler {out['kind']}:{key}=...)")
    return out


def scheduler_config(inventory: Mapping[str, Any] | None, option: str | None) -> dict[str, str]:
    """The inventory's section with the command line's keys laid over it; kind ``ssh`` when neither says."""
    cfg = {k: str(v) for k, v in (inventory or {}).items()}
    if option:
        spec = parse_spec(option)
        if spec["kind"] != cfg.get("kind"):
            cfg = {}
        cfg.update(spec)
        cfg["_option"] = ",".join(spec)  # which keys the command line gave, for error messages
    cfg.setdefault("kind", "ssh")
    SCHEDULERS.get(cfg["kind"])  # an unknown kind is a usage error naming the known ones
    return cfg
