"""Preflight: what each node of an inventory offers, next to what the target's publication had.

Per node, in parallel, over one SSH session and the node-facts script (``repro.nodes.facts.node_script``,
POSIX sh, run by the login shell: bash, dash, zsh, ksh): SSH (round trip, connect time), the Docker engine's
version, GPUs (nvidia-smi) and the processes already on them, InfiniBand (/dev/infiniband, then ibstat,
ibv_devinfo -v or sysfs; the MLNX_OFED and mlx5_core versions), the network interfaces, free disk under the
engine's data root, and the clock offset against this machine. Each tool runs once; its output, read by its
one parser in ``repro.nodes.facts``, gives these checks and the host facts ``repro up`` records in the
provenance (``NodeReport.host``). Every probe fails soft: its value is None and its reason says why; the other
probes and nodes still report.

Two kinds of findings come out of it:

* problems - a node that cannot be reached or whose engine does not answer. Nothing can run there, so
  ``assess`` raises whatever the flags. A socket interface the run's env names (NCCL_SOCKET_IFNAME,
  GLOO_SOCKET_IFNAME) that a node lacks is one too: NCCL's bootstrap aborts there.
* deviations - the node works but differs from the manifest's ``expect`` (GPU model or memory, driver, IB
  presence or rate, node count), has processes on its GPUs already, or, for a multi-node RDMA target, has no
  mlx5 driver or a MOFED older than the containers' user space. A reproduction on different hardware is still
  worth running, so these are warnings; ``--strict`` makes them errors.

Both raise EnvironmentUnavailable, exit code 3 - the kit's "this environment is not the one needed" code -
after the table has been printed, so a script can tell "fix the cluster" (3) from "fix the command line" (2)
and still show the user every finding.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


from repro.errors import EnvironmentUnavailable
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Manifest
from repro.nodes.ssh import DEFAULT_TIMEOUT_S, Session, run_on_all
from repro.nodes.facts import (Gpu, GpuProcess, host_facts, node_script, parse_compute_apps, parse_df,
                               parse_docker_info, parse_ib, parse_nvidia_smi, parse_ofed_info,
                               parse_sections)

GPU_MEMORY_TOLERANCE = 0.05  # nvidia-smi reports usable MiB, a little under the marketed size


@dataclass(frozen=True)
class Probe:
    """One probe's outcome: a value, or None and the reason; ``detail`` qualifies the value."""

    value: Any = None
    reason: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class NodeReport:
    node: str
    address: str
    ssh: Probe
    docker: Probe = field(default_factory=Probe)
    gpus: Probe = field(default_factory=Probe)
    gpu_processes: Probe = field(default_factory=Probe)  # GpuProcess per process on the node's GPUs
    infiniband: Probe = field(default_factory=Probe)
    disk: Probe = field(default_factory=Probe)
    clock: Probe = field(default_factory=Probe)
    rdma_driver: Probe = field(default_factory=Probe)  # the host's MLNX_OFED / mlx5_core version
    interfaces: Probe = field(default_factory=Probe)  # network interface names (/sys/class/net)
    dataset: Probe = field(default_factory=Probe)  # detail: "FORMAT at PATH"; unchecked: all None
    host: dict[str, Any] = field(default_factory=dict, compare=False)  # facts.host_facts, for the provenance

    @property
    def reachable(self) -> bool:
        return self.ssh.reason is None


@dataclass(frozen=True)
class Deviation:
    node: str | None  # None: the inventory as a whole
    what: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.node or 'inventory'}: {self.what}: expected {self.expected}, found {self.found}"


def probe_script(node: Node, dataset: Dataset | None = None) -> str:
    """The one shell script run per node (``facts.node_script``), with the dataset check when asked."""
    return node_script(node.docker_host, dataset_section(dataset) if dataset else "")


# ---------------------------------------------------------------- the dataset

Dataset = tuple[str, str]  # (format, directory on every node)


def dataset_to_check(manifest: Manifest, hosts: Hosts, *, required: bool = True) -> Dataset | None:
    """The target's dataset format and the inventory's directory for it; None when it reads none, or
    (not ``required``) when the inventory names no directory for it."""
    fmt = manifest.dataset_format
    if not fmt or (not required and hosts.data_dir(fmt) is None):
        return None
    return fmt, hosts.need_data_dir(fmt, manifest.id)


