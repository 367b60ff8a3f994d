"""One vocabulary across every output, on every shipped table: the verdict words of the text form, CSV/JSON
records, JUnit and HTML are the same set, ``--fail-on`` names them hyphenated, no JUnit message is empty, the
terminal form fits 120 columns, and the chart is written in the format its file name asks for.

The tables are every published table of the catalog re-derived from its bundled logs, plus one new run made of
real logs (five scaled copies of a publisher's log, and a map of one cell), so that new-run words appear too.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_helpers import run_cli
from parsers_helpers import P_C1AD, PUBLISHED

from repro.verdict.html import render_html
from repro.verdict.report import records, render_csv, render_junit, render_text
from repro.verdict.reproduce import TableResult, reproduce_table, resolve_tables
from repro.verdict.rules import DIFFERS, FAIL_ON, UNSETTLED, VERDICTS, fail_on_name

REPO = Path(__file__).resolve().parents[1]
NGC_PT = PUBLISHED / P_C1AD / "ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs/V100-LOG"
FIGURE = re.compile(rb"(_ips : )(\d+\.\d+)")


def _all_tables() -> list[tuple]:
    from repro.spec.manifest import load_catalog, manifest_files

    ids = sorted({t.id for m in load_catalog(manifest_files()).values() for t in m.published})
    return [pair for table in ids for pair in resolve_tables([table])]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[TableResult]:
    out = [reproduce_table(m, t) for m, t in _all_tables()]
    tree = tmp_path_factory.mktemp("mine")
    for k, f in enumerate((0.96, 0.962, 0.958, 0.961, 0.959), 1):  # 4 % slower in five repeats
        (tree / f"r{k}").mkdir()
        data = (NGC_PT / "pytorch_gpu1_fp32_bs256.txt").read_bytes()
        (tree / f"r{k}" / "log.txt").write_bytes(FIGURE.sub(lambda m: m[1] + b"%.4f" % (float(m[2]) * f), data))
    out += [reproduce_table(m, t, tree) for m, t in resolve_tables(["ngc-pytorch-rn50-v100"])]
    return out


def _verdict_line_words(text: str) -> set[str]:
    words = set()
    for line in re.findall(r"^Verdict: (.*) of \d+ cells\.$", text, re.M):
        words |= {re.sub(r"^\d+ ", "", part) for part in line.split(", ")}
    return words


def test_every_output_uses_the_same_verdict_words(results: list[TableResult]) -> None:
    per_cell = [c.verdict for r in results for c in r.cells]
    assert set(per_cell) <= set(VERDICTS)
    assert {"match", "not derivable", "not run", "slower", "not published"} <= set(per_cell)
    assert [rec["verdict"] for rec in records(results)] == per_cell
    assert _verdict_line_words(render_text(results)) == set(per_cell)
    assert [row["verdict"] for row in csv.DictReader(io.StringIO(render_csv(results)))] == per_cell
    root = ET.fromstring(render_junit(results).split("\n", 1)[1])
    failures = root.findall(".//failure")
    assert {f.get("type") for f in failures} == {v for v in per_cell if v in {*DIFFERS.values(), *UNSETTLED.values()}}
    html = render_html(results[-2:])  # the page embeds a chart per table: two tables keep the test short
    assert {w for w in re.findall(r"<b>([^<]*)</b>", html)} == {c.verdict for r in results[-2:] for c in r.cells}


def test_fail_on_names_the_verdicts_hyphenated() -> None:
    assert set(FAIL_ON) == {fail_on_name(v) for v in (*DIFFERS.values(), *UNSETTLED.values())}
    assert "not-run" in FAIL_ON and "not-derivable" in FAIL_ON and "missing" not in FAIL_ON


def test_no_junit_failure_message_is_empty(results: list[TableResult]) -> None:
    root = ET.fromstring(render_junit(results).split("\n", 1)[1])
    for f in root.findall(".//failure"):
        verdict, _, why = f.get("message", "").partition(": ")
        assert verdict == f.get("type") and why.strip(), ET.tostring(f)[:200]


def columns(line: str) -> int:
    """The terminal columns a line takes: a wide character two, a combining one none (→, — and ± one each:
    a line's UTF-8 bytes are more than its columns)."""
    import unicodedata

    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in line)


