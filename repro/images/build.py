"""Build a target's image: pinned base, source at its commit, patches, upstream ENV, RDMA layer, sshd layer,
labels.

Nothing is tagged until every check passed: the build runs untagged, the RDMA layer is
built and probed, the CA bundle is proven absent, and only then does the manifest's tag
move to the result. Whatever a failed build created is removed again.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import io
import json
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker

from repro import __version__, paths
from repro.errors import BuildError, ReproError, UsageError
from repro.events import Event, Progress, ignore
from repro.images import deps, lock, vcs
from repro.images import rdma as rdma_layer
from repro.images.refs import Ref, parse_ref
from repro.images.registry import DISK_HINT, classify, local_image
from repro.images.source import Mirrors, prepare_source
from repro.images.sshd import render_sshd_layer
from repro.spec.manifest import Manifest
from repro.throwaway import throwaway

log = logging.getLogger(__name__)

#: The build context's CA bundle (empty when none is given) and where build stages put it.
CA_FILE = "repro-ca.crt"
#: the base check (repro/images/base_check.py) in every build context
BASE_CHECK_FILE = "repro-base-check.py"
CA_IMAGE_PATH = "/etc/ssl/certs/repro-build-ca.crt"
TAIL_LINES = 20
_STEP = re.compile(r"^Step (\d+/\d+) : (.*)$")
_LAYER = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_CHATTER = re.compile(r"^ ---> |^Removing intermediate container |^Successfully (built|tagged) ")


@dataclass(frozen=True)
class BuildOptions:
    ca_bundle: Path | None = None
    work_dir: Path | None = None          # contexts and build logs (default ~/.cache/repro/build)
    dockerfiles: Path | None = None       # default: the kit's dockerfiles/
    ofed_cache: Path | None = None
    wheels: Path | None = None            # *.whl files copied into the context's wheels/ (offline pip)
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    no_cache: bool = False
    git_mirrors: Mirrors = ()             # (prefix, replacement) pairs for source URLs (--git-mirror)
    run_id: str | None = None             # the run the build is part of: its check containers carry the id
    #: an mpi target's image gets the sshd layer mpirun reaches the other ranks through; False where its ranks
    #: start through Slurm's PMI (pyxis), which needs none
    sshd: bool = True


@dataclass(frozen=True)
class Built:
    tag: str
    id: str
    labels: Mapping[str, str]
    log: Path
    seconds: float
    rdma_versions: Mapping[str, str] = field(default_factory=dict)
    #: untagged images of the build's earlier stages: the engine keeps them as build cache
    stages: tuple[str, ...] = ()


def work_dir(opts: BuildOptions) -> Path:
    return opts.work_dir or Path.home() / ".cache" / "repro" / "build"


def dockerfile_dir(manifest: Manifest, opts: BuildOptions) -> Path:
    name = manifest.image["build"]["dockerfile"]
    d = (opts.dockerfiles or paths.dockerfiles_dir()) / name
    if not (d / "Dockerfile").is_file():
        raise UsageError(f"{manifest.id}: no Dockerfile {d / 'Dockerfile'}",
                         hint="image.build.dockerfile names a directory under dockerfiles/")
    return d


def tree_sha256(root: Path) -> str:
    """A digest of every file's relative path and content under ``root``."""
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return f"sha256:{h.hexdigest()}"


def variant(manifest: Manifest, sshd: bool = True) -> str | None:
    """Which image an mpi target gets: ``sshd`` (mpirun starts the other ranks through it) or ``pmi`` (its
    ranks start through Slurm's PMI: no sshd layer); None for the other launch kinds."""
    if manifest.launch.kind != "mpi":
        return None
    return "sshd" if sshd else "pmi"


