"""Manifests: load, validate (schema + meaning), and expose as frozen dataclasses.

One manifest is one reproduction target, fully pinned: what runs (image, source
commit, launch command), how its number is measured, and which published table it
must reproduce. Everything a reader of the results needs is in the file; nothing
that changes a number comes from the environment.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import paths
from repro.errors import InputError, Problem, UsageError
from repro.spec import checks
from repro.spec.schema import YamlDoc, read_yaml, validate

#: The first note of a target's synthetic-data variant begins so.
SYNTHETIC_NOTE = "Synthetic data (--synthetic)"


@dataclass(frozen=True)
class Cell:
    """One point of the matrix: where and how one measurement runs."""

    nodes: int
    gpus_per_node: int
    precision: str
    batch_size: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def key(self) -> str:
        return f"{self.nodes}n{self.gpus_per_node}g-{self.precision}-bs{self.batch_size}"

    def matches(self, flt: Mapping[str, Any]) -> bool:
        values = {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "gpus": self.gpus,
                  "precision": self.precision, "batch_size": self.batch_size}
        return all(values[k] == v for k, v in flt.items())


@dataclass(frozen=True)
class PublishedCell:
    nodes: int
    gpus: int
    precision: str
    batch_size: int
    value: str
    tolerance_pct: float
    logs: tuple[Path, ...] = ()
    repeats: tuple[str, ...] = ()
    speedup: str | None = None
    label: str | None = None
    note: str | None = None
    protocol: Mapping[str, Any] = field(default_factory=dict)  # this cell's own, on top of measure's

    @property
    def decimals(self) -> int:
        return len(self.value.partition(".")[2])

    def matches(self, flt: Mapping[str, Any]) -> bool:
        values = {"nodes": self.nodes, "gpus": self.gpus, "gpus_per_node": self.gpus // self.nodes,
                  "precision": self.precision, "batch_size": self.batch_size}
        return all(values[k] == v for k, v in flt.items())


@dataclass(frozen=True)
class PublishedTable:
    id: str
    cite: Mapping[str, str]
    unit: str
    tolerance_pct: float
    cells: tuple[PublishedCell, ...]
    column: str | None = None
    logs_dir: Path | None = None
    run_tolerance: Mapping[str, Any] | None = None  # a new run's tolerance: {pct, reason}
    logs_from: str | None = None  # where the logs of cells without a bundled one come from


@dataclass(frozen=True)
class Measure:
    parser: str
    protocol: Mapping[str, Any]
    overrides: tuple[tuple[Mapping[str, Any], Mapping[str, Any]], ...] = ()
    repeats: Mapping[str, Any] = field(default_factory=dict)
    speedup: Mapping[str, Any] | None = None

    def protocol_for(self, cell: Cell | PublishedCell) -> dict[str, Any]:
        """The protocol for one cell: the default, then every matching override on top, then a published
        cell's own."""
        merged = dict(self.protocol)
        for when, proto in self.overrides:
            if cell.matches(when):
                merged.update(proto)
        merged.update(getattr(cell, "protocol", {}))
        return merged


