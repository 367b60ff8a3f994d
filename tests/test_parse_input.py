"""What users bring: damaged bytes, files that are no logs, impossible values, too few records,
per-GPU logs, and the JSON shapes of ``repro parse``."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import run_cli
from parsers_helpers import P_9881, P_C1AD, PUBLISHED, T5, a100_logs

from repro.errors import ParseError
from repro.measure.protocol import measure
from repro.measure.parsers import parse_file

ROOT = Path(__file__).resolve().parent.parent
PADDLE_A100 = PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/A100-LOG"
TF_1GPU = PUBLISHED / P_9881 / "ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs/tf_gpu1_fp32_bs256.txt"
PADDLE_8GPU = PUBLISHED / P_C1AD / "paddle/ResNet50V1.5/logs/V100-LOG/PaddleClas_ResNet50_bs256_fp32_DP_N1C8_log"


def repro(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=ROOT)


def _shape(path: Path) -> list:
    return [(s.gpus, s.summary, [(r.value, r.iteration, r.epoch, r.line) for r in s.records])
            for s in parse_file(path).series]


# ---------------------------------------------------------------------------------------------
# damaged bytes in a text log


def test_a100_paddle_logs_with_a_nul_byte_are_read_and_the_byte_counted() -> None:
    lines = {"fp32_DP_N1C1": 161, "fp32_DP_N1C8": 192, "pure_fp16_DP_N1C1": 173, "pure_fp16_DP_N1C8": 205}
    for key, line in lines.items():
        path = PADDLE_A100 / f"PaddleClas_ResNet50_bs256_{key}_log"
        assert b"\0" in path.read_bytes()
        result = parse_file(path)
        assert result.issues == [f"1 NUL/control byte(s) in the text (first on line {line}); read past them"]
        assert len(result.series[0].values) > 50


@pytest.mark.parametrize("junk", [b"\0\0\0", b"\x01\x02\x7f", b"\xff\xfe\xc3(", b"\x1b[0m\0"])
def test_stray_bytes_inside_a_line_change_nothing_but_an_issue(junk: bytes, tmp_path: Path) -> None:
    data = TF_1GPU.read_bytes().split(b"\n")
    data[3] = data[3][:10] + junk + data[3][10:]
    p = tmp_path / "x.log"
    p.write_bytes(b"\n".join(data))
    assert _shape(p) == _shape(TF_1GPU)
    (issue,) = parse_file(p).issues
    assert "(first on line 4); read past them" in issue


def test_a100_fp32_config_with_an_amp_section_that_says_off_is_fp32() -> None:
    for gpus in (1, 8):
        facts = parse_file(PADDLE_A100 / f"PaddleClas_ResNet50_bs256_fp32_DP_N1C{gpus}_log").facts
        assert facts["amp"] is False and facts["precision"] == "fp32"
        facts = parse_file(PADDLE_A100 / f"PaddleClas_ResNet50_bs256_pure_fp16_DP_N1C{gpus}_log").facts
        assert facts["amp"] is True and facts["precision"] == "fp16" and facts["amp_level"] == "O2"


def test_a100_logs_give_the_published_a100_figures() -> None:
    """The TF, PyTorch and MXNet A100 cells re-derive exactly with the V100 rules (reference notes)."""
    from parsers_helpers import MH, Y9, Y10

    published = {"tf_gpu1_fp32": (T5, 1, "975.374"), "tf_gpu1_amp": (T5, 1, "2064.8"),
                 "pytorch_gpu1_fp32": (Y10, 1, "924.989"), "pytorch_gpu8_amp": (Y9, 8, "10744.6"),
                 "mxnet_gpu8_fp32": (MH, 8, "7848.2"), "mxnet_gpu1_amp": (MH, 1, "3046.4")}
    seen = 0
    for path in a100_logs():
        key = path.name.rsplit("_bs", 1)[0]
        if key in published:
            rule, gpus, figure = published[key]
            result = parse_file(path)
            s = next(s for s in result.series if s.gpus == gpus)
            value = measure(s, rule, gpus=gpus).value
            assert f"{value:.{len(figure.partition('.')[2])}f}" == figure, path.name
            seen += 1
    assert seen == len(published)


def test_mostly_binary_is_refused_a_little_is_not(tmp_path: Path) -> None:
    text = TF_1GPU.read_bytes()
    p = tmp_path / "x.log"
    p.write_bytes(bytes(range(256)) * 200 + text)
    with pytest.raises(ParseError, match="looks like a binary file"):
        parse_file(p)
    p.write_bytes(bytes(range(256)) * 2 + text)  # two newlines among them
    assert _shape(p) == [(s[0], s[1], [(v, i, e, ln + 2) for v, i, e, ln in s[2]]) for s in _shape(TF_1GPU)]


def test_cr_only_log_reads_every_record(tmp_path: Path) -> None:
    p = tmp_path / "cr.log"
    p.write_bytes(TF_1GPU.read_bytes().replace(b"\n", b"\r"))
    assert _shape(p) == _shape(TF_1GPU)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_fifo_device_and_directory_are_refused_at_once(kind: str, tmp_path: Path) -> None:
    if kind == "fifo":
        path = tmp_path / "pipe.log"
        os.mkfifo(path)
    else:
        path = Path("/dev/null") if kind == "device" else tmp_path
    done = threading.Event()
    err: list[BaseException] = []

    def run() -> None:
        try:
            parse_file(path)
        except ParseError as e:
            err.append(e)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(5), "parse_file blocked"
    assert err and {"fifo": "is a FIFO", "device": "is a device", "directory": "is a directory"}[kind] in str(err[0])
    start = time.monotonic()
    proc = repro("parse", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and time.monotonic() - start < 60


# ---------------------------------------------------------------------------------------------
# impossible values, too few records


@pytest.mark.parametrize("bad", ["-394.81086", "0.0", "inf", "nan"])
def test_impossible_throughput_refuses_the_log(bad: str, tmp_path: Path) -> None:
    text = TF_1GPU.read_text()
    first = text.index("total_ips : ") + len("total_ips : ")
    end = text.index(" ", first)
    p = tmp_path / "x.log"
    p.write_text(text[:first] + bad + text[end:])
    result = parse_file(p)
    assert result.refused and result.refused.startswith("impossible throughput: 1 value(s)")
    assert result.issues[0] == result.refused
    proc = repro("parse", str(p), "--format", "json")
    assert proc.returncode == 2 and "Infinity" not in proc.stdout and "NaN" not in proc.stdout
    (doc,) = json.loads(proc.stdout)
    assert [r["throughput"] for r in doc["results"]] == [None]
    assert "impossible throughput" in proc.stderr


def test_impossible_value_fails_its_cell_with_the_reason(tmp_path: Path) -> None:
    from repro.spec.manifest import find_target
    from repro.verdict.reproduce import NOT_DERIVABLE, reproduce_table

    m = find_target("ngc-tf1-rn50-v100-2.3")
    t = m.table()
    cell = next(c for c in t.cells if c.gpus == 1 and c.precision == "fp32")
    text = cell.logs[0].read_text()
    at = text.rindex("total_ips : ") + len("total_ips : ")
    (tmp_path / cell.logs[0].name).write_text(text[:at] + "inf" + text[text.index(" ", at):])
    got = next(c for c in reproduce_table(m, t, tmp_path).cells if c.gpus == 1 and c.precision == "fp32")
    assert got.verdict == NOT_DERIVABLE and got.reproduced is None
    assert "impossible throughput" in got.detail


def test_one_record_is_no_figure(tmp_path: Path) -> None:
    lines = TF_1GPU.read_text().splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if "total_ips" in ln)
    p = tmp_path / "one.log"
    p.write_text("".join(lines[: first + 1]))
    proc = repro("parse", str(p))
    assert proc.returncode == 2
    assert "too few records for a figure: 1 used, a log of this format needs at least 5" in proc.stderr


# ---------------------------------------------------------------------------------------------
# --gpus, JSON shapes


def test_gpus_multiplies_per_gpu_figures() -> None:
    per_gpu = json.loads(repro("parse", str(PADDLE_8GPU), "--skip-records", "10", "--format", "json").stdout)
    assert per_gpu[0]["results"][0]["gpus"] == 8  # the log says 8 GPUs: the figure is for 8 GPUs
    stated = per_gpu[0]["results"][0]["throughput"]
    assert f"{stated:.3f}" == "3018.015"  # the documented P10 re-derivation of this log
    one = PUBLISHED / P_9881 / "paddle/ResNet50V1.5/logs/paddle_gpu1_fp32_bs256.txt"
    proc = repro("parse", str(one), "--skip-records", "10")
    assert proc.returncode == 2 and "per-GPU values need the run's GPU count" in proc.stderr
    one_gpu = json.loads(repro("parse", str(one), "--skip-records", "10", "--gpus", "1", "--format", "json").stdout)
    two_gpu = json.loads(repro("parse", str(one), "--skip-records", "10", "--gpus", "2", "--format", "json").stdout)
    assert two_gpu[0]["results"][0]["throughput"] == 2 * one_gpu[0]["results"][0]["throughput"]
    assert f"{one_gpu[0]['results'][0]['throughput']:.3f}" == "389.118"
    tf = json.loads(repro("parse", str(TF_1GPU), "--gpus", "8", "--format", "json").stdout)
    plain = json.loads(repro("parse", str(TF_1GPU), "--format", "json").stdout)
    assert tf[0]["results"][0]["throughput"] == plain[0]["results"][0]["throughput"]  # global figures stay


def test_json_is_always_a_list_and_jsonl_one_object_a_line() -> None:
    mx = str(PUBLISHED / P_9881 / "ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs/mxnet_gpu1_gpu8_amp_bs256.txt")
    one = json.loads(repro("parse", mx, "--format", "json").stdout)
    assert isinstance(one, list) and len(one) == 1 and one[0]["parser"] == "ngc-mxnet"
    two = json.loads(repro("parse", mx, str(TF_1GPU), "--format", "json").stdout)
    assert [d["file"] for d in two] == [mx, str(TF_1GPU)]
    lines = repro("parse", mx, str(TF_1GPU), "--format", "jsonl").stdout.splitlines()
    assert [json.loads(ln) for ln in lines] == two


def test_a_line_of_megabytes_is_read_in_pieces(tmp_path: Path) -> None:
    from repro.measure.parsers.text import MAX_LINE

    lines = TF_1GPU.read_bytes().split(b"\n")
    lines[2] = b"x" * (2 * MAX_LINE + 5)
    p = tmp_path / "long.log"
    p.write_bytes(b"\n".join(lines))
    assert _shape(p) == _shape(TF_1GPU)
    assert parse_file(p).issues == ["1 line(s) longer than 4 MiB were read in pieces"]
    one = tmp_path / "one-line.log"  # one record at the end of one huge line: no figure from it
    one.write_bytes(b"y" * (MAX_LINE + 7) + b" (0, 200) total_ips : 415.4 \n")
    proc = repro("parse", str(one), "--parser", "ngc-tf1")
    assert proc.returncode == 2 and "too few records for a figure: 1 used" in proc.stderr
