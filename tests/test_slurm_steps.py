"""What every Slurm job step shares: srun's labelled output split by rank (Demux), and the deadline and stop
(JobStep.run), here on a real process that writes srun's ``--label`` format (the Slurm integration tests run
the same classes under srun)."""

from __future__ import annotations

import sys
import time

from repro.run.schedulers.slurm.steps import Demux, JobStep


class Sink:
    def __init__(self) -> None:
        self.data = b""
        self.flushes = 0

    def write(self, data: bytes) -> None:
        self.data += data

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


def test_demux_routes_each_line() -> None:
    sinks = [Sink(), Sink()]
    marks: list[tuple[int, str, str]] = []
    d = Demux(sinks, per_node=2, control=lambda rank, word, rest: marks.append((rank, word, rest)))
    for line in ["0: first", "  3: fourth task, second node", "1: ##repro step 7.3 n1", "2: ##repro exited 0",
                 "0: slurmstepd: error: *** STEP 7.3 CANCELLED ***", "4: past the last node",
                 "srun: error: n2: task 3: Exited with exit code 1"]:
        d.feed(line)
    assert sinks[0].data == b"first\n" and sinks[1].data == b"fourth task, second node\n"
    assert d.tails == [["first"], ["fourth task, second node"]]
    assert d.step_id == "7.3" and marks == [(1, "exited", "0")]
    assert d.other == ["slurmstepd: error: *** STEP 7.3 CANCELLED ***", "4: past the last node",
                       "srun: error: n2: task 3: Exited with exit code 1"]
    assert [d.events.get_nowait() for _ in range(2)] == [("line", 0, "first"),
                                                         ("line", 1, "fourth task, second node")]
    assert d.events.empty()


def test_demux_without_control_keeps_marked_lines_as_output() -> None:
    sink = Sink()
    d = Demux([sink])
    d.feed("0: ##repro started 1.5")
    assert sink.data == b"##repro started 1.5\n" and d.step_id is None


class _Alloc:
    job = "0"
    steps: list[dict] = []


def test_a_step_past_its_deadline_is_stopped() -> None:
    sink = Sink()
    code = "import sys, time; print('0: up', flush=True); time.sleep(60)"
    step = JobStep(_Alloc(), [sys.executable, "-c", code], Demux([sink]))  # type: ignore[arg-type]
    t0 = time.monotonic()
    step.run(1.0)
    assert step.timed_out and time.monotonic() - t0 < 30
    assert step.proc is not None and step.proc.returncode == -15  # SIGTERM, as srun gets it
    assert sink.data == b"up\n"


def test_a_step_that_ends_keeps_its_own_exit_status() -> None:
    code = ("import sys; print('0: done'); print('srun: error: n1: task 0: Exited with exit code 3'); "
            "sys.exit(3)")
    step = JobStep(_Alloc(), [sys.executable, "-c", code], Demux([Sink()]))  # type: ignore[arg-type]
    step.run(30)
    assert not step.timed_out and step.proc is not None and step.proc.returncode == 3
    assert step.demux.other == ["srun: error: n1: task 0: Exited with exit code 3"]
