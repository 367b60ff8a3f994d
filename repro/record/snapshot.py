"""A run as the results store keeps it (:class:`repro.record.store.Snapshot`): from a ``repro up`` run
directory or archive, or from a tree of your logs (``repro report --from-logs``, ``--map``).

A run is identified by the SHA-256 of its provenance record (``provenance.json``: it holds the digest of
every log and report), a log tree by the SHA-256 of the sorted digests of the contents of the logs its
cells were judged on, whatever their names. The facts are :mod:`repro.record.diff`'s, the one place that
reads a run's environment for `repro diff` and `repro compare` alike. Only your own figures are kept: the
cells of a new run (or a measured-only target) that had a log; cells re-derived from the publication's own
logs, and cells no log was found for, are not a run of yours. A run's cells keep the summary of the
telemetry its nodes sampled while they ran (:func:`repro.nodes.telemetry.summary`), where there is one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro.digest import sha256_file
from repro.errors import ProvenanceError
from repro.nodes.telemetry import summary as telemetry_summary
from repro.record.archive import opened_run
from repro.record.diff import side_from_logs, side_from_run
from repro.record.provenance import now, read_record
from repro.record.store import Snapshot
from repro.layout import PROVENANCE, STATE, is_cell_file
from repro.run.rundir import RunDir
from repro.spec.manifest import Cell
from repro.verdict.report import is_cpu
from repro.verdict.reproduce import CellResult, TableResult
from repro.verdict.rules import NEW_RUN, NOT_PUBLISHED, NOT_RUN


def kept(c: CellResult) -> bool:
    """A cell of yours with a log: a new run's or a measured-only target's."""
    return c.kind == NEW_RUN and c.verdict not in (NOT_RUN, NOT_PUBLISHED) and bool(c.logs)


def cell_key(c: CellResult) -> str:
    return Cell(c.nodes, c.gpus // max(c.nodes, 1), c.precision, c.batch_size).key


def cell_rows(results: Sequence[TableResult]) -> list[dict[str, Any]]:
    """The cells worth keeping, as rows of the store's cells table."""
    out = []
    for r in results:
        for c in r.cells:
            if not kept(c):
                continue
            out.append({"tbl": r.table.id if r.table else "", "target": c.target, "cell": cell_key(c),
                        "framework": c.column, "device": "CPU" if is_cpu(r) else "GPU", "nodes": c.nodes,
                        "gpus": c.gpus, "precision": c.precision, "batch_size": c.batch_size,
                        "unit": r.manifest.unit, "published": c.published,
                        "value": c.reproduced, "low": c.low, "high": c.high, "repeats": list(c.repeats),
                        "n": len(c.repeats),
                        "spread_pct": c.spread_pct, "delta_pct": c.delta_pct, "verdict": c.verdict,
                        "reason": c.detail or None, "tolerance_pct": c.tolerance_pct,
                        "tolerance_reason": c.tolerance_reason or None, "telemetry": None})
    return out


def _facts(side: Any, cluster: str | None) -> dict[str, Any]:
    env = dict(side.env)
    if cluster:
        env["cluster"] = cluster
    return {"env": env, "pins": dict(side.pins)}


def from_run(run: RunDir, results: Sequence[TableResult], *, source: str,
             cluster: str | None = None) -> Snapshot:
    """A ``repro up`` run (its directory open, or an archive unpacked) and the tables judged on it."""
    started = None
    try:
        started = read_record(run.file(PROVENANCE)).started
        side = side_from_run(run)
        digest = "run:" + sha256_file(run.file(PROVENANCE))
    except ProvenanceError:  # never sealed (a run stopped hard): its logs identify it
        side = side_from_logs(run.run_id, [], cluster)
        digest = "run:" + _logs_digest([run.path / p for p in run.files() if is_cell_file(p)])
    facts = _facts(side, cluster)
    rows = cell_rows(results)
    for row in rows:  # what the nodes sampled while the cell ran (repro.nodes.telemetry), where they did
        row["telemetry"] = telemetry_summary(run.path, row["cell"])
    started = started or _mtime([run.file(STATE)])
    return Snapshot(digest, "run", run.run_id, source, started,
                    facts["env"].get("cluster"), facts, rows)


def from_logs(results: Sequence[TableResult], *, source: str, cluster: str | None = None) -> Snapshot:
    """A tree of your logs (or logs --map named) and the tables judged on them (no cells: none of
    yours had a log, and there is nothing to record)."""
    rows = cell_rows(results)
    if not rows:
        return Snapshot("", "logs", None, source, now(), cluster, {"env": {}, "pins": {}}, [])
    logs = sorted({Path(p) for r in results for c in r.cells if kept(c) for p in c.logs})
    facts = _facts(side_from_logs(source, logs, cluster), cluster)
    return Snapshot("logs:" + _logs_digest(logs), "logs", None, source, _mtime(logs), cluster, facts, rows)


def of_path(path: Path, *, table_id: str | None = None, cluster: str | None = None) -> Snapshot:
    """A run directory or archive, judged as `repro report RUN` judges it."""
    from repro.verdict.reproduce import reproduce_run

    with opened_run(path) as run:
        results = [reproduce_run(run.path, table_id, source=str(path))]
        return from_run(run, results, source=str(Path(path).resolve()), cluster=cluster)


def _logs_digest(logs: Sequence[Path]) -> str:
    """The SHA-256 of the logs' contents: their digests, sorted (names and places do not count)."""
    lines = sorted(sha256_file(p) for p in logs)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _mtime(paths: Sequence[Path]) -> str:
    """When the newest of ``paths`` was written, as the store writes times; now when none can be read."""
    times = []
    for p in paths:
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            continue
    if not times:
        return now()
    return datetime.fromtimestamp(max(times), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
