"""``container: apptainer``, as text and argv (pure functions): the job step that builds the run's SIF once
and each cell's job step ``srun … apptainer exec … IMAGE.sif``.

Every flag is Apptainer's own, checked against its documentation and source (apptainer/apptainer
``cmd/internal/cli/action_flags.go``, the user guide's ``environment_and_metadata.rst``, ``mpi.rst`` and
``docker_and_oci.rst``, https://apptainer.org/docs/user/main/):

- ``exec --nv``: the node's NVIDIA driver libraries and devices in the container (GPU targets only);
  ``--cleanenv``: no variable of the node's environment but those prefixed ``APPTAINERENV_``;
  ``--no-home``: the home directory is not mounted (as pyxis's ``--no-container-mount-home``);
  ``--writable-tmpfs``: the image's read-only file system writable through a tmpfs overlay that ends with
  the container, so every repeat starts from the image's own root file system;
  ``--bind SRC:DEST[:ro]``: the manifest's mounts (one flag each: Apptainer splits a flag's value at ``,``
  and its fields at ``:``, and escapes neither); ``--cwd=DIR``: the manifest's working directory (Apptainer
  1.3 and later; older releases name it ``--pwd``, which the kit's redaction would hide as a password).
- The target's environment reaches the container as ``APPTAINERENV_NAME`` in srun's environment (values
  never in argv); a variable whose value differs between ranks (paddle's ``POD_IP``) as ``--env`` on that
  rank's line.
- ``--cleanenv`` also drops the variables slurmstepd gives each task, which the image's MPI needs to find
  Slurm's PMI (``PMIX_*``, ``PMI_*``) and a launcher its rank (``SLURM_*``): ``FORWARD`` re-exports each as
  ``APPTAINERENV_NAME`` in the task before ``apptainer`` starts (Apptainer's ``SetContainerEnv`` passes
  those, and nothing else, under ``--cleanenv``). MPI targets start one task per rank with ``srun --mpi``
  (the hybrid model of the user guide's MPI page: the image's MPI must support that PMI), no mpirun and no
  sshd; the others run one launcher per node through ``--multi-prog``.
- ``build --force SIF docker://REGISTRY/REPO@sha256:…``: the SIF made once per run from the locked image by
  digest, in ``sif_dir`` (a directory every node sees), on the allocation's first node; the step prints
  ``apptainer --version`` and the SIF's sha256 for the provenance.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from repro.errors import UsageError
from repro.run.launchers.base import fill
from repro.run.schedulers.slurm.rankfiles import files_first
from repro.run.schedulers.slurm.siteenv import BASE_EXPORT, StepSite, memlock_checked, step_options
from repro.spec.manifest import Cell, Manifest

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: re-exports the task's Slurm and PMI variables as APPTAINERENV_* (kept by --cleanenv), then runs its
#: arguments. No single quote in it: srun's --multi-prog reads a single-quoted word only where it holds none.
FORWARD = ('for v in $(env | cut -d= -f1 | grep -E "^(PMIX|PMI|SLURM)_[A-Za-z0-9_]*$"); do '
           'eval "export APPTAINERENV_$v=\\"\\${$v}\\""; done; exec "$@"')
#: the SIF build step's script: $1 the SIF, $2 the source; prints the version, ``sha256sum``'s line and the
#: size
BUILD = ('apptainer --version && apptainer build --force "$1" "$2" >&2 && sha256sum "$1" && '
         'stat -c "size %s" "$1"')


def sif_path(sif_dir: str, run_id: str) -> str:
    return f"{sif_dir.rstrip('/')}/repro-{run_id}.sif"


def sif_source(image: str) -> str:
    """The locked image as ``apptainer build`` takes it: ``docker://`` and the reference by digest."""
    if "@sha256:" not in image:
        raise UsageError(f"apptainer builds the run's SIF from an image by digest, and {image!r} has none",
                         hint="give --push REGISTRY (a registry the cluster's nodes can pull from)")
    return f"docker://{image}"


def build_argv(job: str, node: str, sif: str, image: str, export: str = BASE_EXPORT) -> list[str]:
    """The job step that builds the SIF once, on one node, where every node sees it; ``export``: what it
    passes (``siteenv.host_export``)."""
    return ["srun", f"--jobid={job}", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", export,
            "--job-name=repro-sif", "sh", "-c", BUILD, "sh", sif, sif_source(image)]


def seen_argv(job: str, nodes: Sequence[str], sif: str) -> list[str]:
    """The job step that asks every node of a cell for the SIF's size: ``sif_dir`` must be shared."""
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--label", BASE_EXPORT,
            "--job-name=repro-sif-seen", "stat", "-c", "%s", "--", sif]


def rm_argv(job: str, node: str, sif: str) -> list[str]:
    """The job step that removes the run's SIF, on the node that built it."""
    return ["srun", f"--jobid={job}", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            BASE_EXPORT, "--job-name=repro-sif-rm", "rm", "-f", "--", sif]


