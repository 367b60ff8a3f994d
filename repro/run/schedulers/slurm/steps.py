"""The job steps the kit starts in the allocation: one class per kind, all sharing how srun is started,
how its labelled output is split by rank (``Demux``) and how a step is bounded in time and stopped
(``JobStep.run``).

A kind of step says what srun runs (argv, stdin, environment), where each rank's lines go, what the
lines it marks ``##repro`` mean (``control``), what to do with each event as it comes (``follow``) and
what the step's end means (``outcome``). ``CellStep`` adds what every way of running a cell shares: one
result and one log per rank, the events passed on, the step recorded in the provenance, and the failure
raised. ``CELL_STEPS`` names the cell step of each ``container:`` setting.

``container: docker``: the step runs the agent (``repro/run/schedulers/agent.py``) on every node, which
creates that rank's container with the kit's labels, starts it attached and removes it on every way out.
MPI targets keep their own ``mpirun`` inside the allocation (the head container starts the other ranks
through the per-run sshd in each node's container): Slurm's PMI does not reach into containers the Docker
engine starts, and the images' Open MPI needs no Slurm support.

``container: pyxis``: srun starts every rank in an enroot container made from the run's squashfs, which one
step per run imports on every node and holds (``imagestep``, ``enroot``; ``render.pyxis_step``); MPI targets
use ``srun --mpi=pmix`` (or the ``mpi:`` setting) with one task per rank, as NVIDIA's recipes do. No engine on
the nodes.
"""

from __future__ import annotations

import abc
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, ClassVar

from repro.nodes.preflight import NodeReport, Probe, node_report, probe_script
from repro.run.cell import CellFailed, CellJob, LogSink, NodeResult
from repro.run.launchers.base import fill
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.commands import (ENDED_BY_SLURM, LABELLED, SchedulerStopped, sigint_ignored,
                                                 stamp)
from repro.run.schedulers.slurm.render import preflight_argv
from repro.run.schedulers.slurm.siteenv import StepSite, clean_environ, prelude_lines, with_prelude
from repro.spec.hosts import Node

MARK = "##repro "
TAIL = 20  # lines of each rank's output a failure shows
STOP_WAIT_S = 60  # how long a stopped step's srun gets to end before it is killed
TASK_EXIT = re.compile(r"^srun: error: (\S+): tasks? ([0-9,-]+): Exited with exit code ([0-9]{1,6})$",
                       re.ASCII)

StepEvent = tuple[str, int, str]  # (kind, rank, text): line, started, exited, error


def task_exits(lines: Sequence[str], nodes: Sequence[str]) -> dict[str, int]:
    """The non-zero exit statuses srun reports for a step's tasks, by node (the highest of a node's tasks)."""
    out: dict[str, int] = {}
    for line in lines:
        m = TASK_EXIT.match(line.strip())
        if m and m.group(1) in nodes:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(3)))
    return out


class Demux:
    """srun's merged ``--label`` output split by rank: a task's lines go to its rank's sink (task number
    // ``per_node``) and become ``line`` events; lines marked ``##repro`` go to ``control`` where the step
    has one (``step JOB.STEP`` sets ``step_id``); srun's and slurmstepd's own lines go to ``other``."""

    def __init__(self, sinks: Sequence[LogSink], *, per_node: int = 1,
                 control: Callable[[int, str, str], None] | None = None) -> None:
        self.sinks, self.per_node, self.control = list(sinks), per_node, control
        self.events: queue.Queue[StepEvent] = queue.Queue()
        self.other: list[str] = []
        self.tails: list[list[str]] = [[] for _ in self.sinks]
        self.step_id: str | None = None
        self.done = threading.Event()  # the output ended

    def read(self, stream: IO[bytes]) -> None:
        try:
            for raw in stream:
                self.feed(raw.decode("utf-8", "replace").rstrip("\n"))
        finally:
            self.done.set()

    def feed(self, line: str) -> None:
        m = LABELLED.match(line)
        if not m or int(m.group(1)) // self.per_node >= len(self.sinks):
            self.other.append(line)
            return
        rank, text = int(m.group(1)) // self.per_node, m.group(2)
        if text.startswith("slurmstepd"):  # Slurm's own word about the step, not the rank's output
            self.other.append(text)
        elif self.control is not None and text.startswith(MARK):
            word, _, rest = text[len(MARK):].partition(" ")
            if word == "step":
                self.step_id = rest.split()[0]
            else:
                self.control(rank, word, rest)
        else:
            self.sinks[rank].write((text + "\n").encode())
            self.sinks[rank].flush()
            self.tails[rank] = (self.tails[rank] + [text])[-TAIL:]
            self.events.put(("line", rank, text))


