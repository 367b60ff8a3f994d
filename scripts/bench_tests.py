#!/usr/bin/env python3
"""Time the unit lane: every test outside tests/integration, in one pytest process.

Target: the unit lane in <= 60 s of wall time on the project's machine kind (2 cores), measured here, not by a
timed test. A shared machine's wall time mostly measures its other load, so each run also gives its CPU time
(user + sys of pytest and every process it waited for) and the load average when it started;
the best of ``--repeat`` runs is the figure, the spread says how much the load moved it.

Usage: ``python3 scripts/bench_tests.py [--repeat 3] [--json OUT] [-- PYTEST ARGS...]`` (pytest arguments
after ``--`` replace the lane's paths, e.g. ``-- tests/test_plan.py`` to time one file; a failing run is
reported and the script exits 1).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the unit lane as the README runs it: two pytest-xdist workers, one a core
LANE = ["-n", "2", "tests", "--ignore=tests/integration"]


def run_once(paths: list[str]) -> dict:
    """One pytest run of ``paths``: wall and CPU seconds, the load average before it, the summary line."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
    load = os.getloadavg()[0]
    before = _children_cpu()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    wall = time.monotonic() - t0
    cpu = _children_cpu() - before
    summary = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|errors?)\b", ln)]
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_1min_before": round(load, 2),
            "returncode": proc.returncode, "summary": summary[-1].strip("= ") if summary else "",
            "tail": proc.stdout[-3000:] if proc.returncode else ""}


def _children_cpu() -> float:
    """User + sys seconds of every process this one has waited for (pytest, and what pytest waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of the lane (default 3)")
    ap.add_argument("--json", type=Path, help="write the runs and the best of them to this file")
    ap.add_argument("pytest_args", nargs="*", help="after --: what pytest runs instead of the unit lane")
    args = ap.parse_args(argv)
    paths = args.pytest_args or LANE
    runs = []
    for i in range(args.repeat):
        r = run_once(paths)
        runs.append(r)
        print(f"run {i + 1}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
              f"load {r['load_1min_before']:.2f} before; {r['summary']}", flush=True)
        if r["tail"]:
            print(r["tail"], flush=True)
    walls = [r["wall_s"] for r in runs]
    cpus = [r["cpu_s"] for r in runs]
    print(f"{' '.join(paths)}: best {min(walls):.1f} s wall (spread {min(walls):.1f}-{max(walls):.1f} s), "
          f"CPU {min(cpus):.1f}-{max(cpus):.1f} s, {os.cpu_count()} CPUs")
    if args.json:
        best = {"paths": paths, "runs": runs, "best_wall_s": min(walls)}
        args.json.write_text(json.dumps(best, indent=2) + "\n")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
