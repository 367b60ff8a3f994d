"""The verbs that read targets, logs and runs: list, show, validate, plan, parse, report, audit, diff."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from repro.errors import NotSealed, NotSigned, UsageError
from repro.verdict.rules import EXIT_HELP, FAIL_ON


from repro.cli.history import record, record_finished, record_options
from repro.cli.signing import check_sign_target, sign_key_option, sign_sealed
from repro.cli.common import (
    cells_option,
    echo,
    format_option,
    hosts_option,
    parse_filter,
    reports_errors,
    scheduler_option,
)


@click.command("list")
@format_option("json")
@click.option("--wide", is_flag=True, help="one line a target, however wide (default: fit 120 columns)")
@reports_errors
def list_targets(fmt: str, wide: bool) -> None:
    """List the shipped targets and the publication each reproduces."""
    from repro.spec.describe import render_targets, target_rows
    from repro.spec.manifest import load_catalog, manifest_files

    catalog = load_catalog(manifest_files())
    if fmt == "json":
        echo(json.dumps(target_rows(catalog), indent=2))
    else:
        echo(render_targets(catalog, wide=wide))


@click.command()
@click.argument("target")
@format_option("yaml", "json")
@click.option("--wide", is_flag=True, help="one line a fact, however wide (default: fit 120 columns)")
@reports_errors
def show(target: str, fmt: str, wide: bool) -> None:
    """Show one target: pins, launch, matrix, protocol and published tables."""
    from repro.spec.manifest import find_target
    from repro.spec.describe import describe_manifest

    from repro.redact import redact_document

    m = find_target(target)
    data = redact_document(m.data)[0]
    if fmt == "json":
        echo(json.dumps(data, indent=2))
    elif fmt == "yaml":
        import yaml

        echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)
    else:
        from repro.fit import fit_text

        text = describe_manifest(m)
        echo(text if wide else fit_text(text), nl=False)


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@reports_errors
def validate(paths: tuple[Path, ...]) -> None:
    """Validate manifests, hosts files or directories of them (default: every shipped manifest)."""
    from repro.spec.manifest import validate_files

    for path, what in validate_files(list(paths)):
        echo(f"ok {path} ({what})")


@click.command()
@click.argument("target")
@hosts_option()
@cells_option
@click.option("--synthetic", is_flag=True, help="the synthetic-data run the manifest declares, no dataset")
@click.option(
    "--all",
    "all_ranks",
    is_flag=True,
    help="every rank of every cell (default: a cell of more than 16 ranks shows its first two "
    "and its last, and counts the rest)",
)
@click.option(
    "--wide",
    is_flag=True,
    help="one line a command, however wide (default: fit 120 columns, commands "
    "split with a shell line continuation)",
)
@scheduler_option
@click.option("--repeats", type=click.IntRange(min=1, max=1000),
              help="with --script: as `repro up --repeats N` would run")
@click.option("--script", is_flag=True,
              help="print only the batch script `repro up --detach` submits (exact text; needs --scheduler "
                   "slurm "
                   "or the inventory's scheduler section)")
@reports_errors
def plan(
    target: str,
    hosts_file: Path | None,
    cell_filters: tuple[str, ...],
    synthetic: bool,
    all_ranks: bool,
    wide: bool,
    scheduler: str | None,
    repeats: int | None,
    script: bool,
) -> None:
    """Dry run: image, container options and exact command for every cell and node (without --hosts:
    placeholder nodes and dataset path, said so); under Slurm, the batch script and job steps `repro up`
    submits; with --script, only the batch script of `repro up --detach`."""
    from repro.spec.manifest import find_target
    from repro.spec.manifest import synthetic as synthetic_variant
    from repro.run.plan import plan_chunks
    from repro.run.schedulers import plan_runtime, scheduled_plan

    m = find_target(target)
    m = synthetic_variant(m) if synthetic else m
    cells = m.select([parse_filter(f) for f in cell_filters])
    if not cells:
        raise UsageError(
            f"no cell of {m.id} matches {', '.join(cell_filters)}", hint="`repro show TARGET` lists its cells"
        )
    if script:
        from repro.run.schedulers import scheduled_script

        # exact: the script up --detach submits
        echo(scheduled_script(m, cells, hosts_file, scheduler, repeats), nl=False)
        return
    from repro.fit import fit_scheduler_text, fit_text

    hosts, slurm_text = scheduled_plan(m, cells, hosts_file, scheduler)
    runtime = plan_runtime(hosts, scheduler)  # under pyxis or apptainer: no docker run lines
    for chunk in plan_chunks(m, hosts, cells, all_ranks=all_ranks, runtime=runtime):
        echo(chunk if wide else fit_text(chunk), nl=False)
    echo(slurm_text if wide else fit_scheduler_text(slurm_text), nl=False)  # a batch script stays exact


@click.command()
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--parser", "parser_name", help="log format (default: detected from the head of each file)")
@click.option("--skip-records", type=click.IntRange(min=0), help="drop the first N throughput records")
@click.option("--from-iteration", type=click.IntRange(min=0), help="keep records from iteration K on")
@click.option("--window", type=click.IntRange(min=1), help="then keep at most N records")
@click.option(
    "--aggregate",
    type=click.Choice(["mean", "median", "harmonic", "summary"]),
    default="mean",
    show_default=True,
)
@click.option(
    "--gpus",
    type=click.IntRange(min=1, max=4096 * 64),
    help="GPU count of the run; multiplies per-GPU figures (PaddleClas rank-0 logs)",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1, max=1 << 20),
    help="batch per GPU of the run; with --gpus, turns the step rates of a step-time log "
         "(pytorch-examples, paddlecv-18) into images/s",
)
@format_option("json", "jsonl", help="json: a list with one object a log; jsonl: one object a line")
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1, max=1024),
    default=None,
    help="worker processes for several logs (default: one per CPU this process may use)",
)
@reports_errors
def parse(
    logs: tuple[Path, ...],
    parser_name: str | None,
    skip_records: int | None,
    from_iteration: int | None,
    window: int | None,
    aggregate: str,
    gpus: int | None,
    batch_size: int | None,
    fmt: str,
    jobs: int | None,
) -> None:
    """Apply one measurement protocol to each log file given."""
    from repro.verdict.report import render_parse_text
    from repro.verdict.reproduce import parse_logs

    protocol = {
        "skip_records": skip_records,
        "from_iteration": from_iteration,
        "window": window,
        "aggregate": aggregate,
        "gpus": gpus,
        "batch": batch_size,
    }
    failed = []  # each log's result is printed as it comes: memory stays flat
    found = parse_logs(logs, parser_name, jobs=jobs or len(os.sched_getaffinity(0)), **protocol)
    for i, (log, out) in enumerate(zip(logs, found)):
        if problem := _no_figure(log, out):
            failed.append(problem)
        if fmt == "text":
            if "error" not in out:
                echo(render_parse_text(out))
            elif len(logs) > 1:
                echo(f"{log}: error: {out['error']}")
        elif fmt == "jsonl":
            echo(json.dumps(out))
        else:
            echo(("[\n" if i == 0 else ",\n") + json.dumps(out, indent=2), nl=False)
    if fmt == "json":
        echo("\n]")
    if len(logs) == 1 and failed:
        raise UsageError(failed[0])
    if failed:
        raise UsageError(f"{len(failed)} of {len(logs)} logs gave no figure:\n  " + "\n  ".join(failed))


def _no_figure(log: Path, out: dict[str, Any]) -> str | None:
    """Why ``repro parse`` got no figure from a log (an error, no usable run), or None."""
    if "error" in out:
        return out["error"] if out["error"].startswith(str(log)) else f"{log}: {out['error']}"
    if not any(r["throughput"] is not None for r in out["results"]):
        return f"{log}: no figure: {'; '.join(out['issues']) or 'no throughput records'}"
    return None


@click.command(epilog=EXIT_HELP)
@click.argument("targets", nargs=-1, required=True)
@click.option("--published", "table_id", help="which published table of the target (default: its first)")
@click.option(
    "--from-logs",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a directory of your logs (or a repro up run directory) instead of the bundled published logs; "
    "each log goes to the cell its content fits",
)
@click.option(
    "--map",
    "maps",
    multiple=True,
    metavar="CELL=FILE",
    help="use FILE for CELL ([TARGET/]NnMg-PRECISION-bsB, as the report's detail names it); repeatable",
)
@format_option(
    "md",
    "csv",
    "json",
    "junit",
    "html",
    show_default=True,
    help="text fits 120 columns (colour on a terminal); md is full width; csv and json "
    "are tidy records; junit is one testcase per cell; html is one self-contained page",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write the chart in the format its extension names: .png, .svg or .pdf",
)
@click.option("--fail-on", help=f"verdicts that fail, comma-separated (default: all of {', '.join(FAIL_ON)})")
@sign_key_option
@record_options
@reports_errors
def report(
    targets: tuple[str, ...],
    table_id: str | None,
    from_logs: Path | None,
    maps: tuple[str, ...],
    fmt: str,
    plot: Path | None,
    fail_on: str | None,
    sign_key: Path | None,
    results_path: Path | None,
    no_record: bool,
    cluster: str | None,
) -> None:
    """Compare published tables with logs: re-derivation from the publication's own logs, or a new run
    (your logs, a run directory) judged with its repeats' own variance.

    TARGETS are target ids, or the id of a published table several targets share
    (e.g. a whole comparison table: its Paddle and NGC columns), or one run directory
    or run archive written by `repro up` (logs/<run-id>, logs/<run-id>.tar.gz).

    A run directory, archive or tree of your logs is recorded in the results store (`repro history`),
    once; --no-record leaves the store alone.
    """
    from repro.verdict.chart import plot_format
    from repro.verdict.html import render_html
    from repro.verdict.report import RENDERERS, render_junit, render_text
    from repro.verdict.rules import exit_code, parse_fail_on

    failing = parse_fail_on(fail_on)
    plot_fmt = plot_format(plot) if plot else None
    if plot and plot_fmt is None:
        raise UsageError(
            f"--plot {plot}: the chart is written as PNG, SVG or PDF, which its extension names",
            hint="end the file name with .png, .svg or .pdf",
        )
    if plot:
        _writable(plot)
    signer = check_sign_target(targets, from_logs, maps, sign_key)
    detached = _unsealed_detached(targets, from_logs, maps)
    if detached is not None:  # a detached run whose job ended: judged and sealed now, as `repro up` would
        _judge_detached(detached, fmt == "text" and not plot, failing,
                        None if no_record else (results_path, cluster), signer)
    elif signer is not None:
        sign_sealed(targets[0], signer)
    results, environment, snap = _report_results(targets, table_id, from_logs, maps, fmt,
                                                  None if no_record else cluster or "")
    if fmt == "text":
        colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        echo(render_text(results, colour=colour), nl=False, color=colour)
        _point_to_explain(targets, from_logs, maps, results)
    elif fmt == "junit":
        echo(render_junit(results, failing), nl=False)
    elif fmt == "html":
        echo(render_html(results, environment=environment, fail_on=failing), nl=False, raw=True)
    else:
        echo(RENDERERS[fmt](results), nl=False)
    if plot:
        _plot(results, plot, plot_fmt or "png")
    record(snap, results_path)
    sys.exit(exit_code((c.verdict for r in results for c in r.cells), failing))


def _point_to_explain(targets: tuple[str, ...], from_logs: Path | None, maps: tuple[str, ...],
                      results: list[Any]) -> None:
    """One line after a run's table that has deviating cells: where the evidence is."""
    from repro.record.archive import is_run_path
    from repro.verdict.explain import pointer

    if len(targets) == 1 and not from_logs and not maps and is_run_path(targets[0]):
        line = pointer(targets[0], (c for r in results for c in r.cells))
        if line:
            echo(line)