def dataset_section(dataset: Dataset) -> str:
    """The probe script's section that checks the directory looks like its format."""
    from repro.spec.datasets import check_script

    return f"s dataset; {check_script(*dataset)}; e\n"


def dataset_probe(sec: Mapping[str, tuple[str, int]], dataset: Dataset | None) -> Probe:
    """What the dataset section found: a summary, or what is wrong and how to fix it."""
    from repro.spec.datasets import FORMATS, MISSING_FIX

    if dataset is None:
        return Probe()
    fmt, path = dataset
    where = f"{fmt} at {path}"
    if "dataset" not in sec:
        return Probe(reason=f"dataset {where}: no output from the probe", detail=where)
    text, rc = sec["dataset"]
    lines = text.strip().splitlines() or [f"exit status {rc}"]
    if rc != 0:
        fix = MISSING_FIX.format(fmt=fmt) if rc == 2 else FORMATS[fmt].fix
        return Probe(reason=f"dataset {where}: {lines[-1][:300]}; fix: {fix}", detail=where)
    return Probe(lines[-1], detail=where)


class _FirstLine:
    """An output stream that notes when the first complete line arrives."""

    def __init__(self) -> None:
        self.at: float | None = None

    def write(self, data: str) -> None:
        if self.at is None and "\n" in data:
            self.at = time.time()

    def flush(self) -> None:
        pass


def probe_node(session: Session, timeout: float = DEFAULT_TIMEOUT_S,
               dataset: Dataset | None = None) -> NodeReport:
    """Every probe on one node over one command on its open session; failures land in the reasons.

    The clock offset is taken NTP-style: the remote ``date`` is the script's first line, noted on arrival
    here, less half an SSH round trip measured without a shell. Delivery delays on a busy client make it
    good to some milliseconds: enough to catch clocks that are not synchronised, not to judge NTP.
    """
    node = session.node
    rtt = min(session.ping() for _ in range(3))  # the first answer after login can lag
    ssh = Probe(detail="local") if session.connect_s is None else \
        Probe(round(rtt * 1000, 1), detail=f"connect {session.connect_s * 1000:.0f} ms")
    first = _FirstLine()
    r = session.run(probe_script(node, dataset), hide="err", out_stream=first, warn=True, timeout=timeout,
                    in_stream=False)
    return node_report(node, r.stdout, ssh, first.at, f"exit {r.exited}", dataset, rtt=rtt)


def node_report(node: Node, stdout: str, ssh: Probe, arrival: float | None, exited: str,
                dataset: Dataset | None = None, *, rtt: float = 0.0) -> NodeReport:
    """A node's report from the probe script's output (``arrival``: when its first line, the node's
    ``date``, arrived here), however the script reached the node: SSH, or a Slurm job step."""
    head, _, rest = stdout.partition("\n")
    try:
        clock = Probe(float(head) - (arrival or time.time()) + rtt / 2,
                      detail="remote date - arrival + rtt/2" if rtt else "remote date - arrival")
    except ValueError:
        clock = Probe(reason=f"clock: date printed {head.strip()[:60]!r}")
    sections = parse_sections(rest)
    return NodeReport(node.name, node.address, ssh, clock=clock, dataset=dataset_probe(sections, dataset),
                      host=host_facts(sections, exited), **_from_sections(sections))


def _from_sections(sec: Mapping[str, tuple[str, int]]) -> dict[str, Probe]:
    """The probes' values from the script's sections, each failing on its own."""
    def failed(name: str) -> str | None:
        if name not in sec:
            return "no output from the probe"
        text, rc = sec[name]
        return None if rc == 0 else (text.strip().splitlines() or [f"exit status {rc}"])[-1][:200]

    def parsed(name: str, parse: Any, **kw: Any) -> Probe:
        why = failed(name)
        try:
            return Probe(reason=why) if why else Probe(parse(sec[name][0]), **kw)
        except ValueError as e:
            return Probe(reason=str(e)[:200])

    docker = parsed("docker", parse_docker_info)
    out = {"docker": docker if docker.reason else Probe(docker.value.version, detail=docker.value.root),
           "disk": parsed("df", parse_df)}
    out["gpus"] = (Probe((), detail="no nvidia-smi") if sec.get("gpus", ("", 0))[1] == 127
                   else parsed("gpus", parse_nvidia_smi))
    out["gpu_processes"] = (Probe((), detail="no nvidia-smi") if sec.get("gpu_apps", ("", 0))[1] == 127
                            else parsed("gpu_apps", parse_compute_apps))
    out["infiniband"] = (Probe((), detail="no /dev/infiniband") if failed("ibdev")
                         else parsed("ib", parse_ib, detail="/dev/infiniband"))
    out["rdma_driver"] = _rdma_driver(sec)
    out["interfaces"] = parsed("netifs", lambda t: tuple(sorted(t.split())))
    return {k: Probe(reason=f"{k}: {v.reason}") if v.reason else v for k, v in out.items()}


