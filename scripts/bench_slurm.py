#!/usr/bin/env python3
"""Slurm back-end benchmarks on the test cluster (scripts/test-cluster up, with its Slurm).

For N runs of a trivial 2-node cell (tests/data/launch/echo.yaml, the cluster's base image):

1. Slurm's own latency: ``sbatch`` -> RUNNING for the allocation, and a bare 2-node job step
   (``srun --jobid J -N2 python3 -c 'print(time.time())'``: srun started -> task running);
2. the kit's cell under Slurm: srun started -> first container started (the agent's mark),
   and that minus the bare step's latency (what the kit adds beyond Slurm's own);
3. start skew across the two nodes (container starts, as the agents report them);
4. per-cell wall time, Slurm job step vs the SSH/engine launcher (repro.run.launch.launch_cell),
   alternated on the same nodes and image.

    SLURM_CONF=/tmp/repro-cluster/slurm/slurm.conf scripts/bench_slurm.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from repro.spec.hosts import load_hosts  # noqa: E402
from repro.images.engine import node_client  # noqa: E402
from repro.run.launch import launch_cell  # noqa: E402
from repro.spec.manifest import load_manifest  # noqa: E402
from repro.run.schedulers.slurm import SlurmScheduler  # noqa: E402


def stats(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f} s, min {min(xs):.3f}, max {max(xs):.3f} (n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cluster", type=Path, default=Path("/tmp/repro-cluster/cluster.json"))
    args = ap.parse_args()
    cluster = json.loads(args.cluster.read_text())
    os.environ.setdefault("SLURM_CONF", cluster["slurm_conf"])
    os.environ.setdefault("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
    image = f"{cluster['base_image']}@{cluster['base_digest']}"
    manifest = load_manifest(ROOT / "tests" / "data" / "launch" / "echo.yaml")
    cell = next(c for c in manifest.cells() if c.nodes == 2 and c.precision == "fp32")
    hosts = load_hosts(Path(cluster["hosts_file"]))
    clients = {n.name: node_client(n) for n in hosts.nodes}
    for c in clients.values():  # the image on both engines first: no pull is timed
        c.images.pull(image)

    sched = SlurmScheduler({"kind": "slurm", "partition": "debug", "time": "2:00:00"}, manifest, [cell],
                           hosts)
    t0 = time.monotonic()
    used = sched.open(2)
    alloc = time.monotonic() - t0
    bare, beyond, first, skews, slurm_cell, ssh_cell = [], [], [], [], [], []
    try:
        for i in range(args.runs):
            t = time.time()
            out = subprocess.run(["srun", f"--jobid={sched.job}", "-N2", "--ntasks-per-node=1", "--overlap",
                                  "python3", "-c", "import time; print(time.time())"],
                                 capture_output=True, text=True, check=True).stdout.split()
            bare.append(min(float(x) for x in out) - t)
            with tempfile.TemporaryDirectory() as d:
                t = time.monotonic()
                res = sched.launch_cell(manifest, cell, used, Path(d), run_id=f"bench-slurm-{i}", image=image)
                slurm_cell.append(time.monotonic() - t)
            step = sched.steps[-1]
            submitted = datetime.fromisoformat(step["submitted"]).timestamp()
            starts = [datetime.fromisoformat(r.started).timestamp() for r in res]
            first.append(min(starts) - submitted)
            beyond.append(first[-1] - bare[-1])
            skews.append(max(starts) - min(starts))
            with tempfile.TemporaryDirectory() as d:
                t = time.monotonic()
                launch_cell(manifest, cell, hosts, Path(d), run_id=f"bench-ssh-{i}", clients=clients,
                            image=image)
                ssh_cell.append(time.monotonic() - t)
    finally:
        sched.close()
        for c in clients.values():
            c.close()
    print(f"allocation (sbatch -> RUNNING, nodes known): {alloc:.3f} s")
    print(f"bare 2-node job step (srun -> task running):  {stats(bare)}")
    print(f"kit cell step (srun -> first container started): {stats(first)}")
    print(f"  beyond Slurm's own step latency:             {stats(beyond)}")
    print(f"start skew across 2 nodes:                     {stats(skews)}")
    print(f"per-cell wall time, Slurm step:                {stats(slurm_cell)}")
    print(f"per-cell wall time, SSH/engine launcher:       {stats(ssh_cell)}")


if __name__ == "__main__":
    main()