def unseen(lines: Sequence[str], nodes: Sequence[str], size: int) -> list[str]:
    """The nodes (in ``seen_argv``'s task order) whose answer is not the built SIF's size."""
    said: dict[int, str] = {}
    for line in lines:
        task, sep, text = line.partition(": ")
        if sep and task.strip().isdigit():
            said[int(task)] = text.strip()
    return [n for i, n in enumerate(nodes) if said.get(i) != str(size)]


def build_result(lines: Sequence[str], sif: str) -> dict[str, Any]:
    """The version, the SIF's sha256 and its size from the build step's output."""
    version = next((ln.strip() for ln in lines if ln.strip().startswith("apptainer version")), None)
    digest = next((ln.split()[0] for ln in lines if len(ln.split()) == 2 and ln.split()[1] == sif
                   and len(ln.split()[0]) == 64), None)
    size = next((int(ln.split()[1]) for ln in lines if len(ln.split()) == 2 and ln.split()[0] == "size"
                 and ln.split()[1].isdigit()), None)
    return {"apptainer": version, "sha256": digest, "size": size}


def exec_options(manifest: Manifest, container: Mapping[str, Any]) -> list[str]:
    """``apptainer exec``'s options for one rank's container (the plan's container options)."""
    opts = (["--nv"] if manifest.device == "GPU" else []) + ["--cleanenv", "--no-home", "--writable-tmpfs"]
    for src, m in container.get("volumes", {}).items():
        if any(c in path for path in (src, m["bind"]) for c in ",:\n\r\0"):
            raise UsageError(f"the mount {src!r} -> {m['bind']!r} cannot go to apptainer: --bind separates "
                             "entries with ',' and fields with ':', and escapes neither",
                             hint="use a directory (the hosts file's data:, the manifest's mounts) whose "
                                  "path has no ',' or ':', e.g. a link to it")
        opts.append(f"--bind={src}:{m['bind']}" + (":ro" if m["mode"] == "ro" else ""))
    if "working_dir" in container:
        opts.append(f"--cwd={container['working_dir']}")
    return opts


def apptainer_step(manifest: Manifest, cell: Cell, plans: Sequence[Any], sif: str, head: Sequence[str],
                   conf: str, *, mpi: str = "pmix", per_node: int = 1,
                   site: StepSite | None = None) -> tuple[list[str], dict[str, str], str | None]:
    """One cell under Apptainer: the srun argv (``head``: ``srun`` and its job-step options), the environment
    srun passes to the tasks (``APPTAINERENV_NAME``), and the ``--multi-prog`` configuration written to
    ``conf`` (None for MPI targets: ``srun --mpi=MPI`` starts ``per_node`` tasks a node, one per rank).
    ``site``: what the step exports (the host's ``PATH``, by name: ``apptainer`` runs there; a pass-through
    variable as ``APPTAINERENV_NAME``, ``--cleanenv`` drops the rest), its limits, CPUs and GPUs."""
    site = site or StepSite()
    envs = [p.container["environment"] for p in plans]
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs)}
    bad_env = sorted(k for e in envs for k in e if not ENV_NAME.fullmatch(k))
    if bad_env:
        raise UsageError(f"environment name {bad_env[0]!r} cannot go to apptainer as APPTAINERENV_NAME",
                         hint="name environment variables with letters, digits and '_' only")
    env = {f"APPTAINERENV_{k}": v for k, v in common.items()}
    env.update({f"APPTAINERENV_{k}": site.environ[k] for k in site.passed()})
    run = ["sh", "-c", FORWARD, "sh", "apptainer", "exec"]
    own = step_options(manifest, cell, per_node, env, site, None)
    if manifest.launch.kind == "mpi":
        argv = memlock_checked(manifest, cell, fill(manifest.launch.command, manifest.launch, cell,
                                                    [p.command.node for p in plans], 0))
        return ([head[0], f"--mpi={mpi}", *head[1:], f"--nodes={cell.nodes}",
                 f"--ntasks={cell.nodes * per_node}", f"--ntasks-per-node={per_node}", "--label", *own, *run,
                 *exec_options(manifest, plans[0].container), sif, *argv], env, None)
    lines = []
    for p, e in zip(plans, envs):
        mine = [f"--env={k}={v}" for k, v in sorted(e.items()) if k not in common]
        words = [*run, *exec_options(manifest, p.container), *mine, sif,
                 *memlock_checked(manifest, cell, files_first(p.command.command, p.command.files))]
        bad = next((t for t in words if any(c in t for c in "'\n\r\0")), None)
        bad = bad or next((t for t in mine if "," in t), None)  # --env splits its value at ','
        if bad is not None:
            raise UsageError(f"rank {p.command.rank}'s command holds a quote, line break or NUL in "
                             f"{bad!r} (or a per-rank variable a ','): srun's --multi-prog file takes one "
                             "line per rank and no quote in a quoted word",
                             hint="remove quotes and line breaks from launch.command, args and env")
        lines.append(f"{p.command.rank} {shlex.join(words)}\n")
    return ([*head, f"--nodes={cell.nodes}", f"--ntasks={cell.nodes}", "--ntasks-per-node=1", "--label", *own,
             "--multi-prog", conf], env, "".join(lines))
