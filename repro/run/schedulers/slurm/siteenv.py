"""What reaches a rank under pyxis and Apptainer, and what a site runs before the kit's steps (pure).

- ``export_option``: every cell step names what it passes (``srun --export=NAMES``): what pyxis, enroot or
  Apptainer themselves read (``HOME``, ``USER``; under pyxis ``ENROOT_*``, ``NVIDIA_*`` and
  ``MELLANOX_VISIBLE_DEVICES`` where set: enroot's configuration, credentials and hooks read them), the
  ``PATH`` the kit gives each task, the manifest's and the hosts file's environment, the kit's per-rank
  variables and the hosts file's pass-through list (``scheduler: {export: [NAME, ...]}``). Slurm adds its own
  ``SLURM_*``, ``PMIX_*`` and ``CUDA_VISIBLE_DEVICES``. Nothing else of the process that ran ``repro up``
  (a login node's ``PYTHONPATH``, ``LD_PRELOAD``, ``NCCL_*``, ``UCX_*``) reaches a rank.
- ``host_export``: every other step the kit starts (preflight, the image import, the SIF build, the telemetry
  sampler, the docker agent) runs on the node itself and names what it passes too: ``PATH``, ``HOME``,
  ``USER``, ``ENROOT_*``/``NVIDIA_*`` where set, what the node's tools read where set (``DOCKER_CONFIG``, a
  site's proxy, ``APPTAINER_*``), the pass-through list and the step's own variables (``REPRO_MARKS``).
- ``clean_environ``: the environment srun itself starts with, without ``PYXIS_*`` (pyxis reads its options
  from there too: a login shell's must not change the container); the batch script unsets them (``UNSET``).
- ``propagate_option``: a cell that asks for unlimited locked memory (RDMA) propagates every resource limit
  but ``MEMLOCK`` (srun's default propagates all, and a login node's 64 KiB would become every rank's), so
  ranks get the compute node's; ``memlock_checked`` reads the limit inside the container before the target's
  command and stops the rank with the value and the fix.
- ``cpu_options``: each rank's CPUs as the manifest's publisher had them (``launch.cpu_binding``).
- ``prelude_lines``: the hosts file's ``modules:`` and ``prelude:`` entries, verbatim, one line each.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from repro.errors import UsageError

#: what pyxis and enroot read in a task's environment: always named (srun passes a name only where set)...
ALWAYS = ("HOME", "USER")
#: ...and these where set where srun starts
SITE_NAMES = ("MELLANOX_VISIBLE_DEVICES",)
SITE_PREFIXES = ("ENROOT_", "NVIDIA_")
#: what a step on the node itself reads beside those, where set: docker's configuration, a site's proxy (the
#: image import and the SIF build fetch), Apptainer's settings
HOST_NAMES = ("DOCKER_CONFIG", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "NO_PROXY")
HOST_PREFIXES = ("APPTAINER_", "SINGULARITY_")
#: Slurm's resource limit names (slurm.conf PropagateResourceLimits)
LIMITS = ("AS", "CORE", "CPU", "DATA", "FSIZE", "MEMLOCK", "NOFILE", "NPROC", "RSS", "STACK")
PROPAGATE = "--propagate=" + ",".join(limit for limit in LIMITS if limit != "MEMLOCK")
MEMLOCK_EXIT = 97
#: what each rank says of itself inside its container before the target's command, into its log (the
#: provenance reads it back: ``repro.record.rankfacts``): its Slurm rank, its locked-memory limit (KiB), its
#: CPUs (``Cpus_allowed_list``), then its environment, one variable a line. No single quote (srun's
#: --multi-prog reads a single-quoted word only where it holds none), no ``##repro`` (the agent's marks)
RANK_FACTS = ('r=${SLURM_PROCID:--}; echo "#repro-site rank $r memlock $(ulimit -l) cpus $(sed -n '
              '"s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"; '
              'env | sed "s/^/#repro-site env $r /"; ')
RANK_WRAP = RANK_FACTS + 'exec "$@"'
#: then, where the cell asks for unlimited locked memory, each node's first task of the step
#: (``SLURM_LOCALID`` 0: every task of a node has the limit its slurmstepd gives) checks it; each step
#: checks again (a retried or resumed repeat may run on other nodes)
MEMLOCK_CHECK = RANK_FACTS + (
    '[ "${SLURM_LOCALID:-0}" != 0 ] || { l=$(ulimit -l); [ "$l" = unlimited ] || { echo "repro: locked '
    "memory is limited to $l KiB in the container of this rank; the cell asks for unlimited (RDMA): give "
    "slurmd LimitMEMLOCK=infinity (its systemd unit) on every compute node, or set "
    f'PropagateResourceLimitsExcept=MEMLOCK in slurm.conf" >&2; exit {MEMLOCK_EXIT}; }}; }}; exec "$@"')
#: the batch script drops what pyxis would read from the job's environment as its options
UNSET = ('for v in $(env | sed -n "s/^\\(PYXIS_[A-Za-z0-9_]*\\)=.*/\\1/p"); do unset "$v"; done')


def site_names(environ: Mapping[str, str]) -> list[str]:
    """The names pyxis, enroot and Apptainer read: ``HOME``, ``USER`` and those ``environ`` sets."""
    return sorted({*ALWAYS, *(k for k in environ if k in SITE_NAMES or k.startswith(SITE_PREFIXES))})


def passthrough(cfg: Mapping[str, Any]) -> list[str]:
    """The hosts file's pass-through names (``scheduler: {export: [...]}``, or ``--scheduler
    slurm:export=A,B``)."""
    value = cfg.get("export")
    if value in (None, ""):
        return []
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(v) for v in items]


def export_names(environ: Mapping[str, str], cfg: Mapping[str, Any], env: Iterable[str]) -> list[str]:
    """Every name a cell step exports by name: the site's (where set), the step's environment, the
    pass-through list."""
    return sorted({*site_names(environ), *env, *passthrough(cfg)})


def export_option(names: Iterable[str], path: str | None = None) -> str:
    """``--export=``: the ``PATH`` each task gets (a value: srun exports nothing else by value), then the
    names."""
    return "--export=" + ",".join([*([f"PATH={path}"] if path else []), *sorted(set(names))])


def host_export(environ: Mapping[str, str] | None = None, cfg: Mapping[str, Any] | None = None,
                own: Iterable[str] = ()) -> str:
    """``--export=`` of a step on the node itself (no container of the kit's): ``PATH`` by name, the site's
    names, what the node's tools read (``HOST_NAMES``, ``HOST_PREFIXES``) where ``environ`` (this process's)
    sets them, the pass-through list of ``cfg`` and ``own``."""
    env = clean_environ(environ)
    tools = [k for k in env if k in HOST_NAMES or k.startswith(HOST_PREFIXES)]
    return export_option({"PATH", *site_names(env), *tools, *passthrough(cfg or {}), *own})


#: a step's export where its caller names no environment: PATH, HOME and USER
BASE_EXPORT = export_option(["HOME", "PATH", "USER"])


def clean_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """srun's own environment: ``environ`` (this process's) without pyxis's option variables."""
    return {k: v for k, v in (os.environ if environ is None else environ).items()
            if not k.startswith("PYXIS_")}


