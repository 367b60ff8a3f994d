#!/usr/bin/env python3
"""Image imports per node and wall time of a 2-cell x 3-repeat run under pyxis: once per run vs once per step.

On the test cluster (scripts/test-cluster up, with pyxis) or any Slurm cluster with pyxis/enroot, in one
allocation of 2 nodes, with plain srun job steps shaped like the ones ``repro up`` starts:

- once per run (what the kit does): one job step imports the image by digest on every node into a node-local
  squashfs (``enroot import``), then each of the 6 cell steps (2 cells x 3 repeats; cell 1 on one node, cell
  2 on two) starts from that file (``--container-image=/path.sqsh``: a fresh container filesystem each step);
- once per step (the kit before): each of the 6 cell steps names the image by digest
  (``--container-image=REGISTRY#REPO@sha256:...``) and pyxis imports it again on every node of the step.

Imports per node are counted from what the nodes said (enroot's "Fetching image manifest" lines in the import
step, pyxis's "imported docker image" lines in the cell steps). Each cell step runs ``COMMAND`` (default:
``true``), so the figures are the image's cost alone.

    SLURM_CONF=/tmp/repro-cluster/slurm/slurm.conf PATH=/tmp/repro-cluster/cache/pyxis/bin:$PATH \\
        scripts/bench_pyxis_imports.py --image '127.0.0.1:5000/repro-test/debian@sha256:...' \\
        --image-dir /tmp/repro-cluster/node-local/tmp
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.run.schedulers.slurm.enroot import enroot_uri  # noqa: E402

NAME = "repro-bench-pyxis"


def run(argv: list[str], timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def allocate(partition: str | None, minutes: int) -> tuple[str, list[str]]:
    argv = ["sbatch", "--parsable", f"--job-name={NAME}", "--nodes=2", "--exclusive", "--no-requeue",
            f"--time={minutes}", "--output=/dev/null", *([f"--partition={partition}"] if partition else []),
            "--wrap", "exec sleep 2147483647"]
    job = run(argv).stdout.strip().split(";")[0]
    if not job:
        sys.exit("sbatch failed")
    try:
        return job, wait_running(job)
    except BaseException:  # stopped while the job waits in the queue: it must not stay there
        run(["scancel", job])
        raise


def wait_running(job: str) -> list[str]:
    while True:
        shown = run(["scontrol", "show", "job", "-o", job]).stdout.split()
        info = dict(t.split("=", 1) for t in shown if "=" in t)
        if info.get("JobState") == "RUNNING":
            return run(["scontrol", "show", "hostnames", info["NodeList"]]).stdout.split()
        if info.get("JobState") not in ("PENDING", "CONFIGURING"):
            sys.exit(f"job {job} is {info.get('JobState')}")
        time.sleep(0.5)


def step(job: str, nodes: list[str], image: str, command: list[str]) -> tuple[float, str]:
    t0 = time.monotonic()
    p = run(["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
             "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--label",
             f"--job-name={NAME}", f"--container-image={image}", "--no-container-mount-home", *command])
    if p.returncode != 0:
        sys.exit(f"step failed: {p.stderr[-2000:]}")
    return time.monotonic() - t0, p.stdout + p.stderr


def cells(nodes: list[str]) -> list[list[str]]:
    """2 cells x 3 repeats: the 1-node cell's repeats, then the 2-node cell's."""
    return [nodes[:1]] * 3 + [nodes[:2]] * 3


def once_per_step(job: str, nodes: list[str], image: str, command: list[str]) -> dict:
    pyxis_ref = enroot_uri(image).removeprefix("docker://")
    imports: collections.Counter[str] = collections.Counter()
    t0 = time.monotonic()
    for where in cells(nodes):
        _, out = step(job, where, pyxis_ref, command)
        # pyxis says it once for each node it imported on (a line srun prints without the task's label)
        said = sum(1 for line in out.splitlines() if "pyxis: imported docker image" in line)
        for node in where if said == len(where) else ["(not attributable)"]:
            imports[node] += 1 if said == len(where) else said
    return {"wall_s": round(time.monotonic() - t0, 1), "imports_per_node": dict(imports)}


def once_per_run(job: str, nodes: list[str], image: str, command: list[str], folder: str) -> dict:
    path = f"{folder.rstrip('/')}/{NAME}-{job}.sqsh"
    imports: collections.Counter[str] = collections.Counter()
    t0 = time.monotonic()
    p = run(["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
             "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--label",
             f"--job-name={NAME}-import",
             "enroot", "import", "--output", path, "--", enroot_uri(image)])
    if p.returncode != 0:
        sys.exit(f"import failed: {p.stderr[-2000:]}")
    for rank, node in enumerate(nodes):  # enroot's own log line, once per import, labelled with the task
        imports[node] += sum(1 for line in (p.stdout + p.stderr).splitlines()
                             if line.startswith(f"{rank}: ")
                             and line.rstrip().endswith("Fetching image manifest"))
    try:
        for where in cells(nodes):
            step(job, where, path, command)
    finally:
        run(["srun", f"--jobid={job}", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--overlap",
             f"--job-name={NAME}-remove", "rm", "-f", "--", path])
    return {"wall_s": round(time.monotonic() - t0, 1), "imports_per_node": dict(imports)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", required=True, help="REGISTRY/REPO[:TAG]@sha256:... (by digest)")
    ap.add_argument("--image-dir", default="/tmp", help="node-local folder for the squashfs (default /tmp)")
    ap.add_argument("--partition")
    ap.add_argument("--command", default="true", help="what every cell step runs (split on spaces)")
    args = ap.parse_args()
    job, nodes = allocate(args.partition, 60)
    try:
        out = {"image": args.image, "nodes": nodes, "steps": len(cells(nodes)),
               "once_per_run": once_per_run(job, nodes, args.image, args.command.split(), args.image_dir),
               "once_per_step": once_per_step(job, nodes, args.image, args.command.split())}
    finally:
        run(["scancel", job])
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` and kill: the job is cancelled
    main()
