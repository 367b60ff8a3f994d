"""Run the ``repro`` command line inside the test process.

``run_cli("plan", ...)`` answers what ``python -m repro plan ...`` run in ``cwd`` would, as a
``subprocess.CompletedProcess``: the exit status, stdout and stderr apart. A fresh interpreter a call
costs about a second of imports (pandas, scipy, matplotlib); click's ``CliRunner`` runs the same ``cli``
object in this process instead. What a real process would show is kept: an exception that escapes the
command is written to stderr as the interpreter's traceback with exit status 1, so that a test asserting
``"Traceback" not in stderr`` still catches one. The working directory and the environment (``env``, as
``subprocess.run`` takes it: the whole environment) hold only during the call, and a call that runs past
``timeout`` seconds raises ``subprocess.TimeoutExpired`` as ``subprocess.run`` would, rather than hang
the test run.

The entry points themselves (``python -m repro``, the ``repro`` script) and signals are tested in real
processes (tests/test_cli.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

from click.testing import CliRunner

from repro.cli import cli

ROOT = Path(__file__).resolve().parent.parent


class _PastTimeout(BaseException):
    """Raised by the alarm; a BaseException, so that neither the kit nor CliRunner takes it for its own."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def past(signum: int, frame: object) -> None:
        raise _PastTimeout

    old = signal.signal(signal.SIGALRM, past)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


#: what a command may set for its own process (``up`` ignores these once it is stopping): a process ends with
#: the command, this test process does not, and every process it starts afterwards would inherit an ignored
#: signal (a shell cannot trap one it was started ignoring)
_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    before = {s: signal.getsignal(s) for s in _STOPS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def run_cli(*args: str | Path, cwd: Path | str = ROOT, env: Mapping[str, str] | None = None,
            input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``repro ARGS`` in ``cwd`` (the checkout unless given), in this process."""
    argv = [str(a) for a in args]
    overrides: dict[str, str | None] | None = None
    if env is not None:  # the whole environment, as subprocess.run takes it: what it lacks is unset
        overrides = {k: None for k in os.environ if k not in env}
        overrides.update(env)
    try:
        with _alarm(timeout), contextlib.chdir(cwd), _signals_kept():
            res = CliRunner().invoke(cli, argv, input=input, env=overrides, prog_name="repro")
    except _PastTimeout:
        raise subprocess.TimeoutExpired(["repro", *argv], timeout) from None
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(["repro", *argv], res.exit_code, res.stdout, stderr)
