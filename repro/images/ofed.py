"""The OFED layer a manifest asks for, built on top of the framework image.

``inbox``: the distribution's rdma-core user space. ``mlnx``: MLNX_OFED user space only
(``--user-space-only --without-fw-update``; the host keeps its kernel driver), version and
distro pinned, from a local tarball cache or a URL. Rendering is a pure function; after
the build the stack is checked inside the image and its versions recorded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker

from repro.errors import BuildError, EnvironmentUnavailable, UsageError
from repro.images.events import Event, Progress, ignore

log = logging.getLogger(__name__)

ARCH = "x86_64"
INBOX_PACKAGES = ("ibverbs-providers", "ibverbs-utils", "infiniband-diags", "perftest", "rdma-core")
#: What mlnxofedinstall needs on Ubuntu before it runs (DLPerf's list, plus perl and lsb-release).
MLNX_BUILD_DEPS = ("bison", "chrpath", "debhelper", "dpatch", "ethtool", "flex", "gfortran", "graphviz", "kmod",
                   "libelf1", "libltdl-dev", "libmnl0", "lsb-release", "lsof", "pciutils", "perl", "swig", "tcl", "tk")
MLNX_FLAGS = ("--user-space-only", "--without-fw-update", "--force")
DEFAULT_URL = "https://content.mellanox.com/ofed/MLNX_OFED-{version}/{name}.tgz"


def describe(ofed: Mapping[str, Any]) -> str:
    """The ``repro.ofed`` label: ``none``, ``inbox`` or ``mlnx 4.9-0.1.7.0 ubuntu18.04``."""
    if ofed["kind"] == "mlnx":
        return f"mlnx {ofed['version']} {ofed['distro']}"
    return str(ofed["kind"])


def mlnx_name(ofed: Mapping[str, Any]) -> str:
    return f"MLNX_OFED_LINUX-{ofed['version']}-{ofed['distro']}-{ARCH}"


def _run(*commands: str) -> list[str]:
    """One RUN of ``&&``-chained commands, one per line."""
    return [("RUN " if i == 0 else " && ") + c + (" \\" if i < len(commands) - 1 else "")
            for i, c in enumerate(commands)]


def _apt(packages: tuple[str, ...]) -> tuple[str, ...]:
    return ("apt-get update",
            f"DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {' '.join(packages)}",
            "rm -rf /var/lib/apt/lists/*")


def render_ofed_layer(ofed: Mapping[str, Any], base: str) -> str:
    """The Dockerfile that adds the manifest's OFED user space on top of ``base`` (an image ID or ref)."""
    kind = ofed["kind"]
    if kind == "inbox":
        lines = ["# repro OFED layer: inbox (the distribution's rdma-core user space)",
                 f"FROM {base}",
                 *_run(*_apt(INBOX_PACKAGES), "mkdir -p /etc/libibverbs.d")]
    elif kind == "mlnx":
        name = mlnx_name(ofed)
        lines = [f"# repro OFED layer: MLNX_OFED {ofed['version']} for {ofed['distro']}, user space only "
                 f"(the host keeps its kernel driver)",
                 f"FROM {base}",
                 *_run(*_apt(MLNX_BUILD_DEPS)),
                 f"COPY {name}.tgz /tmp/{name}.tgz",
                 *_run("cd /tmp", f"tar -xf {name}.tgz", f"./{name}/mlnxofedinstall {' '.join(MLNX_FLAGS)}",
                       f"rm -rf /tmp/{name} /tmp/{name}.tgz", "mkdir -p /etc/libibverbs.d")]
    else:
        raise UsageError(f"no OFED layer for kind {kind!r}")
    return "\n".join(lines) + "\n"


def cache_dir() -> Path:
    return Path(os.environ.get("REPRO_OFED_CACHE") or Path.home() / ".cache" / "repro" / "ofed")


def stage_mlnx(ofed: Mapping[str, Any], context: Path, cache: Path | None = None,
               progress: Progress = ignore) -> str:
    """Put the MLNX_OFED tarball into ``context`` (from the cache, else downloaded into it); its sha256."""
    name = mlnx_name(ofed)
    cache = cache or cache_dir()
    found = next((cache / f"{name}{ext}" for ext in (".tgz", ".tar") if (cache / f"{name}{ext}").is_file()), None)
    if found is None:
        url = ofed.get("url") or DEFAULT_URL.format(version=ofed["version"], name=name)
        found = cache / f"{name}.tgz"
        progress(Event("step", f"downloading {url} into {cache}"))
        _download(url, found)
    dest = context / f"{name}.tgz"
    shutil.copyfile(found, dest)
    digest = hashlib.sha256()
    with dest.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _download(url: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, part.open("wb") as f:  # noqa: S310 - https URL from manifest
            shutil.copyfileobj(r, f, 1 << 20)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise EnvironmentUnavailable(f"cannot download MLNX_OFED from {url}",
                                     hint=f"put {dest.name} into {dest.parent} (or set REPRO_OFED_CACHE)") from e
    part.rename(dest)


def _probe_script(kind: str) -> str:
    versions = (f"dpkg-query -W -f='${{Package}}=${{Version}}\\n' {' '.join(INBOX_PACKAGES)} 2>/dev/null"
                if kind == "inbox" else "ofed_info -s")
    return ("if ! command -v ibv_devinfo >/dev/null; then echo 'repro:missing ibv_devinfo'; exit 0; fi; "
            "ibv_devinfo 2>&1; echo \"repro:ibv_devinfo_exit=$?\"; echo 'repro:versions'; " + versions + " 2>&1")


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
    if kind == "mlnx":
        if not lines or not lines[0].startswith("MLNX_OFED_LINUX-"):
            raise BuildError(f"OFED check: `ofed_info -s` did not name an MLNX_OFED version: {tail.strip()[-200:]}")
        return {"ofed_info": lines[0].rstrip(":")}
    found = dict(ln.split("=", 1) for ln in lines if "=" in ln)
    missing = [p for p in INBOX_PACKAGES if not found.get(p)]
    if missing:
        raise BuildError(f"OFED check: packages missing from the image: {', '.join(missing)}")
    return found


def verify(client: docker.DockerClient, image: str, ofed: Mapping[str, Any]) -> dict[str, str]:
    """Run the probe in a throwaway container of ``image``; the versions of its OFED user space."""
    container = client.containers.create(image, ["sh", "-c", _probe_script(ofed["kind"])], entrypoint=[],
                                         network_mode="none", labels={"repro.probe": "ofed"})
    try:
        container.start()
        result = container.wait(timeout=120)
        output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    if result.get("StatusCode", 1) != 0:
        raise BuildError(f"OFED check failed (exit {result.get('StatusCode')}): {output.strip()[-400:]}")
    versions = parse_probe(ofed["kind"], output)
    if ofed["kind"] == "mlnx" and ofed["version"] not in versions["ofed_info"]:
        raise BuildError(f"OFED check: the image has {versions['ofed_info']}, the manifest pins {ofed['version']}")
    return versions


def versions_label(versions: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(versions.items()))
