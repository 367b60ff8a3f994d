"""DLPerf's OneFlow, NGC TF1 and NGC MXNet ResNet-50 targets: the OneFlow-Benchmark log parser on the train
lines DLPerf quotes, the protocols against DLPerf's own extraction rules, and each rendered command against the
upstream script it mirrors (Oneflow-Inc/DLPerf at c89430bac64f64caabb0445ff7eb80175641454c)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from repro.measure.parsers import detect_file, parse_file
from repro.measure.protocol import Protocol, measure
from repro.run.plan import plan_cell
from repro.spec.hosts import load_hosts
from repro.spec.manifest import Cell, find_target

HOSTS = Path(__file__).resolve().parent / "data" / "good" / "hosts-4.yaml"
ONEFLOW, TF1, TF1_XLA = "dlperf-oneflow-rn50-v100", "dlperf-ngc-tf1-rn50-v100", "dlperf-ngc-tf1-rn50-v100-xla"
MXNET = "dlperf-ngc-mxnet-rn50-v100"

#: DLPerf OneFlow/Classification/ConvNets/resnet50v1.5/extract_cnn_result.py, the docstring of
#: extract_info_from_file: two train lines of a 2-node 8-GPU bs128 log
QUOTED = ("train: epoch 0, iter 20, loss: 7.087004, top_1: 0.000000, top_k: 0.000000, samples/s: 3988.891 "
          "1597933942.9863544\n",
          "train: epoch 0, iter 120, loss: 1.050499, top_1: 1.000000, top_k: 1.000000, samples/s: 5917.583 "
          "1597933977.6064055\n")

#: the argument dump of OneFlow-Benchmark Classification/cnns/config.py print_args (v0.2.0), abridged to the
#: lines the parser reads (its format: "=" x 66, "Running {model}: num_gpu_per_node = {}, num_nodes = {}.",
#: then "{arg} = {value}" per argument)
DUMP = ("=" * 66 + "\nRunning resnet50: num_gpu_per_node = 8, num_nodes = 2.\n" + "=" * 66 + "\n"
        "batch_size_per_device = 128\nuse_fp16 = None\nnode_ips = ['10.11.0.2', '10.11.0.3']\n" + "-" * 66 + "\n")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "r50_b128_fp32_1.log"
    p.write_text(text, encoding="utf-8")
    return p


def test_oneflow_train_lines_are_records_with_their_iteration(tmp_path: Path) -> None:
    log = write(tmp_path, DUMP + QUOTED[0] + "validation: epoch 0, iter 100, top_1: 0.0, top_k: 0.0, "
                "samples/s: 100.000 1597933950.0\n" + QUOTED[1])
    assert detect_file(log).__name__ == "OneflowCnns"
    (run,) = parse_file(log).series
    assert [(r.iteration, r.value) for r in run.records] == [(20, 3988.891), (120, 5917.583)]
    assert run.gpus == 16
    assert {k: run.facts[k] for k in ("batch_size", "nodes", "gpus", "precision", "amp")} == {
        "batch_size": 128, "nodes": 2, "gpus": 16, "precision": "fp32", "amp": False}


def test_oneflow_fp16_dump_is_amp(tmp_path: Path) -> None:
    log = write(tmp_path, DUMP.replace("use_fp16 = None", "use_fp16 = True") + "".join(QUOTED))
    (run,) = parse_file(log).series
    assert (run.facts["precision"], run.facts["amp"]) == ("amp", True)


def oneflow_log(stamps: list[float], batch: int = 2048) -> str:
    """A run whose lines every 20 iterations carry the samples/s OneFlow-Benchmark's Metric prints (the
    samples since the last line over the time since it, 3 decimals) and the timestamp."""
    lines = [DUMP]
    for k, t in enumerate(stamps):
        rate = batch * 20 / (t - stamps[k - 1]) if k else 1000.0
        lines.append(f"train: epoch 0, iter {20 * (k + 1)}, loss: 6.9, top_1: 0.0, top_k: 0.0, "
                     f"samples/s: {rate:.3f} {t}\n")
    return "".join(lines)


def test_oneflow_protocol_is_dlperfs_timestamp_rule(tmp_path: Path) -> None:
    """extract_util.compute_throughput: total batch x (120 - 20) / (t[120] - t[20]); the manifest's protocol
    (the harmonic mean of the samples/s of iterations 40-120) gives it to the printed precision."""
    stamps = [100.0, 106.91, 113.85, 120.72, 127.70, 134.61]  # iterations 20, 40, ..., 120
    log = write(tmp_path, oneflow_log(stamps))
    dlperf = 2048 * (120 - 20) / (stamps[-1] - stamps[0])
    protocol = Protocol.from_dict(find_target(ONEFLOW).data["measure"]["protocol"])
    got = measure(parse_file(log).series[0], protocol)
    assert got.records_used == 5 and got.value == pytest.approx(dlperf, rel=1e-6)
    short = write(tmp_path, oneflow_log(stamps[:5]))  # no iteration 120: fewer than the protocol needs
    assert measure(parse_file(short).series[0], protocol).value is None


# --- the rendered commands against the upstream scripts ---------------------------------------------------

#: DLPerf OneFlow/Classification/ConvNets/resnet50v1.5/scripts/rn50_train.sh, the python3 command with
#: NUM_NODES=2 GPU_NUM_PER_NODE=8 BSZ_PER_DEVICE=256 NODE_IPS=10.11.0.2,10.11.0.3 (NUM_EXAMPLES =
#: 2 x 8 x 256 x 120, DATA_ROOT the kit's mount, --use_fp16 as the script has it)
RN50_TRAIN = """python3 ./cnns/of_cnn_train_val.py --num_examples=491520 --train_data_dir=/data/ofrecord/train
    --train_data_part_num=256 --num_nodes=2 --gpu_num_per_node=8 --optimizer="sgd" --momentum=0.875
    --label_smoothing=0.1 --learning_rate=0.001 --loss_print_every_n_iter=20 --batch_size_per_device=256
    --val_batch_size_per_device=125 --num_epoch=1 --use_fp16 --channel_last=True --pad_output --fuse_bn_relu=True
    --fuse_bn_add_relu=True --nccl_fusion_threshold_mb=16 --nccl_fusion_max_ops=24 --gpu_image_decoder=True
    --log_dir=./log --node_ips=10.11.0.2,10.11.0.3 --model="resnet50\""""