def _unsealed_detached(targets: tuple[str, ...], from_logs: Path | None,
                       maps: tuple[str, ...]) -> Path | None:
    """The run directory of a detached run not judged yet (no provenance.json), where that is all
    ``report`` was given."""
    from repro.up import is_detached
    from repro.layout import PROVENANCE

    if len(targets) != 1 or from_logs or maps:
        return None
    path = Path(targets[0])
    return path if path.is_dir() and is_detached(path) and not (path / PROVENANCE).is_file() else None


def _judge_detached(detached: Any, show: bool, failing: set[str],
                    recording: tuple[Path | None, str | None] | None, signer: Any = None) -> None:
    """Judge and seal a detached run whose job ended; with ``show``, print its table, record it
    (``recording``: the results store and cluster name; None: --no-record) and exit as `repro up` would."""
    from repro.up import adopt, image_failure
    from repro.up import finish
    from repro.verdict.rules import exit_code

    result = adopt(detached)
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    text = finish(result, colour=colour, sign_key=signer)
    if show:
        echo(text, nl=False, color=colour)
        if recording is not None:
            record_finished(result, recording[0], False, recording[1])
    failure = image_failure(result)  # judged and sealed as far as it got, then failed as an attached run
    if failure is not None:
        raise failure
    if show:
        sys.exit(5 if result.failed else exit_code(result.verdicts, failing))


