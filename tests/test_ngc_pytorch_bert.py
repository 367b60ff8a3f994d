"""The ngc-pytorch-bert parser and DLPerf's rule for it; the NGC PyTorch BERT command line against DLPerf's script.

No log of these runs was published, so the lines are written as DLE 5cc03caa run_pretraining.py writes them through
DLLogger 26a0f8f's stdout backend (prefix ``DLL <str(datetime)> - ``, utils.format_step, ``name : value `` per
metric). DLPerf's figure (NVIDIADeepLearningExamples/PyTorch/BERT/extract_pytorch_logs_time.py at c89430b, with
--warmup_batches 20 --train_batches 120) is global batch x 100 / (t[20th] - t[120th]) of the step lines after
iteration 5, i.e. iterations 25 and 125.
"""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from repro.measure.parsers import detect, parse_file
from repro.measure.protocol import Protocol, measure
from repro.run.launchers import LAUNCHERS
from repro.spec.hosts import Node
from repro.spec.manifest import Cell, find_target

T0 = datetime(2020, 9, 24, 2, 10, 0, 123456)
PROTO = Protocol(from_iteration=26, window=100, aggregate="harmonic", scale="per_gpu", round_each=2,
                 min_records=100)


def write_log(tmp_path: Path, batch: int, seconds: list[float], fp16: bool = True) -> tuple[Path, list[datetime]]:
    """A log of len(seconds) steps, step k taking seconds[k-1]; returns the stamps of the step lines."""
    lines = [f"device: cuda:0 n_gpu: 1, distributed training: True, 16-bits training: {fp16}\n",
             f"DLL {T0} - PARAMETER train_start : True \n",
             f"DLL {T0} - PARAMETER batch_size_per_gpu : {batch} \n",
             f"DLL {T0} - PARAMETER learning_rate : 0.006 \n"]
    stamps, t = [], T0
    for k, dt in enumerate(seconds, 1):
        t = t + timedelta(seconds=dt)
        stamps.append(t)
        lines.append(f"DLL {t} - Training Epoch: 0 Training Iteration: {k}  average_loss : 10.4 "
                     f" step_loss : 10.3  learning_rate : 6e-05 \n")
    lines.append(f"DLL {t} - Training Epoch: 0 Training Iteration: {len(seconds)}  final_loss : 7.1 \n")
    p = tmp_path / "bert-base-adam-training_b96_fp16_1.log"
    p.write_text("".join(lines))
    return p, stamps


def test_detected_and_facts(tmp_path: Path) -> None:
    p, _ = write_log(tmp_path, 96, [0.2] * 150)
    result = parse_file(p)
    assert result.parser == "ngc-pytorch-bert"
    assert result.facts["batch_size"] == 96 and result.facts["precision"] == "amp"
    assert detect([f"DLL {T0} - PARAMETER batch_size_per_gpu : 64 \n"]).name == "ngc-pytorch-bert"


@pytest.mark.parametrize("gpus", [1, 32])
def test_harmonic_mean_of_the_steps_is_dlperfs_wall_clock_rule(tmp_path: Path, gpus: int) -> None:
    seconds = [0.5 + 0.01 * (k % 7) + (2.0 if k < 6 else 0.0) for k in range(1, 151)]
    p, stamps = write_log(tmp_path, 96, seconds)
    (s,) = parse_file(p).series
    m = measure(s, PROTO, gpus=gpus)
    after5 = stamps[5:]  # the step lines of iterations 6, 7, ...
    dlperf = round(float(gpus * 96) / ((after5[119] - after5[19]).total_seconds() / 100), 2)
    assert m.records_used == 100 and m.value == dlperf


def test_a_short_run_gives_no_figure(tmp_path: Path) -> None:
    p, _ = write_log(tmp_path, 96, [0.2] * 120)  # DLPerf's --prof 150 was needed: 125 steps at least
    (s,) = parse_file(p).series
    assert measure(s, PROTO, gpus=8).value is None


def test_the_final_loss_line_is_no_step(tmp_path: Path) -> None:
    p, _ = write_log(tmp_path, 48, [0.2] * 150, fp16=False)
    result = parse_file(p)
    (s,) = result.series
    assert len(s) == 149 and result.facts["precision"] == "fp32"


#: DLPerf single_node_train.sh's command with train_batch_size=96 num_nodes=4 master_node=10.11.0.2
#: master_port=22334 num_gpus=8 train_steps=150 precision=fp16 (run_multi_nodes.sh), node_rank as edited on the
#: second node; CODEDIR the checkout, the dataset /data/bert/ and the outputs in /tmp/repro-checkpoints
UPSTREAM_4N8G_FP16_RANK1 = (
    "python3 -m torch.distributed.launch --nproc_per_node=8 --nnodes 4 --node_rank=1 --master_addr=10.11.0.2 "
    "--master_port=22334 /workspace/DeepLearningExamples/PyTorch/LanguageModeling/BERT/run_pretraining.py "
    "--input_dir=/data/bert/ --output_dir=/tmp/repro-checkpoints "
    "--config_file=/workspace/DeepLearningExamples/PyTorch/LanguageModeling/BERT/bert_config.json "
    "--bert_model=bert-base-uncased --train_batch_size=96 --max_seq_length=128 --max_predictions_per_seq=20 "
    "--max_steps=150 --warmup_proportion=1 --num_steps_per_checkpoint=1000 --learning_rate=6e-3 --seed=42 --fp16 "
    "--do_train --json-summary /tmp/repro-checkpoints/dllogger.json"
)


def test_the_command_is_dlperfs_with_each_nodes_rank() -> None:
    m = find_target("dlperf-ngc-pytorch-bert-v100")
    nodes = [Node(f"node{i}", f"10.11.0.{i + 2}") for i in range(4)]
    cmds = LAUNCHERS.get(m.launch.kind)().render(m.launch, Cell(4, 8, "amp", 96), nodes, {})
    assert shlex.join(cmds[1].command) == UPSTREAM_4N8G_FP16_RANK1
    assert [shlex.join(c.command) for c in cmds] == [
        UPSTREAM_4N8G_FP16_RANK1.replace("--node_rank=1", f"--node_rank={r}") for r in range(4)]
    (one,) = LAUNCHERS.get(m.launch.kind)().render(m.launch, Cell(1, 1, "fp32", 32), nodes[:1], {})
    assert shlex.join(one.command) == (
        UPSTREAM_4N8G_FP16_RANK1.replace("--nproc_per_node=8 --nnodes 4 --node_rank=1", "--nproc_per_node=1 "
                                         "--nnodes 1 --node_rank=0").replace("--train_batch_size=96",
                                                                              "--train_batch_size=32")
        .replace(" --fp16", ""))