def test_oneflow_command_is_rn50_train_sh_on_every_node() -> None:
    m = find_target(ONEFLOW)
    plans = plan_cell(m, Cell(2, 8, "amp", 256), load_hosts(HOSTS))
    assert [p.command.rank for p in plans] == [0, 1]
    for p in plans:  # launch_all.sh starts the same script with the same arguments on every node
        assert list(p.command.command) == shlex.split(RN50_TRAIN)
        assert p.command.env["NCCL_LAUNCH_MODE"] == "PARALLEL" and p.command.env["PYTHONUNBUFFERED"] == "1"
    fp32 = plan_cell(m, Cell(1, 1, "fp32", 128), load_hosts(HOSTS))[0].command.command
    assert "--use_fp16" not in fp32 and "--num_examples=15360" in fp32 and "--node_ips=10.11.0.2" in fp32


def test_oneflow_num_examples_is_120_iterations_of_every_cell() -> None:
    m = find_target(ONEFLOW)
    for cell in m.cells():
        (first,) = [a for a in plan_cell(m, cell, load_hosts(HOSTS))[0].command.command
                    if a.startswith("--num_examples=")]
        assert first == f"--num_examples={cell.nodes * cell.gpus_per_node * cell.batch_size * 120}", cell.key
    assert len(m.cells()) == 15  # the report's 15 rows


#: DLPerf NVIDIADeepLearningExamples/TensorFlow/Classification/ConvNets/resnet50v1.5/scripts, CMD of
#: single_node_train.sh (1 node) and multi_node_train.sh (2 and 4 nodes) with BATCH_SIZE 224, DTYPE amp,
#: NUM_STEP 120, DATA_DIR /data, USE_DALI=1 (the run_*.sh wrappers)
TF1_COMMON = ("--arch=resnet50 --mode=train --iter_unit=batch --num_iter=120 --batch_size=224 {warmup} "
              "--use_cosine_lr --label_smoothing 0.1 {lr} --lr_warmup_epochs=8 --momentum=0.875 "
              "--weight_decay=3.0517578125e-05 --precision=fp32 --use_tf_amp --use_static_loss_scaling "
              "--loss_scale=128 --data_dir=/data/tfrecords --use_dali --data_idx_dir=/data/dali_idx {xla} "
              "--results_dir=../logs/ngc/tensorflow/resnet50/bz224/{n}n8g/results --weight_init=fan_in "
              "--display_every=1 {fraction}")


