"""Node facts: the parsers of every node tool's output, and facts about a node and an image, each
failing soft: ``{"value": ..., "reason": ...}``.

Host probes are one POSIX shell script (``HOST_SCRIPT``); preflight runs it within its own script, on
the same SSH command, and :func:`host_facts` reads its sections, so a node needs no Python and one
round trip per node gives both preflight and the provenance. One parser per tool: nvidia-smi's CSV
(:func:`smi_rows`), ibstat, ibv_devinfo, df, ofed_info.
The container probe runs ``scripts/probe-container.py`` with the image's own Python.
Nothing here raises for a missing tool, device or permission: the value is null and the
reason says why.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import paths
from repro.hosts import Node
from repro.nodes import Session, run_on_all

log = logging.getLogger(__name__)

#: Runs a shell script on a node: script text -> (exit status, stdout, stderr).
Runner = Callable[[str], tuple[int, str, str]]
Probe = dict[str, Any]
MARK = "@@repro-section@@"
PROBE_SCRIPT = "probe-container.py"
GPU_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version", "clocks.max.sm",
              "clocks.max.memory", "clocks.applications.graphics", "ecc.mode.current", "vbios_version")
_GPU_KEYS = ("index", "name", "uuid", "pci_bus_id", "memory_mib", "driver", "clocks_max_sm_mhz", "clocks_max_mem_mhz",
             "clocks_app_mhz", "ecc", "vbios")

HOST_SCRIPT = f"""
export LC_ALL=C PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/bin"
sec() {{ echo "{MARK} $1"; shift; "$@" 2>&1; echo "{MARK} rc=$?"; }}
sec hostname hostname
sec os cat /etc/os-release
sec os_release_file sh -c 'cat /etc/redhat-release 2>/dev/null || cat /etc/debian_version'
sec kernel uname -r
sec arch uname -m
sec lscpu lscpu
sec cpuinfo sh -c "grep -E '^(model name|physical id|core id|cpu cores)' /proc/cpuinfo | sort -u"
sec meminfo grep MemTotal /proc/meminfo
sec gpus nvidia-smi --query-gpu={",".join(GPU_FIELDS)} --format=csv,noheader,nounits
sec smi nvidia-smi
sec topo nvidia-smi topo -m
sec ib_sysfs sh -c 'ls -d /sys/class/infiniband/*/ports/* >/dev/null 2>&1 \
  || {{ echo "no /sys/class/infiniband ports"; exit 1; }}
  for p in /sys/class/infiniband/*/ports/*; do d=${{p%/ports/*}}
    printf "%s|%s|%s|%s|%s|%s\\n" "${{d##*/}}" "${{p##*/}}" "$(cat $p/state 2>/dev/null)" \
      "$(cat $p/rate 2>/dev/null)" "$(cat $p/link_layer 2>/dev/null)" "$(cat $d/fw_ver 2>/dev/null)"; done'
sec ibstat ibstat
sec ibv_devinfo ibv_devinfo
sec mlx5 cat /sys/module/mlx5_core/version
sec ofed ofed_info -s
"""
#: The engine's facts by its CLI, for a probe without the engine's SDK client (``repro up`` has one).
DOCKER_SCRIPT = f"""sec docker_version docker version --format '{{{{json .Server}}}}'
sec docker_info docker info --format \
  '[{{{{json .ServerVersion}}}},{{{{json .DefaultRuntime}}}},{{{{json .Driver}}}},{{{{json .Runtimes}}}}]'
"""


def ok(value: Any) -> Probe:
    return {"value": value, "reason": None}


def fail(reason: str) -> Probe:
    return {"value": None, "reason": reason}


def value(probe: Mapping[str, Any] | None) -> Any:
    return probe.get("value") if isinstance(probe, Mapping) else None


# ---------------------------------------------------------------- tool parsers (pure): one per tool

@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int
    driver: str


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str
    rate_gbps: float | None
    link_layer: str | None
    fw: str | None = field(default=None, compare=False)  # the HCA's firmware, where the tool prints it

    @property
    def active(self) -> bool:
        return self.state.lower() in ("active", "port_active")


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a GPU context (``nvidia-smi --query-compute-apps``)."""

    gpu_uuid: str
    pid: int | None
    name: str  # ``[Not Found]`` for a process in another PID namespace (another container's)
    used_mib: int | None  # None where the driver does not say (``[N/A]``)


#: The query of the processes on a node's GPUs; every field is one nvidia-smi documents for --query-compute-apps.
COMPUTE_APPS_QUERY = "gpu_uuid,pid,process_name,used_gpu_memory"


def smi_rows(text: str, width: int, free: int) -> list[list[str]]:
    """The rows of ``nvidia-smi --query-...=F1,F2,... --format=csv,noheader``: ``width`` fields split at commas,
    field ``free`` (a name, which may hold commas) taking what is left over. ValueError with the first line
    when no line is a row (the driver's error message); ``No devices were found`` is no rows."""
    rows, other = [], []
    for line in filter(None, (ln.strip() for ln in text.splitlines())):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < width:
            if line != "No devices were found":
                other.append(line)
            continue
        extra = len(parts) - width
        rows.append([*parts[:free], ", ".join(parts[free:free + extra + 1]), *parts[free + extra + 1:]])
    if other and not rows:
        raise ValueError(other[0])
    return rows


def _mib(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)(?:\s*MiB)?", text.strip())
    return int(m[1]) if m else None


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """``nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader``."""
    rows = smi_rows(text, 3, 0)
    gpus = tuple(Gpu(name, mib, driver) for name, mem, driver in rows
                 if (mib := _mib(mem)) is not None and mem.endswith("MiB") and " " not in driver)
    if rows and not gpus:
        raise ValueError(", ".join(rows[0]))
    return gpus


def parse_compute_apps(text: str) -> tuple[GpuProcess, ...]:
    """``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv,noheader``:
    one line per process and GPU, none when the GPUs are idle."""
    return tuple(GpuProcess(uuid, int(pid) if pid.isdigit() else None, name, _mib(used))
                 for uuid, pid, name, used in smi_rows(text, 4, 2))


def parse_ibstat(text: str) -> tuple[IbPort, ...]:
    """``ibstat``: ``CA 'mlx5_0'`` blocks, each with ``Port N:`` sections."""
    ports: list[dict[str, Any]] = []
    ca, fw, cur = None, None, None
    for line in text.splitlines():
        if m := re.match(r"CA '(.+)'", line.strip()):
            ca, fw, cur = m[1], None, None
        elif (m := re.fullmatch(r"Port (\d+):", line.strip())) and ca:
            ports.append(cur := {"device": ca, "port": int(m[1]), "fw": fw})
        elif line.strip().startswith("Firmware version:") and cur is None:
            fw = line.partition(":")[2].strip() or None
        elif cur is not None and ":" in line:
            key, _, val = (s.strip() for s in line.partition(":"))
            cur[key.lower()] = val
    return tuple(IbPort(p["device"], p["port"], p.get("state", "?"), _rate(p.get("rate")), p.get("link layer"), p["fw"])
                 for p in ports)


def parse_ibv_devinfo(text: str) -> tuple[IbPort, ...]:
    """``ibv_devinfo -v``: ``hca_id:`` blocks with ``port:`` sections; rate = width x lane speed."""
    ports: list[dict[str, Any]] = []
    hca, fw, cur = None, None, None
    for line in text.splitlines():
        key, _, val = (s.strip() for s in line.partition(":"))
        if key == "hca_id":
            hca, fw, cur = val, None, None
        elif key == "fw_ver" and cur is None:
            fw = val or None
        elif key == "port" and hca:
            ports.append(cur := {"device": hca, "port": int(val), "fw": fw})
        elif cur is not None and key in ("state", "link_layer", "active_width", "active_speed"):
            cur[key] = val
    out = []
    for p in ports:
        width = re.match(r"(\d+)X", p.get("active_width", ""))
        speed = _rate(p.get("active_speed"))
        rate = int(width[1]) * speed if width and speed else None
        out.append(IbPort(p["device"], p["port"], p.get("state", "?").split(" ")[0], rate, p.get("link_layer"), p["fw"]))
    return tuple(out)


def parse_ib(text: str) -> tuple[IbPort, ...]:
    """Either format, told apart by its first block header."""
    return parse_ibv_devinfo(text) if re.search(r"^\s*hca_id:", text, re.MULTILINE) else parse_ibstat(text)


def parse_df(text: str) -> int:
    """Available bytes from ``df -Pk PATH``."""
    rows = [ln.split() for ln in text.splitlines() if ln.strip()]
    if len(rows) < 2 or len(rows[-1]) < 6 or not rows[-1][3].isdigit():
        raise ValueError(text.strip().splitlines()[-1] if text.strip() else "no output")
    return int(rows[-1][3]) * 1024


def parse_ofed_info(text: str) -> str:
    """The version in ``ofed_info -s`` (``MLNX_OFED_LINUX-5.0-2.1.8.0:``, ``OFED-internal-25.01-0.6.0:``)."""
    line = next((ln.strip().rstrip(":") for ln in text.splitlines() if ln.strip()), "")
    m = re.search(r"(\d+\.\d+-\d+(?:\.\d+)*)$", line)
    if not m:
        raise ValueError(f"ofed_info -s printed no version: {line[:100]!r}")
    return m[1]


# ---------------------------------------------------------------- runners
def local_runner(timeout_s: int = 120) -> Runner:
    def run(script: str) -> tuple[int, str, str]:
        try:
            done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=timeout_s,
                                  errors="replace")
        except (OSError, subprocess.TimeoutExpired) as e:
            return 255, "", str(e)
        return done.returncode, done.stdout, done.stderr
    return run


def session_runner(session: Session, timeout_s: int = 120) -> Runner:
    """Run on a node over the session ``nodes.run_on_all`` opened (host keys verified there)."""
    def run(script: str) -> tuple[int, str, str]:
        res = session.run(f"sh -c {shlex.quote(script)}", hide=True, warn=True, timeout=timeout_s, in_stream=False)
        return res.exited, res.stdout, res.stderr
    return run


# ---------------------------------------------------------------- host probes
def _sections(stdout: str) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    name, lines = None, []
    for line in stdout.splitlines():
        if line.startswith(MARK + " rc=") and name is not None:
            out[name] = (int(line.rsplit("=", 1)[1]), "\n".join(lines).strip())
            name, lines = None, []
        elif line.startswith(MARK + " "):
            name, lines = line[len(MARK) + 1:], []
        elif name is not None:
            lines.append(line)
    return out


def _why(section: tuple[int, str] | None, what: str) -> str:
    if section is None:
        return f"{what}: no output (the probe script did not run)"
    rc, text = section
    if rc == 127 or "not found" in text[:200]:
        return f"{what}: not found"
    if "No such file" in text[:300]:
        return f"{what}: no such file"
    return f"{what} failed (exit {rc}): {text.splitlines()[-1][:200] if text else 'no output'}"


def probe_host(runner: Runner, docker_client: Any | None = None) -> dict[str, Probe]:
    """Every host probe of one node, run on its own; ``docker_client`` (the node's engine) replaces the docker CLI."""
    rc, stdout, stderr = runner(HOST_SCRIPT + ("" if docker_client is not None else DOCKER_SCRIPT))
    return host_facts(stdout, stderr.strip()[-300:] or f"exit {rc}", docker_client)


def host_facts(stdout: str, why_not: str = "no output", docker_client: Any | None = None) -> dict[str, Probe]:
    """The host facts in the output of HOST_SCRIPT (alone, or within preflight's script); ``why_not``: what
    to say when the output holds none of its sections."""
    s = _sections(stdout)
    if not s:
        return not_run(f"host probe did not run: {why_not}")

    def text(name: str, what: str) -> Probe:
        sec = s.get(name)
        return ok(sec[1]) if sec and sec[0] == 0 and sec[1] else fail(_why(sec, what))

    kernel = text("kernel", "uname -r")
    if kernel["value"] and s.get("arch", (1, ""))[0] == 0:
        kernel["value"] = {"release": kernel["value"], "machine": s["arch"][1]}
    elif kernel["value"]:
        kernel["value"] = {"release": kernel["value"], "machine": None}
    return {
        "hostname": text("hostname", "hostname"),
        "os": _os(s),
        "kernel": kernel,
        "cpu": _cpu(s),
        "memory": _memory(s),
        "gpus": _gpus(s),
        "cuda_driver": _cuda_driver(s),
        "gpu_topology": text("topo", "nvidia-smi topo -m"),
        "hcas": _hcas(s),
        "mlx5_core": text("mlx5", "/sys/module/mlx5_core/version"),
        "mofed": _mofed(s),
        "docker": docker_facts(docker_client) if docker_client is not None else _docker_cli(s),
    }


def not_run(reason: str) -> dict[str, Probe]:
    return {k: fail(reason) for k in ("hostname", "os", "kernel", "cpu", "memory", "gpus", "cuda_driver",
                                      "gpu_topology", "hcas", "mlx5_core", "mofed", "docker")}


def _mofed(s: dict[str, tuple[int, str]]) -> Probe:
    """The host's MLNX_OFED version (``ofed_info -s``); the containers' MOFED user space must not be newer."""
    sec = s.get("ofed")
    if not sec or sec[0] != 0:
        return fail(_why(sec, "ofed_info -s"))
    try:
        return ok(parse_ofed_info(sec[1]))
    except ValueError as e:
        return fail(str(e))


def _os(s: dict[str, tuple[int, str]]) -> Probe:
    sec = s.get("os")
    if not sec or sec[0] != 0:
        return fail(_why(sec, "/etc/os-release"))
    kv = dict(line.split("=", 1) for line in sec[1].splitlines() if "=" in line)
    release = s.get("os_release_file", (1, ""))
    return ok({"pretty_name": kv.get("PRETTY_NAME", "").strip('"') or None, "id": kv.get("ID", "").strip('"') or None,
               "version_id": kv.get("VERSION_ID", "").strip('"') or None,
               "release": release[1].splitlines()[0] if release[0] == 0 and release[1] else None})


def _cpu(s: dict[str, tuple[int, str]]) -> Probe:
    sec = s.get("lscpu")
    if sec and sec[0] == 0:
        kv = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in sec[1].splitlines())}
        num = lambda k: int(kv[k]) if kv.get(k, "").isdigit() else None
        return ok({"model": kv.get("Model name"), "sockets": num("Socket(s)"),
                   "cores_per_socket": num("Core(s) per socket"),
                   "threads_per_core": num("Thread(s) per core"), "logical_cpus": num("CPU(s)")})
    info = s.get("cpuinfo")
    if info and info[0] == 0 and info[1]:
        lines = info[1].splitlines()
        models = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
        sockets = {ln for ln in lines if ln.startswith("physical id")}
        cores = [int(ln.split(":", 1)[1]) for ln in lines if ln.startswith("cpu cores")]
        return ok({"model": models[0] if models else None, "sockets": len(sockets) or None,
                   "cores_per_socket": cores[0] if cores else None, "threads_per_core": None, "logical_cpus": None})
    return fail(f"{_why(sec, 'lscpu')}; /proc/cpuinfo unreadable")


