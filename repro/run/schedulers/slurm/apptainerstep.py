"""``container: apptainer``: the run's SIF is built once, in ``sif_dir`` (a directory every node sees), by
a job step on the allocation's first node; each cell's job step then starts every rank with ``apptainer
exec`` of that SIF (the ``apptainer`` module says which flags, and why). Apptainer's containers end with
their process: there is none to remove, and the SIF is removed when the allocation is released."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from repro.errors import RunFailed
from repro.run.plan import plan_cell
from repro.run.cell import CellJob
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.apptainer import (apptainer_step, build_argv, build_result, rm_argv,
                                                  seen_argv, sif_path, unseen)
from repro.run.schedulers.slurm.commands import cli
from repro.run.schedulers.slurm.render import pyxis_head, pyxis_tasks_per_node
from repro.run.schedulers.slurm.samplerstep import SamplerStep
from repro.run.schedulers.slurm.steps import TaskStep, step_site

SIF_BUILD_S = 3600  # an NGC image of 10-20 GB converts in minutes; an hour bounds a stuck registry


class ApptainerStep(TaskStep):
    """One cell as a job step of ``apptainer exec`` tasks: each task's labelled output goes to its node's log
    (``per_node`` tasks a node for MPI targets); a task's exit status comes from srun's own report of it."""

    @classmethod
    def make(cls, alloc: Allocation, job: CellJob) -> ApptainerStep:
        manifest, cell = job.manifest, job.cell
        plans = plan_cell(manifest, cell, job.hosts)
        names = [p.command.node.name for p in plans]
        sif = cls.sif(alloc, job, names)
        job.log_dir.mkdir(parents=True, exist_ok=True)
        conf_path = job.log_dir / "multi-prog.conf"
        head = pyxis_head(str(alloc.job), names, f"repro-{cell.key}")
        argv, env, conf = apptainer_step(manifest, cell, plans, sif, head, str(conf_path),
                                         mpi=str(alloc.cfg.get("mpi", "pmix")),
                                         per_node=pyxis_tasks_per_node(manifest, cell),
                                         site=step_site(alloc, job))
        return cls.from_argv(alloc, job, plans, argv, env, conf, conf_path, SamplerStep(alloc, job, names))

    @staticmethod
    def sif(alloc: Allocation, job: CellJob, nodes: list[str]) -> str:
        """The run's SIF: built by the first cell's step, on its first node, from the image by digest; every
        node of each cell must see it (``sif_dir`` shared), asked once a node."""
        built = alloc.extra.get("apptainer") or ApptainerStep.build(alloc, job, nodes[0])
        new = [n for n in nodes if n not in built["seen_on"]]
        if new:
            out = cli(seen_argv(str(alloc.job), new, built["sif"]), timeout=120)
            missing = unseen(out.stdout.splitlines(), new, built["size"])
            if missing:
                raise RunFailed(f"{', '.join(missing)} do(es) not see {built['sif']} as {nodes[0]} built it: "
                                "sif_dir must be a directory every node shares",
                                hint="set scheduler.sif_dir to a path on the cluster's shared filesystem")
            built["seen_on"] += new
        return str(built["sif"])

    @staticmethod
    def build(alloc: Allocation, job: CellJob, node: str) -> dict[str, Any]:
        path = sif_path(str(alloc.cfg["sif_dir"]), job.run_id)
        argv = build_argv(str(alloc.job), node, path, str(job.image), alloc.export())
        t0 = time.monotonic()
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=SIF_BUILD_S)
        except subprocess.TimeoutExpired as e:
            raise RunFailed(f"the SIF build step ({path}) did not end in {SIF_BUILD_S} s") from e
        found = build_result(out.stdout.splitlines(), path)
        if out.returncode != 0 or not found["sha256"] or found["size"] is None:
            said = " | ".join((out.stderr.strip().splitlines() or ["no output"])[-3:])
            raise RunFailed(f"apptainer could not build {path} from {job.image} on {node}: {said}")
        alloc.extra["apptainer"] = {"sif": path, "source": argv[-1], "node": node, **found,
                                    "build_s": round(time.monotonic() - t0, 3), "seen_on": [node]}
        return alloc.extra["apptainer"]

    @staticmethod
    def release(alloc: Allocation) -> None:
        """Remove the run's SIF: a job step while the job runs, else here where ``sif_dir`` is seen."""
        built = alloc.extra.get("apptainer")
        if not built or built.get("removed"):
            return
        built["removed"] = True
        if alloc.job and alloc.job_state() == "RUNNING":
            done = cli(rm_argv(str(alloc.job), built["node"], built["sif"]), timeout=60)
            if done.returncode == 0:
                return
        Path(built["sif"]).unlink(missing_ok=True)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "sif": self.alloc.extra.get("apptainer", {}).get("sif")}
