#!/usr/bin/env python3
"""Speed and memory of log parsing, against the targets the kit keeps.

Targets (figures, not a timed test: a shared machine's wall time mostly measures its other load):

1. the largest bundled log parsed by a whole ``repro parse`` process in <= 0.5 s;
2. 1 GiB of real-format logs in <= 60 s on one core;
3. peak RSS <= 150 MB, flat in the size of the logs;
4. ``repro report`` of every shipped table in <= 2 s.

Every figure is a child process, timed from outside: wall time, CPU time (user + sys of the child,
the "one core" figure) and peak RSS (``wait4``). The log set is built in a temporary folder from
the bundled publisher logs: files of ``--file-mb`` MiB, each the real logs of one format (PaddleClas,
NGC TF1, NGC PyTorch, NGC MXNet, TF2 Keras) concatenated and repeated, cycling through the formats
until the set reaches ``--size-mb``; ``repro parse --jobs 1`` reads the whole set in one process.
The same is run on a quarter of the set, and one file of each format is grown (``--grow``) to show
how memory follows what a single file holds: the format's logs repeated (a run per log: the
figures grow with the runs, one output row each), and one run of it, its record lines repeated
(the figures stay flat however many records it holds).

Usage: ``python scripts/bench_parse.py [--size-mb 1024] [--file-mb 51] [--grow 16,64,256] [--repeat 3]
[--json OUT]`` (``--size-mb 0``: the single files only; ``--grow 64,256,1024`` for 1 GiB files, which
are written to the temporary folder one at a time and removed after their run)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "logs" / "published"
FORMATS = {  # a folder of the bundled set -> format
    "paddle": "paddleclas", "ngc-tf1": "ngc-tf1", "ngc-pytorch": "ngc-pytorch", "ngc-mxnet": "ngc-mxnet",
    "tf2-keras": "tf2-keras",
}
RECORD_LINES = {  # a folder -> what its record lines hold (to grow one run of it)
    "paddle": re.compile(rb"train step:\d+|\[Train\]\[Epoch "),
    "ngc-tf1": re.compile(rb"\) (?:total_ips|imgs_per_sec) : "),
    "ngc-pytorch": re.compile(rb"Iteration: \d+ .*train\.total_ips : "),
    "ngc-mxnet": re.compile(rb"Epoch: \d+ +train\.loss : \S+ +train\.ips : "),
    "tf2-keras": re.compile(rb"TimeHistory: .* examples/second"),
}


def run(cmd: list[str], repeat: int = 1) -> dict:
    """Best wall time of ``repeat`` runs, with that run's CPU time and the largest peak RSS.

    A child's peak RSS counts the pages of the process it was started from (the kernel keeps the
    larger of the two at exec), so this process never holds much: a log set is read in pieces."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    best: dict | None = None
    rss = 0
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode not in (0, 2, 7, 8):  # 7, 8: a verdict (a deviating cell), not a failure
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
        rss = max(rss, usage.ru_maxrss // 1024)
        got = {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
               "exit": proc.returncode}
        if best is None or got["wall_s"] < best["wall_s"]:
            best = got
    assert best is not None
    return {**best, "peak_rss_mb": rss}


def logs_of(folder: str) -> list[Path]:
    return sorted(p for p in PUBLISHED.glob(f"*/{folder}/**/*") if p.is_file() and p.suffix != ".json"
                  and "A100" not in str(p))


def format_file(folder: str, mb: int, out: Path) -> Path:
    unit = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs_of(folder))
    with out.open("wb") as f:
        for _ in range(max(1, (mb << 20) // len(unit))):
            f.write(unit)
    return out


def one_run_file(folder: str, mb: int, out: Path) -> Path:
    """The format's largest bundled log as one run grown to ``mb`` MiB: its record lines repeated
    between its head and its tail (a run that trained for days)."""
    lines = max(logs_of(folder), key=lambda p: p.stat().st_size).read_bytes().splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if RECORD_LINES[folder].search(line)]
    body = b"".join(lines[i] for i in at)
    with out.open("wb") as f:
        f.write(b"".join(lines[: at[0]]))
        for _ in range(max(1, (mb << 20) // len(body))):
            f.write(body)
        f.write(b"".join(lines[at[-1] + 1 :]))
    return out


def build_set(size_mb: int, file_mb: int, where: Path) -> list[Path]:
    files, total, k = [], 0, 0
    folders = list(FORMATS)
    while total < size_mb << 20:
        folder = folders[k % len(folders)]
        path = format_file(folder, file_mb, where / f"{k:02d}-{folder}.log")
        files.append(path)
        total += path.stat().st_size
        k += 1
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--file-mb", type=int, default=51)
    ap.add_argument("--grow", default="16,64,256", help="MiB sizes of one growing file of each format")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    py = [sys.executable, "-m", "repro"]
    out: dict = {"python": sys.version.split()[0], "cpus": len(os.sched_getaffinity(0)),
                 "load": os.getloadavg()}

    logs = [p for folder in FORMATS for p in logs_of(folder)]
    largest = max(logs, key=lambda p: p.stat().st_size)
    out["largest_log"] = {"file": str(largest.relative_to(ROOT)), "bytes": largest.stat().st_size,
                          **run([*py, "parse", str(largest), "--skip-records", "10", "--gpus", "1"],
                                repeat=max(5, args.repeat))}
    print("largest bundled log, whole `repro parse`:", out["largest_log"], flush=True)

    tables = _table_ids()
    out["report_all"] = run([*py, "report", *tables, "--format", "json"], repeat=args.repeat)
    out["report_all"]["tables"] = len(tables)
    print(f"`repro report` of every shipped table ({len(tables)}):", out["report_all"], flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-parse-") as tmp:
        files = build_set(args.size_mb, args.file_mb, Path(tmp))
        mb = sum(p.stat().st_size for p in files) / 2**20
        for p in files:  # warm the page cache (in pieces: see run() on the parent's size)
            with p.open("rb") as f:
                while f.read(1 << 20):
                    pass
        for name, chosen in (("set", files), ("quarter", files[: max(1, len(files) // 4)])) if files else ():
            size = sum(p.stat().st_size for p in chosen) / 2**20
            got = run([*py, "parse", "--jobs", "1", "--format", "jsonl", *map(str, chosen)])
            got.update(mib=round(size, 1), files=len(chosen), cpu_mb_s=round(size / got["cpu_s"], 1))
            out[name] = got
            print(f"`repro parse --jobs 1` over {len(chosen)} files, {size:.0f} MiB:", got, flush=True)
        out["set_mib"] = round(mb, 1)
        for p in files:
            p.unlink()
        for shape, make in (("grow", format_file), ("one_run", one_run_file)):
            out[shape] = {}
            for folder, fmt in FORMATS.items():
                rows = []
                for size in map(int, args.grow.split(",")):
                    path = make(folder, size, Path(tmp) / f"{shape}-{folder}.log")
                    got = run([*py, "parse", "--format", "jsonl", str(path)])
                    got["mib"] = size
                    rows.append(got)
                    path.unlink()
                out[shape][fmt] = rows
                what = "repeated logs" if shape == "grow" else "one run"
                print(f"one {fmt} file ({what}) of", ", ".join(
                    f"{r['mib']} MiB: {r['peak_rss_mb']} MB RSS, {r['cpu_s']} s CPU" for r in rows),
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


def _table_ids() -> list[str]:
    """Every published table id of the shipped manifests (read by a child: this process stays
    small, as a forked child's peak RSS counts the parent's pages it started with)."""
    code = ("from repro.manifest import load_catalog, manifest_files\n"
            "print(*sorted({t.id for m in load_catalog(manifest_files()).values() for t in m.published}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          check=True).stdout.split()


if __name__ == "__main__":
    main()
