"""Put one image on every node, in parallel, and prove they all hold the same image ID.

A node that already holds the image is left alone (no transfer). Otherwise it pulls the
pinned digest from the registry; a node that cannot reach the registry (or when there is
no registry copy) gets the image streamed from this machine's engine, ``docker save`` into
``docker load`` through the SDK, over the node's SSH connection, with no shell involved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import docker

from repro.errors import BuildError, EnvironmentUnavailable, ReproError
from repro.spec.hosts import Hosts, Node
from repro.images.engine import node_client
from repro.events import Event, Progress, ignore
from repro.images.refs import Ref, parse_ref
from repro.images.registry import local_image, pull, translate

log = logging.getLogger(__name__)

MAX_PARALLEL = 16
#: how often a stream to a node says how far it is (seconds)
REPORT_EVERY_S = 5.0
MIB = 1 << 20


@dataclass(frozen=True)
class ImageOnNode:
    """The image on one node after distribution: its id there, and how it got there."""

    node: str
    image_id: str
    how: str  # present | pulled | streamed
    seconds: float


def distribute(local: docker.DockerClient, image_id: str, hosts: Hosts, *, names: Sequence[str] = (),
               registry_ref: Ref | None = None, progress: Progress = ignore) -> list[ImageOnNode]:
    """Make every node of ``hosts`` hold ``image_id`` under ``names`` (tags); see the module doc.

    Raises one error naming every node that failed, after all nodes were tried.
    """
    if not names and registry_ref is None:
        raise BuildError("nothing names the image to distribute")
    remote = [n for n in hosts.nodes if not n.local]
    if not remote:
        return []
    progress(Event("step", f"distributing {image_id[:19]} to {len(remote)} node(s)"))
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(remote))) as pool:
        futures = {n.name: pool.submit(_one, local, n, image_id, names, registry_ref, progress)
                   for n in remote}
    results, failures = [], []
    for name, fut in futures.items():
        err = fut.exception()
        if err is None:
            results.append(fut.result())
        elif isinstance(err, ReproError):
            failures.append((name, err))
        else:
            failures.append((name, BuildError(f"{type(err).__name__}: {err}")))
    if failures:
        kind = (EnvironmentUnavailable if all(isinstance(e, EnvironmentUnavailable) for _, e in failures)
                else BuildError)
        raise kind("the image did not reach every node:\n" + "\n".join(f"  {n}: {e}" for n, e in failures),
                   hint=next((e.hint for _, e in failures if e.hint), None))
    ids = {r.node: r.image_id for r in results}
    if set(ids.values()) != {image_id}:
        odd = ", ".join(f"{n} holds {i}" for n, i in ids.items() if i != image_id)
        raise BuildError(f"image ID mismatch: expected {image_id} everywhere, but {odd}")
    return results


def _one(local: docker.DockerClient, node: Node, image_id: str, names: Sequence[str],
         registry_ref: Ref | None, progress: Progress) -> ImageOnNode:
    started = time.monotonic()
    client = node_client(node)
    try:
        lookup = names[0] if names else registry_ref.pinned  # type: ignore[union-attr]
        have = local_image(client, lookup)
        if have is not None and have.id == image_id:
            how, held = "present", have.id
        else:
            how = _transfer(local, client, node, image_id, names, registry_ref, progress)
            _tag(client, image_id, names)
            found = local_image(client, lookup)
            held = found.id if found is not None else "(none)"
    finally:
        client.close()
    result = ImageOnNode(node.name, held, how, time.monotonic() - started)
    progress(Event("node", f"{how} in {result.seconds:.1f} s", node=node.name, data={"how": how}))
    return result


def _transfer(local: docker.DockerClient, client: docker.DockerClient, node: Node, image_id: str,
              names: Sequence[str], registry_ref: Ref | None, progress: Progress) -> str:
    if registry_ref is not None:
        try:
            pull(client, registry_ref, where=node.name, progress=progress)
            return "pulled"
        except EnvironmentUnavailable as e:
            progress(Event("warn",
                           f"cannot pull from the registry ({e.message}); streaming from this machine",
                           node=node.name))
    stream(local, client, names[0] if names else image_id, node.name, progress)
    return "streamed"


def stream(local: docker.DockerClient, client: docker.DockerClient, name: str, where: str,
           progress: Progress = ignore) -> None:
    """``docker save NAME | docker load`` between two engines, chunk by chunk, through the SDK."""
    progress(Event("step", f"streaming {name} to {where}", node=where))
    try:
        chunks = _counted(local.api.get_image(name), where, progress)
        for ev in client.api.load_image(chunks, quiet=True):
            if "error" in ev:
                raise translate(ev["error"], "loading", name, where)
    except docker.errors.APIError as e:
        raise translate(str(e.explanation or e), "streaming", name, where) from e


def _counted(chunks: Iterable[bytes], where: str, progress: Progress) -> Iterator[bytes]:
    """``chunks`` passed through, the bytes sent and the rate said every REPORT_EVERY_S seconds and at the end
    (``info`` events with ``bytes`` and ``bytes_per_s``)."""
    started = last = time.monotonic()
    sent = 0

    def say(now: float, final: bool) -> None:
        rate = sent / (now - started) if now > started else 0.0
        took = f" in {now - started:.1f} s" if final else ""
        progress(Event("info", f"streamed {sent / MIB:.1f} MiB to {where}{took} ({rate / MIB:.1f} MiB/s)",
                       node=where, data={"bytes": sent, "bytes_per_s": rate}))

    for chunk in chunks:
        yield chunk
        sent += len(chunk)
        now = time.monotonic()
        if now - last >= REPORT_EVERY_S:
            say(now, False)
            last = now
    say(time.monotonic(), True)


def _tag(client: docker.DockerClient, image_id: str, names: Sequence[str]) -> None:
    for name in names:
        ref = parse_ref(name)
        have = local_image(client, ref.tagged)
        if have is None or have.id != image_id:
            client.api.tag(image_id, ref.repository, ref.tag or "latest")
