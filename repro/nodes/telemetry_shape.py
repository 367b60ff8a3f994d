"""The shape of a repeat's ``telemetry.json`` (repro.nodes.telemetry.write_repeat_summary): a run directory
may come from anyone, so a saved summary is used only where every figure the summaries read is of its kind."""

from __future__ import annotations

import math
from typing import Any

_GPU_FIGURES = ("below_max_share", "sm_mhz_mean_busy", "sm_max_mhz", "slowed_share", "temperature_max_c",
                "power_of_limit_mean", "utilization_mean_pct", "memory_used_max_mib")
_CPU_FIGURES = ("load1_mean", "load1_max", "busy_share", "mhz_mean", "mhz_min", "mhz_max")


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 53


def _figure(v: Any) -> bool:
    return v is None or isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _process(a: Any) -> bool:
    return (isinstance(a, dict) and all(isinstance(a.get(k), str) for k in ("pid", "name", "gpu_uuid"))
            and _figure(a.get("memory_mib")))


def _gpu_shaped(g: Any) -> bool:
    return g is None or (isinstance(g, dict) and _count(g.get("samples")) and _count(g.get("busy_samples"))
                         and all(_figure(g.get(k)) for k in _GPU_FIGURES)
                         and isinstance(g.get("reasons", {}), dict)
                         and all(isinstance(k, str) and _figure(v) for k, v in g.get("reasons", {}).items())
                         and isinstance(g.get("other_processes", []), list)
                         and all(_process(a) for a in g.get("other_processes", [])))


def _cpu_shaped(c: Any) -> bool:
    return c is None or (isinstance(c, dict) and _count(c.get("samples"))
                         and all(_figure(c.get(k)) for k in _CPU_FIGURES))


def shaped(doc: Any) -> bool:
    """Whether a repeat's telemetry.json is of the shape write_repeat_summary gives it (node -> summary)."""
    return isinstance(doc, dict) and all(
        isinstance(n, dict) and _gpu_shaped(n.get("gpu")) and _cpu_shaped(n.get("cpu"))
        and _count(n.get("skipped", 0)) for n in doc.values())
