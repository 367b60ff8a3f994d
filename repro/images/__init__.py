"""Images for a target, exactly as pinned, on every node: ``repro images`` and ``repro lock``.

``prepare`` resolves the pins (manifest digest, lock file, or the registry when unpinned
references are allowed) and checks them against the lock, then obtains the image (pull
by digest, or build at the pinned commit with the OFED layer), optionally pushes it, and
distributes it to the nodes. A call that finds everything in place transfers nothing.
Progress goes to a callback; errors are ReproError subclasses.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker

from repro.images import lock
from repro.digest import sha256_file
from repro.errors import ReproError, UsageError
from repro.spec.hosts import Hosts
from repro.images import oci, registry
from repro.images.build import BuildOptions, Built, build_image, find_current, variant
from repro.images.distribute import ImageOnNode, distribute
from repro.images.engine import connect
from repro.events import Event, Progress, ignore
from repro.images.refs import Ref, parse_ref, retag
from repro.images.source import git, repository_url
from repro.spec.manifest import Manifest

log = logging.getLogger(__name__)

__all__ = ["BuildOptions", "ImagesOptions", "ImagesResult", "check_pins", "dry_run_text", "lock_target",
           "prepare"]


@dataclass(frozen=True)
class ImagesOptions:
    mode: str = "auto"            # auto: use what is present, else pull/build | pull | build (always build)
    push: str | None = None       # registry HOST[:PORT][/PREFIX] to push a built image to
    allow_unpinned: bool = False
    update_lock: bool = False
    build: BuildOptions = field(default_factory=BuildOptions)


@dataclass(frozen=True)
class ImagesResult:
    reference: str                # what the nodes run
    image_id: str
    pins: lock.Pins
    lock_path: Path
    lock_written: bool
    built: Built | None = None
    pushed: Ref | None = None
    nodes: tuple[ImageOnNode, ...] = ()
    seconds: float = 0.0


def prepare(manifest: Manifest, hosts: Hosts, opts: ImagesOptions = ImagesOptions(), *,
            progress: Progress = ignore, client: docker.DockerClient | None = None) -> ImagesResult:
    """Resolve, check against the lock, obtain, push and distribute the target's image."""
    started = time.monotonic()
    if opts.mode not in ("auto", "pull", "build"):
        raise UsageError(f"unknown mode {opts.mode!r}")
    local = client or connect()
    pins, path, written = check_pins(manifest, opts, progress=progress)
    built = None
    if "registry" in manifest.image:
        if opts.mode == "build" or opts.push:
            raise UsageError(f"{manifest.id} names a registry image; there is nothing to build or push",
                             hint="drop --build / --push")
        ref = pins.images["image"]
        image_id = registry.pull(local, ref, progress=progress).id
        names: list[str] = []
        registry_ref: Ref | None = ref
        reference = str(ref)
    else:
        if opts.mode == "pull":
            raise UsageError(f"{manifest.id} is built from "
                             f"dockerfiles/{manifest.image['build']['dockerfile']}; "
                             "there is no digest to pull", hint="drop --pull (or use --build)")
        image_id, built = _built_image(local, manifest, pins.images["base"], opts, progress)
        pins = replace(pins, variant=variant(manifest, opts.build.sshd))
        names = [manifest.image["build"]["tag"]]
        registry_ref = None
        reference = names[0]
    pushed = _push(local, image_id, names[0], opts.push, progress) if opts.push and names else None
    registry_ref = pushed or registry_ref
    nodes = distribute(local, image_id, hosts, names=names, registry_ref=registry_ref, progress=progress)
    result = ImagesResult(reference, image_id, pins, path, written, built, pushed, tuple(nodes),
                          time.monotonic() - started)
    progress(Event("done", f"{reference} ({image_id[:19]}) on {len(nodes) or 1} engine(s)",
                   data={"seconds": result.seconds}))
    return result


def check_pins(manifest: Manifest, opts: ImagesOptions = ImagesOptions(), *,
               progress: Progress = ignore) -> tuple[lock.Pins, Path, bool]:
    """Resolve the target's pins and hold them against its lock file (ProvenanceError on a difference).

    Returns the pins, the lock path and whether the lock was written. `repro up` calls this
    before it touches any node, so a mismatch refuses to start. A registry is asked over its API (no
    Docker engine is needed) only where an unpinned tag is allowed.
    """
    pins = resolve_pins(manifest, opts, progress)
    unpinned = any(not r.digest for r in lock.image_refs(manifest).values())
    path, written = lock.check(manifest, pins, update=opts.update_lock,
                               allow_create=opts.allow_unpinned and unpinned)
    if written:
        progress(Event("info", f"lock written: {path}"))
    return pins, path, written


def resolve_pins(manifest: Manifest, opts: ImagesOptions, progress: Progress) -> lock.Pins:
    def from_registry(ref: Ref) -> str:
        digest = oci.digest_of(ref)
        progress(Event("info", f"unpinned {ref.tagged} resolves to {digest}",
                       data={"ref": ref.tagged, "digest": digest}))
        return digest

    return lock.pins_for_run(manifest, lock.read_lock(lock.lock_path(manifest)), from_registry,
                             allow_unpinned=opts.allow_unpinned)


