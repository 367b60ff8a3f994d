"""VCS requirements of a dependency lock: ``git+URL[@REF]#egg=NAME`` pinned by commit and built into a wheel.

pip refuses VCS requirements under ``--require-hashes``, and a branch or a tag can move. ``repro lock``
resolves each one to a commit (a tag or commit as named; a branch, or no ref at all, as the branch stood at
the lock's cutoff), fetches it through ``--git-mirror`` where needed, builds it into a wheel once (``uv
build``, the build backend pinned by BUILD_CONSTRAINTS, file times from the commit's date) and keeps that
wheel beside the manifests in ``wheels/<commit>/``. The lock records the wheel's sha256 and installs it from
the build context (``/tmp/wheels``) by direct reference; an existing wheel of the same commit is reused, never
rebuilt, so a lock stays valid for every target that shares it. Nothing here prints.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.errors import BuildError, UsageError
from repro.images.source import Mirrors, fetch_commit, git, mirrored, repository_url

#: where the build context's wheels are in the build's first stage (dockerfiles/*: COPY wheels/ /tmp/wheels/)
IMAGE_WHEELS = "/tmp/wheels"
#: the build backend every VCS wheel is built with, so that the same commit gives the same bytes later too
BUILD_CONSTRAINTS = ("setuptools==80.9.0", "wheel==0.45.1")
_VCS = re.compile(r"^(?:-e\s+)?git\+(?P<url>[^@#\s]+?(?:\.git)?)(?:@(?P<ref>[^#\s]+))?"
                  r"(?:#egg=(?P<egg>[A-Za-z0-9][A-Za-z0-9._-]*))?\s*$")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")
#: the comment line above each VCS wheel's lock entry
_NOTE = re.compile(r"^# vcs: (?P<name>\S+) from (?P<line>.+) at (?P<commit>[0-9a-f]{40}): "
                   r"wheels/(?P=commit)/(?P<file>\S+\.whl)$")
_DIRECT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*) @ file://" + IMAGE_WHEELS + r"/(\S+\.whl)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Requirement:
    """One VCS requirement line: its URL (without ``git+``), the ref it names (None: the default branch) and
    the distribution name (``#egg=``)."""

    line: str
    url: str
    ref: str | None
    name: str


@dataclass(frozen=True)
class Wheel:
    """A VCS requirement built: the commit, the wheel beside the manifests and its sha256."""

    requirement: Requirement
    commit: str
    path: Path
    sha256: str


def parse(line: str) -> Requirement | None:
    """The VCS requirement on ``line`` (None for any other line); UsageError for one without ``#egg=``."""
    text = line.split(" #", 1)[0].strip()
    if "git+" not in text:
        return None
    m = _VCS.match(text)
    if m is None or not m.group("egg"):
        raise UsageError(f"requirement {line!r} is a VCS URL the kit cannot lock",
                         hint="write it as git+https://HOST/REPO[@REF]#egg=NAME in "
                              "image.build.deps.requirements")
    # GitHub serves a repository with and without .git; a mirror directory holds it under one name
    return Requirement(line.strip(), m.group("url").removesuffix(".git"), m.group("ref"), m.group("egg"))


def split(lines: Sequence[str]) -> tuple[list[str], list[Requirement]]:
    """Index requirement lines and VCS requirements, in their order."""
    plain, vcs = [], []
    for line in lines:
        req = parse(line)
        if req is None:
            plain.append(line)
        else:
            vcs.append(req)
    return plain, vcs


def wheels_dir(manifests: Path) -> Path:
    return manifests / "wheels"


def resolve(req: Requirement, cutoff: str, mirrors: Mirrors, git_dir: Path) -> str:
    """The commit ``req`` names as of ``cutoff``, fetched into ``git_dir`` (a bare repository)."""
    url = repository_url(mirrored(req.url, mirrors))
    git(["--git-dir", str(git_dir), "fetch", "-q", "--", url, "+HEAD:refs/repro/head",
         "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"])

    def rev(*args: str) -> str | None:
        try:
            return git(["--git-dir", str(git_dir), *args], timeout=120).strip() or None
        except BuildError:
            return None

    if req.ref is None:
        found = rev("rev-list", "-1", "--first-parent", f"--before={cutoff}", "refs/repro/head")
    elif rev("rev-parse", "-q", "--verify", f"refs/heads/{req.ref}") and not _HEX.fullmatch(req.ref):
        found = rev("rev-list", "-1", "--first-parent", f"--before={cutoff}", f"refs/heads/{req.ref}")
    else:
        found = rev("rev-parse", "-q", "--verify", f"{req.ref}^{{commit}}")
    if not found:
        at = f"@{req.ref}" if req.ref else " (its default branch)"
        raise BuildError(f"{req.name}: {req.url}{at} has no commit as of {cutoff}",
                         hint="check the requirement's ref, or reach the repository with --git-mirror")
    return found


def build_wheel(req: Requirement, commit: str, mirrors: Mirrors, index_url: str, out: Path,
                run: Callable[..., Any] = subprocess.run) -> Path:
    """``req`` at ``commit`` built into a wheel in ``out`` (uv build, BUILD_CONSTRAINTS, SOURCE_DATE_EPOCH of
    the commit)."""
    with tempfile.TemporaryDirectory(prefix="repro-vcs-") as tmp:
        src, dist = Path(tmp) / "src", Path(tmp) / "dist"
        fetch_commit(mirrored(req.url, mirrors), commit, src)
        epoch = git(["log", "-1", "--format=%ct", commit], cwd=src).strip()
        constraints = "".join(c + "\n" for c in BUILD_CONSTRAINTS)
        (Path(tmp) / "constraints.txt").write_text(constraints, encoding="utf-8")
        argv = [sys.executable, "-m", "uv", "build", "--wheel", "--out-dir", str(dist), "--no-config",
                "--build-constraints", str(Path(tmp) / "constraints.txt"), "--index-url", index_url,
                "--no-cache", "--quiet", "--native-tls", "--python", sys.executable, str(src)]
        env = {**os.environ, "SOURCE_DATE_EPOCH": epoch, "UV_NO_CONFIG": "1"}
        proc = run(argv, capture_output=True, text=True, timeout=900, env=env, check=False)
        built = sorted(dist.glob("*.whl")) if dist.is_dir() else []
        if proc.returncode != 0 or len(built) != 1:
            tail = " | ".join(ln.strip() for ln in (proc.stderr or "").strip().splitlines()[-6:])
            raise BuildError(f"{req.name}: building a wheel of {req.url} at {commit} failed: {tail}")
        out.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(built[0], out / built[0].name))


