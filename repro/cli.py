"""The ``repro`` command line: one thin command per verb.

This is the only module that prints, chooses exit codes or configures logging;
everything it calls raises ReproError subclasses that carry their own exit code.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from repro import __version__
from repro.errors import InputError, ReproError, UsageError
from repro.redact import shown
from repro.verdict.rules import EXIT_HELP, FAIL_ON

F = TypeVar("F", bound=Callable[..., Any])


def echo(text: Any = "", *, err: bool = False, nl: bool = True, color: bool | None = None,
         raw: bool = False) -> None:
    """Everything the CLI prints: secrets blanked and terminal control removed (``repro.redact.shown``);
    ``raw`` for a document that did so to each text it holds (the HTML page)."""
    text = str(text) if raw else shown(str(text), colour=bool(color))
    click.echo(text, err=err, nl=nl, color=color)


def _fail(err: ReproError) -> None:
    if isinstance(err, InputError):
        for p in err.problems:
            echo(f"error: {p}", err=True)
            if p.hint:
                echo(f"  hint: {p.hint}", err=True)
    else:
        echo(f"error: {err}", err=True)
        if err.hint:
            echo(f"hint: {err.hint}", err=True)
    sys.exit(err.exit_code)


def reports_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ReproError as e:
            _fail(e)

    return wrapper  # type: ignore[return-value]


def parse_filter(text: str) -> dict[str, Any]:
    """``nodes=4,precision=amp`` -> {'nodes': 4, 'precision': 'amp'}."""
    keys = {"nodes", "gpus_per_node", "gpus", "precision", "batch_size"}
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        k, sep, v = part.partition("=")
        if not sep or k not in keys:
            raise UsageError(f"bad cell filter {part!r}", hint=f"use KEY=VALUE[,KEY=VALUE], KEY one of {', '.join(sorted(keys))}")
        out[k] = v if k == "precision" else _int(v, part)
    return out


def _int(v: str, part: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"bad cell filter {part!r}: {v!r} is not a whole number") from None


scheduler_option = click.option(
    "--scheduler", metavar="KIND[:KEY=VALUE,...]",
    help="ssh, or slurm[:partition=P,account=A,time=T,constraint=C,container=docker|pyxis] "
         "(over the inventory's scheduler section)")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="repro")
def cli() -> None:
    """Reproduce published deep-learning benchmark tables with one command."""


@cli.command("list")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--wide", is_flag=True, help="one line a target, however wide (default: fit 120 columns)")
@reports_errors
def list_targets(fmt: str, wide: bool) -> None:
    """List the shipped targets and the publication each reproduces."""
    from repro.spec.manifest import load_catalog, manifest_files

    catalog = load_catalog(manifest_files())
    rows = [{"id": m.id, "framework": m.framework, "cells": len(m.cells()),
             "tables": ", ".join(t.id for t in m.published) or "-",
             "published": ", ".join(f"{t.cite['repository'].removeprefix('https://github.com/')}@{t.cite['commit'][:7]} "
                                    f"{t.cite['path']}" for t in m.published) or "(none: measures only)"}
            for m in catalog.values()]
    if fmt == "json":
        echo(json.dumps(rows, indent=2))
    else:
        from tabulate import tabulate

        if wide:
            echo(tabulate(rows, headers="keys", tablefmt="simple"))
        else:  # a target a line, its citations indented under it: 120 columns
            from repro.fit import fit_line

            w = max(len(r["id"]) for r in rows) + 2
            echo(f"{'id':<{w}}{'framework':<12}{'cells':>5}  tables (indented: where each is published)")
            echo(f"{'-' * (w - 2)}  {'-' * 10}  {'-' * 5}  {'-' * 50}")
            for r in rows:
                echo(fit_line(f"{r['id']:<{w}}{r['framework']:<12}{r['cells']:>5}  {r['tables']}"))
                for cite in r["published"].split(", "):
                    echo(fit_line(f"    {cite}"))
        tables: dict[str, list[str]] = {}
        for m in catalog.values():
            for t in m.published:
                tables.setdefault(t.id, []).append(m.id)
        echo("\npublished tables (`repro report TABLE` re-derives a whole table; `repro report TARGET` one "
             "column):")
        import textwrap

        room = 120 - 2 - max(map(len, tables), default=0)

        def targets(ids: list[str]) -> str:  # wrapped between ids, never inside one
            return ", ".join(ids) if wide else "\n".join(textwrap.wrap(", ".join(ids), room, break_on_hyphens=False))

        echo(tabulate([{"table": t, "targets": targets(ids)} for t, ids in sorted(tables.items())],
                            headers="keys", tablefmt="simple"))


@cli.command()
@click.argument("target")
@click.option("--format", "fmt", type=click.Choice(["text", "yaml", "json"]), default="text")
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


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@reports_errors
def validate(paths: tuple[Path, ...]) -> None:
    """Validate manifests, hosts files or directories of them (default: every shipped manifest)."""
    from repro.spec.manifest import validate_files

    for path, what in validate_files(list(paths)):
        echo(f"ok {path} ({what})")


@cli.command()
@click.argument("target")
@click.option("--hosts", "hosts_file", type=click.Path(path_type=Path), help="hosts inventory (default: this machine)")
@click.option("--cells", "cell_filters", multiple=True, help="only cells matching KEY=VALUE[,KEY=VALUE]; repeatable")
@click.option("--synthetic", is_flag=True, help="the synthetic-data run the manifest declares, no dataset")
@click.option("--all", "all_ranks", is_flag=True,
              help="every rank of every cell (default: a cell of more than 16 ranks shows its first two "
                   "and its last, and counts the rest)")
@click.option("--wide", is_flag=True, help="one line a command, however wide (default: fit 120 columns, commands "
              "split with a shell line continuation)")
@scheduler_option
@reports_errors
def plan(target: str, hosts_file: Path | None, cell_filters: tuple[str, ...], synthetic: bool,
         all_ranks: bool, wide: bool, scheduler: str | None) -> None:
    """Dry run: image, container options and exact command for every cell and node (without --hosts:
    placeholder nodes and dataset path, said so); under Slurm, the batch script and job steps `repro up` submits."""
    from repro.spec.manifest import find_target
    from repro.spec.manifest import synthetic as synthetic_variant
    from repro.run.plan import plan_chunks, select_cells
    from repro.run.schedulers import scheduled_plan

    m = find_target(target)
    m = synthetic_variant(m) if synthetic else m
    cells = select_cells(m, [parse_filter(f) for f in cell_filters])
    if not cells:
        raise UsageError(f"no cell of {m.id} matches {', '.join(cell_filters)}", hint="`repro show TARGET` lists its cells")
    from repro.fit import fit_text

    hosts, slurm_text = scheduled_plan(m, cells, hosts_file, scheduler)
    for chunk in plan_chunks(m, hosts, cells, all_ranks=all_ranks):
        echo(chunk if wide else fit_text(chunk), nl=False)
    echo(slurm_text, nl=False)  # a batch script stays exact


@cli.command()
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--parser", "parser_name", help="log format (default: detected from the head of each file)")
@click.option("--skip-records", type=click.IntRange(min=0), help="drop the first N throughput records")
@click.option("--from-iteration", type=click.IntRange(min=0), help="keep records from iteration K on")
@click.option("--window", type=click.IntRange(min=1), help="then keep at most N records")
@click.option("--aggregate", type=click.Choice(["mean", "median", "harmonic", "summary"]), default="mean", show_default=True)
@click.option("--gpus", type=click.IntRange(min=1),
              help="GPU count of the run; multiplies per-GPU figures (PaddleClas rank-0 logs)")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "jsonl"]), default="text",
              help="json: a list with one object a log; jsonl: one object a line")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="worker processes for several logs (default: one per CPU this process may use)")
@reports_errors
def parse(logs: tuple[Path, ...], parser_name: str | None, skip_records: int | None, from_iteration: int | None,
          window: int | None, aggregate: str, gpus: int | None, fmt: str, jobs: int | None) -> None:
    """Apply one measurement protocol to each log file given."""
    from repro.verdict.report import render_parse_text
    from repro.verdict.reproduce import parse_logs

    if skip_records is not None and from_iteration is not None:
        raise UsageError("give --skip-records or --from-iteration, not both")
    protocol = {"skip_records": skip_records, "from_iteration": from_iteration, "window": window,
                "aggregate": aggregate, "gpus": gpus}
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


@cli.command(epilog=EXIT_HELP)
@click.argument("targets", nargs=-1, required=True)
@click.option("--published", "table_id", help="which published table of the target (default: its first)")
@click.option("--from-logs", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="a directory of your logs (or a repro up run directory) instead of the bundled published logs; "
                   "each log goes to the cell its content fits")
@click.option("--map", "maps", multiple=True, metavar="CELL=FILE",
              help="use FILE for CELL ([TARGET/]NnMg-PRECISION-bsB, as the report's detail names it); repeatable")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "csv", "json", "junit", "html"]), default="text",
              show_default=True, help="text fits 120 columns (colour on a terminal); md is full width; csv and json "
              "are tidy records; junit is one testcase per cell; html is one self-contained page")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="write the chart in the format its extension names: .png, .svg or .pdf")
@click.option("--fail-on", help=f"verdicts that fail, comma-separated (default: all of {', '.join(FAIL_ON)})")
@reports_errors
def report(targets: tuple[str, ...], table_id: str | None, from_logs: Path | None, maps: tuple[str, ...], fmt: str,
           plot: Path | None, fail_on: str | None) -> None:
    """Compare published tables with logs: re-derivation from the publication's own logs, or a new run
    (your logs, a run directory) judged with its repeats' own variance.

    TARGETS are target ids, or the id of a published table several targets share
    (e.g. a whole comparison table: its Paddle and NGC columns), or one run directory
    or run archive written by `repro up` (logs/<run-id>, logs/<run-id>.tar.gz).
    """
    from repro.record.archive import is_run_path, opened_run
    from repro.verdict.report import RENDERERS, plot_format, plot_report, render_html, render_junit, render_text
    from repro.verdict.reproduce import reproduce_run, reproduce_table, resolve_tables
    from repro.measure.userlogs import check_maps, parse_maps, scan_logs
    from repro.verdict.rules import exit_code, parse_fail_on

    failing = parse_fail_on(fail_on)
    plot_fmt = plot_format(plot) if plot else None
    if plot and plot_fmt is None:
        raise UsageError(f"--plot {plot}: the chart is written as PNG, SVG or PDF, which its extension names",
                         hint="end the file name with .png, .svg or .pdf")
    mapped = parse_maps(maps)
    environment: list[Any] = []
    if len(targets) == 1 and is_run_path(targets[0]) and not from_logs and not maps:
        with opened_run(Path(targets[0])) as run:
            results = [reproduce_run(run.path, table_id, source=targets[0])]
            if fmt == "html":
                environment = _run_environment(run, results[0].manifest)
    else:
        tables = resolve_tables(targets, table_id)
        check_maps(mapped, tables)
        tree = scan_logs(from_logs) if from_logs else None  # read once for every table
        results = [reproduce_table(m, t, tree, mapped) for m, t in tables]
    if fmt == "text":
        colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        echo(render_text(results, colour=colour), nl=False, color=colour)
    elif fmt == "junit":
        echo(render_junit(results, failing), nl=False)
    elif fmt == "html":
        echo(render_html(results, environment=environment, fail_on=failing), nl=False, raw=True)
    else:
        echo(RENDERERS[fmt](results), nl=False)
    if plot:
        try:
            plot_report(results, plot, plot_fmt or "png")
        except OSError as e:
            raise UsageError(f"cannot write the plot to {plot}: {e.strerror}", hint="give a writable path") from None
        except (ValueError, RuntimeError) as e:  # what matplotlib raises for what it cannot draw
            raise UsageError(f"cannot draw the chart: {e}") from None
        echo(f"plot written to {plot}", err=True)
    sys.exit(exit_code((c.verdict for r in results for c in r.cells), failing))


def _run_environment(run: Any, manifest: Any) -> list[Any]:
    """A run's environment against its publication's, from its provenance record (none: empty)."""
    from repro.record.audit import environment_checks
    from repro.errors import ProvenanceError
    from repro.record.provenance import load_record

    try:
        return environment_checks(load_record(run.file("provenance.json")), manifest)
    except ProvenanceError:
        return []


def image_options(fn: F) -> F:
    """The options that say how a target's image is obtained; shared by `images` and `up`."""
    for option in reversed([
        click.option("--push", metavar="REGISTRY", help="push a built image to HOST[:PORT][/PREFIX]; nodes then pull it"),
        click.option("--allow-unpinned", is_flag=True, help="use what a tag-only reference points to now (and record it)"),
        click.option("--update-lock", is_flag=True, help="accept pins that differ from the lock file and rewrite it"),
        click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="CA bundle for builds behind a TLS-intercepting proxy (kept out of the image)"),
        click.option("--wheels", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     help="directory of *.whl files the build may install from"),
    ]):
        fn = option(fn)
    return fn