def _memory(s: dict[str, tuple[int, str]]) -> Probe:
    sec = s.get("meminfo")
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", sec[1]) if sec else None
    return ok({"total_bytes": int(m.group(1)) * 1024}) if m else fail(_why(sec, "/proc/meminfo"))


def _num(text: str) -> int | float | str | None:
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "[N/A]"):
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _gpus(s: dict[str, tuple[int, str]]) -> Probe:
    sec = s.get("gpus")
    if not sec or sec[0] != 0:
        return fail(_why(sec, "nvidia-smi"))
    try:
        rows = smi_rows(sec[1], len(_GPU_KEYS), 1)
    except ValueError:
        rows = []
    gpus = []
    for parts in rows:
        row = {k: _num(v) for k, v in zip(_GPU_KEYS, parts)}
        for k in ("name", "uuid", "pci_bus_id", "driver", "ecc", "vbios"):
            row[k] = None if row[k] is None else str(parts[_GPU_KEYS.index(k)])
        gpus.append(row)
    return ok(gpus) if gpus else fail(f"nvidia-smi printed no GPU rows: {sec[1][:200]}")


def _cuda_driver(s: dict[str, tuple[int, str]]) -> Probe:
    sec = s.get("smi")
    m = re.search(r"CUDA Version:\s*([0-9.]+)", sec[1]) if sec and sec[0] == 0 else None
    return ok(m.group(1)) if m else fail(_why(sec, "nvidia-smi"))


