"""Launch one cell on all its nodes: one container per node, started together.

Containers are created on every node first (nothing runs yet), per-run files are
copied in (the MPI hostfile, keys, sshd configuration and session environment), then
they are started as close together as threads allow. Each container's output streams
to its own log file as it is produced: the engine buffers container output, so a slow
reader never blocks the workload.
The first container to fail, a node that drops, or the deadline stops the cell on
every node, and every container this call created is removed on every path out,
Ctrl-C included. The result is one record per node.
"""

from __future__ import annotations

import io
import logging
import queue
import signal
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
from docker.types import DeviceRequest, Ulimit

from repro import labels
from repro.errors import EnvironmentUnavailable, RunFailed
from repro.layout import log_name
from repro.run.launchers.base import IB_DEVICE_DIR, rdma_container_options
from repro.run.launchers.mpi import SESSION_ENV, session_environment
from repro.run.cell import CellFailed, CellJob, NodeResult, mpi_files, now
from repro.run.plan import NodePlan, plan_cell
from repro.run.sampling import Samplers
from repro.throwaway import throwaway

log = logging.getLogger(__name__)

ContainerEvent = tuple[str, str, str]  # (kind, node name, text): started | line | exited | error
TAIL_LINES = 20
READY_TIMEOUT_S = 60


def _sdk_options(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's plain-data container options as Docker SDK objects."""
    out = dict(opts)
    out["ulimits"] = [Ulimit(**u) for u in opts.get("ulimits", [])]
    if "device_requests" in opts:
        out["device_requests"] = [DeviceRequest(driver=d["Driver"], device_ids=d["DeviceIDs"],
                                                capabilities=d["Capabilities"])
                                  for d in opts["device_requests"]]
    return out


def _tar(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(Path(p).parent) for p in files})
        for d in dirs:
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


RDMA_CHECK = ("ibv_devinfo",)
RDMA_CHECK_TIMEOUT_S = 120


def rdma_check_problem(exit_code: int, output: str) -> str | None:
    """What ``ibv_devinfo`` run in a cell's container says about RDMA there; None when it sees an active
    port."""
    from repro.nodes.facts import parse_ibv_devinfo

    ports = parse_ibv_devinfo(output)
    if any(p.active for p in ports):
        return None
    if ports:
        return ("ibv_devinfo sees no active port: "
                + ", ".join(f"{p.device}:{p.port} {p.state}" for p in ports))
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()),
                f"exit status {exit_code}")
    if exit_code == 127:
        return f"ibv_devinfo is not in the image ({last[:200]})"
    return f"ibv_devinfo sees no RDMA device ({last[:200]})"


def _rdma_hint(strategy: str | None) -> str:
    fixes = {"image": "the image's own MOFED user space must not be newer than the host's MOFED "
                      "(`repro preflight TARGET --hosts FILE` compares them)",
             "mlnx-ofed": "the image needs the pinned MLNX_OFED user space "
                          "and the host a MOFED at least as new",
             "inbox": "the image needs rdma-core's providers (ibverbs-providers) for the host's HCA"}
    return (f"ports must be Active on the host (ibstat) and {IB_DEVICE_DIR} present; "
            + fixes.get(strategy or "", "see the target's RDMA settings"))


def _start_hint(error: str) -> str:
    if IB_DEVICE_DIR in error:
        return f" (the node has no {IB_DEVICE_DIR}: no InfiniBand/RoCE device or driver there)"
    if "rlimit type 8" in error:
        return (" (this engine may not raise the locked-memory limit: "
                "set launch.container.ulimits.memlock to what the node allows, "
                "`ulimit -Hl`, in the manifest)")
    if "could not select device driver" in error:
        return " (no NVIDIA container runtime on the node: a CPU node needs `gpus: 0` in the hosts file)"
    return ""


