"""Logs that print step times (PyTorch examples imagenet, Paddle 1.8 PaddleCV) and how DLPerf turned them
into images/s; the DLPerf PyTorch-examples and Paddle targets' commands against the scripts they mirror.

DLPerf's rules (Oneflow-Inc/DLPerf c89430b): PyTorch/resnet50v1.5/extract_pytorch_logs_time.py keeps the
"Epoch:" lines with iteration > 5, in file order (every rank of the node prints into the one log), and
gives node_num x GPUs x batch / mean(Time of lines 21..120); PaddlePaddle/resnet50v1.5/extract_paddle_logs.py
gives the mean over lines 20..119 of total_batch_size / elapse, each rounded to 4 decimals."""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from repro.measure.parsers import parse_file
from repro.measure.protocol import Protocol, measure
from repro.run.plan import plan_cell
from repro.spec.hosts import load_hosts
from repro.spec.manifest import Cell, find_target

DATA = Path(__file__).resolve().parent / "data"
HOSTS = load_hosts(DATA / "good" / "hosts-4.yaml")


def figure(log: Path, target: str, gpus: int, batch: int) -> float | None:
    m = find_target(target)
    protocol = Protocol.from_dict(m.measure.protocol)
    result = parse_file(log, m.measure.parser, protocol)
    return measure(result.series[0], protocol, gpus=gpus, batch=batch).value


# --- PyTorch examples ----------------------------------------------------------------------------------------


