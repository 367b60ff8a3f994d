"""``repro explain RUN [CELL]``: why each deviating cell of a run deviates, ranked evidence with numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from repro.cli.common import echo, format_option, reports_errors


@click.command()
@click.argument("run")
@click.argument("cell", required=False)
@click.option("--published", "table_id", help="which published table of the target (default: its first)")
@format_option("json")
@reports_errors
def explain(run: str, cell: str | None, table_id: str | None, fmt: str) -> None:
    """For every cell of a run directory or archive that is slower, faster or inconclusive (or CELL alone,
    e.g. 1n8g-fp32-bs256): ranked evidence from the run itself - GPU telemetry (throttling, clocks below
    their maximum, other processes on the GPUs), NCCL over sockets where InfiniBand was expected, an
    input-bound run, the environment against the publication's, too few repeats for the spread."""
    from repro.errors import UsageError
    from repro.record.archive import is_run_path, opened_run
    from repro.verdict.explain import cell_key, explain_run, render_text
    from repro.verdict.reproduce import reproduce_run

    if not is_run_path(run):
        raise UsageError(f"{run}: not a run directory or run archive",
                         hint="give logs/<run-id> or logs/<run-id>.tar.gz as `repro up` wrote it")
    with opened_run(Path(run)) as opened:
        table = reproduce_run(opened.path, table_id, source=run)
        keys = sorted({cell_key(c) for c in table.cells})
        if cell is not None and cell not in keys:
            raise UsageError(f"{cell}: no such cell in {run}", hint="one of " + ", ".join(keys))
        found = explain_run(opened.path, table, environment=_facts(opened, table.manifest),
                            only=cell, published_logs=_published_logs(table))
    if fmt == "json":
        echo(json.dumps([e.as_dict() for e in found], indent=2, ensure_ascii=False))
    else:
        echo(render_text(found, run), nl=False)


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


def _published_logs(table: Any) -> dict[str, list[Path]]:
    """The publication's own log of each published cell, by the matrix cell's key."""
    if table.table is None:
        return {}
    from repro.verdict.explain import cell_key

    return {cell_key(pc): list(pc.logs) for pc in table.table.cells if pc.logs}
