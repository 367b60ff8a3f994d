"""An image streamed to a node (``docker save`` into the node's ``docker load``) reports the bytes sent and
the rate as it goes, at most one event every few seconds, and the total at the end, in events the CLI shows
(the library prints nothing). No Docker: two stand-in engines and a stand-in clock."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from repro.events import Event

distribute = importlib.import_module("repro.images.distribute")  # the package names a function so
MIB = 1 << 20


class Engine:
    """The few calls of the SDK's low-level API a stream makes."""

    def __init__(self, chunks: list[bytes] | None = None, clock: list[float] | None = None) -> None:
        self.chunks, self.clock, self.loaded = chunks or [], clock, 0
        self.api = self

    def get_image(self, name: str) -> Any:
        for c in self.chunks:
            yield c

    def load_image(self, chunks: Any, quiet: bool = True) -> list[dict[str, str]]:
        for c in chunks:
            self.loaded += len(c)
            self.clock[0] += 1.0  # a second a chunk
        return []


def test_a_stream_reports_bytes_and_rate_as_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(distribute.time, "monotonic", lambda: clock[0])
    local, node = Engine([b"x" * (8 * MIB)] * 12), Engine(clock=clock)
    events: list[Event] = []
    distribute.stream(local, node, "repro/img:1", "node7", events.append)
    assert node.loaded == 96 * MIB
    sent = [e for e in events if "bytes" in e.data]
    assert [e.data["bytes"] for e in sent] == [40 * MIB, 80 * MIB, 96 * MIB]  # every 5 s, then the total
    assert all(e.node == "node7" for e in sent)
    assert sent[0].message == "streamed 40.0 MiB to node7 (8.0 MiB/s)"
    assert sent[-1].message == "streamed 96.0 MiB to node7 in 12.0 s (8.0 MiB/s)"
    assert sent[-1].data["bytes_per_s"] == pytest.approx(8 * MIB)
