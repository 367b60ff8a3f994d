#!/usr/bin/env python3
"""Parse throughput and memory of the kit against ``grep`` on a gigabyte of real logs.

The log set is built in a temporary folder from the publisher logs in ``logs/published``: one
file per log format (PaddleClas, NGC TF1, NGC PyTorch, NGC MXNet, TF2 Keras) made of all real
logs of that format concatenated and repeated, cycling through the formats until the set
reaches ``--size-mb``. Every file has the same size, so a smaller set (the first
``--small-files`` files) shows whether memory depends on the size of the set.

Measured, after one read of every file to warm the page cache:

* ``grep -c -F ips FILES``: one process over all files, and one per format (wall time, MB/s); its
  output goes to a pipe, because GNU grep stops at the first match when stdout is /dev/null;
* the kit: one ``python -c`` process per file calling ``repro.parsers.parse_file`` and
  ``repro.measure.measure`` on every run (wall time including interpreter start, MB/s, the parse
  time the worker reports itself, and the peak RSS of each worker from ``wait4``), ``--repeat``
  times per file, the best time counting;
* for every process also its CPU time (user + sys): on a shared machine wall time mostly
  measures the other load, CPU time much less so.
* when the CLI has a ``parse`` command, also ``python -m repro parse FILE --format json`` per file,
  and over all files in one command (``--jobs 1`` and the default); and, for the target, ``grep -c``
  and ``repro parse`` over all files back to back, five pairs or more: each pair's ratio, whose
  median the targets line reports (this VM's speed drifts by up to 1.6x from minute to minute, and
  the two runs of a pair see the same conditions).

Usage: ``python scripts/bench_parse.py [--size-mb 1024] [--files 20] [--small-files 5] [--repeat 3]
[--json OUT]``

Figures from a shared 2-core AMD EPYC VM, Python engine (load average 4-7 from other jobs; CPU MB/s,
best of 3), default 1 GiB set (51 MiB files):

* grep -c -F ips: 1000-1550 MB/s per format, ~1250 overall (one third: ~420 MB/s);
* kit, process per file: 81-100 MB/s (0.064-0.078 x grep); parse+measure alone 93-115 MB/s;
  per format, process per file: PaddleClas 70-92, NGC TF1 54-65, NGC PyTorch 84-106,
  NGC MXNet 109-134, TF2 Keras 125-152;
* before the byte-block/column engine (same script): 42-43 MB/s (TF1 21-22), peak RSS 84 MB;
* peak RSS 36 MB (51 MiB files) and 28 MB with the 256 MiB set (13 MiB files), whatever the
  number of files: memory grows only with the records a file holds, about 22 bytes each (a single
  1 GiB TF1 log, 9.2 million records, peaks at ~290 MB);
* ``repro parse`` (CLI) 36-52 MB/s when it still imported pandas (via repro.report) for every
  parse, about 0.6 s of CPU per process; the parse path no longer imports it (not re-measured).

With the native scanner (PCRE2 JIT; load average ~1, CPU MB/s, best of 3, 1 GiB set): grep 1338 MB/s;
kit process per file 161 MB/s (0.121 x grep), one process for all files 229 MB/s (0.171 x grep),
``repro parse`` CLI 135 MB/s (0.101); peak RSS 39 MB at 257 MiB and at 1029 MiB.

After exact decimals in C, group spans from the native scan, literal skips, SSE2 newline counts,
one match per PaddleClas config fact, the MPI-tag check and value ranges in C, with cached bytecode
(quiet machine, 1 GiB set): grep 1109 MB/s; ``repro parse`` over all files 257 MB/s (0.232 x grep on
one core), with ``--jobs 2`` 457 MB/s wall (0.412 x grep); kit one process 282 MB/s, process per file
183 MB/s; per format (process per file, parse alone) PaddleClas 260, TF1 176, PyTorch 267, MXNet 315,
Keras 270; peak RSS 38 MB (process per file) at 257 MiB and 1029 MiB, ``repro parse`` over all files
46 and 49 MB. Where the time goes now (perf): per run, Python handlers and their bookkeeping (a
DLLogger run is ~12 KB, so TF1 has 86 runs a MiB); one PCRE2 pass per rule and block (~0.15 ms/MiB
each, 12 rules for PaddleClas); reading (kernel copy, 1 MiB block allocations).

After a SIMD literal search (replacing memmem), rules tried only where their start texts occur, all
non-record rules of a block in one native call with one newline count, MPI tags removed natively,
PARAMETER keys read in one call, blocks read without gluing a partial line on, series that keep a
block's records as parts until read, Clinger's fast path for decimals of up to 53 bits, and JSON
written a run a line by the C encoder (shared VM, load average ~1, 1 GiB set, best of 3): grep 1025
MB/s; ``repro parse`` over all files 267 MB/s (0.261 x grep on one core), with ``--jobs 2`` 454 MB/s
(0.443 x grep); kit one process 258 MB/s, process per file 148 MB/s; peak RSS 38 MB at 257 MiB and
1029 MiB, ``repro parse`` over all files 48-50 MB. The machine's speed varied by up to 1.6x from one
minute to the next during this work (the same in-process parse of the five formats: 192-321 MB/s),
so figures from different runs compare poorly; the ratio to grep is taken within one run. Where the
time goes now: a DLLogger run costs ~25 us of Python (handlers, facts, measuring, the JSON line; TF1
has 86 runs a MiB), a record ~0.13 us (PCRE2 ~0.05 of it).

Then a native fsum of value columns, a set for kept issues (a concatenated log drops thousands of
contradictions), result rows encoded in one call, and no YAML or manifest import on ``repro parse``
(start 156 -> 117 ms). Two runs of the 1 GiB set a few minutes apart: grep 1117 and 1125 MB/s;
``repro parse`` over all files 386 and 359 MB/s (0.346 and 0.319 x grep by best times), back to back
with grep 0.333 and 0.323 x grep (median of 5 pairs; ranges 0.282-0.342 and 0.318-0.328); with
``--jobs 2`` 0.581 and 0.500 x grep back to back; kit one process 404 and 371 MB/s, process per file
232 and 213 MB/s; peak RSS 39-40 MB at 257 and 1029 MiB, ``repro parse`` 44-51 MB.

Then one refilled buffer for all blocks (on this VM a page fault costs ~6 us, and 1 MiB blocks
made the allocator map fresh pages for most blocks: 12.7k faults for the 51 MiB PaddleClas file,
1.7k after), masked newline counts, a kept SIMD mask for the MPI tag of every line, decimal digits
eight at a time, DLLogger parameters turned into facts once per setting: per format, parse alone
(process per file, CPU) PaddleClas 305 -> 368 MB/s, TF1 178 -> 226, PyTorch 325 -> 359, MXNet
328 -> 367, Keras 310 -> 409; kit, process per file 176 -> 215 MB/s (grep 1055 and 966 MB/s).
``repro parse`` over all files, back to back with grep: median 0.352 x grep (5 pairs, 0.270-0.431;
the best single time fell in a slow minute: 268 MB/s, 0.278 x), ``--jobs 2`` 0.542 x; peak RSS
38 MB at 257 and 1029 MiB, ``repro parse`` 42 MB. Where a record goes now (cachegrind, TF1):
~1400 instructions, half in PCRE2 (its JIT code ~580, the call ~130), the rest reading the decimal,
the iteration and epoch, the line count and four column appends.

Then handlers given a native match object (spans inline, one allocation a match, no tuple of ints
and no Python wrapper): parse + measure of the five files by CPU time (interleaved, best of 6)
382 -> 431 MB/s, TF2 Keras (~640 matches a MiB) 483 -> 725. The 1 GiB run after it fell in a slow
phase of the VM (kit one process 261 MB/s, against 315-374 in the runs before): grep 919 MB/s;
``repro parse`` over all files back to back with grep 0.349 x grep (5 pairs, 0.331-0.429; the
quarter set 0.328, 0.319-0.423), ``--jobs 2`` 0.539 x (0.517-0.670); peak RSS 38 MB at 257 and
1029 MiB, ``repro parse`` 42 MB.

Then buffers kept from block to block (MPI tag removal writes into one buffer, the record scanner
keeps its columns: a fresh megabyte a block cost a page fault every 4 KiB), one pass for the start
texts of all of a parser's other rules (nibble tables, 32 places at a time), PARAMETER lines read
once per distinct line, no copy of a value column nothing is skipped from, and no cyclic GC in
``repro parse``: parse + measure by CPU time (interleaved, best of 6) PaddleClas 409 -> 460 MB/s,
TF1 296 -> 321, PyTorch 466 -> 491, MXNet 588 -> 699, TF2 Keras 755 -> 914; ``repro parse --jobs 1``
over the five 51 MiB files twice 387 -> 453 MB/s. Three 1 GiB runs (the last at the final code):
grep 1121, 1118 and 1121 MB/s; ``repro parse`` over all files back to back with grep 0.437, 0.431
and 0.437 x grep (5 pairs each; all 15 within 0.424-0.450), the quarter set 0.370, 0.355 and 0.379
(0.317-0.391: the interpreter's start weighs more there); ``--jobs 2`` 0.745, 0.759 and 0.775 x;
peak RSS 38 MB at 257 and 1029 MiB, ``repro parse`` 42-43 MB.

Where the time went in the Python engine, per MiB of log: regex scans (0.4-2 ms each, 3-6 rules a
format), 0.7-1 us a record (re.split objects, float() of 17-digit decimals, newline counts; TF1 logs
hold ~9000 records a MiB), ~25 us a run (DLLogger PARAMETER lines), and ~50 ms of interpreter start
per process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "logs" / "published"
FORMATS = ("paddle", "ngc-tf1", "ngc-pytorch", "ngc-mxnet", "tf2-keras")  # folders under <set>/
MB = 2**20
JOBS = len(os.sched_getaffinity(0))  # repro parse --jobs default: a worker per CPU
PAIRS = 5  # grep / repro parse pairs at least, for the ratio measured back to back
#: children run as an installed kit does: with the bytecode of its modules cached
WARM_UP = "import repro.cli, repro.reproduce; from repro.parsers import PARSERS; PARSERS.plugins()"
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "PYTHONPATH": str(ROOT)}

#: parse and measure every file named, in one process; a process per file, or one for all files
#: as ``grep`` runs (no interpreter start per file)
WORKER = """
import json, sys, time
from repro.measure import Protocol, measure
from repro.parsers import parse_file
from repro.parsers.base import ENGINE
t, c = time.perf_counter(), time.process_time()
out = {"parsers": [], "lines": 0, "series": 0, "records": 0, "engine": ENGINE}
protocol = Protocol()
for path in sys.argv[1:]:
    r = parse_file(path)
    values = [measure(s, protocol).value for s in r.series]
    out["parsers"].append(r.parser)
    out["lines"] += r.lines
    out["series"] += len(r.series)
    out["records"] += sum(len(s.records) for s in r.series)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": time.process_time() - c, **out}))
