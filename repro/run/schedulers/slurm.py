"""``slurm``: one allocation for the run, one job step per cell.

The allocation is a batch job whose script only holds the nodes (the kit runs each cell
in it with ``srun --jobid``), or the allocation the kit already runs in (``SLURM_JOB_ID``).
Node names come from Slurm (``scontrol show hostnames``), addresses from ``scontrol show
node``, ranks from ``SLURM_NODEID``: the launchers render per node exactly as over SSH.

``container: docker`` (nodes with a Docker engine): the step runs the agent
(``repro/run/schedulers/agent.py``) on every node, which creates that rank's container with the
kit's labels, starts it attached and removes it on every way out. srun labels each line
with its rank, and the kit streams them into the per-node logs of the run directory.
MPI targets keep their own ``mpirun`` inside the allocation (the head container starts the
other ranks through the per-run sshd in each node's container): Slurm's PMI does not reach
into containers the Docker engine starts, and the images' Open MPI needs no Slurm support.

``container: pyxis``: each cell is a job step ``srun --container-image=REGISTRY#REPO@DIGEST …``
(``pyxis_step``) with the ranks' commands through ``--multi-prog``; MPI targets use
``srun --mpi=pmix`` with one task per rank, as NVIDIA's recipes do. No engine on the nodes.

Preflight under Slurm runs preflight's own probe script as one job step on the allocated nodes;
``repro plan`` shows the allocation's script and every cell's step from the functions here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro import labels
from repro.errors import EnvironmentUnavailable, RunFailed, UsageError
from repro.spec.hosts import Hosts, Node, placeholder_hosts
from repro.events import Event
from repro.spec.manifest import Cell, Manifest
from repro.run.cell import CellFailed, FileSink, NodeResult, mpi_files
from repro.run.schedulers import KEYS, SCHEDULERS
from repro.run.schedulers.base import Scheduler
from repro.spec.scheduler import SETTINGS, problems, seconds

AGENT = Path(__file__).with_name("agent.py")
ENDED_BY_SLURM = ("TIMEOUT", "NODE_FAIL", "CANCELLED", "PREEMPTED", "DEADLINE", "BOOT_FAIL", "OUT_OF_MEMORY")
LABELLED = re.compile(r"^\s*(\d+): ?(.*)$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PREFLIGHT_TIME = "5"  # minutes: preflight's own allocation, where it is not run inside one
HOLD = ("# repro holds these nodes for the run and starts each cell in them as a job step (srun --jobid)\n"
        "exec sleep 2147483647")


class SchedulerStopped(RunFailed):
    """Slurm ended the job (time limit, node failure, scancel): the run directory resumes."""


def _cli(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise EnvironmentUnavailable(f"{argv[0]} is not installed on this machine",
                                     hint="run repro where Slurm's client commands are (a login node)") from e
    except subprocess.TimeoutExpired as e:
        raise EnvironmentUnavailable(f"`{shlex.join(argv)}` did not answer in {timeout:.0f} s",
                                     hint="is slurmctld up? (scontrol ping)") from e


def _fields(line: str) -> dict[str, str]:
    """``scontrol show -o`` output as a dict (values may hold spaces only in the last fields we do not read)."""
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def render_sbatch(cfg: Mapping[str, str], name: str, nodes: int, body: str = HOLD, *, per_node: int = 1,
                  output: str = "/dev/null") -> str:
    """A batch script: by default the run's allocation (exact text: it goes into the provenance)."""
    lines = ["#!/bin/sh", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={per_node}", "#SBATCH --exclusive", "#SBATCH --no-requeue"]
    bad = problems({k: v for k, v in cfg.items() if k in SETTINGS})
    if bad:  # every caller checked already; a value that could add a line or an option never reaches a script
        raise UsageError(f"scheduler {bad[0][0]}: {bad[0][1]}", hint=bad[0][2])
    lines += [f"#SBATCH {s.sbatch}={cfg[key]}" for key, s in SETTINGS.items() if s.sbatch and cfg.get(key)]
    lines += [f"#SBATCH --output={output}", body]
    return "\n".join(lines) + "\n"


def srun_argv(job: str, nodes: Sequence[str], step: str) -> list[str]:
    """The job step of one cell in docker mode: the agent once on each node, output labelled by rank."""
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--overlap", "--label", "--input=all", "--kill-on-bad-exit=1",
            f"--job-name={step}", "--", "python3", "-c", AGENT.read_text(encoding="utf-8")]


#: The preflight job step's command: the node's name, then preflight's probe script from stdin, run by the
#: node's sh without the DOCKER_HOST srun exports from where the kit runs (a job step uses its node's engine).
PREFLIGHT_STEP = ["env", "-u", "DOCKER_HOST", "sh", "-c", 'printf "%s\\n" "${SLURMD_NODENAME:-$(hostname)}"; exec sh -s']


def preflight_argv(job: str, nodes: Sequence[str]) -> list[str]:
    """The job step that runs preflight's probe script once on each node, output labelled by task."""
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--overlap", "--label", "--input=all", "--job-name=repro-preflight",
            "--", *PREFLIGHT_STEP]


