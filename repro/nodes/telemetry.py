"""Telemetry while a cell runs: the sampler every node runs, what its lines say, and their summaries.

The sampler (repro/nodes/sampler.py, standard library only) runs on each node of a cell for as long as the
cell runs, started and removed with the cell's own containers (repro.run.launch; the Slurm agent starts it
beside its rank's container). It prints the tools' own lines with a tag in front: ``nvidia-smi
--query-gpu`` CSV (the fields chosen from what ``--help-query-gpu`` lists), ``--query-compute-apps``,
/proc/loadavg, the ``cpu`` line of /proc/stat and the CPUs' MHz. The kit keeps them, bounded, as
``cells/<cell>/r<k>/telemetry-<node>.txt`` and writes what they say as ``telemetry.json`` beside them;
:func:`summary` gives a cell's over its repeats (what the results store records and ``repro explain``
reads).
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.layout import TELEMETRY_PREFIX, TELEMETRY_SUFFIX, TELEMETRY_SUMMARY, repeat_dirs, telemetry_name
from repro.nodes.telemetry_shape import shaped

SAMPLER = Path(__file__).with_name("sampler.py")
INTERVAL_MS = 1000
MAX_BYTES = 4 << 20  # per node and repeat: about 8 hours of one node with 8 GPUs at 1 s
MARGIN_S = 600  # a sampler outlives its cell's deadline by at most this
#: the kit's own first line of a node's file: the ids of the cell's containers on that node
CONTAINERS = "containers"
#: a busy GPU's SM clock below this share of its maximum counts as below max
BELOW_MAX = 0.97

#: NVML's clock event (throttle) reasons, by bit (nvml.h, nvmlClocksEventReason* / nvmlClocksThrottleReason*)
REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
#: what slows a busy GPU down (gpu_idle is a GPU with nothing to do)
SLOWING = frozenset(REASONS.values()) - {"gpu_idle"}
#: the quantities a sample holds, each by the names nvidia-smi has given its query field
NAMES = {
    "clocks.current.sm": "sm_mhz", "clocks.sm": "sm_mhz", "clocks.max.sm": "sm_max_mhz",
    "clocks.current.memory": "mem_mhz", "clocks.mem": "mem_mhz",
    "clocks.max.memory": "mem_max_mhz", "clocks.max.mem": "mem_max_mhz",
    "power.draw": "power_w", "enforced.power.limit": "power_limit_w", "power.limit": "power_limit_w",
    "temperature.gpu": "temperature_c", "clocks_event_reasons.active": "reasons",
    "clocks_throttle_reasons.active": "reasons", "utilization.gpu": "utilization_pct",
    "memory.used": "memory_used_mib", "memory.total": "memory_total_mib", "index": "index", "uuid": "uuid",
    "timestamp": "timestamp",
}
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
#: a figure as the tools print one (at most 15 digits either side of the point), and what only looks like one
_FIGURE = r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?"
_NUMBER = re.compile(rf"^({_FIGURE})(?:\s*(?:MHz|W|%|MiB|C))?$")
_NUMBERLIKE = re.compile(r"^-?[0-9.]+(?:\s*(?:MHz|W|%|MiB|C))?$|^0x[0-9A-Fa-f]+$")
#: a line longer than this is no sample (a GPU row of every field nvidia-smi has is about 2 KiB)
LINE_MAX = 64 << 10
#: what of a node's file is read: the sampler's own cap and the kit's first line, with room to spare
READ_MAX = 2 * MAX_BYTES


class BadSample(ValueError):
    """A value that looks like a figure and is none (``1.2.3``, 5,000 digits): its sample is skipped."""


def sampler_argv(max_s: float, interval_ms: int = INTERVAL_MS, max_bytes: int = MAX_BYTES,
                 source: str | None = None) -> list[str]:
    """The sampler as one argv: ``python3 -c <its source> INTERVAL_MS MAX_BYTES MAX_S``; ``max_s``: the cell's
    deadline, after which the sampler ends by itself whatever happened to the kit (a margin is added);
    ``source``: a file on the node that holds the sampler (``python3 FILE …``) instead of its text in argv."""
    program = ["-c", SAMPLER.read_text(encoding="utf-8")] if source is None else [source]
    return ["python3", *program, str(interval_ms), str(max_bytes), str(int(max_s) + MARGIN_S)]


#: how a record or a plan names the sampler's source where the argv carries its text
SHOWN = "<repro/nodes/sampler.py>"


def shown_sampler(argv: Sequence[str]) -> list[str]:
    """``argv`` with the sampler's source text (``sampler_argv``'s ``-c`` word) named ``SHOWN``."""
    source = SAMPLER.read_text(encoding="utf-8")
    return [SHOWN if word == source else word for word in argv]


def node_file(log_dir: Path, node: str) -> Path:
    return log_dir / telemetry_name(node)


# ---------------------------------------------------------------------------------------- parsing
def value(text: str) -> float | str | None:
    """One CSV value as nvidia-smi prints it: a number (its unit dropped), a hex bitmask as an int,
    None for ``[N/A]``, ``N/A`` and ``[Not Supported]``, else the text."""
    text = text.strip()
    if not text or text.strip("[]") in ("N/A", "Not Supported", "Unknown Error", "Requested functionality "
                                                                                 "has been deprecated"):
        return None
    if re.fullmatch(r"0x[0-9A-Fa-f]{1,16}", text):
        return int(text, 16)
    m = _NUMBER.match(text)
    if m is None and _NUMBERLIKE.match(text):
        raise BadSample(text[:40])
    return float(m[1]) if m else text


def reasons(mask: int | None) -> list[str]:
    """The names of the clock event reasons a bitmask holds."""
    return [] if mask is None else [name for bit, name in REASONS.items() if mask & bit]


def parse_gpu_csv(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,nounits]``: the header names the columns (units in
    brackets dropped), each later row is one GPU's sample with the quantities of NAMES; a header seen again
    starts over, lines of another width are skipped, and so is a row with a bad figure."""
    return _gpu_rows(lines)[0]


