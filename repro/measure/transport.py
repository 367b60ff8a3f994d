"""The network transport a finished cell's ranks used, read from the NCCL lines of its logs (``repro up``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from repro.measure import nccl

if TYPE_CHECKING:
    from repro.run.launch import NodeResult
    from repro.spec.manifest import Cell, Manifest


def transport_findings(manifest: Manifest, cell: Cell, nodes: Sequence[NodeResult]) -> list[str]:
    """What the NCCL lines of a finished cell's logs say against its expected interconnect: one line per node
    whose ranks did not use InfiniBand (or whose log cannot tell), for a multi-node cell expected on IB."""
    if cell.nodes < 2 or manifest.expect.get("interconnect") not in ("infiniband", "roce"):
        return []
    # mpirun's head log holds every rank's
    logs = {r.node: Path(r.log) for r in nodes if r.role != "mpi-sshd"}
    opened = {node: path.open("r", encoding="utf-8", errors="replace") for node, path in logs.items()
              if path.is_file()}
    try:
        return nccl.check_cell(opened, cell.nodes, expect_ib=True) + \
            [f"{node}: no log to read the NCCL transport from" for node in logs if node not in opened]
    finally:
        for f in opened.values():
            f.close()
