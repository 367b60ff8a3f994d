"""Node facts: the one script run on each node, one parser per tool it runs, and the facts the provenance
records, each failing soft: ``{"value": ..., "reason": ...}``.

:func:`node_script` is one POSIX sh script: every tool runs once in it, in a section of its own
(``@@repro:NAME`` ... ``@@repro-rc:STATUS``, read by :func:`parse_sections`). ``repro preflight`` and
``repro up`` run it once per node over one SSH command (``repro.nodes.preflight.probe_node``); the same
parsed output gives preflight's checks and, through :func:`host_facts`, the host facts of the
provenance, so a node needs no Python and one round trip gives both. One parser per tool:
nvidia-smi's CSV queries (:func:`smi_rows`: :func:`parse_nvidia_smi`, :func:`parse_compute_apps`),
the InfiniBand ports (:func:`parse_ib`: ibstat, ``ibv_devinfo -v`` or sysfs), ``df``, ``ofed_info``
and ``docker info`` (:func:`parse_docker_info`).
The container probe runs ``scripts/probe-container.py`` with the image's own Python.
Nothing here raises for a missing tool, device or permission: the value is null and the
reason says why.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import paths
from repro.throwaway import throwaway


#: one recorded fact that fails soft: ``{"value": ..., "reason": None}``, or a None value and the reason (the
#: provenance schema's ``probe``); a preflight check's outcome is :class:`repro.nodes.preflight.Probe`
Fact = dict[str, Any]
Sections = Mapping[str, tuple[str, int]]  # section name -> (output, exit status)
PROBE_SCRIPT = "probe-container.py"
#: The one GPU query: preflight's checks read name, memory and driver; the provenance records every field.
GPU_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version", "clocks.max.sm",
              "clocks.max.memory", "clocks.applications.graphics", "ecc.mode.current", "vbios_version")
_GPU_KEYS = {"index": "index", "name": "name", "uuid": "uuid", "pci.bus_id": "pci_bus_id",
             "memory.total": "memory_mib", "driver_version": "driver", "clocks.max.sm": "clocks_max_sm_mhz",
             "clocks.max.memory": "clocks_max_mem_mhz", "clocks.applications.graphics": "clocks_app_mhz",
             "ecc.mode.current": "ecc", "vbios_version": "vbios"}
_TEXT_KEYS = ("name", "uuid", "pci_bus_id", "driver", "ecc", "vbios")
#: The query of the processes on a node's GPUs; each field is one nvidia-smi documents for
#: --query-compute-apps.
COMPUTE_APPS_QUERY = "gpu_uuid,pid,process_name,used_gpu_memory"
_SECTION, _RC = re.compile(r"@@repro:(\w+)"), re.compile(r"(.*)@@repro-rc:([0-9]{1,9})", re.DOTALL)

_SCRIPT = r"""date +%s.%N
export LC_ALL=C PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/bin"
H={docker_host}; D() {{ docker ${{H:+-H "$H"}} "$@"; }}
s() {{ printf '\n@@repro:%s\n' "$1"; }}; e() {{ printf '\n@@repro-rc:%s\n' "$?"; }}
has() {{ command -v "$1" >/dev/null 2>&1; }}
s docker; out=$(D info --format '{docker_format}' 2>&1); rc=$?
printf '%s' "$out"; (exit $rc); e; root=$(printf '%s\n' "$out" | sed -n 's/^root=//p')
s df; if [ {local_engine} = 1 ] && [ $rc = 0 ] && [ -d "$root" ]; then df -Pk "$root" 2>&1
else echo 'no data root on this machine'; false; fi; e
s gpus; if has nvidia-smi; then nvidia-smi --query-gpu={gpu_fields} --format=csv,noheader,nounits 2>&1
else echo 'nvidia-smi: not found'; (exit 127); fi; e
s gpu_apps; if has nvidia-smi; then nvidia-smi --query-compute-apps={apps_query} --format=csv,noheader 2>&1
else echo 'nvidia-smi: not found'; (exit 127); fi; e
s smi; if has nvidia-smi; then nvidia-smi 2>&1; else echo 'nvidia-smi: not found'; (exit 127); fi; e
s topo; if has nvidia-smi; then nvidia-smi topo -m 2>&1; else echo 'nvidia-smi: not found'; (exit 127); fi; e
s ibdev; ls /dev/infiniband 2>&1; e
s ib; if has ibstat; then ibstat 2>&1; elif has ibv_devinfo; then ibv_devinfo -v 2>&1
elif ls -d /sys/class/infiniband/*/ports/* >/dev/null 2>&1; then
  for p in /sys/class/infiniband/*/ports/*; do d=${{p%/ports/*}}
    printf '%s|%s|%s|%s|%s|%s\n' "${{d##*/}}" "${{p##*/}}" "$(cat $p/state 2>/dev/null)" \
      "$(cat $p/rate 2>/dev/null)" "$(cat $p/link_layer 2>/dev/null)" "$(cat $d/fw_ver 2>/dev/null)"; done
else echo 'no ibstat, no ibv_devinfo, no /sys/class/infiniband ports'; (exit 127); fi; e
s ofed; if has ofed_info; then ofed_info -s 2>&1; else echo 'ofed_info: not found'; (exit 127); fi; e
s mlx5; if [ -d /sys/module/mlx5_core ]; then cat /sys/module/mlx5_core/version 2>/dev/null || echo inbox
else echo 'mlx5_core: not loaded'; false; fi; e
s netifs; ls /sys/class/net 2>&1; e
s hostname; hostname 2>&1; e
s os; cat /etc/os-release 2>&1; e
s os_release_file; {{ cat /etc/redhat-release || cat /etc/debian_version; }} 2>/dev/null; e
s kernel; uname -r 2>&1; e
s arch; uname -m 2>&1; e
s lscpu; lscpu 2>&1; e
s cpuinfo; grep -E '^(model name|physical id|core id|cpu cores)' /proc/cpuinfo 2>&1 | sort -u; e
s meminfo; grep MemTotal /proc/meminfo 2>&1; e
"""


def node_script(docker_host: str | None, extra: str = "") -> str:
    """The one script run on a node: the remote clock (its first line), then a section per tool, then
    ``extra`` sections; ``docker_host`` (the inventory's) enters it shell-quoted only."""
    local_engine = int(docker_host is None or docker_host.startswith("unix://"))
    return _SCRIPT.format(docker_host=shlex.quote(docker_host or ""), local_engine=local_engine,
                          gpu_fields=",".join(GPU_FIELDS), apps_query=COMPUTE_APPS_QUERY,
                          docker_format=DOCKER_INFO_FORMAT) + extra


def parse_sections(text: str) -> dict[str, tuple[str, int]]:
    """The script's output as name -> (output, exit status), in one pass (whatever a node printed)."""
    out: dict[str, tuple[str, int]] = {}
    name, body = None, []
    for line in text.split("\n"):
        if name is None:
            name, body = (m[1] if (m := _SECTION.fullmatch(line)) else None), []
        elif end := _RC.fullmatch(line):
            out[name], name = ("\n".join([*body, end[1]] if end[1] else body), int(end[2])), None
        else:
            body.append(line)
    return out


def ok(value: Any) -> Fact:
    return {"value": value, "reason": None}


def fail(reason: str) -> Fact:
    return {"value": None, "reason": reason}


def value(probe: Mapping[str, Any] | None) -> Any:
    return probe.get("value") if isinstance(probe, Mapping) else None


# ---------------------------------------------------------------- tool parsers (pure): one per tool

@dataclass(frozen=True)
class Gpu:
    """One GPU of ``nvidia-smi --query-gpu``: preflight compares name, memory and driver; the provenance
    records every field (None where the query had no such field or the driver says ``[N/A]``)."""

    name: str
    memory_mib: int
    driver: str
    index: int | None = field(default=None, compare=False)
    uuid: str | None = field(default=None, compare=False)
    pci_bus_id: str | None = field(default=None, compare=False)
    clocks_max_sm_mhz: int | None = field(default=None, compare=False)
    clocks_max_mem_mhz: int | None = field(default=None, compare=False)
    clocks_app_mhz: int | None = field(default=None, compare=False)
    ecc: str | None = field(default=None, compare=False)
    vbios: str | None = field(default=None, compare=False)


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


@dataclass(frozen=True)
class DockerInfo:
    """``docker info``: the engine's version, data root, storage driver and runtimes."""

    version: str
    root: str
    storage_driver: str | None = None
    runtimes: tuple[str, ...] = ()
    default_runtime: str | None = None


def smi_rows(text: str, width: int, free: int) -> list[list[str]]:
    """The rows of ``nvidia-smi --query-...=F1,F2,... --format=csv,noheader``: ``width`` fields split at
    commas, field ``free`` (a name, which may hold commas) taking what is left over. ValueError with the first
    line when no line is a row (the driver's error message); ``No devices were found`` is no rows."""
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


def _num(text: str) -> int | float | str | None:
    """A query field: a number (its unit, if printed, dropped), a string, or None for ``[N/A]``."""
    text = re.sub(r"\s*(MiB|MHz)$", "", text.strip())
    if not text or text.startswith("[") or text == "N/A":
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_nvidia_smi(text: str, fields: Sequence[str] = GPU_FIELDS) -> tuple[Gpu, ...]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv,noheader[,nounits]`` (``fields`` as queried; they include
    name, memory.total and driver_version). ValueError for output that is no GPU list."""
    rows = smi_rows(text, len(fields), list(fields).index("name"))
    keys = [_GPU_KEYS[f] for f in fields]
    gpus = []
    for parts in rows:
        row = {k: (v if v not in ("", "[N/A]", "N/A") else None) if k in _TEXT_KEYS else _num(v)
               for k, v in zip(keys, parts)}
        mib = _mib(parts[keys.index("memory_mib")])
        if mib is None or not row["driver"] or " " in row["driver"]:
            raise ValueError(", ".join(parts))
        gpus.append(Gpu(**{**row, "memory_mib": mib}))
    return tuple(gpus)


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
    return tuple(IbPort(p["device"], p["port"], p.get("state", "?"), _rate(p.get("rate")),
                        p.get("link layer"), p["fw"])
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
        out.append(IbPort(p["device"], p["port"], p.get("state", "?").split(" ")[0], rate,
                          p.get("link_layer"), p["fw"]))
    return tuple(out)


def parse_ib_sysfs(text: str) -> tuple[IbPort, ...]:
    """The script's listing of ``/sys/class/infiniband/*/ports/*`` where neither tool is installed:
    ``DEVICE|PORT|STATE|RATE|LINK_LAYER|FW`` per port (state as ``4: ACTIVE``, rate as
    ``100 Gb/sec (4X EDR)``)."""
    ports = []
    for line in filter(None, (ln.strip() for ln in text.splitlines())):
        device, port, state, rate, layer, fw = (line.split("|") + [""] * 6)[:6]
        if not port.isdigit():
            raise ValueError(f"not a port line: {line[:100]!r}")
        ports.append(IbPort(device, int(port), state.rpartition(":")[2].strip() or "?", _rate(rate),
                            layer or None, fw or None))
    return tuple(ports)


def parse_ib(text: str) -> tuple[IbPort, ...]:
    """Any of the three forms the script's ``ib`` section prints (ibstat, ``ibv_devinfo -v``, sysfs), told
    apart by shape."""
    if re.search(r"^\s*hca_id:", text, re.MULTILINE):
        return parse_ibv_devinfo(text)
    if re.search(r"^[^|\s]+\|\d+\|", text, re.MULTILINE):
        return parse_ib_sysfs(text)
    return parse_ibstat(text)


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


# the facts used, one short line each: srun splits a long output line (at 1 KiB) when it labels a job step's
# output
DOCKER_INFO_FORMAT = ('root={{.DockerRootDir}}{{"\\n"}}version={{.ServerVersion}}{{"\\n"}}driver={{.Driver}}'
                      '{{"\\n"}}default_runtime={{.DefaultRuntime}}{{"\\n"}}'
                      'runtimes={{range $k, $v := .Runtimes}}{{$k}} {{end}}')


def parse_docker_info(text: str) -> DockerInfo:
    """``docker info --format DOCKER_INFO_FORMAT``: ``key=value`` lines (warnings may come around them)."""
    info = dict(ln.partition("=")[::2] for ln in text.splitlines() if "=" in ln)
    if not info.get("version", "").strip():
        raise ValueError(f"docker info printed no server version: {text.strip()[:200]!r}")
    return DockerInfo(info["version"].strip(), info.get("root", "").strip(),
                      info.get("driver", "").strip() or None,
                      tuple(sorted(info.get("runtimes", "").split())),
                      info.get("default_runtime", "").strip() or None)


def _rate(text: str | None) -> float | None:
    """The number a value starts with (``100 Gb/sec (4X EDR)``, ``25.0 Gbps``)."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)", text or "")
    return float(m[1]) if m else None


# ---------------------------------------------------------------- the provenance's host facts
HOST_FACTS = ("hostname", "os", "kernel", "cpu", "memory", "gpus", "cuda_driver", "gpu_topology", "hcas",
              "mlx5_core", "mofed", "docker")


def not_run(reason: str) -> dict[str, Fact]:
    return {k: fail(reason) for k in HOST_FACTS}


def _why(sec: tuple[str, int] | None, what: str) -> str:
    if sec is None:
        return f"{what}: no output (the probe script did not run)"
    text, rc = sec
    if rc == 127 or "not found" in text[:200]:
        return f"{what}: not found"
    if "No such file" in text[:300]:
        return f"{what}: no such file"
    return (f"{what} failed (exit {rc}): "
            f"{text.strip().splitlines()[-1][:200] if text.strip() else 'no output'}")


def _parsed(sec: Sections, name: str, what: str, parse: Any) -> Fact:
    """A section read by its tool's parser; the reason when the tool failed or printed something else."""
    if name not in sec or sec[name][1] != 0:
        return fail(_why(sec.get(name), what))
    try:
        return ok(parse(sec[name][0]))
    except ValueError as e:
        return fail(f"{what}: {str(e)[:200]}")


def host_facts(sec: Sections, why_not: str = "no output") -> dict[str, Fact]:
    """The host facts the provenance records, from the node script's sections (:func:`parse_sections`);
    ``why_not``: what to say when the output holds none of them."""
    if not sec:
        return not_run(f"host probe did not run: {why_not}")

    def text(name: str, what: str) -> Fact:
        return _parsed(sec, name, what, lambda t: t.strip() or _raise(f"{what} printed nothing"))

    kernel = text("kernel", "uname -r")
    if kernel["value"]:
        arch = sec.get("arch", ("", 1))
        kernel["value"] = {"release": kernel["value"],
                           "machine": arch[0].strip() or None if arch[1] == 0 else None}
    gpus = _parsed(sec, "gpus", "nvidia-smi", lambda t: [{k: getattr(g, k) for k in _GPU_KEYS.values()}
                                                          for g in parse_nvidia_smi(t)]
                                                         or _raise("no GPU rows"))
    docker = _parsed(sec, "docker", "docker info", parse_docker_info)
    if docker["value"]:
        d = docker["value"]
        docker["value"] = {"version": d.version, "runtimes": list(d.runtimes),
                           "default_runtime": d.default_runtime,
                           "storage_driver": d.storage_driver}
    mlx5 = sec.get("mlx5")
    return {
        "hostname": text("hostname", "hostname"),
        "os": _os(sec),
        "kernel": kernel,
        "cpu": _cpu(sec),
        "memory": _memory(sec),
        "gpus": gpus,
        "cuda_driver": _parsed(sec, "smi", "nvidia-smi", _cuda_version),
        "gpu_topology": text("topo", "nvidia-smi topo -m"),
        "hcas": _parsed(sec, "ib", "InfiniBand ports", lambda t: [
            {"ca": p.device, "port": p.port, "state": p.state.upper().removeprefix("PORT_"),
             "rate_gbps": p.rate_gbps, "link_layer": p.link_layer, "fw": p.fw} for p in parse_ib(t)]),
        "mlx5_core": ok(mlx5[0].strip()) if mlx5 and mlx5[1] == 0 and mlx5[0].strip()
        else fail(mlx5[0].strip() if mlx5 and mlx5[0].strip() else _why(mlx5, "mlx5_core")),
        "mofed": _parsed(sec, "ofed", "ofed_info -s", parse_ofed_info),
        "docker": docker,
    }


def _raise(message: str) -> Any:
    raise ValueError(message)


def _cuda_version(text: str) -> str:
    m = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return m[1] if m else _raise("no CUDA Version in its banner")


def _os(sec: Sections) -> Fact:
    found = sec.get("os")
    if not found or found[1] != 0:
        return fail(_why(found, "/etc/os-release"))
    kv = dict(line.split("=", 1) for line in found[0].splitlines() if "=" in line)
    text, rc = sec.get("os_release_file", ("", 1))
    return ok({"pretty_name": kv.get("PRETTY_NAME", "").strip('"') or None,
               "id": kv.get("ID", "").strip('"') or None,
               "version_id": kv.get("VERSION_ID", "").strip('"') or None,
               "release": text.strip().splitlines()[0] if rc == 0 and text.strip() else None})


def _cpu(sec: Sections) -> Fact:
    lscpu = sec.get("lscpu")
    if lscpu and lscpu[1] == 0:
        kv = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lscpu[0].splitlines())}

        def num(k: str) -> int | None:
            return int(kv[k]) if kv.get(k, "").isdigit() else None

        return ok({"model": kv.get("Model name"), "sockets": num("Socket(s)"),
                   "cores_per_socket": num("Core(s) per socket"),
                   "threads_per_core": num("Thread(s) per core"), "logical_cpus": num("CPU(s)")})
    info = sec.get("cpuinfo")
    if info and info[1] == 0 and info[0].strip():
        lines = info[0].splitlines()
        models = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
        sockets = {ln for ln in lines if ln.startswith("physical id")}
        cores = [int(ln.split(":", 1)[1]) for ln in lines if ln.startswith("cpu cores")]
        return ok({"model": models[0] if models else None, "sockets": len(sockets) or None,
                   "cores_per_socket": cores[0] if cores else None, "threads_per_core": None,
                   "logical_cpus": None})
    return fail(f"{_why(lscpu, 'lscpu')}; /proc/cpuinfo unreadable")