class JobStep:
    """One srun job step of the allocation, started in its own session with its output demultiplexed,
    followed until it ends or its time is up, then stopped: nothing of it keeps running on any way out."""

    def __init__(self, alloc: Allocation, argv: Sequence[str], demux: Demux, *, stdin: bytes | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.alloc, self.argv, self.demux, self.stdin, self.env = alloc, list(argv), demux, stdin, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader: threading.Thread | None = None
        self.submitted = time.time()
        self.timed_out = False

    def start(self) -> None:
        self.submitted = time.time()
        # srun passes on only what each step's --export names; pyxis's own options never come from here
        self.proc = subprocess.Popen(self.argv, env={**clean_environ(), **(self.env or {})},
                                     stdin=subprocess.DEVNULL if self.stdin is None else subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=self.demux.read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()
        if self.stdin is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(self.stdin)
            self.proc.stdin.close()

    def run(self, timeout_s: float) -> None:
        """Start, follow the events until the step ends or ``timeout_s`` passes (``timed_out``), stop."""
        stopped = False
        try:
            self.start()
            self.follow(self.events(time.monotonic() + timeout_s))
            if self.demux.done.is_set():  # srun's output ended: srun is on its way out, with its own status
                try:
                    self.proc.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
            self.stop()
            stopped = True
            assert self.reader is not None
            self.reader.join(60)
        except BaseException:
            if not stopped and self.proc is not None:
                with sigint_ignored():
                    self.stop()
                    assert self.reader is not None
                    self.reader.join(30)
                    self.abandoned()
            raise
        finally:
            self.finish()

    def events(self, deadline: float) -> Iterator[StepEvent]:
        """The demultiplexer's events as they come, until the step ended and all are taken, or the
        deadline passed."""
        while not self.ended() or not self.demux.events.empty():
            if time.monotonic() > deadline:
                self.timed_out = True
                return
            try:
                yield self.demux.events.get(timeout=0.5)
            except queue.Empty:
                continue

    def ended(self) -> bool:
        """Whether the step is over for the kit (by default: srun's output ended)."""
        return self.demux.done.is_set()

    def follow(self, events: Iterator[StepEvent]) -> None:
        """What the step does with each event (by default: nothing but wait for the end)."""
        for _ in events:
            pass

    def stop(self) -> None:
        """End a step that still runs: ``interrupt``, then ``kill`` if srun is still there after a minute."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return
        self.interrupt()
        try:
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(STOP_WAIT_S)

    def interrupt(self) -> None:
        assert self.proc is not None
        self.proc.terminate()  # srun passes it on to the step's tasks

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()

    def abandoned(self) -> None:
        """After a step stopped by an interruption (Ctrl-C, a signal): what else must not stay behind."""

    def finish(self) -> None:
        """On every way out of ``run``."""


class LineSink:
    """A rank's lines kept in memory (the preflight step's reports are read from them)."""

    def __init__(self, clock_line: int = 2) -> None:
        self.lines: list[str] = []
        self.clock_line = clock_line
        self.arrival: float | None = None  # when the node's clock line (by default the second) came

    def write(self, data: bytes) -> None:
        self.lines.append(data.decode().rstrip("\n"))
        if len(self.lines) == self.clock_line:
            self.arrival = time.time()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class PreflightStep(JobStep):
    """preflight's probe script (the one it runs over SSH) as one job step on the allocated nodes, one task
    per node with the script on stdin; a report per node, as over SSH (a node the step did not reach gets a
    row saying why)."""

    def __init__(self, alloc: Allocation, nodes: Sequence[Node], dataset: Any = None) -> None:
        self.nodes, self.dataset = list(nodes), dataset
        names = [n.name for n in nodes]
        script = probe_script(Node(names[0], names[0]), dataset)  # docker_host None: each node's own engine
        self.enroot = alloc.container == "pyxis"
        self.tasks = [LineSink(3 if self.enroot else 2) for _ in names]
        super().__init__(alloc, preflight_argv(str(alloc.job), names, self.enroot, alloc.export()),
                         Demux(self.tasks), stdin=script.encode())

    def reports(self, engines: bool) -> list[NodeReport]:
        assert self.proc is not None
        by_node = {t.lines[0]: t for t in self.tasks if t.lines}
        skip = 2 if self.enroot else 1  # the node's name (and under pyxis its enroot version), then the probe
        why = " ".join(" | ".join(self.demux.other[-3:]).split())[:300] or \
            f"srun exit status {self.proc.returncode}"
        out = []
        for n in self.nodes:
            if n.name not in by_node:
                reason = f"the preflight job step of Slurm job {self.alloc.job} did not run on it: {why}"
                out.append(NodeReport(n.name, n.address, Probe(reason=reason)))
                continue
            task = by_node[n.name]
            report = node_report(n, "\n".join(task.lines[skip:]) + "\n", Probe(detail="srun"),
                                 task.arrival, f"exit {self.proc.returncode}", self.dataset)
            # under pyxis, enroot runs the containers: the node needs no Docker engine, but enroot
            out.append(report if engines else replace(report, docker=enroot_probe(task.lines[1:2])))
        return out


def enroot_probe(lines: Sequence[str]) -> Probe:
    """The node's enroot as preflight's step under pyxis said it (``enroot VERSION`` or ``enroot -``)."""
    version = lines[0].partition(" ")[2].strip() if lines and lines[0].startswith("enroot ") else "-"
    if version == "-":
        return Probe(reason="no enroot on the PATH srun gives job steps (pyxis needs it on every node)")
    return Probe("pyxis", detail=f"enroot {version}")


class CellStep(JobStep, abc.ABC):
    """One repeat of a cell as a job step: a result and a log sink per rank, each rank's lines passed on as
    events, the step recorded in the allocation's facts, a failure raised as CellFailed (SchedulerStopped
    where Slurm ended the job). A kind of cell step gives ``make`` and ``outcome``; ``marks``: its ranks'
    ``##repro`` lines are the kit's (``control``), not the rank's output."""

    marks: ClassVar[bool] = False

    def __init__(self, alloc: Allocation, job: CellJob, results: list[NodeResult], argv: Sequence[str], *,
                 per_node: int = 1, stdin: bytes | None = None, env: Mapping[str, str] | None = None) -> None:
        self.job, self.results = job, results
        job.log_dir.mkdir(parents=True, exist_ok=True)
        self.sinks = [job.sink(r.rank, r.node) for r in results]
        for r, sink in zip(results, self.sinks):
            r.log = str(sink.path)
        demux = Demux(self.sinks, per_node=per_node, control=self.control if self.marks else None)
        super().__init__(alloc, argv, demux, stdin=stdin, env=env)

    @classmethod
    def launch(cls, alloc: Allocation, job: CellJob) -> list[NodeResult]:
        step = cls.make(alloc, job)
        step.run(job.timeout)
        return step.outcome()

    @classmethod
    @abc.abstractmethod
    def make(cls, alloc: Allocation, job: CellJob) -> CellStep:
        """The step of ``job``'s cell in ``alloc``: its argv, its results and their log sinks."""

    @abc.abstractmethod
    def outcome(self) -> list[NodeResult]:
        """The results once the step ended; raise CellFailed (or SchedulerStopped) where it failed."""

    def control(self, rank: int, word: str, rest: str) -> None:
        """A ``##repro WORD REST`` line of rank ``rank`` (only where ``marks``)."""

    @staticmethod
    def release(alloc: Allocation) -> None:
        """Before the allocation is released, on every path out: what the kind made for the whole run."""

    @abc.abstractmethod
    def record(self) -> dict[str, Any]:
        """What the provenance records of the step."""

    def finish(self) -> None:
        for s in self.sinks:
            s.close()
        if self.demux.other:  # srun's and slurmstepd's own lines (pyxis's errors among them), for the user
            (self.job.log_dir / "srun-output.txt").write_text("\n".join(self.demux.other) + "\n",
                                                              encoding="utf-8")
        ended = stamp()
        for r, tail in zip(self.results, self.demux.tails):
            r.ended = r.ended or ended
            r.tail = tail
        self.alloc.steps.append(self.record())

    def timeout_error(self) -> str:
        return f"timed out after {self.job.timeout:.0f} s"

    def ended_by_slurm(self, state: str) -> None:
        """Raise SchedulerStopped where Slurm ended the job: the run directory resumes in a new allocation."""
        if state in ENDED_BY_SLURM:
            raise SchedulerStopped(f"Slurm ended job {self.alloc.job} ({state}) while cell "
                                   f"{self.job.cell.key} ran",
                                   hint="repro up --resume RUN_DIR runs what is not done in a new allocation")