def test_the_readmes_quoted_pytorch_lines_are_read_as_step_rates(tmp_path: Path) -> None:
    """The log excerpts DLPerf's PyTorch README quotes (2 and 4 nodes; real lines of its runs)."""
    readme = (DATA / "dlperf-b" / "PyTorch" / "resnet50v1.5" / "README.md").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in readme.splitlines() if ln.strip().startswith("Epoch: [0][")]
    (tmp_path / "r50.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = parse_file(tmp_path / "r50.log")
    assert result.parser == "pytorch-examples" and result.issues == []
    (series,) = result.series
    assert len(series) == 28 == len(lines)
    assert series.iterations[:3] == [0, 1, 2] and series.iterations[-1] == 5
    assert series.values[0] == 1 / 12.054 and series.values[11] == 1 / 0.532  # [0/53] 12.054 .. [14/53] 0.532


def _pytorch_log(ranks: int, steps: int, seed: int) -> tuple[str, list[tuple[int, float]]]:
    """A node's log as main.py (49ec0bd) prints it: each rank's ProgressMeter lines, ranks interleaved."""
    rng, out, order = random.Random(seed), [], []
    for i in range(steps):
        for _ in range(ranks):
            t = round(rng.uniform(0.33, 0.41), 3) if i else 12.054
            order.append((i, t))
            out.append(f"Epoch: [0][{i:>4}/1251]\tTime {t:6.3f} ({t:6.3f})\tData  0.106 ( 0.075)\t"
                       f"Loss 6.9828e+00 (6.9828e+00)\tAcc@1   0.78 (  0.78)\tAcc@5   1.56 (  1.56)")
        if i == 3:
            out.append("Use GPU: 6 for training")
    return "\n".join(out) + "\n", order


def dlperf_pytorch(order: list[tuple[int, float]], total_batch: int) -> float:
    """extract_pytorch_logs_time.py's figure of one log, as its loop computes it."""
    times = [t for i, t in order if i > 5][20:120]
    assert len(times) == 100
    return round(float(total_batch / (sum(times) / 100)), 2)


@pytest.mark.parametrize("gpus,steps", [(1, 151), (8, 40)])
def test_pytorch_examples_figure_is_dlperfs(tmp_path: Path, gpus: int, steps: int) -> None:
    text, order = _pytorch_log(gpus, steps, seed=gpus)
    (tmp_path / "r50_b128_fp32_1.log").write_text(text, encoding="utf-8")
    got = figure(tmp_path / "r50_b128_fp32_1.log", "dlperf-pytorch-rn50-v100", gpus, 128)
    assert got == dlperf_pytorch(order, 128 * gpus)


def test_too_few_pytorch_lines_give_no_figure(tmp_path: Path) -> None:
    """DLPerf's script gives 0 for a log without 120 lines after iteration 5; the kit gives none."""
    text, _ = _pytorch_log(1, 125, seed=3)
    (tmp_path / "short.log").write_text(text, encoding="utf-8")
    assert figure(tmp_path / "short.log", "dlperf-pytorch-rn50-v100", 1, 128) is None


def test_step_rates_without_the_batch_give_no_figure_and_say_why(tmp_path: Path) -> None:
    text, _ = _pytorch_log(1, 151, seed=4)
    (tmp_path / "r.log").write_text(text, encoding="utf-8")
    protocol = Protocol.from_dict(find_target("dlperf-pytorch-rn50-v100").measure.protocol)
    m = measure(parse_file(tmp_path / "r.log", "pytorch-examples", protocol).series[0], protocol, gpus=1)
    assert m.value is None and m.issues == [
        "figures from step times need the run's batch size per GPU; the log does not say it and none was given"]


def test_a_zero_step_time_refuses_the_log(tmp_path: Path) -> None:
    (tmp_path / "z.log").write_text("Epoch: [0][   0/10]\tTime  0.000 ( 0.000)\tData  0.1 ( 0.1)\n", encoding="utf-8")
    assert parse_file(tmp_path / "z.log").refused.startswith("impossible throughput")


# --- Paddle 1.8 PaddleCV -------------------------------------------------------------------------------------

_DUMP = ("INFO:utils.utility:-------------  Configuration Arguments -------------\n"
         "INFO:utils.utility:               batch_size : {batch}\n"
         "INFO:utils.utility:                 use_dali : {dali}\n"
         "INFO:utils.utility:                 use_fp16 : {fp16}\n"
         "INFO:utils.utility:----------------------------------------------------\n")


def _paddle_log(steps: int, seed: int, fp16: bool, batch: int) -> tuple[str, list[float]]:
    """Trainer 0's log as train.py / utils/utility.py print_info (PaddleCV release/1.8) write it."""
    rng, out, times = random.Random(seed), [_DUMP.format(batch=batch, dali=False, fp16=fp16)], []
    for i in range(steps):
        t = round(rng.uniform(0.26, 0.30), 4) if i else 9.8713
        times.append(t)
        out.append("INFO:utils.utility:[Pass 0, train batch {0}] \tloss {1}, acc1 {2}, acc5 {3}, lr {4}, elapse {5}\n"
                   .format(i, "7.01234", "0.00000", "0.00781", "0.00100", "%2.4f sec" % t))
    return "".join(out), times


def dlperf_paddle(times: list[float], total_batch: int) -> float:
    """extract_paddle_logs.py's figure of one log."""
    speeds = [round(total_batch / t, 4) for t in times]
    return float(round(np.mean(speeds[20:120]), 2))


@pytest.mark.parametrize("gpus,fp16,batch", [(1, False, 128), (32, True, 224), (8, True, 196)])
def test_paddlecv_figure_is_dlperfs(tmp_path: Path, gpus: int, fp16: bool, batch: int) -> None:
    text, times = _paddle_log(120, seed=gpus, fp16=fp16, batch=batch * min(gpus, 8))
    (tmp_path / "r50.log").write_text(text, encoding="utf-8")
    result = parse_file(tmp_path / "r50.log")
    assert result.parser == "paddlecv-18"
    assert result.facts == {"amp": fp16, "precision": "amp" if fp16 else "fp32", "dali": False}
    assert figure(tmp_path / "r50.log", "dlperf-paddle-rn50-v100", gpus, batch) == dlperf_paddle(times, batch * gpus)


def test_paddlecv_test_lines_are_not_steps(tmp_path: Path) -> None:
    text, _ = _paddle_log(30, seed=1, fp16=False, batch=128)
    text += "INFO:utils.utility:[Pass 0, test  batch 0] \tloss 7.1, acc1 0.0, acc5 0.0, elapse 0.1000 sec\n"
    (tmp_path / "r.log").write_text(text, encoding="utf-8")
    assert len(parse_file(tmp_path / "r.log").series[0]) == 30


# --- the commands, against DLPerf's scripts ------------------------------------------------------------------


def command(target: str, cell: Cell, rank: int = 0) -> str:
    return shlex.join(plan_cell(find_target(target), cell, HOSTS)[rank].command.command)


def test_pytorch_examples_commands_are_the_scripts() -> None:
    """PyTorch/resnet50v1.5/scripts/single_node_train.sh (c89430b) as run_multi_nodes.sh calls it on the
    third node: CMD is main.py --arch ... --rank, then the data directory; the node rank is what DLPerf
    edited by hand, the data directory the kit's mount."""
    script = ("python main.py --arch resnet50 --epochs 1 --batch-size 1024 --lr 1.024 --workers 8 --momentum 0.125 "
              "--print-freq 1 --multiprocessing-distributed --dist-backend nccl --dist-url tcp://10.11.0.2:11222 "
              "--world-size 4 --rank 2 /data/imagenet")
    assert command("dlperf-pytorch-rn50-v100-w8", Cell(4, 8, "fp32", 128), rank=2) == script
    assert command("dlperf-pytorch-rn50-v100", Cell(4, 8, "fp32", 128), rank=2) == script.replace(
        "--workers 8", "--workers 48")
    assert command("dlperf-pytorch-rn50-v100", Cell(1, 4, "fp32", 128)).startswith(
        "python main.py --arch resnet50 --epochs 1 --batch-size 512 --lr 0.512 --workers 48 ")


#: PaddlePaddle/resnet50v1.5/scripts/single_node_train.sh (c89430b), 8 GPUs, FP32, USE_DALI=false: the
#: train.py arguments in the script's order
PADDLE_SINGLE = ("--data_format=NCHW --data_dir=/data/imagenet --total_images=1302936 --class_dim=1000 "
                 "--validate=False --model=ResNet50 --batch_size=1024 --print_step=1 --save_step=10000 "
                 "--reader_thread=8 --lr_strategy=cosine_decay --lr=0.001 --momentum_rate=0.875 "
                 "--image_shape 3 224 224 --max_iter=120 --model_save_dir=output/ --l2_decay=0.000030518 "
                 "--warm_up_epochs=1 --use_mixup=False --use_label_smoothing=True --use_dali=false "
                 "--label_smoothing_epsilon=0.1")
#: multi_node_train.sh, 4 nodes, FP16 bs224 (FP16_PARAMS, then the arguments in the script's order)
PADDLE_MULTI = ("--use_fp16=True --use_dynamic_loss_scaling=true --scale_loss=128.0 --fuse_elewise_add_act_ops=true "
                "--fuse_bn_act_ops=true --data_format=NHWC --reader_thread=8 --data_dir=/data/imagenet "
                "--total_images=1302936 --class_dim=1000 --validate=False --batch_size=1792 --image_shape 3 224 224 "
                "--print_step=1 --save_step=10000 --lr_strategy=piecewise_decay --lr=0.001 --momentum_rate=0.875 "
                "--max_iter=120 --model=ResNet50 --model_save_dir=output/ --l2_decay=0.000030518 "
                "--warm_up_epochs=1 --use_mixup=False --use_label_smoothing=True --label_smoothing_epsilon=0.1")


def _args(text: str) -> list[str]:
    """Arguments as argparse sees them: flags with their values, in any order."""
    return sorted(re.sub(r"--image_shape 3 224 224", "--image_shape=3,224,224", text).split())


def test_paddle_commands_are_the_scripts() -> None:
    """The launcher part is exact; train.py's arguments are the script's, the per-cell ones (reader threads,
    LR strategy, --use_dali) gathered in one place: argparse reads them in any order."""
    one = command("dlperf-paddle-rn50-v100", Cell(1, 8, "fp32", 128))
    head, _, args = one.partition(" train.py ")
    assert head == "python3 -m paddle.distributed.launch --cluster_node_ips=10.11.0.2 --node_ip=10.11.0.2"
    assert _args(args) == _args(PADDLE_SINGLE)
    four = command("dlperf-paddle-rn50-v100", Cell(4, 8, "amp", 224), rank=1)
    head, _, args = four.partition(" train.py ")
    assert head == ("python3 -m paddle.distributed.launch --cluster_node_ips=10.11.0.2,10.11.0.3,10.11.0.4,10.11.0.5 "
                    "--node_ip=10.11.0.3")
    assert _args(args) == _args(PADDLE_MULTI)
    static = command("dlperf-paddle-rn50-v100-static", Cell(4, 8, "amp", 224), rank=1)
    assert _args(static.partition(" train.py ")[2]) == _args(
        PADDLE_MULTI.replace("--use_dynamic_loss_scaling=true", "--use_dynamic_loss_scaling=false"))


@pytest.mark.parametrize("nodes,gpus,dali,threads,fraction", [
    (1, 1, "--use_dali=true", "--reader_thread=10", "0.8"),
    (1, 4, "--use_dali=true", "--reader_thread=10", "0.8"),
    (2, 8, None, "--reader_thread=10", "0.8"),  # multi_node_train.sh passes no --use_dali
])
def test_paddle_dali_cells_as_the_scripts_with_use_dali_true(nodes: int, gpus: int, dali: str | None,
                                                             threads: str, fraction: str) -> None:
    plan = plan_cell(find_target("dlperf-paddle-rn50-v100"), Cell(nodes, gpus, "amp", 196), HOSTS)[0]
    args = plan.command.command
    assert [a for a in args if a.startswith("--use_dali")] == ([dali] if dali else [])
    assert [a for a in args if a.startswith("--reader_thread")] == [threads]
    assert plan.command.env["FLAGS_fraction_of_gpu_memory_to_use"] == fraction
    assert f"--batch_size={196 * gpus}" in args


def test_repro_parse_gives_a_step_time_log_its_figure_with_the_batch(tmp_path: Path) -> None:
    text, order = _pytorch_log(8, 40, seed=8)
    (tmp_path / "r.log").write_text(text, encoding="utf-8")
    rule = ["--from-iteration", "6", "--skip-records", "20", "--window", "100", "--aggregate", "harmonic",
            "--gpus", "8", "--format", "json"]
    proc = run_cli("parse", tmp_path / "r.log", *rule, "--batch-size", "128")
    assert proc.returncode == 0, proc.stderr
    (out,) = json.loads(proc.stdout)
    assert round(out["results"][0]["throughput"], 2) == dlperf_pytorch(order, 1024)
    proc = run_cli("parse", tmp_path / "r.log", *rule)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "(give it with --batch-size B)" in proc.stderr
