"""What the allocation and the job steps share: Slurm's client commands run with a bound, ``scontrol -o``
fields, times as the provenance writes them, and the stop Slurm's own end of a job causes."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from repro.errors import EnvironmentUnavailable, RunFailed

#: a line of srun --label output: the task number, then what the task wrote
LABELLED = re.compile(r"^\s*(\d+): ?(.*)$")
ENDED_BY_SLURM = ("TIMEOUT", "NODE_FAIL", "CANCELLED", "PREEMPTED", "DEADLINE", "BOOT_FAIL", "OUT_OF_MEMORY")


class SchedulerStopped(RunFailed):
    """Slurm ended the job (time limit, node failure, scancel): the run directory resumes."""


def cli(argv: Sequence[str], *, stdin: str | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """One of Slurm's client commands, its output captured; a missing or silent command is a clear error."""
    try:
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise EnvironmentUnavailable(f"{argv[0]} is not installed on this machine",
                                     hint="run repro where Slurm's client commands are (a login node)") from e
    except subprocess.TimeoutExpired as e:
        raise EnvironmentUnavailable(f"`{shlex.join(argv)}` did not answer in {timeout:.0f} s",
                                     hint="is slurmctld up? (scontrol ping)") from e


def fields(line: str) -> dict[str, str]:
    """``scontrol show -o`` output as a dict (values may hold spaces only in the last fields we do not
    read)."""
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def stamp(epoch: float | None = None) -> str:
    """An epoch (now by default) as the provenance writes times."""
    when = datetime.fromtimestamp(epoch if epoch is not None else time.time(), UTC)
    return when.isoformat(timespec="milliseconds")


class sigint_ignored:
    """Ctrl-C ignored while a step that is being stopped cleans up (where the main thread can say so)."""

    def __enter__(self) -> None:
        try:
            self.prev = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread
            self.prev = None

    def __exit__(self, *exc: object) -> None:
        if self.prev is not None:
            signal.signal(signal.SIGINT, self.prev)