def _rate(text: str | None) -> float | None:
    """The number a value starts with (``100 Gb/sec (4X EDR)``, ``25.0 Gbps``)."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)", text or "")
    return float(m[1]) if m else None


def _hcas(s: dict[str, tuple[int, str]]) -> Probe:
    sysfs = s.get("ib_sysfs")
    if sysfs and sysfs[0] == 0 and sysfs[1]:
        ports = []
        for line in sysfs[1].splitlines():
            ca, port, state, rate, layer, fw = (line.split("|") + [""] * 6)[:6]
            ports.append({"ca": ca, "port": int(port) if port.isdigit() else port,
                          "state": state.split(":")[-1].strip() or None, "rate_gbps": _rate(rate),
                          "link_layer": layer or None, "fw": fw or None})
        return ok(ports)
    ib = s.get("ibstat")
    if ib and ib[0] == 0 and "CA '" in ib[1]:
        return ok([{"ca": p.device, "port": p.port, "state": p.state.upper(), "rate_gbps": p.rate_gbps,
                    "link_layer": p.link_layer, "fw": p.fw} for p in parse_ibstat(ib[1])])
    reasons = [sysfs[1] if sysfs and sysfs[1] else "no /sys/class/infiniband", _why(ib, "ibstat"),
               _why(s.get("ibv_devinfo"), "ibv_devinfo")]
    return fail("; ".join(reasons))


def _docker_cli(s: dict[str, tuple[int, str]]) -> Probe:
    ver, info = s.get("docker_version"), s.get("docker_info")
    if not ver or ver[0] != 0:
        return fail(_why(ver, "docker version"))
    try:
        server = json.loads(ver[1].splitlines()[-1])
        version, default_rt, driver, runtimes = json.loads(info[1].splitlines()[-1]) if info and info[0] == 0 \
            else (server.get("Version"), None, None, None)
    except (ValueError, IndexError) as e:
        return fail(f"docker: unreadable output: {e}")
    return ok({"version": version or server.get("Version"), "api_version": server.get("ApiVersion"),
               "runtimes": sorted(runtimes or {}), "default_runtime": default_rt, "storage_driver": driver})


def docker_facts(client: Any) -> Probe:
    """The engine's version and runtimes through the SDK (the client ``repro up`` already holds)."""
    try:
        ver, info = client.version(), client.info()
    except Exception as e:  # noqa: BLE001 - a probe never raises
        return fail(f"docker engine: {type(e).__name__}: {e}")
    return ok({"version": ver.get("Version"), "api_version": ver.get("ApiVersion"),
               "runtimes": sorted(info.get("Runtimes") or {}), "default_runtime": info.get("DefaultRuntime"),
               "storage_driver": info.get("Driver")})


