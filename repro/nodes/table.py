"""Preflight's output: one row per node, then problems, probe notes and deviations; or the same as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from tabulate import tabulate

from repro.nodes.facts import Gpu
from repro.nodes.preflight import Deviation, NodeReport, Probe, problems


def _cells(r: NodeReport) -> list[str]:
    def cell(p: Probe, fmt: Any) -> str:
        return "?" if p.reason else fmt(p)

    if not r.reachable:
        return [r.node, "failed", *["-"] * 6]
    gpus: tuple[Gpu, ...] = r.gpus.value or ()
    names = sorted({g.name for g in gpus})
    return [
        r.node,
        r.ssh.detail if r.ssh.value is None else f"{r.ssh.value:g} ms",  # "local", "srun": no SSH
        cell(r.docker, lambda p: p.value),
        cell(r.gpus, lambda p: f"{len(gpus)} x {', '.join(names)}" if gpus else "none"),
        cell(r.gpus, lambda p: ", ".join(sorted({g.driver for g in gpus})) or "-"),
        cell(r.infiniband, lambda p: ", ".join(
            f"{i.device}:{i.port} {i.state} {f'{i.rate_gbps:g}G' if i.rate_gbps else '?'} "
            f"{i.link_layer or ''}".rstrip() for i in p.value) or "none"),
        cell(r.disk, lambda p: f"{p.value / 2**30:.1f} GiB"),
        cell(r.clock, lambda p: f"{p.value:+.3f} s" if abs(p.value) >= 1 else f"{p.value * 1000:+.1f} ms"),
    ]


HEADERS = ["node", "ssh rtt", "docker", "gpus", "driver", "infiniband", "disk free", "clock offset"]


def render_preflight(reports: Sequence[NodeReport], deviations: Sequence[Deviation],
                     blocking: Sequence[str] = ()) -> str:
    """The preflight table, one row per node, then problems, probe notes and deviations."""
    out = [tabulate([_cells(r) for r in reports], headers=HEADERS, tablefmt="simple", disable_numparse=True)]
    bad = problems(reports) + list(blocking)
    if bad:
        out += ["", "problems:", *(f"  {b}" for b in bad)]
    notes = [f"  {r.node}: {p.reason}" for r in reports if r.reachable
             for p in (r.gpus, r.infiniband, r.disk, r.clock) if p.reason]
    if notes:
        out += ["", "probes that failed:", *notes]
    checked = [r for r in reports if r.dataset.value is not None]
    if checked:
        out += ["", f"dataset {checked[0].dataset.detail}:",
                *(f"  {r.node}: {r.dataset.value}" for r in checked)]
    if deviations:
        out += ["", "deviations from the target's expected hardware:", *(f"  {d}" for d in deviations)]
    return "\n".join(out) + "\n"


def to_json(reports: Sequence[NodeReport], deviations: Sequence[Deviation],
            blocking: Sequence[str] = ()) -> str:
    nodes = [{k: v for k, v in asdict(r).items() if k != "host"} for r in reports]  # host: the provenance's
    return json.dumps({"nodes": nodes, "problems": problems(reports) + list(blocking),
                       "deviations": [asdict(d) for d in deviations]}, indent=2)
