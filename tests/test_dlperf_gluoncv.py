"""DLPerf's MXNet gluon-cv ResNet-50 target (Oneflow-Inc/DLPerf c89430b MxNet/Classification/RN50v1b): the
gluoncv-imagenet parser on lines made from train_horovod.py's own format strings at gluon-cv f9a8a28 (DLPerf's
README quotes no raw log line), the protocol against extract_mxnet_logs.py's rule, the cited repeats against the
extraction output the README prints, and the rendered command against runner.sh."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from repro.measure.parsers import detect_file, parse_file
from repro.measure.protocol import Protocol, measure
from repro.run.plan import plan_cell
from repro.spec.hosts import load_hosts
from repro.spec.manifest import Cell, find_target

TARGET = "dlperf-mxnet-gluoncv-rn50-v100"
HOSTS = Path(__file__).resolve().parent / "data" / "good" / "hosts-4.yaml"
SNAPSHOT = Path(__file__).resolve().parent / "data" / "dlperf" / "mxnet-gluoncv-README.md"

#: train_horovod.py at f9a8a28 logs through logging.basicConfig(level=INFO) on rank 0: "INFO:root:" + message
ARGS = ("INFO:root:Namespace(auto_aug=False, batch_size=128, crop_ratio=0.875, data_nthreads=8, "
        "dtype='float32', log_interval=1, model='resnet50_v1b', use_rec=True)\n")


def batch_lines(nbatch: int, speed: float) -> str:
    """What rank 0 prints per batch with --log-interval=1 (the patched Speed line's format string
    'Epoch[%d] Batch[%d]\\tSpeed: %.2f samples/sec', after the Loss and Rank lines)."""
    return (f"INFO:root:Epoch[0] Batch[{nbatch}] Loss[6.912]\n"
            f"INFO:root:Epoch[0] Rank[0] Batch[{nbatch}]\taccuracy=0.000977\tlr=0.000000\n"
            f"INFO:root:Epoch[0] Batch[{nbatch}]\tSpeed: {speed:.2f} samples/sec\n")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "rn50_b128_fp32_1.log"
    p.write_text(text, encoding="utf-8")
    return p


def test_speed_lines_are_the_records(tmp_path: Path) -> None:
    text = ARGS + "".join(batch_lines(k, v) for k, v in [(1, 120.5), (2, 384.31), (3, 385.004)])
    text += "INFO:root:Epoch[0]\tSpeed: 380.00 samples/sec\n"  # the epoch's closing line is no batch
    log = write(tmp_path, text)
    assert detect_file(log).name == "gluoncv-imagenet"
    result = parse_file(log, "gluoncv-imagenet")
    (run,) = result.series
    assert [(r.epoch, r.iteration, r.value) for r in run.records] == [(0, 1, 120.5), (0, 2, 384.31), (0, 3, 385.0)]
    assert run.facts["batch_size"] == 128 and run.facts["precision"] == "fp32"
    assert run.facts["model"] == "resnet50_v1b"
    fp16 = write(tmp_path, ARGS.replace("float32", "float16") + batch_lines(1, 800.0) + batch_lines(2, 801.0))
    assert parse_file(fp16, "gluoncv-imagenet").series[0].facts["precision"] == "fp16"


def test_protocol_is_extract_mxnet_logs_rule(tmp_path: Path) -> None:
    """120 Speed lines: the mean of batches 21-120, each first rounded to 2 decimals, rounded to 2."""
    speeds = [380.0 + (k * 7 % 13) * 0.313 for k in range(1, 121)]
    log = write(tmp_path, ARGS + "".join(batch_lines(k, v) for k, v in enumerate(speeds, start=1)))
    protocol = Protocol.from_dict(find_target(TARGET).data["measure"]["protocol"])
    got = measure(parse_file(log, "gluoncv-imagenet").series[0], protocol)
    printed = np.array([round(float(f"{v:.2f}"), 2) for v in speeds]).reshape(120, 1)
    want = round(float(np.mean(np.median(printed, axis=1)[20:120])), 2)
    assert got.records_used == 100 and got.value == want == 381.88


def test_cited_repeats_are_the_printed_extraction_and_give_the_medians() -> None:
    """The README prints each FP32 log's figure as the extraction read it; the cited repeats are those in
    repeat order, and their median and its ratio to the 1-GPU median are the table's figures."""
    last: dict[str, dict[int, str]] = {}
    for m in re.finditer(r"bz128/(\dn\dg)/rn50_b128_fp32_\d\.log \{(.*)\}", SNAPSHOT.read_text(encoding="utf-8")):
        last[m.group(1)] = {int(k): v for k, v in re.findall(r"(\d): ([\d.]+)", m.group(2))}
    table = next(t for t in find_target(TARGET).published if t.id == "dlperf-mxnet-gluoncv-v1")
    fp32 = [c for c in table.cells if c.precision == "fp32"]
    assert len(fp32) == len(last) == 6
    base = float(np.median([float(v) for v in fp32[0].repeats]))
    for c in fp32:
        printed = last[f"{c.nodes}n{c.gpus // c.nodes}g"]
        assert list(c.repeats) == [printed[i] for i in sorted(printed)] and len(c.repeats) == 5
        median = round(float(np.median([float(v) for v in c.repeats])), 2)
        assert f"{median}" == c.value and f"{round(median / base, 2):.2f}" == c.speedup