def _memory(sec: Sections) -> Fact:
    found = sec.get("meminfo")
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", found[0]) if found else None
    return ok({"total_bytes": int(m.group(1)) * 1024}) if m else fail(_why(found, "/proc/meminfo"))


# ---------------------------------------------------------------- container probe
def probe_script() -> Path:
    return paths.data_root() / "scripts" / PROBE_SCRIPT


_LAUNCH = ('for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$0" "$@"; fi; '
           'done; echo "no python3 or python in the image" >&2; exit 127')


def probe_container(client: Any, image: str, *, sources: Sequence[str] = (), timeout_s: int = 600,
                    run_id: str | None = None, **run_kwargs: Any) -> Fact:
    """Run the probe script in a fresh container of ``image`` (no network); its JSON document. The container
    carries the run's id (``run_id``), so that ``repro clean`` finds it after a crash."""
    script = probe_script()
    if not script.is_file():
        return fail(f"probe script {script} is missing from this installation")
    argv = [script.read_text(encoding="utf-8"), *[a for src in sources for a in ("--source", src)],
            "--timeout", str(max(30, timeout_s // 2))]
    kwargs = {"network_mode": "none", **run_kwargs}
    try:
        with throwaway(client, image, argv, probe="container", run_id=run_id,
                       entrypoint=["sh", "-c", _LAUNCH], **kwargs) as container:
            container.start()
            status = container.wait(timeout=timeout_s)
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
    except Exception as e:  # noqa: BLE001 - docker errors, timeouts: a reason, not a crash
        return fail(f"container probe of {image}: {type(e).__name__}: {e}")
    start = stdout.find("{\n")
    try:
        return ok(json.loads(stdout[start:])) if start >= 0 else fail(
            f"container probe of {image} printed no document (exit {status.get('StatusCode')}): "
            f"{stderr.strip()[-300:]}")
    except ValueError as e:
        return fail(f"container probe of {image}: unreadable output: {e}")
