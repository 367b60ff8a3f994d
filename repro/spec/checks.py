"""What a manifest's schema cannot say, checked on its document: placeholders, cross-field rules, paths.

Each check takes the validated document and returns its problems. The checks that need the manifest's
model (its cells) or the parser registry stay in :mod:`repro.spec.manifest`, which runs them all.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro import paths
from repro.errors import Problem
from repro.spec.datasets import FORMATS
from repro.spec.schema import YamlDoc

#: Placeholders a launch command may use; each is filled per cell and node.
PLACEHOLDERS = {
    "batch_size": "per-GPU batch size of the cell",
    "global_batch_size": "batch_size x total GPUs",
    "node_batch_size": "batch_size x gpus_per_node (the batch of one node's GPUs together)",
    "gpus_per_node": "GPUs used on each node",
    "gpus": "total GPUs of the cell (nodes x gpus_per_node)",
    "gpu_list": "0,1,...,gpus_per_node-1",
    "nnodes": "number of nodes of the cell",
    "node_rank": "this node's rank, 0 on the master",
    "node_addr": "this node's own address (its entry of hosts)",
    "master_addr": "address of the rank-0 node",
    "master_port": "launch.master_port",
    "hosts": "comma-separated node addresses, rank order",
    "host_ports": "comma-separated address:master_port of every node, rank order",
    "worker_hosts": "comma-separated address:master_port of every node (TensorFlow worker tasks)",
    "ps_hosts": "comma-separated address:master_port+1 of the nodes that run a parameter server "
                "(launch.parameter_servers; by default every node)",
    "job_name": "ps or worker (launch kind tf-ps renders the command once as each); worker elsewhere",
    "task_index": "the task's index in its job: a worker's is the node's rank, a parameter server's its "
                  "place in ps_hosts",
    "precision": "the cell's precision name",
    "precision_args": "the tokens of launch.precision_args[precision], spliced in place",
    "cell_args": "the tokens of every launch.cell_args entry matching the cell, spliced in place",
}
#: Most runs (cells x repeats) one manifest may ask for.
MAX_RUNS = 10_000
#: Placeholders that expand to several tokens and so must stand alone as one token.
SPLICED = ("precision_args", "cell_args")


def placeholders(token: str) -> list[str] | None:
    """Placeholder names in a token; None when its braces do not balance. A format spec or
    conversion (``{batch_size:>9}``, ``{x!r}``) comes back as the whole field, an unknown name."""
    try:
        return [name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") if (spec or conv) else name
                for _, name, spec, conv in string.Formatter().parse(token) if name is not None]
    except ValueError:
        return None


def check_tokens(doc: YamlDoc, where: list[str | int], tokens: list[str], *,
                 spliced_ok: bool) -> tuple[set[str], list[Problem]]:
    """The placeholders ``tokens`` use, and the problems of their braces and names."""
    used: set[str] = set()
    out: list[Problem] = []
    for i, tok in enumerate(tokens):
        names = placeholders(tok)
        if names is None:
            out.append(doc.problem([*where, i], f"unbalanced brace in {tok!r}",
                                   "placeholders are {name}; write a literal brace as {{ or }}"))
            continue
        for name in names:
            used.add(name)
            if name not in PLACEHOLDERS and name.split("!")[0].split(":")[0] in PLACEHOLDERS:
                out.append(doc.problem([*where, i],
                                       f"placeholder {{{name}}} in {tok!r} has a format spec or conversion",
                                       "placeholders are plain {name}; "
                                       "write the value as you want it around it"))
            elif name not in PLACEHOLDERS:
                out.append(doc.problem([*where, i], f"unknown placeholder {{{name}}} in {tok!r}",
                                       "known placeholders: "
                                       f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}; "
                                       "a literal brace is written {{ or }}"))
            elif name in SPLICED and not spliced_ok:
                out.append(doc.problem([*where, i], f"{{{name}}} cannot be used inside {where[-1]}"))
            elif name in SPLICED and tok != f"{{{name}}}":
                out.append(doc.problem([*where, i], f"{{{name}}} must be a whole token",
                                       "write it as its own list item; it expands to several tokens"))
    return used, out


def check_launch(doc: YamlDoc) -> list[Problem]:
    """The placeholders of launch.command, precision_args and cell_args, and those the launcher needs."""
    launch, matrix = doc.data["launch"], doc.data["matrix"]
    used, out = check_tokens(doc, ["launch", "command"], launch["command"], spliced_ok=True)
    for prec, toks in launch.get("precision_args", {}).items():
        out += check_tokens(doc, ["launch", "precision_args", prec], toks, spliced_ok=False)[1]
    for ci, entry in enumerate(launch.get("cell_args", [])):
        out += check_tokens(doc, ["launch", "cell_args", ci, "args"], entry.get("args", []),
                            spliced_ok=False)[1]
    if "precision_args" in used:
        out += [doc.problem(["launch", "precision_args"], f"no tokens for matrix precision {p!r}",
                            f"add `{p}: [...]` (an empty list is fine)")
                for p in matrix["precision"] if p not in launch.get("precision_args", {})]
    needs = {"torch": ("node_rank", "master_addr"), "paddle": ("hosts",)}.get(launch["kind"], ())
    if max(matrix["nodes"]) > 1:
        out += [doc.problem(["launch", "command"],
                            f"launcher {launch['kind']!r} on several nodes needs {{{name}}}",
                            f"pass {{{name}}} to the framework's launcher so each node knows its place")
                for name in needs if name not in used]
    return out


def check_rdma(doc: YamlDoc) -> list[Problem]:
    """An RDMA strategy that installs into the image needs an image the kit builds, for mlnx-ofed of a known
    OS."""
    d = doc.data
    strategy = d.get("rdma", {}).get("strategy")
    if strategy in ("mlnx-ofed", "inbox") and "registry" in d["image"]:
        return [doc.problem(["rdma", "strategy"],
                            f"strategy {strategy} installs into an image the kit builds, "
                            "but image.registry is used as pulled",
                            "use strategy image, or build it (image.build)")]
    if strategy == "mlnx-ofed" and not d["image"]["build"]["base"].get("os"):
        return [doc.problem(["rdma", "strategy"], "strategy mlnx-ofed needs the base image's OS",
                            "declare it as image.build.base.os, e.g. ubuntu18.04 "
                            "(the bundle is built for it)")]
    return []


def check_size(doc: YamlDoc) -> list[Problem]:
    """At most MAX_RUNS runs (cells x repeats); the checks that go through the cells come after this one."""
    matrix = doc.data["matrix"]
    n_runs = (len(matrix["nodes"]) * len(matrix["gpus_per_node"]) * len(matrix["precision"])
              * len(matrix["batch_size"]) * matrix.get("repeats", 1))
    if n_runs <= MAX_RUNS:
        return []
    return [doc.problem(["matrix"], f"{n_runs} runs (cells x repeats), over the limit of {MAX_RUNS}",
                        "split the target into several manifests")]


def check_mounts(doc: YamlDoc) -> list[Problem]:
    """Each launch.container.mounts entry can be written as a Docker bind spec from an absolute host path."""
    out: list[Problem] = []
    for mi, mount in enumerate(doc.data["launch"].get("container", {}).get("mounts", [])):
        where = ["launch", "container", "mounts", mi]
        out += [doc.problem([*where, key], f"{mount[key]!r} contains {c!r}",
                            "bind specs are SOURCE:TARGET[:MODE], pyxis and Apptainer join them with ','; "
                            "a path with ':' or ',' cannot be mounted")
                for key in ("source", "target") for c in ":," if c in mount[key] and mount[key] != "{data}"]
        if mount["source"] != "{data}" and not mount["source"].startswith("/"):
            out.append(doc.problem([*where, "source"],
                                   f"{mount['source']!r} is neither an absolute host path nor {{data}}"))
    return out


def _excluded(matrix: Mapping[str, Any], n: int, g: int, p: str, b: int) -> bool:
    values = {"nodes": n, "gpus_per_node": g, "gpus": n * g, "precision": p, "batch_size": b}
    return any(all(values.get(k) == v for k, v in x.items()) for x in matrix.get("exclude", []))


def check_published(doc: YamlDoc) -> list[Problem]:
    """The matrix runs a cell; each published table's id is its own, its tolerance a number, its log
    directory there, and each of its cells one the matrix runs, published once, with its logs."""
    matrix = doc.data["matrix"]
    matrix_cells = {(n, g, p, b) for n in matrix["nodes"] for g in matrix["gpus_per_node"]
                    for p in matrix["precision"] for b in matrix["batch_size"]}
    runs = {c for c in matrix_cells if not _excluded(matrix, *c)}
    out: list[Problem] = [] if runs else [doc.problem(["matrix", "exclude"], "excludes every cell of the "
                                                      "matrix", "the matrix must run at least one cell")]
    ids: dict[str, int] = {}
    for ti, table in enumerate(doc.data.get("published", [])):
        out += _check_table(doc, ti, table, ids)
        logs_dir, problems = _logs_dir(doc, ti, table)
        out += problems
        seen: dict[tuple[Any, ...], int] = {}
        for ci, cell in enumerate(table["cells"]):
            where: list[str | int] = ["published", ti, "cells", ci]
            key = (cell["nodes"], cell["gpus"], cell["precision"], cell["batch_size"])
            if key in seen:
                out.append(doc.problem(where, f"the same cell as published[{ti}].cells[{seen[key]}]",
                                       "publish each cell of a table once"))
            seen.setdefault(key, ci)
            out += _finite(doc, [*where, "tolerance_pct"], cell.get("tolerance_pct", 0))
            out += _check_published_cell(doc, where, cell, matrix_cells, runs)
            out += _check_cell_logs(doc, where, cell, table, logs_dir)
    return out


def _check_table(doc: YamlDoc, ti: int, table: Mapping[str, Any], ids: dict[str, int]) -> list[Problem]:
    """A published table's id is no other table's; its tolerance a finite number."""
    out = []
    if table["id"] in ids:
        out.append(doc.problem(["published", ti, "id"],
                               f"{table['id']!r} is the id of published[{ids[table['id']]}] too",
                               "give each published table an id of its own"))
    ids.setdefault(table["id"], ti)
    unit = doc.data.get("measure", {}).get("unit", "images/s")
    if table.get("unit", unit) != unit:
        out.append(doc.problem(["published", ti, "unit"],
                               f"{table['unit']!r} is not the target's unit {unit!r} (measure.unit)",
                               f"set measure.unit to {table['unit']!r}, or cite a table in {unit}"))
    return out + _finite(doc, ["published", ti, "tolerance_pct"], table.get("tolerance_pct", 0))


def _finite(doc: YamlDoc, where: list[str | int], tolerance: float) -> list[Problem]:
    """A tolerance is a finite number (.nan passes every bound of the schema, and matches nothing)."""
    return [] if math.isfinite(tolerance) else [doc.problem(where, f"{tolerance} is not a finite number",
                                                            "give the tolerance in percent, e.g. 3")]


def _logs_dir(doc: YamlDoc, ti: int, table: Mapping[str, Any]) -> tuple[Path | None, list[Problem]]:
    """A published table's log directory, None where it names none or a wrong one (then with its problem)."""
    if "logs" not in table:
        return None, []
    logs_dir = paths.data_root() / table["logs"]
    if not logs_dir.resolve().is_relative_to((paths.data_root() / "logs" / "published").resolve()):
        return None, [doc.problem(["published", ti, "logs"], f"{table['logs']!r} leaves logs/published/",
                                  "published logs live under logs/published/<source>@<commit>/")]
    if not logs_dir.is_dir():
        return None, [doc.problem(["published", ti, "logs"], f"no such directory {table['logs']!r}",
                                  "published logs live under logs/published/<source>@<commit>/")]
    return logs_dir, []