def _report_results(targets: tuple[str, ...], table_id: str | None, from_logs: Path | None,
                    maps: tuple[str, ...], fmt: str,
                    cluster: str | None) -> tuple[list[Any], list[Any], Any]:
    """The tables a report judges (a run directory's, or the targets' from their logs or yours), the
    run's environment checks where the HTML page shows them, and the run as the results store keeps it
    (None: not recorded; ``cluster`` None: --no-record, "": the cluster name the run implies)."""
    from repro.measure.userlogs import check_maps, parse_maps, scan_logs
    from repro.record import snapshot
    from repro.record.archive import is_run_path, opened_run
    from repro.verdict.reproduce import reproduce_run, reproduce_table, resolve_tables

    mapped = parse_maps(maps)
    if len(targets) == 1 and is_run_path(targets[0]) and not from_logs and not maps:
        with opened_run(Path(targets[0])) as run:
            results = [reproduce_run(run.path, table_id, source=targets[0])]
            snap = (None if cluster is None else
                    snapshot.from_run(run, results, source=str(Path(targets[0]).resolve()), cluster=cluster))
            return results, run_environment(run, results[0].manifest) if fmt == "html" else [], snap
    tables = resolve_tables(targets, table_id)
    check_maps(mapped, tables)
    tree = scan_logs(from_logs) if from_logs else None  # read once for every table
    results = [reproduce_table(m, t, tree, mapped) for m, t in tables]
    where = str(from_logs.resolve()) if from_logs else "--map " + " ".join(maps)
    snap = (None if cluster is None or not (from_logs or maps)
            else snapshot.from_logs(results, source=where, cluster=cluster or None))
    return results, [], snap


