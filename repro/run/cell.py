"""What every way of running a cell shares: where a node's output goes, what each node's run returns,
the failure of a cell, and the per-run SSH material MPI cells need (``repro.run.launch`` over SSH and the
Slurm job steps alike)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from repro.errors import RunFailed
from repro.run.launchers.mpi import MPI_DIR
from repro.spec.manifest import Cell

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
    """A cell failed on at least one node; carries every node's record."""

    def __init__(self, cell: Cell, results: list[NodeResult]) -> None:
        self.results = results
        bad = [r for r in results if not r.ok]
        lines = [f"cell {cell.key} failed on {len(bad)} of {len(results)} node(s):"]
        for r in bad:
            why = r.error or f"exit code {r.exit_code}"
            lines.append(f"  rank {r.rank} on {r.node}: {why}; log {r.log}")
            lines += [f"    | {t}" for t in r.tail[-5:]]
        super().__init__("\n".join(lines), hint="the full output of every node is in its log file")


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