def step_spec(plans: Sequence[Any], run_id: str, cell: Cell, image: str, files: Mapping[str, tuple[bytes, int]],
              ssh_port: int | None) -> dict[str, Any]:
    """What the agent on each node does: the docker create flags (the plan's container options, InfiniBand
    devices included), files, the ports to wait for."""
    from repro.run.plan import docker_run_flags

    workers = [p.command.node.rendezvous for p in plans if p.command.role == "mpi-sshd"]
    ranks = []
    for p in plans:
        c = p.command
        tags = {**p.container["labels"], labels.RUN: run_id}
        flags = [f"--label={k}={v}" for k, v in sorted(tags.items())] + docker_run_flags(p.container)
        mine = {path: (data.decode(), mode) for path, (data, mode) in files.items()} if c.role.startswith("mpi") else {}
        mine.update({path: (text, 0o644) for path, text in c.files.items()})
        ranks.append({"node": c.node.name, "role": c.role, "name": f"repro-{run_id}-{cell.key}-rank{c.rank}",
                      "create": [*flags, image, *c.command], "files": mine,
                      "wait_for": [[a, ssh_port] for a in workers] if c.role == "mpi-head" else []})
    return {"ranks": ranks, "ready_s": 60}


def pyxis_uri(image: str) -> str:
    """An image reference as pyxis/enroot name it: ``REGISTRY#PATH`` where the registry is named."""
    registry, _, path = image.partition("/")
    return f"{registry}#{path}" if "." in registry or ":" in registry else image


def pyxis_step(manifest: Manifest, cell: Cell, plans: Sequence[Any], image: str, head: Sequence[str],
               conf: str) -> tuple[list[str], dict[str, str], str | None]:
    """One cell under pyxis/enroot: the srun argv (``head``: ``srun`` and its job-step options), the environment
    srun passes to the tasks (``--container-env`` names it; values never go into argv), and the
    ``--multi-prog`` configuration written to ``conf`` (None for MPI targets: ``srun --mpi=pmix`` starts one
    task per rank, no sshd, as NVIDIA's recipes do). The image by digest from its registry, the manifest's
    mounts and workdir; every task's output labelled with its rank."""
    from repro.run.launchers.base import fill

    first = plans[0]
    volumes = first.container.get("volumes", {})
    for src, m in volumes.items():
        if any(c in path for path in (src, m["bind"]) for c in ",:\n\r\0"):
            raise UsageError(f"the mount {src!r} -> {m['bind']!r} cannot go to pyxis: --container-mounts separates "
                             "entries with ',' and fields with ':', and escapes neither",
                             hint="use a directory (the hosts file's data:, the manifest's mounts) whose path has "
                                  "no ',' or ':', e.g. a link to it")
    mounts = ",".join(f"{src}:{m['bind']}" + (":ro" if m["mode"] == "ro" else "") for src, m in volumes.items())
    env = dict(first.container["environment"])
    bad_env = sorted(k for k in env if not ENV_NAME.match(k))
    if bad_env:
        raise UsageError(f"environment name {bad_env[0]!r} cannot go to pyxis: --container-env is a comma-separated "
                         "list of names", hint="name environment variables with letters, digits and '_' only")
    opts = [f"--container-image={pyxis_uri(image)}", "--no-container-mount-home"]
    opts += [f"--container-mounts={mounts}"] if mounts else []
    if "working_dir" in first.container:
        opts.append(f"--container-workdir={first.container['working_dir']}")
    if env:
        opts.append(f"--container-env={','.join(sorted(env))}")
    if manifest.launch.kind == "mpi":
        per_node = pyxis_tasks_per_node(manifest, cell)
        argv = fill(manifest.launch.command, manifest.launch, cell, [p.command.node for p in plans], 0)
        return ([head[0], "--mpi=pmix", *head[1:], f"--nodes={cell.nodes}", f"--ntasks={cell.nodes * per_node}",
                 f"--ntasks-per-node={per_node}", "--label", *opts, "--", *argv], env, None)
    for p in plans:
        bad = next((t for t in p.command.command if any(c in t for c in "\n\r\0")), None)
        if bad is not None:
            raise UsageError(f"rank {p.command.rank}'s command holds a line break or NUL in {bad!r}: a --multi-prog "
                             "file takes one line per rank", hint="remove line breaks from launch.command and args")
    text = "".join(f"{p.command.rank} {shlex.join(p.command.command)}\n" for p in plans)
    return ([*head, f"--nodes={cell.nodes}", f"--ntasks={cell.nodes}", "--ntasks-per-node=1", "--label", *opts,
             "--multi-prog", conf], env, text)


def pyxis_tasks_per_node(manifest: Manifest, cell: Cell) -> int:
    """Tasks per node of a pyxis cell: one per rank for MPI targets (srun starts them), else one launcher per node."""
    if manifest.launch.kind == "mpi" and manifest.launch.mpi.get("slots", "gpus_per_node") == "gpus_per_node":
        return cell.gpus_per_node
    return 1