def _check_published_cell(doc: YamlDoc, where: list[str | int], cell: Mapping[str, Any],
                          matrix_cells: set[tuple[Any, ...]], runs: set[tuple[Any, ...]]) -> list[Problem]:
    if cell["gpus"] % cell["nodes"]:
        return [doc.problem(where + ["gpus"], f"{cell['gpus']} GPUs do not split over {cell['nodes']} nodes")]
    key = (cell["nodes"], cell["gpus"] // cell["nodes"], cell["precision"], cell["batch_size"])
    named = (f"{cell['nodes']} node(s) x {cell['gpus'] // cell['nodes']} GPU(s), {cell['precision']}, "
             f"batch {cell['batch_size']}")
    if key not in matrix_cells:
        return [doc.problem(where, f"{named} is not a cell of the matrix",
                            "a published cell must be one the matrix can run; extend matrix or fix the cell")]
    if key not in runs:
        return [doc.problem(where, f"{named} is a cell matrix.exclude removes",
                            "a published cell must be one the matrix runs; narrow matrix.exclude")]
    return []


def _check_cell_logs(doc: YamlDoc, where: list[str | int], cell: Mapping[str, Any], table: Mapping[str, Any],
                     logs_dir: Path | None) -> list[Problem]:
    out: list[Problem] = []
    for li, rel in enumerate(cell.get("logs", [cell["log"]] if "log" in cell else [])):
        if logs_dir is None and "logs" not in table:
            out.append(doc.problem(where, "a cell names a log but its table has no 'logs' directory"))
        elif logs_dir is not None:
            field_ = where + (["logs", li] if "logs" in cell else ["log"])
            if not (logs_dir / rel).resolve().is_relative_to(logs_dir.resolve()):
                out.append(doc.problem(field_, f"log {rel!r} leaves its table's directory {table['logs']}",
                                       "name a file under that directory"))
            elif not (logs_dir / rel).is_file():
                out.append(doc.problem(field_, f"no such log {rel!r} under {table['logs']}"))
    return out


def summary_metrics(d: Mapping[str, Any]) -> list[tuple[list[str | int], str]]:
    """Each protocol's summary_metric (measure's, its overrides', published cells'), with where it stands."""
    m = d["measure"]
    found: list[tuple[list[str | int], Mapping[str, Any]]] = [(["measure", "protocol"], m["protocol"])]
    found += [(["measure", "overrides", i, "protocol"], o["protocol"])
              for i, o in enumerate(m.get("overrides", []))]
    found += [(["published", ti, "cells", ci, "protocol"], c["protocol"])
              for ti, table in enumerate(d.get("published", []))
              for ci, c in enumerate(table["cells"]) if "protocol" in c]
    return [(where, p["summary_metric"]) for where, p in found if "summary_metric" in p]


def find_run(tokens: list[str], run: list[str]) -> list[int]:
    """Where the token run ``run`` starts in ``tokens``."""
    return [i for i in range(len(tokens) - len(run) + 1) if tokens[i:i + len(run)] == run]


def data_mount(mount: Mapping[str, Any]) -> bool:
    """Whether a launch.container.mounts entry mounts the dataset."""
    return mount.get("source") == "{data}"


def check_dataset(doc: YamlDoc) -> list[Problem]:
    """A dataset is named exactly when it is mounted; each synthetic replacement finds its tokens once."""
    d = doc.data
    mounts = d["launch"].get("container", {}).get("mounts", [])
    mounted = [i for i, m in enumerate(mounts) if data_mount(m)]
    out: list[Problem] = []
    if mounted and "dataset" not in d:
        out.append(doc.problem(["launch", "container", "mounts", mounted[0]],
                               "mounts the dataset ({data}) but the manifest names no dataset format",
                               f"add `dataset: {{format: F}}`, F one of {', '.join(FORMATS)}"))
    if "dataset" in d and not mounted:
        out.append(doc.problem(["dataset"],
                               "a dataset format is named but no launch.container.mounts entry has "
                               "source {data}",
                               "mount it: {source: \"{data}\", target: /where/the/workload/reads}"))
    command = list(d["launch"]["command"])
    for i, r in enumerate(d.get("dataset", {}).get("synthetic", {}).get("replace", [])):
        found = len(find_run(command, r["old"]))
        if found != 1:
            out.append(doc.problem(["dataset", "synthetic", "replace", i, "old"],
                                   f"{r['old']} occurs {found} times in launch.command; it must occur "
                                   "exactly once",
                                   "give a run of launch.command tokens that appears once"))
    return out
