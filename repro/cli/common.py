"""What every verb shares: printing (the one place), errors and exit codes, and the options several verbs
take."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from repro.errors import InputError, ReproError, UsageError
from repro.redact import shown


F = TypeVar("F", bound=Callable[..., Any])


def echo(
    text: Any = "", *, err: bool = False, nl: bool = True, color: bool | None = None, raw: bool = False
) -> None:
    """Everything the CLI prints: secrets blanked and terminal control removed (``repro.redact.shown``);
    ``raw`` for a document that did so to each text it holds (the HTML page)."""
    text = str(text) if raw else shown(str(text), colour=bool(color))
    click.echo(text, err=err, nl=nl, color=color)


def fail(err: ReproError) -> None:
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
            fail(e)

    return wrapper  # type: ignore[return-value]


def parse_filter(text: str) -> dict[str, Any]:
    """``nodes=4,precision=amp`` -> {'nodes': 4, 'precision': 'amp'}."""
    keys = {"nodes", "gpus_per_node", "gpus", "precision", "batch_size"}
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        k, sep, v = part.partition("=")
        if not sep or k not in keys:
            raise UsageError(
                f"bad cell filter {part!r}",
                hint=f"use KEY=VALUE[,KEY=VALUE], KEY one of {', '.join(sorted(keys))}",
            )
        out[k] = v if k == "precision" else _int(v, part)
    return out


def _int(v: str, part: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"bad cell filter {part!r}: {v!r} is not a whole number") from None


scheduler_option = click.option(
    "--scheduler",
    metavar="KIND[:KEY=VALUE,...]",
    help="ssh, or slurm[:partition=P,account=A,time=T,constraint=C,container=docker|pyxis] "
    "(over the inventory's scheduler section)",
)


def _mirror(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    from repro.images.source import parse_mirror

    try:
        return tuple(parse_mirror(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


git_mirror_option = click.option(
    "--git-mirror",
    multiple=True,
    metavar="PREFIX=URL",
    callback=_mirror,
    help="read source repositories starting with PREFIX from URL instead (a local mirror directory "
    "or an internal server), e.g. https://github.com/=/srv/git/; repeatable",
)


def image_options(fn: F) -> F:
    """The options that say how a target's image is obtained; shared by `images` and `up`."""
    for option in reversed(
        [
            click.option(
                "--push",
                metavar="REGISTRY",
                help="push a built image to HOST[:PORT][/PREFIX]; nodes then pull it",
            ),
            click.option(
                "--allow-unpinned",
                is_flag=True,
                help="use what a tag-only reference points to now (and record it)",
            ),
            click.option(
                "--update-lock",
                is_flag=True,
                help="accept pins that differ from the lock file and rewrite it",
            ),
            click.option(
                "--ca-bundle",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="CA bundle for builds behind a TLS-intercepting proxy (kept out of the image)",
            ),
            click.option(
                "--wheels",
                type=click.Path(exists=True, file_okay=False, path_type=Path),
                help="directory of *.whl files the build may install from",
            ),
            click.option(
                "--ofed-cache",
                type=click.Path(file_okay=False, path_type=Path),
                help="MLNX_OFED tarball directory",
            ),
            git_mirror_option,
        ]
    ):
        fn = option(fn)
    return fn


def image_events(verbose: bool) -> Callable[[Any], None]:
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


def hosts_option(help: str = "hosts inventory (default: this machine)") -> Callable[[F], F]:
    """``--hosts FILE``, as every verb that reaches nodes takes it."""
    return click.option("--hosts", "hosts_file", type=click.Path(path_type=Path), help=help)


def format_option(*formats: str, **kw: Any) -> Callable[[F], F]:
    """``--format``, text by default, one of ``formats``."""
    return click.option("--format", "fmt", type=click.Choice(["text", *formats]), default="text", **kw)


#: the cell filter every verb that runs or shows cells takes
cells_option = click.option(
    "--cells", "cell_filters", multiple=True, help="only cells matching KEY=VALUE[,KEY=VALUE]; repeatable"
)
