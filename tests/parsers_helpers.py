"""Shared data for the parser and measurement tests: every bundled publisher log, the rule that
reproduces its published figure, and generators of damaged copies of a log.

The figures and rules are those of ``logs/published/README.md`` and the reference notes it
summarises (rules P10, T5, TT, Y10/Y9, YS, YC, MH, D).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from pathlib import Path

from repro.measure.protocol import Protocol
from repro.measure.parsers import ParseResult

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "logs" / "published"

P_9881 = "PaddlePaddle-Perf@9881d04"
P_C1AD = "PaddlePaddle-Perf@c1ad14b"
DLPERF_LOGS = "DLPerf@e36df2e/tf2-keras/Tensorflow/resnet50v1.5/logs/tensorflow/resnet50"

# the publishers' rules as protocols (see logs/published/README.md)
P10 = Protocol(skip_records=10, scale="per_gpu")  # PaddleClas: drop 10 records, mean, x GPUs
T5 = Protocol(skip_records=5)  # NGC TF1 1/8 GPU: drop 5 displayed records, mean
TT = Protocol(aggregate="summary")  # NGC TF1 32 GPU: printed train_throughput
Y10 = Protocol(from_iteration=10)  # NGC PyTorch 1 GPU
Y9 = Protocol(from_iteration=9)  # NGC PyTorch 8 GPU
YS = Protocol(aggregate="summary")  # NGC PyTorch 32 GPU: printed Summary total_ips
YC = Protocol(aggregate="summary", summary_metric="train.compute_ips")  # the Summary's compute_ips (e15decee)
MH = Protocol(skip_records=1, aggregate="harmonic")  # NGC MXNet benchmark.py: epochs 1..2
MS = Protocol(aggregate="summary")  # NGC MXNet 19.07 benchmark.py: printed train.total_ips table
D = Protocol(skip_records=1, round_each=2)  # DLPerf TF2 Keras: intervals 2..6, 2 decimals


@dataclass(frozen=True)
class Case:
    """One published figure and the log + rule that reproduce it."""

    path: str  # under logs/published
    parser: str
    rule: Protocol
    gpus: int
    published: str  # as printed in the publisher's table
    exact: bool = True
    rederived: str | None = None  # documented value when not exact
    # the publisher first printed the value with 3 decimals and then rounded that text, half
    # up, to the table's precision (363.7649 -> "363.765" -> "363.77")
    via_3_decimals: bool = False
    truncated: bool = False  # the publisher cut the value to the table's decimals (408.32054 -> "408.320")

    @property
    def id(self) -> str:
        return f"{self.path.split('/')[0]}:{Path(self.path).name}:{self.gpus}g"

    @property
    def digits(self) -> int:
        s = self.rederived or self.published
        return len(s.split(".")[1]) if "." in s else 0

    def printed(self, value: float) -> str:
        """``value`` as the publisher would print it in this table cell."""
        if self.truncated:
            return str(Decimal(repr(value)).quantize(Decimal(1).scaleb(-self.digits), rounding=ROUND_DOWN))
        if self.via_3_decimals:
            three = Decimal(f"{value:.3f}")
            return str(three.quantize(Decimal(1).scaleb(-self.digits), rounding=ROUND_HALF_UP))
        return f"{round(value, self.digits):.{self.digits}f}"


def _paddle_2_3() -> list[Case]:
    base = f"{P_9881}/paddle/ResNet50V1.5/logs"
    figures = {
        ("fp32", 1): "389.12",
        ("pure_fp16", 1): "1444.94",
        ("fp32", 8): "2946.29",
        ("pure_fp16", 8): "10649.90",
        ("fp32", 32): "10984.436",
        ("pure_fp16", 32): "39972.131",
    }
    return [
        Case(f"{base}/paddle_gpu{g}_{p}_bs256.txt", "paddleclas", P10, g, v) for (p, g), v in figures.items()
    ]


def _paddle_2_5() -> list[Case]:
    base = f"{P_C1AD}/paddle/ResNet50V1.5/logs/V100-LOG"
    # (published, re-derived with P10 at 3 decimals); none is exact, see the README
    figures = {
        ("fp32", 1): ("393.561", "393.567"),
        ("pure_fp16", 1): ("1438.518", "1432.067"),
        ("fp32", 8): ("3019.361", "3018.015"),
        ("pure_fp16", 8): ("10936.815", "10943.522"),
    }
    return [
        Case(f"{base}/PaddleClas_ResNet50_bs256_{p}_DP_N1C{g}_log", "paddleclas", P10, g, pub, False, red)
        for (p, g), (pub, red) in figures.items()
    ]


def _tf1() -> list[Case]:
    old = f"{P_9881}/ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs"
    new = f"{old.replace(P_9881, P_C1AD)}/V100_LOG"
    return [
        Case(f"{old}/tf_gpu1_fp32_bs256.txt", "ngc-tf1", T5, 1, "414.73"),
        Case(f"{old}/tf_gpu1_amp_bs256.txt", "ngc-tf1", T5, 1, "1173.38"),
        Case(f"{old}/tf_gpu8_fp32_bs256.txt", "ngc-tf1", T5, 8, "3275.93"),
        Case(f"{old}/tf_gpu8_amp_bs256.txt", "ngc-tf1", T5, 8, "9310.31"),
        Case(f"{old}/tf_gpu32_fp32_bs256.txt", "ngc-tf1", TT, 32, "12671.9"),
        Case(f"{old}/tf_gpu32_amp_bs256.txt", "ngc-tf1", TT, 32, "33317.67"),
        Case(f"{new}/tf_gpu1_fp32_bs256.txt", "ngc-tf1", T5, 1, "415.786"),
        Case(f"{new}/tf_gpu1_amp_bs256.txt", "ngc-tf1", T5, 1, "1218.82"),
        Case(f"{new}/tf_gpu8_fp32_bs256.txt", "ngc-tf1", T5, 8, "3273.03"),
        Case(f"{new}/tf_gpu8_amp_bs256.txt", "ngc-tf1", T5, 8, "9405.36"),
    ]


def _pytorch() -> list[Case]:
    old = f"{P_9881}/ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs"
    new = f"{old.replace(P_9881, P_C1AD)}/V100-LOG"
    return [
        Case(f"{old}/pytorch_gpu1_fp32_bs256.txt", "ngc-pytorch", Y10, 1, "363.77", via_3_decimals=True),
        Case(f"{old}/pytorch_gpu1_amp_bs256.txt", "ngc-pytorch", Y10, 1, "773.30"),
        Case(f"{old}/pytorch_gpu8_fp32_bs256.txt", "ngc-pytorch", Y9, 8, "2787.43"),
        Case(f"{old}/pytorch_gpu8_amp_bs256.txt", "ngc-pytorch", Y9, 8, "5811.26"),
        Case(f"{old}/pytorch_gpu32_fp32_bs256.txt", "ngc-pytorch", YS, 32, "10523.32"),
        Case(f"{old}/pytorch_gpu32_amp_bs256.txt", "ngc-pytorch", YS, 32, "21259.81"),
        Case(f"{new}/pytorch_gpu1_fp32_bs256.txt", "ngc-pytorch", Y10, 1, "370.194"),
        Case(f"{new}/pytorch_gpu1_amp_bs256.txt", "ngc-pytorch", Y10, 1, "790.033"),
        Case(f"{new}/pytorch_gpu8_fp32_bs256.txt", "ngc-pytorch", Y9, 8, "2791.98"),
        Case(f"{new}/pytorch_gpu8_amp_bs256.txt", "ngc-pytorch", Y9, 8, "5889.05"),
    ]


def _mxnet() -> list[Case]:
    old = f"{P_9881}/ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs"
    new = f"{old.replace(P_9881, P_C1AD)}/V100_LOG"
    return [
        Case(f"{old}/mxnet_gpu1_gpu8_fp32_bs256.txt", "ngc-mxnet", MH, 1, "380.55"),
        Case(f"{old}/mxnet_gpu1_gpu8_fp32_bs256.txt", "ngc-mxnet", MH, 8, "3002.8"),
        Case(f"{old}/mxnet_gpu1_gpu8_amp_bs256.txt", "ngc-mxnet", MH, 1, "1359.4"),
        Case(f"{old}/mxnet_gpu1_gpu8_amp_bs256.txt", "ngc-mxnet", MH, 8, "10494"),
        Case(f"{new}/mxnet_gpu1_fp32_bs128.txt", "ngc-mxnet", MH, 1, "389.54"),
        Case(f"{new}/mxnet_gpu8_fp32_bs128.txt", "ngc-mxnet", MH, 8, "2957.8"),
        Case(f"{new}/mxnet_gpu1_amp_bs256.txt", "ngc-mxnet", MH, 1, "1471.9"),
        Case(f"{new}/mxnet_gpu8_amp_bs256.txt", "ngc-mxnet", MH, 8, "10336"),
    ]


PERFREPORT = "wanghuancoder-PerformanceReport"


def _perfreport() -> list[Case]:
    """The 2020-12 per-framework reports of the comparison plan's draft (19.07 MXNet, 20.06 TF1, 20.07 PyTorch)."""
    mx = f"{PERFREPORT}@d53a112/ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs"
    tf = f"{PERFREPORT}@0669deb/ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs"
    pt = f"{PERFREPORT}@03bffd5/ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs"
    mxnet = {("fp32", 128): "376.18", ("fp32", 256): "381.62", ("amp", 128): "1301.4", ("amp", 256): "1398.8"}
    tf1 = {(1, "fp32", 128): "408.320", (1, "amp", 128): "954.940", (1, "amp", 256): "978.827",
           (8, "fp32", 128): "3105.256", (8, "amp", 128): "7829.922", (8, "amp", 256): "7810.758"}
    pytorch = {(1, "fp32", 128): "356.77", (1, "fp32", 256): "372.76", (1, "amp", 128): "782.43",
               (1, "amp", 256): "798.15", (8, "fp32", 128): "2742.41", (8, "fp32", 256): "2884.68",
               (8, "amp", 128): "5715.58", (8, "amp", 256): "6007.61"}
    return ([Case(f"{mx}/mxnet_gpu1_gpu8_{p}_bs{b}.txt", "ngc-mxnet", MS, 1, v) for (p, b), v in mxnet.items()]
            + [Case(f"{tf}/tf_gpu{g}_{p}_bs{b}.txt", "ngc-tf1", TT, g, v, truncated=True) for (g, p, b), v in tf1.items()]
            + [Case(f"{pt}/pytorch_gpu{g}_{p}_bs{b}.txt", "ngc-pytorch", YS, g, v) for (g, p, b), v in pytorch.items()]
            + _perfreport_later_and_main())


