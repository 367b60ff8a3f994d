"""The signing options: ``--sign-key FILE`` of ``report`` and ``up``, read once, before any work."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

sign_key_option = click.option(
    "--sign-key", type=click.Path(dir_okay=False, path_type=Path),
    help="sign the run's in-toto statement (provenance.intoto.dsse.json): an ed25519 private key in PEM "
         "(standard DSSE), or an SSH key, private or held by ssh-agent (an SSHSIG in namespace repro)")


def load_sign_key(path: Path | None) -> Any:
    """The signer ``--sign-key`` names (None: not signing); a passphrase-protected PEM key is asked for its
    passphrase at a terminal."""
    if path is None:
        return None
    from repro.record.dsse import is_encrypted_pem, load_signer

    passphrase = None
    if is_encrypted_pem(path) and sys.stdin.isatty():
        passphrase = click.prompt(f"passphrase of {path}", hide_input=True, default="", show_default=False,
                                  err=True).encode()
    return load_signer(path, passphrase)


def check_sign_target(targets: tuple[str, ...], from_logs: Path | None, maps: tuple[str, ...],
                      sign_key: Path | None) -> Any:
    """The signer of ``report --sign-key`` (None: not signing), which signs one run: a run directory or
    archive, alone."""
    from repro.errors import UsageError
    from repro.record.archive import is_run_path

    if sign_key and (len(targets) != 1 or from_logs or maps or not is_run_path(targets[0])):
        raise UsageError("--sign-key signs one run: give a run directory or archive alone",
                         hint="repro report logs/RUN_ID (with --sign-key)")
    return load_sign_key(sign_key)


def sign_sealed(target: str, signer: Any) -> None:
    """Sign a sealed run directory or archive ``report`` was given, and say so on stderr."""
    from repro.cli.common import echo
    from repro.record.sign import sign_path

    kid, packed = sign_path(Path(target), signer)
    echo(f"signed {target} (keyid {kid})" + (f"; archive {packed} packed again" if packed else ""), err=True)