def _mirror(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    from repro.images.source import parse_mirror

    try:
        return tuple(parse_mirror(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


git_mirror_option = click.option(
    "--git-mirror", multiple=True, metavar="PREFIX=URL", callback=_mirror,
    help="read source repositories starting with PREFIX from URL instead (a local mirror directory or an internal "
         "server), e.g. https://github.com/=/srv/git/; repeatable")


def _image_events(verbose: bool) -> Callable[[Any], None]:
    """Render images-library events: phases and results always, build output with -v."""

    def show(e: Any) -> None:
        from repro.progress import redacted

        e = redacted(e)
        where = f"[{e.node}] " if e.node else ""
        if e.kind == "step":
            echo(f"==> {where}{e.message}", err=True)
        elif e.kind == "log" and verbose:
            echo(f"    {e.message}", err=True)
        elif e.kind == "warn":
            echo(f"warning: {where}{e.message}", err=True)
        elif e.kind in ("info", "node"):
            echo(f"    {where}{e.message}", err=True)

    return show


@cli.command()
@click.argument("target")
@click.option("--hosts", "hosts_file", type=click.Path(path_type=Path), help="hosts inventory (default: this machine)")
@click.option("--pull", "mode", flag_value="pull", help="only pull by digest; never build")
@click.option("--build", "mode", flag_value="build", help="build even when a current image is present")
@image_options
@click.option("--ofed-cache", type=click.Path(file_okay=False, path_type=Path), help="MLNX_OFED tarball directory")
@git_mirror_option
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), help="build contexts and logs")
@click.option("--no-cache", is_flag=True, help="build without the engine's layer cache")
@click.option("--dry-run", is_flag=True, help="print the Dockerfiles a build would run; do nothing")
@click.option("-v", "--verbose", is_flag=True, help="show every line of build output")
@reports_errors
def images(target: str, hosts_file: Path | None, mode: str | None, push: str | None, allow_unpinned: bool,
           update_lock: bool, ca_bundle: Path | None, wheels: Path | None, ofed_cache: Path | None,
           git_mirror: tuple[tuple[str, str], ...], work_dir: Path | None, no_cache: bool, dry_run: bool,
           verbose: bool) -> None:
    """Pull or build TARGET's image exactly as pinned and put it on every node."""
    from repro.spec.hosts import load_hosts
    from repro.images import BuildOptions, ImagesOptions, dry_run_text, prepare
    from repro.spec.manifest import find_target

    m = find_target(target)
    if dry_run:
        echo(dry_run_text(m), nl=False)
        return
    build = BuildOptions(ca_bundle=ca_bundle, work_dir=work_dir, ofed_cache=ofed_cache, wheels=wheels, no_cache=no_cache,
                         git_mirrors=git_mirror)
    opts = ImagesOptions(mode=mode or "auto", push=push, allow_unpinned=allow_unpinned, update_lock=update_lock,
                         build=build)
    r = prepare(m, load_hosts(hosts_file), opts, progress=_image_events(verbose))
    echo(f"image {r.reference}\nid {r.image_id}")
    for role, ref in r.pins.images.items():
        echo(f"pinned {role} {ref.pinned}")
    if r.pushed:
        echo(f"pushed {r.pushed.pinned}")
    if r.built:
        echo(f"built in {r.built.seconds:.1f} s, log {r.built.log}")
    for n in r.nodes:
        echo(f"node {n.node} {n.how} {n.image_id}")
    echo(f"lock {r.lock_path} ({'written' if r.lock_written else 'unchanged'}); {r.seconds:.1f} s")


@cli.command("check")
@click.argument("targets", nargs=-1, required=True)
@git_mirror_option
@click.option("--ofed-cache", type=click.Path(file_okay=False, path_type=Path), help="MLNX_OFED bundle directory")
@click.option("--resolve", is_flag=True, help="also ask the package index: upload times of the locked "
              "versions against the cutoff, and whether the requirements still resolve")
@click.option("--index-url", default=None,
              help="the package index (PEP 691) for --resolve [default: the lock's]")
@reports_errors
def check_command(targets: tuple[str, ...], git_mirror: tuple[tuple[str, str], ...], ofed_cache: Path | None,
                  resolve: bool, index_url: str | None) -> None:
    """Check TARGETs' recipes against their sources before a build (one line per failed check)."""
    from repro.images.check import CheckOptions, check_target
    from repro.spec.manifest import find_target

    manifests = [find_target(t) for t in targets]
    opts = CheckOptions(git_mirrors=git_mirror, ofed_cache=ofed_cache, resolve=resolve, index_url=index_url)
    failed = 0
    for m in manifests:
        result = check_target(m, opts)
        for f in result.failures:
            echo(f"FAIL {f}")
        if not result.failures:
            echo(f"ok   {m.id}: " + "; ".join(result.passed or ("nothing to check",)))
        failed += len(result.failures)
    if failed:
        sys.exit(1)


@cli.command("lock")
@click.argument("target")
@click.option("--update-lock", "update", is_flag=True, help="rewrite a lock that differs from what resolves now")
@click.option("--deps-only", is_flag=True, help="only resolve the Python dependency lock (image.build.deps)")
@click.option("--index-url", default=None,
              help="the package index (PEP 691) the dependency lock resolves from "
                   "[default: https://pypi.org/simple]")
@reports_errors
def lock_command(target: str, update: bool, deps_only: bool, index_url: str | None) -> None:
    """Resolve TARGET's tags to digests and branches to commits; write or check its lock file. A target that
    declares image.build.deps also gets its Python dependency lock, resolved as of the cutoff."""
    from repro.images import deps, lock_target
    from repro.spec.manifest import find_target

    manifest = find_target(target)
    if deps.declared(manifest) is not None:
        dpath, changed = deps.write_lock(manifest, index_url or deps.DEFAULT_INDEX)
        shown = dpath.relative_to(Path.cwd()) if dpath.is_relative_to(Path.cwd()) else dpath
        click.echo(f"dependency lock {'written' if changed else 'unchanged'}: {shown} "
                   f"({len(deps.pins(dpath.read_text(encoding='utf-8')))} pins as of "
                   f"{manifest.image['build']['deps']['cutoff']})")
    elif deps_only:
        raise UsageError(f"{manifest.id} declares no image.build.deps: there is no dependency lock to make")
    if deps_only:
        return
    path, pins, written = lock_target(manifest, update=update, progress=_image_events(False))
    for role, ref in pins.images.items():
        echo(f"{role} {ref.tagged} -> {ref.digest}")
    for name, src in pins.sources.items():
        branch = f" (branch {src['branch']} -> {src['branch_commit']})" if "branch_commit" in src else ""
        echo(f"{name} {src['repository']} @ {src['commit']}{branch}")
    for name, sha in pins.files.items():
        echo(f"file {name} sha256 {sha}")
    echo(f"lock {'written' if written else 'unchanged'}: {path}")


@cli.command()
@click.argument("run", type=click.Path(exists=True, path_type=Path))
@click.option("--against", "target", help="compare with this target's current manifest (default: the run's own)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@reports_errors
def audit(run: Path, target: str | None, fmt: str) -> None:
    """Verify a run directory or archive: checksums, schema, pins, environment, results (exit 6 on drift/tampering)."""
    import dataclasses

    from repro.record.audit import audit as audit_run, failing, render
    from repro.errors import ProvenanceError

    checks = audit_run(run, target)
    echo(json.dumps([dataclasses.asdict(c) for c in checks], indent=2) if fmt == "json" else render(checks),
               nl=fmt == "json")
    bad = failing(checks)
    if bad:
        raise ProvenanceError(f"{len(bad)} check(s) failed: " + "; ".join(f"{c.item} {c.status}" for c in bad[:5]),
                              hint="the table above says what differs from what was recorded or expected")


@cli.command()
@click.argument("a")
@click.argument("b")
@reports_errors
def diff(a: str, b: str) -> None:
    """Two runs (directories or archives), or a run and a target's publication, side by side."""
    from repro.record.diff import diff as diff_runs

    echo(diff_runs(a, b), nl=False)


@cli.command()
@click.argument("target", required=False)
@click.option("--hosts", "hosts_file", type=click.Path(path_type=Path), help="hosts inventory (default: this machine)")
@click.option("--strict", is_flag=True, help="deviations from the target's expected hardware are errors (exit 3)")
@click.option("--accept-new-host-keys", is_flag=True, help="accept and record host keys of new nodes (never changed keys)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@scheduler_option
@reports_errors
def preflight(target: str | None, hosts_file: Path | None, strict: bool, accept_new_host_keys: bool, fmt: str,
              scheduler: str | None) -> None:
    """Check every node: SSH, Docker, GPUs, InfiniBand, disk, clock; compare with TARGET's expected hardware
    and check that TARGET's dataset is where the hosts file says, in its format. Under Slurm: the same
    probe as a job step on the nodes of an allocation (the one it runs in, else a short one)."""
    from repro.spec.hosts import load_hosts
    from repro.spec.manifest import find_target
    from repro.nodes.preflight import assess, compare, dataset_to_check, render_preflight, site_checks, to_json
    from repro.run.schedulers import scheduled_preflight

    manifest = find_target(target) if target else None
    expect = manifest.expect if manifest else {}
    hosts = load_hosts(hosts_file)
    dataset = dataset_to_check(manifest, hosts, required=False) if manifest else None
    reports, size = scheduled_preflight(hosts, manifest, scheduler, accept_new_host_keys=accept_new_host_keys,
                                  dataset=dataset, progress=_image_events(False))
    deviations = compare(reports, expect, size)
    more, blocking = site_checks(reports, manifest, hosts.env, manifest.cells() if manifest else ())
    deviations += more
    echo(to_json(reports, deviations, blocking) if fmt == "json" else
               render_preflight(reports, deviations, blocking), nl=fmt == "json")
    if manifest and manifest.dataset_format and dataset is None:
        echo(f"note: dataset not checked: the hosts file names no directory for {manifest.dataset_format}, "
                   f"which `repro up {manifest.id}` needs (`data: {{{manifest.dataset_format}: /path}}`)", err=True)
    assess(reports, deviations, strict=strict, blocking=blocking)


@cli.command()
@click.argument("target", required=False)
@click.option("--hosts", "hosts_file", type=click.Path(path_type=Path), help="hosts inventory (default: this machine)")
@click.option("--cells", "cell_filters", multiple=True, help="only cells matching KEY=VALUE[,KEY=VALUE]; repeatable")
@click.option("--repeats", type=click.IntRange(min=1), help="run at most N repeats of each cell (default: the manifest's)")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="finish a run directory: rerun only what is not done, appending to it")
@click.option("--fail-fast", is_flag=True, help="stop at the first repeat that fails after its retries")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("logs"), show_default=True,
              help="where run directories go")
@click.option("--json-logs", is_flag=True, help="progress as JSON lines on stderr")
@click.option("--strict", is_flag=True, help="deviations from the published hardware stop the run; a multi-node "
              "repeat whose NCCL used sockets where InfiniBand was expected fails")
@click.option("--accept-new-host-keys", is_flag=True, help="accept and record host keys of new nodes (never changed keys)")
@click.option("--synthetic", is_flag=True, help="the synthetic-data run the manifest declares, no dataset (recorded)")
@click.option("--fail-on", help=f"verdicts that fail, comma-separated (default: all of {', '.join(FAIL_ON)})")
@scheduler_option
@image_options
@reports_errors
def up(target: str | None, hosts_file: Path | None, cell_filters: tuple[str, ...], repeats: int | None,
       resume: Path | None, fail_fast: bool, out: Path, json_logs: bool, strict: bool, accept_new_host_keys: bool,
       synthetic: bool, fail_on: str | None, scheduler: str | None, allow_unpinned: bool, update_lock: bool,
       ca_bundle: Path | None, wheels: Path | None, push: str | None) -> None:
    """Reproduce TARGET: preflight, images, every cell and repeat on the nodes, then the table.

    Ctrl-C stops and removes every container on every node; `--resume RUN_DIR` finishes the run.
    It ends with `repro report`'s exit status for the run's table (5 when a repeat failed).
    """
    from repro.images import BuildOptions, ImagesOptions
    from repro.progress import make_progress
    from repro.up import Interrupted, UpOptions, finish, up as run_up
    from repro.verdict.rules import exit_code, parse_fail_on

    failing = parse_fail_on(fail_on)

    images = ImagesOptions(allow_unpinned=allow_unpinned, update_lock=update_lock, push=push,
                           build=BuildOptions(ca_bundle=ca_bundle, wheels=wheels))
    opts = UpOptions(hosts_file=hosts_file, cells=[parse_filter(f) for f in cell_filters], repeats=repeats,
                     resume=resume, fail_fast=fail_fast, out=out, strict=strict,
                     accept_new_host_keys=accept_new_host_keys, synthetic=synthetic, images=images,
                     scheduler=scheduler)
    progress = make_progress(json_lines=json_logs)
    stopped_by = stop_as_interrupt()
    try:
        result = run_up(target, opts, progress)
    except Interrupted as e:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # stopping already: another signal only brings a traceback
        progress.close()
        echo(f"interrupted: no container is left on any node; finish with: repro up --resume {e.run_path}",
                   err=True)
        sys.exit(128 + stopped_by[0])
    finally:
        progress.close()
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    echo(finish(result, colour=colour), nl=False, color=colour)
    if result.failed:
        sys.exit(5)
    sys.exit(exit_code(result.verdicts, failing))


def stop_as_interrupt() -> list[int]:
    """SIGTERM (a kill) and SIGHUP (a closed terminal) stop ``repro up`` as Ctrl-C does, so it cleans up the
    same way; a signal the caller ignores (``nohup``) stays ignored. Returns a one-item list holding the
    signal that stopped the run (SIGINT until another one arrives)."""
    stopped_by = [int(signal.SIGINT)]

    def stop(signum: int, _frame: object) -> None:
        stopped_by[0] = signum
        raise KeyboardInterrupt

    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, stop)
    return stopped_by


