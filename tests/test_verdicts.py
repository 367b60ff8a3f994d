"""Verdicts of new runs, exit codes that gate, and the outputs a person or a CI reads.

A new run is simulated with real published logs: every throughput record of each rank-0 log
is multiplied by a known factor, one random factor per repeat around it (seeded), so the
right verdict is known in advance: x0.97 with 0.3 % noise is slower, x1.00 is reproduced,
x1.00 with 6 % noise cannot tell in 5 repeats.
"""

from __future__ import annotations

import dataclasses
import io
import random
import re
import struct
import zlib
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import run_cli
from click.testing import CliRunner
from junitparser import Failure, JUnitXml

from repro.cli import cli
from repro.errors import UsageError
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Cell, find_target
from repro.verdict.html import render_html
from repro.verdict.report import records, render_csv, render_json, render_junit, render_text
from repro.verdict.reproduce import reproduce_run, reproduce_table, resolve_tables
from repro.run.rundir import DONE, RunDir
from repro.verdict.rules import (
    EXIT_DIFFERS,
    EXIT_UNSETTLED,
    FASTER,
    INCONCLUSIVE,
    NEW_RUN,
    REPRODUCED,
    SLOWER,
    Estimate,
    estimate,
    exit_code,
    judge_new_run,
    parse_fail_on,
    repeats_needed,
)

REPO = Path(__file__).resolve().parents[1]
TARGET = "ngc-pytorch-rn50-v100"
IPS = re.compile(rb"(_ips : )(\d+\.\d+)")
#: a PaddleClas record: its step time and reader time scale by 1/f where its ips scales by f (the reader's share
#: of a step stays the log's)
PADDLE = re.compile(rb"batch_cost: ([0-9.]+) s, reader_cost: ([0-9.]+) s, ips: ([0-9.]+)")


def scaled(text: bytes, f: float) -> bytes:
    """A log's throughput records times ``f`` (NGC's ``*_ips : X``, PaddleClas' ``ips: X`` with its costs)."""
    text = IPS.sub(lambda mt: mt[1] + b"%.2f" % (float(mt[2]) * f), text)
    return PADDLE.sub(lambda mt: b"batch_cost: %.5f s, reader_cost: %.5f s, ips: %.5f"
                      % (float(mt[1]) / f, float(mt[2]) / f, float(mt[3]) * f), text)