def run_preflight(nodes: Sequence[Node], *, accept_new_host_keys: bool = False,
                  timeout: float = DEFAULT_TIMEOUT_S, dataset: Dataset | None = None) -> list[NodeReport]:
    """Probe every node in parallel; a node that cannot be reached gets a row with only its SSH error.
    ``dataset``: also check on every node that the directory looks like that format."""
    results = run_on_all(nodes, lambda s: probe_node(s, timeout, dataset), timeout=timeout,
                         accept_new_host_keys=accept_new_host_keys)
    return [r if isinstance(r := results[n.name], NodeReport) else
            NodeReport(n.name, n.address, Probe(reason=str(r) + (f"; hint: {r.hint}" if r.hint else "")))
            for n in nodes]


# ---------------------------------------------------------------- comparison with the manifest

def _norm(model: str) -> str:
    return re.sub(r"^(nvidia|tesla)\s+", "", model.strip().lower())


def compare(reports: Sequence[NodeReport], expect: Mapping[str, Any], inventory_size: int) -> list[Deviation]:
    """Every difference between what the nodes offer and the publication's ``expect``."""
    out: list[Deviation] = []
    if "nodes" in expect and inventory_size < expect["nodes"]:
        out.append(Deviation(None, "nodes", str(expect["nodes"]), f"{inventory_size} in the inventory"))
    for r in reports:
        if not r.reachable:
            continue
        out += _compare_gpus(r, expect) + _compare_ib(r, expect) + _compare_busy(r)
    return out


def _compare_busy(r: NodeReport) -> list[Deviation]:
    """Processes already on the node's GPUs: they share its memory and compute with the run."""
    procs: tuple[GpuProcess, ...] = r.gpu_processes.value or ()
    if not procs:
        return []
    found = "; ".join(f"pid {p.pid if p.pid is not None else '?'} {p.name}"
                      f"{f' ({p.used_mib} MiB)' if p.used_mib is not None else ''} on {p.gpu_uuid}"
                      for p in procs)
    return [Deviation(r.node, "gpus_in_use", "no other process on the GPUs",
                      f"{len(procs)} process(es): {found}")]


def _compare_gpus(r: NodeReport, expect: Mapping[str, Any]) -> list[Deviation]:
    wanted = [k for k in ("gpu_model", "gpu_memory_gb", "gpus_per_node", "driver") if k in expect]
    if not wanted:
        return []
    gpus: tuple[Gpu, ...] | None = r.gpus.value
    if not gpus:
        what = "gpu_model" if "gpu_model" in wanted else wanted[0]
        return [Deviation(r.node, what, str(expect[what]),
                          "no GPU" if gpus == () else "unknown (the GPU probe failed)")]
    out = []
    if "gpus_per_node" in expect and len(gpus) < expect["gpus_per_node"]:
        out.append(Deviation(r.node, "gpus_per_node", str(expect["gpus_per_node"]), str(len(gpus))))
    if "gpu_model" in expect and any(_norm(g.name) != _norm(expect["gpu_model"]) for g in gpus):
        out.append(Deviation(r.node, "gpu_model", expect["gpu_model"],
                             ", ".join(sorted({g.name for g in gpus}))))
    if "gpu_memory_gb" in expect:
        want = float(expect["gpu_memory_gb"])
        off = sorted({g.memory_mib for g in gpus
                      if abs(g.memory_mib / 1024 - want) > want * GPU_MEMORY_TOLERANCE})
        if off:
            out.append(Deviation(r.node, "gpu_memory_gb", f"{want:g}", ", ".join(f"{m} MiB" for m in off)))
    if "driver" in expect:
        want = str(expect["driver"])
        drivers = sorted({g.driver for g in gpus})
        if any(d != want and not d.startswith(want + ".") for d in drivers):
            out.append(Deviation(r.node, "driver", want, ", ".join(drivers)))
    return out


