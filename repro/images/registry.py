"""Registry operations through an engine: pull by digest, push (digests are asked of the registry API
itself, without an engine: repro.images.oci).

Every failure is translated: a registry that cannot be reached is an
EnvironmentUnavailable (exit 3); an unknown image, a digest that does not match and a
full disk are BuildErrors (exit 4).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import docker

from repro.errors import BuildError, EnvironmentUnavailable, ReproError
from repro.events import Event, Progress, ignore
from repro.images.refs import Ref

log = logging.getLogger(__name__)

_UNREACHABLE = re.compile(r"connection refused|no such host|i/o timeout|network is unreachable|"
                          r"no route to host|dial tcp|connection reset|TLS handshake timeout|"
                          r"server gave HTTP response",
                          re.I)
_UNKNOWN = re.compile(r"manifest unknown|not found|does not exist|repository .* not found|name unknown|"
                      r"pull access denied|no such image", re.I)
_DISK = re.compile(r"no space left on device", re.I)

DISK_HINT = ("free space where the engine keeps its data (`docker info` shows the Docker Root Dir): "
             "`docker image prune`, `docker builder prune`, or remove old images")


def classify(text: str) -> str:
    """What an engine's error text means: ``disk``, ``unreachable``, ``unknown`` or ``other``."""
    for name, pattern in (("disk", _DISK), ("unreachable", _UNREACHABLE), ("unknown", _UNKNOWN)):
        if pattern.search(text):
            return name
    return "other"


def translate(text: str, what: str, ref: Ref | str, where: str) -> ReproError:
    """The ReproError for an engine error ``text`` met while doing ``what`` with ``ref`` on ``where``."""
    kind = classify(text)
    reg = ref.registry if isinstance(ref, Ref) else str(ref)
    if kind == "unreachable":
        return EnvironmentUnavailable(f"{what} {ref} on {where}: registry {reg} is not reachable: "
                                      f"{text.strip()}",
                                      hint=f"is the registry up, and reachable from {where}?")
    if kind == "unknown":
        return BuildError(f"{what} {ref} on {where}: no such image in registry {reg}: {text.strip()}",
                          hint="check the reference and digest in the manifest (or its lock file)")
    if kind == "disk":
        return BuildError(f"{what} {ref} on {where}: disk full: {text.strip()}", hint=DISK_HINT)
    return BuildError(f"{what} {ref} on {where} failed: {text.strip()}")


def _stream(events: Any, what: str, ref: Ref | str, where: str, progress: Progress) -> dict[str, Any]:
    """Consume a pull/push JSON stream; raise on its error; return the last ``aux`` payload."""
    aux: dict[str, Any] = {}
    for ev in events:
        if "error" in ev:
            raise translate(ev.get("error", ""), what, ref, where)
        if "aux" in ev:
            aux = dict(ev["aux"])
        if ev.get("status") and ev.get("id") is None:
            progress(Event("info", ev["status"], node=where))
    return aux


def local_image(client: docker.DockerClient, name: str) -> Any | None:
    """The image ``name`` (ID, tag or repo@digest) on this engine, or None."""
    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as e:
        raise translate(str(e.explanation or e), "inspecting", name, "the engine") from e


def pull(client: docker.DockerClient, ref: Ref, where: str = "this machine",
         progress: Progress = ignore) -> Any:
    """Pull ``ref`` by its digest (a no-op when present) and check the engine holds that digest."""
    pinned = ref.pinned
    image = local_image(client, pinned)
    if image is None:
        progress(Event("step", f"pulling {pinned}", node=where))
        try:
            _stream(client.api.pull(pinned, stream=True, decode=True), "pulling", ref, where, progress)
        except docker.errors.APIError as e:
            raise translate(str(e.explanation or e), "pulling", ref, where) from e
        image = local_image(client, pinned)
    if image is None or pinned not in image.attrs.get("RepoDigests", []):
        held = image.attrs.get("RepoDigests", []) if image is not None else []
        raise BuildError(f"digest mismatch on {where}: asked for {pinned}, the engine holds "
                         f"{held or 'nothing'}")
    return image


def push(client: docker.DockerClient, image_id: str, target: Ref, progress: Progress = ignore) -> Ref:
    """Tag ``image_id`` as ``target`` and push it; returns ``target`` with the registry's digest.

    On failure the tag made for the push is removed again.
    """
    progress(Event("step", f"pushing {target.tagged}"))
    client.api.tag(image_id, target.repository, target.tag or "latest")
    try:
        aux = _stream(client.api.push(target.repository, tag=target.tag or "latest", stream=True,
                                      decode=True),
                      "pushing", target, "this machine", progress)
    except (docker.errors.APIError, ReproError) as e:
        _untag(client, target.tagged)
        if isinstance(e, ReproError):
            raise
        raise translate(str(e.explanation or e), "pushing", target, "this machine") from e
    digest = str(aux.get("Digest", ""))
    if not digest.startswith("sha256:"):
        _untag(client, target.tagged)
        raise BuildError(f"pushing {target.tagged}: the registry reported no digest")
    return target.with_digest(digest)


def _untag(client: docker.DockerClient, name: str) -> None:
    try:
        client.api.remove_image(name, noprune=True)
    except docker.errors.APIError as e:
        log.warning("could not remove tag %s: %s", name, e)
