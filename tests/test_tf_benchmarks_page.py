"""Every figure of the TensorFlow benchmarks page (tensorflow/tensorflow@5984ffe
``tensorflow/docs_src/performance/benchmarks.md``) is cited by a target, as printed, at the batch size the page ran
it with: none missing, none different, none extra. The page's tables are test data copied from the upstream file
(``tests/data/tf-benchmarks/``, provenance in its README)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import run_cli

from repro.spec.manifest import load_manifest, manifest_files
from repro.verdict.reproduce import NOT_PUBLISHED, NOT_RUN, reproduce_table, resolve_tables
from repro.verdict.rules import EXIT_UNSETTLED

PAGE = Path(__file__).resolve().parent / "data" / "tf-benchmarks" / "benchmarks-5984ffe-L74-400.md"
FIRST_LINE = 74  # the excerpt's first line in the upstream file
CITE = ("https://github.com/tensorflow/tensorflow", "5984ffefd320c5d71b801ee06079a51b91ea42c0",
        "tensorflow/docs_src/performance/benchmarks.md")
#: each "Details for ..." section of the page: the kit's table ids start so
SECTIONS = {
    "NVIDIA® DGX-1™ (NVIDIA® Tesla® P100)": "tf-benchmarks-dgx1-p100",
    "Google Compute Engine (NVIDIA® Tesla® K80)": "tf-benchmarks-gce-k80",
    "Amazon EC2 (NVIDIA® Tesla® K80)": "tf-benchmarks-ec2-k80",
    "Amazon EC2 Distributed (NVIDIA® Tesla® K80)": "tf-benchmarks-ec2-k80-distributed",
}
#: the page's column headings as the manifests write them (the page spells AlexNet "Alexnet" in its tables)
COLUMNS = {"Alexnet": "AlexNet"}
#: the tables and columns no target cited before this page was covered whole: 96 figures
NEW = {
    "tf-benchmarks-dgx1-p100-synthetic": {"InceptionV3", "ResNet-152", "AlexNet", "VGG16"},
    "tf-benchmarks-dgx1-p100-real": {"InceptionV3", "ResNet-152", "AlexNet", "VGG16"},
    "tf-benchmarks-dgx1-p100-synthetic-bs32": {"InceptionV3", "ResNet-50", "ResNet-152", "VGG16"},
    "tf-benchmarks-dgx1-p100-real-bs32": {"InceptionV3", "ResNet-50", "ResNet-152", "VGG16"},
    "tf-benchmarks-gce-k80-synthetic-bs32": {"InceptionV3", "ResNet-50"},
    "tf-benchmarks-gce-k80-real-bs32": {"InceptionV3", "ResNet-50"},
    "tf-benchmarks-ec2-k80-synthetic-bs32": {"InceptionV3", "ResNet-50"},
    "tf-benchmarks-ec2-k80-real-bs32": {"InceptionV3", "ResNet-50"},
}
_ROW = re.compile(r"^(\S[^|]*?)\s*\|(.*)$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")]


def page_figures() -> dict[tuple[str, str, int], tuple[str, int, int]]:
    """(table id, column, GPUs) -> (figure as printed, batch size per GPU, line) for every result table of the
    page: the table id from its section, its data ("Training synthetic data") and whether it is under
    "Other Results" (batch size 32); the batch size from the section's options table."""
    out: dict[tuple[str, str, int], tuple[str, int, int]] = {}
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    section = data = ""
    other = False
    batch: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.startswith("## Details for "):
            section, other, batch = SECTIONS[line.removeprefix("## Details for ")], False, {}
        elif line == "### Other Results":
            other = True
        elif line.startswith("**Training ") and line.endswith(" data**"):
            data = line.removeprefix("**Training ").removesuffix(" data**")
        elif line.startswith("Options "):
            heads = [COLUMNS.get(c, c) for c in _cells(line)[1:]]
            sizes = _cells(lines[i + 2])
            assert sizes[0] == "Batch size per GPU"
            batch = dict(zip(heads, map(int, sizes[1:])))
        elif line.startswith("GPUs |"):
            heads = [COLUMNS.get(c, c) for c in _cells(line)[1:]]
            table = f"{section}-{data}" + ("-bs32" if other else "")
            for j in range(i + 2, len(lines)):
                if not _ROW.match(lines[j]):
                    break
                gpus, *figures = _cells(lines[j])
                for head, figure in zip(heads, figures):
                    column = head.removesuffix(" (batch size 32)")
                    out[(table, column, int(gpus))] = (figure, 32 if other else batch[column], FIRST_LINE + j)
    return out


