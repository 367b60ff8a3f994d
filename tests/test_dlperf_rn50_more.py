"""DLPerf's ResNet-50 tables of PyTorch examples and PaddlePaddle (Oneflow-Inc/DLPerf c89430b) against the
kit's citations: every figure of the per-framework READMEs' result tables and of those frameworks' rows in
the main README's summary table is cited by a target, with the same text, and nothing cited is absent from
the publication. The READMEs are bundled in tests/data/dlperf-b/ (see its SOURCE.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_cli

from repro.spec.manifest import find_target

DATA = Path(__file__).resolve().parent / "data" / "dlperf-b"
COMMIT = "c89430bac64f64caabb0445ff7eb80175641454c"
_ROW = re.compile(r"^\s*\|((?:\s*[0-9.]+\s*\|)+)\s*$")
_HEADING = re.compile(r"^\s*(?:-\s*)?(#{2,4})\s+(.*\S)\s*$")

#: each result table of a per-framework README, in the order it prints them: (the headings above it that
#: name it, the target and published table citing it, precision, batch per GPU); None: not cited, and why
PYTORCH = [
    (("DataLoader", "worker=8"), ("dlperf-pytorch-rn50-v100-w8", "dlperf-pytorch-examples-v1-w8", "fp32", 128)),
    (("DataLoader", "worker=48"), ("dlperf-pytorch-rn50-v100", "dlperf-pytorch-examples-v1", "fp32", 128)),
    (("DALI", "worker=8"), None),  # the DALI loader is code printed in the README, at no commit: no source
    (("DALI", "worker=48"), None),
]
PADDLE = [
    (("FP32", "batch size = 128 & without xla"), ("dlperf-paddle-rn50-v100", "dlperf-paddle-v1", "fp32", 128)),
    (("FP16", "batch size = 224 & without xla"), ("dlperf-paddle-rn50-v100", "dlperf-paddle-v1-amp", "amp", 224)),
    (("FP16", "without dynamic_loss_scaling"),
     ("dlperf-paddle-rn50-v100-static", "dlperf-paddle-v1-amp-static", "amp", 224)),
    (("FP16", "batch size = 196 & with dali"), ("dlperf-paddle-rn50-v100", "dlperf-paddle-v1-dali", "amp", 196)),
]


#: words of the headings that open a section of result tables (data loader or precision)
SECTIONS = ("DataLoader", "DALI", "FP32", "FP16")


def result_tables(path: Path) -> list[tuple[tuple[str, str], list[list[str]]]]:
    """Each table whose body rows are all numbers: (the last section heading before it, the heading right
    above it) and its rows."""
    headings: list[str] = []
    tables: list[tuple[tuple[str, str], list[list[str]]]] = []
    rows: list[list[str]] = []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if m := _ROW.match(line):
            rows.append([c.strip() for c in m.group(1).split("|")[:-1]])
            continue
        if rows:
            section = next(h for h in reversed(headings[:-1]) if any(w in h for w in SECTIONS))
            tables.append(((section, headings[-1]), rows))
            rows = []
        if h := _HEADING.match(line):
            headings.append(h.group(2))
    return tables


def cited(target: str, table: str, path: str | None = None) -> dict[tuple[int, int, str, int], tuple[str, str | None]]:
    """The cells of a target's published table, by (nodes, GPUs, precision, batch): (value, speedup) as cited."""
    t = next(t for t in find_target(target).published if t.id == table)
    assert (t.cite["repository"], t.cite["commit"]) == ("https://github.com/Oneflow-Inc/DLPerf", COMMIT)
    assert path is None or t.cite["path"] == path
    return {(c.nodes, c.gpus, c.precision, c.batch_size): (c.value, c.speedup) for c in t.cells}


def _check(readme: Path, expected: list, row_cells) -> int:
    tables = result_tables(readme)
    assert len(tables) == len(expected), [h for h, _ in tables]
    figures = 0
    for ((section, name), rows), ((word, words), citation) in zip(tables, expected):
        assert word in section and words in name, (word, words, section, name)
        if citation is None:
            continue
        target, table, precision, batch = citation
        printed = {}
        for row in rows:
            nodes, gpus, value, speedup = row_cells(row, batch)
            printed[(nodes, gpus, precision, batch)] = (value, speedup)
        path = readme.relative_to(DATA).as_posix()
        assert cited(target, table, path) == printed, (target, table)  # none missing, none different
        figures += 2 * len(printed)
    return figures


def test_every_figure_of_the_pytorch_examples_tables_is_cited() -> None:
    def cells(row: list[str], batch: int) -> tuple[int, int, str, str]:
        nodes, per_node, bs, value, speedup = row
        assert int(bs) == batch
        return int(nodes), int(nodes) * int(per_node), value, speedup

    assert _check(DATA / "PyTorch" / "resnet50v1.5" / "README.md", PYTORCH, cells) == 20