def _perfreport_later_and_main() -> list[Case]:
    """The MXNet re-run with 1 and 8 GPUs in each file (b517482, printed by the MXNet README at cfc5f34), and
    the TF1/PyTorch logs of the comparison table at e15decee (its MXNet column is the d53a112 files)."""
    mx = f"{PERFREPORT}@b517482/ngc-mxnet/ResNet50V1.5/OtherReports/MxNet/logs"
    mxnet = {("fp32", 128): ("381.46", "2948.2"), ("fp32", 256): ("384.72", "2987.9"),
             ("amp", 128): ("1316.7", "9500.5"), ("amp", 256): ("1412", "10440")}
    tf = f"{PERFREPORT}@e15dece/ngc-tf1/ResNet50V1.5/OtherReports/TensorFlow/logs"
    pt = f"{PERFREPORT}@e15dece/ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs"
    return ([Case(f"{mx}/mxnet_gpu1_gpu8_{p}_bs{b}.txt", "ngc-mxnet", MS, g, v)
             for (p, b), row in mxnet.items() for g, v in zip((1, 8), row)]
            + [Case(f"{tf}/tf_gpu1_fp32_bs128.txt", "ngc-tf1", TT, 1, "398.257", truncated=True),
               Case(f"{tf}/tf_gpu1_amp_bs256.txt", "ngc-tf1", TT, 1, "985.466", truncated=True),  # 985.46694
               Case(f"{pt}/pytorch_gpu1_fp32_bs128.txt", "ngc-pytorch", YS, 1, "355.69"),
               # the table prints the Summary's train.compute_ips (797.38), not its train.total_ips (794.40)
               Case(f"{pt}/pytorch_gpu1_amp_bs256.txt", "ngc-pytorch", YC, 1, "797.38")])


