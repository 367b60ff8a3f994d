"""Every figure of DLPerf's ResNet-50 tables against the kit's citations: none missing, none different.

The snapshots under tests/data/dlperf/ are the headings and table lines of DLPerf's files at
c89430bac64f64caabb0445ff7eb80175641454c (SOURCES.md there says which file each one is). ``FRAMEWORKS``
is the data: a summary row of DLPerf's README (the "ResNet50-V1.5 Training Performance" table) and the
per-framework files whose tables it comes from, each table with the target that cites it, or the reason
it is not a target. A framework is added by adding its entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from repro.spec.manifest import Manifest, PublishedTable, find_target

DATA = Path(__file__).resolve().parent / "data" / "dlperf"
COMMIT = "c89430bac64f64caabb0445ff7eb80175641454c"
SUMMARY = "README.rn50.md"  # README.md's ResNet-50 section


@dataclass(frozen=True)
class Table:
    """One table of a per-framework file: the target citing it, the precision and the batch per GPU (None:
    each row's own batch_size_per_device column)."""

    target: str
    precision: str
    batch_size: int | None = None


@dataclass(frozen=True)
class Excluded:
    """A table of a per-framework file that no target cites, and why."""

    why: str


@dataclass(frozen=True)
class Source:
    snapshot: str  # under tests/data/dlperf/
    path: str  # in DLPerf at COMMIT
    tables: tuple[Table | Excluded, ...]  # in the file's order


@dataclass(frozen=True)
class Framework:
    targets: tuple[str, ...]  # the targets whose README.md tables cite this summary row
    sources: tuple[Source, ...]
    amp_batch: int = 256  # the summary's AMP column is bsz=256 unless a footnote says otherwise
    amp_precision: str = "amp"  # the precision of the summary's AMP figures in the kit
    xla: str | None = None  # the target of the figures the summary marks w/XLA


TF1 = "NVIDIADeepLearningExamples/TensorFlow/Classification/ConvNets/resnet50v1.5/README.md"
TF1_SYNTHETIC = ("the real versus synthetic data comparison of 2020-12 (1 node only, XLA, logs-1210-*.zip), "
                 "a study beside the report's tables, not a row of the summary")

#: summary row name (the link text of its first cell) -> what cites it
FRAMEWORKS: dict[str, Framework] = {
    "OneFlow": Framework(
        targets=("dlperf-oneflow-rn50-v100",),
        sources=(Source("oneflow-resnet50_oneflow_v0.2_report_1009.md",
                        "OneFlow/Classification/ConvNets/resnet50v1.5/reports/resnet50_oneflow_v0.2_report_1009.md",
                        (Table("dlperf-oneflow-rn50-v100", "amp"), Table("dlperf-oneflow-rn50-v100", "fp32"))),),
    ),
    "NGC TensorFlow 1.x": Framework(
        targets=("dlperf-ngc-tf1-rn50-v100", "dlperf-ngc-tf1-rn50-v100-xla"),
        sources=(Source("ngc-tf1-README.md", TF1, (
            Table("dlperf-ngc-tf1-rn50-v100", "fp32", 128),
            Table("dlperf-ngc-tf1-rn50-v100", "amp", 224),
            Table("dlperf-ngc-tf1-rn50-v100-xla", "amp", 224),
            Excluded(TF1_SYNTHETIC), Excluded(TF1_SYNTHETIC), Excluded(TF1_SYNTHETIC))),),
        amp_batch=224,  # footnote [1]: bsz = 256 ran out of memory
        xla="dlperf-ngc-tf1-rn50-v100-xla",
    ),
    "NGC MXNet": Framework(
        targets=("dlperf-ngc-mxnet-rn50-v100",),
        sources=(Source("ngc-mxnet-README.md", "NVIDIADeepLearningExamples/MxNet/Classification/RN50v1.5/README.md",
                        (Table("dlperf-ngc-mxnet-rn50-v100", "fp32", 128),
                         Table("dlperf-ngc-mxnet-rn50-v100", "amp", 256),
                         Table("dlperf-ngc-mxnet-rn50-v100", "fp16", 256))),),
        amp_precision="fp16",  # the summary's 30713.68 / 22.03 is the README's "without amp" table
    ),
    "MXNet": Framework(
        targets=("dlperf-mxnet-gluoncv-rn50-v100",),
        sources=(Source("mxnet-gluoncv-README.md", "MxNet/Classification/RN50v1b/README.md",
                        (Table("dlperf-mxnet-gluoncv-rn50-v100", "fp32", 128),
                         Table("dlperf-mxnet-gluoncv-rn50-v100", "fp16", 256))),),
        amp_precision="fp16",  # --dtype=float16 casts the network to float16: no AMP
    ),
}

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SUP = re.compile(r"<sup>(.*?)</sup>")


# --- reading the snapshots ----------------------------------------------------------------------------------

def cells_of(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each table of a snapshot: its header cells and its body rows (the separator line dropped)."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[\s:|-]+\|?", lines[i + 1]):
            header, rows = cells_of(lines[i]), []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells_of(lines[i]))
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


