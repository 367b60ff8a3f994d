"""The run directory: everything one ``repro up`` produced, laid out as :mod:`repro.layout` says.

Nothing secret is ever written here: the values of environment variables whose names
look secret (TOKEN, SECRET, PASSWORD, KEY, AUTH...) are replaced in every file the kit
writes, logs included, by a :class:`Redactor` that lives only in memory. The one exception is a
detached run's ``job/in/`` (and ``job/run/``, their copies for the nodes): the inputs its job needs
while nobody is there (the agent's spec with per-run keys, a step's environment), mode 0600 in a 0700
folder, removed when ``repro report`` judges the run.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import socket
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from repro.errors import ProvenanceError, UsageError
from repro.fastyaml import libyaml
from repro.layout import CELL_KEY, CELLS, HOSTS, LOG_NAME, MANIFEST, STATE, SUMS, log_name, repeat_dir
from repro.redact import Redactor, redact_document, redact_env
from repro.spec.hosts import Hosts
from repro.spec.manifest import Cell, Manifest, canonical_sha256, load_manifest
from repro.tree import walk

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
STATUSES = (PENDING, RUNNING, DONE, FAILED)
STATE_VERSION = 1

#: ``<UTC time>-<target>-<6 hex>``, as make_run_id writes it.
RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9._-]+-[0-9a-f]{6}\Z")
MAX_PENDING = 1 << 16
#: bytes of state.json read (a run of a thousand repeats of a hundred cells writes a few MB)
MAX_STATE = 64 << 20

#: libyaml's safe dumper and loader where PyYAML has them (the same documents, several times faster)
_DUMPER = libyaml(yaml.SafeDumper) or yaml.SafeDumper
_LOADER = libyaml(yaml.SafeLoader) or yaml.SafeLoader


def _state_problem(state: Any) -> str | None:
    """What makes ``state`` other than a run state (cells -> repeats "1".. -> {status: ...}), or None."""
    if not isinstance(state, dict) or not isinstance(state.get("cells"), dict):
        return "not a run state (an object with 'cells')"
    for key, cell in state["cells"].items():
        if (not CELL_KEY.match(key) or not isinstance(cell, dict)
                or not isinstance(cell.get("repeats"), dict)):
            return f"cells.{key}: not a cell (a key like 1n8g-fp32-bs256 with 'repeats')"
        for k, r in cell["repeats"].items():
            if (not (k.isascii() and k.isdigit()) or not isinstance(r, dict)
                    or r.get("status") not in STATUSES):
                return (f"cells.{key}.repeats.{k}: not a repeat "
                        f"(a number with a status: {', '.join(STATUSES)})")
    return None


def make_run_id(target: str, now: datetime | None = None, short: str | None = None) -> str:
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", target).strip("-.") or "run"
    return f"{stamp}-{safe}-{short or secrets.token_hex(3)}"


def parse_cell_key(key: str) -> Cell:
    m = CELL_KEY.match(key)
    if not m:
        raise UsageError(f"not a cell key: {key!r}", hint="cell keys read like 1n8g-fp32-bs256")
    return Cell(int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4)))


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_bytes(path: Path, limit: int, *, whole: bool = False) -> bytes:
    """At most ``limit`` bytes of a file in a run directory (whose files come from anyone): opened without
    following a link, and refused unless a regular file (a link, FIFO or device is a ProvenanceError). With
    ``whole``, a file holding more than ``limit`` bytes is refused rather than cut."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ProvenanceError(f"{path} is a link: a run directory holds only files and folders",
                                  hint="the run directory was altered; take it from its archive") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProvenanceError(f"{path} is not a regular file (a FIFO, socket or device); "
                                  "a run directory holds only files")
        data = f.read(limit + 1 if whole else limit)
    if whole and len(data) > limit:
        raise ProvenanceError(f"{path} holds more than {limit} bytes, more than the kit ever writes there",
                              hint="the run directory was altered; take it from its archive")
    return data


def read_head(path: Path, limit: int) -> str:
    """The first ``limit`` bytes of a file a job or a node wrote into the run directory, as text (bytes that
    are not UTF-8 replaced); ``read_bytes`` opens it."""
    return read_bytes(path, limit).decode("utf-8", "replace")


