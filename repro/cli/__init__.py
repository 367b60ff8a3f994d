"""The ``repro`` command line: one thin command per verb.

This package is the only place that prints, chooses exit codes or configures logging (``logsetup``:
``repro -v``, ``-vv`` or ``REPRO_LOG_LEVEL``); everything it calls raises ReproError subclasses that carry
their own exit code. ``common`` holds what every verb shares; ``tables`` the verbs that read targets, logs
and runs; ``site`` those that act on a site; ``history`` the results store's (history, compare).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import click

from repro import __version__

#: every verb: the module of repro.cli that defines it, and the command's name there. A verb's module is
#: imported when that verb is asked for (`repro history` reads a store without importing what `repro up`
#: needs); `repro --help` and ``cli.commands`` import them all.
VERBS: dict[str, tuple[str, str]] = {
    "list": ("tables", "list_targets"), "show": ("tables", "show"), "validate": ("tables", "validate"),
    "plan": ("tables", "plan"), "images": ("site", "images"), "check": ("site", "check_command"),
    "lock": ("site", "lock_command"), "parse": ("tables", "parse"), "report": ("tables", "report"),
    "explain": ("explain", "explain"), "audit": ("tables", "audit"), "diff": ("tables", "diff"),
    "history": ("history", "history"), "compare": ("history", "compare"), "preflight": ("site", "preflight"),
    "up": ("site", "up"), "status": ("site", "status"), "clean": ("site", "clean"),
}


class Verbs(click.Group):
    """A group whose commands are imported one verb at a time, as they are asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loaded: dict[str, click.Command] = {}
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        """Every verb's command (imports them all)."""
        for name in VERBS:
            self._load(name)
        return self._loaded

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._loaded.update(value)

    def _load(self, name: str) -> click.Command | None:
        if name not in self._loaded and name in VERBS:
            module, attr = VERBS[name]
            command = getattr(importlib.import_module(f"repro.cli.{module}"), attr)
            assert command.name == name, f"repro.cli.{module}.{attr} is `{command.name}`, not `{name}`"
            self._loaded[name] = command
        return self._loaded.get(name)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(VERBS)


@click.group(cls=Verbs, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="repro")
@click.option("-v", "--verbose", count=True,
              help="log what the kit does (-v), every step (-vv); else as REPRO_LOG_LEVEL says "
                   "(debug, info, warning, error)")
def cli(verbose: int) -> None:
    """Reproduce published deep-learning benchmark tables with one command."""
    from repro.cli.common import fail
    from repro.cli.logsetup import configure
    from repro.errors import ReproError

    try:
        configure(verbose, os.environ)
    except ReproError as e:
        fail(e)


def main() -> None:
    cli()