@dataclass(frozen=True)
class Launch:
    kind: str
    command: tuple[str, ...]
    precision_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cell_args: tuple[tuple[Mapping[str, Any], tuple[str, ...]], ...] = ()
    cell_env: tuple[tuple[Mapping[str, Any], Mapping[str, str]], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    master_port: int = 29500
    timeout_s: int = 3600
    mpi: Mapping[str, Any] = field(default_factory=dict)
    container: Mapping[str, Any] = field(default_factory=dict)
    parameter_servers: tuple[tuple[Mapping[str, Any], tuple[int, ...]], ...] = ()
    cpu_binding: Mapping[str, Any] = field(default_factory=dict)  # the publisher's (``bind``, ``by_gpus``)

    def ps_ranks(self, cell: Cell) -> tuple[int, ...]:
        """The ranks of the nodes that run a TensorFlow parameter server in this cell, in ps task order:
        the matching launch.parameter_servers entry's, else every node."""
        return next((ranks for when, ranks in self.parameter_servers if cell.matches(when)),
                    tuple(range(cell.nodes)))

    def env_for(self, cell: Cell, site: Mapping[str, str] | None = None) -> dict[str, str]:
        """One cell's env: the manifest's, every matching cell_args entry's, then the site's (hosts file)."""
        env = dict(self.env)
        for when, extra in self.cell_env:
            if cell.matches(when):
                env.update(extra)
        env.update(site or {})
        return env


@dataclass(frozen=True)
class Rdma:
    """How the image reaches InfiniBand: ``strategy`` is image, mlnx-ofed or inbox (see the schema)."""

    strategy: str
    version: str | None = None
    sha256: str = ""
    flags: tuple[str, ...] = ()
    url: str | None = None


@dataclass(frozen=True)
class Manifest:
    id: str
    title: str
    framework: str
    model: str
    path: Path
    sha256: str
    data: Mapping[str, Any]
    image: Mapping[str, Any]
    launch: Launch
    matrix: Mapping[str, Any]
    measure: Measure
    published: tuple[PublishedTable, ...]
    source: Mapping[str, Any] | None = None
    expect: Mapping[str, Any] = field(default_factory=dict)
    #: (cell filter, what differs from expect) where the publication ran those cells on other machines
    expect_where: tuple[tuple[Mapping[str, Any], Mapping[str, Any]], ...] = ()
    notes: tuple[str, ...] = ()
    rdma: Rdma | None = None
    dataset: Mapping[str, Any] | None = None

    @property
    def dataset_format(self) -> str | None:
        """The dataset format the workload reads; None when it reads none (synthetic data)."""
        return self.dataset["format"] if self.dataset else None

    @property
    def synthetic_data(self) -> str | None:
        """What the synthetic-data variant of a target (``synthetic``) says about its data."""
        return next((n for n in self.notes if n.startswith(SYNTHETIC_NOTE)), None)

    @property
    def unit(self) -> str:
        """What this target's throughput counts (``measure.unit``): images/s unless the manifest says."""
        return str(self.data["measure"].get("unit", "images/s"))

    @property
    def repeats(self) -> int:
        return int(self.matrix.get("repeats", 1))

    @property
    def image_reference(self) -> str:
        """What every node runs: ``repo:tag@sha256:...`` when pinned, the build tag for built images."""
        if "registry" in self.image:
            ref, digest = self.image["registry"]["ref"], self.image["registry"]["digest"]
            return f"{ref}@{digest}" if digest else ref
        return str(self.image["build"]["tag"])

    @property
    def device(self) -> str:
        """What a cell's ranks are counted in: GPUs, or workers for the CPU check targets (no publication, no
        GPU model expected)."""
        return "GPU" if self.published or "gpu_model" in self.expect else "worker"

    def expect_for(self, cells: Iterable[Cell]) -> dict[str, Any]:
        """What the publication's machines were for these cells: ``expect``, with each ``expect_where`` entry
        that selects every one of them put over it (in the manifest's order); cells the publication ran on
        different machines are held against ``expect`` itself."""
        cells = list(cells)
        chosen = [d for when, d in self.expect_where if cells and all(c.matches(when) for c in cells)]
        return dict(self.expect) | {k: v for d in chosen for k, v in d.items()}

    @property
    def rdma_strategy(self) -> str | None:
        """How the target's containers reach the HCAs (``rdma.strategy``: ``image``, ``mlnx-ofed`` or
        ``inbox``), or None when it uses no RDMA."""
        return self.rdma.strategy if self.rdma is not None else None

    @property
    def mofed_version(self) -> str | None:
        """The MLNX_OFED version a ``mlnx-ofed`` target installs into its image."""
        return self.rdma.version if self.rdma is not None else None

    @property
    def retries(self) -> int:
        return int(self.matrix.get("retries", 0))

    def cells(self) -> list[Cell]:
        """The matrix expanded in run order (fewest nodes first), excludes removed."""
        return expand_matrix(self.matrix)

    def select(self, filters: Sequence[Mapping[str, Any]] = ()) -> list[Cell]:
        """The cells that match any of ``filters`` (``--cells``), in run order; all of them without one."""
        return [c for c in self.cells() if not filters or any(c.matches(f) for f in filters)]

    def table(self, table_id: str | None = None) -> PublishedTable:
        if not self.published:
            raise UsageError(f"{self.id} reproduces no published table; it only measures",
                             hint="`repro up` prints its measured table")
        if table_id is None:
            return self.published[0]
        for t in self.published:
            if t.id == table_id:
                return t
        raise UsageError(f"{self.id}: no published table {table_id!r}; it has: "
                         f"{', '.join(t.id for t in self.published)}")


def expand_matrix(m: Mapping[str, Any]) -> list[Cell]:
    """A matrix expanded in run order (fewest nodes first), excludes removed."""
    out = [Cell(n, g, p, b) for n, g, p, b in itertools.product(
        sorted(m["nodes"]), sorted(m["gpus_per_node"]), m["precision"], m["batch_size"])]
    return [c for c in out if not any(c.matches(x) for x in m.get("exclude", []))]


def canonical_sha256(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_manifest(path: Path) -> Manifest:
    """Read, validate and build one manifest; raises InputError with every problem found."""
    doc = read_yaml(path)
    problems = validate(doc, "manifest.v1")
    if not problems:
        problems = _check_meaning(doc) + checks.check_dataset(doc)
    if problems:
        raise InputError(problems)
    return _build(doc)


def _check_meaning(doc: YamlDoc) -> list[Problem]:
    """What a schema cannot say: placeholders, plugin names, files, cross-field rules. The checks that go
    through the matrix's cells run only on a matrix of at most MAX_RUNS runs."""
    out = checks.check_launch(doc) + checks.check_rdma(doc) + _check_parser(doc)
    if too_big := checks.check_size(doc):
        return out + too_big
    return out + _check_parameter_servers(doc) + checks.check_mounts(doc) + checks.check_published(doc)


def _check_parser(doc: YamlDoc) -> list[Problem]:
    """measure.parser names a parser of the registry, and each protocol's summary_metric a figure it reads."""
    from repro.measure.parsers import PARSERS  # lazy: parsers import nothing from here

    if (name := doc.data["measure"]["parser"]) not in PARSERS.names():
        return [doc.problem(["measure", "parser"], f"unknown parser {name!r}",
                            f"available parsers: {', '.join(PARSERS.names())}")]
    known = PARSERS.get(name).summary_names
    hint = f"it reads: {', '.join(known)}" if known else "it reads no summary figure by name"
    return [doc.problem([*where, "summary_metric"], f"parser {name} reads no printed summary {metric!r}",
                        hint) for where, metric in checks.summary_metrics(doc.data) if metric not in known]


def _check_parameter_servers(doc: YamlDoc) -> list[Problem]:
    """launch.parameter_servers: tf-ps only; each entry places the ps of some cells, each cell at most
    once."""
    launch = doc.data["launch"]
    entries = launch.get("parameter_servers", [])
    if entries and launch["kind"] != "tf-ps":
        return [doc.problem(["launch", "parameter_servers"],
                            f"launch kind {launch['kind']!r} runs no parameter servers",
                            "only launch kind tf-ps places parameter servers; "
                            "remove the field or use kind tf-ps")]
    out: list[Problem] = []
    cells = expand_matrix(doc.data["matrix"])
    placed: dict[Cell, int] = {}
    for i, entry in enumerate(entries):
        where = ["launch", "parameter_servers", i]
        matched = [c for c in cells if c.matches(entry["when"])]
        if not matched:
            when = ", ".join(f"{k}: {v}" for k, v in entry["when"].items())
            out.append(doc.problem([*where, "when"], f"{{{when}}} matches no cell of the matrix",
                                   "name the cells whose parameter servers this entry places, e.g. when: "
                                   "{nodes: 8}"))
        for c in matched:
            if c in placed:
                out.append(doc.problem([*where, "when"],
                                       f"cell {c.key} is placed by entry {placed[c]} as well",
                                       "a cell has one placement: make the entries' 'when' match apart"))
                break
            placed[c] = i
        for j, rank in enumerate(entry["ranks"]):
            small = next((c for c in matched if rank >= c.nodes), None)
            if small is not None:
                out.append(doc.problem([*where, "ranks", j],
                                       f"rank {rank}, but cell {small.key} has {small.nodes} "
                                       f"node(s): its highest rank is {small.nodes - 1}",
                                       "a parameter server runs on one of the cell's nodes, by rank"))
    return out


def _build(doc: YamlDoc) -> Manifest:
    d = doc.data
    L = d["launch"]
    launch = Launch(
        kind=L["kind"], command=tuple(L["command"]),
        precision_args={k: tuple(v) for k, v in L.get("precision_args", {}).items()},
        cell_args=tuple((dict(c["when"]), tuple(c["args"])) for c in L.get("cell_args", []) if "args" in c),
        cell_env=tuple((dict(c["when"]), dict(c["env"])) for c in L.get("cell_args", []) if "env" in c),
        env=dict(L.get("env", {})), workdir=L.get("workdir"), master_port=L.get("master_port", 29500),
        timeout_s=L.get("timeout_s", 3600), mpi=dict(L.get("mpi", {})),
        container=dict(L.get("container", {})),
        parameter_servers=tuple((dict(e["when"]), tuple(e["ranks"])) for e in L.get("parameter_servers", [])),
        cpu_binding=dict(L.get("cpu_binding", {})),
    )
    M = d["measure"]
    measure = Measure(
        parser=M["parser"], protocol=dict(M["protocol"]),
        overrides=tuple((dict(o["when"]), dict(o["protocol"])) for o in M.get("overrides", [])),
        repeats=dict(M.get("repeats", {})), speedup=M.get("speedup"),
    )
    tables = []
    for t in d.get("published", []):
        logs_dir = paths.data_root() / t["logs"] if "logs" in t else None
        cells = tuple(
            PublishedCell(
                nodes=c["nodes"], gpus=c["gpus"], precision=c["precision"], batch_size=c["batch_size"],
                value=c["value"], tolerance_pct=c.get("tolerance_pct", t["tolerance_pct"]),
                logs=(tuple(logs_dir / p for p in c.get("logs", [c["log"]] if "log" in c else []))
                      if logs_dir else ()),
                repeats=tuple(c.get("repeats", ())), speedup=c.get("speedup"), label=c.get("label"),
                note=c.get("note"), protocol=dict(c.get("protocol", {})),
            )
            for c in t["cells"]
        )
        tables.append(PublishedTable(id=t["id"], cite=t["cite"], unit=t["unit"],
                                     tolerance_pct=t["tolerance_pct"],
                                     cells=cells, column=t.get("column"), logs_dir=logs_dir,
                                     run_tolerance=t.get("run_tolerance"), logs_from=t.get("logs_from")))
    return Manifest(
        id=d["id"], title=d["title"], framework=d["framework"], model=d["model"], path=doc.path,
        sha256=canonical_sha256(d), data=d, image=d["image"], launch=launch, matrix=d["matrix"],
        measure=measure, published=tuple(tables), source=d.get("source"), expect=d.get("expect", {}),
        expect_where=tuple((e["when"], e["expect"]) for e in d.get("expect_where", ())),
        notes=tuple(d.get("notes", ())), dataset=d.get("dataset"),
        rdma=Rdma(**{**d["rdma"], "flags": tuple(d["rdma"].get("flags", ()))}) if "rdma" in d else None,
    )


def synthetic(manifest: Manifest) -> Manifest:
    """The target on synthetic data, as its manifest declares: command tokens replaced, no dataset mount.

    The variant's document (what a run directory records) says so in its first note.
    """
    spec = (manifest.dataset or {}).get("synthetic")
    if spec is None:
        why = f"it reads {manifest.dataset_format}" if manifest.dataset else "it reads no dataset"
        raise UsageError(f"{manifest.id} declares no synthetic-data run ({why})",
                         hint="run it without --synthetic" if not manifest.dataset else
                         f"give the hosts file `data: {{{manifest.dataset_format}: /path}}`, or declare "
                         "dataset.synthetic in the manifest")
    doc = json.loads(json.dumps(manifest.data))
    command = doc["launch"]["command"]
    for r in spec["replace"]:
        (i,) = checks.find_run(command, r["old"])
        command[i:i + len(r["old"])] = r["new"]
    container = doc["launch"].get("container", {})
    container["mounts"] = [m for m in container.get("mounts", []) if not checks.data_mount(m)]
    if not container["mounts"]:
        del container["mounts"]
    del doc["dataset"]
    doc["notes"] = [f"{SYNTHETIC_NOTE}, not the publication's {manifest.dataset_format}: {spec['why']}",
                    *doc.get("notes", [])]
    return _build(YamlDoc(manifest.path, None, doc))


def manifest_files(dirs: Iterable[Path] | None = None) -> list[Path]:
    dirs = list(dirs) if dirs else [paths.manifests_dir()]
    return sorted(p for d in dirs for p in d.glob("*.yaml"))


def load_catalog(files: Iterable[Path]) -> dict[str, Manifest]:
    """Load many manifests; all problems of all files are reported together, duplicate ids too."""
    catalog: dict[str, Manifest] = {}
    problems: list[Problem] = []
    for f in files:
        try:
            m = load_manifest(f)
        except InputError as e:
            problems.extend(e.problems)
            continue
        if m.id in catalog:
            problems.append(Problem(str(f), read_yaml(f).line(["id"]), "id",
                                    f"duplicate target id {m.id!r} (also in {catalog[m.id].path})",
                                    "target ids must be unique; rename one"))
        else:
            catalog[m.id] = m
    if problems:
        raise InputError(problems)
    return catalog


def find_target(name: str, dirs: Iterable[Path] | None = None) -> Manifest:
    """A target by id (from the manifest directories) or by path to a manifest file."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        return load_manifest(p)
    files = manifest_files(dirs)
    for f in files:
        if f.stem == name:
            m = load_manifest(f)
            if m.id == name:
                return m
    catalog = load_catalog(files)
    if name in catalog:
        return catalog[name]
    prefixed = [t for t in sorted(catalog) if t.startswith(name)]
    close = list(dict.fromkeys(prefixed
                               + difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.5)))[:3]
    raise UsageError(f"unknown target {name!r}",
                     hint="`repro list` shows the targets" + (f"; did you mean {', '.join(close)}?"
                                                              if close else ""))


def _is_hosts_file(doc: YamlDoc) -> bool:
    """What ``validate`` reads as an inventory: any of an inventory's own keys (a Slurm one may hold only
    ``scheduler``), and no manifest's ``id``; ``plan`` and ``up`` read the same file with the same checks."""
    return isinstance(doc.data, dict) and "id" not in doc.data and bool(_hosts_keys() & set(doc.data))


def _hosts_keys() -> set[str]:
    from repro.spec.schema import load_schema

    return set(load_schema("hosts.v1")["properties"]) - {"schema_version"}


def validate_files(inputs: list[Path]) -> list[tuple[Path, str]]:
    """Validate manifests and hosts files (directories: their *.yaml); every problem of every file at once."""
    from repro.spec.hosts import load_hosts

    files = [f for p in (inputs or [paths.manifests_dir()])
             for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])]
    empty = [p for p in (inputs or [paths.manifests_dir()]) if p.is_dir() and not any(p.glob("*.yaml"))]
    if empty:
        raise InputError([Problem(str(p), None, "", "no *.yaml file in this directory",
                                  "give manifest or hosts files, or a directory holding them")
                          for p in empty])
    problems: list[Problem] = []
    manifests: list[Path] = []
    ok: list[tuple[Path, str]] = []
    for f in files:
        try:
            if _is_hosts_file(read_yaml(f)):
                load_hosts(f)
                ok.append((f, "hosts"))
            else:
                manifests.append(f)
        except InputError as e:
            problems += e.problems
    try:
        catalog = load_catalog(manifests)
    except InputError as e:
        problems += e.problems
        catalog = {}
    if problems:
        raise InputError(problems)
    return [(m.path, m.id) for m in catalog.values()] + ok


