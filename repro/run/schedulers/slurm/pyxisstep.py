"""``container: pyxis``: a cell's job step starts every rank in an enroot container made from the run's
squashfs (imported once per node for the run: ``imagestep``); pyxis creates a fresh container filesystem
for each step and removes it when the step ends, so there is none for the kit to remove."""

from __future__ import annotations


from repro.run.plan import plan_cell
from repro.run.cell import CellJob
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.commands import cli
from repro.run.schedulers.slurm.pmicheck import check_pmi, pmi_probe_argv, pmi_said
from repro.run.schedulers.slurm.render import pyxis_head, pyxis_step
from repro.run.schedulers.slurm.samplerstep import SamplerStep
from repro.run.schedulers.slurm.siteenv import clean_environ
from repro.run.schedulers.slurm.steps import TaskStep, step_site



class PyxisStep(TaskStep):
    """One cell as a pyxis job step: each task's labelled output goes to its node's log (``per_node``
    tasks a node under ``srun --mpi=pmix``); a task's exit status comes from srun's own report of it."""

    @staticmethod
    def release(alloc: Allocation) -> None:
        """The run's image off the nodes (the image step removes it), while the job still runs: once the job's
        other steps have ended (pyxis removes a step's container as the step ends, and a removal Slurm cut
        short is left to the image step's sweep, which must not run before it), and the sweep to its end (a
        step cancelled mid-removal leaves a 1 GB tree whose removal takes a minute on a loaded node)."""
        alloc.steps_ended(keep=alloc.run_image.step_id)
        alloc.run_image.release()
        alloc.steps_ended()  # the image step's sweep runs to its end before the job is cancelled

    @classmethod
    def make(cls, alloc: Allocation, job: CellJob) -> PyxisStep:
        manifest, cell = job.manifest, job.cell
        plans = plan_cell(manifest, cell, job.hosts)
        names = [p.command.node.name for p in plans]
        job.log_dir.mkdir(parents=True, exist_ok=True)
        conf_path = job.log_dir / "multi-prog.conf"
        # cells/KEY/rN in the run directory: the run's image step logs beside the cells
        squashfs = alloc.run_image.path(str(job.image or plans[0].image), [n.name for n in job.hosts.nodes],
                                        job.run_id, manifest.id, job.log_dir.parents[2])
        if manifest.launch.kind == "mpi":
            cls.pmi(alloc, names, squashfs)
        argv, env, conf = pyxis_step(manifest, cell, plans, squashfs,
                                     pyxis_head(str(alloc.job), names, f"repro-{cell.key}"), str(conf_path),
                                     mpi=alloc.cfg.get("mpi", "pmix"), image_env=alloc.run_image.env,
                                     site=step_site(alloc, job))
        return cls.from_argv(alloc, job, plans, argv, env, conf, conf_path, SamplerStep(alloc, job, names))

    @staticmethod
    def pmi(alloc: Allocation, names: list[str], squashfs: str) -> None:
        """Before an MPI cell's first step on nodes not yet asked: Slurm's PMI as a rank's container sees it
        (``pmicheck``), once a node for the run; RunFailed with the fix where a node lacks it."""
        done = alloc.extra.setdefault("pmi", {"mpi": alloc.cfg.get("mpi", "pmix"), "seen_on": []})
        new = [n for n in names if n not in done["seen_on"]]
        if not new:
            return
        out = cli(pmi_probe_argv(str(alloc.job), new, squashfs, done["mpi"], clean_environ(),
                                 alloc.run_image.env.get("PATH")), timeout=300)
        check_pmi(pmi_said(out.stdout.splitlines()), new, done["mpi"], " ".join(out.stderr.split())[-300:])
        done["seen_on"] += new
