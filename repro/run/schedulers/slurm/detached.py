"""Submit and walk away: the whole run as one batch script that writes everything into the run directory.

``repro up --detach`` renders the script (``render_detached``), writes the files it reads into the run
directory's ``job/`` folder and submits it with ``sbatch --chdir=RUN_DIR``; the submitting process then
exits. The script holds the allocation, then, in order: the node list (``job/nodes``, names and NodeAddr
from Slurm), a check that every node sees the run directory (``job/shared/``: each node reads back the token
the kit wrote; the batch host compares), the image on every node (docker: a pull by digest from the
registry; pyxis: the attached path's image step, one import a node held for the run, its squashfs removed
when the script exits), the host probe (preflight's own script, ``job/probe/``), and every cell's repeats
as job steps, each node's output into ``cells/KEY/rN/RANK-NODE.log`` (``srun --output``), srun's own
report into ``job/steps/KEY/rNaA.srun`` (repeat N, attempt A), the agent's marks (docker) into
``job/steps/KEY/rNaA-RANK.marks``; beside each repeat's step the attached path's telemetry sampler step
(``render.sampler_srun``, the sampler from ``job/sampler.py``), begun in the background just before it and
stopped once it ended (and by the script's exit trap), each node's lines into
``job/steps/KEY/rNaA-telemetry-RANK-NODE.txt``. Each step start and end is a line of ``job/events``, written
by the batch host alone: ``repro status`` and ``repro report`` need nothing but the run directory.

Each srun line is the one the attached path submits (``render.srun_argv``, ``render.pyxis_step``,
``render.preflight_argv``), rendered for stand-in nodes whose names and addresses are tokens the script
fills in once Slurm names the nodes: ``"${REPRO_N0}"`` in argv, and ``sed`` over the files under ``job/in/``
(the agent's spec, a pyxis step's environment and ``--multi-prog`` file), which may hold per-run keys and
secret values and so are mode 0600 in a 0700 folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.errors import RunFailed, UsageError
from repro.redact import Redactor, is_secret_name
from repro.nodes.preflight import probe_script
from repro.run.plan import plan_cell
from repro.run.schedulers.slurm.commands import cli, stamp
from repro.run.schedulers.slurm.enroot import IMPORT_TIMEOUT_S, image_argv, image_file, keep
from repro.nodes.telemetry import SAMPLER
from repro.run.schedulers.slurm.render import (AGENT, preflight_argv, pyxis_head, pyxis_step,
                                               pyxis_tasks_per_node, render_sbatch, sampler_srun, srun_argv,
                                               step_spec)
from repro.run.schedulers.slurm.siteenv import (UNSET, StepSite, clean_environ, host_export, passthrough,
                                                prelude_lines)
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Cell, Manifest

JOB_DIR = "job"
EVENTS, NODES, TOKEN, SUBMITTED = "job/events", "job/nodes", "job/token", "job/submitted.json"
JOBID, REPEAT, ATTEMPT = "__REPRO_JOB__", "__REPRO_R__", "__REPRO_ATTEMPT__"
IMAGE_PATH = "__REPRO_PATH__"  # the image's own PATH (pyxis), read from the node's squashfs once imported
CPT = "__REPRO_CPT__"  # each task's share of a node's CPUs (a socket-bound step), from SLURM_CPUS_ON_NODE
_TOKEN = re.compile(r"__REPRO_(?:JOB|R|ATTEMPT|PATH|CPT|[NA]\d+)__")
#: a cell's job step as the script writes it: what comes before ``timeout … srun …`` and after it, the files
#: it reads (``job/in/``) and the lines that fill them in
Step = tuple[str, list[str], str, dict[str, str], list[str]]
STOP_GRACE_S = 60  # after a repeat's time is up: how long srun gets to stop its tasks before it is killed
SAMPLER_READY_S = 20  # how long a repeat's step waits for every node's sampler to write its first line


def telemetry_output(key: str, repeat: str | int, attempt: str | int) -> str:
    """Where a repeat's telemetry sampler step writes each node's lines (``%n-%N``: its index and name; the
    kit's ``adopt`` copies the last attempt's, bounded, to the repeat's ``telemetry-NODE.txt``)."""
    return f"job/steps/{key}/r{repeat}a{attempt}-telemetry-%n-%N.txt"


def node_tokens(i: int) -> tuple[str, str]:
    """The stand-ins for the name and the address of the allocation's node ``i`` (rank order)."""
    return f"__REPRO_N{i}__", f"__REPRO_A{i}__"


def shell_var(token: str) -> str:
    """The shell variable the script holds a token's value in."""
    if token == JOBID:
        return "SLURM_JOB_ID"
    if token == REPEAT:
        return "r"
    if token == ATTEMPT:
        return "attempt"
    return "REPRO_" + token.strip("_").removeprefix("REPRO_")


def sh_word(arg: str) -> str:
    """One argv word for sh: quoted as shlex quotes it, each token a double-quoted variable."""
    if not _TOKEN.search(arg):
        return shlex.quote(arg)
    out, at = [], 0
    for m in _TOKEN.finditer(arg):
        if m.start() > at:
            out.append(shlex.quote(arg[at:m.start()]))
        out.append(f'"${{{shell_var(m.group())}}}"')
        at = m.end()
    if at < len(arg):
        out.append(shlex.quote(arg[at:]))
    return "".join(out)


def sh_line(argv: Sequence[str]) -> str:
    return " ".join(sh_word(a) for a in argv)


def stand_ins(hosts: Hosts, need: int) -> Hosts:
    """The inventory with ``need`` nodes whose names and addresses are tokens; each keeps the GPU count of
    the inventory's node of its rank (else of its first node; the hosts file's ``defaults``)."""
    known = hosts.nodes
    nodes = tuple(Node(name=n, address=a, gpus=known[min(i, len(known) - 1)].gpus if known else None)
                  for i, (n, a) in enumerate(map(node_tokens, range(need))))
    return dataclasses.replace(hosts, nodes=nodes)


def detached(argv: Sequence[str], output: str) -> list[str]:
    """An attached srun line as the batch script runs it: each node's output into ``output`` (srun's
    ``%n``: the node's index in the step, which is its rank), no ``--label`` (one file a node)."""
    return [argv[0], f"--output={output}", *(a for a in argv[1:] if a != "--label")]


@dataclass
class Script:
    """The batch script and the files it reads (``job/in/NAME``: mode 0600)."""

    text: str
    inputs: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # job/NAME, not secret (the probe script)


@dataclass
class Detach:
    """What one detached run is: the target, its cells and repeats, the image, the scheduler settings."""

    manifest: Manifest
    cells: Sequence[Cell]
    hosts: Hosts
    cfg: Mapping[str, str]
    image: str
    run_id: str = "RUN_ID"
    repeats: int | None = None
    fail_fast: bool = False
    environ: Mapping[str, str] | None = None  # where sbatch runs (its names are exported where set)

    def export(self, *own: str) -> str:
        """``--export=`` of a step on the nodes themselves (``siteenv.host_export``) and ``own``."""
        return host_export(self.environ, self.cfg, own)

    @property
    def need(self) -> int:
        return max(c.nodes for c in self.cells)

    @property
    def container(self) -> str:
        return self.cfg.get("container", "docker")

    def order(self) -> list[Cell]:
        """Fewest nodes first, as the attached path runs them."""
        return sorted(self.cells, key=lambda c: (c.nodes, list(self.cells).index(c)))

    def per_node(self) -> int:
        if self.container != "pyxis":
            return 1
        return max(pyxis_tasks_per_node(self.manifest, c) for c in self.cells)


PROLOGUE = r"""set -u
RUN_DIR=$(pwd -P)
REPRO_RUN_ID=${RUN_DIR##*/}
mkdir -p job/steps job/shared job/probe job/run && chmod 700 job/run
event() { printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >> job/events; }
quit() { event end "$@"; exit "$1"; }
{sampling}event job "$SLURM_JOB_ID" "$SLURM_JOB_NODELIST"
# the allocation's nodes in rank order, each with the address Slurm gives it (NodeAddr)
i=0 SUBST= failed=0
: > job/nodes
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  a=$(scontrol show node -o -- "$n" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
  a=${a:-$n}
  case "$n:$a" in *[!A-Za-z0-9._:-]*) quit 3 "node $n has a name or address the kit cannot use: $a";; esac
  eval "REPRO_N$i=\$n REPRO_A$i=\$a"
  SUBST="$SUBST -e s/__REPRO_N${i}__/$n/g -e s/__REPRO_A${i}__/$a/g"
  echo "$i $n $a" >> job/nodes
  i=$((i + 1))
done
[ "$i" -ge {need} ] || quit 3 "the allocation has $i node(s), the run needs {need}"
fill() { (umask 077 && sed $SUBST "job/in/$1" > "job/run/$1"); }
begin() {  # cell, repeat, attempt: a fresh log folder (an earlier attempt's logs kept aside)
  mkdir -p "cells/$1/r$2" "job/steps/$1"
  for f in "cells/$1/r$2"/*.log; do [ -f "$f" ] && mv "$f" "${f%.log}.attempt$(($3 - 1))"; done
  event start "$1" "$2" "$3"
}
"""

#: a repeat's telemetry sampler step, begun in the background (``sampling``) and stopped once the cell's step
#: ended (``unsample``), and on the script's exit whatever ended it
SAMPLING = r"""REPRO_SAMPLER=
sampling() {  # srun of a repeat's telemetry sampler (in the background), its files' prefix, its node count:
  # the cell's step waits until every node's sampler wrote its first line, its step ended, or {ready} s passed
  REPRO_SAMPLER=$1 j=0 w=0
  while [ "$j" -lt "$3" ] && [ "$w" -lt {ready} ] && kill -0 "$1" 2>/dev/null; do
    eval "n=\$REPRO_N$j"
    if [ -s "$2-$j-$n.txt" ]; then j=$((j + 1)); else sleep 1; w=$((w + 1)); fi
  done
}
unsample() {  # the sampler's step ended (srun, on TERM, has Slurm kill every node's sampler), waited for
  [ -z "$REPRO_SAMPLER" ] || { kill -TERM "$REPRO_SAMPLER" 2>/dev/null; wait "$REPRO_SAMPLER"; }
  REPRO_SAMPLER=
}
trap unsample EXIT
""".replace("{ready}", str(SAMPLER_READY_S))

SHARED = r"""# the run directory is one directory on every node: each node reads the token back
{srun} > /dev/null 2>&1
j=0
while [ "$j" -lt {need} ]; do
  eval "n=\$REPRO_N$j"
  [ "$(cat "job/shared/$j-$n" 2>/dev/null)" = "$(cat job/token)" ] || \
    quit 3 "node $n does not see the run directory $RUN_DIR (it must be on a filesystem the nodes share)"
  j=$((j + 1))
done
event shared {need}
"""


def check_container(container: str, where: str = "--scheduler container") -> None:
    if container not in CONTAINERS:
        raise UsageError(f"{where}: --detach runs container: {' or '.join(CONTAINERS)}, not {container}",
                         hint="run it attached (without --detach), or choose one of those")


def render_detached(d: Detach) -> Script:
    """The whole run as one batch script (exact text: ``repro plan --script`` prints it, ``repro up
    --detach`` submits it) and the files it reads."""
    check_container(d.container)
    need, hosts = d.need, stand_ins(d.hosts, d.need)
    names = [n.name for n in hosts.nodes]
    head = [f"# repro up --detach: {d.manifest.id}, {len(d.cells)} cell(s), in the run directory this job "
            "starts in (sbatch --chdir=RUN_DIR);",
            "# `repro status RUN_DIR` shows its progress, `repro report RUN_DIR` judges it once it ended",
            PROLOGUE.replace("{need}", str(need)).replace("{sampling}", SAMPLING).rstrip("\n")]
    every = ["srun", f"--jobid={JOBID}", f"--nodes={need}", f"--ntasks={need}", "--ntasks-per-node=1",
             f"--nodelist={','.join(names)}", "--overlap", d.export()]
    shared = [*every, "--job-name=repro-shared", "--output=${RUN_DIR}/job/shared/%n-%N", "--", "cat",
              "${RUN_DIR}/job/token"]
    head += _site_lines(d.hosts)
    head.append(SHARED.replace("{need}", str(need)).replace("{srun}", _expand(shared)).rstrip("\n"))
    script = Script("", files={"probe.sh": probe_script(Node(names[0], names[0])),
                               "sampler.py": SAMPLER.read_text(encoding="utf-8")})
    if d.container == "docker":
        script.files["agent.py"] = AGENT.read_text(encoding="utf-8")
    lines = head + CONTAINERS[d.container].prologue(d, every)
    probe = detached(preflight_argv(JOBID, names, export=d.export()), "job/probe/%n-%N.out")
    lines += ["# the host facts the provenance records: preflight's probe script on every node",
              f"{sh_line(probe)} < job/probe.sh 2> job/probe/srun.err || event probe-failed $?"]
    for cell in d.order():
        lines += _cell_lines(d, cell, hosts, script)
    lines.append('[ "$failed" = 0 ] && quit 0 done || quit 5 "$failed repeat(s) failed"')
    name = f"repro-{d.manifest.id}"
    script.text = render_sbatch(d.cfg, name, need, "\n".join(lines), per_node=d.per_node(),
                                output="job/batch-%j.out", gpus=hosts.gpus)
    return script


def _site_lines(hosts: Hosts) -> list[str]:
    """No ``PYXIS_*`` from where sbatch ran (pyxis would read them as its options), then the site's prelude
    (the hosts file's ``prelude`` and ``modules``, verbatim, without ``set -u``: a site's scripts may read
    unset variables) before any step."""
    lines = ["# pyxis reads PYXIS_* as its options: they come from the kit's steps alone", UNSET]
    found = prelude_lines(hosts)
    if found:
        lines += ["# the site's prelude (the hosts file's prelude and modules)", "set +u", *found, "set -u"]
    return lines


def _expand(argv: Sequence[str]) -> str:
    """argv whose ``${RUN_DIR}`` parts the shell expands (double quotes), tokens as variables."""
    return " ".join(f'"{a}"' if "${RUN_DIR}" in a else sh_word(a) for a in argv)


def _cell_lines(d: Detach, cell: Cell, hosts: Hosts, script: Script) -> list[str]:
    """One cell: its inputs filled in once, then each repeat as a job step, retried up to the manifest's
    limit, bounded by ``launch.timeout_s``."""
    key, manifest = cell.key, d.manifest
    repeats = min(d.repeats or manifest.repeats, manifest.repeats)
    attempts = manifest.retries + 1
    before, argv, after, inputs, fills = CONTAINERS[d.container].step(d, cell, hosts)
    script.inputs.update(inputs)
    timeout = ["timeout", f"--kill-after={STOP_GRACE_S}", str(manifest.launch.timeout_s)]
    lines = ["", f"# cell {key}: {cell.nodes} node(s), repeats 1..{repeats}, up to {attempts} attempt(s) "
                 f"each, at most {manifest.launch.timeout_s} s each", *fills,
             f"for r in {' '.join(str(k) for k in range(1, repeats + 1))}; do",
             f"  for attempt in {' '.join(str(k) for k in range(1, attempts + 1))}; do",
             f'    begin {key} "$r" "$attempt"', *_sampler_lines(d, cell, hosts),
             f"    {before}{sh_line([*timeout, *argv])}{after}",
             "    code=$?", "    unsample", f'    event exit {key} "$r" "$attempt" "$code"',
             '    [ "$code" = 0 ] && break',
             *(f"    {ln}" for ln in CONTAINERS[d.container].after_failure(d, cell, hosts)),
             "  done"]
    lines.append('  [ "$code" = 0 ] || failed=$((failed + 1))')
    if d.fail_fast:
        lines.append(f'  [ "$code" = 0 ] || quit 5 "{key} repeat $r failed (--fail-fast)"')
    return lines + ["done"]


def _sampler_lines(d: Detach, cell: Cell, hosts: Hosts) -> list[str]:
    """A repeat's telemetry sampler: the attached path's job step (``render.sampler_srun``: one task a node,
    on the host, outside any container) with the sampler from ``job/sampler.py``, each node's lines into
    ``telemetry_output``, started in the background before the cell's step and stopped (``unsample``) once
    the step ended, and by the script's exit trap on any other way out."""
    key, names = cell.key, [n.name for n in hosts.nodes[:cell.nodes]]
    argv = detached(sampler_srun(JOBID, names, f"repro-{key}-telemetry", d.manifest.launch.timeout_s,
                                 source="job/sampler.py", export=d.export()),
                    telemetry_output(key, REPEAT, ATTEMPT))
    prefix = telemetry_output(key, "${r}", "${attempt}").removesuffix("-%n-%N.txt")
    return [f'    {sh_line(argv)} 2> "job/steps/{key}/r${{r}}a$attempt-telemetry.srun" &',
            f'    sampling $! "{prefix}" {cell.nodes}']


class Docker:
    """``container: docker``: the image pulled by digest on every node first; each repeat the agent on
    every node, its spec from ``job/in/KEY.json``, its marks into ``job/steps/``."""

    @staticmethod
    def prologue(d: Detach, every: Sequence[str]) -> list[str]:
        pull = [*every, "--job-name=repro-pull", "--output=job/pull-%n-%N.out", "--", "env", "-u",
                "DOCKER_HOST", "docker", "pull", d.image]
        return ["# the image by digest on every node, from its registry",
                f"{sh_line(pull)} 2> job/pull.err || quit 4 'docker pull {d.image} failed (job/pull-*.out)'",
                "event pulled"]

    @staticmethod
    def step(d: Detach, cell: Cell, hosts: Hosts) -> Step:
        from repro.run.cell import mpi_files
        from repro.run.launchers.mpi import DEFAULT_SSH_PORT

        manifest = d.manifest
        plans = plan_cell(manifest, cell, hosts)
        port = int(manifest.launch.mpi.get("ssh_port", DEFAULT_SSH_PORT)) if manifest.launch.kind == "mpi" \
            else None
        spec = step_spec(plans, d.run_id, cell, d.image, mpi_files(plans, port) if port else {}, port)
        argv = srun_argv(JOBID, [p.command.node.name for p in plans], f"repro-{cell.key}",
                         d.export("REPRO_MARKS"))
        program = argv.index("--") + 1
        argv = detached([*argv[:program], "python3", "job/agent.py"], f"cells/{cell.key}/r{REPEAT}/%n-%N.log")
        key = cell.key
        return (f'REPRO_MARKS="job/steps/{key}/r${{r}}a$attempt" ', argv,
                f' < job/run/{key}.json 2> "job/steps/{key}/r${{r}}a$attempt.srun"',
                {f"{key}.json": json.dumps(spec, sort_keys=True) + "\n"}, [f"fill {key}.json"])

    @staticmethod
    def after_failure(d: Detach, cell: Cell, hosts: Hosts) -> list[str]:
        names = [n.name for n in hosts.nodes[:cell.nodes]]
        argv = srun_argv(JOBID, names, "repro-sweep", d.export())
        sweep = [*argv[:argv.index("--") + 1], "python3", "job/agent.py"]
        return [f"echo '{{\"sweep\": \"'\"$REPRO_RUN_ID\"'\"}}' | {sh_line(sweep)} > /dev/null 2>&1"]


class Pyxis:
    """``container: pyxis``: the image imported once on every node for the run (``enroot.image_argv``, the
    attached path's image step, in the background), its digest checked against the lock, its squashfs
    removed when the script exits (``trap``); each repeat the pyxis job step from that squashfs with the
    image's own PATH on every task, its environment from ``job/in/KEY.env`` (the values never in argv), each
    rank's command from ``job/in/KEY.multi-prog.conf``."""

    @staticmethod
    def squashfs(d: Detach) -> tuple[str, str]:
        """The node-local file every step starts from, and the digest it must hold."""
        if "@" not in d.image:
            raise UsageError(f"pyxis runs images by digest; {d.image} has none",
                             hint="give --push REGISTRY for a built image, or pin the registry image")
        return image_file(d.cfg, d.run_id, d.manifest.id), d.image.rpartition("@")[2]

    @staticmethod
    def prologue(d: Detach, every: Sequence[str]) -> list[str]:
        path, digest = Pyxis.squashfs(d)
        names = [n.name for n in stand_ins(d.hosts, d.need).nodes]
        step = detached(image_argv(JOBID, names, d.image, path, digest, keep(d.cfg), export=d.export()),
                        "job/image/%n-%N.log")
        return ["# the image once on every node for the run: enroot imports it by digest into a node-local",
                "# squashfs and holds it; stopped (TERM) when this script exits, its script removes the file",
                "mkdir -p job/image", f"{sh_line(step)} 2> job/image/srun.err &", "REPRO_IMAGE=$!",
                *IMAGE_WAIT.replace("{need}", str(d.need)).replace("{timeout}", str(IMPORT_TIMEOUT_S))
                .replace("{digest}", shlex.quote(digest)).replace("{file}", shlex.quote(path)).splitlines()]

    @staticmethod
    def step(d: Detach, cell: Cell, hosts: Hosts) -> Step:
        plans = plan_cell(d.manifest, cell, hosts)
        key = cell.key
        head = pyxis_head(JOBID, [p.command.node.name for p in plans], f"repro-{key}")
        per_node = pyxis_tasks_per_node(d.manifest, cell)
        site = StepSite(clean_environ(d.environ), d.cfg, hosts.gpus or cell.gpus_per_node, CPT)
        argv, env, conf = pyxis_step(d.manifest, cell, plans, Pyxis.squashfs(d)[0], head,
                                     f"job/run/{key}.multi-prog.conf", mpi=d.cfg.get("mpi", "pmix"),
                                     image_env={"PATH": IMAGE_PATH}, site=site)
        inputs = {f"{key}.env": "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))}
        fills = [f"fill {key}.env"]
        if any(a.startswith("--cpus-per-task=") for a in argv):
            fills.append(f"REPRO_CPT=$((${{SLURM_CPUS_ON_NODE:-{per_node}}} / {per_node}))")
        if conf is not None:
            inputs[f"{key}.multi-prog.conf"] = conf
            fills.append(f"fill {key}.multi-prog.conf")
        argv = detached(argv, f"cells/{key}/r{REPEAT}/%n-%N.log")
        after = f') 2> "job/steps/{key}/r${{r}}a$attempt.srun"'
        return f"(. job/run/{key}.env && exec ", argv, after, inputs, fills

    @staticmethod
    def after_failure(d: Detach, cell: Cell, hosts: Hosts) -> list[str]:
        return []


#: the batch host's side of the pyxis image step: on exit, the step stopped as the attached path stops it
#: (``scancel --signal=TERM STEP``); until every node says ``ready``, a node's error or the step's end ends
#: the job; each node's digest checked against the lock; the image's PATH filled in for ``__REPRO_PATH__``
IMAGE_WAIT = r"""release() {
  s=$(sed -n 's/^##repro step //p' "job/image/0-$REPRO_N0.log" 2>/dev/null | head -n 1)
  case "$s" in ""|*[!0-9.]*) kill -TERM "$REPRO_IMAGE" 2>/dev/null;; *) scancel --signal=TERM -- "$s";; esac
  wait "$REPRO_IMAGE"
}
trap 'unsample; release' EXIT
trap 'exit 143' TERM INT HUP
j=0 w=0
while [ "$j" -lt {need} ]; do
  eval "n=\$REPRO_N$j"
  f="job/image/$j-$n.log"
  if grep -q '^##repro ready' "$f" 2>/dev/null; then
    got=$(sed -n -e 's/^##repro imported //p' -e 's/^##repro reused //p' "$f" | head -n 1)
    [ "$got" = {digest} ] || quit 4 "node $n: {file} holds ${got:-no digest}, the run locks "{digest}
    j=$((j + 1))
    continue
  fi
  e=$(sed -n 's/^##repro error //p' "$f" 2>/dev/null | head -n 1)
  [ -z "$e" ] || quit 4 "the image on node $n: $e ($f)"
  kill -0 "$REPRO_IMAGE" 2>/dev/null || quit 4 "the image step ended before node $n was ready (job/image/)"
  [ "$w" -lt {timeout} ] || quit 4 "node $n did not make the image ready within {timeout} s ($f)"
  sleep 1
  w=$((w + 1))
done
REPRO_PATH=$(sed -n 's/^##repro path //p' "job/image/0-$REPRO_N0.log" | head -n 1)
case "$REPRO_PATH" in
  ""|*[!A-Za-z0-9._:/+-]*)
    quit 4 "the image's PATH (etc/environment in its squashfs) is empty or not plain folders: $REPRO_PATH";;
esac
SUBST="$SUBST -e s|__REPRO_PATH__|$REPRO_PATH|g"
event imported {need}"""


CONTAINERS: dict[str, Any] = {"docker": Docker, "pyxis": Pyxis}


def write_job(run: Path, d: Detach, script: Script) -> Path:
    """The script and the files it reads into ``run/job/``: ``in/`` (0700) holds the inputs that may hold
    per-run keys or secret values, each 0600; the token the nodes read back. The script the run directory
    keeps (``job/batch.sbatch``) has every secret blanked as an attached run's record has it
    (``repro.redact``); where that changed it, the script submitted is ``in/batch.sbatch``. The
    pass-through values whose names look secret go into ``in/passed.env``: what the ranks write of them is
    scrubbed when the run is judged (``jobfiles.job_envs``), whichever shell judges it. Returns the script
    to submit."""
    job = run / JOB_DIR
    (job / "in").mkdir(parents=True, mode=0o700)
    os.chmod(job / "in", 0o700)
    environ = clean_environ(d.environ)
    passed = {n: environ[n] for n in passthrough(d.cfg) if n in environ and is_secret_name(n)}
    kept = Redactor.from_envs(environ, d.hosts.env, passed).text(script.text)
    inputs = {**script.inputs, **({"batch.sbatch": script.text} if kept != script.text else {}),
              **({"passed.env": "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(passed.items()))}
                 if passed else {})}
    for name, text in inputs.items():
        fd = os.open(job / "in" / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    for name, text in script.files.items():
        (job / name).write_text(text, encoding="utf-8")
    (run / TOKEN).write_text(secrets.token_hex(16), encoding="utf-8")
    (job / "batch.sbatch").write_text(kept, encoding="utf-8")
    return job / ("in" if kept != script.text else "") / "batch.sbatch"


def submit(run: Path, d: Detach, script_path: Path) -> str:
    """``sbatch --chdir=RUN_DIR`` of the script; the job id, recorded in ``job/submitted.json``."""
    out = cli(["sbatch", "--parsable", f"--chdir={run.resolve()}", str(script_path)], timeout=60)
    if out.returncode != 0:
        raise RunFailed(f"sbatch failed: {' '.join(out.stderr.split())}",
                        hint=f"nothing runs; the run directory {run} holds the script (job/batch.sbatch)")
    job_id = out.stdout.strip().split(";")[0]
    manifest = d.manifest
    record = {"job_id": job_id, "submitted": stamp(), "host": socket.gethostname(),
              "script": "job/batch.sbatch",
              "container": d.container, "image": d.image, "timeout_s": manifest.launch.timeout_s,
              "attempts": manifest.retries + 1,
              "repeats": {c.key: min(d.repeats or manifest.repeats, manifest.repeats) for c in d.order()}}
    if d.container == "pyxis":  # what each node's image step holds, and whether it stays after the run
        record.update(image_file=Pyxis.squashfs(d)[0], keep_image=keep(d.cfg))
    (run / SUBMITTED).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return job_id
