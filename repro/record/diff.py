"""``repro diff A B``: two runs, or a run and a target's publication, side by side.

Each side is a run directory, a run archive, or a target (its ``expect`` environment,
its pins and its published figures). Three tables answer "why is my number different?":
the environment (hardware and stack), the pins (manifest, image, source, framework) and
the per-cell results with the delta from A to B.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from repro.record.archive import is_run_path, opened_run
from repro.record.audit import BASE_DIGEST, ENVIRONMENT, container, per_node_text, framework_build, observe
from repro.errors import UsageError
from repro.spec.manifest import Manifest
from repro.nodes.facts import value
from repro.layout import PROVENANCE, REPORTS
from repro.record.provenance import read_record
from repro.record.provenance_view import ProvenanceRecord
from repro.run.rundir import RunDir

ENV_KEYS = ("cluster", "nodes", "gpu_model", "gpu_memory_gb", "gpus_per_node", "driver", "interconnect",
            "ib_rate_gbps", "cpu", "os", "cuda", "cudnn", "nccl", "nccl_transport", "kernel", "docker",
            "python")


@dataclass
class Side:
    label: str
    kind: str  # run | target | logs (a tree of your logs)
    env: dict[str, str | None] = field(default_factory=dict)
    pins: dict[str, str | None] = field(default_factory=dict)
    results: dict[str, float | None] = field(default_factory=dict)
    unit: str = ""
    observed: dict[str, dict[str, Any]] = field(default_factory=dict)  # run: key -> node -> raw value
    expect: Mapping[str, Any] = field(default_factory=dict)             # target: its expect section


def _cell(c: Mapping[str, Any]) -> str:
    return (f"{c['gpus']} GPU ({c['nodes']} node{'s' if c['nodes'] > 1 else ''}) "
            f"{c['precision']} bs{c['batch_size']}")


def _node_fact(record: ProvenanceRecord, probe: str, key: str) -> str | None:
    per = {n.name: (value(n.host.get(probe)) or {}).get(key) for n in record.nodes}
    per = {k: v for k, v in per.items() if v is not None}
    return per_node_text(per) if per else None


def side_from_run(run: RunDir) -> Side:
    record = read_record(run.file(PROVENANCE))
    manifest = run.load_manifest()
    fw = manifest.framework
    env: dict[str, str | None] = {"cluster": cluster_name(record), "nodes": str(len(record.nodes))}
    observed = {key: observe(record, key, fw) for key in ENVIRONMENT}
    for key, per in observed.items():
        env[key] = (per_node_text({k: round(v, 1) if isinstance(v, float) else v for k, v in per.items()})
                    if per else None)
    env["kernel"] = _node_fact(record, "kernel", "release")
    env["docker"] = _node_fact(record, "docker", "version")
    pys = {n.name: (value(container(n).get("python")) or {}).get("version") for n in record.nodes}
    env["python"] = per_node_text({k: v for k, v in pys.items() if v}) or None
    env["nccl_transport"] = transport_seen(record)
    if "registry" in manifest.image:
        images = {n.name: n.image.digest or n.image.id for n in record.nodes}
    else:
        images = {n.name: n.image.labels.get(BASE_DIGEST) for n in record.nodes}
    versions = {n.name: framework_build(n, fw).get("version") for n in record.nodes}
    commits = {n.name: (value(container(n).get("sources", {}).get((manifest.source or {}).get("path", "")))
                        or {}).get("commit") for n in record.nodes}
    pins = {"target": manifest.id, "manifest sha256": record.manifest.sha256[:16],
            "image" if "registry" in manifest.image else "base image":
                per_node_text({k: v for k, v in images.items() if v}) or None,
            "framework version": per_node_text({k: v for k, v in versions.items() if v}) or None,
            "source commit": per_node_text({k: v for k, v in commits.items() if v}) or None,
            "kit": f"{record.kit.version} {record.kit.commit or ''}".strip()}
    results: dict[str, float | None] = {}
    unit = manifest.published[0].unit if manifest.published else ""
    try:
        report = json.loads(run.file(REPORTS["json"]).read_text(encoding="utf-8"))
        results = {_cell(c): c.get("reproduced")
                   for c in (report["cells"] if isinstance(report, dict) else report)}
    except (OSError, ValueError, KeyError):
        if manifest.published:
            from repro.verdict.reproduce import reproduce_run

            results = {_cell(c.__dict__): c.reproduced for c in reproduce_run(run.path).cells}
    return Side(run.run_id, "run", env, pins, results, unit, observed=observed)


def cluster_name(record: ProvenanceRecord) -> str | None:
    """The cluster a run ran on, as its inventory names it: the hosts file's name without its suffix
    (``hosts-perf.yaml``: ``hosts-perf``); without a file, the one machine's name."""
    if record.hosts_source:
        return Path(record.hosts_source).stem
    return record.host_names[0] if len(record.host_names) == 1 else None