@dataclass(frozen=True)
class Figure:
    """One printed figure: where it is and what it says."""

    nodes: int
    gpus: int
    precision: str
    batch_size: int
    value: str
    speedup: str | None
    label: str = ""  # the summary's marker (w/XLA)

    def key(self) -> tuple[int, int, str, int]:
        return (self.nodes, self.gpus, self.precision, self.batch_size)


def per_framework_figures(header: list[str], rows: list[list[str]], table: Table) -> list[Figure]:
    col = {name: i for i, name in enumerate(header)}
    out = []
    for row in rows:
        nodes = int(row[col["num_nodes" if "num_nodes" in col else "node_num"]])
        gpus = (nodes * int(row[col["gpu_num_per_node"]]) if "gpu_num_per_node" in col
                else int(row[col["gpu_num"]]))
        batch = table.batch_size or int(row[col["batch_size_per_device"]])
        value = row[col["throughput" if "throughput" in col else "samples/s"]]
        out.append(Figure(nodes, gpus, table.precision, batch, value, row[col["speedup"]]))
    return out


def summary_rows() -> dict[str, list[str]]:
    ((header, rows),) = markdown_tables((DATA / SUMMARY).read_text(encoding="utf-8"))
    assert header[2].startswith("FP32 throughput") and header[4].startswith("AMP throughput"), header
    return {re.sub(r"<sup>.*?</sup>", "", re.match(r"(?:<sup>.*?</sup>)?\[([^\]]+)\]", row[0]).group(1)): row
            for row in rows}


def summary_figures(row: list[str], fw: Framework) -> list[Figure]:
    """The 4-node 32-GPU figures of a summary row: FP32 bsz 128, AMP at the framework's batch, each with
    its speedup and its marker (w/XLA) where the cell prints two."""
    out = []
    for precision, batch, value_cell, speedup_cell in (("fp32", 128, row[2], row[3]),
                                                        (fw.amp_precision, fw.amp_batch, row[4], row[5])):
        values, speedups = value_cell.split("<br>"), speedup_cell.split("<br>")
        assert len(values) == len(speedups), row
        for v, s in zip(values, speedups):
            label = " ".join(m for m in _SUP.findall(v) if not m.startswith("["))
            (number,) = _NUMBER.findall(_SUP.sub("", re.sub(r"\]\([^)]*\)", "]", v)))
            (speed,) = _NUMBER.findall(_SUP.sub("", s))
            out.append(Figure(4, 32, precision, batch, number, speed, label))
    return out


# --- the kit's citations ----------------------------------------------------------------------------------

