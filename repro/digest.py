"""The SHA-256 of a file, read in blocks: the digest run directories list and RDMA bundles are pinned by."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of the bytes of ``path``, read 1 MiB at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