def wheel_for(req: Requirement, cutoff: str, manifests: Path, mirrors: Mirrors, index_url: str) -> Wheel:
    """The requirement's commit as of ``cutoff`` and its wheel under ``manifests``/wheels/<commit>/, built
    only when no wheel of that commit is there yet."""
    with tempfile.TemporaryDirectory(prefix="repro-vcs-git-") as tmp:
        git(["init", "-q", "--bare", "--", tmp], timeout=60)
        commit = resolve(req, cutoff, mirrors, Path(tmp))
    where = wheels_dir(manifests) / commit
    have = sorted(where.glob("*.whl")) if where.is_dir() else []
    path = have[0] if len(have) == 1 else build_wheel(req, commit, mirrors, index_url, where)
    return Wheel(req, commit, path, hashlib.sha256(path.read_bytes()).hexdigest())


def lock_lines(wheel: Wheel) -> list[str]:
    """The lock's entry of one VCS wheel: where it came from, then a direct reference with its hash."""
    return [f"# vcs: {wheel.requirement.name} from {wheel.requirement.line} at {wheel.commit}: "
            f"wheels/{wheel.commit}/{wheel.path.name}",
            f"{wheel.requirement.name} @ file://{IMAGE_WHEELS}/{wheel.path.name} \\",
            f"    --hash=sha256:{wheel.sha256}"]


def locked(text: str) -> list[tuple[str, str, str, str]]:
    """(name, commit, wheel file name, sha256) of every VCS wheel a lock installs."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        note = _NOTE.match(line)
        if note is None:
            continue
        entry = " ".join(lines[i + 1:i + 3])
        digest = _HASH.search(entry)
        direct = _DIRECT.match(entry)
        out.append((note.group("name"), note.group("commit"),
                    direct.group(2) if direct else "", digest.group(1) if digest else ""))
    return out


def direct_pins(text: str) -> dict[str, str]:
    """Normalized name -> version (from the wheel's file name) of every direct reference in a lock."""
    out = {}
    for line in text.splitlines():
        m = _DIRECT.match(line)
        if m:
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2).split("-")[1]
    return out


def problems(text: str, manifests: Path) -> list[str]:
    """Locked VCS wheels that are missing beside the manifests or differ from the sha256 the lock records."""
    out = []
    for name, commit, filename, digest in locked(text):
        path = wheels_dir(manifests) / commit / filename
        if not filename or not path.is_file():
            out.append(f"the wheel of {name} at {commit[:12]} (wheels/{commit}/{filename}) is missing: run "
                       "`repro lock TARGET --deps-only` and commit manifests/wheels/")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            out.append(f"wheels/{commit}/{filename} is not the wheel the lock records (sha256 differs)")
    return out