def cited(targets: tuple[str, ...], path: str) -> dict[tuple[str, int, int, str, int], tuple[str, str | None]]:
    """Every cell the targets cite from DLPerf's ``path`` at COMMIT, by target and cell: value and speedup."""
    out: dict[tuple[str, int, int, str, int], tuple[str, str | None]] = {}
    for target in targets:
        for table in tables_citing(find_target(target), path):
            for c in table.cells:
                key = (target, c.nodes, c.gpus, c.precision, c.batch_size)
                assert key not in out, f"{key} cited twice from {path}"
                out[key] = (c.value, c.speedup)
    return out


def tables_citing(m: Manifest, path: str) -> list[PublishedTable]:
    return [t for t in m.published if t.cite["repository"] == "https://github.com/Oneflow-Inc/DLPerf"
            and t.cite["path"] == path and t.cite["commit"] == COMMIT]


# --- the tests -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_every_summary_figure_is_cited_as_printed(name: str) -> None:
    """Each figure of the row, with its speedup, is a README.md cell of one of the row's targets: the one
    marked w/XLA of the XLA target, the others of the rest."""
    fw = FRAMEWORKS[name]
    printed = sorted((f.key(), f.value, f.speedup, f.label == "w/XLA")
                     for f in summary_figures(summary_rows()[name], fw))
    kit = sorted((key[1:], value, speedup, key[0] == fw.xla)
                 for key, (value, speedup) in cited(fw.targets, "README.md").items())
    assert printed == kit


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_every_per_framework_figure_is_cited_as_printed(name: str) -> None:
    fw = FRAMEWORKS[name]
    for source in fw.sources:
        tables = markdown_tables((DATA / source.snapshot).read_text(encoding="utf-8"))
        assert len(tables) == len(source.tables), f"{source.snapshot}: {len(tables)} tables"
        printed: dict[tuple[str, int, int, str, int], tuple[str, str | None]] = {}
        for (header, rows), spec in zip(tables, source.tables):
            if isinstance(spec, Excluded):
                continue
            for f in per_framework_figures(header, rows, spec):
                key = (spec.target, *f.key())
                assert key not in printed, f"{source.snapshot}: {key} printed twice"
                printed[key] = (f.value, f.speedup)
        targets = tuple(dict.fromkeys(t.target for t in source.tables if isinstance(t, Table)))
        assert printed == cited(targets, source.path), source.snapshot


def test_every_targets_dlperf_citation_is_covered() -> None:
    """A target of the list cites nothing of DLPerf that the list does not compare."""
    for fw in FRAMEWORKS.values():
        paths = {"README.md"} | {s.path for s in fw.sources}
        for target in fw.targets:
            m = find_target(target)
            dlperf = [t for t in m.published if "Oneflow-Inc/DLPerf" in t.cite["repository"]]
            assert dlperf and {t.cite["path"] for t in dlperf} <= paths, target


def test_the_snapshots_name_their_source() -> None:
    sources = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    assert COMMIT in sources
    for fw in FRAMEWORKS.values():
        for s in fw.sources:
            assert f"`{s.snapshot}`: `{s.path}`" in sources
    assert f"`{SUMMARY}`: `README.md`" in sources


def test_the_comparison_fails_on_a_figure_that_differs() -> None:
    """The reading is not vacuous: a changed digit in the snapshot's text is a different figure."""
    text = (DATA / "ngc-tf1-README.md").read_text(encoding="utf-8").replace("| 5099.42 ", "| 5099.43 ")
    header, rows = markdown_tables(text)[0]
    figures = per_framework_figures(header, rows, Table("dlperf-ngc-tf1-rn50-v100", "fp32", 128))
    kit = cited(("dlperf-ngc-tf1-rn50-v100",), TF1)
    differ = [f.key() for f in figures if (f.value, f.speedup) != kit[("dlperf-ngc-tf1-rn50-v100", *f.key())]]
    assert differ == [(2, 16, "fp32", 128)]
    assert len(figures) == 5 and len(summary_figures(summary_rows()["NGC TensorFlow 1.x"],
                                                     FRAMEWORKS["NGC TensorFlow 1.x"])) == 3
