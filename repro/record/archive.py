"""Run archives: ``logs/<run-id>.tar.gz``, byte-for-byte reproducible, and their safe extraction.

An archive holds one top-level directory, the run directory, with entries sorted,
owners, modes and times fixed, and a gzip header without name or time: the same run
directory always gives the same bytes. ``<run-id>.tar.gz.sha256`` next to it is in
``sha256sum -c`` format.

Extraction trusts nothing: every member must be a regular file or directory under the
one top-level directory, with no absolute path, no ``..``, no link and no device; the
member count and the total and per-file sizes are bounded. Then tarfile's ``data``
filter extracts what passed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import tarfile
import tempfile
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from repro.errors import ProvenanceError, UsageError
from repro.digest import sha256_file
from repro.layout import REPORTS, STATE
from repro.run.rundir import RunDir, atomic_write
from repro.tree import MAX_DEPTH, remove, walk

#: Every entry's modification time: 2000-01-01T00:00:00Z (a fixed, obviously synthetic date).
FIXED_MTIME = 946684800
SUFFIX = ".tar.gz"


@dataclass(frozen=True)
class Limits:
    """Bounds on what an archive may unpack to (defaults suit benchmark logs, not datasets)."""

    max_members: int = 100_000
    max_file_bytes: int = 2 << 30
    max_total_bytes: int = 8 << 30
    #: what the unpacked size may be relative to the archive's (training logs compress 5-20 times)
    max_ratio: int = 100
    #: plus this much whatever the archive's size (a small run's metadata)
    ratio_slack_bytes: int = 16 << 20
    #: a JSON member larger than this is not run metadata
    max_json_bytes: int = 64 << 20

    def total_for(self, archive_bytes: int) -> int:
        return min(self.max_total_bytes, self.ratio_slack_bytes + self.max_ratio * archive_bytes)


def is_archive(path: Path) -> bool:
    return path.name.endswith(SUFFIX) and path.is_file()


def checksum_file(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sha256")


def create(run: RunDir, dest: Path | None = None) -> Path:
    """Pack the run directory into ``dest`` (default: ``<run dir>.tar.gz`` beside it) and its checksum."""
    dest = dest or run.path.with_name(run.run_id + SUFFIX)
    found = list(walk(run.path, ProvenanceError))
    for p in found:
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            raise ProvenanceError(f"{p} is not a regular file or directory; a run directory holds only files")
    entries = sorted([run.path, *(p for p in found if not p.name.endswith(".part"))],
                     key=lambda p: p.relative_to(run.path).as_posix())
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            _pack(run, entries, raw)
        digest = sha256_file(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    atomic_write(checksum_file(dest), f"{digest}  {dest.name}\n".encode())
    return dest


def _pack(run: RunDir, entries: list[Path], raw: BinaryIO) -> None:
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for p in entries:
                rel = p.relative_to(run.path).as_posix()
                name = run.run_id if rel == "." else f"{run.run_id}/{rel}"
                info = tarfile.TarInfo(name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
                if p.is_dir():
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    info.size, info.mode = p.stat().st_size, 0o644
                    with p.open("rb") as f:
                        tar.addfile(info, f)


def verify_checksum(archive: Path) -> str | None:
    """None when ``<archive>.sha256`` is absent or matches; else what is wrong."""
    sums = checksum_file(archive)
    if not sums.is_file():
        return None
    m = re.match(r"^([0-9a-f]{64}) [ *](.+)$", sums.read_text(encoding="utf-8", errors="replace").strip())
    if not m:
        return f"{sums.name} is not in sha256sum format"
    if m.group(2) != archive.name:
        return f"{sums.name} names {m.group(2)!r}, not {archive.name!r}"
    if sha256_file(archive) != m.group(1):
        return f"{archive.name} does not match {sums.name} (the archive was changed or damaged)"
    return None


def _check_member(m: tarfile.TarInfo, top: str | None, limits: Limits) -> str:
    """The member's top-level directory; raises ProvenanceError for anything unsafe."""
    name = m.name
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or re.match(r"^[A-Za-z]:", name) or "\\" in name:
        raise ProvenanceError(f"archive member {name!r} has an absolute path")
    if ".." in parts or any(p in ("", ".") for p in name.rstrip("/").split("/")[1:]):
        raise ProvenanceError(f"archive member {name!r} leaves its directory ('..' or an odd path)")
    if m.issym() or m.islnk():
        raise ProvenanceError(f"archive member {name!r} is a link (to {m.linkname!r}); "
                              "run archives hold none")
    if not (m.isfile() or m.isdir()):
        raise ProvenanceError(f"archive member {name!r} is a device, fifo or other special file")
    if len(parts) > MAX_DEPTH:
        raise ProvenanceError(f"archive member {name[:200]!r}... is nested deeper than {MAX_DEPTH} levels")
    if m.size > limits.max_file_bytes:
        raise ProvenanceError(f"archive member {name!r} is {m.size} bytes, "
                              f"over the {limits.max_file_bytes} limit")
    if top is not None and parts[0] != top:
        raise ProvenanceError(f"archive member {name!r} is outside the run directory {top!r}")
    return parts[0]


