"""The runner the tf-ps launcher writes into each container: a parameter server beside a worker.

Real processes (the interpreter running small scripts), no TensorFlow: a parameter server never
ends on its own, so the pair must end it when the worker is done, and must not wait forever on a
worker whose parameter server died.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[1] / "repro" / "run" / "launchers" / "tf_ps_pair.py"
SERVE = "import time\nprint('ps up', flush=True)\nwhile True: time.sleep(0.1)"
#: a worker that ends only once the parameter server has made a file (the ps has printed by then)
WAIT_FOR = "import os, sys, time\nwhile not os.path.exists({!r}): time.sleep(0.01)\n"


def pair(ps: list[str], worker: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(RUNNER), str(len(ps)), *ps, *worker], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_workers_status_is_the_pairs_and_the_parameter_server_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "ps.pid"
    ps = [sys.executable, "-c", f"import os; print('ps up', flush=True); open({str(pid_file)!r} + '.part', 'w')"
                                f".write(str(os.getpid())); os.rename({str(pid_file)!r} + '.part', {str(pid_file)!r})"
                                "\nwhile True: __import__('time').sleep(0.1)"]
    worker = [sys.executable, "-c", f"{WAIT_FOR.format(str(pid_file))}print('worker done'); sys.exit(3)"]
    started = time.monotonic()
    proc = pair(ps, worker)
    assert proc.returncode == 3
    assert "ps up" in proc.stdout and "worker done" in proc.stdout
    assert time.monotonic() - started < 30
    pid = int(pid_file.read_text())
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False)
    assert state.stdout.strip() in ("", "Z"), "the parameter server was left running"


def test_a_parameter_server_that_dies_first_ends_the_worker() -> None:
    ps = [sys.executable, "-c", "import sys; sys.exit(5)"]
    worker = [sys.executable, "-c", SERVE]
    proc = pair(ps, worker)
    assert proc.returncode == 5
    assert "repro: the parameter server exited with status 5 before the worker" in proc.stderr


def test_the_parameter_server_sees_no_gpu_and_the_worker_keeps_its_own(tmp_path: Path) -> None:
    """The ps as the launcher renders it (``env CUDA_VISIBLE_DEVICES=`` before its command): the variable is
    empty for the ps process alone; the worker keeps the container's value."""
    from repro.run.launchers.tf_ps import PS_NO_GPU

    show = "import os, sys; print(sys.argv[1], repr(os.environ.get('CUDA_VISIBLE_DEVICES')), flush=True)"
    up = tmp_path / "ps-up"
    ps = [*PS_NO_GPU, sys.executable, "-c", f"{show}\nopen({str(up)!r}, 'w')\nimport time\nwhile True: time.sleep(0.1)",
          "ps"]
    worker = [sys.executable, "-c", WAIT_FOR.format(str(up)) + show, "worker"]
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0,1"}
    proc = subprocess.run([sys.executable, str(RUNNER), str(len(ps)), *ps, *worker], capture_output=True,
                          text=True, timeout=60, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["ps ''", "worker '0,1'"]