def options(argv: list[str]) -> list[str]:
    """Options with their values, in a canonical order (argparse does not depend on the order)."""
    out: list[str] = []
    for a in argv:
        if not a.startswith("-") and out:
            out[-1] += " " + a
        else:
            out.append(a)
    return sorted(out)


@pytest.mark.parametrize(("target", "xla"), [(TF1, ""), (TF1_XLA, "--use_xla")])
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_tf1_command_is_the_dlperf_script(target: str, xla: str, nodes: int) -> None:
    single = nodes == 1
    want = TF1_COMMON.format(
        warmup="--warmup_steps=10000" if single else "--warmup_steps=0",
        lr="--lr_init=0.001" if single else "--lr_init=0.256", xla=xla, n=nodes,
        fraction="" if single else "--gpu_memory_fraction=0.98")
    (head, *others) = plan_cell(find_target(target), Cell(nodes, 8, "amp", 224), load_hosts(HOSTS))
    argv = list(head.command.command)
    main = argv.index("main.py")
    assert argv[main - 1:main + 1] == ["python3", "main.py"]
    assert options(argv[main + 1:]) == options(shlex.split(want))
    # mpirun -np N with the multi-node script's -map-by slot, -bind-to none, -x PATH -x LD_LIBRARY_PATH,
    # -mca pml ob1 -mca btl ^openib, and ssh on port 12345 (plm_rsh_args -p 12345)
    mpi = argv[:main - 1]
    assert mpi[:4] == ["mpirun", "--allow-run-as-root", "-np", str(8 * nodes)]
    assert "--map-by slot" in " ".join(mpi) and "--bind-to none" in " ".join(mpi)
    assert "-mca pml ob1 -mca btl ^openib" in " ".join(mpi) and "ssh -p 12345 " in " ".join(mpi)
    assert "-x PATH -x LD_LIBRARY_PATH" in " ".join(mpi)
    assert [p.command.role for p in others] == ["mpi-sshd"] * (nodes - 1)


def test_tf1_fp32_precision_is_the_scripts() -> None:
    argv = plan_cell(find_target(TF1), Cell(1, 1, "fp32", 128), load_hosts(HOSTS))[0].command.command
    assert "--precision=fp32" in argv and "--use_tf_amp" not in argv and "--use_xla" not in argv
    assert "--batch_size=128" in argv


# --- NGC MXNet: one record per batch, the median over the ranks --------------------------------------------

def speedometer(batch: int, value: float) -> str:
    """A line of DLE e470c21 fit.py (logging format '{asctime}:{levelname}: {message}', disp_batches 1)."""
    return (f"2020-09-16 10:00:00,000:INFO: Epoch[0] Batch [{batch}-{batch}]\tSpeed: {value} samples/sec\t"
            "LR: 0.256000\t\n")


def mxnet_log(ranks: list[list[float]]) -> str:
    """Each rank's arguments line, then per batch every rank's line (``ranks[r][k]``: rank r, batch k)."""
    args = ("2020-09-16 09:59:00,000:INFO: Start with arguments Namespace(amp=False, batch_size=512, "
            "data_backend='dali-gpu', dtype='float32', gpus=[0, 1, 2, 3], kv_store='horovod')\n")
    out = [args] * len(ranks)
    for k in range(len(ranks[0])):
        out += [speedometer(k, r[k]) for r in ranks]
    return "".join(out)