def read_whole(path: Path, limit: int) -> str:
    """A whole file of the run directory of at most ``limit`` bytes, as text (``read_bytes``)."""
    return read_bytes(path, limit, whole=True).decode("utf-8", "replace")


def read_json(path: Path, limit: int) -> Any:
    """A JSON document of the run directory of at most ``limit`` bytes; not JSON, or nested past what the
    parser takes: a ProvenanceError naming the file."""
    text = read_whole(path, limit)
    try:
        return json.loads(text)
    except ValueError as e:
        raise ProvenanceError(f"{path}: not JSON ({e})",
                              hint="the run directory was damaged or altered") from None
    except RecursionError:
        raise ProvenanceError(f"{path}: nested too deeply",
                              hint="the run directory was damaged or altered") from None


def verify_tree(path: Path, *, links: bool = False) -> None:
    """Every entry under ``path`` a regular file or a folder, before anything in it is read, written or
    removed: a link (which could lead out of it, or to a device) or a FIFO, socket or device (which would
    block whoever reads it) is a ProvenanceError naming it; a tree deeper than ``repro.tree.MAX_DEPTH`` as
    well. With ``links``, links are let through (never followed) for a caller that reports them itself."""
    for p in walk(path, ProvenanceError):
        mode = p.lstat().st_mode
        if stat.S_ISLNK(mode) and not links:
            raise ProvenanceError(f"{p} is a link (to {os.readlink(p)}); a run directory holds only files "
                                  "and folders", hint="the run directory was altered; take it from its "
                                                      "archive")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            raise ProvenanceError(f"{p} is not a regular file (a FIFO, socket or device); "
                                  "a run directory holds only files")


def _hosts_doc(hosts: Hosts) -> dict[str, Any]:
    nodes = []
    for n in hosts.nodes:
        entry = {"name": n.name, "address": n.address, "user": n.user, "port": n.port, "identity": n.identity,
                 "gpus": n.gpus, "docker_host": n.docker_host, "rendezvous_address": n.rendezvous_address}
        nodes.append({k: v for k, v in entry.items() if v is not None})
    doc: dict[str, Any] = {"schema_version": 1, "nodes": nodes}
    if hosts.gpus is not None:  # what the allocation asks of each node (nodes Slurm named may not say)
        doc["defaults"] = {"gpus": hosts.gpus}
    if hosts.data:
        doc["data"] = hosts.data
    if hosts.env:
        doc["env"] = redact_env(hosts.env)
    if hosts.scheduler:
        doc["scheduler"] = dict(hosts.scheduler)
    doc.update({k: list(v) for k, v in (("prelude", hosts.prelude), ("modules", hosts.modules)) if v})
    return doc


