"""The results store, `repro history` and `repro compare` (no Docker needed).

Runs are simulated as the verdict tests do: the publisher's own logs, every throughput figure scaled by a
known factor per repeat, so each cell's figure, verdict and change between runs is known in advance; the
facts come from sealed run directories whose probes report the publication's V100 nodes (test_provenance).
Every test has its own store (REPRO_RESULTS in tmp_path).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cli_helpers import run_cli
from test_provenance import make_run
from test_userlogs import scaled_copy

from repro.record import snapshot
from repro.record.archive import create
from repro.record.compare import BEYOND, UNKNOWN, WITHIN, noise
from repro.record.history import parse_since
from repro.record.store import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
    StoreError,
    default_path,
    filesystem_type,
    open_store,
)
from repro.errors import UsageError
from repro.spec.manifest import find_target
from repro.verdict.reproduce import reproduce_table

TARGET = "ngc-pytorch-rn50-v100"
ROOT = Path(__file__).resolve().parent.parent


def published_log(gpus: int = 1, precision: str = "fp32") -> Path:
    m = find_target(TARGET)
    return next(c.logs[0] for c in m.table().cells if c.gpus == gpus and c.precision == precision)


def log_tree(root: Path, factors: list[float], day: str, cells: tuple[tuple[int, str], ...] = ((1, "fp32"),)
             ) -> Path:
    """A tree of your logs, one folder a repeat, each the published log scaled by that repeat's factor,
    written on ``day`` (the files' times: when the run ran)."""
    for k, f in enumerate(factors, 1):
        for gpus, precision in cells:
            src = published_log(gpus, precision)
            scaled_copy(src, root / f"rep{k}" / "V100" / src.name, f)
    t = datetime.fromisoformat(f"{day}T10:00:00+00:00").timestamp()
    for p in root.rglob("*"):
        os.utime(p, (t, t))
    return root


def factors(mean: float, sd: float, seed: int, n: int = 5) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.gauss(0, sd)) for _ in range(n)]