def test_mxnet_ranks_make_one_record_per_batch(tmp_path: Path) -> None:
    ranks = [[1500.004, 1510.0, 1490.0], [1501.0, 1509.0, 1495.0], [1499.0, 1511.0, 1493.0],
             [1502.0, 1508.0, 1494.0]]
    log = write(tmp_path, mxnet_log(ranks))
    (run,) = parse_file(log, "ngc-mxnet-ranks").series
    # np.median of the four ranks' figures, each first rounded to 2 decimals (extract_mxnet_logs.py)
    assert [(r.iteration, r.value) for r in run.records] == [(0, 1500.5), (1, 1509.5), (2, 1493.5)]
    assert run.gpus == 4 and run.facts["batch_size"] == 128 and run.facts["precision"] == "fp32"
    (plain,) = parse_file(log, "ngc-mxnet").series  # the other parser: a record per line
    assert len(plain.records) == 12


def test_mxnet_protocol_is_dlperfs_rule(tmp_path: Path) -> None:
    """120 batches x 2 ranks: mean over batches 21-120 of the per-batch medians."""
    ranks = [[1000.0 + k for k in range(120)], [1002.0 + k for k in range(120)]]
    log = write(tmp_path, mxnet_log(ranks).replace("gpus=[0, 1, 2, 3]", "gpus=[0, 1]"))
    protocol = Protocol.from_dict(find_target(MXNET).data["measure"]["protocol"])
    got = measure(parse_file(log, "ngc-mxnet-ranks").series[0], protocol)
    medians = [1001.0 + k for k in range(120)]
    assert got.records_used == 100 and got.value == round(sum(medians[20:120]) / 100, 2) == 1070.5


#: DLPerf NVIDIADeepLearningExamples/MxNet/Classification/RN50v1.5/runner.sh, the train.py flags (CMD) for
#: DTYPE fp16 with BZ_PER_DEVICE 256 on 4 nodes of GPUS 0,...,7 (total_bz 8192), DATA_DIR as run_test.sh
RUNNER_FP16 = """--dtype float16 --amp --fuse-bn-relu 1 --fuse-bn-add-relu 1 --input-layout NCHW --conv-layout NHWC
    --batchnorm-layout NHWC --pooling-layout NHWC --arch resnetv15 --num-layers 50 --num-classes 1000 --mode train
    --data-train /data/imagenet/train-val-recordio-passthrough/train.rec
    --data-train-idx /data/imagenet/train-val-recordio-passthrough/train.idx --gpus 0,1,2,3,4,5,6,7
    --batch-size 8192 --image-shape 3,224,224 --lr 0.256 --lr-schedule cosine --optimizer sgd --mom 0.875
    --wd 3.0517578125e-05 --label-smoothing 0.1 --kv-store horovod --data-backend dali-gpu --benchmark-iters 120
    --no-metrics --disp-batches 1 --save-frequency 0 --num-epochs 1"""


def test_mxnet_command_is_runner_sh() -> None:
    m = find_target(MXNET)
    (head, *others) = plan_cell(m, Cell(4, 8, "amp", 256), load_hosts(HOSTS))
    argv = list(head.command.command)
    main = argv.index("train.py")
    assert argv[main - 1:] == ["python3", "train.py", *shlex.split(RUNNER_FP16)]
    mpi = " ".join(argv[:main - 1])
    assert mpi.startswith("mpirun --allow-run-as-root -np 32 ") and "ssh -p 10001 " in mpi
    assert "--map-by slot" in mpi and "--bind-to none" in mpi and "-mca pml ob1 -mca btl ^openib" in mpi
    assert head.command.env["MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD"] == "25" and len(others) == 3
    # "without amp": runner.sh with --amp removed; FP32: its float32 flags and batch 128 x 2 GPUs
    fp16 = plan_cell(m, Cell(1, 1, "fp16", 256), load_hosts(HOSTS))[0].command.command
    assert "--amp" not in fp16 and fp16[fp16.index("--batch-size") + 1] == "256"
    fp32 = plan_cell(m, Cell(1, 2, "fp32", 128), load_hosts(HOSTS))[0].command.command
    assert list(fp32[fp32.index("train.py") + 1:][:8]) == shlex.split(
        "--dtype float32 --input-layout NHWC --fuse-bn-relu 0 --fuse-bn-add-relu 0")
    assert fp32[fp32.index("--gpus") + 1] == "0,1" and fp32[fp32.index("--batch-size") + 1] == "256"
