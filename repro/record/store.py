"""The results store: every recorded run's cells and facts in one SQLite file, for ``repro history`` and
``repro compare``.

Where: ``--results FILE``, else ``$REPRO_RESULTS``, else ``$XDG_DATA_HOME/repro/results.sqlite``
(``~/.local/share/repro/results.sqlite`` when XDG_DATA_HOME is unset). How: the standard library's
``sqlite3``; on a local filesystem in WAL mode (readers never wait for a writer), on a network filesystem
(NFS, CIFS, Lustre, GPFS, BeeGFS, ... as ``/proc/self/mountinfo`` names the mount) with the rollback
journal (``journal_mode=DELETE``): WAL's shared-memory index works only between processes of one machine,
while the rollback journal relies on the file locks the filesystem itself provides. Every write is one
``BEGIN IMMEDIATE`` transaction and waits up to :data:`BUSY_TIMEOUT_S` for another writer.

The schema is versioned (``PRAGMA user_version``) and identified (``PRAGMA application_id``): an older
store is migrated in place, one step of :data:`MIGRATIONS` after another, inside one transaction; a store
of a newer kit, another program's SQLite file, or a file that is no SQLite database at all is refused with
a :class:`StoreError` that names it. Nothing here touches a run directory.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.record.rows import KINDS, holds

#: "RPRO": the application id this kit writes into its stores' headers
APPLICATION_ID = 0x5250524F
BUSY_TIMEOUT_S = 30.0
#: filesystem types (as /proc/self/mountinfo names them) that are shared over a network
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "fuse.glusterfs",
    "fuse.sshfs", "fuse.cephfs", "afs", "panfs", "orangefs", "pvfs2", "9p", "wekafs", "fuse.weka"})
SQLITE_HEADER = b"SQLite format 3\x00"
FILE_NAME = "results.sqlite"


class StoreError(UsageError):
    """The results store cannot be used: corrupt, foreign, newer, unwritable."""


def default_path(env: Mapping[str, str] | None = None) -> Path:
    """``$REPRO_RESULTS``, else the user's data directory (XDG) ``/repro/results.sqlite``."""
    env = os.environ if env is None else env
    if env.get("REPRO_RESULTS"):
        return Path(env["REPRO_RESULTS"]).expanduser()
    data = env.get("XDG_DATA_HOME") or ""
    base = Path(data) if os.path.isabs(data) else Path(env.get("HOME") or Path.home()) / ".local" / "share"
    return base / "repro" / FILE_NAME