@pytest.fixture()
def store(tmp_path: Path) -> dict[str, str]:
    """The environment of a test that has its own results store."""
    return {**os.environ, "REPRO_RESULTS": str(tmp_path / "results.sqlite")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two sealed runs of TARGET: the second with another driver on its last node."""
    root = tmp_path_factory.mktemp("runs")
    return make_run(root / "a").path, make_run(root / "b", driver_on_last="535.104.05").path


# ------------------------------------------------------------------ pure parts
MOUNTINFO = (  # this machine's own lines, and an NFS home as the kernel writes it (proc(5) format)
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534\n"
    "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683656k\n"
    "41 27 0:45 / /home rw,relatime shared:30 - nfs4 fs1:/export/home rw,vers=4.2,rsize=1048576,hard,proto=tcp\n"
    "42 41 0:46 / /home/a\\040b rw,relatime - ext4 /dev/vdb rw\n")


def test_filesystem_type_is_the_longest_mount_above_the_path() -> None:
    assert filesystem_type(Path("/home/u/.local/share/repro/results.sqlite"), MOUNTINFO) == "nfs4"
    assert filesystem_type(Path("/home"), MOUNTINFO) == "nfs4"
    assert filesystem_type(Path("/homes/u"), MOUNTINFO) == "ext4"  # a prefix of the name is not a parent
    assert filesystem_type(Path("/home/a b/x"), MOUNTINFO) == "ext4"  # \040 is a space
    assert filesystem_type(Path("/dev/shm/x"), MOUNTINFO) == "tmpfs"
    assert filesystem_type(Path("/x"), "garbage\n\n") is None


def test_network_filesystem_gets_the_rollback_journal(tmp_path: Path) -> None:
    here = str(tmp_path.resolve()).replace(" ", "\\040")
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO + f"50 27 0:50 / {here} rw,relatime - nfs4 fs1:/export rw,vers=4.2\n")
    s = open_store(tmp_path / "nfs.sqlite", mountinfo=info)
    assert s.journal == "delete" and s.db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    s.close()
    info.write_text(MOUNTINFO + f"50 27 0:50 / {here} rw,relatime - ext4 /dev/vdc rw\n")
    s = open_store(tmp_path / "local.sqlite", mountinfo=info)
    assert s.journal == "wal" and s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()


def test_default_path_follows_xdg() -> None:
    assert default_path({"REPRO_RESULTS": "/r/x.sqlite", "XDG_DATA_HOME": "/d"}) == Path("/r/x.sqlite")
    assert default_path({"XDG_DATA_HOME": "/d", "HOME": "/h"}) == Path("/d/repro/results.sqlite")
    # XDG: a relative XDG_DATA_HOME is invalid and ignored
    assert default_path({"XDG_DATA_HOME": "rel", "HOME": "/h"}) == Path("/h/.local/share/repro/results.sqlite")
    assert default_path({"HOME": "/h"}) == Path("/h/.local/share/repro/results.sqlite")


def test_since_and_noise() -> None:
    assert parse_since("2026-11-01") == "2026-11-01T00:00:00Z"
    assert parse_since("2026-11-01T12:30Z") == "2026-11-01T12:30:00Z"
    with pytest.raises(UsageError, match="not a date"):
        parse_since("last week")
    with pytest.raises(UsageError, match="not a date"):
        parse_since("2026-13-01")
    assert noise([1.0], [2.0, 2.1]) == (UNKNOWN, None)
    assert noise([1.0, 1.0], [1.0, 1.0]) == (WITHIN, 1.0)
    assert noise([100, 101, 99, 100.5], [95, 96, 94, 95.5])[0] == BEYOND
    assert noise([100, 104, 96, 101], [99, 103, 97, 100])[0] == WITHIN


# ------------------------------------------------------------------ record, history, compare
def test_record_history_compare_round_trip(runs: tuple[Path, Path], store: dict[str, str],
                                           tmp_path: Path) -> None:
    a, b = runs
    res = run_cli("report", a, "--cluster", "v100-lab", env=store)
    assert res.returncode == 0, res.stderr
    assert f"recorded in {store['REPRO_RESULTS']} as run #1" in res.stderr
    archive = create(snapshot_rundir(b, tmp_path))
    res = run_cli("history", "import", archive, env=store)
    assert res.returncode == 0 and "as run #2" in res.stderr, res.stderr
    res = run_cli("history", "perf-2.5-v100", "--format", "json", env=store)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    report = json.loads((a / "report.json").read_text())
    first = {(r["gpus"], r["precision"]): r for r in got if r["run"] == 1}
    assert {(c["gpus"], c["precision"]): c["reproduced"] for c in report} == \
        {k: r["value"] for k, r in first.items()}
    assert {r["cluster"] for r in got if r["run"] == 1} == {"v100-lab"}
    assert {r["verdict"] for r in got} == {"reproduced"} and {r["repeats"] for r in got} == {1}
    assert len(got) == 2 * len(report)
    res = run_cli("history", "perf-2.5-v100", "--cluster", "v100-lab", env=store)
    assert "| #1 " in res.stdout and "| #2 " not in res.stdout
    res = run_cli("compare", "1", "2", env=store)
    assert res.returncode == 0, res.stderr
    facts = res.stdout.split("## Facts that differ")[1]
    lines = [ln for ln in facts.splitlines() if ln.startswith("| ") and not ln.startswith("| fact")]
    assert lines[0].startswith("| driver ") and "node3: 535.104.05" in lines[0], facts
    assert "+0.00%" in res.stdout and "reproduced (one repeat)" in res.stdout
    # a run directory or archive compares the same as its number, and `repro diff` sees the same driver
    by_path = run_cli("compare", a, archive, env=store)
    assert by_path.stdout == res.stdout
    assert "node3: 535.104.05" in run_cli("diff", a, archive).stdout


def snapshot_rundir(run: Path, tmp_path: Path) -> object:
    from repro.run.rundir import RunDir

    dest = tmp_path / "copy" / run.name
    shutil.copytree(run, dest)
    return RunDir.open(dest)


def test_a_runs_cells_keep_their_telemetry(runs: tuple[Path, Path], store: dict[str, str],
                                          tmp_path: Path) -> None:
    from repro.nodes.telemetry import summary, write_repeat_summary

    run = snapshot_rundir(runs[0], tmp_path).path
    d = run / "cells" / "1n1g-fp32-bs256" / "r1"  # the samples of a real H100 under load, as the sampler writes
    rows = (ROOT / "tests" / "data" / "telemetry" / "h100-590.48.01-query-gpu-load.csv").read_text().splitlines()
    (d / "telemetry-node0.txt").write_text("\n".join("gpu " + x for x in rows) + "\n")
    write_repeat_summary(d)
    assert run_cli("report", run, env=store).returncode == 0
    cells = {c["cell"]: c["telemetry"] for c in open_store(Path(store["REPRO_RESULTS"])).find("1").cells}
    assert cells["1n1g-fp32-bs256"] == json.loads(json.dumps(summary(run, "1n1g-fp32-bs256")))
    assert cells["1n1g-fp32-bs256"]["gpu"]["samples"] == 1
    assert cells["1n8g-fp32-bs256"] is None


def test_recording_the_same_run_again_changes_nothing(runs: tuple[Path, Path], store: dict[str, str],
                                                      tmp_path: Path) -> None:
    a, _ = runs
    assert run_cli("report", a, env=store).returncode == 0
    path = Path(store["REPRO_RESULTS"])
    before = list(sqlite3.connect(path).iterdump())
    res = run_cli("report", a, "--format", "csv", env=store)
    assert "already recorded" in res.stderr and "as run #1" in res.stderr
    res = run_cli("history", "import", create(snapshot_rundir(a, tmp_path)), env=store)  # its archive
    assert "already recorded" in res.stderr
    assert list(sqlite3.connect(path).iterdump()) == before
    assert run_cli("report", a, "--no-record", env={**store, "REPRO_RESULTS": str(tmp_path / "n.sqlite")}
                   ).returncode == 0
    assert not (tmp_path / "n.sqlite").exists()


def test_history_of_three_runs_draws_beside_the_published_figure(tmp_path: Path, store: dict[str, str]) -> None:
    plan = [(1.0, "2026-09-01"), (0.995, "2026-10-01"), (0.95, "2026-11-01")]
    m = find_target(TARGET)
    for i, (mean, day) in enumerate(plan, 1):
        tree = log_tree(tmp_path / f"run{i}", factors(mean, 0.003, i), day)
        if i < 3:  # as `repro report` records them (the CLI's hook is the last one), without its start-up
            snap = snapshot.from_logs([reproduce_table(m, m.table(), tree)], source=str(tree), cluster="lab")
            s = open_store(Path(store["REPRO_RESULTS"]))
            assert s.record(snap, now="2026-11-02T00:00:00Z").id == i
            s.close()
            continue
        res = run_cli("report", TARGET, "--from-logs", tree, "--cluster", "lab", env=store)
        assert f"as run #{i}" in res.stderr, res.stderr
    chart = tmp_path / "history.png"
    res = run_cli("history", TARGET, "--plot", chart, env=store)
    assert res.returncode == 0, res.stderr
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = res.stdout
    assert "ngc-pytorch-rn50-v100 1 GPU (1 node) fp32 bs256: published 370.194 images/s" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| #")]
    assert [r.split("|")[2].strip() for r in rows] == ["2026-09-01 10:00:00", "2026-10-01 10:00:00",
                                                       "2026-11-01 10:00:00"]
    assert [r.split("|")[-2].strip() for r in rows] == ["reproduced", "reproduced", "slower"]
    res = run_cli("history", TARGET, "--since", "2026-10-01", "--format", "csv", env=store)
    assert [ln.split(",")[0] for ln in res.stdout.splitlines()] == ["run", "2", "3"]
    res = run_cli("compare", "2", "3", "--format", "json", env=store)
    cell = json.loads(res.stdout)["cells"][0]
    assert cell["noise"] == BEYOND and -5.2 < cell["delta_pct"] < -4.0


# ------------------------------------------------------------------ schema versions
def test_a_store_of_a_newer_kit_is_refused(store: dict[str, str], runs: tuple[Path, Path]) -> None:
    path = Path(store["REPRO_RESULTS"])
    open_store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    for args in (("history", TARGET), ("report", runs[0]), ("compare", "1", "2")):
        res = run_cli(*args, env=store)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert f"written by a newer repro (schema version {SCHEMA_VERSION + 1}; this kit reads up to " \
               f"{SCHEMA_VERSION})" in res.stderr and "hint: upgrade repro" in res.stderr


V1_RUN = ("INSERT INTO runs (digest, kind, run_id, source, started, recorded, cluster, kit_version, facts) "
          "VALUES ('logs:x', 'logs', NULL, '/old', '2026-01-02T03:04:05Z', '2026-01-02T03:04:05Z', 'old', '0.1', "
          "'{\"env\": {}, \"pins\": {}}')")
V1_CELL = ("INSERT INTO cells (run, tbl, target, cell, framework, device, nodes, gpus, precision, batch_size, unit, "
           "published, value, low, high, repeats, n, spread_pct, delta_pct, verdict, reason, tolerance_pct, "
           "tolerance_reason) VALUES (1, 'perf-2.5-v100', 'ngc-pytorch-rn50-v100', '1n1g-fp32-bs256', 'NGC', 'GPU', "
           "1, 1, 'fp32', 256, 'images/s', '370.194', 369.0, 368.0, 370.0, '[368.5, 369.0, 369.5]', 3, 0.1, -0.3, "
           "'reproduced', NULL, 2.0, NULL)")


@pytest.mark.parametrize("version", range(SCHEMA_VERSION))
def test_every_older_schema_is_migrated(version: int, tmp_path: Path, store: dict[str, str]) -> None:
    path = Path(store["REPRO_RESULTS"])
    open_store(path, upto=version).close()
    db = sqlite3.connect(path)
    if version >= 1:  # a store with a run in it, written by that version
        db.execute(V1_RUN)
        db.execute(V1_CELL)
        db.commit()
    assert db.execute("PRAGMA user_version").fetchone()[0] == version
    db.close()
    s = open_store(path)
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)
    assert s.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    s.close()
    res = run_cli("history", TARGET, "--format", "json", env=store)
    if version >= 1:
        [row] = json.loads(res.stdout)
        assert (row["value"], row["repeats"], row["cluster"]) == (369.0, 3, "old")
        s = open_store(path)
        assert s.find("1").cells[0]["telemetry"] is None
        summary = {"what": "any JSON object: the store keeps it as given"}
        assert s.set_telemetry(1, "ngc-pytorch-rn50-v100", "1n1g-fp32-bs256", summary)
        assert not s.set_telemetry(1, "ngc-pytorch-rn50-v100", "1n8g-fp32-bs256", summary)
        assert s.find("1").cells[0]["telemetry"] == summary
        s.close()
    else:
        assert res.returncode == 2 and "no recorded run" in res.stderr


# ------------------------------------------------------------------ damaged and foreign files
def _sums(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _damaged_store(path: Path, kind: str, run: Path) -> None:
    if kind == "garbage":
        path.write_bytes(b"not a database at all\n" * 100)
    elif kind == "foreign":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)")
        db.close()
    else:  # a real store whose pages were overwritten past the header
        res = run_cli("report", run, env={**os.environ, "REPRO_RESULTS": str(path)})
        assert res.returncode == 0, res.stderr
        sqlite3.connect(path).execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        data = bytearray(path.read_bytes())
        data[100:] = b"\xa5" * (len(data) - 100)
        path.write_bytes(bytes(data))


@pytest.mark.parametrize(("kind", "said"), [("garbage", "not an SQLite database"),
                                            ("foreign", "an SQLite database of another program"),
                                            ("malformed", "a corrupt file, or not a results store")])
def test_a_corrupt_or_foreign_store_is_a_clear_error_and_loses_nothing(
        kind: str, said: str, runs: tuple[Path, Path], tmp_path: Path) -> None:
    run = snapshot_rundir(runs[0], tmp_path).path
    path = tmp_path / "bad.sqlite"
    _damaged_store(path, kind, run)
    before, store_bytes = _sums(run), path.read_bytes()
    env = {**os.environ, "REPRO_RESULTS": str(path)}
    res = run_cli("report", run, env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert said in res.stderr and "hint:" in res.stderr
    assert "| 1 GPU (1 node) " in res.stdout  # the report itself was printed first
    for args in (("history", TARGET), ("history", "import", run)):
        res = run_cli(*args, env=env)
        assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert _sums(run) == before and path.read_bytes() == store_bytes


# ------------------------------------------------------------------ two writers at once
def _writer(paths: list[str], tag: str, rows: list[dict], start: object, out: object) -> None:
    from repro.record.store import Snapshot, open_store

    try:
        for path in paths:  # each store new: both processes create it at the same moment, then fill it
            start.wait()  # type: ignore[attr-defined]
            for i in range(4):
                s = open_store(Path(path))
                s.record(Snapshot(f"logs:{tag}{i}", "logs", None, f"/{tag}/{i}", "2026-11-01T00:00:00Z", tag,
                                  {"env": {}, "pins": {}}, rows), now="2026-11-01T00:00:00Z")
                s.record(Snapshot("logs:shared", "logs", None, "/shared", "2026-11-01T00:00:00Z", None,
                                  {"env": {}, "pins": {}}, rows), now="2026-11-01T00:00:00Z")
                s.close()
        out.put((tag, "ok"))  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - the parent asserts on it
        out.put((tag, repr(e)))  # type: ignore[attr-defined]
        start.abort()  # type: ignore[attr-defined]


def test_two_concurrent_writers_never_corrupt_the_store(tmp_path: Path) -> None:
    tree = log_tree(tmp_path / "mine", factors(1.0, 0.003, 1), "2026-11-01")
    m = find_target(TARGET)
    rows = snapshot.cell_rows([reproduce_table(m, m.table(), tree)])
    assert len(rows) == 1
    paths = [str(tmp_path / f"results{k}.sqlite") for k in range(10)]
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(2, timeout=60), ctx.Queue()  # a writer that fails breaks the other's wait
    procs = [ctx.Process(target=_writer, args=(paths, tag, rows, start, out), daemon=True) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert sorted(out.get(timeout=5) for _ in procs) == [("a", "ok"), ("b", "ok")]
    for path in paths:
        s = open_store(Path(path))
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert s.count() == 9  # 4 each, and the one both recorded
        assert s.db.execute("SELECT count(*) FROM cells").fetchone()[0] == 9
        s.close()


def test_store_errors_are_usage_errors() -> None:
    assert issubclass(StoreError, UsageError) and StoreError("x").exit_code == 2
    assert datetime.now(UTC).year >= 2026
