"""The ``repro`` command line: one thin command per verb.

This package is the only place that prints, chooses exit codes or configures logging; everything it calls
raises ReproError subclasses that carry their own exit code. ``common`` holds what every verb shares;
``tables`` the verbs that read targets, logs and runs; ``site`` those that act on a site; ``history`` the
results store's (history, compare).
"""

from __future__ import annotations

import click

from repro import __version__
from repro.cli import explain, history, site, tables


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="repro")
def cli() -> None:
    """Reproduce published deep-learning benchmark tables with one command."""


for _command in (
    tables.list_targets,
    tables.show,
    tables.validate,
    tables.plan,
    site.images,
    site.check_command,
    site.lock_command,
    tables.parse,
    tables.report,
    explain.explain,
    tables.audit,
    tables.diff,
    history.history,
    history.compare,
    site.preflight,
    site.up,
    site.status,
    site.clean,
):
    cli.add_command(_command)


def main() -> None:
    cli()