def extract(archive: Path, dest: Path, limits: Limits = Limits()) -> Path:
    """Check and unpack ``archive`` into ``dest``; returns the run directory inside it."""
    if not hasattr(tarfile, "data_filter"):
        raise UsageError("this Python lacks tarfile extraction filters", hint="use Python 3.11.4 or later")
    problem = verify_checksum(archive)
    if problem:
        raise ProvenanceError(problem)
    cap = limits.total_for(archive.stat().st_size)
    _check_stream(archive, cap)
    members: list[tarfile.TarInfo] = []
    top: str | None = None
    total = 0
    seen: set[str] = set()
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for m in tar:
                if len(members) >= limits.max_members:
                    raise ProvenanceError(f"{archive.name} has more than {limits.max_members} members")
                top = _check_member(m, top, limits)
                total += m.size
                if total > cap:
                    raise ProvenanceError(f"{archive.name} unpacks to more than {cap} bytes (the limit: "
                                          f"{limits.max_ratio} x its size + {limits.ratio_slack_bytes}, "
                                          f"at most {limits.max_total_bytes})")
                key = m.name.rstrip("/")
                if key in seen:
                    raise ProvenanceError(f"archive member {m.name!r} appears twice")
                seen.add(key)
                members.append(m)
            if top is None:
                raise ProvenanceError(f"{archive.name} is empty")
            dest.mkdir(parents=True, exist_ok=True)
            if (dest / top).exists():
                raise UsageError(f"{dest / top} already exists; extract elsewhere")
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as e:
        if isinstance(e, tarfile.FilterError):
            raise ProvenanceError(f"{archive.name}: unsafe member refused: {e}") from e
        raise ProvenanceError(f"{archive.name} is not a readable .tar.gz: {e}") from e
    root = (dest / top).resolve()
    if not root.is_relative_to(dest.resolve()) or not root.is_dir():
        raise ProvenanceError(f"{archive.name} does not hold a run directory")
    for m in members:
        if m.isfile() and m.name.endswith(".json"):
            _check_json(archive, m.name, dest / m.name, limits)
    return root


def _check_stream(archive: Path, cap: int) -> None:
    """Read the whole gzip stream once: its end marker and CRC must be there, and what it
    unpacks to must stay under ``cap`` bytes (counted as it is read, nothing written)."""
    total = 0
    try:
        with gzip.open(archive, "rb") as gz:
            while block := gz.read(1 << 20):
                total += len(block)
                if total > cap:
                    raise ProvenanceError(f"{archive.name} unpacks to more than {cap} bytes",
                                          hint="a run archive holds logs and metadata; this one is not one")
    except (OSError, EOFError, zlib.error) as e:
        raise ProvenanceError(f"{archive.name} is not a readable .tar.gz (damaged or cut short): "
                              f"{e}") from None


def _check_json(archive: Path, member: str, path: Path, limits: Limits) -> None:
    """A JSON member of a run archive must be one JSON object (report.json: a list of records, one object
    a cell), not too large or deep to read."""
    why = None
    if path.stat().st_size > limits.max_json_bytes:
        why = f"over the {limits.max_json_bytes}-byte limit for a JSON member"
    else:
        try:
            doc = json.loads(path.read_bytes())
            if Path(member).name == REPORTS["json"]:
                why = None if isinstance(doc, list) and all(isinstance(r, dict) for r in doc) else \
                    "not a JSON list of records"
            else:
                why = None if isinstance(doc, dict) else f"a JSON {type(doc).__name__}, not an object"
        except RecursionError:
            why = "nested too deeply"
        except ValueError as e:
            why = f"not JSON: {e}"
    if why:
        raise ProvenanceError(f"{archive.name}: member {member}: {why}")


@contextlib.contextmanager
def opened_run(path: Path, limits: Limits = Limits(), *, links: bool = False) -> Iterator[RunDir]:
    """A run directory, or an archive unpacked into a temporary directory for the duration (with ``links``,
    a run directory's links are let through for the caller to report: ``repro audit``)."""
    path = Path(path)
    if path.is_dir():
        yield RunDir.open(path, links=links)
        return
    if not is_archive(path):
        raise UsageError(f"{path} is neither a run directory nor a {SUFFIX} run archive")
    tmp = Path(tempfile.mkdtemp(prefix="repro-run-"))
    try:
        with _terminate_as_exit():
            root = extract(path, tmp, limits)
            try:
                run = RunDir.open(root)
            except UsageError as e:  # inside an archive, a missing part is an integrity failure
                raise ProvenanceError(f"{path.name}: {e.message.replace(str(root), root.name)}") from None
            yield run
    finally:
        remove(tmp)


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM (and SIGHUP) raise SystemExit while the unpacked copy exists, so that the
    ``finally`` above removes it; the default action would kill the process and leave it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def is_run_path(text: str) -> bool:
    """Does a command-line argument name a run directory or archive (rather than a target)?"""
    p = Path(text)
    try:
        return (p.is_dir() and (p / STATE).is_file()) or is_archive(p)
    except OSError:  # a name too long to be a path, say: no run
        return False

