"""Where the kit's shipped data lives: manifests, Dockerfiles, published logs.

A wheel carries them inside the package (``repro/_data``); a checkout (editable
install, CI) reads them from the repository root next to the package.
"""

from __future__ import annotations

from pathlib import Path


def data_root() -> Path:
    pkg = Path(__file__).resolve().parent
    bundled = pkg / "_data"
    return bundled if bundled.is_dir() else pkg.parent


def manifests_dir() -> Path:
    return data_root() / "manifests"


def dockerfiles_dir() -> Path:
    return data_root() / "dockerfiles"
