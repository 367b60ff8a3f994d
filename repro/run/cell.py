"""What every way of running a cell shares: what a scheduler is asked (``CellJob``), where a node's output
goes, what each node's run returns, the failure of a cell, and the per-run SSH material MPI cells need
(``repro.run.launch`` over SSH and the Slurm job steps alike)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from repro.errors import RunFailed
from repro.layout import log_name
from repro.run.launchers.mpi import MPI_DIR
from repro.spec.hosts import Hosts
from repro.spec.manifest import Cell, Manifest

if TYPE_CHECKING:
    from repro.run.plan import NodePlan


class LogSink(Protocol):
    """Where one node's output goes: the run directory's log writer, or a plain file."""

    path: Path

    def write(self, data: bytes) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class FileSink:
    """A node's output appended to a plain file, unbuffered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = path.open("ab", buffering=0)

    def write(self, data: bytes) -> None:
        self._f.write(data)

    def flush(self) -> None:
        pass  # unbuffered

    def close(self) -> None:
        self._f.close()


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class NodeResult:
    node: str
    address: str
    rank: int
    role: str
    command: tuple[str, ...]
    log: str
    container: str | None = None
    exit_code: int | None = None
    started: str | None = None
    ended: str | None = None
    error: str | None = None
    tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        # an MPI worker only serves sshd; it is stopped once the head is done
        return self.error is None and (self.exit_code == 0
                                       or (self.role == "mpi-sshd" and self.exit_code is not None))


class CellFailed(RunFailed):
    """A cell failed on at least one node. Like docker-py's ``ContainerError``, it carries what failed as
    data: every node's record (``results``), the ranks that failed (``failed``), and of the first of them
    ``node``, ``rank``, ``exit_code`` and ``error`` (the kit's word, None where the rank just exited
    non-zero); ``reason`` says it in one line."""

    def __init__(self, cell: Cell, results: list[NodeResult]) -> None:
        self.cell, self.results = cell, results
        self.failed = [r for r in results if not r.ok]
        first = self.failed[0] if self.failed else None
        self.node, self.rank = (first.node, first.rank) if first else (None, None)
        self.exit_code, self.error = (first.exit_code, first.error) if first else (None, None)
        lines = [self.headline]
        for r in self.failed:
            lines.append(f"  {_rank_line(r)}")
            lines += [f"    | {t}" for t in r.tail[-5:]]
        super().__init__("\n".join(lines), hint="the full output of every node is in its log file")

    @property
    def headline(self) -> str:
        return f"cell {self.cell.key} failed on {len(self.failed)} of {len(self.results)} node(s):"

    @property
    def reason(self) -> str:
        """Why the cell failed, in one line: its first failed rank's, where a rank failed."""
        return _rank_line(self.failed[0]).splitlines()[0] if self.failed else self.headline


def _rank_line(r: NodeResult) -> str:
    return f"rank {r.rank} on {r.node}: {r.error or f'exit code {r.exit_code}'}; log {r.log}"


@dataclass
class CellJob:
    """What a scheduler's ``launch_cell`` is asked (reframe's ``Job`` is the model): one repeat of ``cell``
    on ``hosts``, each rank's output under ``log_dir`` (or to ``log_writer``'s sinks), ``on_event`` told of
    each rank's lines and exit; ``clients``: each node's Docker engine where the kit starts the containers;
    ``image``: what they run (default: the plan's); ``timeout_s``: default the manifest's."""

    manifest: Manifest
    cell: Cell
    hosts: Hosts
    log_dir: Path
    run_id: str
    clients: Any = None
    timeout_s: float | None = None
    on_event: Callable[[tuple[str, str, str]], None] | None = None
    image: str | None = None
    log_writer: Callable[[int, str], LogSink] | None = None

    @property
    def timeout(self) -> float:
        return self.timeout_s or self.manifest.launch.timeout_s

    def emit(self, event: tuple[str, str, str]) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def sink(self, rank: int, node: str) -> LogSink:
        """Where rank ``rank``'s output on ``node`` goes: the job's log writer, else ``RANK-NODE.log``."""
        if self.log_writer is not None:
            return self.log_writer(rank, node)
        return FileSink(self.log_dir / log_name(rank, node))


def mpi_files(plans: Sequence[NodePlan], ssh_port: int) -> dict[str, tuple[bytes, int]]:
    """Per-run SSH material for mpirun: a client key, a host key, and known_hosts pinning it."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def keypair() -> tuple[bytes, bytes]:
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
        return private, key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)

    client, client_pub = keypair()
    host, host_pub = keypair()
    known = b"".join(f"[{p.command.node.rendezvous}]:{ssh_port} ".encode() + host_pub + b"\n" for p in plans)
    return {f"{MPI_DIR}/id_ed25519": (client, 0o600),
            f"{MPI_DIR}/authorized_keys": (client_pub + b"\n", 0o600),
            f"{MPI_DIR}/host_ed25519": (host, 0o600), f"{MPI_DIR}/known_hosts": (known, 0o644)}
