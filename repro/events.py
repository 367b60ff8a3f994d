"""Progress events: the kit's stages report through a callback; only the CLI prints."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One thing that happened.

    ``kind`` is one of: ``step`` (a phase starts), ``log`` (a line of build output),
    ``info`` (a result worth showing: a digest, a version), ``warn``, ``node`` (one node's
    outcome), ``done`` (the whole call's outcome).
    """

    kind: str
    message: str
    node: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


Progress = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """A Progress that drops everything (the default for library callers)."""


def logged(progress: Progress) -> Progress:
    """Wrap a Progress so every event also goes to this package's logger (debug level)."""

    def emit(event: Event) -> None:
        log.debug("%s %s%s", event.kind, f"[{event.node}] " if event.node else "", event.message)
        progress(event)

    return emit
