"""Published tables re-derived from the bundled raw logs, through the shipped manifests.

Every expected figure here is a published number (or the documented re-derivation of
one); the protocol that reproduces it comes from the manifest, never from the test.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import run_cli

from repro.spec.manifest import find_target, load_catalog, manifest_files
from repro.verdict.chart import plot_report
from repro.verdict.report import RENDERERS
from repro.verdict.reproduce import (
    MATCH,
    NOT_RUN,
    NOT_DERIVABLE,
    NOT_PUBLISHED,
    is_exact,
    reproduce_table,
    resolve_tables,
)
from repro.verdict.rules import NEW_RUN, REPRODUCED

REPO = Path(__file__).resolve().parent.parent


def table(name: str, from_logs: Path | None = None):
    return [reproduce_table(m, t, from_logs) for m, t in resolve_tables([name])]


def cells(results):
    return [c for r in results for c in r.cells]


def test_perf_2_3_every_published_number_re_derives_exactly() -> None:
    got = cells(table("perf-2.3-v100"))
    # Paddle, TF1, PyTorch: 1/8/32 GPUs x 2 precisions; MXNet: 1/8 GPUs x 2 (two GPU counts per log).
    assert len(got) == 22
    assert {c.target for c in got} == {"paddle-rn50-v100-2.3", "ngc-tf1-rn50-v100-2.3",
                                       "ngc-pytorch-rn50-v100-2.3", "ngc-mxnet-rn50-v100-2.3"}
    not_exact = [(c.target, c.gpus, c.precision, c.published, c.reproduced) for c in got if not c.exact]
    assert not_exact == []
    assert all(c.verdict == MATCH for c in got)


def test_perf_2_5_ngc_columns_exact_paddle_within_deviation_and_one_cell_not_derivable() -> None:
    got = {(c.target, c.gpus, c.precision): c for c in cells(table("perf-2.5-v100"))}
    ngc = [c for c in got.values() if c.target.startswith("ngc-")]
    assert len(ngc) == 16 and all(c.exact and c.verdict == MATCH for c in ngc)
    # The documented re-derivations of the Paddle 2.5 cells (reference README, rule P10).
    assert round(got[("paddle-rn50-v100", 1, "fp32")].reproduced, 3) == 393.567
    assert round(got[("paddle-rn50-v100", 8, "fp32")].reproduced, 3) == 3018.015
    assert round(got[("paddle-rn50-v100", 8, "fp16")].reproduced, 3) == 10943.522
    for key in [("paddle-rn50-v100", 1, "fp32"), ("paddle-rn50-v100", 8, "fp32"), ("paddle-rn50-v100", 8, "fp16")]:
        assert got[key].verdict == MATCH and not got[key].exact
    odd = got[("paddle-rn50-v100", 1, "fp16")]
    assert odd.published == "1438.518"
    assert round(odd.reproduced, 3) == 1432.067
    assert odd.verdict == NOT_DERIVABLE, "1438.518 must never be rounded into a match"
    assert odd.detail == ("published 1438.518 lies above every record the protocol uses from its log "
                          "(1428.560 .. 1434.843), so no window of them gives it; the log gives 1432.067 (-0.45%)")


def test_one_computed_rule_says_a_published_figure_does_not_come_from_its_log() -> None:
    """The same words on every bundled table, computed from the log and never a manifest's note: the two
    Paddle 2.5 cells whose figure lies outside every record their protocol uses, and no other cell."""
    found = {}
    for name in sorted({t.id for m in load_catalog(manifest_files()).values() for t in m.published}):
        for c in cells(table(name)):
            if c.verdict == NOT_DERIVABLE and c.reproduced is not None:
                found[(name, c.target, c.gpus, c.precision)] = c.detail
    assert found == {
        ("perf-2.5-a100", "paddle-rn50-a100", 8, "fp32"):
            "published 5333.558 (666.695 per GPU) lies above every record the protocol uses from its log "
            "(419.132 .. 602.569 per GPU), so no window of them gives it; the log gives 4388.648 (-17.72%)",
        ("perf-2.5-v100", "paddle-rn50-v100", 1, "fp16"):
            "published 1438.518 lies above every record the protocol uses from its log (1428.560 .. 1434.843), "
            "so no window of them gives it; the log gives 1432.067 (-0.45%)",
    }


def test_dlperf_tf2_medians_speedups_and_repeats() -> None:
    published = {  # DLPerf README: case -> (median, speedup, per-repeat values)
        1: ("321.8", "1", [320.18, 321.22, 321.80, 322.25, 323.90]),
        2: ("574.66", "1.79", [563.93, 571.71, 574.66, 575.76, 580.55]),
        4: ("1143.46", "3.55", [1122.51, 1128.34, 1143.46, 1145.76, 1167.06]),
        8: ("2458.74", "7.64", [2441.07, 2455.28, 2458.74, 2480.44, 2494.22]),
        16: ("4849.68", "15.07", [4789.87, 4829.93, 4849.68, 4864.58, 4918.45]),
        32: ("9418.44", "29.27", [9369.06, 9402.51, 9418.44, 9420.23, 9454.31]),
    }
    got = {c.gpus: c for c in cells(table("dlperf-tf2-rn50-v100"))}
    assert sorted(got) == sorted(published)
    for gpus, (median, speedup, repeats) in published.items():
        c = got[gpus]
        assert c.published == median and c.exact and c.verdict == MATCH
        assert sorted(c.repeats) == repeats
        assert c.speedup == float(speedup)


def test_published_repeats_are_checked_when_no_log_exists() -> None:
    got = {c.gpus: c for c in cells(table("dlperf-ngc-pytorch-rn50-v100")) if c.precision == "amp"}
    assert all(c.verdict == NOT_RUN and c.reproduced is None for c in got.values())
    assert "give median 22551.16, consistent with the published 22551.16" in got[32].detail


def test_dlperf_ngc_pytorch_cites_every_speedup_and_the_static_loss_scale_table() -> None:
    # DLPerf NVIDIADeepLearningExamples/PyTorch/resnet50v1.5/README.md @c89430b: the three tables
    published = {("fp32", 1): ("367.29", "1.00"), ("fp32", 4): ("1449.48", "3.95"), ("fp32", 8): ("2887.65", "7.86"),
                 ("fp32", 16): ("5716.79", "15.56"), ("fp32", 32): ("10917.09", "29.72"),
                 ("amp", 1): ("802.9", "1.00"), ("amp", 4): ("3137.44", "3.91"), ("amp", 8): ("6154.66", "7.67"),
                 ("amp", 16): ("11991.94", "14.94"), ("amp", 32): ("22551.16", "28.09")}
    got = {(c.precision, c.gpus): c for c in cells(table("dlperf-ngc-pytorch-rn50-v100"))}
    assert {k: (c.published, c.published_speedup) for k, c in got.items()} == published
    for (prec, gpus), (value, sp) in published.items():
        assert f"gives speedup {float(sp)}, consistent with the published {sp}" in got[(prec, gpus)].detail
    static = {c.gpus: c for c in cells(table("dlperf-ngc-pytorch-v1-static"))}
    assert {g: (c.precision, c.batch_size, c.published, c.published_speedup) for g, c in static.items()} == {
        1: ("amp", 256, "827.86", "1.00"), 4: ("amp", 256, "3253.68", "3.93"), 8: ("amp", 256, "6446.74", "7.79")}
    md = RENDERERS["md"](table("dlperf-ngc-pytorch-v1-static"))
    assert "| 4 GPUs (1 node) | published x3.93 |" in md


def test_a_published_speedup_that_its_own_figures_do_not_give_is_flagged() -> None:
    m = find_target("dlperf-ngc-pytorch-rn50-v100-static")
    t = m.table()
    wrong = replace(t, cells=(t.cells[0], replace(t.cells[1], speedup="3.99"), t.cells[2]))
    got = {c.gpus: c for c in reproduce_table(m, wrong).cells}
    assert "gives speedup 3.93, INCONSISTENT with the published 3.99" in got[4].detail


def test_targets_without_bundled_logs_say_no_log() -> None:
    got = [c for c in cells(table("dlperf-ngc-pytorch-rn50-v100")) if c.precision == "fp32"]
    assert got and all(c.verdict == NOT_RUN and c.reproduced is None for c in got)


A100 = {  # PaddlePaddle/Perf@c1ad14b ResNet50V1.5/README.md, A100-FP32 and A100-AMP tables
    ("paddle-rn50-a100", 1, "fp32"): "908.244", ("paddle-rn50-a100", 8, "fp32"): "5333.558",
    ("paddle-rn50-a100", 1, "fp16"): "2602.629", ("paddle-rn50-a100", 8, "fp16"): "17587.654",
    ("ngc-tf1-rn50-a100", 1, "fp32"): "975.374", ("ngc-tf1-rn50-a100", 8, "fp32"): None,
    ("ngc-tf1-rn50-a100", 1, "amp"): "2064.8", ("ngc-tf1-rn50-a100", 8, "amp"): None,
    ("ngc-pytorch-rn50-a100", 1, "fp32"): "924.989", ("ngc-pytorch-rn50-a100", 8, "fp32"): "7020.9",
    ("ngc-pytorch-rn50-a100", 1, "amp"): "1449.65", ("ngc-pytorch-rn50-a100", 8, "amp"): "10744.6",
    ("ngc-mxnet-rn50-a100", 1, "fp32"): "1015.8", ("ngc-mxnet-rn50-a100", 8, "fp32"): "7848.2",
    ("ngc-mxnet-rn50-a100", 1, "fp16"): "3046.4", ("ngc-mxnet-rn50-a100", 8, "fp16"): "22690",
}


def test_perf_2_5_a100_every_cell_from_its_log_or_not_published() -> None:
    got = {(c.target, c.gpus, c.precision): c for c in cells(table("perf-2.5-a100"))}
    assert {k: c.published for k, c in got.items()} == A100
    dashes = [c for c in got.values() if c.published is None]
    assert len(dashes) == 2 and all(c.verdict == NOT_PUBLISHED and c.reproduced is None and c.logs == [] for c in dashes)
    derived = [c for c in got.values() if c.published is not None]
    assert len(derived) == 14 and all(len(c.logs) == 1 and "A100" in c.logs[0] for c in derived)
    assert all(c.exact and c.verdict == MATCH for c in derived if not c.target.startswith("paddle"))
    # Paddle 2.5 cells: within 0.1 % as on V100, each with its reason; 8-GPU FP32 is not its log's figure.
    for gpus, prec, value in [(1, "fp32", 908.246), (1, "fp16", 2602.554), (8, "fp16", 17598.478)]:
        c = got[("paddle-rn50-a100", gpus, prec)]
        assert round(c.reproduced, 3) == value and c.verdict == MATCH and not c.exact and "within 0.1 %" in c.detail
    odd = got[("paddle-rn50-a100", 8, "fp32")]  # 5333.558 / 8 = 666.7 a GPU, above every record after P10
    assert round(odd.reproduced, 1) == 4388.6 and odd.verdict == NOT_DERIVABLE
    assert "666.695 per GPU" in odd.detail and "602.569 per GPU" in odd.detail and "-17.72%" in odd.detail


def test_perf_2_5_a100_markdown() -> None:
    md = RENDERERS["md"](table("perf-2.5-a100"))
    assert ("| 8 GPUs (1 node) | 7848.2 → 7848.21 (exact) match | 22690 → 22690.0 (exact) match  "
            "| 7020.9 → 7020.90 (exact) match   | 10744.6 → 10744.60 (exact) match | — (not published)                "
            "| — (not published)               | 5333.558 → 4388.6484 (-17.72%) not derivable "
            "| 17587.654 → 17598.4784 (+0.06%) match |") in md
    assert ("- ngc-tf1-rn50-a100 8 GPUs amp bs256: not published: the table prints - (no 8-GPU A100 TF run; no log)"
            in md)
    assert md.rstrip().endswith("Verdict: 13 match, 2 not published, 1 not derivable of 16 cells.")


def test_user_logs_directory_and_insufficient_records(tmp_path: Path) -> None:
    m = find_target("ngc-tf1-rn50-v100-2.3")
    t = m.table()
    one, short = t.cells[0], t.cells[1]
    # your own log of that cell (one more line than the publication's): a new run, not a re-derivation
    (tmp_path / one.logs[0].name).write_bytes(one.logs[0].read_bytes() + b"\n")
    # a run cut off after its first displayed records: fewer than the protocol skips
    lines = short.logs[0].read_text(encoding="utf-8").splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if "total_ips" in ln)
    (tmp_path / short.logs[0].name).write_text("".join(lines[: first + 3]), encoding="utf-8")
    got = {(c.gpus, c.precision): c for c in reproduce_table(m, t, tmp_path).cells}
    copied = got[(one.gpus, one.precision)]  # your log, not the publication's: a new run of one repeat
    assert (copied.kind, copied.verdict) == (NEW_RUN, REPRODUCED) and "no spread known (1 repeat)" in copied.detail
    cut = got[(short.gpus, short.precision)]
    assert cut.verdict == NOT_DERIVABLE and cut.reproduced is None
    assert "insufficient records: found 3, need 6" in cut.detail
    others = [c for k, c in got.items() if k not in {(one.gpus, one.precision), (short.gpus, short.precision)}]
    assert others and all(c.verdict == NOT_RUN for c in others)


def test_json_csv_and_markdown_forms() -> None:
    results = table("paddle-rn50-v100-2.3")
    recs = json.loads(RENDERERS["json"](results))
    assert {r["table"] for r in recs} == {"perf-2.3-v100"} and {r["unit"] for r in recs} == {"images/s"}
    assert {(c["gpus"], c["published"]) for c in recs} >= {(1, 389.12), (32, 39972.131)}
    assert recs[0]["log"].startswith("logs/published/")  # relative, never a local absolute path
    csv = RENDERERS["csv"](results).splitlines()
    assert csv[0] == ("table,target,framework,model,kind,nodes,gpus,device,precision,batch_size,published,reproduced,"
                      "interval_low,interval_high,repeats,spread_pct,delta_pct,verdict,reason,unit,tolerance_pct,"
                      "tolerance_reason,published_speedup,speedup,efficiency,log")
    assert len(csv) == 7
    md = RENDERERS["md"](results)
    assert "| 1 GPU (1 node)    | 389.12 → 389.118 (exact) match" in md
    assert md.rstrip().endswith("Verdict: 6 match of 6 cells.")


def test_is_exact_rounds_the_decimal_figure_half_up() -> None:
    assert is_exact(363.765, "363.77") and not is_exact(363.7649, "363.77")
    assert is_exact(10493.8, "10494") and is_exact(1173.3849, "1173.38")


def test_plot_is_a_png(tmp_path: Path) -> None:
    out = tmp_path / "scaling.png"
    plot_report(table("perf-2.5-v100"), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def repro(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=REPO)


def test_cli_report_and_parse() -> None:
    proc = repro("report", "perf-2.3-v100", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert all(c["verdict"] == "match" for c in json.loads(proc.stdout))
    bad = repro("report", "no-such-table")
    assert bad.returncode == 2 and "unknown target or published table 'no-such-table'" in bad.stderr
    mx = repro("parse", "logs/published/PaddlePaddle-Perf@9881d04/ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs/"
                        "mxnet_gpu1_gpu8_amp_bs256.txt", "--skip-records", "1", "--aggregate", "harmonic", "--format", "json")
    assert mx.returncode == 0, mx.stderr
    (doc,) = json.loads(mx.stdout)  # always a list, one object a log
    assert doc["parser"] == "ngc-mxnet" and doc["detected"] is True
    assert [(r["gpus"], f"{r['throughput']:.5g}") for r in doc["results"]] == [(1, "1359.4"), (8, "10494")]


@pytest.mark.parametrize("content", [b"", b"\x00\x01\x02binary\xff" * 50])
def test_cli_parse_rejects_empty_and_binary(tmp_path: Path, content: bytes) -> None:
    f = tmp_path / "x.log"
    f.write_bytes(content)
    proc = repro("parse", str(f))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_cli_parse_reads_several_logs_in_one_process(tmp_path: Path) -> None:
    mx = ("logs/published/PaddlePaddle-Perf@9881d04/ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs/"
          "mxnet_gpu1_gpu8_amp_bs256.txt")
    tf = "logs/published/PaddlePaddle-Perf@c1ad14b/ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs/V100_LOG/tf_gpu1_amp_bs256.txt"
    one = [doc for log in (mx, tf) for doc in json.loads(repro("parse", log, "--format", "json").stdout)]
    for jobs in ("1", "2"):  # one process for all, and two workers
        both = repro("parse", mx, tf, "--format", "json", "--jobs", jobs)
        assert both.returncode == 0, both.stderr
        assert json.loads(both.stdout) == one  # the same figures, in the same order, as one log a call
    text = repro("parse", mx, tf)
    assert text.returncode == 0 and [ln.split(":")[0] for ln in text.stdout.splitlines() if not ln[0].isspace()] == [mx, tf]
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    bad = repro("parse", mx, str(empty), "--format", "json")
    docs = json.loads(bad.stdout)
    assert [d.get("parser") for d in docs] == ["ngc-mxnet", None] and "the file is empty" in docs[1]["error"]
    assert bad.returncode == 2 and bad.stderr.startswith("error: 1 of 2 logs gave no figure:")
    assert f"\n  {empty}: the file is empty" in bad.stderr and "Traceback" not in bad.stderr


# TensorFlow benchmarks page, tensorflow/tensorflow@5984ffe tensorflow/docs_src/performance/benchmarks.md:
# columns InceptionV3, ResNet-50, ResNet-152, AlexNet, VGG16; rows 1/2/4/8 GPUs ("-" where the page prints N/A).
K80 = {
    "tf-benchmarks-gce-k80-synthetic": ["30.5 51.9 20.0 656 35.4", "57.8 99.0 38.2 1209 64.8",
                                        "116 195 75.8 2328 120", "227 387 148 4640 234"],
    "tf-benchmarks-gce-k80-real": ["30.6 51.2 20.0 639 34.2", "58.4 98.8 38.3 1136 62.9",
                                   "115 194 75.4 2067 118", "225 381 148 4056 230"],
    "tf-benchmarks-ec2-k80-synthetic": ["30.8 51.5 19.7 684 36.3", "58.7 98.0 37.6 1244 69.4",
                                        "117 195 74.9 2479 141", "230 384 149 4853 260"],
    "tf-benchmarks-ec2-k80-real": ["30.5 51.3 19.7 674 36.3", "59.0 94.9 38.2 1227 67.5",
                                   "118 188 75.2 2201 136", "228 373 149 - 242"],
}
K80_COLUMNS = ["InceptionV3", "ResNet-50", "ResNet-152", "AlexNet", "VGG16"]
K80_BATCH = {"InceptionV3": 64, "ResNet-50": 64, "ResNet-152": 32, "AlexNet": 512, "VGG16": 32}


@pytest.mark.parametrize("table_id", sorted(K80))
def test_k80_single_server_tables_cite_every_number(table_id: str) -> None:
    got = {(c.column, c.gpus): c for c in cells(table(table_id))}
    want = {(col, gpus): v for gpus, row in zip([1, 2, 4, 8], K80[table_id])
            for col, v in zip(K80_COLUMNS, row.split())}
    assert {k: (c.published or "-") for k, c in got.items()} == want
    assert all(c.batch_size == K80_BATCH[col] and c.nodes == 1 for (col, _), c in got.items())
    assert all(c.verdict == (NOT_PUBLISHED if c.published is None else NOT_RUN) for c in got.values())


def test_k80_distributed_table_cites_every_number() -> None:
    got = {(c.column, c.nodes, c.gpus): c.published for c in cells(table("tf-benchmarks-ec2-k80-distributed-synthetic"))}
    rows = [(1, 1, "29.7 52.4 19.4"), (1, 8, "229 378 146"), (2, 16, "459 751 291"), (4, 32, "902 1388 565"),
            (8, 64, "1783 2744 981")]
    assert got == {(col, n, g): v for n, g, row in rows for col, v in zip(K80_COLUMNS[:3], row.split())}


def test_non_monotonic_scaling_speaks_of_the_targets_devices() -> None:
    """A CPU target scales over workers, a GPU target over GPUs; the note says which."""
    from repro.verdict.report import notes
    from repro.verdict.reproduce import CellResult, TableResult

    def result(target: str, table) -> TableResult:  # noqa: ANN001
        cells = [CellResult(target, "col", n, n, "fp32", 8, None, reproduced=v, verdict="measured")
                 for n, v in ((1, 30.0), (2, 20.0))]
        return TableResult(find_target(target), table, cells, "logs")

    assert notes([result("torch-rn50-cpu", None)])[-2] == \
        "- non-monotonic scaling: col fp32 bs8: 20.00 images/s on 2 workers is below 30.00 on 1"
    gpu = find_target("ngc-pytorch-rn50-v100")
    assert notes([result("ngc-pytorch-rn50-v100", gpu.published[0])])[-2] == \
        "- non-monotonic scaling: col fp32 bs8: 20.00 images/s on 2 GPUs is below 30.00 on 1"


def test_the_2020_12_perfreport_tables_re_derive_from_their_bundled_logs() -> None:
    """wanghuancoder/PerformanceReport: MXNet 19.07 (train.total_ips tables of DLE 99b1c89's code), TF1 20.06
    (train_throughput, cut to three decimals by the publisher) and PyTorch 20.07 (Summary total_ips)."""
    expected = {"ngc-mxnet-rn50-v100-19.07": 4, "ngc-tf1-rn50-v100-20.06": 6, "ngc-pytorch-rn50-v100-20.07": 8}
    for target, n in expected.items():
        got = cells(table(target))
        assert len(got) == n and {c.verdict for c in got} == {MATCH}, [(c.verdict, c.detail) for c in got]
        assert all(c.kind == "re-derivation" and len(c.logs) == 1 for c in got)
        exact = {c.exact for c in got}
        assert exact == ({True, False} if "tf1" in target else {True}), target  # 408.3205 cut to "408.320"
    mx = {(c.precision, c.batch_size): c.reproduced for c in cells(table("ngc-mxnet-rn50-v100-19.07"))}
    assert mx == {("fp32", 128): 376.18, ("fp32", 256): 381.62, ("fp16", 128): 1301.4, ("fp16", 256): 1398.8}
