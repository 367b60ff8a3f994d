"""Lock files: every tag a manifest names resolved to a digest, every branch to a commit.

``<manifest stem>.lock.json`` sits next to the manifest. ``repro lock`` writes it;
``repro images`` and ``repro up`` resolve the same pins and refuse to run when they differ
from the lock (naming both values) unless told to update it. A tag-only reference is
pinned by the lock; without one it is refused unless unpinned references are allowed,
and then the digest found is recorded in a new lock.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro.errors import ProvenanceError, UsageError
from repro.images.refs import Ref, parse_ref
from repro.spec.manifest import Manifest

log = logging.getLogger(__name__)

LOCK_VERSION = 1
#: Resolves ``repo:tag`` to the digest its registry names now.
TagResolver = Callable[[Ref], str]
#: Resolves (repository, branch) to the commit the branch points at now.
BranchResolver = Callable[[str, str], str]


@dataclass(frozen=True)
class Pins:
    """What a run uses: image role -> (ref, digest), the source commit, and downloaded files' sha256."""

    images: Mapping[str, Ref] = field(default_factory=dict)
    sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: file name -> sha256 hex of what the build downloads (the MLNX_OFED bundle), as `repro lock` found it
    files: Mapping[str, str] = field(default_factory=dict)
    #: the image variant a run built (an mpi target's ``sshd`` or ``pmi``: build.variant), for the run's lock
    variant: str | None = None

    def to_json(self, manifest: Manifest) -> dict[str, Any]:
        return {"lock_version": LOCK_VERSION, "target": manifest.id, "manifest": manifest.path.name,
                "images": {k: {"ref": r.tagged, "digest": r.digest} for k, r in sorted(self.images.items())},
                "sources": {k: dict(v) for k, v in sorted(self.sources.items())},
                **({"files": dict(sorted(self.files.items()))} if self.files else {}),
                **({"variant": self.variant} if self.variant else {}),
                "resolved_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def lock_path(manifest: Manifest) -> Path:
    return lock_beside(manifest.path)


def lock_beside(manifest_file: Path) -> Path:
    """The lock of the manifest file ``manifest_file`` (a run directory's copy of it among them)."""
    return manifest_file.with_name(f"{manifest_file.stem}.lock.json")


def image_refs(manifest: Manifest) -> dict[str, Ref]:
    """The manifest's image references by role (``image`` or ``base``), digest as written (may be empty)."""
    img = manifest.image
    spec, role = (img["registry"], "image") if "registry" in img else (img["build"]["base"], "base")
    return {role: parse_ref(spec["ref"], spec.get("digest", ""))}


def read_lock(path: Path) -> Pins | None:
    """The pins of a lock file (None: there is none); one that cannot be read or is not of the shape
    ``repro lock`` writes is a UsageError naming it."""
    fix = "regenerate it: repro lock TARGET --update-lock"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(f"{path}: cannot read it as a lock file: {e}", hint=fix) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a lock file (a JSON object)", hint=fix)
    if data.get("lock_version") != LOCK_VERSION:
        raise UsageError(f"{path}: lock_version {data.get('lock_version')!r:.40}, this kit reads "
                         f"{LOCK_VERSION}")
    try:
        images = {k: parse_ref(v["ref"], v["digest"]) for k, v in data.get("images", {}).items()}
    except (AttributeError, KeyError, TypeError, UsageError) as e:
        raise UsageError(f"{path}: bad images entry: {e}", hint=fix) from None
    try:
        sources = {k: {a: str(b) for a, b in v.items()} for k, v in data.get("sources", {}).items()}
        files = {str(k): str(v) for k, v in data.get("files", {}).items()}
    except (AttributeError, TypeError) as e:
        raise UsageError(f"{path}: bad sources or files entry: {e}", hint=fix) from None
    return Pins(images, sources, files)


def write_lock(path: Path, manifest: Manifest, pins: Pins) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(pins.to_json(manifest), indent=2) + "\n", encoding="utf-8")
    os.replace(part, path)