def kit_figures() -> dict[tuple[str, str, int], tuple[str, int]]:
    """(table id, column, GPUs) -> (figure as cited, batch size per GPU) for every manifest citing the page."""
    out: dict[tuple[str, str, int], tuple[str, int]] = {}
    for f in manifest_files():
        m = load_manifest(f)
        for t in m.published:
            if (t.cite["repository"], t.cite["commit"], t.cite["path"]) != CITE:
                continue
            for c in t.cells:
                key = (t.id, t.column or "", c.gpus)
                assert key not in out, f"{key} is cited twice ({m.id})"
                out[key] = ("N/A" if c.value == "-" else c.value, c.batch_size)
    return out


def test_the_page_excerpt_holds_every_table_of_the_page() -> None:
    page = page_figures()
    assert len(page) == 209  # 40 + 32 P100, 40 + 16 GCE, 40 + 16 EC2, 15 + 10 EC2 distributed
    assert sum(fig == "N/A" for fig, _, _ in page.values()) == 2  # AlexNet real data, 8 GPUs, P100 and EC2
    assert page[("tf-benchmarks-dgx1-p100-synthetic", "ResNet-50", 1)] == ("219", 64, 125)
    assert page[("tf-benchmarks-ec2-k80-distributed-synthetic-bs32", "ResNet-50", 64)] == ("2315", 32, 399)


def test_every_figure_of_the_page_is_cited_as_printed_at_its_batch_size() -> None:
    page = {k: (fig, batch) for k, (fig, batch, _) in page_figures().items()}
    kit = kit_figures()
    missing = sorted(set(page) - set(kit))
    extra = sorted(set(kit) - set(page))
    different = sorted((k, page[k], kit[k]) for k in set(page) & set(kit) if page[k] != kit[k])
    assert (missing, extra, different) == ([], [], [])


def test_the_96_figures_no_target_cited_before() -> None:
    page = page_figures()
    new = [k for k in page if k[1] in NEW.get(k[0], ())]
    assert len(new) == 96
    assert {k[0] for k in new} == set(NEW)


@pytest.mark.parametrize("table", sorted(NEW))
def test_repro_report_of_each_new_table_says_not_run_and_where_the_logs_come_from(table: str) -> None:
    results = [reproduce_table(m, t) for m, t in resolve_tables([table])]
    cells = [c for r in results for c in r.cells]
    assert {r.source for r in results} == {"no log (the kit bundles none)"}
    assert {r.table.logs_from for r in results if r.table} == {LOGS_FROM}
    published = [c for c in cells if c.verdict != NOT_PUBLISHED]
    assert {c.verdict for c in published} == {NOT_RUN}
    assert all(c.detail.startswith(f"the kit bundles no publication log of this cell; {LOGS_FROM}")
               for c in published)
    assert len(cells) == 4 * len({k[1] for k in page_figures() if k[0] == table})


LOGS_FROM = ("no raw logs were published (the page's tables are the only source): a run of the target "
             "(repro up) gives each cell's")


def test_repro_report_of_the_p100_real_data_table() -> None:
    proc = run_cli("report", "tf-benchmarks-dgx1-p100-real")
    assert proc.returncode == EXIT_UNSETTLED, proc.stderr  # no cell is judged: every one is not run
    out = proc.stdout
    assert "| 8 GPUs (1 node) | — (not published)    | 1079 → — (not run) " in out  # AlexNet, real data: N/A
    words = " ".join(out.split())  # the notes wrap
    assert ("- tf-cnn-alexnet-p100-real 8 GPUs fp32 bs512: not published: the table prints N/A (AlexNet with real "
            "data on 8 GPUs maxed out the input pipeline)") in words
    assert words.count(f"not run: the kit bundles no publication log of this cell; {LOGS_FROM}") == 19
    assert out.endswith("Verdict: 19 not run, 1 not published of 20 cells.\n")
