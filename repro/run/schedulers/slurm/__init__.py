"""``slurm``: one allocation for the run, one job step per cell.

``allocation``: the run's allocation (checked, submitted or found, its nodes, its facts, released).
``render``: what is submitted, as exact text and argv (pure functions; ``repro plan`` shows them).
``steps``: what every job step shares (srun's labelled output split by rank, a timeout, the stop), the
preflight step and what every cell step shares; one module per kind of cell step, named in ``CELL_STEPS``
by the ``container:`` setting: ``dockerstep`` (the agent, ``repro/run/schedulers/agent.py``, on every
node), ``pyxisstep`` (``srun --container-image``, from the run's squashfs that ``imagestep`` imports once
per node and holds for the run; ``enroot``: what that step runs, as text) and ``apptainerstep``
(``apptainer exec`` of a SIF built once per run; ``apptainer`` renders it); beside each of these two,
``samplerstep``: the telemetry sampler as a job step of its own on each host. ``detached``: the whole run
as one batch script (``repro up --detach``); ``jobfiles``: what that job wrote into the run directory, read
back for ``repro status`` and, once the job is over, for ``repro report`` to adopt.

Node names come from Slurm, ranks from ``SLURM_NODEID``: the launchers render per node exactly as over SSH.
Preflight under Slurm runs preflight's own probe script as one job step on the allocated nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.events import Event
from repro.images import ImagesOptions
from repro.nodes.preflight import NodeReport
from repro.run.cell import CellJob, NodeResult
from repro.run.schedulers import SCHEDULERS
from repro.run.schedulers.base import Scheduler
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.apptainerstep import ApptainerStep
from repro.run.schedulers.slurm.commands import SchedulerStopped
from repro.run.schedulers.slurm.detached import Detach, check_container, render_detached, submit, write_job
from repro.run.schedulers.slurm.dockerstep import AgentStep
from repro.run.schedulers.slurm.jobfiles import (IMAGE, RECORD, JobView, copy_telemetry, drop_inputs,
                                                 image_failure, is_detached, job_envs, job_facts,
                                                 probe_output, pyxis_image, rank_outcomes, read_job,
                                                 seconds_of, slurm_state)
from repro.run.schedulers.slurm.imagestep import RunImage
from repro.run.schedulers.slurm.pyxisstep import PyxisStep
from repro.run.schedulers.slurm.render import (AGENT, pyxis_head, pyxis_step, render_plan_slurm, render_pyxis,
                                               render_sbatch, srun_argv, step_spec)
from repro.run.schedulers.slurm.steps import CellStep, PreflightStep, task_exits
from repro.spec.hosts import Hosts, Node, placeholder_hosts
from repro.spec.manifest import Cell, Manifest
from repro.spec.scheduler import seconds

#: the cell step of each ``container:`` setting
CELL_STEPS: dict[str, type[CellStep]] = {"docker": AgentStep, "pyxis": PyxisStep, "apptainer": ApptainerStep}

__all__ = ["AGENT", "CELL_STEPS", "SchedulerStopped", "SlurmScheduler", "pyxis_head", "pyxis_step",
           "render_pyxis", "render_sbatch", "seconds", "srun_argv", "step_spec", "task_exits",
           # a detached job's files, read back by repro.up
           "IMAGE", "RECORD", "JobView", "copy_telemetry", "drop_inputs", "image_failure", "is_detached",
           "job_envs", "job_facts", "probe_output", "pyxis_image", "rank_outcomes", "read_job", "seconds_of"]


@SCHEDULERS.register("slurm")
class SlurmScheduler(Scheduler):
    allocates = True

    def __init__(self, config: Mapping[str, str], manifest: Manifest, cells: Sequence[Cell], hosts: Hosts,
                 progress: Callable[[Event], None] | None = None) -> None:
        super().__init__(config, manifest, cells, hosts, progress)
        self.allocation = Allocation(config, manifest, cells, hosts, self.progress)
        self.allocation.run_image = RunImage(self.allocation)
        self.cfg = dict(self.allocation.cfg)

    @property
    def job(self) -> str | None:
        return self.allocation.job

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.allocation.steps

    @property
    def engines(self) -> bool:
        """Whether the nodes' Docker engines run the containers (not under pyxis: enroot does, from the
        registry)."""
        return self.allocation.container == "docker"

    def image_options(self, options: ImagesOptions) -> ImagesOptions:
        """Under pyxis an mpi target's ranks start through Slurm's PMI: its image needs no sshd layer."""
        if self.allocation.container == "pyxis" and self.manifest is not None \
                and self.manifest.launch.kind == "mpi":
            return dataclasses.replace(options, build=dataclasses.replace(options.build, sshd=False))
        return options

    def check(self, need: int, *, preflight: bool = False) -> None:
        self.allocation.check(need, preflight=preflight)

    def open(self, need: int, *, preflight: bool = False) -> Hosts:
        return self.allocation.open(need, preflight=preflight)

    def facts(self) -> dict[str, Any]:
        facts = self.allocation.facts()
        if self.allocation.run_image.facts:
            facts["image"] = self.allocation.run_image.facts
        return facts

    def close(self, interrupted: bool = False) -> None:
        try:
            CELL_STEPS[self.allocation.container].release(self.allocation)
        finally:
            self.allocation.close(interrupted)

    def preflight(self, nodes: Sequence[Node], *, dataset: Any = None, timeout: float = 120,
                  **_: Any) -> list[NodeReport]:
        """preflight's probe script as one job step on the allocated nodes: a report per node."""
        step = PreflightStep(self.allocation, nodes, dataset)
        step.run(timeout)
        return step.reports(self.engines)

    def launch_cell(self, job: CellJob) -> list[NodeResult]:
        return CELL_STEPS[self.allocation.container].launch(self.allocation, job)

    def check_detach(self) -> None:
        """A container runtime the detached script renders; ``check`` says the rest."""
        check_container(self.cfg.get("container", "docker"), self.allocation.where("container"))

    def detach(self, run: Path, image: str, *, repeats: int | None = None, fail_fast: bool = False) -> str:
        """The whole run as one batch script (``detached``), its inputs into ``run/job/``, submitted."""
        d = Detach(self.manifest, self.cells, self.inventory, self.settings(), image, run.name, repeats,
                   fail_fast)
        script = render_detached(d)
        return submit(run, d, write_job(run, d, script))

    def settings(self) -> dict[str, str]:
        return {k: v for k, v in self.cfg.items() if not k.startswith("_")}

    @classmethod
    def detached_script(cls, cfg: Mapping[str, str], manifest: Manifest, hosts: Hosts, cells: Sequence[Cell],
                        image: str, repeats: int | None = None) -> str:
        return render_detached(Detach(manifest, cells, hosts, cfg, image, repeats=repeats)).text

    @classmethod
    def job_state(cls, job_id: str) -> str | None:
        return slurm_state(job_id)

    @classmethod
    def runtime(cls, cfg: Mapping[str, Any]) -> str:
        return str(cfg.get("container", "docker"))

    @classmethod
    def plan_text(cls, cfg: Mapping[str, str], manifest: Manifest, hosts: Hosts,
                  cells: Sequence[Cell]) -> tuple[Hosts, str]:
        """The allocation's script and each cell's job step; nodes Slurm has not allocated yet are
        stand-ins."""
        need = max(c.nodes for c in cells)
        stand_ins = len(hosts.nodes) < need or hosts.nodes[0].local
        if stand_ins:
            hosts = dataclasses.replace(hosts, nodes=placeholder_hosts(need).nodes)
        return hosts, render_plan_slurm(cfg, manifest, hosts, cells, stand_ins=stand_ins)