def _compare_ib(r: NodeReport, expect: Mapping[str, Any]) -> list[Deviation]:
    kind = expect.get("interconnect")
    if kind not in ("infiniband", "roce"):
        return []
    if r.infiniband.value is None:
        return [Deviation(r.node, "interconnect", kind, "unknown (the InfiniBand probe failed)")]
    layer = "infiniband" if kind == "infiniband" else "ethernet"
    ports = [p for p in r.infiniband.value if p.active and (p.link_layer or "").lower() == layer]
    if not ports:
        found = "no /dev/infiniband" if not r.infiniband.value else \
            f"no active {'InfiniBand' if layer == 'infiniband' else 'RoCE'} port"
        return [Deviation(r.node, "interconnect", kind, found)]
    best = max((p.rate_gbps or 0) for p in ports)
    if "ib_rate_gbps" in expect and best < float(expect["ib_rate_gbps"]):
        return [Deviation(r.node, "ib_rate_gbps", f"{expect['ib_rate_gbps']:g}",
                          f"{best:g}" if best else "unknown")]
    return []


# ---------------------------------------------------------------- RDMA driver and network interfaces

#: The variables naming the interfaces NCCL's and Gloo's sockets use; sites set them in the hosts file's env.
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _rdma_driver(sec: Mapping[str, tuple[str, int]]) -> Probe:
    """The host side of RDMA: MLNX_OFED's version (``ofed_info -s``) and the mlx5_core module's."""
    if "ofed" not in sec or "mlx5" not in sec:
        return Probe(reason="no output from the probe")
    (ofed_text, ofed_rc), (mlx5_text, mlx5_rc) = sec["ofed"], sec["mlx5"]
    try:
        ofed = parse_ofed_info(ofed_text) if ofed_rc == 0 else None
    except ValueError as e:
        return Probe(reason=str(e))
    mlx5 = mlx5_text.strip() or None if mlx5_rc == 0 else None
    return Probe({"ofed": ofed, "mlx5_core": mlx5}, detail=None if mlx5 else "mlx5_core not loaded")


def version_key(version: str) -> tuple[int, ...]:
    """``5.0-2.1.8.0`` -> (5, 0, 2, 1, 8, 0); numbers until a part that is not one (``5.4-rdmacore36.0``)."""
    out = []
    for part in re.split(r"[.-]", version):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def host_mofed(report: NodeReport) -> str | None:
    """The node's kernel-side MOFED: ``ofed_info``, else a versioned mlx5_core; None for an inbox driver."""
    drv = report.rdma_driver.value or {}
    mlx5 = drv.get("mlx5_core")
    return drv.get("ofed") or (mlx5 if mlx5 and version_key(mlx5) else None)


def container_mofed(manifest: Any, image_env: Mapping[str, str] | None = None) -> str | None:
    """The MOFED user space the containers carry: the pinned bundle (``mlnx-ofed``), or what the image
    declares in ``MOFED_VERSION`` (NGC images set it, e.g. ``4.6-1.0.1``); None where unknown or inbox."""
    strategy = manifest.rdma_strategy
    if strategy == "mlnx-ofed":
        return manifest.mofed_version
    if strategy == "image":
        return (image_env or {}).get("MOFED_VERSION") or None
    return None


def image_env(attrs: Mapping[str, Any]) -> dict[str, str]:
    """An image's ``ENV`` from its inspect document (``Config.Env``: ``NAME=value`` strings)."""
    pairs = ((attrs.get("Config") or {}).get("Env") or [])
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def compare_rdma(reports: Sequence[NodeReport], manifest: Any, *, multi_node: bool,
                 image_env: Mapping[str, str] | None = None) -> list[Deviation]:
    """The host side of a multi-node RDMA target on every node: an mlx5 driver, and a MOFED at least as new as
    the containers' user space (the user space must not be newer than the kernel side it talks to)."""
    strategy = manifest.rdma_strategy
    if strategy is None or not multi_node:
        return []
    want = container_mofed(manifest, image_env)
    out = []
    for r in reports:
        if not r.reachable:
            continue
        if r.rdma_driver.value is None:
            out.append(Deviation(r.node, "rdma_driver", "mlx5_core", f"unknown ({r.rdma_driver.reason})"))
            continue
        if not r.rdma_driver.value.get("mlx5_core") and not r.rdma_driver.value.get("ofed"):
            out.append(Deviation(r.node, "rdma_driver", "mlx5_core loaded", "mlx5_core not loaded"))
            continue
        host = host_mofed(r)
        if want and host and version_key(host) < version_key(want):
            out.append(Deviation(r.node, "mofed", f">= {want} (the containers' MOFED user space, {strategy})",
                                 f"{host} on the host"))
        elif want and not host and strategy == "mlnx-ofed":
            out.append(Deviation(r.node, "mofed", f">= {want} (the containers' MOFED user space, {strategy})",
                                 "the kernel's inbox mlx5 driver, no MLNX_OFED"))
    return out


