#!/usr/bin/env python3
"""Launch benchmarks on the test cluster (scripts/test-cluster up; cpu-torch image on the nodes).

1. start skew: the spread between the first and the last node's container start, over
   several 2-node launches of a trivial command (target <= 0.5 s);
2. throughput by the kit vs by hand: the same 1-node ResNet-50 CPU cell started by
   repro.run.launch.launch_cell and by a plain Docker SDK run of the same image, command and
   options, alternated, each measured with the target's own protocol (target >= 0.98x);
3. kit overhead of `repro up` on one cell: its wall time outside the cell (target <= 5 %
   of a 60 s cell), and that a second `repro up` with the image present pulls and builds nothing.

    scripts/bench_launch.py [--runs N] [--image REF] [--manifest PATH]
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

from repro.spec.hosts import Hosts, load_hosts  # noqa: E402
from repro.images.engine import node_client  # noqa: E402
from repro.run.launch import _sdk_options, launch_cell  # noqa: E402
from repro.spec.manifest import load_manifest  # noqa: E402
from repro.measure.protocol import Protocol, measure  # noqa: E402
from repro.measure.parsers import parse_file  # noqa: E402
from repro.run.plan import plan_cell  # noqa: E402


def skew(hosts: Hosts, clients: dict, image: str, runs: int) -> list[float]:
    m = load_manifest(ROOT / "tests" / "data" / "launch" / "echo.yaml")
    cell = next(c for c in m.cells() if c.nodes == 2 and c.precision == "fp32")
    out = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as d:
            res = launch_cell(m, cell, hosts, Path(d), run_id=f"bench-skew-{i}", clients=clients, image=image)
        starts = [datetime.fromisoformat(r.started).timestamp() for r in res if r.started]
        out.append(max(starts) - min(starts))
    return out


def figure(log: Path, manifest) -> float:
    cell_protocol = Protocol.from_dict(manifest.measure.protocol)
    series = parse_file(log, manifest.measure.parser).series[0]
    value = measure(series, cell_protocol, gpus=1).value
    assert value is not None, f"no figure in {log}"
    return value


def by_hand(hosts: Hosts, clients: dict, manifest, image: str, out: Path) -> float:
    """The same container the kit would start, started with the Docker SDK directly."""
    cell = next(c for c in manifest.cells() if c.nodes == 1)
    plan = plan_cell(manifest, cell, Hosts(hosts.nodes[:1], hosts.path, hosts.data, hosts.env))[0]
    client = clients[plan.command.node.name]
    c = client.containers.run(image, list(plan.command.command), detach=True, **_sdk_options(plan.container))
    try:
        c.wait()
        out.write_bytes(c.logs(stdout=True, stderr=True))
    finally:
        c.remove(force=True)
    return figure(out, manifest)


OVERHEAD: list[tuple[float, float]] = []  # (launch_cell wall, container start-to-end) per kit run


def by_kit(hosts: Hosts, clients: dict, manifest, image: str, d: Path, i: int) -> float:
    cell = next(c for c in manifest.cells() if c.nodes == 1)
    t0 = time.monotonic()
    res = launch_cell(manifest, cell, hosts, d, run_id=f"bench-kit-{i}", clients=clients, image=image)
    wall = time.monotonic() - t0
    ran = (datetime.fromisoformat(res[0].ended).timestamp()
           - datetime.fromisoformat(res[0].started).timestamp())
    OVERHEAD.append((wall, ran))
    return figure(Path(res[0].log), manifest)


def up_overhead(manifest_path: Path, hosts_file: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = {}
    for label in ("first", "second"):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "repro", "up", str(manifest_path),
                                   "--hosts", hosts_file, "--cells", "nodes=1", "--repeats", "1", "--out", d,
                                   "--json-logs"],
                                  capture_output=True, text=True, env=env, cwd=ROOT)
            wall = time.monotonic() - t0
            events = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
            assert proc.returncode == 0, proc.stderr[-2000:]
            state = json.loads(next(Path(d).glob("*/state.json")).read_text())
            r = state["cells"]["1n1g-fp32-bs8"]["repeats"]["1"]
            cell_s = (datetime.fromisoformat(r["ended"].replace("Z", "+00:00"))
                      - datetime.fromisoformat(r["started"].replace("Z", "+00:00"))).total_seconds()
            msgs = [e["message"] for e in events]
            out[label] = {"wall_s": round(wall, 1), "cell_s": cell_s,
                          "outside_cell_s": round(wall - cell_s, 1),
                          "built": any(m.startswith("built ") for m in msgs),
                          "pulled_or_streamed": any("pulled" in m or "streamed" in m for m in msgs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cluster", default="/tmp/repro-cluster/cluster.json")
    ap.add_argument("--image", default="repro/cpu-torch:2.13.0")
    ap.add_argument("--manifest", type=Path, help="torch-rn50-cpu copy whose lock matches this cluster")
    args = ap.parse_args()
    cluster = json.loads(Path(args.cluster).read_text())
    os.environ.setdefault("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
    os.environ.setdefault("DOCKER_HOST", cluster["docker_host"])
    hosts = load_hosts(Path(cluster["hosts_file"]))
    clients = {n.name: node_client(n) for n in hosts.nodes}
    manifest = load_manifest(args.manifest or ROOT / "manifests" / "torch-rn50-cpu.yaml")
    print(f"load average before: {os.getloadavg()}")
    s = skew(hosts, clients, args.image, args.runs)
    print(f"start skew over {len(s)} 2-node launches: median {statistics.median(s) * 1000:.1f} ms, "
          f"max {max(s) * 1000:.1f} ms (target <= 500 ms)")
    kit, hand = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.runs):
            hand.append(by_hand(hosts, clients, manifest, args.image, Path(d) / f"hand-{i}.log"))
            kit.append(by_kit(hosts, clients, manifest, args.image, Path(d) / f"kit-{i}", i))
            print(f"  pair {i + 1}: by hand {hand[-1]:.2f} images/s, by the kit {kit[-1]:.2f} images/s",
                  flush=True)
    ratio = statistics.median(kit) / statistics.median(hand)
    print(f"throughput: kit median {statistics.median(kit):.2f}, by hand median "
          f"{statistics.median(hand):.2f} images/s, ratio {ratio:.3f} (target >= 0.98)")
    over = [(w - r) / w for w, r in OVERHEAD]
    print("launch overhead per cell (create, copy-in, start, follow, remove), as a share of the cell's wall "
          "time: " + ", ".join(f"{w - r:.2f} s of {w:.1f} s" for w, r in OVERHEAD)
          + f"; median {statistics.median(over):.1%}; on a 60 s cell: "
            f"{statistics.median([w - r for w, r in OVERHEAD]) / 60:.1%}")
    if args.manifest:
        print("repro up, one 1-node cell:",
              json.dumps(up_overhead(args.manifest, cluster["hosts_file"]), indent=2))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
