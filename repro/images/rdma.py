"""The RDMA user space of an image, as the manifest's ``rdma.strategy`` says.

``image``: the base already carries it (NGC images ship MOFED user space and adapt it to
the host driver); nothing is installed. ``mlnx-ofed``: the pinned MLNX_OFED bundle, its
distro taken from the base image's declared OS (``image.build.base.os``), installed user
space only with the publisher's installer flags; the bundle's sha256 is checked before
it enters the build (the manifest's, else the one ``repro lock`` recorded). ``inbox``:
the distribution's rdma-core. apt reads the distribution's sources only (``repro.images.apt``).
Rendering is a pure function; after a build that installed
something, the stack is checked inside the image and its versions recorded.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tarfile
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import docker

from repro.digest import sha256_file
from repro.errors import BuildError, EnvironmentUnavailable, UsageError
from repro.events import Event, Progress, ignore
from repro.images.apt import dist_apt_install
from repro.spec.manifest import Manifest, Rdma
from repro.throwaway import throwaway

log = logging.getLogger(__name__)

ARCH = "x86_64"
INBOX_PACKAGES = ("ibverbs-providers", "ibverbs-utils", "infiniband-diags", "perftest", "rdma-core")
#: What mlnxofedinstall needs on Ubuntu before it runs (DLPerf's list, plus perl and lsb-release).
MLNX_BUILD_DEPS = ("bison", "chrpath", "debhelper", "dpatch", "ethtool", "flex", "gfortran", "graphviz",
                   "kmod", "libelf1", "libltdl-dev", "libmnl0", "lsb-release", "lsof", "pciutils", "perl",
                   "swig", "tcl", "tk")
DEFAULT_URL = "https://content.mellanox.com/ofed/MLNX_OFED-{version}/{name}.tgz"
_BUNDLE = re.compile(r"^MLNX_OFED_LINUX-(?P<version>[0-9][0-9.-]*?)-"
                     r"(?P<distro>[a-z]+[0-9.]+)-(?P<arch>[a-z0-9_]+)$")


def base_os(manifest: Manifest) -> str | None:
    """The OS the manifest declares for its base image (``image.build.base.os``), if any."""
    build = manifest.image.get("build")
    return build["base"].get("os") if build else None


def bundle_name(manifest: Manifest) -> str:
    """``MLNX_OFED_LINUX-<version>-<distro>-x86_64``, the distro being the base image's declared OS."""
    rdma, distro = manifest.rdma, base_os(manifest)
    if rdma is None or rdma.strategy != "mlnx-ofed":
        raise UsageError(f"{manifest.id}: rdma strategy is not mlnx-ofed; there is no bundle")
    if not distro:
        raise UsageError(f"{manifest.id}: rdma strategy mlnx-ofed needs the base image's OS",
                         hint="declare it, e.g. image.build.base.os: ubuntu18.04 (read /etc/os-release in "
                              "the image)")
    return f"MLNX_OFED_LINUX-{rdma.version}-{distro}-{ARCH}"


def bundle_distro(name: str) -> str | None:
    """The distro a bundle's top directory names (``...-ubuntu16.04-x86_64`` -> ubuntu16.04)."""
    m = _BUNDLE.match(name)
    return m.group("distro") if m else None


def describe(manifest: Manifest) -> str:
    """The ``repro.rdma`` label: ``none``, ``image``, ``inbox`` or ``mlnx-ofed 5.0-2.1.8.0 ubuntu16.04``."""
    rdma = manifest.rdma
    if rdma is None:
        return "none"
    if rdma.strategy == "mlnx-ofed":
        return f"mlnx-ofed {rdma.version} {base_os(manifest) or '(base os not declared)'}"
    return rdma.strategy


def installs(manifest: Manifest) -> bool:
    """Whether the build adds an RDMA layer (mlnx-ofed, inbox) rather than using what the base has."""
    return manifest.rdma is not None and manifest.rdma.strategy in ("mlnx-ofed", "inbox")


def _run(*commands: str) -> list[str]:
    """One RUN of ``&&``-chained commands, one per line."""
    return [("RUN " if i == 0 else " && ") + c + (" \\" if i < len(commands) - 1 else "")
            for i, c in enumerate(commands)]