@cli.command()
@click.argument("run", required=False)
@click.option("--all", "all_runs", is_flag=True, help="every container of the kit on the nodes, of any run")
@click.option("--hosts", "hosts_file", type=click.Path(path_type=Path),
              help="hosts inventory (default: the one RUN recorded; with --all: this machine)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@reports_errors
def clean(run: str | None, all_runs: bool, hosts_file: Path | None, fmt: str) -> None:
    """Remove a run's containers (and so its keys and sshd) on every node: RUN_DIR, a run id, or --all.

    For runs that were killed (kill -9, a lost SSH link): `repro up` removes what it starts
    whenever it can. Idempotent; one line per node; exit 3 when a node could not be cleaned.
    """
    from repro.run.clean import as_json, clean_nodes, resolve, summary
    from repro.errors import EnvironmentUnavailable

    run_id, hosts = resolve(run, all_runs, hosts_file)
    results = clean_nodes(hosts.nodes, run_id)
    echo(json.dumps(as_json(results), indent=2) if fmt == "json" else summary(results), nl=fmt == "json")
    failed = [r.node for r in results if r.error]
    if failed:
        raise EnvironmentUnavailable(f"could not clean {len(failed)} of {len(results)} node(s): {', '.join(failed)}",
                                     hint="run `repro clean` again once the node is reachable")


def main() -> None:
    cli()