def _gpu_rows(lines: Iterable[str]) -> tuple[list[dict[str, Any]], int]:
    """parse_gpu_csv's rows and how many rows it skipped for a bad figure."""
    header: list[str] | None = None
    rows, bad = [], 0
    for raw in lines:
        cells = next(csv.reader([raw], skipinitialspace=True), [])
        if not cells:
            continue
        if cells[0].strip() == "timestamp":
            header = [_UNIT.sub("", c).strip() for c in cells]
            continue
        if header is None or len(cells) != len(header):
            continue
        try:
            rows.append({NAMES[h]: value(c) for h, c in zip(header, cells, strict=True) if h in NAMES})
        except BadSample:
            bad += 1
    return rows, bad


def parse_apps_csv(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv``
    (``used_gpu_memory`` is the same field, as the header prints it)."""
    out = []
    header: list[str] | None = None
    for raw in lines:
        cells = next(csv.reader([raw], skipinitialspace=True), [])
        if not cells:
            continue
        if "pid" in [_UNIT.sub("", c).strip() for c in cells]:
            header = [_UNIT.sub("", c).strip() for c in cells]
            continue
        if header is None or len(cells) != len(header):
            continue
        row = dict(zip(header, cells, strict=True))
        try:
            mem = value(row.get("used_gpu_memory", row.get("used_memory", "")))
        except BadSample:
            mem = None
        out.append({"gpu_uuid": row.get("gpu_uuid", "").strip(), "pid": row.get("pid", "").strip(),
                    "name": row.get("process_name", "").strip(),
                    "memory_mib": mem if isinstance(mem, float) else None})
    return out


def parse_loadavg(text: str) -> tuple[float, float, float, int, int] | None:
    """/proc/loadavg: the 1, 5 and 15 minute load, the runnable and all scheduling entities."""
    m = re.match(rf"\s*({_FIGURE}) ({_FIGURE}) ({_FIGURE}) ([0-9]{{1,18}})/([0-9]{{1,18}})(?:\s|$)", text)
    return (float(m[1]), float(m[2]), float(m[3]), int(m[4]), int(m[5])) if m else None


def parse_stat_cpu(text: str) -> tuple[int, int] | None:
    """The ``cpu`` line of /proc/stat: (busy, total) jiffies since boot (idle and iowait are not busy)."""
    parts = text.split()
    if len(parts) < 5 or parts[0] != "cpu" or not all(re.fullmatch("[0-9]{1,20}", p) for p in parts[1:]):
        return None
    ticks = [int(p) for p in parts[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def parse_mhz(text: str) -> list[float]:
    """The CPUs' MHz: /proc/cpuinfo's ``cpu MHz`` values, or cpufreq's kHz after ``khz``."""
    parts = text.split()
    khz = bool(parts) and parts[0] == "khz"
    numbers = parts[1:] if khz else parts
    if not all(re.fullmatch(r"[0-9]{1,12}" if khz else r"[0-9]{1,12}(?:\.[0-9]{1,6})?", p) for p in numbers):
        return []
    return [int(p) / 1000 if khz else float(p) for p in numbers]


@dataclass
class Stream:
    """What one node's sampler said during one repeat."""

    node: str
    containers: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    apps: list[dict[str, Any]] = field(default_factory=list)
    cgroups: dict[str, str] = field(default_factory=dict)
    load: list[tuple[float, float, float, int, int]] = field(default_factory=list)
    stat: list[tuple[int, int]] = field(default_factory=list)
    mhz: list[list[float]] = field(default_factory=list)
    no_gpu: str | None = None
    capped: bool = False
    #: sample lines skipped: a figure that is none, a line over LINE_MAX
    skipped: int = 0


def parse_stream(node: str, lines: Iterable[str]) -> Stream:
    """A node's telemetry file, line by line (unknown lines, e.g. an image's banner, are skipped)."""
    s = Stream(node)
    gpu_lines, app_lines = [], []
    for line in lines:
        if len(line) > LINE_MAX:
            s.skipped += 1
            continue
        tag, _, rest = line.rstrip("\n").partition(" ")
        if tag in ("loadavg", "stat", "mhz"):
            rest = rest.partition(" ")[2]  # the epoch
        if tag == CONTAINERS:
            s.containers = rest.split()
        elif tag == "fields":
            s.fields = rest.split(",")
        elif tag == "gpu":
            gpu_lines.append(rest)
        elif tag == "apps":
            app_lines.append(rest)
        elif tag == "cgroup" and len(parts := rest.split()) == 2:
            s.cgroups[parts[0]] = parts[1]
        elif tag in ("loadavg", "stat", "mhz"):
            _cpu_sample(s, tag, rest)
        elif tag == "nogpu":
            s.no_gpu = rest
        elif tag == "capped":
            s.capped = True
    (s.gpu, bad), s.apps = _gpu_rows(gpu_lines), parse_apps_csv(app_lines)
    s.skipped += bad
    return s


def _cpu_sample(s: Stream, tag: str, rest: str) -> None:
    """One loadavg, stat or mhz line into ``s`` (one that does not parse: skipped, counted)."""
    got = {"loadavg": parse_loadavg, "stat": parse_stat_cpu, "mhz": parse_mhz}[tag](rest)
    if not got:
        s.skipped += 1
    else:
        {"loadavg": s.load, "stat": s.stat, "mhz": s.mhz}[tag].append(got)  # type: ignore[arg-type]


def bounded_lines(path: Path) -> Iterator[str]:
    """The lines of a node's file, read at most READ_MAX bytes of it, each at most LINE_MAX + 1 characters
    (a longer one comes cut there, and the rest of it is read past, never held)."""
    left = READ_MAX
    with path.open(encoding="utf-8", errors="replace", newline="\n") as f:
        while left > 0 and (line := f.readline(min(LINE_MAX + 1, left))):
            left -= len(line)
            yield line
            while len(line) > LINE_MAX and not line.endswith("\n") and left > 0:
                line = f.readline(min(LINE_MAX + 1, left))
                if not line:
                    return
                left -= len(line)


# -------------------------------------------------------------------------------------- summaries
def _mean(xs: Sequence[float]) -> float | None:
    return round(statistics.fmean(xs), 3) if xs else None


def _share(n: int, of: int) -> float | None:
    return round(n / of, 4) if of else None


def _vals(rows: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if isinstance(r.get(key), float)]


def _mask(row: Mapping[str, Any]) -> set[str]:
    return set(reasons(row["reasons"] if isinstance(row.get("reasons"), int) else None))


def gpu_summary(s: Stream) -> dict[str, Any] | None:
    """What a node's GPU samples say: over the samples of a busy GPU (utilization above 0), the share with
    the SM clock below BELOW_MAX of its maximum and the share with each clock event reason; over all, the
    maximum temperature, mean power against the limit, mean utilization, the most memory used, and
    processes on the GPUs that are not the cell's (their container is none of the cell's)."""
    if not s.gpu:
        return None
    busy = [r for r in s.gpu if isinstance(r.get("utilization_pct"), float) and r["utilization_pct"] > 0]
    below = [r for r in busy if _num(r, "sm_mhz") and _num(r, "sm_max_mhz")
             and r["sm_mhz"] < BELOW_MAX * r["sm_max_mhz"]]
    seen: dict[str, int] = {}
    for r in busy:
        for name in _mask(r):
            seen[name] = seen.get(name, 0) + 1
    slowed = [r for r in busy if SLOWING & _mask(r)]
    power = [r["power_w"] / r["power_limit_w"] for r in s.gpu
             if _num(r, "power_w") and _num(r, "power_limit_w") and r["power_limit_w"] > 0]
    return {
        "samples": len(s.gpu), "gpus": len({r.get("index") for r in s.gpu}), "busy_samples": len(busy),
        "below_max_share": _share(len(below), len(busy)),
        "sm_mhz_mean_busy": _mean(_vals(busy, "sm_mhz")),
        "sm_max_mhz": max(_vals(s.gpu, "sm_max_mhz"), default=None),
        "slowed_share": _share(len(slowed), len(busy)),
        "reasons": {k: _share(v, len(busy)) for k, v in sorted(seen.items())},
        "temperature_max_c": max(_vals(s.gpu, "temperature_c"), default=None),
        "power_of_limit_mean": _mean(power),
        "utilization_mean_pct": _mean(_vals(s.gpu, "utilization_pct")),
        "memory_used_max_mib": max(_vals(s.gpu, "memory_used_mib"), default=None),
        "other_processes": others(s),
    }


def _num(row: Mapping[str, Any], key: str) -> bool:
    return isinstance(row.get(key), float)


def others(s: Stream) -> list[dict[str, Any]]:
    """The compute processes on the node's GPUs whose container is none of the cell's, one entry per process
    (the most memory it held). Without the cell's container ids nothing can be told apart: empty."""
    if not s.containers:
        return []
    ours = tuple(s.containers)
    found: dict[str, dict[str, Any]] = {}
    for app in s.apps:
        cid = s.cgroups.get(app["pid"], "-")
        if cid != "-" and cid.startswith(ours) or any(c.startswith(cid) for c in ours if cid != "-"):
            continue
        prev = found.get(app["pid"])
        mem = app["memory_mib"] or 0.0
        if prev is None or mem > (prev["memory_mib"] or 0.0):
            found[app["pid"]] = {"pid": app["pid"], "name": app["name"], "gpu_uuid": app["gpu_uuid"],
                                 "memory_mib": app["memory_mib"], "container": cid}
    return sorted(found.values(), key=lambda a: a["pid"])


def cpu_summary(s: Stream) -> dict[str, Any] | None:
    """What a node's CPU samples say: the 1-minute load (mean, max), the share of CPU time busy between the
    first and the last /proc/stat sample, and the CPUs' clock (mean of the per-sample means, min, max)."""
    if not s.load and not s.stat:
        return None
    busy = None
    if len(s.stat) >= 2 and s.stat[-1][1] > s.stat[0][1]:
        busy = round((s.stat[-1][0] - s.stat[0][0]) / (s.stat[-1][1] - s.stat[0][1]), 4)
    means = [statistics.fmean(m) for m in s.mhz if m]
    return {"samples": max(len(s.load), len(s.stat)),
            "load1_mean": _mean([x[0] for x in s.load]),
            "load1_max": max((x[0] for x in s.load), default=None),
            "busy_share": busy, "mhz_mean": _mean(means),
            "mhz_min": min((min(m) for m in s.mhz if m), default=None),
            "mhz_max": max((max(m) for m in s.mhz if m), default=None)}


def node_summary(s: Stream) -> dict[str, Any]:
    return {"gpu": gpu_summary(s), "cpu": cpu_summary(s), "no_gpu": s.no_gpu, "capped": s.capped,
            **({"skipped": s.skipped} if s.skipped else {})}


def repeat_summary(log_dir: Path) -> dict[str, Any] | None:
    """Every node's summary of one repeat's telemetry files (None: the repeat has none)."""
    files = sorted(log_dir.glob(f"{TELEMETRY_PREFIX}*{TELEMETRY_SUFFIX}")) if log_dir.is_dir() else []
    out = {}
    for f in files:
        node = f.name[len(TELEMETRY_PREFIX):-len(TELEMETRY_SUFFIX)]
        out[node] = node_summary(parse_stream(node, bounded_lines(f)))
    return out or None


def write_repeat_summary(log_dir: Path) -> dict[str, Any] | None:
    """``telemetry.json`` of one repeat, beside its telemetry files; what it holds, or None."""
    found = repeat_summary(log_dir)
    if found is not None:
        text = json.dumps(found, indent=2, sort_keys=True) + "\n"
        (log_dir / TELEMETRY_SUMMARY).write_text(text, encoding="utf-8")
    return found


def summary(run_dir: Path | str, cell: Any) -> dict[str, Any] | None:
    """A cell's telemetry over its repeats, from a run directory (``cell``: a Cell or its key such as
    ``1n8g-fp32-bs256``): ``{"cell", "repeats": {k: {node: node summary}}, "gpu": the whole cell's figures,
    "cpu": ...}``; None when no repeat of the cell has telemetry."""
    key = cell if isinstance(cell, str) else cell.key
    repeats, misshapen = {}, 0
    for k, d in repeat_dirs(Path(run_dir), key):
        found, saved_ok = _saved_or_parsed(d)
        misshapen += not saved_ok
        if found is not None:
            repeats[k] = found
    if not repeats:
        return None
    nodes = [n for r in repeats.values() for n in r.values()]
    skipped = sum(n.get("skipped", 0) for n in nodes)
    return {"cell": key, "repeats": repeats, "gpu": _gpu_overall([n["gpu"] for n in nodes if n.get("gpu")]),
            "cpu": _cpu_overall([n["cpu"] for n in nodes if n.get("cpu")]),
            **({"skipped": skipped} if skipped else {}), **({"misshapen": misshapen} if misshapen else {})}


def _saved_or_parsed(d: Path) -> tuple[dict[str, Any] | None, bool]:
    """A repeat's summary: its telemetry.json where there is one of the kit's shape, else from its samples;
    and False where a telemetry.json was there but not of that shape (or not readable)."""
    saved = d / TELEMETRY_SUMMARY
    if not saved.is_file():
        return repeat_summary(d), True
    try:
        with saved.open("rb") as f:
            doc = json.loads(f.read(READ_MAX))
    except (OSError, ValueError, RecursionError):
        doc = None
    if shaped(doc):
        return doc, True
    return repeat_summary(d), False


def _weighted(parts: Sequence[Mapping[str, Any]], key: str, weight: str) -> float | None:
    pairs = [(p[key], p[weight]) for p in parts if p.get(key) is not None and p.get(weight)]
    total = sum(w for _, w in pairs)
    return round(sum(v * w for v, w in pairs) / total, 4) if total else None


def _gpu_overall(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    busy = sum(p["busy_samples"] for p in parts)
    names = sorted({k for p in parts for k in p.get("reasons", {})})
    return {
        "samples": sum(p["samples"] for p in parts), "busy_samples": busy,
        "below_max_share": _weighted(parts, "below_max_share", "busy_samples"),
        "slowed_share": _weighted(parts, "slowed_share", "busy_samples"),
        "reasons": {n: _weighted([{"v": p["reasons"].get(n, 0.0), "w": p["busy_samples"]} for p in parts],
                                 "v", "w") for n in names},
        "sm_mhz_mean_busy": _weighted(parts, "sm_mhz_mean_busy", "busy_samples"),
        "sm_max_mhz": max((p["sm_max_mhz"] for p in parts if p.get("sm_max_mhz")), default=None),
        "temperature_max_c": max((p["temperature_max_c"] for p in parts if p.get("temperature_max_c")),
                                 default=None),
        "power_of_limit_mean": _weighted(parts, "power_of_limit_mean", "samples"),
        "utilization_mean_pct": _weighted(parts, "utilization_mean_pct", "samples"),
        "memory_used_max_mib": max((p["memory_used_max_mib"] for p in parts if p.get("memory_used_max_mib")),
                                   default=None),
        "other_processes": list({(a["pid"], a["name"], a["gpu_uuid"]): a
                                 for p in parts for a in p.get("other_processes", [])}.values()),
    }


def _cpu_overall(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    return {"samples": sum(p["samples"] for p in parts),
            "load1_mean": _weighted(parts, "load1_mean", "samples"),
            "load1_max": max((p["load1_max"] for p in parts if p.get("load1_max") is not None), default=None),
            "busy_share": _weighted(parts, "busy_share", "samples"),
            "mhz_mean": _weighted(parts, "mhz_mean", "samples"),
            "mhz_min": min((p["mhz_min"] for p in parts if p.get("mhz_min")), default=None),
            "mhz_max": max((p["mhz_max"] for p in parts if p.get("mhz_max")), default=None)}
