#!/usr/bin/env python3
"""Preflight of 8 nodes against 1 node on the SSH test cluster: does fanning out cost time?

Needs a test cluster with at least 8 nodes, for example one beside the default cluster:

    REPRO_CLUSTER_DIR=/tmp/repro-bench REPRO_CLUSTER_PREFIX=rb REPRO_CLUSTER_SUBNET=10.78.0 \\
    REPRO_CLUSTER_PORT=5001 REPRO_CLUSTER_NODES=8 scripts/test-cluster up
    python scripts/bench_preflight.py --cluster /tmp/repro-bench/cluster.json

Measured in this process, after one warm-up run of each, alternating 1 node and 8 nodes
``--runs`` times:

* ``preflight``: ``repro.nodes.preflight.run_preflight`` - connect, then the probe script (login
  shell, docker info, df, nvidia-smi/ibstat lookups) on every node;
* ``login``: ``repro.nodes.ssh.run_on_all`` running ``true`` on every node - what the node's
  login shell costs before any probe runs (sshd forks it, it reads its rc files);
* ``connect``: ``repro.nodes.ssh.run_on_all`` with only an SSH protocol round trip per node -
  the fan-out itself (threads, TCP, key exchange, host-key check, authentication).

Reported per size: the median wall time, the median CPU time of this process (the client
side), and the median CPU time the whole machine was busy during the run (/proc/stat; on
the test cluster the "nodes" are network namespaces on this machine, so their sshd, login
shell, docker CLI and dockerd work shares its cores, and so does anything else running).
The target is an 8-node preflight within 1.3 x the 1-node wall time. With every node on
this machine that is bounded below by the "floor": the 8 nodes' machine CPU time spread over
all cores, over the 1-node wall time - what a perfect fan-out would reach here.

Usage: ``python scripts/bench_preflight.py [--cluster PATH] [--nodes 8] [--runs 9] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from repro.spec.hosts import Node  # noqa: E402 - after the sys.path line above
from repro.nodes.ssh import run_on_all  # noqa: E402 - after the sys.path line above
from repro.nodes.preflight import run_preflight  # noqa: E402 - after the sys.path line above

TARGET_RATIO = 1.3


def machine_cpu_s() -> float:
    """CPU seconds all cores have spent busy since boot (user+nice+system+irq+softirq+steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + sum(fields[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def one_run(mode: str, nodes: list[Node]) -> dict[str, float]:
    m0, c0, t0 = machine_cpu_s(), time.process_time(), time.perf_counter()
    if mode == "preflight":
        bad = [f"{r.node}: {r.ssh.reason or r.docker.reason}" for r in run_preflight(nodes, timeout=60)
               if r.ssh.reason or r.docker.reason]
    else:
        fn = ((lambda s: s.ping()) if mode == "connect"
              else (lambda s: s.run("true", hide=True, in_stream=False).exited))
        bad = [f"{k}: {v}" for k, v in run_on_all(nodes, fn, timeout=60).items() if isinstance(v, Exception)]
    wall, cpu, machine = time.perf_counter() - t0, time.process_time() - c0, machine_cpu_s() - m0
    if bad:
        sys.exit(f"{mode} failed on the bench cluster:\n  " + "\n  ".join(bad))
    return {"wall_s": wall, "client_cpu_s": cpu, "machine_cpu_s": machine}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", type=Path, default=Path(os.environ.get("REPRO_BENCH_CLUSTER",
                                                                        "/tmp/repro-bench/cluster.json")))
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    args = ap.parse_args()

    info = json.loads(args.cluster.read_text())
    if len(info["nodes"]) < args.nodes:
        sys.exit(f"{args.cluster} has {len(info['nodes'])} nodes; bring up one with "
                 f"REPRO_CLUSTER_NODES={args.nodes}")
    os.environ["REPRO_SSH_CONFIG"] = info["ssh"]["config"]  # the cluster's pinned host keys
    nodes = [Node(n["name"], n["address"], user="root", identity=info["ssh"]["key"])
             for n in info["nodes"][:args.nodes]]
    sizes = {1: nodes[:1], args.nodes: nodes}

    modes = ("preflight", "login", "connect")
    load0 = os.getloadavg()[0]
    for mode in modes:
        for group in sizes.values():
            one_run(mode, group)  # warm-up: imports, page cache, first logins
    runs: dict[str, dict[int, list[dict[str, float]]]] = {m: {k: [] for k in sizes} for m in modes}
    for _ in range(args.runs):
        for mode in modes:
            for k, group in sizes.items():
                runs[mode][k].append(one_run(mode, group))

    print(f"test cluster {args.cluster}: {args.runs} runs each, medians; {os.cpu_count()} CPU(s), "
          f"load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'mode':<10} {'nodes':>5}  {'wall s':>7}  {'client CPU s':>12}  {'machine CPU s':>13}  "
          f"{'wall min..max':>15}")
    ratios, floors = {}, {}
    cores = os.cpu_count() or 1
    for mode in modes:
        med = {k: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for k, rs in runs[mode].items()}
        # the nodes share this machine's cores: N nodes' work cannot take less wall time than
        # its CPU time spread over every core, however well the kit fans out
        floors[mode] = med[args.nodes]["machine_cpu_s"] / cores / med[1]["wall_s"]
        for k, m in med.items():
            walls = [r["wall_s"] for r in runs[mode][k]]
            print(f"{mode:<10} {k:>5}  {m['wall_s']:7.3f}  {m['client_cpu_s']:12.3f}  "
                  f"{m['machine_cpu_s']:13.3f}  {min(walls):6.3f}..{max(walls):6.3f}")
        ratios[mode] = med[args.nodes]["wall_s"] / med[1]["wall_s"]
    for mode, ratio in ratios.items():
        verdict = (f" (target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'missed'})"
                   if mode == "preflight" else "")
        print(f"{mode}: {args.nodes}-node / 1-node wall time {ratio:.2f}{verdict}; "
              f"floor on {cores} core(s) {floors[mode]:.2f} "
              f"({args.nodes}-node machine CPU / cores / 1-node wall)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "ratios": ratios, "floors": floors}, indent=2))


if __name__ == "__main__":
    main()