def differences(locked: Pins, resolved: Pins) -> list[str]:
    """Every way ``resolved`` differs from ``locked``, each naming both values."""
    out = []
    for role in sorted(set(locked.images) | set(resolved.images)):
        a, b = locked.images.get(role), resolved.images.get(role)
        if a is None or b is None:
            out.append(f"{role} image: lock has {a or 'nothing'}, now {b or 'nothing'}")
        elif a.tagged != b.tagged:
            out.append(f"{role} image: lock names {a.tagged}, the manifest {b.tagged}")
        elif a.digest != b.digest:
            out.append(f"{role} image {a.tagged}: lock has {a.digest}, resolved {b.digest}")
    for name in sorted(set(locked.sources) | set(resolved.sources)):
        a_src, b_src = locked.sources.get(name, {}), resolved.sources.get(name, {})
        for key in ("repository", "commit"):
            if a_src.get(key) != b_src.get(key):
                out.append(f"source {key}: lock has {a_src.get(key)}, the manifest {b_src.get(key)}")
        if "branch_commit" in b_src and a_src.get("branch_commit") != b_src["branch_commit"]:
            out.append(f"source branch {b_src.get('branch')}: lock has {a_src.get('branch_commit')}, "
                       f"resolved {b_src['branch_commit']}")
    for name in sorted(set(locked.files) & set(resolved.files)):
        if locked.files[name] != resolved.files[name]:
            out.append(f"file {name}: lock has sha256 {locked.files[name]}, found {resolved.files[name]}")
    return out


def _sources(manifest: Manifest, branch: BranchResolver | None) -> dict[str, dict[str, str]]:
    src = manifest.source
    if not src:
        return {}
    entry = {"repository": src["repository"], "commit": src["commit"]}
    if src.get("branch"):
        entry["branch"] = src["branch"]
        if branch is not None:
            entry["branch_commit"] = branch(src["repository"], src["branch"])
    return {"source": entry}


def resolve_all(manifest: Manifest, tag: TagResolver, branch: BranchResolver | None,
                warn: Callable[[str], None] = log.warning, files: Mapping[str, str] | None = None) -> Pins:
    """``repro lock``: ask the registries and repositories now; a digest the manifest pins wins."""
    images = {}
    for role, ref in image_refs(manifest).items():
        current = tag(ref)
        if ref.digest and ref.digest != current:
            warn(f"{ref.tagged} now points to {current}; the manifest pins {ref.digest}, which is kept")
        images[role] = ref if ref.digest else ref.with_digest(current)
    return Pins(images, _sources(manifest, branch), dict(files or {}))


def pins_for_run(manifest: Manifest, locked: Pins | None, tag: TagResolver, *, allow_unpinned: bool) -> Pins:
    """What a run uses: the manifest's digests, else the lock's, else (if allowed) the registry's now."""
    images = {}
    for role, ref in image_refs(manifest).items():
        have = locked.images.get(role) if locked else None
        if ref.digest:
            images[role] = ref
        elif allow_unpinned:
            images[role] = ref.with_digest(tag(ref))
        elif have is not None and have.tagged == ref.tagged:
            images[role] = have
        else:
            raise UsageError(f"{manifest.id}: {role} image {ref.tagged} is a tag without a digest",
                             hint="pin it: `repro lock TARGET` (or pass --allow-unpinned to use what the tag "
                                  "points to now and record it)")
    return Pins(images, _sources(manifest, None), dict(locked.files) if locked else {})


def check(manifest: Manifest, resolved: Pins, *, update: bool,
          allow_create: bool = False) -> tuple[Path, bool]:
    """Compare ``resolved`` with the lock: ProvenanceError on a difference unless ``update``.

    Returns the lock path and whether it was written (updated, or created when ``allow_create``).
    """
    path = lock_path(manifest)
    locked = read_lock(path)
    if locked is None:
        if allow_create or update:
            write_lock(path, manifest, resolved)
            return path, True
        return path, False
    diffs = differences(locked, resolved)
    if not diffs:
        return path, False
    if not update:
        raise ProvenanceError(f"{manifest.id}: what was resolved differs from the lock {path}:\n"
                              + "\n".join(f"  {d}" for d in diffs),
                              hint="if the change is intended, run again with --update-lock")
    write_lock(path, manifest, _keep_branches(locked, resolved))
    return path, True


def _keep_branches(locked: Pins, resolved: Pins) -> Pins:
    """A run does not ask where branches point now; keep what the lock recorded about them."""
    sources = {}
    for name, entry in resolved.sources.items():
        old = locked.sources.get(name, {})
        keep = {k: old[k] for k in ("branch", "branch_commit") if k in old and "branch_commit" not in entry}
        sources[name] = {**entry, **keep}
    return Pins(resolved.images, sources, {**locked.files, **resolved.files})