#: DLPerf TF 2.x Keras, FP32 bs128: (case, GPUs, per-repeat values sorted, median, speedup)
DLPERF = [
    ("1n1g", 1, ["320.18", "321.22", "321.80", "322.25", "323.90"], "321.8", "1"),
    ("1n2g", 2, ["563.93", "571.71", "574.66", "575.76", "580.55"], "574.66", "1.79"),
    ("1n4g", 4, ["1122.51", "1128.34", "1143.46", "1145.76", "1167.06"], "1143.46", "3.55"),
    ("1n8g", 8, ["2441.07", "2455.28", "2458.74", "2480.44", "2494.22"], "2458.74", "7.64"),
    ("2n8g", 16, ["4789.87", "4829.93", "4849.68", "4864.58", "4918.45"], "4849.68", "15.07"),
    ("4n8g", 32, ["9369.06", "9402.51", "9418.44", "9420.23", "9454.31"], "9418.44", "29.27"),
]


def _dlperf() -> list[Case]:
    """One case per repeat log; its 'published' figure is the per-repeat value (rule D)."""
    out = []
    for case, gpus, _, _, _ in DLPERF:
        for k in range(1, 6):
            out.append(Case(f"{DLPERF_LOGS}/{case}/rn50_b128_fp32_{k}.log", "tf2-keras", D, gpus, ""))
    return out


