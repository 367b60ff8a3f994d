"""Signing a sealed run: its in-toto statement as a DSSE envelope beside it (:mod:`repro.record.dsse`).

``repro up --sign-key FILE`` signs a run as it finishes (before it is packed); ``repro report RUN --sign-key
FILE`` signs a run directory that is sealed already (re-packing the archive beside it) or an archive (packed
again in place). A run whose files no longer match its seal is refused: a signature vouches for the run.
"""

from __future__ import annotations

import json
from pathlib import Path

from repro.errors import ProvenanceError
from repro.record.archive import SUFFIX, create, is_archive, opened_run
from repro.record.audit import TAMPERED, integrity
from repro.record.dsse import MAX_ENVELOPE_BYTES, SIGNED, Signer, envelope, read_bounded
from repro.layout import INTOTO, SUMS
from repro.run.rundir import RunDir, atomic_write


def sign_run(run_dir: Path, key: Signer) -> str:
    """Sign the sealed run in ``run_dir`` with ``key`` (replacing an earlier signature); its key id."""
    run = RunDir.open(Path(run_dir))
    if not run.file(SUMS).is_file() or not run.file(INTOTO).is_file():
        raise ProvenanceError(f"{run.path} is not sealed: it has no {INTOTO} to sign",
                              hint=f"finish it first (repro up --resume {run.path}, or repro report "
                                   f"{run.path} for a detached run)")
    bad = [c for c in integrity(run)[1] if c.status == TAMPERED]
    if bad:
        raise ProvenanceError(f"{run.path} does not match its seal ({', '.join(c.item for c in bad[:3])}): "
                              "a signature would vouch for what changed",
                              hint=f"repro audit {run.path} says what differs")
    doc = envelope(read_bounded(run.file(INTOTO), MAX_ENVELOPE_BYTES, "statement"), key)
    atomic_write(run.file(SIGNED), (json.dumps(doc, indent=2) + "\n").encode())
    return doc["signatures"][0]["keyid"]


def sign_path(path: Path, key: Signer) -> tuple[str, Path | None]:
    """Sign a run directory or archive ``repro report`` was given: the key id, and the archive packed
    again (a directory's, beside it, where there is one; an archive, in place)."""
    path = Path(path)
    if path.is_dir():
        kid = sign_run(path, key)
        packed = path.with_name(path.name + SUFFIX)
        return kid, create(RunDir.open(path), packed) if is_archive(packed) else None
    with opened_run(path) as run:
        kid = sign_run(run.path, key)
        return kid, create(run, path)
