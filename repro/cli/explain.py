"""``repro explain RUN|TARGET|TABLE [CELL]``: why each deviating cell deviates, ranked evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from repro.cli.common import echo, format_option, reports_errors


@click.command()
@click.argument("what", metavar="RUN|TARGET|TABLE")
@click.argument("cell", required=False)
@click.option("--published", "table_id", help="which published table of the target (default: its first)")
@click.option("--from-logs", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="a tree of your logs, judged against TARGET or TABLE as `repro report --from-logs` does")
@format_option("json")
@reports_errors
def explain(what: str, cell: str | None, table_id: str | None, from_logs: Path | None, fmt: str) -> None:
    """Ranked evidence, each item with its numbers, for every cell that is slower, faster or inconclusive
    (or CELL alone, e.g. 1n8g-fp32-bs256).

    First, where the published figure does not come from the publication's own log, whether the run agrees
    with that log; then GPU telemetry (throttling, clocks below their maximum, other processes on the
    GPUs), NCCL over sockets where InfiniBand was expected, an input-bound run (against the same target at
    1 GPU and the publication's log), the environment against the publication's, too few repeats.

    WHAT is a run directory or archive; or a target or published table with --from-logs DIR (a tree of your
    logs: what the logs show, and what they cannot); or a target or published table alone (why a published
    figure deviates from, or cannot come from, the publication's own log).
    """
    from repro.errors import UsageError
    from repro.record.archive import is_run_path
    from repro.verdict.explain import LOGS, PUBLISHED, RUN, render_text

    if is_run_path(what) and from_logs is None:
        found, kind = _of_run(what, cell, table_id), RUN
    elif is_run_path(what):
        raise UsageError(f"--from-logs {from_logs}: give it with a target or published table, not a run",
                         hint=f"repro explain TARGET --from-logs {from_logs}")
    else:
        found, kind = _of_tables(what, cell, table_id, from_logs), (LOGS if from_logs else PUBLISHED)
    if fmt == "json":
        echo(json.dumps([e.as_dict() for e in found], indent=2, ensure_ascii=False))
    else:
        echo(render_text(found, what, kind), nl=False)


def _of_run(run: str, cell: str | None, table_id: str | None) -> list[Any]:
    from repro.record.archive import opened_run
    from repro.verdict.explain import explain_run
    from repro.verdict.reproduce import reproduce_run

    with opened_run(Path(run)) as opened:
        table = reproduce_run(opened.path, table_id, source=run)
        _known(cell, [table], run)
        return explain_run(opened.path, table, environment=_facts(opened, table.manifest), only=cell)


def _of_tables(name: str, cell: str | None, table_id: str | None, from_logs: Path | None) -> list[Any]:
    """A target's or published table's cells judged on a tree of logs, or re-derived from the
    publication's own logs; explained as such."""
    from repro.measure.userlogs import scan_logs
    from repro.verdict.explain import LOGS, PUBLISHED, explain_table
    from repro.verdict.reproduce import reproduce_table, resolve_tables

    tree = scan_logs(from_logs) if from_logs else None
    tables = [reproduce_table(m, t, tree) for m, t in resolve_tables((name,), table_id)]
    _known(cell, tables, name)
    kind = LOGS if from_logs else PUBLISHED
    return [e for t in tables for e in explain_table(t, kind, only=cell)]


def _known(cell: str | None, tables: list[Any], where: str) -> None:
    from repro.errors import UsageError
    from repro.verdict.explain import cell_key

    keys = sorted({cell_key(c) for t in tables for c in t.cells})
    if cell is not None and cell not in keys:
        raise UsageError(f"{cell}: no such cell in {where}", hint="one of " + ", ".join(keys))


def _facts(run: Any, manifest: Any) -> list[Any]:
    """The run's environment (driver, CUDA, GPU, ...) and pins (image, framework version) against the
    publication's, as `repro audit` checks them from the provenance record; none without one."""
    from repro.errors import ProvenanceError
    from repro.record.audit import environment_checks, pin_checks
    from repro.layout import PROVENANCE
    from repro.record.provenance import read_record

    try:
        record = read_record(run.file(PROVENANCE))
        return environment_checks(record, manifest) + pin_checks(record, manifest, False)
    except (ProvenanceError, KeyError, TypeError, ValueError):
        return []
