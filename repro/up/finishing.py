"""The finish of a run, attached or detached: its scheduler's facts and the provenance sealed on every way
out, then the judgement (the run's logs parsed with the manifest's protocol, the published table beside the
reproduced one), the reports and the archive."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from repro.errors import ReproError
from repro.events import Event, Progress, ignore
from repro.run.rundir import RunDir
from repro.up.start import UpResult

log = logging.getLogger(__name__)


def keep_scheduler_facts(result: UpResult, facts: Mapping[str, Any] | None) -> None:
    """The allocation this invocation ran in (job id, partition, nodes, batch script, steps), one entry per
    allocation, and the allocation's batch script beside the record."""
    if facts:
        kept = [a for a in result.record.get("scheduler", []) if a.get("job_id") != facts["job_id"]]
        result.record["scheduler"] = [*kept, facts]
        if facts.get("sbatch_script"):
            result.run.write_text(f"slurm-{facts['job_id']}.sbatch", facts["sbatch_script"])


def seal(result: UpResult, progress: Progress) -> None:
    """Provenance and checksums on every way out, so even a stopped run is auditable as far as it got."""
    from repro.record import provenance

    try:
        provenance.finalize(result.run, result.record)
    except ReproError as e:
        progress(Event("warn", f"provenance not written: {e}"))


def finish(result: UpResult, *, colour: bool = False, sign_key: Any = None) -> str:
    """Parse the run's logs with the manifest's protocol, write the reports into the run directory
    (report.md/csv/json/png, report.html), seal it, sign it with ``sign_key`` (a repro.record.dsse.Signer),
    fill ``result.verdicts`` and return the table with a closing summary for the CLI to print."""
    from repro.record.audit import environment_checks
    from repro.verdict.html import render_html
    from repro.verdict.report import render_text
    from repro.verdict.reproduce import reproduce_run
    from repro.record import archive, sign

    run = result.run
    table = result.table = reproduce_run(run.path)
    ran = {(c.nodes, c.gpus, c.precision, c.batch_size) for c in result.cells}
    result.verdicts = [c.verdict for c in table.cells
                       if not ran or (c.nodes, c.gpus, c.precision, c.batch_size) in ran]
    findings = findings_section(result.record)
    write_reports(run, [table], findings)
    chart = _draw_chart(table, run)
    try:  # the environment against the publication's, as far as the record has it
        environment = environment_checks(result.record, result.manifest) if result.record.get("nodes") else []
    except (KeyError, TypeError, ValueError):
        environment = []
    png = run.file("report.png").read_bytes() if chart is None else None  # drawn once, for both
    run.write_text("report.html", render_html([table], environment=environment, chart=png))
    seal(result, ignore)
    signed = f"signed by keyid {sign.sign_run(run.path, sign_key)}\n" if sign_key is not None else ""
    packed = archive.create(run)
    overhead = result.seconds - result.cell_seconds
    summary = (f"\nrun {run.path}: {result.done} repeat(s) done, {len(result.failed)} failed"
               + (f" ({', '.join(result.failed)})" if result.failed else "")
               + f"; {result.seconds:.0f} s in all, {result.cell_seconds:.0f} s in cells\n")
    summary += f"report {run.file('report.html')}\n" + (f"chart not drawn: {chart}\n" if chart else "")
    summary += f"archive {packed} (check it with: repro audit {packed})\n" + signed
    if result.failed:
        summary += f"finish it with: repro up --resume {run.path}\n"
    log.debug("kit overhead outside cells: %.1f s", overhead)
    return render_text([table], colour=colour) + findings + summary


def _draw_chart(table: Any, run: RunDir) -> str | None:
    """report.png; a chart that cannot be drawn is said so (returned) and never stops the run's sealing."""
    from repro.verdict.chart import plot_report

    try:
        plot_report([table], run.file("report.png"))
    except Exception as err:  # noqa: BLE001 - matplotlib raises many kinds; the archive matters more
        if run.file("report.png").is_file():
            run.file("report.png").unlink()
        return f"{type(err).__name__}: {err}"
    return None


def write_reports(run: RunDir, tables: Sequence[Any], findings: str = "") -> None:
    """report.md/csv/json of the run's tables; ``findings`` (a markdown section) closes report.md."""
    from repro.verdict.report import RENDERERS

    for fmt, render in RENDERERS.items():
        run.write_text(f"report.{fmt}", render(tables) + (findings if fmt == "md" else ""))


def findings_section(record: Mapping[str, Any]) -> str:
    """The run's findings (e.g. NCCL over sockets where InfiniBand was expected) as a report section."""
    found = record.get("findings") or []
    if not found:
        return ""
    lines = [f"- {f['cell']} repeat {f['repeat']}: {f['kind']}: {f['text']}" for f in found]
    return "\nFindings:\n\n" + "\n".join(lines) + "\n"