CASES: list[Case] = _paddle_2_3() + _paddle_2_5() + _tf1() + _pytorch() + _mxnet() + _perfreport()
DLPERF_CASES: list[Case] = _dlperf()
ALL_CASES: list[Case] = CASES + DLPERF_CASES


def reference_logs() -> list[Path]:
    """Every bundled log with a published figure case (the README, .gitattributes and DLPerf's
    result JSON are not logs; the A100 logs are checked by their own table: see a100_logs())."""
    return sorted(
        p
        for p in PUBLISHED.rglob("*")
        if p.is_file() and p.name not in ("README.md", ".gitattributes") and p.suffix != ".json"
        and "A100" not in str(p.relative_to(PUBLISHED))
    )


def a100_logs() -> list[Path]:
    """The A100 logs of PaddlePaddle/Perf@c1ad14b."""
    return sorted(p for p in (PUBLISHED / P_C1AD).rglob("*") if p.is_file() and "A100" in str(p))


def representative_logs() -> list[Path]:
    """All Perf logs plus one repeat of each DLPerf case (the other repeats are the same format)."""
    return [p for p in reference_logs() if "DLPerf@" not in str(p) or p.name == "rn50_b128_fp32_1.log"]


# ---------------------------------------------------------------------------------------------
# damaged copies of a log

JUNK = [
    "NCCL INFO Bootstrap : Using eth0:10.10.0.1<0>",
    "vs002:1234:1290 [0] NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7",
    "vs002:1234:1290 [3] NCCL INFO Ring 01 : 3[3] -> 4[4] via P2P/IPC/read",
    (
        "/usr/lib/python3.8/site-packages/torch/optim/lr_scheduler.py:131: UserWarning: Detected call of "
        "`lr_scheduler.step()` before `optimizer.step()`."
    ),
    '  warnings.warn("Detected call of `lr_scheduler.step()` before `optimizer.step()`. "',
    (
        "WARNING:tensorflow:Callback method `on_train_batch_end` is slow compared to the batch time "
        "(batch time: 0.0400s vs `on_train_batch_end` time: 0.0590s). Check your callbacks."
    ),
    "Traceback (most recent call last):",
    '  File "/workspace/rn50/dali.py", line 83, in <module>',
    '    self.cmnp = ops.CropMirrorNormalize(device="gpu",',
    "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error",
    "W0606 15:22:59.025491  4653 gpu_context.cc:278] Please NOTE: device: 0, GPU Compute Capability: 7.0",
    "ips: 127.0.0.1",
    "\t",
    "",
    "Epoch 00001: saving model to ../output/model.ckpt-0001",
    "\x1b[32m[INFO]\x1b[0m throughput sampler warming up \u2026 \u6b63\u5728\u8bad\u7ec3",
]


