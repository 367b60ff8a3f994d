"""The verbs that act on a site: images, check, lock, preflight, up, clean."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from repro.errors import UsageError
from repro.verdict.rules import FAIL_ON


from repro.cli.history import record_finished, record_options
from repro.cli.signing import load_sign_key, sign_key_option
from repro.cli.common import (
    cells_option,
    echo,
    format_option,
    git_mirror_option,
    hosts_option,
    image_events,
    image_options,
    parse_filter,
    reports_errors,
    scheduler_option,
    stop_as_interrupt,
)


@click.command()
@click.argument("target")
@hosts_option()
@click.option("--pull", "mode", flag_value="pull", help="only pull by digest; never build")
@click.option("--build", "mode", flag_value="build", help="build even when a current image is present")
@image_options
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), help="build contexts and logs")
@click.option("--no-cache", is_flag=True, help="build without the engine's layer cache")
@click.option("--dry-run", is_flag=True, help="print the Dockerfiles a build would run; do nothing")
@click.option("-v", "--verbose", is_flag=True, help="show every line of build output")
@reports_errors
def images(
    target: str,
    hosts_file: Path | None,
    mode: str | None,
    push: str | None,
    allow_unpinned: bool,
    update_lock: bool,
    ca_bundle: Path | None,
    wheels: Path | None,
    ofed_cache: Path | None,
    git_mirror: tuple[tuple[str, str], ...],
    work_dir: Path | None,
    no_cache: bool,
    dry_run: bool,
    verbose: bool,
) -> None:
    """Pull or build TARGET's image exactly as pinned and put it on every node."""
    from repro.spec.hosts import load_hosts
    from repro.images import BuildOptions, ImagesOptions, dry_run_text, prepare
    from repro.spec.manifest import find_target

    m = find_target(target)
    if dry_run:
        echo(dry_run_text(m), nl=False)
        return
    build = BuildOptions(
        ca_bundle=ca_bundle,
        work_dir=work_dir,
        ofed_cache=ofed_cache,
        wheels=wheels,
        no_cache=no_cache,
        git_mirrors=git_mirror,
    )
    opts = ImagesOptions(
        mode=mode or "auto", push=push, allow_unpinned=allow_unpinned, update_lock=update_lock, build=build
    )
    r = prepare(m, load_hosts(hosts_file), opts, progress=image_events(verbose))
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


@click.command("check")
@click.argument("targets", nargs=-1, required=True)
@git_mirror_option
@click.option(
    "--ofed-cache", type=click.Path(file_okay=False, path_type=Path), help="MLNX_OFED bundle directory"
)
@click.option(
    "--resolve",
    is_flag=True,
    help="also ask the package index: upload times of the locked "
    "versions against the cutoff, and whether the requirements still resolve",
)
@click.option(
    "--index-url", default=None, help="the package index (PEP 691) for --resolve [default: the lock's]"
)
@reports_errors
def check_command(
    targets: tuple[str, ...],
    git_mirror: tuple[tuple[str, str], ...],
    ofed_cache: Path | None,
    resolve: bool,
    index_url: str | None,
) -> None:
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


@click.command("lock")
@click.argument("target")
@click.option(
    "--update-lock", "update", is_flag=True, help="rewrite a lock that differs from what resolves now"
)
@click.option("--deps-only", is_flag=True, help="only resolve the Python dependency lock (image.build.deps)")
@click.option(
    "--index-url",
    default=None,
    help="the package index (PEP 691) the dependency lock resolves from [default: https://pypi.org/simple]",
)
@git_mirror_option
@reports_errors
def lock_command(
    target: str, update: bool, deps_only: bool, index_url: str | None, git_mirror: tuple[tuple[str, str], ...]
) -> None:
    """Resolve TARGET's tags to digests and branches to commits; write or check its lock file. A target that
    declares image.build.deps also gets its Python dependency lock, resolved as of the cutoff."""
    from repro.images import deps, lock_target
    from repro.spec.manifest import find_target

    manifest = find_target(target)
    if deps.declared(manifest) is not None:
        dpath, changed = deps.write_lock(manifest, index_url or deps.DEFAULT_INDEX, git_mirror)
        shown = dpath.relative_to(Path.cwd()) if dpath.is_relative_to(Path.cwd()) else dpath
        click.echo(
            f"dependency lock {'written' if changed else 'unchanged'}: {shown} "
            f"({deps.pin_count(dpath.read_text(encoding='utf-8'))} pins as of "
            f"{manifest.image['build']['deps']['cutoff']})"
        )
    elif deps_only:
        raise UsageError(f"{manifest.id} declares no image.build.deps: there is no dependency lock to make")
    if deps_only:
        return
    path, pins, written = lock_target(manifest, update=update, progress=image_events(False))
    for role, ref in pins.images.items():
        echo(f"{role} {ref.tagged} -> {ref.digest}")
    for name, src in pins.sources.items():
        branch = f" (branch {src['branch']} -> {src['branch_commit']})" if "branch_commit" in src else ""
        echo(f"{name} {src['repository']} @ {src['commit']}{branch}")
    for name, sha in pins.files.items():
        echo(f"file {name} sha256 {sha}")
    echo(f"lock {'written' if written else 'unchanged'}: {path}")


