"""The tf2-bert parser and DLPerf's rule for it; the TensorFlow 2.x BERT command line against DLPerf's script.

No log of these runs was published, so the lines are written as tensorflow/models r2.3.0
official/modeling/model_training_utils.py logs them through absl (``I<MMDD> <HH:MM:SS.ffffff> <thread>
file:line] Train Step: K/N  / loss = ...``). DLPerf's figure (TensorFlow/bert/extract_tensorflow_logs_time.py at
c89430b, defaults --warmup_batches 20 --train_batches 120) is global batch x 100 / seconds between the clocks of
the 20th and the 120th ``Train Step:`` line.
"""

from __future__ import annotations

import os
import subprocess
import sys

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from repro.measure.parsers import detect, parse_file
from repro.measure.protocol import Protocol, measure
from repro.run.launchers import LAUNCHERS
from repro.spec.hosts import Node
from repro.spec.manifest import Cell, find_target

T0 = datetime(2020, 9, 26, 23, 59, 0, 123456)
PROTO = Protocol(skip_records=19, window=100, aggregate="harmonic", scale="global_batch", round_each=2,
                 min_records=100)


def write_log(tmp_path: Path, seconds: list[float]) -> tuple[Path, list[datetime]]:
    """A log of len(seconds) steps, step k taking seconds[k-1]; returns the stamps of the step lines."""
    lines = ["I0926 23:59:40.000001 140113 run_pretraining.py:190] Training using customized training loop TF 2.0 "
             "with distributed strategy.\n"]
    stamps, t = [], T0
    for k, dt in enumerate(seconds, 1):
        t = t + timedelta(seconds=dt)
        stamps.append(t)
        lines.append(f"I{t:%m%d %H:%M:%S.%f} 140113 model_training_utils.py:444] Train Step: {k}/{len(seconds)}  "
                     f"/ loss = 7.912345657348633\n")
    lines.append(f"I{t:%m%d %H:%M:%S.%f} 140113 model_training_utils.py:478] Final loss 7.91\n")
    p = tmp_path / "bert_b64_fp32_1.log"
    p.write_text("".join(lines))
    return p, stamps


def test_detected() -> None:
    line = "I0926 10:00:01.000100 140113 model_training_utils.py:444] Train Step: 3/120  / loss = 10.1\n"
    assert detect([line]).name == "tf2-bert"


@pytest.mark.parametrize(("gpus", "batch"), [(1, 64), (32, 96)])
def test_harmonic_mean_of_the_steps_is_dlperfs_wall_clock_rule(tmp_path: Path, gpus: int, batch: int) -> None:
    seconds = [0.5 + 0.013 * (k % 7) + (3.0 if k < 4 else 0.0) for k in range(1, 121)]
    p, stamps = write_log(tmp_path, seconds)  # the clock passes midnight between the 20th and the 120th line
    assert stamps[19].day != stamps[119].day
    result = parse_file(p)
    assert result.parser == "tf2-bert"
    (s,) = result.series
    m = measure(s, PROTO, gpus=gpus, batch=batch)
    # the script's clocks have no date (it would take this run's seconds as negative): the next day's
    t1 = datetime.strptime(f"{stamps[19]:%H:%M:%S.%f}", "%H:%M:%S.%f")
    t2 = datetime.strptime(f"{stamps[119]:%H:%M:%S.%f}", "%H:%M:%S.%f") + timedelta(days=1)
    dlperf = round(float(gpus * batch) / ((t2 - t1).total_seconds() / 100), 2)
    assert m.records_used == 100 and m.value == dlperf


def test_a_short_run_gives_no_figure(tmp_path: Path) -> None:
    p, _ = write_log(tmp_path, [0.2] * 119)  # DLPerf's 120 steps are all needed
    (s,) = parse_file(p).series
    assert measure(s, PROTO, gpus=8, batch=64).value is None


#: DLPerf single_node_train.sh's command for bash run_multi_node.sh 96 5 fp16 false 1 (the second node): the
#: batch of all 32 GPUs; the checkout's run_pretraining.py as the Model Garden module, the dataset /datasets/bert as
#: /data/bert and ../output as /tmp/repro-output
UPSTREAM_4N8G_FP16_TASK1 = (
    "python3 -m official.nlp.bert.run_pretraining --input_files=/data/bert/wiki/*.tfrecord --max_seq_length=128 "
    "--max_predictions_per_seq=20 --train_batch_size=3072 --num_steps_per_epoch=120 --num_train_epochs=1 "
    "--warmup_steps=10000 --use_next_sentence_label=True --train_summary_interval=0 --optimizer_type=adamw "
    "--num_gpus=8 --datasets_num_private_threads=8 --dtype=fp16 --enable_xla=false --model_dir=/tmp/repro-output "
    "--bert_config_file=/data/bert/uncased_L-12_H-768_A-12/bert_config.json "
    "--distribution_strategy=multi_worker_mirrored "
    "--worker_hosts=10.11.0.2:11111,10.11.0.3:11111,10.11.0.4:11111,10.11.0.5:11111 --task_index=1 "
    "--all_reduce_alg=nccl"
)


def _line(tokens: tuple[str, ...]) -> str:
    """The argv as DLPerf's unquoted $CMD reads (the input pattern reaches the script as written, unexpanded)."""
    assert not any(c.isspace() for tok in tokens for c in tok)
    return " ".join(tokens)


def test_the_command_is_dlperfs_with_each_nodes_task_index() -> None:
    m = find_target("dlperf-tf2-bert-v100")
    nodes = [Node(f"node{i}", f"10.11.0.{i + 2}") for i in range(4)]
    cmds = LAUNCHERS.get(m.launch.kind)().render(m.launch, Cell(4, 8, "amp", 96), nodes, {})
    assert _line(cmds[1].command) == UPSTREAM_4N8G_FP16_TASK1
    assert [_line(c.command) for c in cmds] == [
        UPSTREAM_4N8G_FP16_TASK1.replace("--task_index=1", f"--task_index={r}") for r in range(4)]
    (one,) = LAUNCHERS.get(m.launch.kind)().render(m.launch, Cell(1, 1, "fp32", 32), nodes[:1], {})
    assert _line(one.command) == (
        UPSTREAM_4N8G_FP16_TASK1.split(" --distribution_strategy")[0].replace("--train_batch_size=3072",
                                                                              "--train_batch_size=32")
        .replace("--num_gpus=8", "--num_gpus=1").replace("--dtype=fp16", "--dtype=fp32"))


def test_the_image_makes_dlperfs_edit_once_and_refuses_other_text(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "dockerfiles" / "tf2-models" / "dlperf-bert-edit.py"
    pkg = tmp_path / "official" / "nlp" / "bert"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "official", tmp_path / "official" / "nlp", pkg):
        (d / "__init__.py").write_text("")
    quoted = ("  strategy = distribution_utils.get_distribution_strategy(\n"
              "      distribution_strategy=FLAGS.distribution_strategy,\n"
              "      num_gpus=FLAGS.num_gpus,\n"
              "      tpu_address=FLAGS.tpu)\n")  # DLPerf TensorFlow/bert/README.md, "LINE 186"
    (pkg / "run_pretraining.py").write_text(f"def main(_):\n{quoted}  run_bert_pretrain(strategy)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = (pkg / "run_pretraining.py").read_text()
    assert "distribution_utils.configure_cluster(\n      FLAGS.worker_hosts,\n      FLAGS.task_index)" in text
    assert "all_reduce_alg=FLAGS.all_reduce_alg" in text and "enable_xla=FLAGS.enable_xla" in text
    again = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "0 times, not once" in again.stderr