def pyxis_head(job: str, nodes: Sequence[str], step: str) -> list[str]:
    """srun's options for a pyxis cell as a job step of the run's allocation."""
    return ["srun", f"--jobid={job}", f"--nodelist={','.join(nodes)}", "--overlap", "--kill-on-bad-exit=1",
            f"--job-name={step}"]


def render_pyxis(manifest: Manifest, cell: Cell, plans: Sequence[Any], image: str, cfg: Mapping[str, str]) -> str:
    """A batch script that runs one cell under pyxis/enroot on its own (exact text; pyxis is not installable
    here): the same job step ``repro up`` starts in its allocation, after the env it passes."""
    argv, env, conf = pyxis_step(manifest, cell, plans, image, ["srun"], "repro-multi-prog.conf")
    body = [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    if conf is not None:
        body += ["cat > repro-multi-prog.conf <<'REPRO_EOF'", conf.rstrip("\n"), "REPRO_EOF"]
    body.append(shlex.join(argv))
    per_node = int(next(a for a in argv if a.startswith("--ntasks-per-node=")).partition("=")[2])
    return render_sbatch(cfg, f"repro-{manifest.id}-{cell.key}", cell.nodes, "\n".join(body), per_node=per_node,
                         output=f"repro-{manifest.id}-{cell.key}-%j.out")


def render_plan_slurm(cfg: Mapping[str, str], manifest: Manifest, hosts: Hosts, cells: Sequence[Cell], *,
                      stand_ins: bool = False) -> str:
    """What ``repro up`` submits under Slurm, from the functions that render it there: the allocation's batch
    script, then each cell's job step (``JOBID``: the allocation's id, known once submitted)."""
    from repro.run.plan import plan_cell
    from repro.redact import redact_argv, redact_text

    need = max(c.nodes for c in cells)
    pyxis = cfg.get("container") == "pyxis"
    lines = ["", "slurm: " + ", ".join(f"{k} {cfg[k]}" for k in KEYS[1:] if cfg.get(k)) if len(cfg) > 1 else "slurm",
             "allocation (sbatch; none where the kit runs inside one, SLURM_JOB_ID):"]
    if stand_ins:
        lines.insert(2, f"nodes: node1..node{need} stand for the nodes Slurm allocates; `repro up` renders every "
                        "cell with their names and addresses")
    per_node = max(pyxis_tasks_per_node(manifest, c) for c in cells) if pyxis else 1
    lines += [f"  {redact_text(ln)}" for ln in render_sbatch(cfg, f"repro-{manifest.id}", need,
                                                              per_node=per_node).splitlines()]
    image = manifest.image_reference
    if pyxis and "build" in manifest.image:
        image = f"REGISTRY/{image}@DIGEST"
        lines.append(f"image: {image} (pyxis pulls the image pushed with --push REGISTRY, by digest)")
    for cell in cells:
        plans = plan_cell(manifest, cell, hosts)
        names = [p.command.node.name for p in plans]
        lines += ["", f"cell {cell.key}: job step"]
        if pyxis:
            argv, env, conf = pyxis_step(manifest, cell, plans, image, pyxis_head("JOBID", names, f"repro-{cell.key}"),
                                         "RUN_DIR/cells/" + cell.key + "/rN/multi-prog.conf")
            lines += [f"  env {k}={v}" for k, v in sorted(redact_env(env).items())]
            lines.append(f"  $ {shlex.join(redact_argv(argv))}")
            if conf is not None:
                lines.append("  multi-prog.conf:")
                lines += [f"    {redact_text(ln)}" for ln in conf.splitlines()]
            continue
        lines.append(f"  $ {shlex.join(srun_argv('JOBID', names, f'repro-{cell.key}')[:-1])} "
                     "<repro/run/schedulers/agent.py> < SPEC")
        spec = step_spec(plans, "RUN", cell, image, {}, None)
        for rank in spec["ranks"]:
            lines.append(f"  task {spec['ranks'].index(rank)} on {rank['node']}: docker create --name {rank['name']} "
                         f"{shlex.join(redact_argv(rank['create']))}")
    return "\n".join(lines) + "\n"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    from repro.redact import redact_argv

    return {k: redact_argv([f"{k}={v}"])[0].partition("=")[2] for k, v in env.items()}


def _now(epoch: float | None = None) -> str:
    return datetime.fromtimestamp(epoch if epoch is not None else time.time(), UTC).isoformat(timespec="milliseconds")


@dataclass
class _Step:
    proc: subprocess.Popen[bytes]
    events: queue.Queue[tuple[str, int, str]] = field(default_factory=queue.Queue)
    step_id: str | None = None
    other: list[str] = field(default_factory=list)  # srun's own lines


@SCHEDULERS.register("slurm")
class SlurmScheduler(Scheduler):
    allocates = True

    def __init__(self, config: Mapping[str, str], manifest: Manifest, cells: Sequence[Cell], hosts: Hosts,
                 progress: Callable[[Event], None] | None = None) -> None:
        super().__init__(config, manifest, cells, hosts, progress)
        self.given = set(self.cfg.pop("_option", "").split(","))
        self.job: str | None = None
        self.owned = False
        self.script: str | None = None
        self.nodes: list[Node] = []
        self.steps: list[dict[str, Any]] = []
        self.waited_s: float | None = None
        self.released = False
        self.checked = False
        self.probed: list[dict[str, Any]] = []

    def per_node(self) -> int:
        """The allocation's tasks per node: under pyxis, the most any cell's job step starts on a node."""
        if self.cfg.get("container") != "pyxis":
            return 1
        return max((pyxis_tasks_per_node(self.manifest, c) for c in self.cells), default=1)

    def where(self, key: str) -> str:
        """Where a setting came from, for errors: the command line or the inventory."""
        if key in self.given or not (self.inventory.path and self.inventory.scheduler):
            return f"--scheduler {key}"
        return f"{self.inventory.path}: scheduler.{key}"

    # -- checks (nothing is submitted until all pass) --------------------------------------
    def check(self, need: int, *, preflight: bool = False) -> None:
        """Everything Slurm can say before a submission; ``preflight``: a short allocation to probe the nodes."""
        self.checked = True
        ping = _cli(["scontrol", "ping"])
        if ping.returncode != 0 or "UP" not in ping.stdout:
            text = (ping.stdout + ping.stderr).strip().splitlines()[0] if (ping.stdout + ping.stderr).strip() else ""
            raise EnvironmentUnavailable(f"Slurm does not answer: {text or 'scontrol ping failed'}",
                                         hint="start slurmctld, or set SLURM_CONF to this cluster's slurm.conf")
        if self.cfg.get("container", "docker") not in ("docker", "pyxis"):
            raise UsageError(f"{self.where('container')}: {self.cfg['container']!r} is not docker or pyxis",
                             hint="container: docker (nodes with a Docker engine) or pyxis (srun --container-image)")
        if self.cfg.get("container") == "pyxis" and "--container-image" not in _cli(["srun", "--help"]).stdout:
            raise UsageError(f"{self.where('container')}: pyxis, but `srun --help` here shows no --container-image "
                             "(the pyxis plugin is not installed)",
                             hint="use container: docker where nodes run a Docker engine, or install pyxis and enroot")
        if os.environ.get("SLURM_JOB_ID"):
            return
        listed = _cli(["sinfo", "-h", "-o", "%P"]).stdout.split()
        partitions = [p.rstrip("*") for p in listed]
        part = self.cfg.get("partition") or next((p.rstrip("*") for p in listed if p.endswith("*")), None)
        missing = [p for p in (part or "").split(",") if p not in partitions]
        if part is None or missing:
            raise UsageError(f"{self.where('partition')}: no partition {missing[0] if missing else part!r} in this "
                             f"cluster (it has: {', '.join(partitions) or 'none'})",
                             hint="set scheduler.partition (or --scheduler slurm:partition=NAME) to one of them")
        total = max(int(_fields(_cli(["scontrol", "show", "partition", "-o", "--", p]).stdout).get("TotalNodes", "0"))
                    for p in part.split(","))
        if need > total:
            raise UsageError(f"{self.where('partition')}: the matrix needs {need} nodes, partition {part} has {total}",
                             hint="choose a larger partition, or filter the cells: --cells nodes=" + str(total))
        limit = seconds(self.cfg["time"]) if self.cfg.get("time") else None
        longest = self.manifest.launch.timeout_s if self.manifest and not preflight else 0
        if limit is not None and limit < longest:
            raise UsageError(f"{self.where('time')}: {self.cfg['time']} ({limit} s) is shorter than one repeat of "
                             f"{self.manifest.id} may take (launch.timeout_s {longest} s)",
                             hint=f"give at least time={-(-longest // 60)} (minutes); a run cut off by the limit "
                                  "resumes with repro up --resume RUN_DIR")
        if preflight:
            short = PREFLIGHT_TIME if limit is None or limit > seconds(PREFLIGHT_TIME) else self.cfg["time"]
            self.script = render_sbatch({**self.cfg, "time": short}, "repro-preflight", need)
        else:
            self.script = render_sbatch(self.cfg, f"repro-{self.manifest.id}", need, per_node=self.per_node())
        test = _cli(["sbatch", "--test-only"], stdin=self.script)
        if test.returncode != 0:
            why = " ".join(test.stderr.replace("sbatch: error:", "").split())
            key = "account" if "account" in why.lower() else "time" if "time" in why.lower() else "constraint" \
                if "feature" in why.lower() or "constraint" in why.lower() else "partition"
            raise UsageError(f"{self.where(key)}: Slurm refuses the job: {why}",
                             hint="fix the scheduler settings (sinfo, sacctmgr show assoc user=$USER show what "
                                  "this account may use); nothing was submitted")

    # -- the allocation ----------------------------------------------------------------------
    def open(self, need: int, *, preflight: bool = False) -> Hosts:
        """The allocation (submitted, or the one the kit runs in) and its nodes; ``preflight``: a short one,
        and no agent probe (preflight's own probe reports every node)."""
        if not self.checked:
            self.check(need, preflight=preflight)
        t0 = time.monotonic()
        if os.environ.get("SLURM_JOB_ID"):
            self.job = os.environ["SLURM_JOB_ID"]
            nodelist = os.environ.get("SLURM_JOB_NODELIST") or _fields(
                _cli(["scontrol", "show", "job", "-o", "--", self.job]).stdout).get("NodeList", "")
            self.progress(Event("info", f"inside Slurm allocation {self.job} ({nodelist})"))
        else:
            sub = _cli(["sbatch", "--parsable"], stdin=self.script)
            if sub.returncode != 0:
                raise RunFailed(f"sbatch failed: {' '.join(sub.stderr.split())}")
            self.job, self.owned = sub.stdout.strip().split(";")[0], True
            self.progress(Event("step", f"Slurm job {self.job}: waiting for {need} node(s)"))
            nodelist = self._wait_running()
        self.waited_s = time.monotonic() - t0
        names = _cli(["scontrol", "show", "hostnames", "--", nodelist]).stdout.split()
        if len(names) < need:
            raise UsageError(f"Slurm allocation {self.job} has {len(names)} node(s), the matrix needs {need}",
                             hint="salloc/sbatch with more nodes, or filter the cells with --cells")
        known = {n.name: n for n in self.inventory.nodes}
        for name in names if preflight and not self.owned else names[:need]:  # preflight: every node it runs in
            addr = _fields(_cli(["scontrol", "show", "node", "-o", "--", name]).stdout).get("NodeAddr", name)
            base = known.get(name)
            self.nodes.append(Node(**{**(base.__dict__ if base else {}), "name": name, "address": addr}))
        if self.cfg.get("container", "docker") == "docker" and not preflight:
            self.probe()
        inv = self.inventory
        # the settings in effect (inventory and command line) go with the nodes, so a run directory resumes with them
        settings = {k: self.cfg[k] for k in KEYS if self.cfg.get(k)}
        return Hosts(tuple(self.nodes), inv.path, inv.data, inv.env, scheduler=settings)

    def preflight(self, nodes: Sequence[Node], *, dataset: Any = None, timeout: float = 120,
                  **_: Any) -> list[Any]:
        """preflight's probe script (the one it runs over SSH) as one job step on the allocated nodes, one task
        per node with the script on stdin; a report per node, as over SSH (a node the step did not reach gets
        a row saying why)."""
        from repro.nodes.preflight import NodeReport, Probe, node_report, probe_script

        names = [n.name for n in nodes]
        script = probe_script(Node(names[0], names[0]), dataset)  # docker_host None: each node's own engine
        proc = subprocess.Popen(preflight_argv(str(self.job), names), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        tasks: dict[int, list[str]] = {}
        arrival: dict[int, float] = {}
        other: list[str] = []
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(script.encode())
            proc.stdin.close()
            for raw in proc.stdout:
                m = LABELLED.match(raw.decode("utf-8", "replace").rstrip("\n"))
                if not m:
                    other.append(raw.decode("utf-8", "replace").strip())
                    continue
                lines = tasks.setdefault(int(m.group(1)), [])
                lines.append(m.group(2))
                if len(lines) == 2:  # the node's name, then its date: the clock line
                    arrival[int(m.group(1))] = time.time()
            rc = proc.wait()
        finally:
            timer.cancel()
        by_node = {lines[0]: (task, lines[1:]) for task, lines in tasks.items() if lines}
        why = " ".join(" | ".join(other[-3:]).split())[:300] or f"srun exit status {proc.returncode}"
        out = []
        for n in nodes:
            if n.name not in by_node:
                out.append(NodeReport(n.name, n.address, Probe(reason=f"the preflight job step of Slurm job "
                                                                      f"{self.job} did not run on it: {why}")))
                continue
            task, lines = by_node[n.name]
            report = node_report(n, "\n".join(lines) + "\n", Probe(detail="srun"), arrival.get(task),
                                 f"exit {rc}", dataset)
            # under pyxis, enroot runs the containers: the node needs no Docker engine
            out.append(report if self.engines else dataclasses.replace(report, docker=Probe("pyxis", detail="enroot")))
        return out

    def probe(self) -> None:
        """A job step on every allocated node before any cell: each must reach a Docker engine from inside a step."""
        names = [n.name for n in self.nodes]
        out = _cli(srun_argv(str(self.job), names, "repro-probe"), stdin=json.dumps({"probe": True}), timeout=120)
        found = {}
        for line in out.stdout.splitlines():
            m = LABELLED.match(line)
            if m and m.group(2).startswith("##repro probe "):
                info = json.loads(m.group(2)[len("##repro probe "):])
                found[info["node"]] = info
        self.probed = [found.get(n, {"node": n}) for n in names]
        bad = [f"{n}: " + (found[n]["docker_error"] or "no engine") if n in found else
               f"{n}: the probe step did not run ({' '.join(out.stderr.split())[:300] or 'no output'})"
               for n in names if n not in found or not found[n]["docker"]]
        if bad:
            raise EnvironmentUnavailable("container: docker, but a job step cannot reach a Docker engine on:\n  "
                                         + "\n  ".join(bad),
                                         hint="use container: pyxis where the cluster has pyxis/enroot, or nodes "
                                              "whose job steps may use Docker")
        self.progress(Event("info", "job step probe: " + "; ".join(
            f"{i['node']} docker {i['docker']}, {i['cpus']} CPUs, {i['gpus']} GPUs"
            + (", InfiniBand" if i["infiniband"] else "") for i in self.probed)))

    def _wait_running(self) -> str:
        last = ""
        while True:
            info = _fields(_cli(["scontrol", "show", "job", "-o", "--", str(self.job)]).stdout)
            state = info.get("JobState", "")
            if state == "RUNNING":
                return info.get("NodeList", "")
            if state not in ("PENDING", "CONFIGURING", ""):
                raise RunFailed(f"Slurm job {self.job} is {state} before it ran ({info.get('Reason', '')})")
            if info.get("Reason", "None") not in (last, "None"):
                last = info["Reason"]
                self.progress(Event("info", f"job {self.job} {state}: {last}"))
            time.sleep(0.1)

    def facts(self) -> dict[str, Any]:
        return {"kind": "slurm", "job_id": self.job, "allocation": "submitted" if self.owned else "existing",
                "partition": self.cfg.get("partition") or _fields(
                    _cli(["scontrol", "show", "job", "-o", "--", str(self.job)]).stdout).get("Partition"),
                **{k: self.cfg.get(k) for k in ("account", "qos", "reservation", "time", "constraint", "exclude")},
                "container": self.cfg.get("container", "docker"),
                "nodes": [n.name for n in self.nodes], "sbatch_script": self.script,
                "allocation_wait_s": round(self.waited_s or 0.0, 3), "probe": self.probed, "steps": self.steps}

    def job_state(self) -> str:
        """The job's state once settled: a job being torn down (COMPLETING) is waited for, up to a minute."""
        for _ in range(120):
            state = _fields(_cli(["scontrol", "show", "job", "-o", "--", str(self.job)]).stdout).get("JobState", "UNKNOWN")
            if state != "COMPLETING":
                break
            time.sleep(0.5)
        return state

    def close(self, interrupted: bool = False) -> None:
        if self.owned and self.job and not self.released:
            self.released = True
            _cli(["scancel", "--", self.job])
            self.progress(Event("info", f"Slurm job {self.job} cancelled" if interrupted else
                                f"Slurm job {self.job} released"))

    @property
    def engines(self) -> bool:
        """Whether the nodes' Docker engines run the containers (not under pyxis: enroot does, from the registry)."""
        return self.cfg.get("container", "docker") == "docker"

    @classmethod
    def plan_text(cls, cfg: Mapping[str, str], manifest: Manifest, hosts: Hosts,
                  cells: Sequence[Cell]) -> tuple[Hosts, str]:
        """The allocation's script and each cell's job step; nodes Slurm has not allocated yet are stand-ins."""
        need = max(c.nodes for c in cells)
        stand_ins = len(hosts.nodes) < need or hosts.nodes[0].local
        if stand_ins:
            hosts = dataclasses.replace(hosts, nodes=placeholder_hosts(need).nodes)
        return hosts, render_plan_slurm(cfg, manifest, hosts, cells, stand_ins=stand_ins)

    # -- one cell = one job step -------------------------------------------------------------
    def launch_cell(self, manifest: Manifest, cell: Cell, hosts: Hosts, log_dir: Path, *, run_id: str,
                    clients: Any = None, timeout_s: float | None = None,
                    on_event: Callable[[tuple[str, str, str]], None] | None = None,
                    image: str | None = None,
                    log_writer: Callable[[int, str], Any] | None = None) -> list[Any]:
        from repro.run.launchers.mpi import DEFAULT_SSH_PORT
        from repro.run.plan import plan_cell

        if not self.engines:
            return self._launch_pyxis(manifest, cell, hosts, log_dir, timeout_s=timeout_s, on_event=on_event,
                                      image=image, log_writer=log_writer)
        plans = plan_cell(manifest, cell, hosts)
        image = image or plans[0].image
        port = int(manifest.launch.mpi.get("ssh_port", DEFAULT_SSH_PORT)) if manifest.launch.kind == "mpi" else None
        files = mpi_files(plans, port) if port else {}
        spec = step_spec(plans, run_id, cell, image, files, port)
        emit = on_event or (lambda e: None)
        log_dir.mkdir(parents=True, exist_ok=True)
        writer = log_writer or (lambda rank, node: FileSink(log_dir / f"{rank}-{node}.log"))
        results = [NodeResult(p.command.node.name, p.command.node.address, p.command.rank, p.command.role,
                              p.command.command, str(log_dir / f"{p.command.rank}-{p.command.node.name}.log"),
                              container=spec["ranks"][i]["name"]) for i, p in enumerate(plans)]
        sinks = []
        for r in results:
            sinks.append(writer(r.rank, r.node))
            r.log = str(sinks[-1].path)
        argv = srun_argv(str(self.job), [r.node for r in results], f"repro-{cell.key}")
        submitted = time.time()
        step = _Step(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        reader = threading.Thread(target=self._read, args=(step, results, sinks), daemon=True)
        reader.start()
        assert step.proc.stdin is not None
        step.proc.stdin.write(json.dumps(spec).encode())
        step.proc.stdin.close()
        decisive = {r.rank for r in results if r.role != "mpi-sshd"}
        deadline = time.monotonic() + (timeout_s or manifest.launch.timeout_s)
        stopped = False
        try:
            while decisive and step.proc.poll() is None or not step.events.empty():
                if time.monotonic() > deadline:
                    for r in results:
                        if r.rank in decisive:
                            r.error = f"timed out after {timeout_s or manifest.launch.timeout_s:.0f} s"
                    break
                try:
                    kind, rank, text = step.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                emit((kind, results[rank].node, text))
                if kind == "error" or (kind == "exited" and text != "0"):
                    break
                if kind == "exited":
                    decisive.discard(rank)
            if not decisive and all(r.role != "mpi-sshd" for r in results):
                try:
                    step.proc.wait(30)  # every rank exited: the agents finish their removal
                except subprocess.TimeoutExpired:
                    pass
            self._stop(step, quiet=not decisive)
            stopped = True
            reader.join(60)
        except BaseException:
            if not stopped:
                with _sigint_ignored():
                    self._stop(step, quiet=False)
                    reader.join(30)
                    _await_removal(clients, results)
            raise
        finally:
            for s in sinks:
                s.close()
            ended = _now()
            for r in results:
                r.ended = r.ended or ended
            self.steps.append({"cell": cell.key, "step": step.step_id, "srun": argv[:-1] + ["<agent>"],
                               "submitted": _now(submitted), "exit_code": step.proc.returncode,
                               "started": {r.node: r.started for r in results}})
        state = "RUNNING"
        if step.proc.returncode not in (0, None) or not all(r.ok for r in results):
            # a step killed from outside (no exit from a container): give slurmctld a moment to say why
            killed = any(r.exit_code is None and r.error is None for r in results)
            for _ in range(20 if killed else 1):
                state = self.job_state()
                if state != "RUNNING":
                    break
                time.sleep(0.5)
        _await_removal(clients, results)
        if state in ENDED_BY_SLURM:
            raise SchedulerStopped(f"Slurm ended job {self.job} ({state}) while cell {cell.key} ran",
                                   hint="repro up --resume RUN_DIR runs what is not done in a new allocation")
        for r in results:
            if r.exit_code is None and r.error is None:
                r.error = "the job step ended without the container's exit: " + " | ".join(step.other[-3:])
        if not all(r.ok for r in results):
            self._sweep(run_id, [r.node for r in results])
            raise CellFailed(cell, results)
        return results

    def _launch_pyxis(self, manifest: Manifest, cell: Cell, hosts: Hosts, log_dir: Path, *,
                      timeout_s: float | None, on_event: Callable[[tuple[str, str, str]], None] | None,
                      image: str | None, log_writer: Callable[[int, str], Any] | None) -> list[Any]:
        """One cell as a pyxis job step of the allocation: srun starts every rank in an enroot container of the
        image (by digest, from its registry); each task's labelled output goes to its node's log; a task's exit
        status comes from srun's own report of it. enroot's containers end with the step: none to remove."""
        from repro.run.launchers.base import fill
        from repro.run.plan import plan_cell

        plans = plan_cell(manifest, cell, hosts)
        names = [p.command.node.name for p in plans]
        log_dir.mkdir(parents=True, exist_ok=True)
        conf_path = log_dir / "multi-prog.conf"
        argv, env, conf = pyxis_step(manifest, cell, plans, str(image or plans[0].image),
                                     pyxis_head(str(self.job), names, f"repro-{cell.key}"), str(conf_path))
        if conf is not None:
            conf_path.write_text(conf, encoding="utf-8")
        per_node = int(next(a for a in argv if a.startswith("--ntasks-per-node=")).partition("=")[2])
        mpi = manifest.launch.kind == "mpi"
        program = tuple(fill(manifest.launch.command, manifest.launch, cell, [p.command.node for p in plans], 0)) \
            if mpi else ()
        writer = log_writer or (lambda rank, node: FileSink(log_dir / f"{rank}-{node}.log"))
        results = [NodeResult(p.command.node.name, p.command.node.address, i, "mpi-rank" if mpi else p.command.role,
                              program or p.command.command, "") for i, p in enumerate(plans)]
        sinks = [writer(r.rank, r.node) for r in results]
        for r, sink in zip(results, sinks):
            r.log = str(sink.path)
        emit = on_event or (lambda e: None)
        submitted = time.time()
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        started = _now()
        for r in results:
            r.started = started
            emit(("started", r.node, started))
        other: list[str] = []
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.terminate()  # srun passes it on to the step's tasks

        timer = threading.Timer(timeout_s or manifest.launch.timeout_s, expire)
        timer.start()
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                m = LABELLED.match(line)
                if not m or int(m.group(1)) // per_node >= len(results):
                    other.append(line)
                    continue
                i = int(m.group(1)) // per_node
                sinks[i].write((m.group(2) + "\n").encode())
                results[i].tail = (results[i].tail + [m.group(2)])[-20:]
                emit(("line", results[i].node, m.group(2)))
            proc.wait()
        except BaseException:
            with _sigint_ignored():
                proc.terminate()
                proc.wait(60)
            raise
        finally:
            timer.cancel()
            for s in sinks:
                s.close()
            ended = _now()
            for r in results:
                r.ended = ended
            self.steps.append({"cell": cell.key, "srun": argv, "env": sorted(env), "submitted": _now(submitted),
                               "exit_code": proc.returncode, "started": {r.node: r.started for r in results}})
        timed_out = expired.is_set()
        codes = task_exits(other, names)
        for r in results:
            r.exit_code = codes.get(r.node, 0 if proc.returncode == 0 else None)
            if timed_out:
                r.error = f"timed out after {timeout_s or manifest.launch.timeout_s:.0f} s"
            elif r.exit_code is None:
                r.error = "the job step ended without the task's exit: " + " | ".join(other[-3:])
            emit(("exited", r.node, str(r.exit_code)))
        if not all(r.ok for r in results):
            state = self.job_state()
            if state in ENDED_BY_SLURM:
                raise SchedulerStopped(f"Slurm ended job {self.job} ({state}) while cell {cell.key} ran",
                                       hint="repro up --resume RUN_DIR runs what is not done in a new allocation")
            raise CellFailed(cell, results)
        return results

    def _read(self, step: _Step, results: list[Any], sinks: list[Any]) -> None:
        """srun's merged output: labelled lines to the rank's log (or events), the rest kept as srun's own."""
        assert step.proc.stdout is not None
        for raw in step.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            m = LABELLED.match(line)
            if not m or int(m.group(1)) >= len(results):
                step.other.append(line)
                continue
            rank, text = int(m.group(1)), m.group(2)
            r = results[rank]
            if text.startswith("slurmstepd"):  # Slurm's own word about the step, not the rank's output
                step.other.append(text)
                continue
            if text.startswith("##repro "):
                word, _, rest = text[8:].partition(" ")
                if word == "step":
                    step.step_id = rest.split()[0]
                elif word == "started":
                    r.started = _now(float(rest))
                    step.events.put(("started", rank, r.started))
                elif word == "exited":
                    if not rest.startswith("signal"):
                        r.exit_code = int(rest)
                    elif r.role == "mpi-sshd":
                        r.exit_code = 0
                    step.events.put(("exited", rank, rest))
                elif word == "error":
                    r.error = rest
                    step.events.put(("error", rank, rest))
                continue
            sinks[rank].write((text + "\n").encode())
            sinks[rank].flush()
            r.tail = (r.tail + [text])[-20:]
            step.events.put(("line", rank, text))

    def _stop(self, step: _Step, *, quiet: bool) -> None:
        """End a step that still runs: SIGTERM to its tasks (the agents remove their containers)."""
        if step.proc.poll() is not None:
            return
        if step.step_id:
            _cli(["scancel", "--signal=TERM", "--", step.step_id])
        else:
            step.proc.send_signal(signal.SIGINT)
        try:
            step.proc.wait(60)
        except subprocess.TimeoutExpired:
            _cli(["scancel", "--", step.step_id or str(self.job)])
            step.proc.wait(60)

    def _sweep(self, run_id: str, nodes: Sequence[str]) -> None:
        """After a failed step: remove whatever container of this run a killed agent left (job still running)."""
        if self.job_state() != "RUNNING":
            return
        argv = srun_argv(str(self.job), nodes, "repro-sweep")
        _cli(argv, stdin=json.dumps({"sweep": run_id}), timeout=60)


TASK_EXIT = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): Exited with exit code (\d+)$")


def task_exits(lines: Sequence[str], nodes: Sequence[str]) -> dict[str, int]:
    """The non-zero exit statuses srun reports for a step's tasks, by node (the highest of a node's tasks)."""
    out: dict[str, int] = {}
    for line in lines:
        m = TASK_EXIT.match(line.strip())
        if m and m.group(1) in nodes:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(3)))
    return out


def _await_removal(clients: Mapping[str, Any] | None, results: Sequence[Any], wait_s: float = 30) -> None:
    """Where the kit reaches the nodes' engines: wait until the agents' removals are done (a killed agent's
    request still completes in the engine), and remove what is left after ``wait_s``."""
    import docker

    for r in results:
        client = (clients or {}).get(r.node)
        if client is None:
            continue
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    c = client.containers.get(r.container)
                except docker.errors.NotFound:
                    break
                if time.monotonic() > deadline:
                    c.remove(force=True)
                    break
                time.sleep(0.2)
        except docker.errors.APIError:
            pass  # being removed right now


class _sigint_ignored:
    def __enter__(self) -> None:
        try:
            self.prev = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread
            self.prev = None

    def __exit__(self, *exc: object) -> None:
        if self.prev is not None:
            signal.signal(signal.SIGINT, self.prev)
