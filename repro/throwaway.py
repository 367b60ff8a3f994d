"""Throwaway containers: a probe or a check the kit runs once in a container of an image.

Each is created with the labels ``repro clean`` finds (``repro.probe``, and ``repro.run`` within a run) and
removed, forced, when its block ends, however it ends. A removal that fails is logged, never raised over the
outcome of the job itself; ``repro clean`` finds what is left by its labels.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from repro.labels import probe_labels

log = logging.getLogger(__name__)


@contextmanager
def throwaway(client: Any, image: str, command: Sequence[str], *, probe: str, run_id: str | None = None,
              **create: Any) -> Iterator[Any]:
    """A container of ``image`` created (not started) on ``client`` to run ``command``, labelled as probe
    ``probe`` of run ``run_id`` (on top of any ``labels`` given), and removed when the block ends. The other
    keyword arguments go to the Docker SDK's ``containers.create``."""
    labels = {**create.pop("labels", {}), **probe_labels(probe, run_id)}
    container = client.containers.create(image, list(command), labels=labels, **create)
    try:
        yield container
    finally:
        try:
            container.remove(force=True)
        except Exception as e:  # noqa: BLE001 - the job's outcome is what the caller needs to see
            log.warning("could not remove the %s container %s: %s", probe, container.id[:12], e)