def _built_image(local: docker.DockerClient, manifest: Manifest, base: Ref, opts: ImagesOptions,
                 progress: Progress) -> tuple[str, Built | None]:
    if opts.mode == "auto":
        current = find_current(local, manifest, base, opts.build)
        if current is not None:
            progress(Event("info",
                           f"{manifest.image['build']['tag']} is current ({current.id[:19]}); not building"))
            return current.id, None
    registry.pull(local, base, progress=progress)
    progress(Event("step", f"building {manifest.image['build']['tag']} FROM {base.pinned}"))
    built = build_image(local, manifest, base, opts.build, progress)
    progress(Event("info", f"built {built.tag} ({built.id[:19]}) in {built.seconds:.1f} s; log: {built.log}"))
    return built.id, built


def _push(local: docker.DockerClient, image_id: str, tag: str, target: str, progress: Progress) -> Ref:
    dest = retag(parse_ref(tag), target)
    image: Any = local.images.get(image_id)
    for entry in image.attrs.get("RepoDigests", []):
        held = parse_ref(entry)
        if held.repository == dest.repository and _in_registry(held):
            progress(Event("info",
                           f"{dest.repository}@{held.digest} is already in the registry; not pushing"))
            return Ref(dest.repository, dest.tag, held.digest)
    pushed = registry.push(local, image_id, dest, progress)
    progress(Event("info", f"pushed {pushed}", data={"digest": pushed.digest}))
    return pushed


def _in_registry(ref: Ref) -> bool:
    """Whether the registry holds ``ref``'s digest (asked over its API); one that cannot say is taken as no,
    and the push that follows says what is wrong."""
    try:
        return oci.exists(ref)
    except ReproError:
        return False


def branch_commit(repository: str, branch: str) -> str:
    """Where ``branch`` (or tag) of ``repository`` points now (``git ls-remote``)."""
    out = git(["ls-remote", "--", repository_url(repository), f"refs/heads/{branch}",
               f"refs/tags/{branch}^{{}}", f"refs/tags/{branch}"], timeout=120)
    refs = dict(reversed(line.split("\t", 1)) for line in out.splitlines() if "\t" in line)
    for name in (f"refs/heads/{branch}", f"refs/tags/{branch}^{{}}", f"refs/tags/{branch}"):
        if name in refs:
            return refs[name]
    raise UsageError(f"{repository} has no branch or tag {branch!r}")


def lock_target(manifest: Manifest, *, update: bool = False,
                progress: Progress = ignore) -> tuple[Path, lock.Pins, bool]:
    """``repro lock``: resolve every tag and branch now and write (or check) the lock file. Digests come
    from the registries' API: no Docker engine is asked."""
    pins = lock.resolve_all(manifest, oci.digest_of, branch_commit,
                            warn=lambda msg: progress(Event("warn", msg)),
                            files=bundle_files(manifest, progress))
    path, written = lock.check(manifest, pins, update=update, allow_create=True)
    return path, pins, written


def bundle_files(manifest: Manifest, progress: Progress = ignore,
                 cache: Path | None = None) -> dict[str, str]:
    """For rdma strategy mlnx-ofed: the bundle's name -> its sha256 (fetched into the cache when absent).

    A manifest that pins rdma.sha256 must match it; one that cannot (sha256 "") gets the
    value recorded in the lock file, and every later build checks the bundle against it.
    """
    if manifest.rdma is None or manifest.rdma.strategy != "mlnx-ofed":
        return {}
    from repro.images import rdma

    path = rdma.fetch_bundle(manifest, cache, progress)
    digest = rdma.verify_bundle(manifest, path, manifest.rdma.sha256 or sha256_file(path))
    progress(Event("info", f"{path.name}: sha256 {digest}"))
    return {rdma.bundle_name(manifest): digest}


def dry_run_text(manifest: Manifest) -> str:
    """What ``repro images --dry-run`` prints: the pins as known without asking a registry, then the build."""
    from repro.images import rdma
    from repro.images.render import render_build

    locked = lock.read_lock(lock.lock_path(manifest))
    lines = []
    for role, ref in lock.image_refs(manifest).items():
        have = ref if ref.digest else (locked.images.get(role) if locked else None)
        shown = have.pinned if have and have.digest else f"{ref.tagged} (not pinned: run repro lock)"
        lines.append(f"# {role}: {shown}")
    if "registry" in manifest.image:
        return "\n".join(lines) + "\n# pulled by digest; nothing is built\n"
    base = lock.image_refs(manifest)["base"]
    if not base.digest and locked and "base" in locked.images:
        base = locked.images["base"]
    files = locked.files if locked else {}
    sha = (files.get(rdma.bundle_name(manifest), "")
           if manifest.rdma and manifest.rdma.strategy == "mlnx-ofed" else "")
    return "\n".join(lines) + "\n" + render_build(manifest, base, bundle_sha256=sha)
