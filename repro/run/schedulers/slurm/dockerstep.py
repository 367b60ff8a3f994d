"""``container: docker``: a cell's job step runs the agent on every node, which creates, starts and removes
that rank's container through the node's Docker engine."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import docker

from repro.layout import log_name
from repro.run.cell import CellFailed, CellJob, NodeResult, mpi_files
from repro.run.launchers.mpi import DEFAULT_SSH_PORT
from repro.nodes.telemetry import sampler_argv
from repro.run.plan import plan_cell
from repro.run.sampling import TelemetryFiles
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.commands import cli, stamp
from repro.run.schedulers.slurm.render import srun_argv, step_spec
from repro.run.schedulers.slurm.steps import CellStep, StepEvent


class AgentStep(CellStep):
    """One cell as a job step of the agent, once per node with the step's spec on stdin. The agent marks
    its lines ``##repro`` (the step's id, a rank's start, exit and error); a decisive rank's failure ends
    the step; a stop reaches the agents as SIGTERM (they remove their containers); after a failure the
    nodes are swept of this run's containers."""

    marks = True

    def __init__(self, alloc: Allocation, job: CellJob, results: list[NodeResult],
                 spec: dict[str, Any]) -> None:
        argv = srun_argv(str(alloc.job), [r.node for r in results], f"repro-{job.cell.key}", alloc.export())
        super().__init__(alloc, job, results, argv, stdin=json.dumps(spec).encode())
        self.decisive = {r.rank for r in results if r.role != "mpi-sshd"}
        self.telemetry = TelemetryFiles(job.log_dir)

    @classmethod
    def make(cls, alloc: Allocation, job: CellJob) -> AgentStep:
        manifest = job.manifest
        plans = plan_cell(manifest, job.cell, job.hosts)
        mpi = manifest.launch.kind == "mpi"
        port = int(manifest.launch.mpi.get("ssh_port", DEFAULT_SSH_PORT)) if mpi else None
        files = mpi_files(plans, port) if port else {}
        spec = step_spec(plans, job.run_id, job.cell, job.image or plans[0].image, files, port)
        spec["telemetry"] = sampler_argv(job.timeout)  # each agent samples its node beside its rank
        results = [NodeResult(c.node.name, c.node.address, c.rank, c.role, c.command,
                              str(job.log_dir / log_name(c.rank, c.node.name)), container=rank["name"])
                   for c, rank in zip((p.command for p in plans), spec["ranks"])]
        return cls(alloc, job, results, spec)

    def control(self, rank: int, word: str, rest: str) -> None:
        r = self.results[rank]
        if word == "telemetry":
            self.telemetry.write(r.node, rest)
        elif word == "started":
            r.started = stamp(float(rest))
            self.demux.events.put(("started", rank, r.started))
        elif word == "exited":
            if not rest.startswith("signal"):
                r.exit_code = int(rest)
            elif r.role == "mpi-sshd":
                r.exit_code = 0
            self.demux.events.put(("exited", rank, rest))
        elif word == "error":
            r.error = rest
            self.demux.events.put(("error", rank, rest))

    def finish(self) -> None:
        super().finish()
        self.telemetry.close()

    def ended(self) -> bool:
        return not self.decisive or super().ended()

    def follow(self, events: Iterator[StepEvent]) -> None:
        for kind, rank, text in events:
            self.job.emit((kind, self.results[rank].node, text))
            if kind == "error" or (kind == "exited" and text != "0"):
                break
            if kind == "exited":
                self.decisive.discard(rank)
        if self.timed_out:
            for r in self.results:
                if r.rank in self.decisive:
                    r.error = self.timeout_error()
        if not self.decisive and all(r.role != "mpi-sshd" for r in self.results):
            try:
                self.proc.wait(30)  # every rank exited: the agents finish their removal
            except subprocess.TimeoutExpired:
                pass

    def interrupt(self) -> None:
        """SIGTERM to the step's tasks (the agents remove their containers)."""
        if self.demux.step_id:
            cli(["scancel", "--signal=TERM", "--", self.demux.step_id])
        else:
            self.proc.send_signal(signal.SIGINT)

    def kill(self) -> None:
        cli(["scancel", "--", self.demux.step_id or str(self.alloc.job)])

    def abandoned(self) -> None:
        await_removal(self.job.clients, self.results)

    def record(self) -> dict[str, Any]:
        return {"cell": self.job.cell.key, "step": self.demux.step_id, "srun": self.argv[:-1] + ["<agent>"],
                "submitted": stamp(self.submitted), "exit_code": self.proc.returncode if self.proc else None,
                "started": {r.node: r.started for r in self.results}}

    def outcome(self) -> list[NodeResult]:
        results = self.results
        state = "RUNNING"
        if self.proc.returncode not in (0, None) or not all(r.ok for r in results):
            # a step killed from outside (no exit from a container): give slurmctld a moment to say why
            killed = any(r.exit_code is None and r.error is None for r in results)
            for _ in range(20 if killed else 1):
                state = self.alloc.job_state()
                if state != "RUNNING":
                    break
                time.sleep(0.5)
        await_removal(self.job.clients, results)
        self.ended_by_slurm(state)
        for r in results:
            if r.exit_code is None and r.error is None:
                r.error = ("the job step ended without the container's exit: "
                           + " | ".join(self.demux.other[-3:]))
        if not all(r.ok for r in results):
            self.sweep()
            raise CellFailed(self.job.cell, results)
        return results

    def sweep(self) -> None:
        """After a failed step: remove whatever container of this run a killed agent left (where the job
        still runs)."""
        if self.alloc.job_state() != "RUNNING":
            return
        argv = srun_argv(str(self.alloc.job), [r.node for r in self.results], "repro-sweep",
                         self.alloc.export())
        cli(argv, stdin=json.dumps({"sweep": self.job.run_id}), timeout=60)


def await_removal(clients: Mapping[str, Any] | None, results: Sequence[NodeResult],
                  wait_s: float = 30) -> None:
    """Where the kit reaches the nodes' engines: wait until the agents' removals are done (a killed agent's
    request still completes in the engine), and remove what is left after ``wait_s``."""
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
