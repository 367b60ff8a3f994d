"""Every figure of DLPerf's BERT-base tables against the kit's citations: none missing, none different.

The tables are bundled under tests/data/dlperf-bert/ as printed upstream (each file's first line names
repository@commit:path): the summary row of every framework in DLPerf's README.md and the per-framework
reports. A row of the summary the kit has no target for yet is listed in PENDING, so a new target must
take its row out of there and cite all of it.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from repro.spec.manifest import Manifest, find_target

DATA = Path(__file__).resolve().parent / "data" / "dlperf-bert"
COMMIT = "c89430bac64f64caabb0445ff7eb80175641454c"
SUMMARY_TABLE = "dlperf-v1-bert-base"

#: summary row (its framework cell, links and superscripts dropped) -> the target that reproduces it
ROWS = {"OneFlow": "dlperf-oneflow-bert-v100", "OneFlow W/O clip": "dlperf-oneflow-bert-noclip-v100",
        "NGC PyTorch": "dlperf-ngc-pytorch-bert-v100", "TensorFlow 2.x": "dlperf-tf2-bert-v100",
        "PaddlePaddle": "dlperf-paddle-bert-v100"}
#: summary rows with no target yet
PENDING = {"NGC TensorFlow 1.x", "MXNet W/O clip", "MindSpore"}

#: per-framework report -> {(precision, section words): (target, published table id)}
REPORTS = {
    "oneflow-v0.2-report.md": {
        ("amp", "FP16 with clip"): ("dlperf-oneflow-bert-v100", "dlperf-oneflow-bert-fp16"),
        ("fp32", "FP32 with clip"): ("dlperf-oneflow-bert-v100", "dlperf-oneflow-bert-fp32"),
        ("amp", "FP16 without clip"): ("dlperf-oneflow-bert-noclip-v100", "dlperf-oneflow-bert-noclip-fp16"),
        ("fp32", "FP32 without clip"): ("dlperf-oneflow-bert-noclip-v100", "dlperf-oneflow-bert-noclip-fp32"),
    },
    "ngc-pytorch.md": {
        ("fp32", "FP32"): ("dlperf-ngc-pytorch-bert-v100", "dlperf-ngc-pytorch-bert-fp32"),
        ("amp", "FP16 dynamic loss scale"): ("dlperf-ngc-pytorch-bert-v100", "dlperf-ngc-pytorch-bert-amp"),
    },
    "tf2.md": {
        ("fp32", "FP32 without xla"): ("dlperf-tf2-bert-v100", "dlperf-tf2-bert-fp32"),
        ("amp", "FP16 without xla"): ("dlperf-tf2-bert-v100", "dlperf-tf2-bert-amp"),
    },
    "paddle.md": {
        ("fp32", "FP32 without xla"): ("dlperf-paddle-bert-v100", "dlperf-paddle-bert-fp32"),
        ("amp", "FP16 without xla"): ("dlperf-paddle-bert-v100", "dlperf-paddle-bert-amp"),
    },
}
#: per-framework tables no target cites yet (report, (precision, section))
REPORTS_PENDING = {
    # the README names no loss scale, so the run cannot be pinned
    ("ngc-pytorch.md", ("amp", "FP16 static loss scale")),
    # another run (--enable_xla=true, TF_XLA_FLAGS), for a target of its own
    ("tf2.md", ("fp32", "FP32 with xla")),
    ("tf2.md", ("amp", "FP16 with xla")),
    # another run (--use_dynamic_loss_scaling=false), for a target of its own
    ("paddle.md", ("amp", "FP16 without xla & without dynamic_loss_scaling")),
}
#: reports that quote their extract script's output for every repeat: report -> (target, table, batch)
PRINTED_REPEATS = {
    "ngc-pytorch.md": ("dlperf-ngc-pytorch-bert-v100", "dlperf-ngc-pytorch-bert-amp", 96),
    "tf2.md": ("dlperf-tf2-bert-v100", "dlperf-tf2-bert-fp32", 64),
    "paddle.md": ("dlperf-paddle-bert-v100", "dlperf-paddle-bert-fp32", 64),
}


def _provenance(name: str) -> str:
    first = (DATA / name).read_text(encoding="utf-8").splitlines()[0]
    m = re.fullmatch(rf"<!-- Oneflow-Inc/DLPerf@{COMMIT}:(\S+) -->", first)
    assert m, f"{name} names no upstream file"
    return m.group(1)


def _plain(cell: str) -> str:
    """A summary cell without links, superscript markers and line breaks' markup."""
    text = re.sub(r"<sup>\[\d+\]</sup>", "", cell)  # a footnote mark
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<sup>([^<]*)</sup>", r" \1", text)
    return re.sub(r"\s+", " ", text.replace("<br/>", " ").replace("<br>", " ")).strip()