def ifname_matches(var: str, spec: str, interfaces: Sequence[str]) -> list[str]:
    """The interfaces ``var=spec`` lets the library use.

    NCCL_SOCKET_IFNAME is a comma-separated list of name prefixes; ``=`` first makes them exact names, and
    ``^`` before that excludes them instead (``eth``, ``=eth0``, ``^docker``, ``^=docker0``).
    GLOO_SOCKET_IFNAME is a comma-separated list of exact names, every one of which is used.
    """
    names = [n for n in spec.split(",") if n]
    if var == "GLOO_SOCKET_IFNAME":
        return [n for n in names if n in interfaces]
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    prefixes = [p.partition(":")[0] for p in (body[1:] if exact else body).split(",") if p]
    hit = (lambda i: i in prefixes) if exact else (lambda i: any(i.startswith(p) for p in prefixes))
    return [i for i in interfaces if hit(i) != exclude]


def interface_problems(reports: Sequence[NodeReport], envs: Sequence[Mapping[str, str]]) -> list[str]:
    """Nodes on which a socket interface the run's env names (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) is
    missing: NCCL's bootstrap would abort there ("no socket interface found"), and Gloo would not start."""
    wanted = sorted({(var, env[var]) for env in envs for var in SOCKET_IFNAME_VARS if env.get(var)})
    out = []
    for r in reports:
        if not r.reachable or not wanted:
            continue
        have: tuple[str, ...] | None = r.interfaces.value
        if have is None:
            out.append(f"{r.node}: cannot check {', '.join(f'{v}={s}' for v, s in wanted)}: "
                       f"{r.interfaces.reason}")
            continue
        for var, spec in wanted:
            used = ifname_matches(var, spec, have)
            missing = ([n for n in spec.split(",") if n and n not in have] if var == "GLOO_SOCKET_IFNAME"
                       else [])
            if used and not missing:
                continue
            what = f"names {', '.join(missing)}, not there" if used else "matches no interface there"
            out.append(f"{r.node}: {var}={spec} {what} (it has {', '.join(have) or 'none'}); "
                       f"set {var} in the hosts file's env to this cluster's interface")
    return out


def site_checks(reports: Sequence[NodeReport], manifest: Any, site_env: Mapping[str, str],
                cells: Sequence[Any] = ()) -> tuple[list[Deviation], list[str]]:
    """The checks a target's cells and the site's env add: RDMA host side (deviations) and the socket
    interfaces the env names (problems: a run cannot start without them). No target: the site's env alone."""
    if manifest is None:
        return [], interface_problems(reports, [site_env])
    envs = [manifest.launch.env_for(c, site_env) for c in cells]
    return (compare_rdma(reports, manifest, multi_node=any(c.nodes > 1 for c in cells)),
            interface_problems(reports, envs))


def problems(reports: Sequence[NodeReport]) -> list[str]:
    """What stops a run outright: nodes not reached, engines not answering, a dataset not there."""
    return [f"{r.node}: {r.ssh.reason or r.docker.reason or r.dataset.reason}" for r in reports
            if r.ssh.reason or r.docker.reason or r.dataset.reason]


class PreflightFailed(EnvironmentUnavailable):
    """Nodes unusable, or (under --strict) different from the publication's hardware."""


def assess(reports: Sequence[NodeReport], deviations: Sequence[Deviation], *, strict: bool,
           blocking: Sequence[str] = ()) -> None:
    """Raise PreflightFailed (exit 3) for problems (``blocking``: the site's, such as a missing interface),
    and for deviations under ``strict``; else return."""
    bad = {line.partition(":")[0] for line in [*problems(reports), *blocking]}  # a line names its node first
    if bad:
        raise PreflightFailed(f"{len(bad)} of {len(reports)} node(s) cannot run a target",
                              hint="see the notes under the table")
    if strict and deviations:
        raise PreflightFailed(f"{len(deviations)} deviation(s) from the target's expected hardware "
                              "(--strict)", hint="run without --strict to treat them as warnings")
