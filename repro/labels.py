"""The labels the kit puts on every container it starts, and the filters that find them again.

Every container started within a run carries ``repro.run=<run id>``: the ranks, and the probes and
build checks started for the run, which also carry ``repro.probe``; those of ``repro images`` and
``repro preflight`` alone, outside any run, carry only that one. ``repro clean`` relies on them.
"""

from __future__ import annotations

RUN = "repro.run"
PROBE = "repro.probe"
TARGET = "repro.target"
CELL = "repro.cell"
RANK = "repro.rank"


def probe_labels(kind: str, run_id: str | None) -> dict[str, str]:
    """The labels of a container the kit starts to probe something (``kind``), within run ``run_id`` if
    any."""
    return {PROBE: kind, **({RUN: run_id} if run_id else {})}


def rank_labels(target: str, cell: str, rank: int) -> dict[str, str]:
    """The labels of one rank's container (the run's id is added where the run starts it)."""
    return {TARGET: target, CELL: cell, RANK: str(rank)}


def label_filters(run_id: str | None) -> list[dict[str, str]]:
    """Docker label filters for one run's containers, or for every container of the kit."""
    if run_id is not None:
        return [{"label": f"{RUN}={run_id}"}]
    return [{"label": RUN}, {"label": PROBE}]
