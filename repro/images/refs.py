"""Image references: split, pin and compare ``registry/repo:tag@sha256:...`` strings.

Pure functions; every other images module goes through these so that a reference is
parsed one way only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from repro.errors import UsageError

log = logging.getLogger(__name__)

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Ref:
    """``repository`` includes the registry host when there is one; tag and digest may be empty."""

    repository: str
    tag: str = ""
    digest: str = ""

    @property
    def registry(self) -> str:
        """The registry host, or ``docker.io`` for a reference without one."""
        first, sep, _ = self.repository.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            return first
        return "docker.io"

    @property
    def path(self) -> str:
        """The repository without its registry host (what the registry API calls the name)."""
        if self.registry == "docker.io" and not self.repository.startswith("docker.io/"):
            return self.repository if "/" in self.repository else f"library/{self.repository}"
        return self.repository.partition("/")[2]

    @property
    def tagged(self) -> str:
        """``repo:tag`` (``repo:latest`` when there is no tag)."""
        return f"{self.repository}:{self.tag or 'latest'}"

    @property
    def pinned(self) -> str:
        """``repo@sha256:...``: what is pulled and built FROM; the tag is only informational."""
        if not self.digest:
            raise UsageError(f"{self} is not pinned by a digest")
        return f"{self.repository}@{self.digest}"

    def with_digest(self, digest: str) -> Ref:
        check_digest(digest, str(self))
        return Ref(self.repository, self.tag, digest)

    def __str__(self) -> str:
        out = self.repository + (f":{self.tag}" if self.tag else "")
        return out + (f"@{self.digest}" if self.digest else "")


def check_digest(digest: str, where: str) -> str:
    if not DIGEST.fullmatch(digest):
        raise UsageError(f"{where}: {digest!r} is not a sha256 digest",
                         hint="a digest reads sha256:<64 hex digits>")
    return digest


def parse_ref(text: str, digest: str = "") -> Ref:
    """``host:5000/a/b:tag@sha256:...`` -> Ref; ``digest`` (e.g. from a manifest field) fills a missing
    one."""
    name, _, at = text.partition("@")
    if at:
        check_digest(at, text)
    if digest:
        check_digest(digest, text)
        if at and at != digest:
            raise UsageError(f"{text} names digest {at} but {digest} was given")
    last = name.rsplit("/", 1)[-1]
    repo, tag = (name.rsplit(":", 1) if ":" in last else (name, ""))
    if not repo or not re.match(r"^[a-z0-9][a-z0-9._/:-]*$", repo):
        raise UsageError(f"not an image reference: {text!r}")
    return Ref(repo, tag, at or digest)


def retag(ref: Ref, registry: str) -> Ref:
    """The same repository path under another registry (``--push HOST[:PORT][/PREFIX]``), digest dropped."""
    registry = registry.rstrip("/")
    if not re.match(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._/-]+)?$", registry):
        raise UsageError(f"bad registry {registry!r}", hint="give HOST[:PORT][/PREFIX], e.g. 127.0.0.1:5000")
    path = ref.repository.partition("/")[2] if ref.registry != "docker.io" else ref.repository
    return Ref(f"{registry}/{path}", ref.tag)