# ---------------------------------------------------------------- container probe
def probe_script() -> Path:
    return paths.data_root() / "scripts" / PROBE_SCRIPT


_LAUNCH = ('for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$0" "$@"; fi; done; '
           'echo "no python3 or python in the image" >&2; exit 127')


def probe_container(client: Any, image: str, *, sources: Sequence[str] = (), timeout_s: int = 600,
                    run_id: str | None = None, **run_kwargs: Any) -> Probe:
    """Run the probe script in a fresh container of ``image`` (no network); its JSON document. The container
    carries the run's id (``run_id``), so that ``repro clean`` finds it after a crash."""
    from repro.clean import probe_labels

    script = probe_script()
    if not script.is_file():
        return fail(f"probe script {script} is missing from this installation")
    argv = [script.read_text(encoding="utf-8"), *[a for src in sources for a in ("--source", src)],
            "--timeout", str(max(30, timeout_s // 2))]
    kwargs = {"network_mode": "none", "labels": probe_labels("container", run_id), **run_kwargs}
    container = None
    try:
        container = client.containers.create(image, argv, entrypoint=["sh", "-c", _LAUNCH], **kwargs)
        container.start()
        status = container.wait(timeout=timeout_s)
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
    except Exception as e:  # noqa: BLE001 - docker errors, timeouts: a reason, not a crash
        return fail(f"container probe of {image}: {type(e).__name__}: {e}")
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except Exception as e:  # noqa: BLE001
                log.warning("could not remove probe container %s: %s", container.id[:12], e)
    start = stdout.find("{\n")
    try:
        return ok(json.loads(stdout[start:])) if start >= 0 else fail(
            f"container probe of {image} printed no document (exit {status.get('StatusCode')}): "
            f"{stderr.strip()[-300:]}")
    except ValueError as e:
        return fail(f"container probe of {image}: unreadable output: {e}")


def probe_hosts(nodes: Sequence[Node], *, clients: Mapping[str, Any] | None = None,
                timeout_s: int = 120) -> dict[str, dict[str, Probe]]:
    """Every node's host probes, in parallel over SSH (``nodes.run_on_all``: the same config, host-key
    checks and errors as preflight and launch); ``clients``: node name -> its engine's SDK client."""
    clients = clients or {}
    found = run_on_all(nodes, lambda s: probe_host(session_runner(s, timeout_s), clients.get(s.node.name)),
                       timeout=timeout_s)
    return {name: facts if not isinstance(facts, Exception) else not_run(f"host probe did not run: {facts}")
            for name, facts in found.items()}