def test_every_figure_of_the_paddle_tables_is_cited() -> None:
    def cells(row: list[str], batch: int) -> tuple[int, int, str, str]:
        nodes, gpus, value, speedup = row
        return int(nodes), int(gpus), value, speedup

    assert _check(DATA / "PaddlePaddle" / "resnet50v1.5" / "README.md", PADDLE, cells) == 42


def test_the_published_paddle_fp32_repeats_give_the_printed_medians() -> None:
    """The README prints each repeat of the FP32 table; the cited repeats are those, and numpy's median
    rounded half to even gives every printed figure (1358.64 needs it: Python's round gives 1358.63)."""
    text = (DATA / "PaddlePaddle" / "resnet50v1.5" / "README.md").read_text(encoding="utf-8")
    last = {}
    for m in re.finditer(r"bz128/(\dn\dg)/r50_b128_fp32_\d\.log \{(.*)\}", text):
        last[m.group(1)] = {int(k): v for k, v in re.findall(r"(\d): ([\d.]+)", m.group(2))}
    t = next(t for t in find_target("dlperf-paddle-rn50-v100").published if t.id == "dlperf-paddle-v1")
    for c in t.cells:
        printed = last[f"{c.nodes}n{c.gpus // c.nodes}g"]
        assert list(c.repeats) == [printed[i] for i in sorted(printed)]


def _numbers(cell: str) -> list[str]:
    cell = re.sub(r"<sup>\[\d+\]</sup>", "", cell)
    return re.findall(r"(?<![\w/])\d+(?:\.\d+)?(?![\w/])", re.sub(r"\]\([^)]*\)", "]", cell)) or (
        ["-"] if cell.strip() == "-" else [])


def summary_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (DATA / "README.md").read_text(encoding="utf-8").splitlines():
        if m := re.match(r"\| \[(PyTorch|PaddlePaddle)\]\(https://github.com/(?:pytorch/pytorch|PaddlePaddle/Paddle)/",
                         line):
            rows.setdefault(m.group(1), line.split("|")[3:7])  # the first table: ResNet50 (BERT comes after)
    return rows


def test_the_summary_rows_are_cited_as_the_data_list_says() -> None:
    listed = yaml.safe_load((DATA / "summary-rows.yaml").read_text(encoding="utf-8"))
    rows = summary_rows()
    assert sorted(rows) == sorted(r["row"] for r in listed)
    for entry in listed:
        fp32, fp32_speedup, amp, amp_speedup = map(_numbers, rows[entry["row"]])
        assert [c["value"] for c in entry["fp32"]] == fp32 and [c["speedup"] for c in entry["fp32"]] == fp32_speedup
        if amp == ["-"]:
            assert entry["amp"] == [] and amp_speedup == ["-"]
        else:
            assert [c["value"] for c in entry["amp"]] == amp
            assert [c["speedup"] for c in entry["amp"]] == amp_speedup
        for precision in ("fp32", "amp"):
            for c in entry[precision]:
                key = (4, 32, precision, c["batch_size"])
                assert cited(c["target"], c["table"], "README.md")[key] == (c["value"], c["speedup"])


def test_pytorch_examples_has_no_amp_citation() -> None:
    """The row prints "-" for AMP: pytorch/examples had no mixed precision (the README's footnote [2])."""
    for target in ("dlperf-pytorch-rn50-v100", "dlperf-pytorch-rn50-v100-w8"):
        assert {c.precision for t in find_target(target).published for c in t.cells} == {"fp32"}


@pytest.mark.parametrize("target,table,cells", [
    ("dlperf-pytorch-rn50-v100", "dlperf-pytorch-examples-v1", 5),
    ("dlperf-pytorch-rn50-v100-w8", "dlperf-pytorch-examples-v1-w8", 5),
    ("dlperf-paddle-rn50-v100", "dlperf-paddle-v1", 6),
    ("dlperf-paddle-rn50-v100", "dlperf-paddle-v1-amp", 5),
    ("dlperf-paddle-rn50-v100", "dlperf-paddle-v1-dali", 5),
    ("dlperf-paddle-rn50-v100-static", "dlperf-paddle-v1-amp-static", 5),
])
def test_report_shows_every_cell_not_run_with_where_its_logs_are(target: str, table: str, cells: int) -> None:
    """No raw log of these tables is in git: each cell is "not run", and the report says where the
    publisher's archive is (or that none was published)."""
    proc = run_cli("report", target, "--published", table)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"Verdict: {cells} not run of {cells} cells." in proc.stdout
    where = "oneflow-public.oss-cn-beijing.aliyuncs.com" if "static" not in table else "no logs archive"
    assert " ".join(proc.stdout.split()).count(where) >= cells  # beside each cell (the report wraps lines)