def render_rdma_layer(manifest: Manifest, base: str) -> str:
    """The Dockerfile that adds the manifest's RDMA user space on top of ``base`` (an image ID or ref)."""
    rdma = manifest.rdma
    if rdma is None or not installs(manifest):
        raise UsageError(f"{manifest.id}: rdma strategy {describe(manifest)} installs nothing; there is no "
                         "layer")
    if rdma.strategy == "inbox":
        lines = ["# repro RDMA layer: inbox (the distribution's rdma-core user space)",
                 f"FROM {base}",
                 *_run(*dist_apt_install(INBOX_PACKAGES), "mkdir -p /etc/libibverbs.d")]
    else:
        name = bundle_name(manifest)
        lines = [f"# repro RDMA layer: MLNX_OFED {rdma.version} for {base_os(manifest)} "
                 "(the base image's OS), "
                 f"user space only (the host keeps its kernel driver)",
                 f"FROM {base}",
                 *_run(". /etc/os-release",
                       f'test "$ID$VERSION_ID" = {base_os(manifest)} || {{ echo "the base image '
                       f'is $ID$VERSION_ID, image.build.base.os says {base_os(manifest)}" >&2; exit 1; }}'),
                 *_run(*dist_apt_install(MLNX_BUILD_DEPS)),
                 f"COPY {name}.tgz /tmp/{name}.tgz",
                 *_run("cd /tmp", f"tar -xf {name}.tgz", f"./{name}/mlnxofedinstall {' '.join(rdma.flags)}",
                       f"rm -rf /tmp/{name} /tmp/{name}.tgz", "mkdir -p /etc/libibverbs.d")]
    return "\n".join(lines) + "\n"


def tarball_top(path: Path) -> str:
    """The name of the one top directory of a bundle tarball (BuildError when it has none)."""
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                return member.name.lstrip("./").split("/", 1)[0]
    except (tarfile.TarError, OSError) as e:
        raise BuildError(f"{path} is not a readable tar archive: {e}") from e
    raise BuildError(f"{path} is an empty archive")


def cache_dir() -> Path:
    return Path(os.environ.get("REPRO_OFED_CACHE") or Path.home() / ".cache" / "repro" / "ofed")


def cached_bundle(manifest: Manifest, cache: Path | None = None) -> Path | None:
    """The manifest's MLNX_OFED bundle in the cache (``.tgz`` or DLPerf's ``.tar``), if there."""
    name, cache = bundle_name(manifest), cache or cache_dir()
    return next((cache / f"{name}{ext}" for ext in (".tgz", ".tar") if (cache / f"{name}{ext}").is_file()),
                None)


def fetch_bundle(manifest: Manifest, cache: Path | None = None, progress: Progress = ignore) -> Path:
    """The bundle from the cache, else downloaded into it (from rdma.url or Mellanox's download site)."""
    found = cached_bundle(manifest, cache)
    if found is None:
        name, cache = bundle_name(manifest), cache or cache_dir()
        rdma = manifest.rdma
        assert rdma is not None
        url = rdma.url or DEFAULT_URL.format(version=rdma.version, name=name)
        found = cache / f"{name}.tgz"
        progress(Event("step", f"downloading {url} into {cache}"))
        _download(url, found)
    return found


def verify_bundle(manifest: Manifest, path: Path, expected: str) -> str:
    """Check the bundle against ``expected`` (sha256 hex) and the base's OS; return its sha256."""
    if not expected:
        raise BuildError(f"{manifest.id}: no checksum to verify {path.name} against",
                         hint="run `repro lock TARGET` to record the bundle's sha256 (or set rdma.sha256 to "
                              "the publisher's checksum)")
    got = sha256_file(path)
    if got != expected:
        raise BuildError(f"{path}: sha256 {got}, but {expected} was recorded for {path.name}",
                         hint="the file in the cache is not the verified bundle; "
                              "remove it and fetch it again")
    top = tarball_top(path)
    if bundle_distro(top) != base_os(manifest):
        raise BuildError(f"{path}: the bundle is for {bundle_distro(top) or top}, the base image is "
                         f"{base_os(manifest)}", hint="mlnxofedinstall refuses a distro mismatch")
    return got


