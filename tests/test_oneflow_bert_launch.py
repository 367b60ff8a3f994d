"""The OneFlow BERT targets' command lines, exactly as DLPerf's launch script writes them.

Upstream: Oneflow-Inc/DLPerf@c89430b OneFlow/LanguageModeling/BERT/scripts/bert_base_pretrain.sh, called by
launch_all.sh as ``./bert_base_pretrain.sh NUM_NODES GPU_NUM_PER_NODE BSZ IPS`` on every host (IPS the first
NUM_NODES of 10.11.0.2-10.11.0.5 joined with commas). The kit's differences, each on purpose: the script is
run from the benchmark's own directory (``./run_pretraining.py``, not ``./$BENCH_ROOT/run_pretraining.py``
from a copy in ~/oneflow_temp), DATA_ROOT is the container's /data/bert, and AMP cells add --use_fp16
(the script has no precision switch; see the manifest's notes).
"""

from __future__ import annotations

import shlex

import pytest

from repro.run.launchers import LAUNCHERS
from repro.spec.hosts import Node
from repro.spec.manifest import Cell, find_target

#: bert_base_pretrain.sh's python3 line with NUM_NODES=2 GPU_NUM_PER_NODE=8 BSZ_PER_DEVICE=160
#: NODE_IPS=10.11.0.2,10.11.0.3, BENCH_ROOT=. and DATA_ROOT=/data/bert DATA_PART_NUM=32
UPSTREAM_2N8G_BS160 = (
    "python3 ./run_pretraining.py --gpu_num_per_node=8 --num_nodes=2 --node_ips=10.11.0.2,10.11.0.3 "
    "--learning_rate=1e-4 --batch_size_per_device=160 --iter_num=140 --loss_print_every_n_iter=20 "
    "--seq_length=128 --max_predictions_per_seq=20 --num_hidden_layers=12 --num_attention_heads=12 "
    "--max_position_embeddings=512 --type_vocab_size=2 --vocab_size=30522 --attention_probs_dropout_prob=0.1 "
    "--hidden_dropout_prob=0.1 --hidden_size_per_head=64 --data_dir=/data/bert --data_part_num=32 "
    "--log_dir=./log --model_save_every_n_iter=10000 --save_last_snapshot=False --model_save_dir=./snapshots"
)
NODES = [Node("node1", "10.11.0.2"), Node("node2", "10.11.0.3"), Node("node3", "10.11.0.4"),
         Node("node4", "10.11.0.5")]


@pytest.mark.parametrize("target", ["dlperf-oneflow-bert-v100", "dlperf-oneflow-bert-noclip-v100"])
@pytest.mark.parametrize(("precision", "extra"), [("fp32", ""), ("amp", " --use_fp16")])
def test_every_node_runs_the_upstream_command(target: str, precision: str, extra: str) -> None:
    m = find_target(target)
    cmds = LAUNCHERS.get(m.launch.kind)().render(m.launch, Cell(2, 8, precision, 160), NODES[:2],
                                                 m.launch.env_for(Cell(2, 8, precision, 160)))
    assert [c.rank for c in cmds] == [0, 1]
    for c in cmds:
        assert shlex.join(c.command) == UPSTREAM_2N8G_BS160 + extra
        assert c.env == {"PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "INFO"}  # the first as bert_base_pretrain.sh
    assert m.launch.workdir == "/workspace/OneFlow-Benchmark/LanguageModeling/BERT"


def test_one_node_names_its_own_address_and_the_batch() -> None:
    m = find_target("dlperf-oneflow-bert-v100")
    (c,) = LAUNCHERS.get("plain")().render(m.launch, Cell(1, 1, "fp32", 96), NODES[:1], {})
    expected = (UPSTREAM_2N8G_BS160.replace("--gpu_num_per_node=8 --num_nodes=2 --node_ips=10.11.0.2,10.11.0.3",
                                            "--gpu_num_per_node=1 --num_nodes=1 --node_ips=10.11.0.2")
                .replace("--batch_size_per_device=160", "--batch_size_per_device=96"))
    assert shlex.join(c.command) == expected


def test_four_nodes_list_all_four_in_rank_order() -> None:
    m = find_target("dlperf-oneflow-bert-v100")
    cmds = LAUNCHERS.get("plain")().render(m.launch, Cell(4, 8, "fp32", 32), NODES, {})
    assert {shlex.join(c.command).split(" --node_ips=")[1].split()[0] for c in cmds} == {
        "10.11.0.2,10.11.0.3,10.11.0.4,10.11.0.5"}