def _writable(plot: Path) -> None:
    """Refuse a plot path that cannot be written before the report is made (a chart takes seconds to
    draw); a file that is there is left as it is."""
    there = plot.exists()
    try:
        with open(plot, "ab"):
            pass
    except OSError as e:
        raise UsageError(f"cannot write the plot to {plot}: {e.strerror}",
                         hint="give a writable path") from None
    if not there:
        plot.unlink()


def _plot(results: list[Any], plot: Path, fmt: str) -> None:
    from repro.verdict.chart import plot_report

    try:
        plot_report(results, plot, fmt)
    except OSError as e:
        raise UsageError(f"cannot write the plot to {plot}: {e.strerror}",
                         hint="give a writable path") from None
    except (ValueError, RuntimeError) as e:  # what matplotlib raises for what it cannot draw
        raise UsageError(f"cannot draw the chart: {e}") from None
    echo(f"plot written to {plot}", err=True)


def run_environment(run: Any, manifest: Any) -> list[Any]:
    """A run's environment against its publication's, from its provenance record (none: empty)."""
    from repro.record.audit import environment_checks
    from repro.errors import ProvenanceError
    from repro.layout import PROVENANCE
    from repro.record.provenance import read_record

    try:
        return environment_checks(read_record(run.file(PROVENANCE)), manifest)
    except ProvenanceError:
        return []


@click.command()
@click.argument("run", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--against", "target", help="compare with this target's current manifest (default: the run's own)"
)
@click.option("--key", type=click.Path(dir_okay=False, path_type=Path),
              help="verify the run's signature by this key too: an ed25519 public key (PEM), an SSH public "
                   "key or an allowed_signers file")
@click.option("--require-signature", is_flag=True,
              help=f"exit {NotSigned.exit_code} when the run is not signed (with --key)")
@format_option("json")
@reports_errors
def audit(run: Path, target: str | None, key: Path | None, require_signature: bool, fmt: str) -> None:
    """Verify a run directory or archive: checksums, schema, pins, environment, results, and with --key its
    signature (exit 6 on drift/tampering or a signature not by the key, 10 for a run never sealed; with
    --require-signature, 9 when it is not signed)."""
    import dataclasses

    from repro.record.audit import NOT_SEALED, NOT_SIGNED, audit as audit_run, failing, render
    from repro.record.dsse import load_keys
    from repro.errors import ProvenanceError

    if require_signature and key is None:
        raise UsageError("--require-signature needs a key (--key): the key whose signature is required",
                         hint="repro audit RUN (with --require-signature and --key)")
    checks = audit_run(run, target, keys=load_keys(key) if key else None)
    echo(json.dumps([dataclasses.asdict(c) for c in checks], indent=2) if fmt == "json" else render(checks),
         nl=fmt == "json")
    bad = failing(checks)
    if bad and all(c.status == NOT_SEALED for c in bad):
        raise NotSealed(f"{run} was never sealed: nothing in it can be verified",
                        hint=f"repro up --resume {run} finishes and seals it")
    if bad:
        raise ProvenanceError(
            f"{len(bad)} check(s) failed: " + "; ".join(f"{c.item} {c.status}" for c in bad[:5]),
            hint="the table above says what differs from what was recorded or expected",
        )
    if require_signature and any(c.status == NOT_SIGNED for c in checks):
        raise NotSigned(f"{run} is not signed", hint=f"repro report {run} signs it (with --sign-key)")


@click.command()
@click.argument("a")
@click.argument("b")
@reports_errors
def diff(a: str, b: str) -> None:
    """Two runs (directories or archives), or a run and a target's publication, side by side."""
    from repro.record.diff import diff as diff_runs

    echo(diff_runs(a, b), nl=False)