@click.command()
@click.argument("target", required=False)
@hosts_option()
@click.option(
    "--strict", is_flag=True, help="deviations from the target's expected hardware are errors (exit 3)"
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="accept and record host keys of new nodes (never changed keys)",
)
@format_option("json")
@scheduler_option
@reports_errors
def preflight(
    target: str | None,
    hosts_file: Path | None,
    strict: bool,
    accept_new_host_keys: bool,
    fmt: str,
    scheduler: str | None,
) -> None:
    """Check every node: SSH, Docker, GPUs, InfiniBand, disk, clock; compare with TARGET's expected hardware
    and check that TARGET's dataset is where the hosts file says, in its format. Under Slurm: the same
    probe as a job step on the nodes of an allocation (the one it runs in, else a short one)."""
    from repro.spec.hosts import load_hosts
    from repro.spec.manifest import find_target
    from repro.nodes.preflight import assess, compare, dataset_to_check, site_checks
    from repro.nodes.table import render_preflight, to_json
    from repro.errors import EnvironmentUnavailable, RunFailed
    from repro.run.schedulers import scheduled_preflight

    manifest = find_target(target) if target else None
    expect = manifest.expect if manifest else {}
    hosts = load_hosts(hosts_file)
    dataset = dataset_to_check(manifest, hosts, required=False) if manifest else None
    try:
        reports, size = scheduled_preflight(
            hosts,
            manifest,
            scheduler,
            accept_new_host_keys=accept_new_host_keys,
            dataset=dataset,
            progress=image_events(False),
        )
    except RunFailed as e:  # no node to probe (the allocation refused or ended): the environment, exit 3
        raise EnvironmentUnavailable(f"preflight could not run on the nodes: {e}", hint=e.hint) from None
    if manifest:  # the machines the publication ran this many nodes' cells on
        expect = manifest.expect_for(c for c in manifest.cells() if c.nodes == size)
    deviations = compare(reports, expect, size)
    more, blocking = site_checks(reports, manifest, hosts.env, manifest.cells() if manifest else ())
    deviations += more
    echo(
        to_json(reports, deviations, blocking)
        if fmt == "json"
        else render_preflight(reports, deviations, blocking),
        nl=fmt == "json",
    )
    if manifest and manifest.dataset_format and dataset is None:
        echo(
            f"note: dataset not checked: the hosts file names no directory for {manifest.dataset_format}, "
            f"which `repro up {manifest.id}` needs (`data: {{{manifest.dataset_format}: /path}}`)",
            err=True,
        )
    assess(reports, deviations, strict=strict, blocking=blocking)


@click.command()
@click.argument("target", required=False)
@hosts_option()
@cells_option
@click.option(
    "--repeats",
    type=click.IntRange(min=1, max=1000),  # the manifest's own limit (matrix.repeats)
    help="run at most N repeats of each cell (default: the manifest's)",
)
@click.option(
    "--resume",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="finish a run directory: rerun only what is not done, appending to it",
)
@click.option("--fail-fast", is_flag=True, help="stop at the first repeat that fails after its retries")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("logs"),
    show_default=True,
    help="where run directories go",
)
@click.option("--json-logs", is_flag=True, help="progress as JSON lines on stderr")
@click.option(
    "--strict",
    is_flag=True,
    help="deviations from the published hardware stop the run; a multi-node "
    "repeat whose NCCL used sockets where InfiniBand was expected fails",
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="accept and record host keys of new nodes (never changed keys)",
)
@click.option(
    "--synthetic", is_flag=True, help="the synthetic-data run the manifest declares, no dataset (recorded)"
)
@click.option("--fail-on", help=f"verdicts that fail, comma-separated (default: all of {', '.join(FAIL_ON)})")
@click.option("--detach", is_flag=True,
              help="submit the whole run as one batch job and exit (Slurm); `repro status RUN_DIR` follows "
                   "it, "
                   "`repro report RUN_DIR` judges it once it ended")