def wants_memlock(manifest: Any, cell: Any) -> bool:
    """Whether the cell asks for unlimited locked memory: its manifest's ``container.ulimits.memlock: -1``,
    or a multi-node cell of a target with an RDMA strategy."""
    asked = manifest.launch.container.get("ulimits", {}).get("memlock") == -1
    return asked or (cell.nodes > 1 and manifest.rdma_strategy is not None)


def propagate_option(manifest: Any, cell: Any) -> list[str]:
    return [PROPAGATE] if wants_memlock(manifest, cell) else []


def memlock_checked(manifest: Any, cell: Any, argv: Sequence[str]) -> list[str]:
    """``argv`` after the rank's facts (``RANK_FACTS``) and the in-container check of the locked-memory limit
    where the cell asks for unlimited."""
    return ["sh", "-c", MEMLOCK_CHECK if wants_memlock(manifest, cell) else RANK_WRAP, "sh", *argv]


def binding(manifest: Any, cell: Any) -> str:
    """The publisher's CPU binding for this cell (``launch.cpu_binding``: ``bind``, ``by_gpus``): ``none``
    where the manifest says nothing."""
    found = manifest.launch.cpu_binding
    return str(found.get("by_gpus", {}).get(str(cell.gpus), found.get("bind", "none")))


