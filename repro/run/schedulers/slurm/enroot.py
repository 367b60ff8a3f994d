"""The run's image under pyxis, imported once per node: what the kit runs for it, as text and argv (pure).

One job step of the allocation (``image_argv``) runs ``IMPORT_SCRIPT`` once on every node for as long as
the run holds the nodes: it says which enroot the node has, imports the image by digest into a squashfs
file in a node-local folder (``image_file``) with a record of the digest it imported beside it, says it
is ready, and waits. Every cell step then starts its containers from that file (``--container-image=PATH``:
pyxis creates a fresh container filesystem from it for each step and removes it when the step ends), so
every repeat starts from the image's own root filesystem. When the step is stopped (the end of the run,
Ctrl-C, or Slurm ending the job at its time limit) the script removes the file, unless the user keeps it
(``keep_image``), and any container pyxis left of the job (``pyxis_JOB.STEP``, or ``pyxis_JOB_...`` where
pyxis runs with ``container_scope=job``: a step killed while pyxis made its container leaves one). A kept
file is named after the target and reused by a later run only when the digest it was imported from is the
one that run locks.

A job Slurm ends at its time limit can kill a step while pyxis still makes its container, which then stays
on the node: a resumed run's image step first removes the containers of the run's earlier jobs (``OLD``).

The values reach the script as its arguments (``sh -c SCRIPT sh URI FILE DIGEST KEEP OLD``), never inside
it; job ids are digits only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from repro.run.schedulers.slurm.siteenv import BASE_EXPORT

#: The node's side of the image step. Lines marked ``##repro`` are the kit's: ``step JOB.STEP``, ``enroot
#: VERSION``, ``imported DIGEST`` or ``reused DIGEST`` (the record beside a kept file), ``path PATH`` (the
#: image's own PATH, from the /etc/environment enroot wrote into the squashfs), ``ready``,
#: ``error TEXT``, ``released``. Everything else is enroot's own output.
IMPORT_SCRIPT = r"""say() { printf '##repro %s\n' "$*"; }
say step "$SLURM_JOB_ID.$SLURM_STEP_ID"
command -v enroot >/dev/null 2>&1 || { say error "enroot is not on the PATH srun gave the job step"; exit 3; }
say enroot "$(enroot version 2>&1 | head -n 1)"
f=$2
sweep() { enroot list | grep -E "^pyxis_$1[._]" | while read -r c; do enroot remove -f -- "$c"; done; }
drop() {
  if [ "$4" != yes ]; then rm -f -- "$f" "$f.digest" "$f.part"; fi
  sweep "$SLURM_JOB_ID"
}
for old in $5; do sweep "$old"; done
trap 'drop "$@"; say released; exit 0' TERM INT HUP
if [ "$4" = yes ] && [ -f "$f" ] && [ -f "$f.digest" ]; then
  say reused "$(cat -- "$f.digest")"
else
  rm -f -- "$f" "$f.digest" "$f.part"
  mkdir -p -- "${f%/*}" || { say error "cannot create ${f%/*}"; exit 4; }
  enroot import --output "$f.part" -- "$1" \
    || { rm -f -- "$f.part"; say error "enroot import failed"; exit 5; }
  printf '%s\n' "$3" > "$f.digest" && mv -- "$f.part" "$f" || { say error "cannot write $f"; exit 6; }
  say imported "$3"
fi
say path "$(unsquashfs -cat "$f" etc/environment 2>/dev/null | sed -n 's/^PATH=//p' | head -n 1)"
say ready
while :; do sleep 60 & wait $!; done
"""
DEFAULT_DIR = "/tmp"
#: how long every node gets to import the image (a 20 GB NGC image over a slow link takes tens of minutes)
IMPORT_TIMEOUT_S = 3 * 3600
YES = ("yes", "true", "True")
NOT_READY = "the image could not be made ready on every node (enroot)"


def enroot_uri(image: str) -> str:
    """A pinned reference (``REGISTRY/PATH@sha256:...``) as enroot imports it: ``docker://REGISTRY#PATH@...``
    (enroot needs the ``#`` between the registry and the path; a reference without a registry host is
    Docker Hub's)."""
    registry, _, path = image.partition("/")
    if path and ("." in registry or ":" in registry or registry == "localhost"):
        return f"docker://{registry}#{path}"
    return f"docker://{image}"


def keep(cfg: Mapping[str, str]) -> bool:
    return str(cfg.get("keep_image", "no")) in YES


def image_file(cfg: Mapping[str, str], run_id: str, target: str) -> str:
    """Where each node keeps the run's squashfs: ``image_dir`` (node-local, default /tmp), named after the run
    (removed at its end), or after the target where the user keeps it for later runs."""
    folder = str(cfg.get("image_dir") or DEFAULT_DIR).rstrip("/") or ""
    return f"{folder}/repro-{target if keep(cfg) else run_id}.sqsh"


def image_argv(job: str, nodes: Sequence[str], image: str, path: str, digest: str, kept: bool,
               earlier: Sequence[str] = (), export: str = BASE_EXPORT) -> list[str]:
    """The job step that imports ``image`` once on each node into ``path`` and holds it for the run;
    ``earlier``: the run's earlier jobs, whose leftover containers it removes first; ``export``: what it
    passes (enroot reads ``ENROOT_*`` and a site's proxy: ``siteenv.host_export``)."""
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--label", export,
            "--job-name=repro-image", "--", "sh", "-c", IMPORT_SCRIPT, "sh", enroot_uri(image), path, digest,
            "yes" if kept else "no", " ".join(j for j in earlier if j.isdigit())]


def node_said(node: dict[str, Any], word: str, rest: str, at: str | None = None) -> None:
    """What one ``##repro WORD REST`` line of a node's image step tells of the node, into ``node``: the
    action (``imported``/``reused``), the digest and when (``at``), its enroot, the image's PATH, ready,
    released, an error."""
    if word in ("imported", "reused"):
        node.update(action=word, digest=rest.strip(), **({"at": at} if at else {}))
    elif word in ("enroot", "error", "ready", "released", "path"):
        node[word] = rest.strip() or True


def node_facts(name: str, text: str) -> dict[str, Any]:
    """A node's image step output (its ``##repro`` lines among enroot's own) as ``node_said`` reads it."""
    node: dict[str, Any] = {"node": name}
    for line in text.splitlines():
        if line.startswith("##repro "):
            word, _, rest = line[len("##repro "):].partition(" ")
            node_said(node, word, rest)
    return node


def image_problems(nodes: Sequence[Mapping[str, Any]], path: str, digest: str,
                   unready: bool = True) -> list[str]:
    """Each node whose image holds another digest than ``digest`` (the run's lock), and with ``unready``
    each whose image is not ready, and why: one line a node."""
    bad = [f"{n['node']}: " + str(n.get("error") or ("no enroot output" if "enroot" not in n else
                                                      "the import did not finish"))
           for n in nodes if unready and "ready" not in n]
    bad += [f"{n['node']}: {path} holds {n.get('digest') or 'no digest'}"
            + (" (imported earlier and kept)" if n.get("action") == "reused" else "")
            + f", the run locks {digest}" for n in nodes if "ready" in n and n.get("digest") != digest]
    return bad