def identity_labels(manifest: Manifest, base: Ref, dockerfile_sha: str, sshd: bool = True) -> dict[str, str]:
    """The labels that say what an image was built from (without the time it was built)."""
    src = manifest.source or {}
    mpi = variant(manifest, sshd)
    return {**({"repro.mpi.variant": mpi} if mpi else {}),
        "org.opencontainers.image.source": src.get("repository", ""),
        "org.opencontainers.image.revision": src.get("commit", ""),
        "org.opencontainers.image.base.name": base.tagged,
        "org.opencontainers.image.base.digest": base.digest,
        "repro.target": manifest.id,
        "repro.manifest.sha256": manifest.sha256,
        "repro.build.sha256": build_inputs_sha256(manifest, sshd),
        "repro.dockerfile.sha256": dockerfile_sha,
        "repro.rdma": rdma_layer.describe(manifest),
        "repro.kit.version": __version__,
    }


#: Labels that trace an image to the manifest it was built for but say nothing about its content:
#: a manifest that changes only its matrix, launch flags or protocol reuses the image.
TRACE_ONLY = ("repro.manifest.sha256", "repro.target")


def build_inputs_sha256(manifest: Manifest, sshd: bool = True) -> str:
    """A digest of everything in a manifest that goes into its image: the build section, source, RDMA, and
    for an mpi target the sshd layer (or that its variant has none)."""
    inputs = {"build": manifest.data["image"]["build"], "source": manifest.data.get("source"),
              "rdma": manifest.data.get("rdma")}
    if variant(manifest, sshd) == "sshd":
        inputs["sshd"] = render_sshd_layer("BASE")
    elif variant(manifest, sshd) == "pmi":
        inputs["mpi"] = "pmi"
    lock = deps.deps_lock_path(manifest)
    if deps.declared(manifest) is not None and lock.is_file():
        inputs["requirements_lock"] = lock.read_text(encoding="utf-8")
    if "python" in manifest.image["build"]["base"] or manifest.image["build"]["base"].get("ships"):
        inputs["base_check"] = Path(__file__).with_name("base_check.py").read_text(encoding="utf-8")
    return "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def find_current(client: docker.DockerClient, manifest: Manifest, base: Ref,
                 opts: BuildOptions) -> Any | None:
    """The image already tagged for this manifest's build, when it was built from exactly these inputs."""
    image = local_image(client, manifest.image["build"]["tag"])
    if image is None:
        return None
    want = identity_labels(manifest, base, tree_sha256(dockerfile_dir(manifest, opts)), opts.sshd)
    have = image.labels or {}
    return image if all(have.get(k) == v for k, v in want.items() if k not in TRACE_ONLY) else None


def build_image(client: docker.DockerClient, manifest: Manifest, base: Ref, opts: BuildOptions,
                progress: Progress = ignore) -> Built:
    """Build, verify and tag the manifest's image FROM ``base`` (pinned); see the module doc."""
    started = time.monotonic()
    df_dir = dockerfile_dir(manifest, opts)
    tag = parse_ref(manifest.image["build"]["tag"])
    labels = {**identity_labels(manifest, base, tree_sha256(df_dir), opts.sshd),
              "org.opencontainers.image.created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
              **opts.extra_labels}
    root = work_dir(opts)
    logfile = root / "logs" / f"{manifest.id}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.log"
    created: list[str] = []
    try:
        with _scratch(root) as scratch:
            context = _context(manifest, df_dir, scratch / "context", opts, progress)
            stages: list[str] = []
            image_id = run_build(client, logfile, progress, created, stages, path=str(context),
                                 buildargs=build_args(manifest, base), nocache=opts.no_cache)
            versions: dict[str, str] = {}
            if rdma_layer.installs(manifest):
                image_id, versions, extra = _rdma(client, manifest, image_id, scratch / "rdma", logfile, opts,
                                                  progress, created)
                labels.update(extra)
            if variant(manifest, opts.sshd) == "sshd":
                image_id = _sshd(client, image_id, scratch / "sshd", logfile, opts, progress, created)
            check_no_ca(client, image_id, opts.run_id)
            progress(Event("step", "labelling"))
            image_id = run_build(client, logfile, progress, created,
                                 fileobj=io.BytesIO(label_step(image_id, labels)))
        client.api.tag(image_id, tag.repository, tag.tag or "latest")
    except BaseException:
        _remove(client, created)
        raise
    progress(Event("info", f"tagged {tag.tagged} ({image_id[:19]})"))
    final = client.images.get(image_id)
    return Built(tag.tagged, image_id, dict(final.labels or {}), logfile, time.monotonic() - started,
                 versions, stages=tuple(s for s in stages if _dangling(client, s)))