def _redacted_manifest(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The manifest document with every secret blanked (repro.redact); the dotted paths changed."""
    return redact_document(json.loads(json.dumps(data)))


@dataclass
class RunDir:
    path: Path
    redactor: Redactor = field(default_factory=Redactor)

    # ------------------------------------------------------------ layout
    @property
    def run_id(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def cells_dir(self) -> Path:
        return self.path / CELLS

    def log_dir(self, cell: Cell | str, repeat: int) -> Path:
        """``cells/<cell-key>/r<repeat>``: where one repeat's per-node logs go."""
        key = cell if isinstance(cell, str) else cell.key
        if repeat < 1 or not CELL_KEY.match(key):
            raise UsageError(f"bad log coordinates: cell {key!r}, repeat {repeat}")
        return repeat_dir(self.path, key, repeat)

    def log_path(self, cell: Cell | str, repeat: int, rank: int, node: str) -> Path:
        if rank < 0 or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", node):
            raise UsageError(f"bad log coordinates: rank {rank}, node {node!r}")
        return self.log_dir(cell, repeat) / log_name(rank, node)

    # ------------------------------------------------------------ create / open
    @classmethod
    def create(cls, root: Path, manifest: Manifest, hosts: Hosts, *, run_id: str | None = None,
               env: Mapping[str, str] | None = None) -> RunDir:
        """A new run directory under ``root`` with the manifest, inventory and an all-pending state.

        ``env`` (default: this process's) contributes secret values to scrub, as do the
        manifest's and the inventory's env sections.
        """
        rid = run_id or make_run_id(manifest.id)
        path = Path(root) / rid
        try:
            path.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise UsageError(f"run directory {path} already exists") from None
        launch_envs = [manifest.launch.env, *(e for _, e in manifest.launch.cell_env)]
        run = cls(path, Redactor.from_envs(os.environ if env is None else env, hosts.env, *launch_envs))
        doc, redacted = _redacted_manifest(manifest.data)
        header = f"# {manifest.id}, as loaded from {manifest.path}; sha256 {manifest.sha256}\n"
        if redacted:
            header += f"# secret values redacted: {', '.join(redacted)}\n"
        written = run.write_text(MANIFEST, header + yaml.dump(doc, Dumper=_DUMPER, sort_keys=False,
                                                             allow_unicode=True))
        # what audit will read back: the digest of the file as written, secrets blanked
        written_sha256 = canonical_sha256(yaml.load(written.read_text(encoding="utf-8"), Loader=_LOADER))
        if written_sha256 != manifest.sha256 and not redacted:
            redacted = ["(free text)"]
        where = (str(hosts.path) if hosts.path
                 else f"the local machine ({socket.gethostname()}), no --hosts file")
        run.write_text(HOSTS, f"# inventory: {where}\n" + yaml.dump(_hosts_doc(hosts), Dumper=_DUMPER,
                                                                     sort_keys=False))
        cells = {c.key: {"nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "precision": c.precision,
                         "batch_size": c.batch_size,
                         "repeats": {str(k): {"status": PENDING, "why": None, "attempts": 0, "started": None,
                                              "ended": None} for k in range(1, manifest.repeats + 1)}}
                 for c in manifest.cells()}
        run.write_state({"schema_version": STATE_VERSION, "run_id": rid, "target": manifest.id,
                         "manifest_sha256": manifest.sha256, "redacted": redacted,
                         "redacted_sha256": written_sha256 if redacted else None, "cells": cells})
        run.cells_dir.mkdir()
        return run

    @classmethod
    def open(cls, path: Path, *, env: Mapping[str, str] | None = None, links: bool = False) -> RunDir:
        """An existing run directory, its tree verified first (``verify_tree``); with ``links``, links are
        let through for a caller that reports them itself (``repro audit``)."""
        path = Path(path)
        missing = [n for n in (MANIFEST, STATE) if not (path / n).is_file()]
        if missing:
            raise UsageError(f"{path} is not a run directory (no {', '.join(missing)})",
                             hint="give a logs/<run-id>/ directory written by `repro up`, or its .tar.gz")
        verify_tree(path, links=links)
        return cls(path, Redactor.from_envs(os.environ if env is None else env))

    def load_manifest(self) -> Manifest:
        return load_manifest(self.file(MANIFEST))

    # ------------------------------------------------------------ writing
    def write_text(self, name: str, text: str) -> Path:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ProvenanceError(f"{name!r} is not a name inside the run directory {self.path}")
        path = self.path / name
        atomic_write(path, self.redactor.text(text).encode("utf-8"))
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, json.dumps(self.redactor.data(obj), indent=2, sort_keys=False) + "\n")

    def write_log(self, cell: Cell | str, repeat: int, rank: int, node: str, data: bytes | str) -> Path:
        path = self.log_path(cell, repeat, rank, node)
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
        atomic_write(path, self.redactor.bytes(raw))
        return path

    def open_log(self, cell: Cell | str, repeat: int, rank: int, node: str) -> LogWriter:
        """A streaming writer for one node's log (output arrives while the cell runs)."""
        return LogWriter(self.log_path(cell, repeat, rank, node), self.redactor)

    def scrub_files(self) -> list[str]:
        """Rewrite every file holding a known secret value (logs other code wrote); the files changed."""
        changed = []
        if not self.redactor.values:
            return changed
        for rel in self.files():
            raw = (self.path / rel).read_bytes()
            if self.redactor.found_in(raw):
                atomic_write(self.path / rel, self.redactor.bytes(raw))
                changed.append(rel)
        return changed

    # ------------------------------------------------------------ state
    def read_state(self) -> dict[str, Any]:
        path = self.file(STATE)
        try:
            state = read_json(path, MAX_STATE)
        except OSError as e:
            raise ProvenanceError(f"cannot read {path}: {e}") from e
        problem = _state_problem(state)
        if problem:
            raise ProvenanceError(f"{path}: {problem}", hint="the run directory was damaged or altered")
        return state

    def write_state(self, state: Mapping[str, Any]) -> None:
        self.write_json(STATE, state)

    def set_status(self, cell: Cell | str, repeat: int, status: str,
                   why: str | None = None) -> dict[str, Any]:
        """Record one repeat's status (with the time, and an attempt when it starts running)."""
        if status not in STATUSES:
            raise UsageError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
        key = cell if isinstance(cell, str) else cell.key
        state = self.read_state()
        try:
            entry = state["cells"][key]["repeats"][str(repeat)]
        except KeyError:
            raise UsageError(f"{self.run_id}: no cell {key} repeat {repeat}") from None
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if status == RUNNING:
            entry.update(attempts=entry.get("attempts", 0) + 1, started=now, ended=None)
        elif status in (DONE, FAILED):
            entry["ended"] = now
        entry.update(status=status, why=why)
        self.write_state(state)
        return entry

    def pending(self) -> list[tuple[str, int]]:
        """(cell key, repeat) still to run: pending, failed, or running when a previous run stopped."""
        state = self.read_state()
        return [(key, int(k)) for key, c in state["cells"].items() for k, r in c["repeats"].items()
                if r["status"] != DONE]

    # ------------------------------------------------------------ reading logs
    def logs_for(self, cell: Cell | str, repeat: int) -> list[Path]:
        """One cell's logs of one repeat, in rank order (rank 0 first)."""
        return [p for _, p in self._ranked_logs(cell, repeat)]

    def rank0_log(self, cell: Cell | str, repeat: int) -> Path | None:
        logs = self._ranked_logs(cell, repeat)
        return logs[0][1] if logs and logs[0][0] == 0 else None

    def _ranked_logs(self, cell: Cell | str, repeat: int) -> list[tuple[int, Path]]:
        d = self.log_dir(cell, repeat)
        if not d.is_dir():
            return []
        return sorted((int(m.group(1)), p) for p in d.iterdir()
                      if p.is_file() and (m := LOG_NAME.match(p.name)))

    def files(self) -> list[str]:
        """Every regular file, as a sorted relative POSIX path, except SHA256SUMS and partial writes."""
        out = []
        for p in walk(self.path, ProvenanceError):
            rel = p.relative_to(self.path).as_posix()
            if p.is_file() and not p.is_symlink() and rel != SUMS and not p.name.endswith(".part"):
                out.append(rel)
        return sorted(out)


class LogWriter:
    """Appends a node's output to its log, scrubbing secrets line by line; a context manager."""

    def __init__(self, path: Path, redactor: Redactor) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._redactor = redactor
        self._f = path.open("ab")
        self._pending = b""

    def write(self, data: bytes | str) -> None:
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
        head, sep, tail = (self._pending + raw).rpartition(b"\n")
        if sep:
            self._f.write(self._redactor.bytes(head + sep))
        self._pending = tail
        if len(self._pending) > MAX_PENDING:
            # a long line without a newline (progress bars): scrub, write all but what could
            # still be the start of a secret
            scrubbed = self._redactor.bytes(self._pending)
            keep = self._redactor.longest - 1
            self._f.write(scrubbed[:len(scrubbed) - keep])
            self._pending = scrubbed[len(scrubbed) - keep:]

    def flush(self) -> None:
        """Push what is complete to the file now, so the log can be read while the cell runs."""
        self._f.flush()

    def close(self) -> None:
        if self._f.closed:
            return
        self._f.write(self._redactor.bytes(self._pending))
        self._pending = b""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