def stage_bundle(manifest: Manifest, context: Path, expected: str, cache: Path | None = None,
                 progress: Progress = ignore) -> str:
    """Put the verified bundle into ``context`` under the name the layer copies; its ``sha256:`` digest."""
    found = fetch_bundle(manifest, cache, progress)
    digest = verify_bundle(manifest, found, expected)
    shutil.copyfile(found, context / f"{bundle_name(manifest)}.tgz")
    return f"sha256:{digest}"


def _download(url: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    try:
        with (urllib.request.urlopen(url, timeout=60) as r,  # noqa: S310 - https URL from manifest
              part.open("wb") as f):
            shutil.copyfileobj(r, f, 1 << 20)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise EnvironmentUnavailable(f"cannot download MLNX_OFED from {url}",
                                     hint=f"put {dest.name} into {dest.parent} "
                                          "(or set REPRO_OFED_CACHE)") from e
    part.rename(dest)


def _probe_script(kind: str) -> str:
    versions = (f"dpkg-query -W -f='${{Package}}=${{Version}}\\n' {' '.join(INBOX_PACKAGES)} 2>/dev/null"
                if kind == "inbox" else "ofed_info -s")
    return ("if ! command -v ibv_devinfo >/dev/null; then echo 'repro:missing ibv_devinfo'; exit 0; fi; "
            "ibv_devinfo 2>&1; echo \"repro:ibv_devinfo_exit=$?\"; echo 'repro:versions'; " + versions
            + " 2>&1")


def parse_probe(kind: str, output: str) -> dict[str, str]:
    """Check the probe's output; the versions it found (package=version, or ofed_info)."""
    if "repro:missing ibv_devinfo" in output:
        raise BuildError("OFED check: ibv_devinfo is not in the image")
    head, _, tail = output.partition("repro:versions")
    # Without an HCA (CI, a build host) ibv_devinfo still runs and says so ("No IB devices
    # found", "Failed to get IB devices list"); what must not happen is a binary or a
    # library that cannot be loaded.
    if re.search(r"error while loading shared libraries|repro:ibv_devinfo_exit=12[67]\b", head):
        raise BuildError(f"OFED check: ibv_devinfo does not run: {head.strip()[-400:]}")
    if "repro:ibv_devinfo_exit=" not in head:
        raise BuildError(f"OFED check: ibv_devinfo did not finish: {head.strip()[-400:]}")
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    if kind == "mlnx-ofed":
        if not lines or not lines[0].startswith("MLNX_OFED_LINUX-"):
            raise BuildError("OFED check: `ofed_info -s` did not name an MLNX_OFED version: "
                             f"{tail.strip()[-200:]}")
        return {"ofed_info": lines[0].rstrip(":")}
    found = dict(ln.split("=", 1) for ln in lines if "=" in ln)
    missing = [p for p in INBOX_PACKAGES if not found.get(p)]
    if missing:
        raise BuildError(f"OFED check: packages missing from the image: {', '.join(missing)}")
    return found


def verify(client: docker.DockerClient, image: str, rdma: Rdma, run_id: str | None = None) -> dict[str, str]:
    """Run the probe in a throwaway container of ``image``; the versions of its RDMA user space."""
    with throwaway(client, image, ["sh", "-c", _probe_script(rdma.strategy)], probe="ofed", run_id=run_id,
                   entrypoint=[], network_mode="none") as container:
        container.start()
        result = container.wait(timeout=120)
        output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    if result.get("StatusCode", 1) != 0:
        raise BuildError(f"OFED check failed (exit {result.get('StatusCode')}): {output.strip()[-400:]}")
    versions = parse_probe(rdma.strategy, output)
    if rdma.strategy == "mlnx-ofed" and str(rdma.version) not in versions["ofed_info"]:
        raise BuildError(f"OFED check: the image has {versions['ofed_info']}, the manifest pins "
                         f"{rdma.version}")
    return versions


def versions_label(versions: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(versions.items()))
