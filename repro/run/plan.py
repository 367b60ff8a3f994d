"""The dry run of a reproduction: for every cell and node, the image, the container
options and the exact command, with ranks, master and host list filled in.

Pure functions only; ``repro plan`` prints what ``render_plan`` returns, and the
launch step starts containers from the same NodePlan objects.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from repro import labels
from repro.errors import UsageError
from repro.spec.hosts import Hosts, Node, load_hosts, local_hosts, placeholder_hosts
from repro.run.launchers import LAUNCHERS, NodeCommand, rdma_container_options
from repro.spec.manifest import Cell, Manifest
from repro.redact import redact_argv, redact_text


@dataclass(frozen=True)
class NodePlan:
    cell: Cell
    command: NodeCommand
    image: str
    container: Mapping[str, Any]  # Docker SDK ``containers.run`` keyword arguments


def container_options(manifest: Manifest, cell: Cell, cmd: NodeCommand,
                      data_dir: str | None) -> dict[str, Any]:
    c = manifest.launch.container
    rdma = rdma_container_options(manifest, cell)
    ulimits = {"memlock": -1, **c.get("ulimits", {}), **rdma.get("ulimits", {})}
    opts: dict[str, Any] = {
        "network_mode": "host",
        "ipc_mode": c.get("ipc", "host"),
        "ulimits": [{"name": k, "soft": v, "hard": v} for k, v in sorted(ulimits.items())],
        "environment": dict(cmd.env),
        "labels": labels.rank_labels(manifest.id, cell.key, cmd.rank),
    }
    if "shm_size" in c:
        opts["shm_size"] = c["shm_size"]
    if manifest.launch.workdir:
        opts["working_dir"] = manifest.launch.workdir
    if cmd.node.gpus != 0 and manifest.device == "GPU":  # a CPU target's container asks for no GPU
        opts["device_requests"] = [{"Driver": "nvidia",
                                    "DeviceIDs": [str(i) for i in range(cell.gpus_per_node)],
                                    "Capabilities": [["gpu"]]}]
    devices = [f"{d}:{d}" for d in c.get("devices", [])] + rdma.get("devices", [])
    if devices:
        opts["devices"] = list(dict.fromkeys(devices))
    if c.get("cap_add") or rdma.get("cap_add"):
        opts["cap_add"] = sorted({*c.get("cap_add", []), *rdma.get("cap_add", [])})
    if c.get("privileged"):
        opts["privileged"] = True
    mounts = [(data_dir if m["source"] == "{data}" else m["source"], m["target"], m.get("read_only", False))
              for m in c.get("mounts", [])]
    if any(src is None for src, _, _ in mounts):
        raise UsageError(f"{manifest.id} mounts the dataset ({{data}}) but no data directory is known",
                         hint="give a hosts file with `data: /path/to/dataset` "
                              "(repro plan TARGET --hosts FILE)")
    if mounts:
        opts["volumes"] = {src: {"bind": dst, "mode": "ro" if ro else "rw"} for src, dst, ro in mounts}
    return opts


def plan_cell(manifest: Manifest, cell: Cell, hosts: Hosts) -> list[NodePlan]:
    nodes: Sequence[Node] = hosts.take(cell.nodes)
    launcher = LAUNCHERS.get(manifest.launch.kind)()
    image = manifest.image_reference
    fmt = manifest.dataset_format
    data_dir = hosts.need_data_dir(fmt, manifest.id) if fmt else None
    return [NodePlan(cell, cmd, image, container_options(manifest, cell, cmd, data_dir))
            for cmd in launcher.render(manifest.launch, cell, nodes,
                                       manifest.launch.env_for(cell, hosts.env))]


def plan_hosts(manifest: Manifest, cells: Sequence[Cell], hosts_file: Path | None) -> Hosts:
    """The inventory a dry run shows: the hosts file's; without one, this machine when every cell fits
    on one node (as ``repro up`` would run it), else placeholder nodes; a placeholder dataset path either
    way."""
    if hosts_file is not None:
        return load_hosts(hosts_file)
    formats = [manifest.dataset_format] if manifest.dataset_format else []
    need = max(c.nodes for c in cells)
    stand_in = placeholder_hosts(need, formats)
    return replace(stand_in, nodes=local_hosts().nodes) if need == 1 else stand_in


def _inventory_lines(manifest: Manifest, hosts: Hosts) -> list[str]:
    lines = []
    if hosts.placeholder and hosts.nodes[0].local:
        lines.append("nodes: this machine (no --hosts file)")
    elif hosts.placeholder:
        lines.append(f"nodes: placeholders node1..node{len(hosts.nodes)} (no --hosts file); "
                     "--hosts FILE shows the real names and addresses")
    fmt = manifest.dataset_format
    if fmt:
        where = hosts.data_dir(fmt)
        lines.append(f"dataset: {fmt} at {where}" + (" (a placeholder: the hosts file's `data:` names it)"
                                                      if hosts.placeholder else " on every node"))
    elif manifest.synthetic_data:
        lines.append(f"dataset: none: {manifest.synthetic_data}")
    return lines


def docker_run_flags(opts: Mapping[str, Any]) -> list[str]:
    """The container options as the equivalent ``docker run`` flags, for people to read."""
    flags = [f"--network={opts['network_mode']}", f"--ipc={opts['ipc_mode']}"]
    if "shm_size" in opts:
        flags.append(f"--shm-size={opts['shm_size']}")
    flags += [f"--ulimit={u['name']}={u['soft']}" for u in opts["ulimits"]]
    for req in opts.get("device_requests", []):
        flags.append(f"--gpus=\"device={','.join(req['DeviceIDs'])}\"")
    flags += [f"--device={d}" for d in opts.get("devices", [])]
    flags += [f"--cap-add={c}" for c in opts.get("cap_add", [])]
    if opts.get("privileged"):
        flags.append("--privileged")
    flags += [f"-v={src}:{m['bind']}:{m['mode']}" for src, m in opts.get("volumes", {}).items()]
    if "working_dir" in opts:
        flags.append(f"-w={opts['working_dir']}")
    flags += [f"-e={k}={v}" for k, v in sorted(opts["environment"].items())]
    return flags


#: longer files a launcher writes into the containers are shown by their first lines only
FILE_LINES_SHOWN = 16


def _ps_placement(manifest: Manifest, cell: Cell) -> str:
    ranks = manifest.launch.ps_ranks(cell)
    if ranks == tuple(range(cell.nodes)):
        return (f"parameter servers: one beside the worker on every node ({cell.nodes}), each without GPUs "
                "(CUDA_VISIBLE_DEVICES= empty)")
    return (f"parameter servers: {len(ranks)} of {cell.nodes} nodes, on rank(s) {', '.join(map(str, ranks))} "
            "in ps task order (launch.parameter_servers); a worker on every node; each ps without GPUs "
            "(CUDA_VISIBLE_DEVICES= empty)")


#: a cell with more ranks than this shows its first two and its last, and counts the rest (--all: every rank);
#: with thousands of nodes each rank's command holds every host, so every rank would print megabytes
RANKS_SHOWN = 16


def render_plan(manifest: Manifest, hosts: Hosts, cells: Sequence[Cell], *, all_ranks: bool = False) -> str:
    """The human-readable plan: exact-text tested, printed by ``repro plan``."""
    return "".join(plan_chunks(manifest, hosts, cells, all_ranks=all_ranks))


def plan_chunks(manifest: Manifest, hosts: Hosts, cells: Sequence[Cell], *,
                all_ranks: bool = False, runtime: str = "docker") -> Iterator[str]:
    """``render_plan`` a cell at a time, so that what is printed need not be held (a cell's ranks are).
    What the inventory lacks for any cell (nodes, the dataset) is an error before anything is yielded.
    ``runtime``: what starts the containers; other than ``docker``, each rank shows its command and where the
    scheduler's text shows the job step that starts it, not a ``docker run`` line."""
    for cell in cells:
        hosts.take(cell.nodes)
    if manifest.dataset_format:
        hosts.need_data_dir(manifest.dataset_format, manifest.id)
    yield "\n".join([f"target {manifest.id}: {manifest.title}",
                     f"launcher {manifest.launch.kind}, {len(cells)} cells x {manifest.repeats} repeats",
                     *_inventory_lines(manifest, hosts)]) + "\n"
    for cell in cells:
        yield "\n" + "\n".join(_cell_lines(manifest, hosts, cell, all_ranks, runtime)) + "\n"


def _cell_lines(manifest: Manifest, hosts: Hosts, cell: Cell, all_ranks: bool, runtime: str) -> list[str]:
    plans = plan_cell(manifest, cell, hosts)
    unit = manifest.device
    lines = [f"cell {cell.key}: {cell.nodes} node(s) x {cell.gpus_per_node} {unit}(s) = "
             f"{cell.gpus} {unit}(s), "
             f"{cell.precision}, batch {cell.batch_size}/{unit}",
             f"  image: {plans[0].image}"]
    if manifest.launch.kind == "tf-ps":
        lines.append(f"  {_ps_placement(manifest, cell)}")
    shown = plans if all_ranks or len(plans) <= RANKS_SHOWN else [*plans[:2], plans[-1]]
    for p in shown:
        if p is plans[-1] and len(shown) < len(plans):
            lines.append(_ranks_left_out(plans[2:-1]))
        lines += _rank_lines(p, runtime, manifest.launch.kind == "mpi")
    return lines


def _ranks_left_out(plans: Sequence[NodePlan]) -> str:
    first, last = plans[0].command, plans[-1].command
    roles = Counter(p.command.role for p in plans)
    counted = ", ".join(f"{n} {r}" for r, n in roles.items())
    return (f"  ... {len(plans)} more ranks, {first.rank} to {last.rank} on {first.node.name} to "
            f"{last.node.name} ({counted}), not shown: `repro plan --all` shows every rank")


def _rank_lines(p: NodePlan, runtime: str = "docker", mpi: bool = False) -> list[str]:
    c = p.command
    lines = [f"  rank {c.rank} on {c.node.name} ({c.node.address}) [{c.role}]"]
    if runtime != "docker" and mpi:  # srun --mpi starts every rank: no mpirun, no sshd runs under Slurm
        return [*lines, f"    {runtime}: its tasks are srun's, in the cell's job step (below)"]
    lines += [f"    docker run {shlex.join(redact_argv(docker_run_flags(p.container)))} IMAGE"
              if runtime == "docker" else f"    {runtime}: in the cell's job step (below)",
              f"    $ {shlex.join(redact_argv(c.command))}"]
    for path, text in c.files.items():
        body = text.splitlines()
        if len(body) > FILE_LINES_SHOWN:  # a program the kit ships (tf-ps's runner): its first lines
            body = [*body[:2], f"... ({len(body)} lines)"]
        lines.append(f"    file {path}:")
        lines += [f"      {redact_text(ln)}" for ln in body]
    return lines
