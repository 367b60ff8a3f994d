"""The run directory's layout: the one place that knows where each file of a run lies.

::

    logs/<run-id>/                         run id: 20261122T111500Z-<target>-3f9a1c
      manifest.yaml                        the manifest as loaded
      hosts.yaml                           the inventory it ran on
      state.json                           per cell and repeat: pending | running | done | failed (+ why)
      cells/<cell-key>/r<k>/<rank>-<node>.log   one log per node, cell and repeat (k from 1, rank 0 first)
      cells/<cell-key>/r<k>/telemetry-<node>.txt  what the node's sampler printed; telemetry.json beside them
      report.md  report.csv  report.json   the table compared from the rank-0 logs
      report.png  report.html              its chart, and one self-contained page with both
      provenance.json                      what ran where (schema repro/spec/schemas/provenance.v1.json)
      provenance.intoto.json               the same as an in-toto Statement (SLSA Provenance v1)
      SHA256SUMS                           ``sha256sum -c`` format, every file but itself
      job/                                 a detached run's batch script and what its job wrote
                                           (repro/run/schedulers/slurm/detached.py)

A base module: every stage may import it (the nodes' telemetry, the run, the record); :mod:`repro.run.rundir`
reads and writes a run directory by it.
"""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST, HOSTS, STATE = "manifest.yaml", "hosts.yaml", "state.json"
PROVENANCE, INTOTO, SUMS = "provenance.json", "provenance.intoto.json", "SHA256SUMS"
REPORTS = {"md": "report.md", "csv": "report.csv", "json": "report.json"}
CHART, PAGE = "report.png", "report.html"
CELLS, JOB = "cells", "job"
#: one node's telemetry file of a repeat, ``telemetry-<node>.txt``, and the repeat's summary beside them
TELEMETRY_PREFIX, TELEMETRY_SUFFIX, TELEMETRY_SUMMARY = "telemetry-", ".txt", "telemetry.json"

#: ``1n8g-fp32-bs256``: nodes, GPUs per node, precision, batch size
CELL_KEY = re.compile(r"^(\d+)n(\d+)g-(.+)-bs(\d+)$")
#: ``<rank>-<node>.log``; ``rank<rank>-<node>.log`` (an earlier kit's naming) is read too
LOG_NAME = re.compile(r"^(?:rank)?(\d+)-(.+)\.log$")
_REPEAT = re.compile(r"^r([0-9]+)$")


def cell_dir(run: Path, key: str) -> Path:
    """``cells/<cell-key>``: every repeat of one cell."""
    return Path(run) / CELLS / key


def repeat_dir(run: Path, key: str, repeat: int) -> Path:
    """``cells/<cell-key>/r<repeat>``: one repeat's per-node logs and telemetry."""
    return cell_dir(run, key) / f"r{repeat}"


def repeat_dirs(run: Path, key: str) -> list[tuple[int, Path]]:
    """(repeat, its folder) of every repeat folder a cell has, in repeat order."""
    base = cell_dir(run, key)
    found = [(int(m.group(1)), d) for d in base.iterdir() if (m := _REPEAT.match(d.name)) and d.is_dir()] \
        if base.is_dir() else []
    return sorted(found)


def log_name(rank: int, node: str) -> str:
    """``<rank>-<node>.log``: one node's log of one repeat."""
    return f"{rank}-{node}.log"


def telemetry_name(node: str) -> str:
    """``telemetry-<node>.txt``: what one node's sampler printed during one repeat."""
    return f"{TELEMETRY_PREFIX}{node}{TELEMETRY_SUFFIX}"


def is_cell_file(rel: str) -> bool:
    """Whether a run directory's file (a relative POSIX path) is one of the cells' (logs, telemetry)."""
    return rel.startswith(CELLS + "/")
