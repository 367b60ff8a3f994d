"""The verbs of the results store: history (and history import), compare; and the options with which
report and up record what they judged (--results, --no-record, --cluster)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from repro.cli.common import echo, format_option, reports_errors
from repro.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])

results_option = click.option(
    "--results", "results_path", type=click.Path(dir_okay=False, path_type=Path),
    help="the results store (default: $REPRO_RESULTS, else $XDG_DATA_HOME/repro/results.sqlite)")


def record_options(fn: F) -> F:
    """``--results``, ``--no-record`` and ``--cluster``: where and whether a verb records its run."""
    for option in reversed([
        results_option,
        click.option("--no-record", is_flag=True, help="do not record the run in the results store"),
        click.option("--cluster", "cluster", metavar="NAME",
                     help="the cluster name the run is recorded under (default: the hosts file's name, or "
                          "this machine's; a log tree: none)"),
    ]):
        fn = option(fn)
    return fn


def store_path(results_path: Path | None) -> Path:
    from repro.record.store import default_path

    return results_path if results_path is not None else default_path()


def record(snap: Any, results_path: Path | None) -> None:
    """Record one run (a Snapshot; None: --no-record, or a re-derivation) and say so on stderr; a run
    none of whose cells has a figure of its own is not recorded, and that is said."""
    from repro.record.provenance import now
    from repro.record.store import open_store

    if snap is None:
        return
    if not snap.cells:
        echo(f"not recorded in the results store: no cell of {snap.source} has a figure of its own", err=True)
        return
    store = open_store(store_path(results_path))
    try:
        done = store.record(snap, now=now())
    finally:
        store.close()
    said = {"new": "recorded", "updated": "recorded again (the run changed since: resumed)",
            "unchanged": "already recorded", "extended": f"already recorded; added {done.cells} cell(s)"}
    echo(f"{said[done.outcome]} in {store.path} as run #{done.id} ({snap.source})", err=True)


def record_finished(result: Any, results_path: Path | None, no_record: bool, cluster: str | None) -> None:
    """Record a finished `repro up` run (an UpResult whose table ``finish`` judged), unless --no-record."""
    if no_record or result.table is None:
        return
    from repro.record import snapshot

    source = str(result.run.path.resolve())
    record(snapshot.from_run(result.run, [result.table], source=source, cluster=cluster), results_path)


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("name", metavar="TARGET|TABLE | import RUN...", nargs=-1, required=True)
@click.option("--cluster", help="only runs recorded under this cluster name (import: the name to record them "
              "under)")
@click.option("--since", metavar="DATE", help="only runs from DATE on (YYYY-MM-DD, or YYYY-MM-DDTHH:MM, UTC)")
@click.option("--last", type=click.IntRange(min=0, max=1_000_000), default=20, show_default=True,
              help="the text shows each cell's latest N runs (0: every run; csv and json hold every one)")
@format_option("csv", "json", help="csv and json: one record per cell and run")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="also draw the chart (.png, .svg or .pdf): a line per cell, the published figure dashed, "
                   "intervals as bands")
@results_option
@reports_errors
def history(name: tuple[str, ...], cluster: str | None, since: str | None, last: int, fmt: str,
            plot: Path | None, results_path: Path | None) -> None:
    """Each cell of a target or published table over the recorded runs, beside the published figure.

    `repro history import RUN...` records earlier runs: run directories, run archives, or directories
    holding them (a `logs/` folder).
    """
    if name[0] == "import":
        _import(name[1:], results_path, cluster)
        return
    if len(name) != 1:
        raise UsageError("give one target or published table", hint="e.g. repro history perf-2.5-v100")
    from repro.record import history as hist
    from repro.record.store import open_store

    store = open_store(store_path(results_path), create=False)
    try:  # the text alone shows only each cell's latest runs: only those are read
        when = hist.parse_since(since) if since else None
        histories = hist.read(store, name[0], cluster=cluster, since=when,
                              last=last if fmt == "text" and plot is None else 0)
    finally:
        store.close()
    if not histories:
        raise UsageError(f"no recorded run of {name[0]!r} in {store.path}"
                         + (" with those filters" if cluster or since else ""),
                         hint="`repro report RUN` and `repro up` record runs; `repro history import RUN...` "
                              "loads earlier ones")
    echo(hist.render_text(histories, last) if fmt == "text" else hist.RENDERERS[fmt](histories),
         nl=fmt == "text")
    if plot:
        _plot(histories, plot, name[0])


def _plot(histories: Any, plot: Path, title: str) -> None:
    from repro.record.history_chart import plot_history
    from repro.verdict.chart import plot_format

    fmt = plot_format(plot)
    if fmt is None:
        raise UsageError(f"--plot {plot}: the chart is written as PNG, SVG or PDF, which its extension names",
                         hint="end the file name with .png, .svg or .pdf")
    try:
        plot_history(histories, plot, fmt, title=f"{title}: each cell over time beside its published figure")
    except OSError as e:
        raise UsageError(f"cannot write the plot to {plot}: {e.strerror}",
                         hint="give a writable path") from None
    echo(f"plot written to {plot}", err=True)


def _runs_under(paths: tuple[str, ...]) -> list[Path]:
    from repro.record.archive import is_run_path

    found = []
    for text in paths:
        if is_run_path(text):
            found.append(Path(text))
            continue
        p = Path(text)
        inside = sorted(q for q in p.iterdir() if is_run_path(str(q))) if p.is_dir() else []
        if not inside:
            raise UsageError(f"{text}: neither a run directory, a run archive, nor a directory holding them",
                             hint="a tree of your own logs is recorded by "
                                  "`repro report TARGET --from-logs DIR`")
        found += inside
    return found


def _import(paths: tuple[str, ...], results_path: Path | None, cluster: str | None) -> None:
    from repro.record import snapshot

    if not paths:
        raise UsageError("repro history import: give run directories or archives", hint="e.g. logs/*")
    for path in _runs_under(paths):
        record(snapshot.of_path(path, cluster=cluster), results_path)


COMPARE_EXIT = ("Exit status: as `repro report`'s, from the runs' verdicts against the baseline: 0 when "
                "every baseline cell is reproduced in every run; 7 when one is slower or faster; 8 when none "
                "of those but one is inconclusive or not run (the run has no cell of its shape); 2-6 as for "
                "every command. --fail-on chooses which verdicts count (default: all of them).")


@click.command(epilog=COMPARE_EXIT)
@click.argument("baseline")
@click.argument("runs", nargs=-1, required=True)
@click.option("--fail-on", help="verdicts that fail, comma-separated, as `repro report` takes them "
                                "(default: all)")
@format_option("csv", "json", help="csv: one record per run and cell; json: the cells and the facts that "
                                   "differ")
@results_option
@reports_errors
def compare(baseline: str, runs: tuple[str, ...], fail_on: str | None, fmt: str,
            results_path: Path | None) -> None:
    """Runs against a baseline, cell by cell: both figures with their intervals, the ratio with its
    interval, whether the difference is beyond the noise, a verdict in the report's words, and the facts that
    differ, most likely cause first.

    Cells are matched by GPUs, nodes, precision, batch size and model, across targets: a Paddle run and an
    NGC PyTorch run on one cluster compare cell by cell. BASELINE and RUNS are run numbers or run ids from
    `repro history`, run directories or run archives.
    """
    import sys

    from repro.record.compare import RENDERERS, compare_all, status
    from repro.verdict.rules import parse_fail_on

    failing = parse_fail_on(fail_on)
    base = _resolve(baseline, results_path)
    comparisons = compare_all(base, [_resolve(r, results_path) for r in runs])
    echo(RENDERERS[fmt](comparisons), nl=fmt == "text")
    sys.exit(status(comparisons, failing))


def _resolve(ref: str, results_path: Path | None) -> Any:
    """A run for compare: a run directory or archive (its recorded number where the store has it), or a
    number or run id the store holds."""
    from repro.record import snapshot
    from repro.record.archive import is_run_path
    from repro.record.store import open_store

    path = store_path(results_path)
    if is_run_path(ref):
        snap = snapshot.of_path(Path(ref))
        if path.is_file():
            store = open_store(path, create=False)
            try:
                stored = store.find_digest(snap.digest)
            finally:
                store.close()
            return stored or snap  # as recorded (its number, the cluster it was recorded under)
        return snap
    store = open_store(path, create=False)
    try:
        found = store.find(ref)
    finally:
        store.close()
    if found is None:
        raise UsageError(f"{ref!r} is neither a recorded run in {path} nor a run directory or archive",
                         hint="`repro history TARGET` lists recorded runs by number (#N) and run id")
    return found