#: DLPerf MxNet/Classification/RN50v1b/runner.sh at c89430b, its mpirun line and the train_horovod.py flags
RUNNER = r"""mpirun --allow-run-as-root -oversubscribe -np ${gpu_num} -H ${node_ip}  \
     -bind-to none -map-by slot \
     -x LD_LIBRARY_PATH -x PATH \
     -mca pml ob1 -mca btl ^openib \
     -mca plm_rsh_args "-p 22  -q -o StrictHostKeyChecking=no" \
     -mca btl_tcp_if_include ib0   python3 train_horovod.py \
    --mode='hybrid'  \
    --model='resnet50_v1b'  \
    --use-rec \
    --rec-train=$DATA_DIR/train.rec  \
    --rec-val=$DATA_DIR/val.rec  \
    --batch-size=${BATCH_SIZE}   \
    --dtype=${PRECISION}  \
    --log-interval=1  \
    --save-frequency=10000 \
    --lr=0.001  \
    --momentum=0.875  \
    --wd=0.000030518  \
    --num-epochs=1  \
    --warmup-epochs=1"""


def runner(batch: int, precision: str) -> list[str]:
    text = (RUNNER.replace("\\\n", " ").replace("$DATA_DIR", "/datasets/ImageNet/MXNet")
            .replace("${BATCH_SIZE}", str(batch)).replace("${PRECISION}", precision))
    return shlex.split(text)


@pytest.mark.parametrize(("nodes", "per_node", "precision", "batch", "dtype"),
                         [(1, 1, "fp32", 128, "float32"), (1, 2, "fp32", 128, "float32"),
                          (2, 8, "fp16", 256, "float16"), (4, 8, "fp16", 256, "float16")])
def test_command_is_runner_sh(nodes: int, per_node: int, precision: str, batch: int, dtype: str) -> None:
    plans = plan_cell(find_target(TARGET), Cell(nodes, per_node, precision, batch), load_hosts(HOSTS))
    argv = list(plans[0].command.command)
    want = runner(batch, dtype)
    main = argv.index("train_horovod.py")
    assert argv[main - 1:] == want[want.index("python3"):]
    mpi = " ".join(argv[:main - 1])
    # runner.sh's -np and its mpirun options; -H is the kit's hostfile, plm_rsh_args its own ssh agent, and
    # btl_tcp_if_include ib0 the publisher's interface (see the manifest's notes)
    assert mpi.startswith(f"mpirun --allow-run-as-root -np {nodes * per_node} --hostfile ")
    for option in ("--bind-to none", "--map-by slot", "-x PATH -x LD_LIBRARY_PATH", "-oversubscribe",
                   "-mca pml ob1 -mca btl ^openib"):
        assert option in mpi, option
    assert [p.command.role for p in plans[1:]] == ["mpi-sshd"] * (nodes - 1)