def test_the_terminal_form_of_every_table_fits_120_columns(results: list[TableResult]) -> None:
    widths = {}
    for r in results:  # each as `repro report TABLE` prints it, and all together
        widths[(r.table.id if r.table else r.manifest.id, r.manifest.id)] = max(map(columns,
                                                                                   render_text([r]).splitlines()))
    tables = {t.id for _, t in _all_tables()}
    assert {t for t, _ in widths} == tables and len(tables) >= 26, widths  # every published table of the kit
    assert max(widths.values()) <= 120, widths
    assert max(map(columns, render_text(results).splitlines())) <= 120


def test_one_framework_vocabulary_and_a_model_column(results: list[TableResult]) -> None:
    """The framework is the manifest's (one word of the schema's list), never a published column heading;
    the model is the manifest's, in CSV, JSON and HTML."""
    import json

    from repro.spec.schema import load_schema
    from repro.verdict.report import render_json

    words = set(load_schema("manifest.v1")["properties"]["framework"]["enum"])
    recs = records(results)
    assert {rec["framework"] for rec in recs} <= words
    assert {rec["framework"] for rec in recs} == {"paddle", "pytorch", "tensorflow", "mxnet", "oneflow"}
    assert [(rec["framework"], rec["model"]) for rec in recs] == [(r.manifest.framework, r.manifest.model)
                                                                  for r in results for _ in r.cells]
    assert {rec["model"] for rec in recs} >= {"resnet50v1.5", "alexnet", "vgg16"}
    rows = list(csv.DictReader(io.StringIO(render_csv(results))))
    assert [(row["framework"], row["model"]) for row in rows] == [(rec["framework"], rec["model"]) for rec in recs]
    assert [(d["framework"], d["model"]) for d in json.loads(render_json(results))] == [
        (rec["framework"], rec["model"]) for rec in recs]
    html = render_html(results[-1:])
    assert "<th class=l>framework</th><th class=l>model</th>" in html
    assert "<td class=l>pytorch</td><td class=l>resnet50v1.5</td>" in html


def test_headers_say_where_the_logs_came_from(results: list[TableResult]) -> None:
    text = render_text(results)
    assert "Reproduced from: no log (the kit bundles none)." in text  # the TF benchmarks tables
    assert "Cells: 20 with no log (not run)." in text  # DGX-1 P100 synthetic data: five models x 4 GPU counts
    mine = render_text(results[-1:])
    assert "Reproduced from: your logs under " in mine
    assert "Cells: 1 from your logs (new run), 5 with no log (not run)." in mine


def test_the_html_title_names_the_table(results: list[TableResult]) -> None:
    html = render_html(results[-1:])
    assert "<title>perf-2.5-v100: repro report</title>" in html


@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml"), (".pdf", b"%PDF-")])
def test_the_plot_is_written_in_the_format_its_name_asks_for(suffix: str, magic: bytes, tmp_path: Path) -> None:
    out = tmp_path / f"chart{suffix}"
    proc = run_cli("report", "ngc-mxnet-rn50-v100-19.07", "--plot", out, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(magic)
    if suffix == ".svg":
        assert b"<svg" in out.read_bytes()[:2000]


def test_a_plot_format_the_kit_does_not_write_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "chart.jpg"
    proc = run_cli("report", "ngc-mxnet-rn50-v100-19.07", "--plot", out, cwd=REPO)
    assert proc.returncode == 2 and "end the file name with .png, .svg or .pdf" in proc.stderr and not out.exists()
    assert "Traceback" not in proc.stderr