def _dangling(client: docker.DockerClient, image_id: str) -> bool:
    image = local_image(client, image_id)
    return image is not None and not image.tags


def label_step(image_id: str, labels: Mapping[str, str]) -> bytes:
    """A Dockerfile that adds all ``labels`` to ``image_id`` in one config-only step."""
    pairs = " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"FROM {image_id}\nLABEL {pairs}\n".encode()


class _scratch:  # noqa: N801 - used as a context manager
    """A temporary directory under ``root``; ENOSPC and other OS errors become BuildErrors."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __enter__(self) -> Path:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "logs").mkdir(exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix="ctx-", dir=self.root))
        except OSError as e:
            raise _os_error(e, self.root) from e
        return self.path

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if isinstance(err, OSError) and not isinstance(err, ReproError):
            raise _os_error(err, self.root) from err


def _os_error(e: OSError, where: Path) -> BuildError:
    # shutil.copytree gathers its failures into one shutil.Error, without an errno
    if e.errno == errno.ENOSPC or "[Errno 28]" in str(e):
        return BuildError(f"disk full while preparing the build in {where}",
                          hint="free space there, or choose another directory with --work-dir")
    return BuildError(f"cannot prepare the build in {where}")


def env_lines(manifest: Manifest) -> str:
    """The ENV instructions that carry the upstream Dockerfile's ENV (image.build.env), appended last."""
    env = manifest.image["build"].get("env", {})
    return "".join(f"ENV {k}={json.dumps(v)}\n" for k, v in env.items())


def _dependency_lock(manifest: Manifest, context: Path) -> None:
    """The target's dependency lock into the context as ``requirements.lock``, when its Dockerfile installs
    from one; a missing, edited or stale lock stops the build here, naming what is wrong."""
    if "requirements.lock" not in (context / "Dockerfile").read_text(encoding="utf-8"):
        return
    if deps.declared(manifest) is None:
        name = manifest.image["build"]["dockerfile"]
        raise UsageError(f"{manifest.id}: dockerfiles/{name} installs from a dependency lock, but the "
                         "manifest declares no image.build.deps",
                         hint="declare image.build.deps (cutoff, why), then run "
                              "`repro lock TARGET --deps-only`")
    path = deps.deps_lock_path(manifest)
    text = deps.read_lock_text(manifest)
    problems = deps.lock_problems(manifest, text)
    if problems:
        raise BuildError(f"{manifest.id}: " + "; ".join(problems),
                         hint=f"run `repro lock {manifest.id} --deps-only` and commit {path.name}")
    (context / "requirements.lock").write_text(text or "", encoding="utf-8")
    (context / "wheels").mkdir(exist_ok=True)
    for _, commit, filename, _ in vcs.locked(text or ""):
        where = vcs.wheels_dir(manifest.path.parent) / commit
        shutil.copyfile(where / filename, context / "wheels" / filename)


