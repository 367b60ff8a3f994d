"""The image side of the RDMA check, on the real engine: an image that declares its MOFED user space the way NGC
images do (``ENV MOFED_VERSION=...``), read back from the engine and compared with each node's host MOFED."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from repro.errors import EnvironmentUnavailable
from repro.spec.manifest import find_target
from repro.nodes.preflight import NodeReport, Probe

pytestmark = pytest.mark.docker
PREFLIGHT = Path(__file__).resolve().parents[1] / "data" / "preflight"


def build(engine, base: str, env_lines: list[str], tag: str, labels: dict[str, str]) -> str:
    dockerfile = f"FROM {base}\n" + "".join(f"ENV {ln}\n" for ln in env_lines)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    buf.seek(0)
    engine.images.build(fileobj=buf, custom_context=True, tag=tag, labels=labels, rm=True)
    return tag


def report(name: str, ofed: str) -> NodeReport:
    return NodeReport(name, "10.0.0.1", Probe(0.1), docker=Probe("24.0"),
                      rdma_driver=Probe({"ofed": ofed, "mlx5_core": ofed}))


def test_the_images_mofed_version_against_the_hosts(cluster, engine, track) -> None:
    from repro.events import Event
    from repro.up import UpOptions
    from repro.up.attached import _image_mofed

    # the NGC PyTorch 20.06 environment's lines, MOFED_VERSION=4.6-1.0.1 among them
    lines = [ln.removeprefix("export ") for ln in (PREFLIGHT / "ngc-pytorch-20.06-env.txt").read_text().splitlines()]
    image = track.image(build(engine, cluster["base_image_local"], lines, f"repro-test/ngc-env:{track.run_id}",
                              track.labels))
    m = find_target("ngc-pytorch-rn50-v100")  # rdma: {strategy: image}
    events: list[Event] = []
    reports = [report("old", "4.5-1.0.1.0"), report("new", "5.0-2.1.8.0")]
    _image_mofed(m, m.cells(), reports, engine, image, UpOptions(), events.append)
    assert [(e.kind, e.message) for e in events] == [("warn",
        "old: mofed: expected >= 4.6-1.0.1 (the containers' MOFED user space, image), found 4.5-1.0.1.0 on the host")]
    with pytest.raises(EnvironmentUnavailable, match=r"^1 node\(s\) with a MOFED older than the image's"):
        _image_mofed(m, m.cells(), reports, engine, image, UpOptions(strict=True), events.append)
    events.clear()
    _image_mofed(m, [c for c in m.cells() if c.nodes == 1], reports, engine, image, UpOptions(strict=True),
                 events.append)
    assert events == []  # single-node cells only: no RDMA between nodes to check
    paddle = find_target("paddle-rn50-v100")  # mlnx-ofed: the image's MOFED_VERSION is not what it runs
    _image_mofed(paddle, paddle.cells(), reports, engine, image, UpOptions(strict=True), events.append)
    assert events == []