def scaled_run(root: Path, factor: float, noise: float, repeats: int = 5, seed: int = 17,
               factors: list[float] | None = None, target: str = TARGET) -> RunDir:
    """A run directory whose rank-0 logs are the published logs, scaled by ``factor`` x (1 + N(0, noise))
    in each repeat (or by the given ``factors``, one per repeat)."""
    rng = random.Random(seed)
    factors = factors or [factor * (1 + rng.gauss(0, noise)) for _ in range(repeats)]
    repeats = len(factors)
    m = find_target(target)
    m = dataclasses.replace(m, matrix={**m.matrix, "repeats": repeats})
    run = RunDir.create(root, m, Hosts((Node("node0", "10.0.0.1", user="root"),)))
    for pc in m.table().cells:
        cell = Cell(pc.nodes, pc.gpus // pc.nodes, pc.precision, pc.batch_size)
        text = pc.logs[0].read_bytes()
        for k, f in enumerate(factors, 1):
            run.write_log(cell, k, 0, "node0", scaled(text, f))
            run.set_status(cell, k, DONE)
    return run


def verdicts(run: RunDir) -> dict[str, str]:
    return {f"{c.gpus}g {c.precision}": c.verdict for c in reproduce_run(run.path).cells}


def report(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["report", *args])
    return res.exit_code, res.output


# ------------------------------------------------------------------ new runs from scaled real logs
def test_three_percent_slower_in_five_repeats_is_slower_and_fails(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 0.97, 0.003)
    got = reproduce_run(run.path)
    assert {c.verdict for c in got.cells} == {SLOWER}, [(c.verdict, c.detail) for c in got.cells]
    c = got.cells[0]
    assert c.kind == NEW_RUN and len(c.repeats) == 5 and c.low is not None and c.high is not None
    assert c.high < float(c.published) and -3.6 < c.delta_pct < -2.4
    assert "published outside the interval" in c.detail and "tolerance ±2%" in c.detail
    code, out = report(str(run.path), "--format", "csv")
    assert code == EXIT_DIFFERS == 7, out
    assert report(str(run.path), "--fail-on", "inconclusive,not-run")[0] == 0


def test_unchanged_logs_in_five_repeats_reproduce(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 1.00, 0.003)
    assert set(verdicts(run).values()) == {REPRODUCED}
    code, out = report(str(run.path))
    assert code == 0, out
    assert "Compared as a new run" in out and "n=5) reproduced" in out


def test_wide_noise_is_inconclusive_and_says_how_many_more_repeats(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 1.0, 0.0, factors=[0.94, 1.06, 0.97, 1.03, 1.00])  # mean 1.00, sd 4.7 %
    got = reproduce_run(run.path).cells
    assert {c.verdict for c in got} == {INCONCLUSIVE}, [(c.verdict, c.detail) for c in got]
    assert all(re.search(r"about \d+ more repeat\(s\) would narrow it to the tolerance", c.detail) for c in got)
    assert report(str(run.path), "--format", "json")[0] == EXIT_UNSETTLED == 8
    assert report(str(run.path), "--fail-on", "slower,faster")[0] == 0


def test_one_repeat_says_no_spread_is_known(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 0.97, 0.0, repeats=1)
    got = reproduce_run(run.path).cells
    assert {c.verdict for c in got} == {SLOWER}
    assert all("no spread known (1 repeat)" in c.detail and c.low is None for c in got)


# ------------------------------------------------------------------ the statistics, exactly
def test_judge_new_run_cases() -> None:
    # 5 repeats, mean 100, sd 1.2748: t(4) = 2.7764, half-width 2.7764 * 1.2748 / sqrt(5) = 1.5828
    est = estimate(100.0, [99.0, 100.0, 101.0, 98.5, 101.5])
    assert est.n == 5 and round(est.low, 3) == 98.417 and round(est.high, 3) == 101.583
    assert judge_new_run(est, 100.5, 2.0)[0] == REPRODUCED
    assert judge_new_run(est, 103.5, 2.0) == (SLOWER, "-3.38% from published, tolerance ±2%, published outside "
                                              "the interval 98.42 .. 101.58")
    assert judge_new_run(est, 97.0, 2.0)[0] == FASTER
    verdict, why = judge_new_run(est, 100.0, 1.0)
    # n=8: 2.3646 * 1.2748 / sqrt(8) = 1.066 > 1; n=9: 2.3060 * 1.2748 / 3 = 0.980
    assert verdict == INCONCLUSIVE and "about 4 more repeat(s)" in why
    assert repeats_needed(est.stdev, 1.0, 5) == 9
    assert judge_new_run(Estimate(97.0, 1), 100.0, 2.0) == (
        SLOWER, "-3.00% from published, tolerance ±2%; no spread known (1 repeat): run more for an interval")


def test_exit_codes_and_fail_on() -> None:
    assert exit_code(["match", "reproduced", "measured"]) == 0
    assert exit_code(["match", "not derivable", "inconclusive"]) == 7
    assert exit_code(["reproduced", "not run"]) == 8
    assert exit_code(["slower", "not run"], parse_fail_on("not-run")) == 8
    assert exit_code(["slower"], parse_fail_on("inconclusive")) == 0
    with pytest.raises(UsageError, match="--fail-on: unknown verdict 'slow'"):
        parse_fail_on("slow,faster")


def test_cli_exit_codes_of_the_published_tables() -> None:
    assert report("perf-2.3-v100")[0] == 0  # 22 of 22 re-derived
    code, out = report("perf-2.5-v100")
    assert code == 7 and "1 not derivable" in out  # 1438.518
    assert report("perf-2.5-v100", "--fail-on", "inconclusive,not-run")[0] == 0
    assert report("paddle-rn50-a100")[0] == 7  # its 8-GPU FP32 figure does not come from its own log
    bad = run_cli("report", "perf-2.5-v100", "--fail-on", "worse", cwd=REPO)
    assert bad.returncode == 2 and "hint: use a comma-separated list of slower, faster" in bad.stderr
    helptext = CliRunner().invoke(cli, ["report", "--help"], terminal_width=200).output
    assert "Exit status: 0 when every cell is reproduced" in helptext and "--fail-on" in helptext


# ------------------------------------------------------------------ outputs
def test_terminal_form_fits_120_columns_and_colours_only_on_request() -> None:
    proc = run_cli("report", "perf-2.5-v100", cwd=REPO)
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 120 and "\x1b[" not in proc.stdout  # a pipe: no colour
    assert "- ngc-pytorch-rn50-v100: parser ngc-pytorch, protocol {skip: {from_iteration: 10}, aggregate: mean}; " \
           "when {gpus: 8}:\n  {skip: {from_iteration: 9}}; when {gpus: 32}: {aggregate: summary}" in proc.stdout
    assert "| GPUs              | PaddlePaddle fp32 bs256              | PaddlePaddle fp16 bs256                     |" \
        in lines
    results = [reproduce_table(m, t) for m, t in resolve_tables(["perf-2.5-v100"])]
    coloured = render_text(results, colour=True)
    assert "\x1b[32mmatch\x1b[0m" in coloured and "\x1b[31mnot derivable\x1b[0m" in coloured
    assert max(len(re.sub(r"\x1b\[[0-9;]*m", "", ln)) for ln in coloured.splitlines()) <= 120


def test_two_publications_stay_two_tables_with_their_citations() -> None:
    code, md = report("perf-2.5-v100", "perf-2.3-v100", "--format", "md")
    assert code == 7
    assert "# perf-2.5-v100: PaddlePaddle/Perf" in md and "# perf-2.3-v100: " in md
    assert "@ c1ad14b35c7b" in md and "@ 9881d04" in md
    assert md.count("Verdict: ") == 2
    results = [reproduce_table(m, t) for m, t in resolve_tables(["perf-2.5-v100", "perf-2.3-v100"])]
    df = pd.read_csv(io.StringIO(render_csv(results)))
    assert df.groupby("table").size().to_dict() == {"perf-2.3-v100": 22, "perf-2.5-v100": 22}


def test_csv_and_json_round_trip_in_pandas(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 0.97, 0.003)
    results = [reproduce_run(run.path), *[reproduce_table(m, t) for m, t in resolve_tables(["perf-2.5-v100"])]]
    expected = norm(pd.DataFrame(records(results)))
    from_csv = raw_text(pd.read_csv(io.StringIO(render_csv(results))))
    from_json = pd.read_json(io.StringIO(render_json(results)), orient="records")
    for got in (from_csv, from_json):
        pd.testing.assert_frame_equal(norm(got), expected)
    assert set(expected["kind"]) == {"new run", "re-derivation"}
    new = expected[expected["kind"] == "new run"]
    assert (new["repeats"] == 5).all() and (new["interval_low"] < new["interval_high"]).all()
    assert new["log"].iloc[0] == "cells/1n1g-fp32-bs256"  # the folder of its repeats, inside the run
    assert not expected["log"].str.startswith("/").any()


def test_csv_is_written_without_pandas_as_pandas_wrote_it(tmp_path: Path) -> None:
    """pandas is in the test extra only: the CSV comes from the standard library, byte for byte what
    ``DataFrame.to_csv`` wrote (a new run's intervals, None, formula-like text)."""
    run = scaled_run(tmp_path, 0.97, 0.003)
    results = [reproduce_run(run.path), *[reproduce_table(m, t) for m, t in resolve_tables(["perf-2.5-a100"])]]
    code = ("import sys, pickle; sys.modules['pandas'] = None; from repro.verdict.report import render_csv; "
            "sys.stdout.write(render_csv(pickle.load(sys.stdin.buffer)))")
    import pickle
    import subprocess
    import sys

    got = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(results), capture_output=True,
                         check=False)
    assert got.returncode == 0, got.stderr.decode()[-2000:]
    from repro.verdict.report import COLUMNS, spreadsheet_safe

    rows = [{k: spreadsheet_safe(v) for k, v in rec.items()} for rec in records(results)]
    assert got.stdout.decode() == pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False)


