"""The telemetry sampler: one per node while a cell runs, as ``python3 -c <this file> INTERVAL_MS MAX_BYTES
MAX_S`` (the interval, the most bytes it writes, the most seconds it runs: the cell's deadline and a margin,
so that a sampler whose kit was lost ends by itself).

It needs only the Python standard library, because it runs on the node (in a container beside the cell's,
or under the Slurm agent), not where the kit is installed. Every line it prints is a tool's own output with
a tag in front, so the kit parses what the tools print (repro.nodes.telemetry), never a format of its own:

- ``loadavg EPOCH <the line of /proc/loadavg>``, ``stat EPOCH <the "cpu" line of /proc/stat>``,
  ``mhz EPOCH <the "cpu MHz" values of /proc/cpuinfo, or cpufreq's scaling_cur_freq in kHz, "khz ...">``;
- where ``nvidia-smi`` answers: ``fields <the query fields chosen>`` (asked of ``--help-query-gpu`` first:
  the clock event reasons were called throttle reasons before driver 535), then ``gpu <each line of
  nvidia-smi --query-gpu=FIELDS --format=csv,nounits --loop-ms INTERVAL>`` and, every fifth interval,
  ``apps <each line of --query-compute-apps>`` and ``cgroup PID <the process's container id or ->``.

Output stops at MAX_BYTES (``capped BYTES`` says so); SIGTERM, SIGINT or SIGHUP end it and its nvidia-smi.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

#: each quantity and the query field names it has had, newest first
WANTED = (
    ("timestamp",), ("index",), ("uuid",),
    ("clocks.current.sm", "clocks.sm"), ("clocks.max.sm",),
    ("clocks.current.memory", "clocks.mem"), ("clocks.max.memory", "clocks.max.mem"),
    ("power.draw",), ("enforced.power.limit", "power.limit"), ("temperature.gpu",),
    ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
    ("utilization.gpu",), ("memory.used",), ("memory.total",),
)
APPS = "gpu_uuid,pid,process_name,used_memory"
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


class Out:
    """Tagged lines to stdout, at most ``cap`` bytes in all (the last line says it stopped there)."""

    def __init__(self, cap):
        self.cap, self.used, self.lock, self.full = cap, 0, threading.Lock(), False

    def put(self, tag, text):
        line = f"{tag} {text.rstrip()}\n"
        with self.lock:
            if self.full:
                return
            if self.used + len(line) > self.cap - 32:  # room for the "capped" line
                self.full = True
                line = f"capped {self.used}\n"
            self.used += len(line)
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            except OSError:  # nobody reads any more: the cell is over
                os._exit(0)


def chosen_fields(help_text):
    """The first name of each wanted quantity that this nvidia-smi lists, in the order of WANTED."""
    listed = set(re.findall(r'"([A-Za-z0-9_.]+)"', help_text))
    return [next(n for n in names if n in listed) for names in WANTED if any(n in listed for n in names)]


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def sample_cpu(out):
    now = f"{time.time():.3f}"
    out.put("loadavg", now + " " + read("/proc/loadavg").strip())
    first = read("/proc/stat").split("\n", 1)[0]
    out.put("stat", now + " " + first)
    mhz = re.findall(r"^cpu MHz\s*:\s*([0-9.]+)", read("/proc/cpuinfo"), re.M)
    if mhz:
        out.put("mhz", now + " " + " ".join(mhz))
        return
    base = "/sys/devices/system/cpu"
    khz = [read(f"{base}/{d}/cpufreq/scaling_cur_freq").strip() for d in sorted(os.listdir(base))
           if re.fullmatch(r"cpu\d+", d)] if os.path.isdir(base) else []
    if any(khz):
        out.put("mhz", now + " khz " + " ".join(k for k in khz if k))


def container_of(pid):
    ids = CONTAINER_ID.findall(read(f"/proc/{pid}/cgroup"))
    return ids[-1] if ids else "-"


def sample_apps(out, seen):
    try:
        got = subprocess.run(["nvidia-smi", "--query-compute-apps=" + APPS, "--format=csv,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return
    for line in got.stdout.splitlines():
        out.put("apps", line)
        pid = line.split(",")[1].strip() if line.count(",") >= 3 else ""
        if pid.isdigit() and pid not in seen:
            seen.add(pid)
            out.put("cgroup", f"{pid} {container_of(pid)}")


def start_gpu(out, interval_ms):
    """nvidia-smi in loop mode, its lines copied out by a thread; None where there is no nvidia-smi."""
    try:
        helped = subprocess.run(["nvidia-smi", "--help-query-gpu"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        out.put("nogpu", f"nvidia-smi: {e}")
        return None
    fields = chosen_fields(helped.stdout)
    if helped.returncode != 0 or not fields:
        out.put("nogpu", f"nvidia-smi --help-query-gpu exited {helped.returncode}")
        return None
    out.put("fields", ",".join(fields))
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,nounits",
                             f"--loop-ms={interval_ms}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def copy():
        for line in proc.stdout:
            out.put("gpu", line)

    threading.Thread(target=copy, daemon=True).start()
    return proc


def main():
    interval_ms = max(100, int(sys.argv[1])) if len(sys.argv) > 1 else 1000
    out = Out(int(sys.argv[2]) if len(sys.argv) > 2 else 4 << 20)
    deadline = time.monotonic() + (float(sys.argv[3]) if len(sys.argv) > 3 else 86400)
    out.put("telemetry", f"v1 interval_ms={interval_ms} max_bytes={out.cap}")
    proc = start_gpu(out, interval_ms)

    def stop(signum, _frame):
        if proc is not None:
            proc.kill()
        os._exit(0)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, stop)
    seen, tick = set(), 0
    while time.monotonic() < deadline:  # the cell's end stops it sooner; a lost kit, this
        if not out.full:
            sample_cpu(out)
            if proc is not None and tick % 5 == 0:
                sample_apps(out, seen)
        elif proc is not None and proc.poll() is None:  # capped: nothing more is written
            proc.kill()
        tick += 1
        time.sleep(interval_ms / 1000)
    stop(0, None)


if __name__ == "__main__":
    main()
