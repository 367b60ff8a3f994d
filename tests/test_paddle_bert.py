"""The paddle-bert parser and DLPerf's rule for it; the PaddlePaddle BERT command line against DLPerf's scripts.

No log of these runs was published, so the lines are written as PaddlePaddle/models b87761f
PaddleNLP/pretrain_language_models/BERT/train.py prints them (its argument dump, the nccl2 trainers line and
``epoch: E, progress: F/N, step: K, loss: ..., speed: S steps/s, file: ...``; DLPerf's extract_paddle_logs.py
quotes the fragment ``, speed: 0.163902 steps/s``). DLPerf's figure (PaddlePaddle/bert/extract_paddle_logs.py at
c89430b, defaults --warmup_batches 20 --train_batches 120) is the mean of S x GPUs of one node x batch per GPU
over the 21st to the 120th line, where S counts the steps of every node.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from repro.measure.parsers import detect, parse_file
from repro.measure.protocol import Protocol, measure
from repro.run.launchers import LAUNCHERS
from repro.spec.hosts import Node
from repro.spec.manifest import Cell, find_target

PROTO = Protocol(skip_records=20, window=100, aggregate="mean", scale="global_batch", round_each=2,
                 min_records=100)
ENDPOINTS = "10.11.0.2:9999,10.11.0.3:9999,10.11.0.4:9999,10.11.0.5:9999"


def write_log(tmp_path: Path, speeds: list[float], trainers: int, fp16: bool = False) -> Path:
    lines = ["-----------  Configuration Arguments -----------\n", "batch_size: 8192\n", "in_tokens: True\n",
             f"use_fp16: {fp16}\n", "------------------------------------------------\n", "Device count 8\n"]
    if trainers > 1:
        lines.append(f"worker_endpoints:{ENDPOINTS.split(',')[:trainers]} trainers_num:{trainers} "
                     "current_endpoint:10.11.0.2:9999               trainer_id:0\n")
    for k, s in enumerate(speeds, 1):
        lines.append("feed_queue size: 70, current learning_rate: 0.000001\n")
        lines.append(f"epoch: 1, progress: 1/1, step: {k}, loss: 10.868433, ppl: 52632.785156, next_sent_acc: "
                     f"0.515625, speed: {s:f} steps/s, file: data/train/demo_wiki_train_50.gz\n")
    p = tmp_path / "bert_b64_fp32_1.log"
    p.write_text("".join(lines))
    return p


def dlperf(speeds: list[float], gpus_per_node: int, batch: int) -> float:
    """extract_paddle_logs.py: S x the node's GPUs x batch, rounded to 4, items 20..119 meaned and rounded to 2."""
    items = [round(float(f"{s:f}") * gpus_per_node * batch, 4) for s in speeds]
    return float(round(np.mean(items[20:120]), 2))


@pytest.mark.parametrize(("nodes", "gpus_per_node"), [(1, 1), (1, 8), (4, 8)])
def test_the_mean_of_the_lines_is_dlperfs_figure(tmp_path: Path, nodes: int, gpus_per_node: int) -> None:
    speeds = [nodes * (1.5 + 0.001 * (k % 9)) + (0.9 if k < 4 else 0.0) for k in range(1, 121)]
    result = parse_file(write_log(tmp_path, speeds, nodes))
    assert result.parser == "paddle-bert" and result.facts["precision"] == "fp32"
    (s,) = result.series
    m = measure(s, PROTO, gpus=nodes * gpus_per_node, batch=64)
    assert m.records_used == 100 and m.value == dlperf(speeds, gpus_per_node, 64)


def test_detected_and_a_short_run_gives_no_figure(tmp_path: Path) -> None:
    line = ("epoch: 1, progress: 1/1, step: 3, loss: 10.8, ppl: 52632.7, next_sent_acc: 0.5, speed: 0.163902 "
            "steps/s, file: data/train/demo_wiki_train_50.gz\n")
    assert detect([line]).name == "paddle-bert"
    (s,) = parse_file(write_log(tmp_path, [1.5] * 119, 1, fp16=True)).series
    assert measure(s, PROTO, gpus=8, batch=64).value is None


#: DLPerf multi_node_train.sh's command for run_multi_node.sh 64 fp16 on the second node (CURRENT_NODE=$NODE2),
#: its two exported variables given through env(1), python3 for python
UPSTREAM_4N8G_FP16_NODE2 = (
    f"env worker_endpoints={ENDPOINTS} current_endpoint=10.11.0.3:9999 python3 -u ./train.py --is_distributed true "
    "--use_cuda true --use_fast_executor true --weight_sharing true --batch_size 8192 --data_dir data/train "
    "--validation_set_dir data/train --bert_config_path data/demo_config/bert_config.json --vocab_path "
    "data/demo_config/vocab.txt --generate_neg_sample true --save_steps 10000 --learning_rate 1e-4 --weight_decay "
    "0.01 --warmup_steps 120 --num_train_steps 120 --max_seq_len 128 --skip_steps 1 --validation_steps 1000 "
    "--use_fp16 True --use_dynamic_loss_scaling True --init_loss_scaling 128.0 --verbose true --checkpoints "
    "../output/paddle/runtime_output/checkpoints"
)


def test_the_command_is_dlperfs_with_each_nodes_endpoint() -> None:
    m = find_target("dlperf-paddle-bert-v100")
    nodes = [Node(f"node{i}", f"10.11.0.{i + 2}") for i in range(4)]
    cell = Cell(4, 8, "amp", 64)
    cmds = LAUNCHERS.get(m.launch.kind)().render(m.launch, cell, nodes, m.launch.env_for(cell))
    assert [" ".join(c.command) for c in cmds] == [
        UPSTREAM_4N8G_FP16_NODE2.replace("current_endpoint=10.11.0.3", f"current_endpoint=10.11.0.{r + 2}")
        for r in range(4)]
    assert cmds[1].env["NCCL_IB_DISABLE"] == "1"
    (one,) = LAUNCHERS.get(m.launch.kind)().render(m.launch, Cell(1, 1, "fp32", 32), nodes[:1], {})
    assert " ".join(one.command) == (  # single_node_train.sh: the same flags, not distributed
        UPSTREAM_4N8G_FP16_NODE2.split(" python3 ")[1].join(["python3 ", ""])
        .replace("--is_distributed true", "--is_distributed false").replace("--batch_size 8192", "--batch_size 4096")
        .replace("--use_fp16 True --use_dynamic_loss_scaling True", "--use_fp16 False --use_dynamic_loss_scaling False"))