def step_site(alloc: Allocation, job: CellJob) -> StepSite:
    """What a cell step takes from where it starts: this process's environment (no ``PYXIS_*``), the
    settings, each node's GPUs (the inventory's, else the cell's) and the fewest CPUs of its nodes."""
    names = [n.name for n in job.hosts.nodes[:job.cell.nodes]]
    cpus = [alloc.cpus[n] for n in names if n in alloc.cpus]
    return StepSite(clean_environ(), alloc.cfg, job.hosts.gpus or job.cell.gpus_per_node,
                    min(cpus) if cpus else None)


class TaskStep(CellStep):
    """A cell whose ranks are srun's own tasks in a container runtime (pyxis, Apptainer): every rank starts
    with the step, its lines come labelled with its task, and its exit status from srun's report of it.
    ``sampler``: the telemetry sampler's own job step on the same nodes (``samplerstep``), begun just before
    the cell's step and ended after it on every way out."""

    sampler: Any = None

    @classmethod
    def from_argv(cls, alloc: Allocation, job: CellJob, plans: Sequence[Any], argv: list[str],
                  env: Mapping[str, str], conf: str | None, conf_path: Path, sampler: Any = None) -> TaskStep:
        """The step of a rendered srun line: its --multi-prog file written, a result per rank (an MPI
        target's ranks all run rank 0's program), the sampler's step beside it."""
        if conf is not None:
            conf_path.write_text(conf, encoding="utf-8")
        per_node = int(next(a for a in argv if a.startswith("--ntasks-per-node=")).partition("=")[2])
        manifest, cell = job.manifest, job.cell
        mpi = manifest.launch.kind == "mpi"
        nodes = [p.command.node for p in plans]
        program = tuple(fill(manifest.launch.command, manifest.launch, cell, nodes, 0)) if mpi else ()
        results = [NodeResult(n.name, n.address, i, "mpi-rank" if mpi else p.command.role,
                              program or p.command.command, "") for i, (n, p) in enumerate(zip(nodes, plans))]
        # the site's prelude (hosts file) runs before srun, as in the batch script of a detached run
        argv = with_prelude(prelude_lines(job.hosts), argv)
        step = cls(alloc, job, results, argv, per_node=per_node, env=env)
        step.sampler = sampler
        return step

    def start(self) -> None:
        if self.sampler is not None:
            self.sampler.begin()
        super().start()
        started = stamp()
        for r in self.results:
            r.started = started
            self.job.emit(("started", r.node, started))

    def follow(self, events: Any) -> None:
        for kind, rank, text in events:
            self.job.emit((kind, self.results[rank].node, text))

    def finish(self) -> None:
        try:
            if self.sampler is not None:
                self.sampler.end()
        finally:
            super().finish()

    def record(self) -> dict[str, Any]:
        return {"cell": self.job.cell.key, "srun": self.argv, "env": sorted(self.env or {}),
                "submitted": stamp(self.submitted), "exit_code": self.proc.returncode if self.proc else None,
                "started": {r.node: r.started for r in self.results},
                **({"telemetry": self.sampler.record()} if self.sampler is not None else {})}

    def outcome(self) -> list[NodeResult]:
        codes = task_exits(self.demux.other, [r.node for r in self.results])
        for r in self.results:
            r.exit_code = codes.get(r.node, 0 if self.proc.returncode == 0 else None)
            if self.timed_out:
                r.error = self.timeout_error()
            elif r.exit_code is None:
                r.error = "the job step ended without the task's exit: " + " | ".join(self.demux.other[-3:])
            self.job.emit(("exited", r.node, str(r.exit_code)))
        if not all(r.ok for r in self.results):
            self.ended_by_slurm(self.alloc.job_state())
            raise CellFailed(self.job.cell, self.results)
        return self.results