def _unescape(field: str) -> str:
    """A mountinfo path field: spaces, tabs, newlines and backslashes are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: Path, mountinfo: str) -> str | None:
    """The type of the filesystem ``path`` (absolute, resolved) lies on, from the text of
    ``/proc/self/mountinfo``: the longest mount point above it, the last mounted where several are."""
    best, found = -1, None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mount = _unescape(fields[4])
        if (path == Path(mount) or Path(mount) in path.parents) and len(mount) >= best:
            best, found = len(mount), right.split()[0]
    return found


def on_network_filesystem(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """The network filesystem type ``path`` would be written on, or None (local, or unknown)."""
    where = path.resolve()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        kind = filesystem_type(where, mountinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return kind if kind in NETWORK_FILESYSTEMS else None


# ------------------------------------------------------------------ schema and migrations
def _v1(db: sqlite3.Connection) -> None:
    """Runs (one per recorded run directory, archive or log tree) and their cells."""
    db.execute("""CREATE TABLE runs (
        id INTEGER PRIMARY KEY, digest TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, run_id TEXT,
        source TEXT NOT NULL, started TEXT NOT NULL, recorded TEXT NOT NULL, cluster TEXT,
        kit_version TEXT, facts TEXT NOT NULL)""")
    db.execute("CREATE INDEX runs_started ON runs(started)")
    db.execute("CREATE INDEX runs_run_id ON runs(run_id)")
    db.execute("""CREATE TABLE cells (
        run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, tbl TEXT NOT NULL, target TEXT NOT NULL,
        cell TEXT NOT NULL, framework TEXT, device TEXT, nodes INTEGER, gpus INTEGER, precision TEXT,
        batch_size INTEGER,
        unit TEXT, published TEXT, value REAL, low REAL, high REAL, repeats TEXT NOT NULL, n INTEGER NOT NULL,
        spread_pct REAL,
        delta_pct REAL, verdict TEXT NOT NULL, reason TEXT, tolerance_pct REAL, tolerance_reason TEXT,
        PRIMARY KEY (run, tbl, target, cell))""")
    db.execute("CREATE INDEX cells_tbl ON cells(tbl)")
    db.execute("CREATE INDEX cells_target ON cells(target)")


def _v2(db: sqlite3.Connection) -> None:
    """A JSON column per cell for the summaries of the GPU telemetry sampled while it ran (null: none)."""
    db.execute("ALTER TABLE cells ADD COLUMN telemetry TEXT")


def _v3(db: sqlite3.Connection) -> None:
    """Two covering indexes for `repro history`'s text, by target and by table: a cell's count comes from
    an index, not the rows, and its lowest and highest figure are the ends of its range there. (The narrow
    indexes stay: reading every row through them goes in the order the cells were recorded.)"""
    db.execute("CREATE INDEX cells_by_target ON cells(target, tbl, cell, value, run)")
    db.execute("CREATE INDEX cells_by_table ON cells(tbl, target, cell, value, run)")


#: MIGRATIONS[i] takes a store from schema version i to i + 1
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_v1, _v2, _v3)
SCHEMA_VERSION = len(MIGRATIONS)

RUN_COLUMNS = ("digest", "kind", "run_id", "source", "started", "recorded", "cluster", "kit_version", "facts")
CELL_COLUMNS = ("tbl", "target", "cell", "framework", "device", "nodes", "gpus", "precision", "batch_size",
                "unit", "published", "value", "low", "high", "repeats", "n", "spread_pct", "delta_pct",
                "verdict", "reason", "tolerance_pct", "tolerance_reason", "telemetry")


#: what `repro history` reads of each cell and its run, in this order (``n``: how many repeats)
HISTORY_COLUMNS = ("r.id AS run_no", "r.run_id", "r.source", "r.started", "r.cluster", "c.tbl", "c.target",
                   "c.cell", "c.device", "c.nodes", "c.gpus", "c.precision", "c.batch_size", "c.unit",
                   "c.published", "c.value", "c.low", "c.high", "c.n",
                   "c.spread_pct", "c.delta_pct", "c.verdict", "c.tolerance_pct")


def checked_row(path: Path, names: Sequence[str], row: Sequence[Any]) -> list[Any]:
    """A row read from the store with each column of the type KINDS names (JSON ones decoded); a column of
    another type (a tampered or corrupt store) is a StoreError naming the row and the column."""
    out = []
    for name, v in zip(names, row, strict=True):
        try:
            out.append(holds(KINDS[name], v) if name in KINDS else v)
        except ValueError as e:
            named = dict(zip(names, row, strict=True))
            where = ", ".join(f"{k} {named[k]!r:.40}" for k in ("run_no", "run", "id", "cell") if k in named)
            raise StoreError(f"results store {path}: row of {where}: column {name} holds {v!r:.60}, not {e} "
                             "(a tampered or corrupt store)",
                             hint="move the file aside and record the runs again (`repro history import "
                                  "RUN...`), or give another --results") from None
    return out


#: the names of HISTORY_COLUMNS as a row holds them
HISTORY_NAMES = tuple(c.split(" AS ")[-1].split(".")[-1] for c in HISTORY_COLUMNS)


@dataclass
class Snapshot:
    """One run as the store keeps it: its identity, its facts and its cells (rows of CELL_COLUMNS)."""

    digest: str
    kind: str  # "run": a repro up run directory or archive; "logs": a tree of your logs
    run_id: str | None
    source: str
    started: str  # when it ran, ISO 8601 UTC
    cluster: str | None
    facts: dict[str, Any]  # {"env": {...}, "pins": {...}} as repro.record.diff.Side holds them
    cells: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None  # its number in the store, once recorded
    recorded: str | None = None

    @property
    def label(self) -> str:
        name = self.run_id or self.source
        return f"#{self.id} {name}" if self.id else name


@dataclass(frozen=True)
class Recorded:
    """What recording a snapshot did: ``new``, ``updated`` (the run directory was resumed since),
    ``unchanged`` (recorded before) or ``extended`` (recorded before, with fewer tables)."""

    outcome: str
    id: int
    cells: int


@dataclass(frozen=True)
class CellRuns:
    """One cell's recorded runs at a glance, for `repro history`'s text: how many runs, their lowest and
    highest figure (None: none has one), and as HISTORY_COLUMNS tuples the cell's first recorded row and
    its ``last`` latest rows, newest first."""

    count: int
    low: float | None
    high: float | None
    first: tuple[Any, ...]
    latest: list[tuple[Any, ...]]


def _damaged(path: Path, err: Exception) -> StoreError:
    return StoreError(f"results store {path}: {err} (a corrupt file, or not a results store)",
                      hint="move the file aside (the run directories keep everything it held: "
                           "`repro history import` loads them again), or pass --no-record / another "
                           "--results")


class Store:
    """An open results store; use :func:`open_store`."""

    def __init__(self, path: Path, db: sqlite3.Connection, journal: str) -> None:
        self.path, self.db, self.journal = path, db, journal

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        try:
            _retry_busy(lambda: self.db.execute("BEGIN IMMEDIATE"))
        except sqlite3.OperationalError as e:
            raise self._busy(e) from None
        try:
            yield self.db
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _busy(self, e: sqlite3.OperationalError) -> StoreError:
        if "locked" in str(e) or "busy" in str(e):
            return StoreError(f"results store {self.path}: another process held it for {BUSY_TIMEOUT_S:g} s",
                              hint="try again once the other `repro` has finished")
        return _damaged(self.path, e)

    def record(self, snap: Snapshot, *, now: str) -> Recorded:
        """Record ``snap`` once: a digest recorded before changes nothing but cells of tables it lacked; a
        run directory recorded before under another digest (resumed since) replaces its old record."""
        try:
            with self._write() as db:
                row = db.execute("SELECT id FROM runs WHERE digest = ?", (snap.digest,)).fetchone()
                if row:
                    added = self._insert_cells(db, row[0], snap.cells)
                    return Recorded("extended" if added else "unchanged", row[0], added)
                old = [r[0] for r in db.execute("SELECT id FROM runs WHERE run_id = ? AND kind = 'run'",
                                                (snap.run_id,))] if snap.run_id else []
                for rid in old:
                    db.execute("DELETE FROM cells WHERE run = ?", (rid,))
                    db.execute("DELETE FROM runs WHERE id = ?", (rid,))
                values = (snap.digest, snap.kind, snap.run_id, snap.source, snap.started, now, snap.cluster,
                          (snap.facts.get("pins") or {}).get("kit"), json.dumps(snap.facts, sort_keys=True))
                cur = db.execute(f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES "
                                 f"({', '.join('?' * len(RUN_COLUMNS))})", values)
                rid = int(cur.lastrowid or 0)
                n = self._insert_cells(db, rid, snap.cells)
                return Recorded("updated" if old else "new", rid, n)
        except sqlite3.DatabaseError as e:
            raise _damaged(self.path, e) from None

    @staticmethod
    def _insert_cells(db: sqlite3.Connection, rid: int, cells: Sequence[Mapping[str, Any]]) -> int:
        sql = (f"INSERT OR IGNORE INTO cells (run, {', '.join(CELL_COLUMNS)}) VALUES "
               f"(?, {', '.join('?' * len(CELL_COLUMNS))})")
        before = db.total_changes
        db.executemany(sql, [(rid, *(_sql_value(c.get(k)) for k in CELL_COLUMNS)) for c in cells])
        return db.total_changes - before

    def set_telemetry(self, run: int, target: str, cell: str, summary: Mapping[str, Any] | None) -> bool:
        """Keep the summary of the telemetry sampled while a recorded cell ran (run number, target, cell
        key as ``1n8g-amp-bs256``); False when the store holds no such cell."""
        try:
            with self._write() as db:
                cur = db.execute("UPDATE cells SET telemetry = ? WHERE run = ? AND target = ? AND cell = ?",
                                 (None if summary is None else json.dumps(summary, sort_keys=True), run,
                                  target, cell))
                return cur.rowcount > 0
        except sqlite3.DatabaseError as e:
            raise _damaged(self.path, e) from None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self.db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise _damaged(self.path, e) from None

    def history(self, name: str, *, cluster: str | None = None,
                since: str | None = None) -> list[tuple[Any, ...]]:
        """Every recorded cell of table or target ``name`` with its run, in no order (sorting 10,000 runs'
        cells in SQL costs more than :func:`repro.record.history.group` does in Python), as plain tuples
        of HISTORY_COLUMNS (what 10,000 runs' cells cost least to read)."""
        where, params = _run_filters(cluster, since, "r.")
        where, params = ["(c.tbl = ? OR c.target = ?)", *where], [name, name, *params]
        return self._history_rows(f"SELECT {', '.join(HISTORY_COLUMNS)} FROM cells c JOIN runs r ON "
                                  f"r.id = c.run WHERE {' AND '.join(where)}", params)

    def _history_rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return [tuple(checked_row(self.path, HISTORY_NAMES, r)) for r in self._plain(sql, params)]

    def history_latest(self, name: str, last: int, *, cluster: str | None = None,
                       since: str | None = None) -> list[CellRuns]:
        """Each cell of table or target ``name`` as :meth:`history` finds it, in the order the cells were
        first recorded (their lowest rowid), without reading every row: the count and the figures' range
        from a covering index (cells_by_target, cells_by_table), the ``last`` (> 0) latest rows by walking
        the runs newest first (the index runs_started) until there are ``last``."""
        runs, params = _run_filters(cluster, since)
        only = f" AND run IN (SELECT id FROM runs WHERE {' AND '.join(runs)})" if runs else ""
        glance = "min(rowid), count(*)" + (", min(value), max(value)" if runs else "")
        cells = self._plain(f"SELECT tbl, target, cell, {glance} FROM cells WHERE target = ?{only} "
                            "GROUP BY tbl, cell", [name, *params])
        cells += self._plain(f"SELECT tbl, target, cell, {glance} FROM cells WHERE tbl = ? AND target <> ?"
                             f"{only} GROUP BY target, cell", [name, name, *params])
        columns = f"SELECT {', '.join(HISTORY_COLUMNS)} FROM "
        first_row = columns + "cells c JOIN runs r ON r.id = c.run WHERE c.rowid = ?"
        where = " AND ".join(["c.tbl = ?", "c.target = ?", "c.cell = ?", *(f"r.{w}" for w in runs)])
        latest = (columns + f"runs r CROSS JOIN cells c ON c.run = r.id WHERE {where} "  # the runs outer
                  "ORDER BY r.started DESC, r.id DESC LIMIT ?")
        out = []
        for tbl, target, cell, first, count, *span in sorted(cells, key=lambda c: c[3]):
            key = [tbl, target, cell]
            low, high = span or (self._plain(f"SELECT {end}(value) FROM cells WHERE tbl = ? AND target = ? "
                                             "AND cell = ?", key)[0][0] for end in ("min", "max"))
            low, high = checked_row(self.path, ("cell", "value", "value"), (cell, low, high))[1:]
            out.append(CellRuns(count, low, high, self._history_rows(first_row, [first])[0],
                                self._history_rows(latest, [*key, *params, last])))
        return out

    def _plain(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The rows of a query as plain tuples."""
        try:
            cur = self.db.cursor()
            cur.row_factory = None
            return cur.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise _damaged(self.path, e) from None

    def find(self, ref: str) -> Snapshot | None:
        """A recorded run by its number (``12`` or ``#12``), its run id, or its digest."""
        key = ref[1:] if ref.startswith("#") else ref
        number = re.fullmatch("[0-9]{1,18}", key) is not None  # ASCII digits that fit SQLite's INTEGER
        sql = "SELECT * FROM runs WHERE " + ("id = ?" if number else "run_id = ? OR digest = ?")
        rows = self.query(sql + " ORDER BY id DESC LIMIT 1", (int(key),) if number else (key, key))
        return self.snapshot(rows[0]) if rows else None

    def find_digest(self, digest: str) -> Snapshot | None:
        rows = self.query("SELECT * FROM runs WHERE digest = ?", (digest,))
        return self.snapshot(rows[0]) if rows else None

    def snapshot(self, run: sqlite3.Row) -> Snapshot:
        cells = [dict(zip(r.keys(), checked_row(self.path, r.keys(), tuple(r)), strict=True))
                 for r in self.query("SELECT * FROM cells WHERE run = ? ORDER BY rowid", (run["id"],))]
        run = dict(zip(run.keys(), checked_row(self.path, run.keys(), tuple(run)), strict=True))
        return Snapshot(run["digest"], run["kind"], run["run_id"], run["source"], run["started"],
                        run["cluster"], run["facts"], cells, id=run["id"], recorded=run["recorded"])

    def count(self) -> int:
        return int(self.query("SELECT count(*) FROM runs")[0][0])


def _sql_value(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, (list, dict)) else v


def _check_header(path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise StoreError(f"results store {path}: cannot read it: {e.strerror}",
                         hint="give a readable file with --results or REPRO_RESULTS") from None
    if head and head != SQLITE_HEADER:
        raise StoreError(f"results store {path}: not an SQLite database (a corrupt file, or another "
                         "program's)",
                         hint="move it aside, or give another file with --results or REPRO_RESULTS")


def open_store(path: Path, *, create: bool = True, upto: int = SCHEMA_VERSION,
               mountinfo: Path = Path("/proc/self/mountinfo")) -> Store:
    """The store at ``path``, migrated to schema ``upto`` (tests stop earlier to make an old store);
    ``create`` False: a missing file is an error rather than a new store."""
    path = Path(path)
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError(f"results store {path}: a symbolic link loop, not a file",
                             hint="give a file path with --results or REPRO_RESULTS") from None
    if path.exists() and not path.is_file():
        raise StoreError(f"results store {path}: not a file", hint="give a file path with --results")
    if not path.exists():
        if not create:
            raise StoreError(f"no results store at {path}",
                             hint="`repro report RUN`, `repro up` and `repro history import RUN...` "
                                  "record runs there; --results or REPRO_RESULTS names another store")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"results store {path}: cannot create {path.parent}: {e.strerror}",
                             hint="give a writable path with --results or REPRO_RESULTS") from None
    if path.exists():
        _check_header(path)
    network = on_network_filesystem(path, mountinfo)
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as e:
        raise StoreError(f"results store {path}: cannot open it: {e}",
                         hint="give a writable path with --results or REPRO_RESULTS") from None
    db.row_factory = sqlite3.Row
    store = Store(path, db, "delete" if network else "wal")
    try:
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        db.execute("PRAGMA foreign_keys = ON")
        _migrate(store, upto)  # identified first, in the same transaction: a file not ours stays as it was
        _retry_busy(lambda: db.execute(f"PRAGMA journal_mode = {store.journal}").fetchone())
    except sqlite3.OperationalError as e:
        db.close()
        raise store._busy(e) from None
    except sqlite3.DatabaseError as e:
        db.close()
        raise _damaged(path, e) from None
    except StoreError:
        db.close()
        raise
    return store


def _retry_busy(step: Callable[[], Any]) -> Any:
    """``step`` again while SQLite answers busy at once (it does not wait where waiting could deadlock:
    while another connection creates the store or changes its journal mode), up to BUSY_TIMEOUT_S."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return step()
        except sqlite3.OperationalError as e:
            if not ("locked" in str(e) or "busy" in str(e)) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _header(db: sqlite3.Connection) -> tuple[int, int, int]:
    """(schema version, application id, count of schema objects)."""
    return (db.execute("PRAGMA user_version").fetchone()[0],
            db.execute("PRAGMA application_id").fetchone()[0],
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0])


def _identify(store: Store, version: int, app: int, tables: int) -> None:
    """Refuse another program's database, and a store of a newer kit."""
    if app != APPLICATION_ID and (app or tables or version):
        raise StoreError(f"results store {store.path}: an SQLite database of another program, not a "
                         "results store", hint="give another file with --results or REPRO_RESULTS")
    if version > SCHEMA_VERSION:
        raise StoreError(f"results store {store.path}: written by a newer repro (schema version {version}; "
                         f"this kit reads up to {SCHEMA_VERSION})",
                         hint="upgrade repro, or give another file with --results or REPRO_RESULTS")


def _migrate(store: Store, upto: int) -> None:
    """Identify the store and bring its schema to version ``upto``, one migration after another, all in
    one write transaction: another process that creates or migrates it at the same moment is waited for,
    and the header is read in one consistent state (a refused file is left unwritten)."""
    with store._write() as db:
        version, app, tables = _header(db)
        _identify(store, version, app, tables)
        for step in range(version, upto):
            MIGRATIONS[step](db)
        if upto > version:
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {upto}")


def _run_filters(cluster: str | None, since: str | None, prefix: str = "") -> tuple[list[str], list[str]]:
    """The conditions on a run (its cluster, its start no earlier than ``since``) and their parameters."""
    where, params = [], []
    if cluster is not None:
        where.append(f"{prefix}cluster = ?")
        params.append(cluster)
    if since is not None:
        where.append(f"{prefix}started >= ?")
        params.append(since)
    return where, params