def cpu_options(manifest: Any, cell: Any, per_node: int, cpus: int | str | None) -> list[str]:
    """srun's CPU options: ``--bind-to none`` as ``--cpu-bind=none`` (one task per node keeps every CPU of
    the exclusive node), ``--bind-to socket`` as ``--cpu-bind=sockets`` with each task's share of the node's
    ``cpus`` (a number, or a shell word the batch script fills in)."""
    if binding(manifest, cell) != "socket":
        return ["--cpu-bind=none"]
    share = cpus // per_node if isinstance(cpus, int) else cpus
    return ["--cpu-bind=sockets", *([f"--cpus-per-task={share}"] if share else [])]


def prelude_lines(hosts: Any) -> list[str]:
    """The hosts file's ``prelude:`` entries, verbatim, then its ``modules:`` (``module load NAME``)."""
    return [*hosts.prelude, *(f"module load {m}" for m in hosts.modules)]


def with_prelude(lines: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` started by ``sh`` after the prelude's lines (the attached allocation's steps)."""
    if not lines:
        return list(argv)
    return ["sh", "-c", "\n".join([*lines, 'exec "$@"']), "sh", *argv]


@dataclass(frozen=True)
class StepSite:
    """What a cell step's options take from the site: the environment srun starts in (names exported where
    set there), the scheduler settings (``export``, ``gpu_request``), each node's GPUs and CPUs (a number; or,
    as a word, each task's share, which a batch script fills in or a plan names)."""

    environ: Mapping[str, str] = field(default_factory=dict)
    cfg: Mapping[str, Any] = field(default_factory=dict)
    gpus: int | None = None
    cpus: int | str | None = None

    def passed(self) -> list[str]:
        """The pass-through names set where srun starts."""
        return [n for n in passthrough(self.cfg) if n in self.environ]


def gpu_option(manifest: Any, site: StepSite) -> list[str]:
    """Every step of a GPU cell asks for the node's GPUs, whatever ``gpu_request`` the allocation used
    (under ``none`` the site's ``sbatch_extra`` asked; a step that asks for none may get none)."""
    if manifest.device != "GPU" or not site.gpus:
        return []
    how = str(site.cfg.get("gpu_request", "gpus-per-node"))
    return [f"--gpus-per-node={site.gpus}" if how == "gpus-per-node" else f"--gres=gpu:{site.gpus}"]


def step_options(manifest: Any, cell: Any, per_node: int, names: Iterable[str], site: StepSite,
                 path: str | None) -> list[str]:
    """A cell step's options beside the runtime's own: what it exports, the limits it propagates, its CPUs,
    its GPUs. ``names``: the step's own variables; ``path``: the ``PATH`` each task gets (None: this
    process's, by name)."""
    if path and any(c in path for c in ",\n\r\0"):  # srun's --export separates its entries with ','
        raise UsageError(f"the image's PATH {path[:80]!r} cannot go to srun --export: it holds a ','",
                         hint="the image's /etc/environment PATH must be plain folders joined by ':'")
    exported = export_names(site.environ, site.cfg, [*names, *([] if path else ["PATH"])])
    return [export_option(exported, path), *propagate_option(manifest, cell),
            *cpu_options(manifest, cell, per_node, site.cpus), *gpu_option(manifest, site)]