@contextmanager
def _shielded() -> Iterator[None]:
    """Ignore Ctrl-C while cleaning up, so a second Ctrl-C never leaves containers behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class CellRun:
    """The containers of one cell on its nodes, from creation to removal."""

    def __init__(self, job: CellJob) -> None:
        manifest, cell, log_dir = job.manifest, job.cell, job.log_dir
        self.manifest, self.cell, self.run_id = manifest, cell, job.run_id
        self.plans = plan_cell(manifest, cell, job.hosts)
        self.clients: Mapping[str, docker.DockerClient] = job.clients
        self.on_event = job.emit
        self.image = job.image or self.plans[0].image
        self.containers: dict[str, Any] = {}
        self.events: queue.Queue[ContainerEvent] = queue.Queue()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.samplers = Samplers(log_dir, job.run_id, cell.key, manifest.launch.timeout_s)
        self.log_writer = job.sink
        self.results = {p.command.node.name: NodeResult(
            p.command.node.name, p.command.node.address, p.command.rank, p.command.role, p.command.command,
            str(log_dir / log_name(p.command.rank, p.command.node.name))) for p in self.plans}

    # -- creation -------------------------------------------------------------------------
    def _create_one(self, plan: NodePlan, files: Mapping[str, tuple[bytes, int]]) -> None:
        node = plan.command.node
        opts = _sdk_options(plan.container)
        opts["labels"] = {**opts["labels"], labels.RUN: self.run_id}
        name = f"repro-{self.run_id}-{self.cell.key}-rank{plan.command.rank}"
        client = self.clients[node.name]
        try:
            container = client.containers.create(self.image, list(plan.command.command), name=name,
                                                 detach=True, **opts)
        except docker.errors.ImageNotFound as e:
            raise EnvironmentUnavailable(
                f"image {self.image} is not on node {node.name}",
                hint="`repro images TARGET --hosts FILE` puts it on every node") from e
        self.containers[node.name] = container
        self.results[node.name].container = container.id[:12]
        extra = {path: (text.encode(), 0o644) for path, text in plan.command.files.items()}
        if plan.command.role == "mpi-sshd":  # the sessions of this sshd get the container's environment
            extra[SESSION_ENV] = (session_environment(container.attrs["Config"]["Env"] or []).encode(), 0o600)
        if files or extra:
            container.put_archive("/", _tar({**files, **extra}))

    def create(self) -> None:
        files: dict[str, tuple[bytes, int]] = {}
        if self.manifest.launch.kind == "mpi":
            from repro.run.launchers.mpi import DEFAULT_SSH_PORT

            files = mpi_files(self.plans, int(self.manifest.launch.mpi.get("ssh_port", DEFAULT_SSH_PORT)))
        with ThreadPoolExecutor(len(self.plans)) as pool:
            futures = {p.command.node.name: pool.submit(self._create_one, p, files) for p in self.plans}
        errors = {n: f.exception() for n, f in futures.items() if f.exception() is not None}
        for name, err in errors.items():
            self.results[name].error = f"could not create the container: {err}"
        if errors:
            first = next(iter(errors.values()))
            if isinstance(first, EnvironmentUnavailable) and len(errors) == len(self.plans):
                raise first
            raise CellFailed(self.cell, list(self.results.values()))
        nodes = {p.command.node.name: p for p in self.plans}  # one telemetry sampler per node
        self.samplers.create([(p.command.node, p.container, [self.containers[name].id])
                              for name, p in nodes.items()], self.image)

    def check_rdma(self) -> None:
        """A multi-node RDMA cell: ``ibv_devinfo`` in a container like rank 0's (the same image,
        entrypoint and options, devices included) must see an active port before training starts on any
        node."""
        if not rdma_container_options(self.manifest, self.cell):
            return
        plan = self.plans[0]
        node = plan.command.node.name
        opts = _sdk_options(plan.container)
        try:
            with throwaway(self.clients[node], self.image, RDMA_CHECK, probe="rdma", run_id=self.run_id,
                           detach=True, **opts) as container:
                container.start()
                code = int(container.wait(timeout=RDMA_CHECK_TIMEOUT_S).get("StatusCode", -1))
                output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            problem = rdma_check_problem(code, output)
        except docker.errors.DockerException as e:
            text = getattr(e, "explanation", None) or str(e)
            problem = f"the RDMA check container did not run: {text}" + _start_hint(str(e))
        except Exception as e:  # noqa: BLE001 - a timeout or a dropped node: the check did not pass
            problem = f"the RDMA check did not finish: {type(e).__name__}: {e}"
        if problem:
            raise EnvironmentUnavailable(f"cell {self.cell.key}: RDMA is not usable in the container "
                                         f"on {node}: {problem}",
                                         hint=_rdma_hint(self.manifest.rdma_strategy))
        log.info("cell %s: ibv_devinfo in the container on %s sees an active port", self.cell.key, node)

    # -- running --------------------------------------------------------------------------
    def _follow(self, name: str) -> None:
        """Copy a container's output to its log file as it comes; report lines and the exit."""
        container, result = self.containers[name], self.results[name]
        tail: list[str] = []
        pending = b""
        try:
            out = self.log_writer(result.rank, name)
            result.log = str(out.path)
            try:
                for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    out.write(chunk)
                    out.flush()
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        text = raw.decode("utf-8", "replace").rstrip("\r")
                        tail = (tail + [text])[-TAIL_LINES:]
                        self.events.put(("line", name, text))
                if pending:
                    tail = (tail + [pending.decode("utf-8", "replace")])[-TAIL_LINES:]
            finally:
                out.close()
            status = container.wait()
            result.exit_code = int(status.get("StatusCode", -1))
            self.events.put(("exited", name, str(result.exit_code)))
        except Exception as e:  # noqa: BLE001 - a dropped node surfaces here as any transport error
            result.error = f"lost the node while the cell ran: {e}"
            self.events.put(("error", name, result.error))
        finally:
            result.tail = tail
            result.ended = now()

    def _start(self, names: Sequence[str]) -> None:
        barrier = threading.Barrier(len(names))

        def start(name: str) -> None:
            barrier.wait()
            try:
                self.containers[name].start()
            except docker.errors.APIError as e:
                self.results[name].error = (f"the container did not start: {e.explanation or e}"
                                            + _start_hint(str(e)))
                return
            self.results[name].started = now()
            self.events.put(("started", name, self.results[name].started or ""))

        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(start, names))
        if any(self.results[n].error for n in names):
            raise CellFailed(self.cell, list(self.results.values()))
        for name in names:
            threading.Thread(target=self._follow, args=(name,), daemon=True, name=f"follow-{name}").start()

    def _wait_ready(self, names: Sequence[str]) -> None:
        """MPI workers: wait until every sshd says it listens before mpirun dials in."""
        waiting, deadline = set(names), time.monotonic() + READY_TIMEOUT_S
        while waiting:
            try:
                kind, name, text = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise EnvironmentUnavailable(
                    f"sshd did not come up in the MPI containers on {', '.join(sorted(waiting))}",
                    hint="the image needs openssh-server at /usr/sbin/sshd") from None
            self.on_event((kind, name, text))
            if kind == "line" and "Server listening" in text:
                waiting.discard(name)
            elif kind in ("exited", "error") and name in waiting:
                raise CellFailed(self.cell, list(self.results.values()))

    def run(self, timeout_s: float) -> list[NodeResult]:
        workers = [p.command.node.name for p in self.plans if p.command.role != "mpi-head"]
        heads = [p.command.node.name for p in self.plans if p.command.role == "mpi-head"]
        self.samplers.start()
        if heads:
            if workers:  # a one-node mpi cell has only its head
                self._start(workers)
                self._wait_ready(workers)
            self._start(heads)
        else:
            self._start(workers)
        self._wait(heads or workers, timeout_s)
        return [self.results[p.command.node.name] for p in self.plans]

    def _wait(self, decisive: Sequence[str], timeout_s: float) -> None:
        """Until every decisive container exits; the first failure or the deadline stops all."""
        running, deadline = set(decisive), time.monotonic() + timeout_s
        while running:
            left = deadline - time.monotonic()
            if left <= 0:
                for name in running:
                    self.results[name].error = f"timed out after {timeout_s:.0f} s"
                break
            try:
                kind, name, text = self.events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self.on_event((kind, name, text))
            if kind == "error" or (kind == "exited" and text != "0"):
                break
            if kind == "exited":
                running.discard(name)

    # -- cleanup --------------------------------------------------------------------------
    def remove(self) -> list[str]:
        """Stop and remove every container this run created, on every node; never raises."""
        problems: list[str] = []

        def remove_one(name: str) -> None:
            try:
                c = self.containers[name]
                try:
                    c.reload()
                    if c.status == "running":
                        c.kill()
                        code = c.wait(timeout=30).get("StatusCode")
                        res = self.results[name]
                        res.exit_code = int(code) if code is not None else res.exit_code
                        if res.error is None and res.role != "mpi-sshd":
                            res.error = "stopped: the cell ended on another node"
                except docker.errors.NotFound:
                    return
                c.remove(force=True)
            except Exception as e:  # noqa: BLE001 - report and go on with the other nodes
                problems.append(f"{name}: could not remove container {self.results[name].container}: {e}")

        with _shielded(), ThreadPoolExecutor(max(1, len(self.containers))) as pool:
            list(pool.map(remove_one, list(self.containers)))
            self.samplers.stop()
        for r in self.results.values():
            r.ended = r.ended or now()
        return problems


def launch_cell(job: CellJob) -> list[NodeResult]:
    """Run one cell on its nodes (``job.clients``: each node's engine) and return one record per node; raise
    CellFailed if any node failed.

    A multi-node cell of an RDMA target first checks that RDMA works in its containers (``check_rdma``)."""
    run = CellRun(job)
    try:
        run.check_rdma()
        run.create()
        results = run.run(job.timeout)
    finally:
        problems = run.remove()
    if problems:
        raise RunFailed("containers could not be removed:\n" + "\n".join(problems),
                        hint="remove them by hand: docker rm -f (label repro.run=" + job.run_id + ")")
    if not all(r.ok for r in results):
        raise CellFailed(job.cell, results)
    return results
