"""Before the first MPI cell under pyxis: Slurm's PMI as a rank sees it inside its container (pure but for
``check_pmi``).

An MPI target's ranks are srun's own tasks (``srun --mpi=MPI``); each reaches Slurm's PMIx server through the
``PMIX_SERVER_URI*`` variables and the server's directory (``PMIX_SERVER_TMPDIR``), or, under ``pmi2``,
through ``PMI_FD``. enroot carries them into a container only with its PMI hook (``50-slurm-pmi.sh``, one of
enroot's *extra* hooks, not installed by default: it copies ``SLURM_*`` and ``PMIX_*`` into the container and
mounts the server's directories); without it ``MPI_Init`` fails in every rank. One task a node, started as the
cell's ranks are, says what it sees (``PMI_PROBE``), and what the image's Open MPI offers (``ompi_info``'s
``pmix`` components); the run stops with the fix where a node's container lacks it.

The plugin: the hosts file's ``mpi`` where it names one, else the first of ``pmix``, ``pmi2`` that
``srun --mpi=list`` offers (``default_mpi``); the image's Open MPI must support it (``mpi_problem``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from repro.errors import RunFailed
from repro.run.schedulers.slurm.siteenv import export_option, site_names

#: run in each node's container: ``##repro pmi URI_NAME DIR there|missing fd|nofd COMPONENTS`` (``-``: none)
PMI_PROBE = (
    'u=$(env | sed -n "s/^\\(PMIX_SERVER_URI[0-9]*\\)=.*/\\1/p" | head -n 1); d=${PMIX_SERVER_TMPDIR:--}; '
    '[ -d "$d" ] && w=there || w=missing; [ -n "${PMI_FD:-}" ] && f=fd || f=nofd; '
    'c=$(ompi_info --parsable 2>/dev/null | sed -n "s/^mca:pmix:\\([^:]*\\):.*/\\1/p" | sort -u | '
    'paste -sd, -); '
    'echo "##repro pmi ${u:--} $d $w $f ${c:--}"')
FIX = ("install enroot's PMI hook on every node: copy 50-slurm-pmi.sh from enroot's extra hooks "
       "(conf/hooks/extra/ in enroot's source) into /etc/enroot/hooks.d/; it carries SLURM_* and PMIX_* into "
       "the container and mounts the PMIx server's directories")
#: Open MPI's pmix components (``ompi_info``) that speak PMIx, and the one that speaks PMI-2
PMIX_COMPONENTS = ("ext1x", "ext2x", "ext3x", "ext4x", "pmix112", "pmix2x", "pmix3x", "pmix4x")
PMI2_COMPONENT = "s2"


def default_mpi(offered: Iterable[str]) -> str:
    """The first of ``pmix``, ``pmi2`` that ``srun --mpi=list`` offers (``pmix`` where it offers neither)."""
    found = set(offered)
    return next((m for m in ("pmix", "pmi2") if m in found), "pmix")


def pmi_probe_argv(job: str, nodes: Sequence[str], squashfs: str, mpi: str, environ: Mapping[str, str],
                   path: str | None = None) -> list[str]:
    """One task a node in a container from the run's squashfs, started as an MPI cell's ranks are."""
    return ["srun", f"--mpi={mpi}", f"--jobid={job}", f"--nodelist={','.join(nodes)}", "--overlap",
            f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--label",
            export_option([*site_names(environ), *([] if path else ["PATH"])], path), "--job-name=repro-pmi",
            f"--container-image={squashfs}", "--no-container-mount-home", "--", "sh", "-c", PMI_PROBE]


def pmi_said(lines: Iterable[str]) -> dict[int, dict[str, Any]]:
    """Each task's ``##repro pmi`` line (srun's ``--label`` form), by task."""
    said: dict[int, dict[str, Any]] = {}
    for line in lines:
        task, sep, text = line.partition(": ")
        words = text.split()
        if sep and task.strip().isdigit() and words[:2] == ["##repro", "pmi"] and len(words) == 7:
            uri, folder, where, fd, comps = words[2:]
            said[int(task)] = {"uri": None if uri == "-" else uri, "dir": None if folder == "-" else folder,
                               "dir_there": where == "there", "pmi_fd": fd == "fd",
                               "components": [] if comps == "-" else comps.split(",")}
    return said


def pmi_problems(said: Mapping[int, Mapping[str, Any]], nodes: Sequence[str], mpi: str) -> list[str]:
    """Each node (in task order) whose container does not see Slurm's PMI as ``mpi`` gives it, and why."""
    bad = []
    for i, node in enumerate(nodes):
        s = said.get(i)
        if s is None:
            bad.append(f"{node}: the step's task said nothing (see srun's output above)")
        elif mpi == "pmix" and not s["uri"]:
            bad.append(f"{node}: a rank's container sees no PMIX_SERVER_URI* variable")
        elif mpi == "pmix" and not s["dir_there"]:
            where = s["dir"] or "(PMIX_SERVER_TMPDIR unset)"
            bad.append(f"{node}: the PMIx server's directory {where} is not in a rank's container")
        elif mpi == "pmi2" and not s["pmi_fd"]:
            bad.append(f"{node}: a rank's container sees no PMI_FD")
    return bad


def mpi_problem(mpi: str, components: Sequence[str]) -> str | None:
    """Where the image's Open MPI (its ``pmix`` components; none known: no judgement) cannot use ``mpi``."""
    if not components:
        return None
    pmix = any(c in PMIX_COMPONENTS for c in components)
    if mpi == "pmix" and not pmix:
        return (f"the image's Open MPI has no PMIx component ({', '.join(components)}): "
                + ("set mpi: pmi2 in the hosts file's scheduler" if PMI2_COMPONENT in components else
                   "it cannot start under srun --mpi=pmix"))
    if mpi == "pmi2" and PMI2_COMPONENT not in components:
        return (f"the image's Open MPI has no PMI-2 component (s2; it has {', '.join(components)}): "
                + ("set mpi: pmix in the hosts file's scheduler" if pmix else "it cannot start under srun "
                   "--mpi=pmi2"))
    return None


def check_pmi(said: Mapping[int, Mapping[str, Any]], nodes: Sequence[str], mpi: str, other: str = "") -> None:
    """RunFailed naming each node whose container lacks Slurm's PMI (with the fix), or where the image's MPI
    cannot use ``mpi``."""
    bad = pmi_problems(said, nodes, mpi)
    if bad:
        raise RunFailed(f"Slurm's PMI ({mpi}) does not reach the ranks' containers:\n  " + "\n  ".join(bad)
                        + (f"\n  srun: {other}" if other else ""), hint=FIX)
    found = next((s["components"] for s in said.values() if s["components"]), [])
    wrong = mpi_problem(mpi, found)
    if wrong:
        raise RunFailed(f"Slurm's PMI is {mpi}, but {wrong}",
                        hint="choose the plugin both srun --mpi=list and the image's MPI support")
