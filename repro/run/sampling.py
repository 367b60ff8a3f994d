"""The telemetry sampler of each node of a cell, as a container beside the cell's (repro.run.launch).

The sampler (repro/nodes/sampler.py) runs in the cell's own image, through the node's own engine, as the
cell's ranks do: created with them, started just before them, and stopped and removed with them on every way
out (the end, a failure, the deadline, Ctrl-C). It carries the run's label, so ``repro clean`` finds one a
killed kit left. It sees the host's processes (``--pid=host``, to tell which container a GPU process belongs
to) and the GPUs the node's rank uses (the NVIDIA runtime's ``utility`` capability gives it nvidia-smi),
and nothing else: no network, 256 MiB of memory. Its lines stream to ``telemetry-<node>.txt`` in the
repeat's directory, bounded; telemetry never fails a cell: a sampler that cannot start is a warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from repro import labels
from repro.spec.hosts import Node
from repro.nodes.telemetry import CONTAINERS, MAX_BYTES, node_file, sampler_argv, write_repeat_summary

log = logging.getLogger(__name__)
PROBE = "telemetry"
SLACK = 64 << 10  # the file may hold this much beyond the sampler's own cap (the kit's first line)


def sampler_options(rank_options: Mapping[str, Any], run_id: str, cell_key: str,
                    max_s: float) -> dict[str, Any]:
    """Docker SDK options of a node's sampler container, from its rank's (plain data, as the plan's)."""
    argv = sampler_argv(max_s)
    opts: dict[str, Any] = {
        "entrypoint": argv[:1], "command": argv[1:], "network_mode": "none", "pid_mode": "host",
        "mem_limit": "256m", "environment": {"NVIDIA_DRIVER_CAPABILITIES": "utility"},
        "labels": {**labels.probe_labels(PROBE, run_id), labels.CELL: cell_key},
    }
    if "device_requests" in rank_options:
        opts["device_requests"] = [{**d, "Capabilities": [["gpu", "utility"]]}
                                   for d in rank_options["device_requests"]]
    return opts


class Samplers:
    """One sampler container per node of a cell, each through a client of its own (its own SSH connection:
    its log stream never shares the cell's): create, start, stop and remove; never raises."""

    def __init__(self, log_dir: Path, run_id: str, cell_key: str, max_s: float) -> None:
        self.log_dir, self.run_id, self.cell_key, self.max_s = log_dir, run_id, cell_key, max_s
        self.containers: dict[str, Any] = {}
        self.clients: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.ours: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.stopped = False

    def create(self, wanted: Sequence[tuple[Node, Mapping[str, Any], Sequence[str]]], image: str) -> None:
        """A sampler for each (node, its rank's container options, the ids of the cell's containers there)."""
        with ThreadPoolExecutor(max(1, len(wanted))) as pool:
            list(pool.map(lambda w: self._create_one(*w, image), wanted))

    def _create_one(self, node: Node, rank_options: Mapping[str, Any], rank_ids: Sequence[str],
                    image: str) -> None:
        from docker.types import DeviceRequest

        from repro.images.engine import node_client

        opts = sampler_options(rank_options, self.run_id, self.cell_key, self.max_s)
        command = opts.pop("command")
        opts["device_requests"] = [DeviceRequest(driver=d["Driver"], device_ids=d["DeviceIDs"],
                                                 capabilities=d["Capabilities"])
                                   for d in opts.get("device_requests", [])] or None
        try:
            client = node_client(node)
            with self.lock:
                self.clients.append(client)
            name = f"repro-{self.run_id}-{self.cell_key}-telemetry-{node.name}"
            container = client.containers.create(image, command, name=name, detach=True, **opts)
        except Exception as e:  # noqa: BLE001 - telemetry is evidence, never a reason to stop a cell
            log.warning("no telemetry on %s: the sampler container was not created: %s", node.name, e)
            return
        with self.lock:
            if self.stopped:  # the cell ended while this was being created
                _remove(node.name, container)
                return
            self.containers[node.name], self.ours[node.name] = container, list(rank_ids)

    def start(self) -> None:
        for node, container in self.containers.items():
            try:
                container.start()
            except Exception as e:  # noqa: BLE001
                log.warning("no telemetry on %s: the sampler did not start: %s", node, e)
                continue
            t = threading.Thread(target=self._follow, args=(node, container), daemon=True,
                                 name=f"telemetry-{node}")
            t.start()
            self.threads.append(t)

    def _follow(self, node: str, container: Any) -> None:
        path = node_file(self.log_dir, node)
        written = 0
        try:
            with path.open("wb") as out:
                head = f"{CONTAINERS} {' '.join(self.ours.get(node, []))}\n".encode()
                out.write(head)
                for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    if written + len(chunk) > MAX_BYTES + SLACK:
                        break
                    out.write(chunk)
                    written += len(chunk)
        except Exception as e:  # noqa: BLE001 - a dropped node: what was written stays
            log.warning("telemetry of %s ended early: %s", node, e)

    def stop(self) -> None:
        """Kill and remove every sampler, wait for their files, and write the repeat's summary."""
        with self.lock:
            self.stopped = True
            containers, self.containers = self.containers, {}
        for node, container in containers.items():
            _remove(node, container)
        for t in self.threads:
            t.join(timeout=10)
        for client in self.clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110 - a connection that is gone is closed
                pass
        self.threads, self.clients = [], []
        try:
            write_repeat_summary(self.log_dir)
        except (OSError, ValueError) as e:
            log.warning("the telemetry of %s could not be summarised: %s", self.log_dir, e)


def _remove(node: str, container: Any) -> None:
    try:
        container.remove(force=True)
    except Exception as e:  # noqa: BLE001 - report and go on; `repro clean` finds it by its label
        log.warning("the telemetry sampler on %s could not be removed: %s", node, e)


class TelemetryFiles:
    """Telemetry lines that arrive marked in a job step's output (the Slurm agent's ``##repro telemetry``),
    into each node's file of the repeat, bounded as the engine's are; ``close`` writes the summary."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.files: dict[str, Any] = {}
        self.sizes: dict[str, int] = {}
        self.closed = False

    def write(self, node: str, line: str) -> None:
        if self.closed:  # a line after the step's end: its file is written and summarised
            return
        if node not in self.files:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.files[node], self.sizes[node] = node_file(self.log_dir, node).open("w", encoding="utf-8"), 0
        data = line + "\n"
        if self.sizes[node] + len(data) <= MAX_BYTES + SLACK:
            self.files[node].write(data)
            self.sizes[node] += len(data)

    def close(self) -> None:
        self.closed = True
        for f in self.files.values():
            f.close()
        if self.files:
            try:
                write_repeat_summary(self.log_dir)
            except (OSError, ValueError) as e:
                log.warning("the telemetry of %s could not be summarised: %s", self.log_dir, e)
        self.files = {}