"""


def bench_all_files(cmd: list[str], files: list[Path], repeat: int) -> dict:
    """One command over every file, as grep runs, ``repeat`` times: best wall and CPU time, and the
    highest peak RSS."""
    runs = [run_child([*cmd, *map(str, files)]) for _ in range(repeat)]
    if any(r["rc"] != 0 for r in runs):
        raise SystemExit(f"{' '.join(cmd[:4])} ... over all files failed")
    mb = total_mb(files)
    wall, cpu = min(r["wall"] for r in runs), min(r["cpu"] for r in runs)
    return {"seconds": wall, "mb_s": mb / wall, "cpu": cpu, "cpu_mb_s": mb / cpu,
            "peak_rss_mb": max(r["rss_mb"] for r in runs), "out": runs[0]["out"]}


def bench_one_process(files: list[Path], repeat: int) -> dict:
    """The worker over every file in one process (no interpreter start per file)."""
    res = bench_all_files([sys.executable, "-c", WORKER], files, repeat)
    res["engine"] = json.loads(res.pop("out").strip().splitlines()[-1])["engine"]
    return res


def bench_cli_one(files: list[Path], repeat: int, jobs: int = 1) -> dict:
    """``repro parse --format json --jobs N FILES``: the CLI over every file in one command
    (``jobs`` 1: one process; more: that many worker processes)."""
    res = bench_all_files(
        [sys.executable, "-m", "repro", "parse", "--format", "json", "--jobs", str(jobs)], files, repeat
    )
    del res["out"]
    return res


def bench_paired(files: list[Path], pairs: int, jobs: int) -> dict:
    """``grep -c`` and then ``repro parse --jobs N`` over all files, back to back, ``pairs`` times:
    on a machine whose speed drifts from one minute to the next, the two runs of a pair see the
    same conditions, so the ratio of a pair is steadier than the ratio of two separate bests."""
    grep = ["grep", "-c", "-F", "ips", *map(str, files)]
    cli = [sys.executable, "-m", "repro", "parse", "--format", "json", "--jobs", str(jobs), *map(str, files)]
    ratios = []
    for _ in range(pairs):
        g, k = run_child(grep), run_child(cli)
        if k["rc"] != 0:
            raise SystemExit(f"repro parse --jobs {jobs} over all files failed")
        ratios.append(g["wall"] / k["wall"])  # (MB / parse seconds) / (MB / grep seconds)
    ratios.sort()
    return {"ratios": ratios, "median": statistics.median(ratios)}


def format_unit(fmt: str) -> bytes:
    """All real logs of one format, each ending in a newline, back to back."""
    files = sorted(p for p in PUBLISHED.glob(f"*/{fmt}/**/*") if p.is_file() and p.suffix != ".json")
    if not files:
        raise SystemExit(f"no logs for {fmt} under {PUBLISHED}")
    return b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in files)


def build_set(folder: Path, size_mb: int, n_files: int) -> list[Path]:
    per_file = size_mb * MB // n_files
    units = {fmt: format_unit(fmt) for fmt in FORMATS}
    out = []
    for i in range(n_files):
        fmt = FORMATS[i % len(FORMATS)]
        unit = units[fmt]
        path = folder / f"{i:03d}-{fmt}.log"
        with path.open("wb") as f:
            for _ in range(max(1, -(-per_file // len(unit)))):
                f.write(unit)
        out.append(path)
    return out


def total_mb(files: list[Path]) -> float:
    return sum(p.stat().st_size for p in files) / MB


def run_child(cmd: list[str], capture: bool = True) -> dict:
    """Run one child; its wall seconds, CPU seconds, peak RSS (MiB, from wait4), status, stdout."""
    t = time.perf_counter()
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    out = p.stdout.read() if p.stdout else b""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall": time.perf_counter() - t,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss_mb": usage.ru_maxrss / 1024,
        "rc": p.returncode,
        "out": out.decode(),
    }


def fmt_of(path: Path) -> str:
    return path.name.split("-", 1)[1][:-4]


def bench_grep(files: list[Path], runs: int = 5) -> dict:
    """grep over all files at once, and over the files of each format; best wall and best CPU
    time of ``runs`` runs each."""

    def best(group: list[Path]) -> dict:
        # grep's output is read (a pipe): with stdout on /dev/null, GNU grep (3.x) stops at the
        # first match of each file, as with -q, and would read almost nothing of most logs
        rs = [run_child(["grep", "-c", "-F", "ips", *map(str, group)]) for _ in range(runs)]
        wall, cpu = min(r["wall"] for r in rs), min(r["cpu"] for r in rs)
        mb = total_mb(group)
        return {"seconds": wall, "mb_s": mb / wall, "cpu": cpu, "cpu_mb_s": mb / max(cpu, 1e-6)}

    res = best(files)
    groups: dict[str, list[Path]] = {}
    for f in files:
        groups.setdefault(fmt_of(f), []).append(f)
    res["by_format"] = {fmt: best(group) for fmt, group in groups.items()}
    return res


def bench_kit(files: list[Path], cmd_for, repeat: int = 1) -> dict:
    """One process per file, ``repeat`` times; per file the best wall and best CPU time count
    (other load on the machine only ever adds time), and the highest peak RSS."""
    wall = cpu = parse = parse_cpu = peak = 0.0
    per_file = []
    for f in files:
        runs = [run_child(cmd_for(f)) for _ in range(repeat)]
        for r in runs:
            if r["rc"] != 0:
                raise SystemExit(f"parse of {f} failed (exit {r['rc']})")
        info = {
            "file": f.name,
            "wall": min(r["wall"] for r in runs),
            "proc_cpu": min(r["cpu"] for r in runs),
            "rss_mb": max(r["rss_mb"] for r in runs),
        }
        wall, cpu, peak = wall + info["wall"], cpu + info["proc_cpu"], max(peak, info["rss_mb"])
        try:
            reports = [json.loads(r["out"].strip().splitlines()[-1]) for r in runs]
            info.update(min(reports, key=lambda x: x.get("cpu", 0.0)))
            info["seconds"] = min(x.get("seconds", 0.0) for x in reports)
            parse += info.get("seconds", 0.0)
            parse_cpu += info.get("cpu", 0.0)
        except (ValueError, IndexError, AttributeError):
            pass
        per_file.append(info)
    mb = total_mb(files)
    res = {
        "seconds": wall,
        "mb_s": mb / wall,
        "cpu": cpu,
        "cpu_mb_s": mb / cpu,
        "peak_rss_mb": peak,
        "per_file": per_file,
    }
    if parse:
        res.update(
            parse_seconds=parse, parse_mb_s=mb / parse, parse_cpu=parse_cpu, parse_cpu_mb_s=mb / parse_cpu
        )
    return res


def cli_has_parse() -> bool:
    try:
        r = subprocess.run(
            [sys.executable, "-m", "repro", "parse", "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=ENV,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "--format" in r.stdout


def measure_set(label: str, files: list[Path], use_cli: bool, repeat: int = 1) -> dict:
    for f in files:  # warm the page cache so grep and the kit read from memory alike
        with f.open("rb") as fh:
            while fh.read(16 * MB):
                pass
    res = {
        "label": label,
        "files": len(files),
        "mb": total_mb(files),
        "load": os.getloadavg()[0],
        "grep": bench_grep(files),
    }
    res["kit"] = bench_kit(files, lambda f: [sys.executable, "-c", WORKER, str(f)], repeat)
    res["kit_one"] = bench_one_process(files, repeat)
    if use_cli:
        res["cli_one"] = bench_cli_one(files, repeat)
        res["cli_jobs"] = bench_cli_one(files, repeat, JOBS)
        res["paired_one"] = bench_paired(files, max(repeat, PAIRS), 1)
        res["paired_jobs"] = bench_paired(files, max(repeat, PAIRS), JOBS)
        res["cli"] = bench_kit(
            files, lambda f: [sys.executable, "-m", "repro", "parse", str(f), "--format", "json"], repeat
        )
    res["load_after"] = os.getloadavg()[0]
    return res


def report(results: list[dict], file_mb: float) -> str:
    lines = [
        f"log set: real logs from logs/published, one format per file, {file_mb:.0f} MiB per file",
        "MB/s by wall time, and in [] by CPU time (user+sys), which other load on the machine disturbs less",
        f"parse engine: {results[0]['kit_one']['engine']}",
    ]
    for r in results:
        g, k = r["grep"], r["kit"]
        lines.append(
            f"\n== {r['label']}: {r['files']} files, {r['mb']:.0f} MiB "
            f"(load average {r['load']:.1f} before, {r.get('load_after', r['load']):.1f} after)"
        )
        lines.append(
            f"grep -c -F ips         {g['seconds']:7.2f} s {g['mb_s']:7.0f} MB/s [{g['cpu_mb_s']:6.0f}]"
        )
        rows = [
            ("kit, process per file", k, "mb_s", "cpu_mb_s", "seconds"),
            ("kit, one process", r["kit_one"], "mb_s", "cpu_mb_s", "seconds"),
        ]
        if "parse_mb_s" in k:
            rows.append(("kit, parse+measure", k, "parse_mb_s", "parse_cpu_mb_s", "parse_seconds"))
        if "cli" in r:
            rows.append(("repro parse (CLI)", r["cli"], "mb_s", "cpu_mb_s", "seconds"))
        if "cli_one" in r:
            rows.append(("repro parse, all files", r["cli_one"], "mb_s", "cpu_mb_s", "seconds"))
            rows.append((f"  the same, --jobs {JOBS}", r["cli_jobs"], "mb_s", "cpu_mb_s", "seconds"))
        paired = (("repro parse, all files", "paired_one"), (f"  the same, --jobs {JOBS}", "paired_jobs"))
        for label, key in paired if "paired_one" in r else ():
            q = r[key]["ratios"]
            lines.append(
                f"{label:22s} back to back with grep: {r[key]['median']:.3f} x grep "
                f"(range {q[0]:.3f}-{q[-1]:.3f}, {len(q)} pairs)"
            )
        for name, d, wall_key, cpu_key, sec_key in rows:
            rss = (
                f"  peak RSS {d['peak_rss_mb']:.0f} MB" if wall_key == "mb_s" else "  (no interpreter start)"
            )
            lines.append(
                f"{name:22s} {d[sec_key]:7.2f} s {d[wall_key]:7.0f} MB/s [{d[cpu_key]:6.0f}]  "
                f"{d[wall_key] / g['mb_s']:.3f} x grep [{d[cpu_key] / g['cpu_mb_s']:.3f}]{rss}"
            )
        by_fmt: dict[str, list[dict]] = {}
        for info in k["per_file"]:
            by_fmt.setdefault(info["file"].split("-", 1)[1][:-4], []).append(info)
        lines.append(
            f"    {'format':12s} {'records':>8s}   {'grep MB/s':>14s}   {'kit process MB/s':>16s}   "
            f"{'kit parse':>9s}   {'x grep':>13s}   {'RSS':>6s}"
        )
        for fmt, infos in by_fmt.items():
            n = len(infos)
            recs = sum(i.get("records", 0) for i in infos) / n
            pwall, pcpu = (sum(i[key] for i in infos) for key in ("wall", "proc_cpu"))
            cpu_s = sum(i.get("cpu", 0) for i in infos)
            parse = n * file_mb / cpu_s if cpu_s else 0.0
            rss = max(i["rss_mb"] for i in infos)
            gf = g.get("by_format", {}).get(fmt)
            gtxt = f"{gf['mb_s']:5.0f} [{gf['cpu_mb_s']:5.0f}]" if gf else " " * 13
            kw, kc = n * file_mb / pwall, n * file_mb / pcpu
            ratio = f"{kw / gf['mb_s']:.3f} [{kc / gf['cpu_mb_s']:.3f}]" if gf else ""
            lines.append(
                f"    {fmt:12s} {recs:8.0f}   {gtxt:>14s}   {kw:6.0f} [{kc:6.0f}]   [{parse:6.0f}]   "
                f"{ratio:>13s}   {rss:4.0f} MB"
            )
    if len(results) == 2:
        small, big = (r["kit"]["peak_rss_mb"] for r in results)
        lines.append(
            f"\npeak RSS {small:.0f} MB at {results[0]['mb']:.0f} MiB vs {big:.0f} MB at "
            f"{results[1]['mb']:.0f} MiB (x{big / small:.2f})"
        )
    big = results[-1]
    g = big["grep"]
    per_file = big["kit"]["cpu_mb_s"] / g["cpu_mb_s"]
    head = big.get("cli_one", big["kit_one"])  # repro parse over all files, as grep -c runs
    name = "repro parse over all files" if "cli_one" in big else "kit in one process"
    cpu = head["cpu_mb_s"] / g["cpu_mb_s"]
    wall = big["cli_jobs"]["mb_s"] / g["mb_s"] if "cli_jobs" in big else head["mb_s"] / g["mb_s"]
    if "paired_one" in big:  # the ratios measured back to back with grep, where there are
        cpu, wall = big["paired_one"]["median"], big["paired_jobs"]["median"]
        name += ", median of pairs with grep"
    rss = max(big["kit"]["peak_rss_mb"], head["peak_rss_mb"])
    lines.append(
        f"targets: parse >= 1/3 of grep MB/s: on one core (CPU time) {'met' if cpu >= 1 / 3 else 'NOT met'} "
        f"({name}: {cpu:.3f} x grep; a process per file: {per_file:.3f}); by wall time with --jobs {JOBS} "
        f"{'met' if wall >= 1 / 3 else 'NOT met'} ({wall:.3f} x grep); "
        f"peak RSS <= 150 MB: {'met' if rss <= 150 else 'NOT met'} ({rss:.0f} MB)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--size-mb", type=int, default=1024, help="size of the full log set in MiB (default 1024)"
    )
    ap.add_argument("--files", type=int, default=20, help="number of files in the full set (default 20)")
    ap.add_argument(
        "--small-files",
        type=int,
        default=5,
        help="files in the smaller set measured first (default 5, one per format)",
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs per file of the kit, best one counts (default 3)"
    )
    ap.add_argument("--tmpdir", type=Path, default=None, help="where to build the set (default: system temp)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--json", type=Path, default=None, help="also write all figures to this JSON file")
    args = ap.parse_args(argv)
    if not 0 < args.small_files < args.files:
        ap.error("--small-files must be between 1 and --files - 1")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if shutil.which("grep") is None:
        ap.error("grep is not on PATH")
    folder = Path(tempfile.mkdtemp(prefix="repro-bench-", dir=args.tmpdir))
    try:
        t = time.perf_counter()
        files = build_set(folder, args.size_mb, args.files)
        took = time.perf_counter() - t
        print(
            f"built {len(files)} files, {total_mb(files):.0f} MiB in {folder} ({took:.1f} s)", file=sys.stderr
        )
        # compile and cache the kit's bytecode once, as an install does
        subprocess.run([sys.executable, "-c", WARM_UP], cwd=ROOT, env=ENV, check=True)
        use_cli = cli_has_parse()
        print(f"CLI parse command: {'yes' if use_cli else 'no (python -c fallback only)'}", file=sys.stderr)
        results = [
            measure_set("small set", files[: args.small_files], use_cli, args.repeat),
            measure_set("full set", files, use_cli, args.repeat),
        ]
        print(report(results, total_mb(files) / len(files)))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
