#!/usr/bin/env python3
"""Run the container- and job-lifecycle integration tests several times in a row, outside CI.

A flaky test is a defect: this script is how one is found before CI finds it. Each round is a pytest
process of its own over the same files on the running test cluster (``REPRO_KEEP_CLUSTER=1
scripts/test-cluster up``); every round runs to its end, and the script exits 1 if any round failed.

    python3 scripts/soak_lifecycle.py [--rounds 5] [-k EXPR] [FILE ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what starts, kills, resumes and removes containers and Slurm jobs: every test of `repro clean`, and the
#: tests of launch, up and Slurm that stop a cell from outside (kill -9, Ctrl-C, a deadline, a failing rank,
#: a time limit) and then list, remove or resume what is left
LIFECYCLE = ["tests/integration/test_clean_cluster.py",
             "tests/integration/test_launch.py::test_failure_on_one_node_stops_the_cell_everywhere",
             "tests/integration/test_launch.py::test_deadline_stops_the_cell",
             "tests/integration/test_launch.py::test_container_killed_mid_cell",
             "tests/integration/test_launch.py::test_ctrl_c_removes_every_container_and_keeps_logs",
             "tests/integration/test_up.py::test_interrupted_run_leaves_no_container_and_resume_runs_exactly_the_rest",
             "tests/integration/test_up.py::test_a_repeat_whose_container_is_killed_is_retried",
             "tests/integration/test_slurm_cluster.py::test_time_limit_kill_is_recorded_and_resumes",
             "tests/integration/test_slurm_cluster.py::test_mpi_ctrl_c_or_kill_cancels_the_job_and_resumes"]
_SUMMARY = re.compile(r"^=+ (.*) in [0-9.]+s", re.M)


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("files", nargs="*", default=LIFECYCLE)
    args = ap.parse_args()
    env = {**os.environ, "REPRO_REQUIRE": os.environ.get("REPRO_REQUIRE", "docker,ssh,slurm,pyxis")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.files]
    if args.k:
        cmd += ["-k", args.k]
    failed = 0
    for i in range(1, args.rounds + 1):
        before, t0 = load(), time.monotonic()
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        found = _SUMMARY.findall(out.stdout)
        print(f"round {i}: exit {out.returncode}, {wall:.0f} s wall, load {before} before; "
              f"{found[-1] if found else 'no summary'}", flush=True)
        if out.returncode != 0:
            failed += 1
            print("\n".join(out.stdout.splitlines()[-40:]), flush=True)
    print(f"{args.rounds - failed} of {args.rounds} rounds green ({len(args.files)} files or tests)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