def summary_rows() -> dict[str, list[tuple[str, int | None, str]]]:
    """Framework -> its figures as (precision, batch or None for a fixed-batch column's own, value)."""
    lines = [ln for ln in (DATA / "summary.md").read_text(encoding="utf-8").splitlines() if ln.startswith("|")]
    out: dict[str, list[tuple[str, int | None, str]]] = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name, figures = _plain(cells[0]), []
        for (precision, fixed), cell in zip((("fp32", None), ("fp32", 32), ("amp", None), ("amp", 64)), cells[2:]):
            text = _plain(cell)
            bsz = re.search(r"bsz=(\d+)", text)
            for value in re.findall(r"(?<![=\d.])(\d+\.\d+)", text):
                figures.append((precision, int(bsz.group(1)) if bsz else fixed, value))
        out[name] = figures
    return out


def report_rows(name: str) -> dict[tuple[str, str], list[tuple[int, int, int, str, str]]]:
    """(precision, section) -> its rows (nodes, gpus per node, batch per GPU, throughput, speedup). A section is the
    FP16/FP32 heading a table is under, with the loss-scale variant line before it where the report has one, or the
    XLA variant of a ``batch size=N & with(out) xla`` heading (whose tables print total GPUs and no batch)."""
    out: dict[tuple[str, str], list[tuple[int, int, int, str, str]]] = {}
    section = variant = ""
    batch = 0
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        heading = re.fullmatch(r"#+ (?:BERT-Base\s+)?(FP16|FP32)(.*)", line.strip())
        if heading:
            section, variant = (heading.group(1) + heading.group(2)).strip(), ""
        marker = re.fullmatch(r"`(\w+ loss scale)`|#+ batch size ?= ?(\d+) & (with(?:out)? xla(?: & .*)?)", line.strip())
        if marker:
            variant, batch = marker.group(1) or marker.group(3), int(marker.group(2) or 0)
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells and all(re.fullmatch(r"[\d.]+", c) for c in cells):
            precision = "amp" if section.startswith("FP16") else "fp32"
            n, g = int(cells[0]), int(cells[1])
            row = (n, g, int(cells[2]), *cells[3:]) if len(cells) == 5 else (n, g // n, batch, *cells[2:])
            out.setdefault((precision, f"{section} {variant}".strip()), []).append(row)  # type: ignore[arg-type]
    return out


def printed_repeats(name: str) -> dict[tuple[int, int, int], list[str]]:
    """(nodes, gpus per node, batch) -> each repeat's figure in repeat order, from the quoted extract output (its
    last, complete line per case: a dict of repeat number to figure)."""
    out: dict[tuple[int, int, int], list[str]] = {}
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        m = re.search(r"/(\d)n(\d)g/[\w-]+_b(\d+)_\w+_\d\.log \{(.*)\}$", line)
        if m:
            pairs = sorted((int(k), v) for k, v in re.findall(r"(\d+): ([\d.]+)", m.group(4)))
            out[(int(m.group(1)), int(m.group(2)), int(m.group(3)))] = [v for _, v in pairs]
    return out


def _median2(repeats: tuple[str, ...]) -> float:
    """np.round(np.median(repeats), 2), as DLPerf's extract scripts print it: half to even on the binary product
    (the mean of 441.4 and 442.09 is printed 441.74)."""
    return round(statistics.median(float(v) for v in repeats) * 100) / 100


def _table(m: Manifest, table_id: str):  # noqa: ANN202
    return next(t for t in m.published if t.id == table_id)


def test_every_summary_row_is_a_target_or_pending() -> None:
    rows = summary_rows()
    assert len(rows) == 8, "DLPerf's BERT-base summary has eight rows"
    assert set(rows) == set(ROWS) | PENDING and not set(ROWS) & PENDING
    assert all(rows[r] for r in rows), "every row prints figures"


@pytest.mark.parametrize("row", sorted(ROWS))
def test_summary_row_figures_are_cited_exactly(row: str) -> None:
    m = find_target(ROWS[row])
    table = _table(m, SUMMARY_TABLE)
    assert (table.cite["commit"], table.cite["path"]) == (COMMIT, _provenance("summary.md"))
    assert table.unit == m.unit == "sentences/s"
    printed = sorted(summary_rows()[row])
    cited = sorted((c.precision, c.batch_size, c.value) for c in table.cells)
    assert cited == printed
    for c in table.cells:  # and each cell's figure is their median
        assert not c.repeats or _median2(c.repeats) == float(c.value), "none missing, none different, none extra"
    assert all((c.nodes, c.gpus) == (4, 32) for c in table.cells), "the summary is 4 nodes x 8 GPUs"
    assert table.column == row


@pytest.mark.parametrize(("report", "key"), [(r, k) for r, keys in REPORTS.items() for k in keys])
def test_per_framework_figures_are_cited_exactly(report: str, key: tuple[str, str]) -> None:
    target, table_id = REPORTS[report][key]
    m = find_target(target)
    table = _table(m, table_id)
    assert (table.cite["commit"], table.cite["path"]) == (COMMIT, _provenance(report))
    rows = report_rows(report)[key]
    printed = sorted((n, n * g, key[0], b, v, s) for n, g, b, v, s in rows)
    cited = sorted((c.nodes, c.gpus, c.precision, c.batch_size, c.value, c.speedup) for c in table.cells)
    assert cited == printed
    for c in table.cells:  # and each cell's figure is their median
        assert not c.repeats or _median2(c.repeats) == float(c.value), "every figure and speedup, as printed"


def test_every_report_section_is_cited_or_pending() -> None:
    for report, keys in REPORTS.items():
        pending = {k for r, k in REPORTS_PENDING if r == report}
        assert set(report_rows(report)) == set(keys) | pending and not set(keys) & pending, report


@pytest.mark.parametrize("report", sorted(PRINTED_REPEATS))
def test_printed_repeats_are_cited_in_repeat_order(report: str) -> None:
    """The NGC PyTorch README quotes its extract script's output for AMP bs96, the TensorFlow 2.x and PaddlePaddle
    READMEs for FP32 bs64: every repeat of every case (six in PaddlePaddle's, five in the others)."""
    target, table_id, batch = PRINTED_REPEATS[report]
    printed = printed_repeats(report)
    assert {k[2] for k in printed} == {batch}
    assert {len(v) for v in printed.values()} == {6 if report == "paddle.md" else 5}
    assert len(printed) == len({(n, g) for n, g, b, *_ in sum(report_rows(report).values(), []) if b == batch})
    table = _table(find_target(target), table_id)
    cited = {(c.nodes, c.gpus // c.nodes, c.batch_size): list(c.repeats) for c in table.cells if c.repeats}
    assert cited == printed
    for c in table.cells:  # and each cell's figure is their median
        assert not c.repeats or _median2(c.repeats) == float(c.value)


def test_the_cited_speedups_are_the_cited_medians_over_1n1g() -> None:
    """The report's speedup is its median over the 1-GPU median of the same batch, both unrounded, printed to 2
    decimals: from the printed medians it comes out within half a hundredth (5745.56 / 534.72 = 10.7450 is
    printed 10.75)."""
    for target in set(ROWS.values()):
        for table in find_target(target).published:
            base = {(c.precision, c.batch_size): float(c.value) for c in table.cells if c.gpus == 1}
            for c in table.cells:
                if c.speedup is not None:
                    ratio = float(c.value) / base[(c.precision, c.batch_size)]
                    assert abs(ratio - float(c.speedup)) <= 0.0051, (table.id, c)