def transport_seen(record: ProvenanceRecord) -> str | None:
    """The network transports NCCL used in the run, as its ranks' logs say (``IB``, ``Socket``, both)."""
    seen = {(value(c.nccl_transport) or {}).get("transport") for c in record.commands}
    return "/".join(sorted(t for t in seen if t)) or None


def side_from_logs(label: str, logs: Sequence[Path], cluster: str | None = None) -> Side:
    """A tree of your logs as a side: what logs say of their environment (the NCCL transport where they
    print NCCL_DEBUG=INFO lines), the cluster they are said to come from, and this kit."""
    from repro import __version__
    from repro.measure.nccl import scan

    seen = set()
    for path in logs:
        with Path(path).open("r", encoding="utf-8", errors="replace") as f:
            seen.add(scan(f).transport)
    env = {k: None for k in ENV_KEYS} | {"cluster": cluster,
                                         "nccl_transport": "/".join(sorted(t for t in seen if t)) or None}
    return Side(label, "logs", env, {"kit": __version__})


def side_from_target(m: Manifest, table_id: str | None = None) -> Side:
    env = {k: (str(m.expect[k]) if k in m.expect else None) for k in ENV_KEYS}
    img = m.image.get("registry") or m.image["build"]["base"]
    pins = {"target": m.id, "manifest sha256": m.sha256[:16],
            "image" if "registry" in m.image else "base image": img.get("digest") or img["ref"],
            "framework version": m.expect.get("framework_version"),
            "source commit": (m.source or {}).get("commit"), "kit": None}
    results: dict[str, float | None] = {}
    unit = ""
    if m.published:
        table = m.table(table_id)
        unit = table.unit
        results = {_cell(c.__dict__): float(c.value) for c in table.cells if c.value != "-"}
    return Side(f"{m.id} (published)", "target", env, pins, results, unit, expect=m.expect)


@contextmanager
def side(spec: str) -> Iterator[Side]:
    if is_run_path(spec):
        with opened_run(Path(spec)) as run:
            yield side_from_run(run)
        return
    from repro.spec.manifest import find_target

    try:
        yield side_from_target(find_target(spec))
    except UsageError as e:
        raise UsageError(f"{spec!r} is neither a run (directory or .tar.gz) nor a target: {e.message}",
                         hint=e.hint) from None


def _note(key: str, a: Side, b: Side, x: str | None, y: str | None) -> str:
    if x == y:
        return ""
    if x is None or y is None:
        return "only in A" if y is None else "only in B"
    run, target = (a, b) if a.kind == "run" else (b, a)
    if run.kind == "run" and target.kind == "target" and key in ENVIRONMENT and run.observed.get(key):
        # a publication's figure against what was observed: the audit's notion of a match
        same = ENVIRONMENT[key][1]
        matches = all(same(target.expect[key], v) for v in run.observed[key].values())
        return "matches" if matches else "DIFFERS"
    return "DIFFERS"


def fact_rows(a: Side, b: Side, section: str, keys: tuple[str, ...] | list[str] | None = None
              ) -> list[list[str]]:
    """``[fact, A's, B's, note]`` for each fact of ``section`` (env: the environment, pins), the note
    empty where they agree: what `repro diff` tabulates and `repro compare` ranks."""
    if keys is None:
        keys = ENV_KEYS if section == "env" else list(dict.fromkeys([*a.pins, *b.pins]))
    rows = []
    for k in keys:
        x, y = getattr(a, section).get(k), getattr(b, section).get(k)
        rows.append([k, x or "—", y or "—", _note(k, a, b, x, y) if section == "env" else
                     ("" if x == y else "only in A" if y is None
                      else "only in B" if x is None else "DIFFERS")])
    return rows


def diff_sides(a: Side, b: Side) -> str:
    heads = ["", f"A: {a.label}", f"B: {b.label}"]
    out = [f"# repro diff\n\nA: {a.label} ({a.kind})  \nB: {b.label} ({b.kind})\n", "## Environment\n",
           tabulate(fact_rows(a, b, "env"), headers=[*heads, ""], tablefmt="github",
                    disable_numparse=True),
           "\n## Pins\n",
           tabulate(fact_rows(a, b, "pins"), headers=[*heads, ""],
                    tablefmt="github", disable_numparse=True),
           f"\n## Results ({a.unit or b.unit or 'as published'})\n"]
    rows = []
    for cell in sorted(set(a.results) | set(b.results), key=lambda c: (int(c.split()[0]), c)):
        x, y = a.results.get(cell), b.results.get(cell)
        delta = f"{(y - x) / x * 100:+.2f}%" if x and y is not None else "—"
        rows.append([cell, "—" if x is None else f"{x:.2f}", "—" if y is None else f"{y:.2f}", delta])
    out.append(tabulate(rows, headers=["cell", "A", "B", "B vs A"], tablefmt="github", disable_numparse=True)
               if rows else "(no results)")
    return "\n".join(out) + "\n"


def diff(a: str, b: str) -> str:
    """``repro diff``: markdown comparing two runs, or a run and a target's publication."""
    with side(a) as sa, side(b) as sb:
        return diff_sides(sa, sb)
