"""The telemetry sampler's job step beside a pyxis or Apptainer cell (repro.run.schedulers.slurm.samplerstep):
its srun line as exact text, its labelled lines into each node's telemetry file, a node without python3 as a
warning, and its begin and end around the cell's own step on every way out. The steps run here as real
processes that write srun's ``--label`` format (tests/integration/test_pyxis_up.py runs them under srun)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from repro.nodes.telemetry import SAMPLER, node_file, parse_stream, sampler_argv
from repro.run.plan import plan_cell
from repro.run.sampling import TelemetryFiles
from repro.run.schedulers.slurm.render import sampler_srun
from repro.run.schedulers.slurm.samplerstep import SamplerLines, SamplerStep
from repro.run.schedulers.slurm.pyxisstep import PyxisStep
from repro.run.schedulers.slurm.steps import CellJob, TaskStep
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import find_target

#: what srun 22.05 printed on the test cluster for a job step whose nodes have no python3 on the PATH it gave
NO_PYTHON = ["1: slurmstepd-rc-node2: error: execve(): python3: No such file or directory",
             "srun: error: rc-node2: task 1: Exited with exit code 2"]


class _Alloc:
    job = "42"

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.events: list = []

    def progress(self, event) -> None:
        self.events.append(event)

    def export(self) -> str:
        return "--export=HOME,PATH,USER"


def job_of(tmp_path: Path, nodes: int = 2) -> CellJob:
    m = find_target("torch-rn50-cpu")
    cell = next(c for c in m.select() if c.nodes == nodes)
    hosts = Hosts((Node("rc-node1", "10.0.0.1", gpus=0), Node("rc-node2", "10.0.0.2", gpus=0)))
    return CellJob(m, cell, hosts, tmp_path / "r1", "RUN", timeout_s=300)


def test_the_sampler_step_is_one_host_task_per_node_without_container_options():
    argv = sampler_srun("42", ["n1", "n2"], "repro-2n1g-fp32-bs8-telemetry", 300)
    assert argv == ["srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2",
                    "--overlap", "--label", "--export=HOME,PATH,USER", "--job-name=repro-2n1g-fp32-bs8-telemetry", "--",
                    "python3", "-c", SAMPLER.read_text(encoding="utf-8"), "1000", str(4 << 20), "900"]
    assert argv[argv.index("--") + 1:] == sampler_argv(300)  # the same sampler as every other path


def test_each_tasks_lines_go_to_its_nodes_file_and_srun_s_own_lines_are_kept(tmp_path):
    files = TelemetryFiles(tmp_path)
    d = SamplerLines(files, ["rc-node1", "rc-node2"])
    for line in ["0: telemetry v1 interval_ms=1000 max_bytes=4194304", " 0: loadavg 1.0 0.5 0.4 0.3 1/2 3",
                 *NO_PYTHON, "2: past the last node"]:
        d.feed(line)
    files.close()
    assert node_file(tmp_path, "rc-node1").read_text() == ("telemetry v1 interval_ms=1000 max_bytes=4194304\n"
                                                           "loadavg 1.0 0.5 0.4 0.3 1/2 3\n")
    assert not node_file(tmp_path, "rc-node2").exists() and d.heard == {"rc-node1"}
    assert d.other == ["slurmstepd-rc-node2: error: execve(): python3: No such file or directory",
                       "srun: error: rc-node2: task 1: Exited with exit code 2", "2: past the last node"]
    assert d.events.empty()  # nothing follows the sampler's lines: no queue grows with them
    for i in range(30):
        d.feed(f"srun: line {i}")
    assert len(d.other) == 20 and d.other[-1] == "srun: line 29"


def fake_srun(interval_ms: int = 100) -> list[str]:
    """A process in srun's place: the real sampler as task 0 (each line labelled ``0: ``), task 1 a node
    without python3 (srun's real lines); SIGTERM ends the sampler and itself, as srun's stop does."""
    code = f"""
import signal, subprocess, sys
lines = {NO_PYTHON!r}
print(lines[0], flush=True)
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
def stop(*_):
    child.kill(); child.wait()
    print("srun: error: rc-node1: task 0: Killed", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print(lines[1], flush=True)
for line in child.stdout:
    print("0: " + line, end="", flush=True)
"""
    return [sys.executable, "-c", code, sys.executable, *sampler_argv(300, interval_ms)[1:]]


def test_the_step_samples_until_its_end_and_a_node_without_python3_is_a_warning(tmp_path):
    alloc = _Alloc()
    step = SamplerStep(alloc, job_of(tmp_path), ["rc-node1", "rc-node2"])  # type: ignore[arg-type]
    assert step.argv == sampler_srun("42", ["rc-node1", "rc-node2"], "repro-2n1g-fp32-bs8-telemetry", 300)
    step.argv = fake_srun()
    t0 = time.monotonic()
    step.begin()
    assert time.monotonic() - t0 < 15 and step.demux.heard == {"rc-node1"}  # rc-node2's task ended: no wait
    deadline = time.monotonic() + 30
    while step.files.sizes.get("rc-node1", 0) < 600 and time.monotonic() < deadline:  # a few samples
        time.sleep(0.01)
    assert [e.message for e in alloc.events] == [
        "no telemetry on rc-node2: the sampler (python3 on the node, outside the container) did not run: "
        "slurmstepd-rc-node2: error: execve(): python3: No such file or directory | "
        "srun: error: rc-node2: task 1: Exited with exit code 2"]
    step.end()
    assert step.proc is not None and step.proc.returncode == 143 and step.demux.done.is_set()
    stream = parse_stream("rc-node1", node_file(step.files.log_dir, "rc-node1").open())
    assert len(stream.load) >= 2 and len(stream.stat) >= 2
    summary = json.loads((step.files.log_dir / "telemetry.json").read_text())
    assert list(summary) == ["rc-node1"] and summary["rc-node1"]["cpu"]["samples"] == len(stream.load)
    assert len(alloc.events) == 1  # warned once
    rec = step.record()
    assert rec["sampled"] == ["rc-node1"] and rec["exit_code"] == 143


def test_a_step_that_never_began_ends_without_a_warning(tmp_path):
    alloc = _Alloc()
    step = SamplerStep(alloc, job_of(tmp_path), ["rc-node1", "rc-node2"])  # type: ignore[arg-type]
    step.end()
    assert alloc.events == [] and not (step.files.log_dir / "telemetry.json").exists()


class Recorder:
    """A sampler's step in the cell step's place: what the cell's srun was doing when it began and ended."""

    def __init__(self, cell: list) -> None:
        self.cell, self.calls = cell, []

    def begin(self) -> None:
        self.calls.append(("begin", self.cell[0].proc))

    def end(self) -> None:
        self.calls.append(("end", self.cell[0].proc.poll()))

    def record(self) -> dict:
        return {"sampled": []}


def task_step(tmp_path: Path, code: str) -> tuple[TaskStep, Recorder]:
    job = job_of(tmp_path, 1)
    plans = plan_cell(job.manifest, job.cell, job.hosts)
    holder: list = []
    rec = Recorder(holder)
    step = PyxisStep.from_argv(_Alloc(), job, plans, [sys.executable, "-c", code, "--ntasks-per-node=1"], {},  # type: ignore[arg-type]
                              None, tmp_path / "conf", rec)
    holder.append(step)
    return step, rec


def test_the_sampler_begins_before_the_cells_step_and_ends_after_it(tmp_path):
    step, rec = task_step(tmp_path, "print('0: ran')")
    step.run(30)
    assert rec.calls == [("begin", None), ("end", 0)]
    assert step.alloc.steps[0]["telemetry"] == {"sampled": []}


def test_the_sampler_ends_when_the_cell_is_interrupted(tmp_path):
    step, rec = task_step(tmp_path, "import time; print('0: up', flush=True); time.sleep(60)")

    def interrupted(events):
        next(iter(events))
        raise KeyboardInterrupt

    step.follow = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        step.run(30)
    assert rec.calls[0] == ("begin", None) and rec.calls[1][0] == "end" and rec.calls[1][1] is not None
