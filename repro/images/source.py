"""The benchmark's source, fetched on this machine at the manifest's exact commit.

The build context gets a plain copy of the tree at that commit (no network in the
build, and a moved branch or tag cannot change it), with the manifest's patches applied
as exact text replacements that must each match exactly once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.errors import BuildError, EnvironmentUnavailable

log = logging.getLogger(__name__)

GIT_TIMEOUT_S = 1800
#: Written into the checkout: what it is, for anyone who finds it inside an image.
STAMP = ".repro-source.json"
#: The only transports the kit's git calls may use: a URL can never name a transport helper (``ext::``) that
#: runs a command, whatever a manifest or ``--git-mirror`` says.
PROTOCOLS = ("-c", "protocol.allow=never", "-c", "protocol.https.allow=always", "-c",
             "protocol.ssh.allow=always", "-c", "protocol.file.allow=always")
#: What a repository or mirror may be: an https://, ssh:// or file:// URL, or an absolute path.
SAFE_URL = re.compile(r"^(https://|ssh://|file:///?|/)[^\s\x00-\x1f\x7f]*$")


def git(args: Sequence[str], cwd: Path | None = None, timeout: int = GIT_TIMEOUT_S) -> str:
    """Run git (argv, no shell; only the PROTOCOLS transports); return stdout; raise BuildError with git's
    own message. Callers put ``--`` before positional values that could begin with ``-``."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    try:
        done = subprocess.run(["git", *PROTOCOLS, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError as e:
        raise EnvironmentUnavailable("git is not installed", hint="install git (apt-get install git)") from e
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"git {' '.join(args[:2])} took longer than {timeout} s") from e
    if done.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


#: (prefix, replacement) pairs: a source URL that starts with a prefix is read from the replacement instead
Mirrors = tuple[tuple[str, str], ...]


def parse_mirror(text: str) -> tuple[str, str]:
    """``PREFIX=URL`` (``--git-mirror``) as a pair; ValueError when it has no ``=`` or URL is not a safe
    URL."""
    prefix, sep, url = text.partition("=")
    if not sep or not prefix or not url:
        raise ValueError(f"{text!r} is not PREFIX=URL (e.g. https://github.com/=/srv/git/)")
    if not SAFE_URL.fullmatch(url):
        raise ValueError(f"{text!r}: the mirror {url!r} is not an https://, ssh:// or file:// URL or an "
                         "absolute path (e.g. https://github.com/=/srv/git/)")
    return prefix, url


def mirrored(repository: str, mirrors: Mirrors) -> str:
    """``repository`` with the longest matching mirror prefix replaced (unchanged when none matches)."""
    for prefix, url in sorted(mirrors, key=lambda m: -len(m[0])):
        if repository.startswith(prefix):
            return url + repository[len(prefix):]
    return repository


def repository_url(repository: str) -> str:
    """A local path becomes a file:// URL (git fetches by commit from either); BuildError for anything that is
    not a SAFE_URL (a mirror prefix can make one out of a manifest's repository)."""
    if not SAFE_URL.fullmatch(repository):
        raise BuildError(f"{repository!r} is not an https://, ssh:// or file:// URL or an absolute path",
                         hint="check source.repository in the manifest and the --git-mirror values")
    return f"file://{repository}" if repository.startswith("/") else repository


def fetch_commit(repository: str, commit: str, dest: Path) -> None:
    """``dest`` becomes a checkout of exactly ``commit`` (detached), verified with rev-parse."""
    dest.mkdir(parents=True, exist_ok=True)
    git(["init", "-q", "--", str(dest)])
    url = repository_url(repository)
    try:
        git(["fetch", "-q", "--depth", "1", "--", url, commit], cwd=dest)
    except BuildError:
        # servers that refuse fetching by commit: take everything, then pick the commit
        log.info("fetch of %s by commit refused; fetching all refs", url)
        git(["fetch", "-q", "--", url, "+refs/heads/*:refs/remotes/src/*", "+refs/tags/*:refs/tags/*"],
            cwd=dest)
    try:
        git(["-c", "advice.detachedHead=false", "checkout", "-q", "--detach", f"{commit}^{{commit}}"],
            cwd=dest)
    except BuildError as e:
        raise BuildError(f"commit {commit} is not in {repository}",
                         hint="check source.commit in the manifest (a full 40-hex commit)") from e
    head = git(["rev-parse", "HEAD"], cwd=dest).strip()
    if head != commit:
        raise BuildError(f"checkout of {repository} is at {head}, not the manifest's {commit}")


def apply_patches(root: Path, patches: Sequence[Mapping[str, str]]) -> list[str]:
    """Replace each patch's ``old`` text with ``new``; ``old`` must occur exactly once."""
    applied = []
    for i, p in enumerate(patches):
        path = (root / p["file"]).resolve()
        if not path.is_relative_to(root.resolve()) or not path.is_file():
            raise BuildError(f"source.patches[{i}]: no file {p['file']!r} in the checkout")
        text = path.read_text(encoding="utf-8")
        count = text.count(p["old"])
        if count != 1:
            raise BuildError(f"source.patches[{i}] ({p['file']}): the old text {p['old']!r} occurs {count} "
                             "times, not once",
                             hint=f"patch {p['why']!r} does not match this commit; fix `old` in the manifest")
        path.write_text(text.replace(p["old"], p["new"], 1), encoding="utf-8")
        applied.append(p["file"])
    return applied


def prepare_source(source: Mapping[str, Any], dest: Path, mirrors: Mirrors = ()) -> dict[str, Any]:
    """The manifest's source at its commit, patched, without .git, in ``dest``; returns its stamp."""
    work = dest.with_name(dest.name + ".git-work")
    shutil.rmtree(work, ignore_errors=True)
    fetch_commit(mirrored(source["repository"], mirrors), source["commit"], work)
    patches = list(source.get("patches", []))
    apply_patches(work, patches)
    shutil.rmtree(work / ".git")
    shutil.move(str(work), str(dest))
    stamp = {"repository": source["repository"], "commit": source["commit"],
             "patches": [{"file": p["file"], "why": p["why"]} for p in patches],
             "patches_sha256": hashlib.sha256(json.dumps(patches, sort_keys=True).encode()).hexdigest()}
    (dest / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    return stamp