def _context(manifest: Manifest, df_dir: Path, context: Path, opts: BuildOptions, progress: Progress) -> Path:
    shutil.copytree(df_dir, context)
    if env_lines(manifest):
        with (context / "Dockerfile").open("a", encoding="utf-8") as f:
            f.write(env_lines(manifest))
    if manifest.source:
        src = manifest.source
        progress(Event("step", f"fetching {src['repository']} at {src['commit']}"))
        prepare_source(src, context / "source", opts.git_mirrors)
        if src.get("patches"):
            progress(Event("info", f"applied {len(src['patches'])} patch(es)"))
    else:
        (context / "source").mkdir()
    shutil.copyfile(Path(__file__).with_name("base_check.py"), context / BASE_CHECK_FILE)
    _dependency_lock(manifest, context)
    ca = context / CA_FILE
    if opts.ca_bundle:
        shutil.copyfile(opts.ca_bundle, ca)
    else:
        ca.write_bytes(b"")
    wheels = context / "wheels"
    wheels.mkdir(exist_ok=True)
    for whl in sorted(opts.wheels.glob("*.whl")) if opts.wheels else ():
        shutil.copyfile(whl, wheels / whl.name)
    return context


def base_declared(manifest: Manifest) -> dict[str, str]:
    """BASE_PYTHON and BASE_SHIPS, what the build's first stage checks the base against (``base_check``),
    when the manifest declares them (image.build.base.python / ships)."""
    base = manifest.image["build"]["base"]
    out = {}
    if "python" in base:
        out["BASE_PYTHON"] = base["python"]["version"]
    if base.get("ships"):
        out["BASE_SHIPS"] = " ".join(f"{s['name']}=={s['version']}" for s in base["ships"])
    return out


def build_args(manifest: Manifest, base: Ref) -> dict[str, str]:
    """BASE (pinned by digest) and SOURCE_PATH (the manifest's source.path), then the manifest's args."""
    extra = dict(manifest.image["build"].get("args", {}))
    for reserved in ("BASE", "SOURCE_PATH", "SOURCE_SUBDIR", "BASE_PYTHON", "BASE_SHIPS"):
        if reserved in extra:
            raise UsageError(f"{manifest.id}: image.build.args may not set {reserved}",
                             hint="the kit sets it from image.build.base / source.path")
    args = {"BASE": base.pinned, **base_declared(manifest)}
    if manifest.source:
        args["SOURCE_PATH"] = manifest.source["path"]
        if manifest.source.get("subdir"):
            args["SOURCE_SUBDIR"] = manifest.source["subdir"]
    return {**args, **extra}


def expected_bundle_sha256(manifest: Manifest) -> str:
    """The sha256 the MLNX_OFED bundle must have: rdma.sha256, else what `repro lock` recorded."""
    assert manifest.rdma is not None
    if manifest.rdma.sha256:
        return manifest.rdma.sha256
    locked = lock.read_lock(lock.lock_path(manifest))
    return locked.files.get(rdma_layer.bundle_name(manifest), "") if locked else ""


def _rdma(client: docker.DockerClient, manifest: Manifest, image_id: str, context: Path, logfile: Path,
          opts: BuildOptions, progress: Progress, created: list[str]) -> tuple[str, dict[str, str],
                                                                               dict[str, str]]:
    """Build and probe the RDMA layer; its image, the versions found, and the labels to record."""
    rdma = manifest.rdma
    assert rdma is not None
    context.mkdir()
    (context / "Dockerfile").write_text(rdma_layer.render_rdma_layer(manifest, image_id), encoding="utf-8")
    labels = {}
    if rdma.strategy == "mlnx-ofed":
        labels["repro.rdma.bundle.sha256"] = rdma_layer.stage_bundle(
            manifest, context, expected_bundle_sha256(manifest), opts.ofed_cache, progress)
    progress(Event("step", f"building the RDMA layer ({rdma_layer.describe(manifest)})"))
    layered = run_build(client, logfile, progress, created, path=str(context), nocache=opts.no_cache)
    progress(Event("step", "checking the RDMA user space inside the image"))
    versions = rdma_layer.verify(client, layered, rdma, opts.run_id)
    progress(Event("info", f"RDMA: {rdma_layer.versions_label(versions)}"))
    labels["repro.rdma.versions"] = rdma_layer.versions_label(versions)
    return layered, versions, labels