def test_the_runtime_needs_no_pandas() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {re.split(r"[<>=~ ;\[]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert "pandas" not in runtime
    assert any(d.startswith("pandas") for d in project["optional-dependencies"]["test"])


def raw_text(df: pd.DataFrame) -> pd.DataFrame:
    """The CSV's text cells as they were before a leading ``'`` neutralised a formula (the README's recipe)."""
    for col in df.columns:
        if not pd.api.types.is_numeric_dtype(df[col]):
            df[col] = df[col].str.replace(r"^'(?=[=+\-@\t\r])", "", regex=True)
    return df


def norm(df: pd.DataFrame) -> pd.DataFrame:
    """Missing values as None, numbers as floats: how CSV and JSON may spell the same table."""
    out = df.astype(object).where(df.notna(), None)
    return out.apply(lambda col: col.map(lambda v: float(v) if isinstance(v, int | float) and not isinstance(v, bool)
                                         else v))


def test_junit_is_read_by_a_junit_library(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 0.97, 0.003)
    results = [reproduce_run(run.path)]
    path = tmp_path / "verdicts.xml"
    path.write_text(render_junit(results))
    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert [s.name for s in suites] == ["perf-2.5-v100"] and suites[0].tests == 6 and suites[0].failures == 6
    case = next(iter(suites[0]))
    assert case.name == "1 GPU (1 node) fp32 bs256" and case.classname == "perf-2.5-v100.ngc-pytorch-rn50-v100"
    failure = case.result[0]
    assert isinstance(failure, Failure) and failure.type == "slower" and "published outside the interval" in failure.message
    path.write_text(render_junit(results, parse_fail_on("inconclusive")))
    assert next(iter(JUnitXml.fromfile(str(path)))).failures == 0


def test_junit_skips_cells_with_nothing_to_judge(tmp_path: Path) -> None:
    """`not published` is skipped, never passed; `not run` is skipped where --fail-on does not count it
    (where it does, it is a failure, as the exit status says)."""
    from junitparser import Skipped

    results = [reproduce_table(m, t) for m, t in resolve_tables(["perf-2.5-a100", "tf-benchmarks-ec2-k80-real"])]
    path = tmp_path / "verdicts.xml"

    def kinds(fail_on: str | None) -> dict[str, dict[str, int]]:
        path.write_text(render_junit(results, parse_fail_on(fail_on)))
        out: dict[str, dict[str, int]] = {}
        for suite in JUnitXml.fromfile(str(path)):
            for case in suite:
                kind = type(case.result[0]).__name__ if case.result else "passed"
                out.setdefault(suite.name, {}).setdefault(kind, 0)
                out[suite.name][kind] += 1
            assert suite.skipped == out[suite.name].get("Skipped", 0)
        return out

    assert kinds(None) == {"perf-2.5-a100": {"passed": 13, "Skipped": 2, "Failure": 1},
                           "tf-benchmarks-ec2-k80-real": {"Failure": 19, "Skipped": 1}}
    assert kinds("slower,faster,deviates,not-derivable") == {
        "perf-2.5-a100": {"passed": 13, "Skipped": 2, "Failure": 1},
        "tf-benchmarks-ec2-k80-real": {"Skipped": 20}}
    skipped = next(c for s in JUnitXml.fromfile(str(path)) for c in s if c.result)
    assert isinstance(skipped.result[0], Skipped) and skipped.result[0].message.startswith("not published: ")


def test_html_is_one_self_contained_file(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 0.97, 0.003)
    page = render_html([reproduce_run(run.path)])
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", page.replace("href='https://github.com/", ""))
    assert page.count("src='data:image/png;base64,") == 1
    assert "href='cells/1n1g-fp32-bs256'" in page and "Perf" in page and "slower" in page
    assert "Exit status of this report: 7." in page


def _log_links(page: str) -> list[str]:
    from html import unescape

    return [unescape(h) for h in re.findall(r"<td class=l><a href='([^']*)'>", page)]


def test_html_log_links_of_bundled_logs_open_wherever_the_page_is_read() -> None:
    """A publication's bundled log links to its file in the cited repository at the log set's commit (the
    path inside the repository: logs/published/<set>@<commit>/<group>/ dropped), not to a path of the checkout
    that an installed kit (repro/_data) or a page saved elsewhere does not have."""
    from repro.spec.manifest import load_catalog, manifest_files

    ids = sorted({t.id for m in load_catalog(manifest_files()).values() for t in m.published if any(c.logs for c in t.cells)})
    results = [reproduce_table(m, t) for m, t in resolve_tables(ids)]
    links = {}
    for r in results:
        page = render_html([r], chart=b"")
        bundled = [c.logs for c in r.cells if c.logs]
        assert len(_log_links(page)) == len(bundled), r.manifest.id
        links.update(zip(_log_links(page), [records([r])[i]["log"] for i, c in enumerate(r.cells) if c.logs]))
    assert len(links) == 88  # every cell with a bundled log, across the 10 tables that bundle logs
    web = re.compile(r"https://github\.com/(PaddlePaddle/Perf|Oneflow-Inc/DLPerf|wanghuancoder/PerformanceReport)"
                     r"/(blob|tree)/([0-9a-f]{7,40})/(.+)")
    for href, log in links.items():
        m = web.fullmatch(href)
        assert m, href
        parts = log.split("/")
        assert parts[2].replace("/", "-").endswith("@" + m[3][:7]) and m[4] == "/".join(parts[4:]), (href, log)
        assert m[2] == ("tree" if (REPO / log).is_dir() else "blob")
    assert ("https://github.com/PaddlePaddle/Perf/blob/c1ad14b35c7bf6cce484abab75c6c89b3e0b2f15/ResNet50V1.5/logs/"
            "A100-LOG/PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log") in links
    assert ("https://github.com/Oneflow-Inc/DLPerf/tree/e36df2e/Tensorflow/resnet50v1.5/logs/tensorflow/resnet50/1n1g"
            in links)


def test_html_log_links_of_a_run_open_inside_its_archive(tmp_path: Path) -> None:
    """The page a run keeps (report.html at its root) links its logs relative to the run directory: each
    opens in the archive unpacked anywhere."""
    from repro.record import archive

    run = scaled_run(tmp_path / "runs", 0.97, 0.003)
    run.write_text("report.html", render_html([reproduce_run(run.path)], chart=b""))
    top = archive.extract(archive.create(run), tmp_path / "elsewhere")
    page = (top / "report.html").read_text(encoding="utf-8")
    links = _log_links(page)
    assert links and all(not h.startswith(("/", "http")) and (top / h).exists() for h in links), links


def _png_dpi(path: Path) -> float:
    data = path.read_bytes()
    i = data.index(b"pHYs")
    per_metre = struct.unpack(">I", data[i + 4:i + 8])[0]
    assert zlib.crc32(data[i:i + 13]) == struct.unpack(">I", data[i + 13:i + 17])[0]
    return per_metre * 0.0254


def test_plot_is_a_150_dpi_png(tmp_path: Path) -> None:
    run = scaled_run(tmp_path, 0.97, 0.003)
    out = tmp_path / "chart.png"
    code, _ = report(str(run.path), "--plot", str(out))
    assert code == 7 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and round(_png_dpi(out)) == 150


def test_cpu_targets_count_workers(tmp_path: Path) -> None:
    m = find_target("torch-rn50-cpu")
    run = RunDir.create(tmp_path, m, Hosts((Node("node0", "10.0.0.1", user="root", gpus=0),)))
    log = find_target(TARGET).table().cells[0].logs[0].read_bytes()
    for k in (1, 2, 3):
        run.write_log(Cell(1, 1, "fp32", 8), k, 0, "node0", log)
        run.set_status(Cell(1, 1, "fp32", 8), k, DONE)
    got = reproduce_run(run.path)
    text = render_text([got])
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table[0].startswith("| workers ") and table[2].startswith("| 1 worker (1 node) ")
    assert not any("GPU" in ln for ln in table)
    assert records([got])[0]["device"] == "CPU"


def test_html_of_a_sealed_run_shows_its_environment_against_the_publication(tmp_path: Path) -> None:
    from test_provenance import make_run

    run = make_run(tmp_path, driver_on_last="470.82.01")
    code, page = report(str(run.path), "--format", "html")
    assert code == 0, page[-2000:]
    assert "<h2>Environment and deviations from the published hardware</h2>" in page
    env = page.split("<h2>Environment")[1]
    assert "<td class=l>gpu_model</td><td class=l>ok</td>" in env
    assert "<td class=l>driver</td><td class=l>drift</td>" in env  # one node's driver differs
    assert "href='cells/1n1g-fp32-bs256/r1/0-node0.log'" in page


def test_a_declared_run_tolerance_and_its_reason_are_used(tmp_path: Path) -> None:
    text = (REPO / "manifests" / f"{TARGET}.yaml").read_text(encoding="utf-8")
    declared = ('    unit: images/s\n    run_tolerance: {pct: 5, reason: "this site accepts 5 % slower nodes"}\n')
    assert text.count("    unit: images/s\n") == 1
    path = tmp_path / f"{TARGET}.yaml"
    path.write_text(text.replace("    unit: images/s\n", declared), encoding="utf-8")
    run = scaled_run(tmp_path / "runs", 0.97, 0.003, target=str(path))
    got = records([reproduce_run(run.path)])
    assert {(r["verdict"], r["tolerance_pct"], r["tolerance_reason"]) for r in got} == {
        (REPRODUCED, 5.0, "this site accepts 5 % slower nodes")}
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("    unit: images/s\n", "    unit: images/s\n    run_tolerance: {pct: 5}\n"))
    with pytest.raises(UsageError, match="run_tolerance"):
        find_target(str(bad))


def test_the_end_of_up_writes_the_html_and_gives_the_verdicts(tmp_path: Path) -> None:
    from test_provenance import make_run

    from repro.record.provenance import load_record
    from repro.up import UpResult, finish

    run = make_run(tmp_path)
    result = UpResult(run, find_target(TARGET), record=load_record(run.file("provenance.json")), done=6)
    text = finish(result)
    assert result.verdicts == [REPRODUCED] * 6 and exit_code(result.verdicts) == 0
    table = text.split(f"\nrun {run.path}")[0]  # the closing lines name paths, as long as they are
    assert "| GPUs " in table and max(map(len, table.splitlines())) <= 120
    assert f"report {run.file('report.html')}" in text
    page = run.file("report.html").read_text()
    assert "src='data:image/png;base64," in page and "<td class=l>gpu_model</td><td class=l>ok</td>" in page
    assert "report.html" in run.file("SHA256SUMS").read_text()
