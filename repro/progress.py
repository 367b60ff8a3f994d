"""How the CLI shows a long run: a live rich panel on a terminal, plain lines or JSON lines elsewhere.

Only ``repro.cli`` uses this module; the library reports through events and never prints.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from datetime import UTC, datetime
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from repro.events import Event
from repro.redact import shown


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def redacted(ev: Event) -> Event:
    """The event as it may be shown: secrets in its message and data blanked, terminal control
    (a container's output, a manifest's title) removed (repro.redact.shown)."""
    data = {k: shown(v) if isinstance(v, str) else v for k, v in ev.data.items()}
    node = shown(ev.node) if ev.node else ev.node
    return dataclasses.replace(ev, message=shown(ev.message), node=node, data=data)


class PlainProgress:
    """One line per event worth a line (not every container output line)."""

    QUIET = {"log", "throughput"}

    def __init__(self, stream: IO[str] | None = None, *, json_lines: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.json_lines = json_lines

    def __call__(self, ev: Event) -> None:
        ev = redacted(ev)
        if self.json_lines:
            rec: dict[str, Any] = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                                   "kind": ev.kind, "message": ev.message}
            if ev.node:
                rec["node"] = ev.node
            rec.update({k: v for k, v in ev.data.items() if k not in rec})
            self.stream.write(json.dumps(rec, default=str) + "\n")
        elif ev.kind not in self.QUIET:
            where = f"[{ev.node}] " if ev.node else ""
            self.stream.write(f"{datetime.now():%H:%M:%S} {ev.kind:<5} {where}{ev.message}\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class LiveProgress:
    """Cells done/total, the current cell and repeat, elapsed and estimated time, each node's
    latest throughput, and warnings and failures as they happen."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.total = 0
        self.index = 0
        self.current = "preparing"
        self.cell_started: float | None = None
        self.durations: list[float] = []
        self.nodes: dict[str, str] = {}
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=True)
        self.live.start()

    def _render(self) -> Group:
        elapsed = time.monotonic() - self.started
        done = max(0, self.index - 1)
        eta = ""
        if self.durations and self.total:
            eta = f" · about {_clock(sum(self.durations) / len(self.durations) * (self.total - done))} left"
        head = Text(f"{done}/{self.total} repeats done · {self.current} · {_clock(elapsed)} elapsed{eta}",
                    style="bold")
        table = Table(show_header=True, header_style="dim", box=None, padding=(0, 2))
        table.add_column("node")
        table.add_column("latest throughput (images/s)", justify="right")
        for node, value in sorted(self.nodes.items()):
            table.add_row(node, value)
        return Group(head, table)

    def __call__(self, ev: Event) -> None:
        ev = redacted(ev)
        if ev.kind == "cell":
            if self.cell_started is not None:
                self.durations.append(time.monotonic() - self.cell_started)
            self.cell_started = time.monotonic()
            self.index, self.total = int(ev.data.get("index", 0)), int(ev.data.get("total", 0))
            self.current = f"cell {ev.message}"
            self.nodes = {}
        elif ev.kind == "step" and "total" in ev.data:
            self.total = int(ev.data["total"])
        elif ev.kind == "throughput" and ev.node:
            self.nodes[ev.node] = ev.message
        elif ev.kind in ("warn", "error"):
            self.console.print(Text(f"{ev.kind}: {ev.message}",
                                    style="yellow" if ev.kind == "warn" else "red"))
        elif ev.kind in ("step", "info", "done") and ev.kind != "log":
            self.console.print(Text(ev.message, style="dim" if ev.kind == "info" else ""))
        self.live.update(self._render())

    def close(self) -> None:
        if self.live.is_started:
            self.live.stop()


def make_progress(*, json_lines: bool, stream: IO[str] | None = None) -> PlainProgress | LiveProgress:
    out = stream or sys.stderr
    if json_lines or not out.isatty():
        return PlainProgress(out, json_lines=json_lines)
    return LiveProgress(Console(file=out))