def crlf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


def mpi_tagged(data: bytes, timestamp: bool = False) -> bytes:
    """Tag every line the way orterun does (rank 0, stdout), optionally with --timestamp-output."""
    stamp = b"Mon Jun 13 17:45:27 2022" if timestamp else b""
    lines = data.split(b"\n")
    tagged = [stamp + b"[1,0]<stdout>:" + line if line else line for line in lines]
    return b"\n".join(tagged)


def with_junk(data: bytes, seed: int, every: int = 3) -> bytes:
    """Insert junk lines (NCCL chatter, warnings, a traceback) between lines, deterministically."""
    rnd = random.Random(seed)
    out: list[bytes] = []
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if i and rnd.randrange(every) == 0:
            out.extend(j.encode() for j in rnd.sample(JUNK, 3))
        out.append(line)
    return b"\n".join(out)


def cut_inside_line(data: bytes, line: int, keep: float = 0.5) -> bytes:
    """Everything before 1-based ``line`` plus the first ``keep`` of that line (no newline)."""
    lines = data.split(b"\n")
    text = lines[line - 1]
    return b"\n".join(lines[: line - 1] + [text[: max(1, int(len(text) * keep))]])


def spliced_tags(data: bytes, seed: int, every: int = 4, timestamp: bool = False) -> bytes:
    """Tag every line, and splice more tags into the middle of some lines, as Open MPI does when
    a rank writes a line in several pieces or ranks write at once (deterministic)."""
    rnd = random.Random(seed)
    stamp = b"Mon Jun 13 17:45:27 2022" if timestamp else b""
    out = []
    for line in mpi_tagged(data, timestamp).split(b"\n"):
        if len(line) > 40 and rnd.randrange(every) == 0:
            at = rnd.randrange(len(stamp) + 15, len(line))
            tag = f"[1,{rnd.randrange(8)}]<std{rnd.choice(['out', 'err'])}>:".encode()
            line = line[:at] + stamp + tag + line[at:]
        out.append(line)
    return b"\n".join(out)


def full(result: ParseResult) -> tuple:
    """Everything a parse found, records with their line numbers, in comparable form."""
    return (
        result.parser,
        result.lines,
        result.facts,
        result.issues,
        [(s.gpus, s.summary, s.per_gpu, list(s.records)) for s in result.series],
    )


def parameter_lines() -> list[str]:
    """Every bundled PARAMETER line, and 20k generated ones: keys inside values and inside other
    keys, blank runs of every length, tabs, empty values."""
    lines = []
    for path in reference_logs():
        lines += re.findall(r"PARAMETER (\w+ : [^\n]*)", path.read_text(errors="replace"))
    assert len(lines) > 20
    rng = random.Random(5)
    keys = ["amp", "xamp", "amp_x", "a", "batch_size", "gpus", "mode", "dali"]
    values = ["", "1", "True", "a b", "[0, 1]", "a : b", "amp : 3", " amp", "p q  ", "\t", "k : v :", "\x1c"]
    for _ in range(20000):
        items = []
        for _ in range(rng.randint(0, 8)):
            k, v = rng.choice(keys), rng.choice(values)
            items.append(rng.choice([f"{k} : {v}", f"{k} :", f"{k}: {v}", f"{k} :{v}", v]))
        seps = [rng.choice(["  ", "   ", "    ", " ", "\t ", "  \t", " \t  ", "\t"]) for _ in items]
        lines.append(rng.choice(["", " ", "  "]) + "".join(i + s for i, s in zip(items, seps)))
    return lines