@scheduler_option
@image_options
@sign_key_option
@record_options
@reports_errors
def up(target: str | None, hosts_file: Path | None, cell_filters: tuple[str, ...], repeats: int | None,
       resume: Path | None, fail_fast: bool, out: Path, json_logs: bool, strict: bool,
       accept_new_host_keys: bool, synthetic: bool, fail_on: str | None, scheduler: str | None,
       allow_unpinned: bool, update_lock: bool, ca_bundle: Path | None, wheels: Path | None,
       push: str | None, ofed_cache: Path | None, git_mirror: tuple[tuple[str, str], ...], detach: bool,
       sign_key: Path | None, results_path: Path | None, no_record: bool, cluster: str | None) -> None:
    """Reproduce TARGET: preflight, images, every cell and repeat on the nodes, then the table.

    Ctrl-C stops and removes every container on every node; `--resume RUN_DIR` finishes the run.
    It ends with `repro report`'s exit status for the run's table (5 when a repeat failed). The finished
    run is recorded in the results store (`repro history`) unless --no-record.
    """
    from repro.images import BuildOptions, ImagesOptions
    from repro.progress import make_progress
    from repro.up import Interrupted, UpOptions, finish, up as run_up
    from repro.verdict.rules import exit_code, parse_fail_on

    failing = parse_fail_on(fail_on)
    if detach and sign_key:
        raise UsageError("--detach cannot sign the run (--sign-key): it is sealed when it is judged",
                         hint="sign it then: repro report RUN_DIR (with --sign-key)")
    signer = load_sign_key(sign_key)  # a bad key fails now, not after the run

    images = ImagesOptions(allow_unpinned=allow_unpinned, update_lock=update_lock, push=push,
                           build=BuildOptions(ca_bundle=ca_bundle, wheels=wheels, ofed_cache=ofed_cache,
                                                    git_mirrors=git_mirror))
    opts = UpOptions(hosts_file=hosts_file, cells=[parse_filter(f) for f in cell_filters], repeats=repeats,
                     resume=resume, fail_fast=fail_fast, out=out, strict=strict,
                     accept_new_host_keys=accept_new_host_keys, synthetic=synthetic, images=images,
                     scheduler=scheduler)
    progress = make_progress(json_lines=json_logs)
    if detach:
        from repro.up import submit

        try:
            run, job = submit(target, opts, progress)
        finally:
            progress.close()
        echo(f"submitted Slurm job {job}\nrun directory {run.path}\n"
             f"follow it: repro status {run.path}\njudge it once it ended: repro report {run.path}")
        return
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
    echo(finish(result, colour=colour, sign_key=signer), nl=False, color=colour)
    record_finished(result, results_path, no_record, cluster)
    if result.failed:
        sys.exit(5)
    sys.exit(exit_code(result.verdicts, failing))


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@format_option("json")
@reports_errors
def status(run_dir: Path, fmt: str) -> None:
    """Progress of a detached run (`repro up --detach`) from its run directory alone: each cell's repeats
    done, running, failed or pending, the nodes, and the job's state where squeue/sacct can tell."""
    from dataclasses import asdict

    from repro.up import status_text, view

    run, jv = view(run_dir)
    if fmt == "json":
        doc = {**{k: v for k, v in asdict(jv).items() if k != "repeats"}, "over": jv.over,
               "repeats": [asdict(r) for r in jv.repeats.values()]}
        echo(json.dumps(doc, indent=2))
        return
    echo(status_text(run, jv), nl=False)


@click.command()
@click.argument("run", required=False)
@click.option("--all", "all_runs", is_flag=True, help="every container of the kit on the nodes, of any run")
@hosts_option("hosts inventory (default: the one RUN recorded; with --all: this machine)")
@format_option("json")
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
        raise EnvironmentUnavailable(
            f"could not clean {len(failed)} of {len(results)} node(s): {', '.join(failed)}",
            hint="run `repro clean` again once the node is reachable",
        )
