"""The run's allocation: checked before anything is submitted, submitted (or the one the kit runs in),
its nodes named and probed, its facts recorded, released on every way out.

The allocation is a batch job whose script only holds the nodes (the kit runs each cell in it with
``srun --jobid``), or the allocation the kit already runs in (``SLURM_JOB_ID``). Node names come from
Slurm (``scontrol show hostnames``), addresses from ``scontrol show node``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from repro.errors import EnvironmentUnavailable, RunFailed, UsageError
from repro.events import Event
from repro.run.schedulers import KEYS
from repro.run.schedulers.slurm.commands import LABELLED, cli, fields
from repro.run.schedulers.slurm.render import pyxis_tasks_per_node, render_sbatch, srun_argv
from repro.run.schedulers.slurm.pmicheck import default_mpi
from repro.run.schedulers.slurm.siteenv import host_export
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Cell, Manifest
from repro.spec.scheduler import seconds

#: the setting Slurm's refusal of a batch script names, by the words in it
REFUSALS = ((("account",), "account"), (("time",), "time"), (("feature", "constraint"), "constraint"),
            (("gres", "gpu"), "gpu_request"), (("memory",), "mem"))
PREFLIGHT_TIME = "5"  # minutes: preflight's own allocation, where it is not run inside one
CONTAINERS = ("docker", "pyxis", "apptainer")
#: the runtimes that start one task per MPI rank through Slurm's PMI (no mpirun, no sshd)
PMI_RUNTIMES = ("pyxis", "apptainer")


class Allocation:
    """One Slurm job holding the run's nodes; ``steps`` collects what each job step in it recorded."""

    def __init__(self, config: Mapping[str, str], manifest: Manifest | None, cells: Sequence[Cell],
                 inventory: Hosts, progress: Callable[[Event], None]) -> None:
        self.cfg = dict(config)
        self.given = set(self.cfg.pop("_option", "").split(","))
        self.manifest, self.cells, self.inventory, self.progress = manifest, cells, inventory, progress
        self.job: str | None = None
        self.owned = False
        self.script: str | None = None
        self.nodes: list[Node] = []
        self.steps: list[dict[str, Any]] = []
        self.waited_s: float | None = None
        self.released = False
        self.cpus: dict[str, int] = {}  # each allocated node's CPUs (scontrol show node: CPUTot)
        self.checked = False
        self.probed: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}  # what a runtime made for the allocation (apptainer: the SIF)
        self.run_image: Any = None  # under pyxis: the run's image on the nodes (imagestep.RunImage)

    @property
    def container(self) -> str:
        return self.cfg.get("container", "docker")

    def per_node(self) -> int:
        """The allocation's tasks per node: under pyxis or apptainer, the most any cell's job step starts on a
        node."""
        if self.cfg.get("container") not in PMI_RUNTIMES:
            return 1
        return max((pyxis_tasks_per_node(self.manifest, c) for c in self.cells), default=1)

    def export(self) -> str:
        """``--export=`` of a step on the nodes themselves (``siteenv.host_export``): what this process's
        environment sets of what the node's tools read, the pass-through list; nothing else of it."""
        return host_export(None, self.cfg)

    def where(self, key: str) -> str:
        """Where a setting came from, for errors: the command line or the inventory."""
        if key in self.given or not (self.inventory.path and self.inventory.scheduler):
            return f"--scheduler {key}"
        return f"{self.inventory.path}: scheduler.{key}"

    # -- checks (nothing is submitted until all pass) --------------------------------------
    def check(self, need: int, *, preflight: bool = False) -> None:
        """Everything Slurm can say before a submission; ``preflight``: a short allocation to probe the
        nodes."""
        self.checked = True
        self._check_slurm()
        if os.environ.get("SLURM_JOB_ID"):
            return
        limit = self._check_partition(need)
        longest = self.manifest.launch.timeout_s if self.manifest and not preflight else 0
        if limit is not None and limit < longest:
            hint = (f"give at least time={-(-longest // 60)} (minutes); a run cut off by the limit resumes "
                    "with repro up --resume RUN_DIR")
            raise UsageError(f"{self.where('time')}: {self.cfg['time']} ({limit} s) is shorter than one "
                             f"repeat of {self.manifest.id} may take (launch.timeout_s {longest} s)",
                             hint=hint)
        if preflight:
            short = PREFLIGHT_TIME if limit is None or limit > seconds(PREFLIGHT_TIME) else self.cfg["time"]
            self.script = render_sbatch({**self.cfg, "time": short}, "repro-preflight", need,
                                        gpus=self.inventory.gpus)
        else:
            self.script = render_sbatch(self.cfg, f"repro-{self.manifest.id}", need, per_node=self.per_node(),
                                        gpus=self.inventory.gpus)
        self._test_script()

    def _check_slurm(self) -> None:
        """slurmctld answers, and the container setting is one this cluster runs."""
        ping = cli(["scontrol", "ping"])
        if ping.returncode != 0 or "UP" not in ping.stdout:
            said = (ping.stdout + ping.stderr).strip()
            text = said.splitlines()[0] if said else ""
            hint = "start slurmctld, or set SLURM_CONF to this cluster's slurm.conf"
            raise EnvironmentUnavailable(f"Slurm does not answer: {text or 'scontrol ping failed'}",
                                         hint=hint)
        if self.container not in CONTAINERS:
            hint = ("container: docker (nodes with a Docker engine), pyxis (srun --container-image) or "
                    "apptainer (apptainer exec of a SIF)")
            raise UsageError(f"{self.where('container')}: {self.cfg['container']!r} is not one of "
                             f"{', '.join(CONTAINERS)}", hint=hint)
        if self.container == "apptainer" and not self.cfg.get("sif_dir"):
            raise UsageError(f"{self.where('sif_dir')}: container: apptainer needs sif_dir, a directory "
                             "every node sees, where the run's SIF is built once",
                             hint="add sif_dir: /path/on/a/shared/filesystem to the scheduler section")
        if self.container == "pyxis" and "--container-image" not in cli(["srun", "--help"]).stdout:
            raise UsageError(f"{self.where('container')}: pyxis, but `srun --help` here shows no "
                             "--container-image (the pyxis plugin is not installed)",
                             hint="use container: docker where nodes run a Docker engine, or install pyxis "
                                  "and enroot")
        self._check_mpi()

    def _check_mpi(self) -> None:
        """Under pyxis an MPI target's ranks start through Slurm's PMI (``mpi``; unnamed, the first of pmix
        and pmi2 that ``srun --mpi=list`` offers): srun here must offer it."""
        mpi_target = self.manifest is not None and self.manifest.launch.kind == "mpi"
        if self.container != "pyxis" or not (mpi_target or "mpi" in self.cfg):
            return
        offered = [w for w in cli(["srun", "--mpi=list"]).stdout.split() if w.isidentifier()]
        want = self.cfg.setdefault("mpi", default_mpi(offered))  # unnamed: the first of pmix, pmi2 offered
        if want not in offered:
            plugins = [w for w in offered if w in ("pmix", "pmi2", "cray_shasta", "none")]
            raise UsageError(f"{self.where('mpi')}: {want}, but `srun --mpi=list` here offers "
                             f"{', '.join(plugins) or 'no MPI plugin'}",
                             hint="set mpi: to one srun offers and the image's MPI supports (pmix, pmi2); "
                                  "srun loads mpi/pmix only where libpmix is installed")

    def _check_partition(self, need: int) -> int | None:
        """The partition exists and has ``need`` nodes; returns the time limit set, in seconds."""
        listed = cli(["sinfo", "-h", "-o", "%P"]).stdout.split()
        partitions = [p.rstrip("*") for p in listed]
        part = self.cfg.get("partition") or next((p.rstrip("*") for p in listed if p.endswith("*")), None)
        missing = [p for p in (part or "").split(",") if p not in partitions]
        if part is None or missing:
            hint = "set scheduler.partition (or --scheduler slurm:partition=NAME) to one of them"
            raise UsageError(f"{self.where('partition')}: no partition {missing[0] if missing else part!r} "
                             f"in this cluster (it has: {', '.join(partitions) or 'none'})", hint=hint)
        shown = [fields(cli(["scontrol", "show", "partition", "-o", "--", p]).stdout)
                 for p in part.split(",")]
        total = max(int(f.get("TotalNodes", "0")) for f in shown)
        if need > total:
            hint = f"choose a larger partition, or filter the cells: --cells nodes={total}"
            raise UsageError(f"{self.where('partition')}: the matrix needs {need} nodes, partition {part} "
                             f"has {total}", hint=hint)
        return seconds(self.cfg["time"]) if self.cfg.get("time") else None

    def _test_script(self) -> None:
        """``sbatch --test-only`` of the script: Slurm's refusal names the setting to fix."""
        test = cli(["sbatch", "--test-only"], stdin=self.script)
        if test.returncode != 0:
            why = " ".join(test.stderr.replace("sbatch: error:", "").split())
            low = why.lower()
            key = next((k for words, k in REFUSALS if any(w in low for w in words)), "partition")
            hint = ("fix the scheduler settings (sinfo, sacctmgr show assoc user=$USER show what this "
                    "account may use); nothing was submitted")
            raise UsageError(f"{self.where(key)}: Slurm refuses the job: {why}", hint=hint)

    # -- the allocation ----------------------------------------------------------------------
    def open(self, need: int, *, preflight: bool = False) -> Hosts:
        """The allocation (submitted, or the one the kit runs in) and its nodes; ``preflight``: a short one,
        and no agent probe (preflight's own probe reports every node)."""
        if not self.checked:
            self.check(need, preflight=preflight)
        t0 = time.monotonic()
        if os.environ.get("SLURM_JOB_ID"):
            self.job = os.environ["SLURM_JOB_ID"]
            nodelist = os.environ.get("SLURM_JOB_NODELIST") or fields(
                cli(["scontrol", "show", "job", "-o", "--", self.job]).stdout).get("NodeList", "")
            self.progress(Event("info", f"inside Slurm allocation {self.job} ({nodelist})"))
        else:
            sub = cli(["sbatch", "--parsable"], stdin=self.script)
            if sub.returncode != 0:
                raise RunFailed(f"sbatch failed: {' '.join(sub.stderr.split())}")
            self.job, self.owned = sub.stdout.strip().split(";")[0], True
            self.progress(Event("step", f"Slurm job {self.job}: waiting for {need} node(s)"))
            nodelist = self._wait_running()
        self.waited_s = time.monotonic() - t0
        self._name_nodes(nodelist, need, preflight)
        if self.container == "docker" and not preflight:
            self.probe()
        inv = self.inventory
        # the settings in effect (inventory and command line) go with the nodes: a run directory resumes
        # with them
        settings = {k: self.cfg[k] for k in KEYS if self.cfg.get(k)}
        return dataclasses.replace(inv, nodes=tuple(self.nodes), scheduler=settings)

    def _name_nodes(self, nodelist: str, need: int, preflight: bool) -> None:
        """The allocated nodes with the names and addresses Slurm gives them (the inventory's settings
        kept)."""
        names = cli(["scontrol", "show", "hostnames", "--", nodelist]).stdout.split()
        if len(names) < need:
            raise UsageError(f"Slurm allocation {self.job} has {len(names)} node(s), the matrix needs {need}",
                             hint="salloc/sbatch with more nodes, or filter the cells with --cells")
        known = {n.name: n for n in self.inventory.nodes}
        # preflight in an allocation the kit runs in: every node of it
        for name in names if preflight and not self.owned else names[:need]:
            shown = fields(cli(["scontrol", "show", "node", "-o", "--", name]).stdout)
            addr = shown.get("NodeAddr", name)
            if shown.get("CPUTot", "").isdigit():  # a socket-bound step shares them among its tasks
                self.cpus[name] = int(shown["CPUTot"])
            base = known.get(name)
            self.nodes.append(Node(**{**(base.__dict__ if base else {}), "name": name, "address": addr}))

    def probe(self) -> None:
        """A job step on every allocated node before any cell: each must reach a Docker engine from inside
        a step."""
        names = [n.name for n in self.nodes]
        out = cli(srun_argv(str(self.job), names, "repro-probe", self.export()),
                  stdin=json.dumps({"probe": True}), timeout=120)
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
            hint = ("use container: pyxis where the cluster has pyxis/enroot, or nodes whose job steps may "
                    "use Docker")
            raise EnvironmentUnavailable("container: docker, but a job step cannot reach a Docker engine "
                                         "on:\n  " + "\n  ".join(bad), hint=hint)
        self.progress(Event("info", "job step probe: " + "; ".join(
            f"{i['node']} docker {i['docker']}, {i['cpus']} CPUs, {i['gpus']} GPUs"
            + (", InfiniBand" if i["infiniband"] else "") for i in self.probed)))

    def _wait_running(self) -> str:
        last = ""
        while True:
            info = fields(cli(["scontrol", "show", "job", "-o", "--", str(self.job)]).stdout)
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
                "partition": self.cfg.get("partition") or fields(
                    cli(["scontrol", "show", "job", "-o", "--", str(self.job)]).stdout).get("Partition"),
                **{k: self.cfg.get(k) for k in ("account", "qos", "reservation", "time", "constraint",
                                                "exclude", "gpu_request", "mem", "sbatch_extra")},
                "container": self.container,
                "nodes": [n.name for n in self.nodes], "sbatch_script": self.script,
                "allocation_wait_s": round(self.waited_s or 0.0, 3), "probe": self.probed,
                "steps": self.steps, **self.extra}

    def steps_ended(self, keep: str | None = None, timeout: float = 180) -> None:
        """Wait, at most ``timeout`` seconds, until no step of the job is listed but ``keep``, the batch
        script's and the extern step (steps being torn down are listed until they are gone)."""
        if not self.job:
            return
        ours = {keep, f"{self.job}.batch", f"{self.job}.extern"}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = cli(["squeue", "-h", "-s", "-j", str(self.job), "-o", "%i"]).stdout.split()
            if not set(listed) - ours:
                return
            time.sleep(0.5)

    def job_state(self) -> str:
        """The job's state once settled: a job being torn down (COMPLETING) is waited for, up to a minute."""
        for _ in range(120):
            state = fields(cli(["scontrol", "show", "job", "-o", "--", str(self.job)]).stdout).get(
                "JobState", "UNKNOWN")
            if state != "COMPLETING":
                break
            time.sleep(0.5)
        return state

    def close(self, interrupted: bool = False) -> None:
        if self.owned and self.job and not self.released:
            self.released = True
            cli(["scancel", "--", self.job])
            self.progress(Event("info", f"Slurm job {self.job} cancelled" if interrupted else
                                f"Slurm job {self.job} released"))
