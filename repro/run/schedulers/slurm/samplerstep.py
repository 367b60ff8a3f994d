"""The telemetry sampler beside a pyxis or Apptainer cell: a job step of its own in the run's allocation, one
task per node of the cell, started just before the cell's step and stopped when it ends, on every way out
(the end, a failure, the deadline, Ctrl-C: ``steps.TaskStep`` begins and ends it).

Its tasks run the sampler (repro/nodes/sampler.py) on each host itself, outside any container
(``render.sampler_srun``): the node's own nvidia-smi and /proc. Each task's lines go, bounded, to the node's
``telemetry-<node>.txt`` of the repeat and what they say to ``telemetry.json`` (``TelemetryFiles``, as the
agent's lines under ``container: docker``). Telemetry never fails a cell: a node whose sampler does not run
(no python3 on the PATH a job step gets there) is a warning, and the cell runs without its telemetry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from repro.events import Event
from repro.nodes.telemetry import shown_sampler
from repro.run.sampling import TelemetryFiles
from repro.run.cell import CellJob
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.commands import LABELLED, sigint_ignored, stamp
from repro.run.schedulers.slurm.render import sampler_srun
from repro.run.schedulers.slurm.steps import Demux, JobStep, task_exits

READY_S = 20  # how long a cell's step waits for every node's sampler to say its first line
KEEP = 20  # srun's and slurmstepd's own lines kept, for a warning


class SamplerLines(Demux):
    """srun's labelled output of the sampler's step: each task's lines into its node's telemetry file (no
    events: nothing follows them), srun's and slurmstepd's own lines, the last few, into ``other``."""

    def __init__(self, files: TelemetryFiles, nodes: Sequence[str]) -> None:
        super().__init__([])
        self.files, self.nodes = files, list(nodes)
        self.heard: set[str] = set()

    def feed(self, line: str) -> None:
        m = LABELLED.match(line)
        ours = m is not None and int(m.group(1)) < len(self.nodes)
        if m and ours and not m.group(2).startswith("slurmstepd"):
            node = self.nodes[int(m.group(1))]
            self.heard.add(node)
            self.files.write(node, m.group(2))
        else:  # srun's own line, or slurmstepd's about a task (without the task's label, as Demux keeps it)
            self.other = [*self.other, m.group(2) if m and ours else line][-KEEP:]


class SamplerStep(JobStep):
    """The sampler's job step of one repeat of a cell on ``nodes``; ``begin`` and ``end`` never raise."""

    demux: SamplerLines

    def __init__(self, alloc: Allocation, job: CellJob, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self.files = TelemetryFiles(job.log_dir)
        self.warned: set[str] = set()
        self.begun = False
        argv = sampler_srun(str(alloc.job), self.nodes, f"repro-{job.cell.key}-telemetry", job.timeout,
                            export=alloc.export())
        super().__init__(alloc, argv, SamplerLines(self.files, self.nodes))

    def begin(self, ready_s: float = READY_S) -> None:
        """Start the step and wait until every node's sampler has said its first line (or its task ended, or
        ``ready_s`` passed), so that the samples begin before the cell does."""
        self.begun = True
        try:
            self.start()
        except OSError as e:
            self.proc = None
            self.warn(self.nodes, f"its job step did not start: {e}")
            return
        deadline = time.monotonic() + ready_s
        while self.waiting() and not self.demux.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        failed = task_exits(self.demux.other, self.nodes)
        self.warn([n for n in self.nodes if n in failed and n not in self.demux.heard], self.said())

    def waiting(self) -> list[str]:
        """The nodes whose sampler has said nothing yet and whose task has not ended."""
        ended = task_exits(self.demux.other, self.nodes)
        return [n for n in self.nodes if n not in self.demux.heard and n not in ended]

    def end(self) -> None:
        """Stop the step (srun passes the stop on to every task), take the rest of its output, close the
        files and write the repeat's summary; a warning for each node that sent nothing."""
        if not self.begun:
            return
        if self.proc is not None:
            try:
                with sigint_ignored():
                    self.stop()
                    if self.reader is not None:
                        self.reader.join(10)
            except Exception as e:  # noqa: BLE001 - telemetry is evidence, never a reason to stop a run
                self.warn(self.nodes, f"its job step could not be stopped: {e}")
        self.files.close()
        self.warn([n for n in self.nodes if n not in self.demux.heard], self.said())

    def said(self) -> str:
        return " | ".join(self.demux.other[-3:]) or "no output"

    def warn(self, nodes: Sequence[str], why: str) -> None:
        new = [n for n in nodes if n not in self.warned]
        if new:
            self.warned.update(new)
            self.alloc.progress(Event("warn", f"no telemetry on {', '.join(new)}: the sampler (python3 on "
                                              f"the node, outside the container) did not run: {why}"))

    def record(self) -> dict[str, Any]:
        """What the provenance records of the step (the sampler's source by its file's name)."""
        return {"srun": shown_sampler(self.argv),
                "submitted": stamp(self.submitted), "sampled": sorted(self.demux.heard),
                "exit_code": self.proc.returncode if self.proc is not None else None}