def _sshd(client: docker.DockerClient, image_id: str, context: Path, logfile: Path, opts: BuildOptions,
          progress: Progress, created: list[str]) -> str:
    """Build the mpi launcher's sshd layer on ``image_id``; the resulting image."""
    context.mkdir()
    (context / "Dockerfile").write_text(render_sshd_layer(image_id), encoding="utf-8")
    progress(Event("step", "building the mpi layer (sshd)"))
    return run_build(client, logfile, progress, created, path=str(context), nocache=opts.no_cache)


def run_build(client: docker.DockerClient, logfile: Path, progress: Progress, created: list[str],
              stages: list[str] | None = None, **kwargs: Any) -> str:
    """One ``docker build`` (legacy builder, host network), streamed to ``logfile`` and ``progress``.

    ``stages`` collects the last image of every stage before the final one (multi-stage builds).
    """
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    step, image_id, layer = "", "", ""
    with logfile.open("a", encoding="utf-8") as out:
        try:
            for chunk in _stream(client, kwargs):
                if "error" in chunk:
                    raise _failed(chunk["error"], step, tail, logfile)
                if chunk.get("aux", {}).get("ID"):
                    image_id = chunk["aux"]["ID"]
                for line in str(chunk.get("stream", "")).splitlines():
                    out.write(line + "\n")
                    m = _STEP.match(line)
                    if m and m.group(2).upper().startswith("FROM ") and layer and stages is not None:
                        stages.append(layer)
                    done = _LAYER.match(line)
                    layer = done.group(1) if done else layer
                    if m:
                        step = f"step {m.group(1)}: {m.group(2)}"
                        tail.clear()
                        progress(Event("step", step))
                    elif line.strip():
                        if not _CHATTER.match(line):
                            tail.append(line)  # the step's own output, not the builder's bookkeeping
                        progress(Event("log", line))
        except docker.errors.APIError as e:
            raise _failed(str(e.explanation or e), step, tail, logfile) from e
    if not image_id:
        raise BuildError(f"the build ended without an image ID (log: {logfile})")
    created.append(image_id)
    return image_id


def _stream(client: docker.DockerClient, kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return client.api.build(network_mode="host", rm=True, forcerm=True, decode=True, pull=False, **kwargs)


def _failed(error: str, step: str, tail: collections.deque[str], logfile: Path) -> BuildError:
    lines = "\n".join(f"  | {ln}" for ln in tail) or "  | (no output)"
    where = f"at {step}" if step else "before its first step"
    hint = DISK_HINT if classify(error) == "disk" else None
    return BuildError(f"build failed {where}\n{error.strip()}\n"
                      f"last {len(tail)} lines of its output:\n{lines}\n"
                      f"full log: {logfile}", hint=hint)


def check_no_ca(client: docker.DockerClient, image_id: str, run_id: str | None = None) -> None:
    """The CA bundle given to the build must not be in the final image."""
    with throwaway(client, image_id, ["true"], probe="ca", run_id=run_id, entrypoint=[],
                   network_mode="none") as container:
        try:
            container.get_archive(CA_IMAGE_PATH)
        except docker.errors.NotFound:
            return
    raise BuildError(f"the build's CA bundle ({CA_IMAGE_PATH}) is in the final image",
                     hint="copy it only in an earlier build stage, never in the last one "
                          "(as dockerfiles/cpu-torch does)")


def _remove(client: docker.DockerClient, ids: list[str]) -> None:
    for image_id in reversed(ids):
        try:
            client.api.remove_image(image_id)
        except docker.errors.APIError as e:
            # 409: a cached layer that an earlier, good image still uses; it stays
            level = logging.DEBUG if e.status_code == 409 else logging.WARNING
            log.log(level, "could not remove %s after a failed build: %s", image_id, e)

