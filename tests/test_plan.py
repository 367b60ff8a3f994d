"""``repro plan``: exact text for each launcher kind, argv safety, and --cells filters.

The expected texts below were written from the launch commands in docs/domain.md §1
(DLPerf single_node_train.sh for NGC PyTorch, PaddlePaddle/Perf clas_fp32.sh /
tf_test_dist_all.sh), not copied from the kit's output.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
from cli_helpers import run_cli

from repro.cli.common import parse_filter
from repro.errors import InputError, UsageError
from repro.spec.hosts import load_hosts, local_hosts
from repro.run.launchers.mpi import session_environment
from repro.spec.manifest import Cell, find_target, load_manifest
from repro.run.plan import plan_cell, render_plan

REPO = Path(__file__).resolve().parents[1]
GOOD = Path(__file__).resolve().parent / "data" / "good"
DLPERF = "dlperf-ngc-pytorch-rn50-v100"


def rel(p: Path) -> str:
    return os.path.relpath(p, REPO)


def repro(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=REPO)


# --- torch: DLPerf NGC PyTorch on 4 nodes --------------------------------------------------------------

# multiproc.py --nnodes N --node_rank R --nproc_per_node G --master_addr M --master_port=P main.py ... as the
# report's logged 4-node command (DLPerf NVIDIADeepLearningExamples/PyTorch/resnet50v1.5/README.md @c89430b):
# --raport-file /workspace/rn50/raport.json, --workspace /workspace/rn50, data /data/image, and LR = batch per GPU x
# GPUs per node / 1000 (single_node_train.sh with num_gpus 8) = 256 * 8 / 1000 = 2.048 at any node count;
# TRAIN_STEPS 150, PREC "--amp --dynamic-loss-scale".
DLPERF_DOCKER = ("docker run --network=host --ipc=host --shm-size=16g --ulimit=memlock=-1 "
                 "'--gpus=\"device=0,1,2,3,4,5,6,7\"' --device=/dev/infiniband:/dev/infiniband --cap-add=IPC_LOCK "
                 "-v=/datasets/imagenet:/data/image:ro "
                 "-w=/workspace/rn50/PyTorch/Classification/ConvNets -e=NCCL_DEBUG=INFO IMAGE")
DLPERF_MAIN = ("./main.py --data-backend dali-cpu --raport-file /workspace/rn50/raport.json -j8 -p 1 --lr 2.048 "
               "--optimizer-batch-size -1 --warmup 8 --arch resnet50 -c fanin --label-smoothing 0.1 "
               "--lr-schedule cosine --mom 0.125 --wd 3.0517578125e-05 --workspace /workspace/rn50 -b 256 "
               "--epochs 1 --prof 150 --training-only --no-checkpoints --amp --dynamic-loss-scale /data/image")
# The report's logged 2-node FP32 command, token for token from main.py on (its --prof 121 aside: see the manifest).
DLPERF_2N_FP32_MAIN = ("./main.py --data-backend dali-cpu --raport-file /workspace/rn50/raport.json -j8 -p 1 --lr 1.024 "
                       "--optimizer-batch-size -1 --warmup 8 --arch resnet50 -c fanin --label-smoothing 0.1 "
                       "--lr-schedule cosine --mom 0.125 --wd 3.0517578125e-05 --workspace /workspace/rn50 -b 128 "
                       "--epochs 1 --prof 150 --training-only --no-checkpoints /data/image")

DLPERF_4N_AMP = f"""\
target dlperf-ngc-pytorch-rn50-v100: DLPerf NGC PyTorch 20.03 ResNet-50 v1.5 training throughput, 1-32 V100-SXM2-16GB, FP32 bs128 and AMP bs256
launcher torch, 1 cells x 5 repeats
dataset: imagenet-jpeg at /datasets/imagenet on every node

cell 4n8g-amp-bs256: 4 node(s) x 8 GPU(s) = 32 GPU(s), amp, batch 256/GPU
  image: repro/dlperf-ngc-pytorch-rn50:20.03-5cc03ca
  rank 0 on node1 (10.11.0.2) [worker]
    {DLPERF_DOCKER}
    $ python ./multiproc.py --nnodes 4 --node_rank 0 --nproc_per_node 8 --master_addr 10.11.0.2 --master_port=22333 {DLPERF_MAIN}
  rank 1 on node2 (10.11.0.3) [worker]
    {DLPERF_DOCKER}
    $ python ./multiproc.py --nnodes 4 --node_rank 1 --nproc_per_node 8 --master_addr 10.11.0.2 --master_port=22333 {DLPERF_MAIN}
  rank 2 on node3 (10.11.0.4) [worker]
    {DLPERF_DOCKER}
    $ python ./multiproc.py --nnodes 4 --node_rank 2 --nproc_per_node 8 --master_addr 10.11.0.2 --master_port=22333 {DLPERF_MAIN}
  rank 3 on node4 (10.11.0.5) [worker]
    {DLPERF_DOCKER}
    $ python ./multiproc.py --nnodes 4 --node_rank 3 --nproc_per_node 8 --master_addr 10.11.0.2 --master_port=22333 {DLPERF_MAIN}
"""


def test_torch_plan_dlperf_4_nodes_amp() -> None:
    proc = repro("plan", "--wide", DLPERF, "--hosts", rel(GOOD / "hosts-4.yaml"), "--cells", "nodes=4,precision=amp")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == DLPERF_4N_AMP


def test_torch_ranks_and_master_at_api_level() -> None:
    m = find_target(DLPERF)
    hosts = load_hosts(GOOD / "hosts-4.yaml")
    plans = plan_cell(m, Cell(4, 8, "amp", 256), hosts)
    assert [p.command.rank for p in plans] == [0, 1, 2, 3]
    assert [p.command.node.address for p in plans] == ["10.11.0.2", "10.11.0.3", "10.11.0.4", "10.11.0.5"]
    for rank, p in enumerate(plans):
        argv = p.command.command
        assert argv[argv.index("--node_rank") + 1] == str(rank)
        assert argv[argv.index("--master_addr") + 1] == "10.11.0.2"
        assert argv[argv.index("--lr") + 1] == "2.048"
        assert p.image == "repro/dlperf-ngc-pytorch-rn50:20.03-5cc03ca"
        assert p.container["labels"] == {"repro.target": DLPERF, "repro.cell": "4n8g-amp-bs256",
                                         "repro.rank": str(rank)}
    # the learning rate follows the GPUs per node (DLPerf: batch per GPU x num_gpus / 1000, num_gpus 8 on 2/4 nodes)
    lrs = {c.key: (lambda a: a[a.index("--lr") + 1])(plan_cell(m, c, hosts)[0].command.command)
           for c in m.cells()}
    assert lrs == {"1n1g-fp32-bs128": "0.128", "1n1g-amp-bs256": "0.256", "1n4g-fp32-bs128": "0.512",
                   "1n4g-amp-bs256": "1.024", "1n8g-fp32-bs128": "1.024", "1n8g-amp-bs256": "2.048",
                   "2n8g-fp32-bs128": "1.024", "2n8g-amp-bs256": "2.048", "4n8g-fp32-bs128": "1.024",
                   "4n8g-amp-bs256": "2.048"}


def test_torch_plan_dlperf_2_nodes_fp32_is_the_logged_command() -> None:
    proc = repro("plan", "--wide", DLPERF, "--hosts", rel(GOOD / "hosts-4.yaml"), "--cells", "nodes=2,precision=fp32")
    assert proc.returncode == 0, proc.stderr
    cmds = [ln for ln in proc.stdout.splitlines() if ln.startswith("    $ ")]
    assert cmds == [f"    $ python ./multiproc.py --nnodes 2 --node_rank {r} --nproc_per_node 8 --master_addr 10.11.0.2 "
                    f"--master_port=22333 {DLPERF_2N_FP32_MAIN}" for r in (0, 1)]


def test_torch_plan_dlperf_static_loss_scale() -> None:
    proc = repro("plan", "--wide", "dlperf-ngc-pytorch-rn50-v100-static", "--hosts", rel(GOOD / "hosts-4.yaml"),
                 "--cells", "gpus=8")
    assert proc.returncode == 0, proc.stderr
    (cmd,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("    $ ")]
    assert cmd == ("    $ python ./multiproc.py --nnodes 1 --node_rank 0 --nproc_per_node 8 --master_addr 10.11.0.2 "
                   "--master_port=22333 " + DLPERF_MAIN.replace(" --dynamic-loss-scale", ""))


# --- paddle: the same command, with --ips=<all nodes>, on every node ---------------------------------------

PADDLE_DOCKER = ("docker run --network=host --ipc=host --shm-size=64g --ulimit=memlock=-1 "
                 "'--gpus=\"device=0,1,2,3,4,5,6,7\"' -v=/data/imagenet:/workspace/PaddleClas/data:ro "
                 "-w=/workspace/PaddleClas -e=FLAGS_conv_workspace_size_limit=4000 "
                 "-e=FLAGS_cudnn_batchnorm_spatial_persistent=1 -e=FLAGS_cudnn_exhaustive_search=1 "
                 "-e=POD_IP={ip} IMAGE")  # the node's own address: Paddle's rank comes from it
PADDLE_CMD = ("$ python -m paddle.distributed.launch --log_dir=./mylog --gpus=0,1,2,3,4,5,6,7 "
              "--ips=10.10.0.1,10.10.0.2,10.10.0.3,10.10.0.4 ppcls/static/train.py "
              "-c ppcls/configs/ImageNet/ResNet/ResNet50.yaml -o Global.print_batch_step=10 "
              "-o DataLoader.Train.sampler.batch_size=256 -o Global.eval_during_train=False "
              "-o fuse_elewise_add_act_ops=True -o enable_addto=True -o DataLoader.Train.loader.num_workers=8 "
              "-o Global.epochs=1 -o Global.use_dali=True")

PADDLE_4N = f"""\
target test-paddle-multinode: Perf 2.5 PaddleClas ResNet50 static graph, 4 nodes x 8 V100, FP32 bs256
launcher paddle, 1 cells x 1 repeats
dataset: imagenet-jpeg-list at /data/imagenet on every node

cell 4n8g-fp32-bs256: 4 node(s) x 8 GPU(s) = 32 GPU(s), fp32, batch 256/GPU
  image: paddlepaddle/paddle-benchmark:2.5.0-cuda11.2-cudnn8-runtime-ubuntu16.04@sha256:{"ab" * 32}
  rank 0 on 10.10.0.1 (10.10.0.1) [worker]
    {PADDLE_DOCKER.format(ip="10.10.0.1")}
    {PADDLE_CMD}
  rank 1 on 10.10.0.2 (10.10.0.2) [worker]
    {PADDLE_DOCKER.format(ip="10.10.0.2")}
    {PADDLE_CMD}
  rank 2 on 10.10.0.3 (10.10.0.3) [worker]
    {PADDLE_DOCKER.format(ip="10.10.0.3")}
    {PADDLE_CMD}
  rank 3 on 10.10.0.4 (10.10.0.4) [worker]
    {PADDLE_DOCKER.format(ip="10.10.0.4")}
    {PADDLE_CMD}
"""


def test_paddle_plan_same_ips_on_every_node() -> None:
    proc = repro("plan", "--wide", rel(GOOD / "paddle-multinode.yaml"), "--hosts", rel(GOOD / "hosts-perf.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == PADDLE_4N


def test_paddle_commands_are_identical_across_nodes() -> None:
    m = load_manifest(GOOD / "paddle-multinode.yaml")
    plans = plan_cell(m, m.cells()[0], load_hosts(GOOD / "hosts-perf.yaml"))
    assert len({p.command.command for p in plans}) == 1
    assert "--ips=10.10.0.1,10.10.0.2,10.10.0.3,10.10.0.4" in plans[0].command.command


# --- mpi: mpirun on rank 0, sshd on the others ------------------------------------------------------------

MPI_DOCKER = ("docker run --network=host --ipc=host --ulimit=memlock=-1 '--gpus=\"device=0,1,2,3,4,5,6,7\"' "
              "--device=/dev/infiniband:/dev/infiniband --cap-add=IPC_LOCK -w=/workspace/rn50v15_tf -e=NCCL_DEBUG=INFO -e=NCCL_IB_DISABLE=0 -e=NCCL_IB_GID_INDEX=3 IMAGE")
MPI_SSH = ("'ssh -p 10000 -i /run/repro-mpi/id_ed25519 -o IdentitiesOnly=yes "
           "-o UserKnownHostsFile=/run/repro-mpi/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes'")


def mpi_sshd(addr: str) -> str:
    return ("$ /usr/sbin/sshd -D -e -f /run/repro-mpi/sshd_config\n"
            "    file /run/repro-mpi/sshd_config:\n"
            "      Port 10000\n"
            f"      ListenAddress {addr}\n"
            "      HostKey /run/repro-mpi/host_ed25519\n"
            "      AuthorizedKeysFile /run/repro-mpi/authorized_keys\n"
            "      PasswordAuthentication no\n"
            "      PermitRootLogin prohibit-password\n"
            "      StrictModes no\n"
            "      UsePAM no\n"
            "      PermitUserEnvironment yes")


MPI_4N_AMP = f"""\
target test-mpi-ngc-tf1: Perf NGC TensorFlow 20.12-tf1 ResNet-50 v1.5 under Horovod, 4 nodes x 8 V100, FP32 and AMP bs256
launcher mpi, 1 cells x 1 repeats

cell 4n8g-amp-bs256: 4 node(s) x 8 GPU(s) = 32 GPU(s), amp, batch 256/GPU
  image: nvcr.io/nvidia/tensorflow:20.12-tf1-py3
  rank 0 on node1 (10.11.0.2) [mpi-head]
    {MPI_DOCKER}
    $ mpirun --allow-run-as-root -np 32 --hostfile /run/repro-mpi/hostfile --bind-to none --map-by slot -mca plm_rsh_agent {MPI_SSH} -x PATH -x LD_LIBRARY_PATH -x NCCL_DEBUG -x NCCL_IB_DISABLE -x NCCL_IB_GID_INDEX -mca btl_tcp_if_exclude docker0,lo python main.py --mode=training_benchmark --use_xla --warmup_steps 200 --num_iter 500 --iter_unit batch --batch_size 256 --data_dir=./data/tfrecords/ --results_dir=/tmp/result --use_tf_amp --use_static_loss_scaling --lr_init=0.01 --loss_scale=128
    file /run/repro-mpi/hostfile:
      10.11.0.2 slots=8
      10.11.0.3 slots=8
      10.11.0.4 slots=8
      10.11.0.5 slots=8
  rank 1 on node2 (10.11.0.3) [mpi-sshd]
    {MPI_DOCKER}
    {mpi_sshd("10.11.0.3")}
  rank 2 on node3 (10.11.0.4) [mpi-sshd]
    {MPI_DOCKER}
    {mpi_sshd("10.11.0.4")}
  rank 3 on node4 (10.11.0.5) [mpi-sshd]
    {MPI_DOCKER}
    {mpi_sshd("10.11.0.5")}
"""


def test_mpi_plan_head_and_sshd() -> None:
    proc = repro("plan", "--wide", rel(GOOD / "mpi-ngc-tf1.yaml"), "--hosts", rel(GOOD / "hosts-4.yaml"),
                 "--cells", "precision=amp")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == MPI_4N_AMP


def test_mpi_render_at_api_level() -> None:
    m = load_manifest(GOOD / "mpi-ngc-tf1.yaml")
    plans = plan_cell(m, Cell(4, 8, "fp32", 256), load_hosts(GOOD / "hosts-4.yaml"))
    head, *others = [p.command for p in plans]
    assert head.role == "mpi-head" and [o.role for o in others] == ["mpi-sshd"] * 3
    assert head.command[head.command.index("-np") + 1] == "32"
    assert head.files == {"/run/repro-mpi/hostfile": "".join(f"10.11.0.{i} slots=8\n" for i in range(2, 6))}
    forwarded = [head.command[i + 1] for i, t in enumerate(head.command) if t == "-x"]
    assert forwarded == ["PATH", "LD_LIBRARY_PATH", "NCCL_DEBUG", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX"]
    assert head.command[-1] == "--results_dir=/tmp/result"  # fp32: {precision_args} adds nothing
    for o in others:
        assert o.command == ("/usr/sbin/sshd", "-D", "-e", "-f", "/run/repro-mpi/sshd_config")
        assert "Port 10000\n" in o.files["/run/repro-mpi/sshd_config"]
        assert o.env == {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "INFO"}


def test_mpi_session_environment_carries_the_container_env() -> None:
    env = ["PATH=/usr/local/mpi/bin:/usr/bin:/bin", "LD_LIBRARY_PATH=/usr/local/mpi/lib", "OPAL_PREFIX=/usr/local/mpi",
           "EMPTY=", "WITH_EQ=a=b c", "TWO_LINES=a\nb", "bad-name=x", "NO_EQUALS"]
    assert session_environment(env) == ("PATH=/usr/local/mpi/bin:/usr/bin:/bin\nLD_LIBRARY_PATH=/usr/local/mpi/lib\n"
                                        "OPAL_PREFIX=/usr/local/mpi\nEMPTY=\nWITH_EQ=a=b c\n")


# --- plain: one node, this machine -------------------------------------------------------------------------

PLAIN_LOCAL = """\
target test-plain-paddle-1gpu: Perf 2.5 PaddleClas ResNet50 static graph, 1 V100, FP32 and AMP bs256
launcher plain, 2 cells x 1 repeats
nodes: this machine (no --hosts file)

cell 1n1g-fp32-bs256: 1 node(s) x 1 GPU(s) = 1 GPU(s), fp32, batch 256/GPU
  image: paddlepaddle/paddle-benchmark:2.5.0-cuda11.2-cudnn8-runtime-ubuntu16.04
  rank 0 on HOSTNAME (127.0.0.1) [worker]
    docker run --network=host --ipc=host --ulimit=memlock=-1 '--gpus="device=0"' -w=/workspace/PaddleClas IMAGE
    $ python -u ppcls/static/train.py -c ppcls/configs/ImageNet/ResNet/ResNet50.yaml -o Global.print_batch_step=10 -o DataLoader.Train.sampler.batch_size=256 -o Global.eval_during_train=False -o Global.epochs=1

cell 1n1g-amp-bs256: 1 node(s) x 1 GPU(s) = 1 GPU(s), amp, batch 256/GPU
  image: paddlepaddle/paddle-benchmark:2.5.0-cuda11.2-cudnn8-runtime-ubuntu16.04
  rank 0 on HOSTNAME (127.0.0.1) [worker]
    docker run --network=host --ipc=host --ulimit=memlock=-1 '--gpus="device=0"' -w=/workspace/PaddleClas IMAGE
    $ python -u ppcls/static/train.py -c ppcls/configs/ImageNet/ResNet/ResNet50_amp_O2_ultra.yaml -o 'Global.image_shape=[4,224,224]' -o AMP.use_pure_fp16=False -o Global.print_batch_step=10 -o DataLoader.Train.sampler.batch_size=256 -o Global.eval_during_train=False -o Global.epochs=1
"""


def test_plain_plan_on_this_machine() -> None:
    proc = repro("plan", "--wide", rel(GOOD / "plain-single.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == PLAIN_LOCAL.replace("HOSTNAME", socket.gethostname())


# --- argv safety -------------------------------------------------------------------------------------------


def test_shell_metacharacters_stay_literal_tokens() -> None:
    m = load_manifest(GOOD / "shell-metachars.yaml")
    (plan,) = plan_cell(m, m.cells()[0], local_hosts())
    assert plan.command.command == (
        "python", "main.py", "--tag", "; rm -rf / #", "--name=$(reboot)", "-b", "64",
        "--note=x | sh", "'quoted'", '"dq"', "`id` && echo pwned > /etc/passwd", "a b\tc")
    assert plan.container["environment"] == {"NOTE": "$(reboot); `id`", "LD_PRELOAD": "/tmp/x.so && reboot"}
    # the printed command is for people; quoted so that a shell would give back the same tokens
    text = render_plan(m, local_hosts(), m.cells())
    (shown,) = [ln.removeprefix("    $ ") for ln in text.splitlines() if ln.startswith("    $ ")]
    assert shlex.split(shown) == list(plan.command.command)
    assert "'; rm -rf / #'" in shown


def test_placeholders_in_spliced_tokens_are_filled_or_rejected(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text((GOOD / "plain-single.yaml").read_text().replace(
        "fp32: [-c, ppcls/configs/ImageNet/ResNet/ResNet50.yaml]",
        'fp32: [-c, ppcls/configs/ImageNet/ResNet/ResNet50.yaml, "--global-batch={global_batch_size}"]'))
    try:
        m = load_manifest(f)
    except InputError:
        return  # rejected at validation: fine
    (plan,) = plan_cell(m, Cell(1, 1, "fp32", 256), local_hosts())
    assert "--global-batch=256" in plan.command.command


# --- --cells ---------------------------------------------------------------------------------------------


def test_parse_filter() -> None:
    assert parse_filter("nodes=4,precision=amp") == {"nodes": 4, "precision": "amp"}
    assert parse_filter("gpus=32") == {"gpus": 32}
    assert parse_filter("batch_size=256,gpus_per_node=8") == {"batch_size": 256, "gpus_per_node": 8}
    for bad in ("nodes", "gpu=8", "nodes=four", "precision"):
        with pytest.raises(UsageError):
            parse_filter(bad)


def test_several_cells_options_are_alternatives() -> None:
    m = find_target(DLPERF)
    cells = m.select([parse_filter("nodes=1,gpus_per_node=1"), parse_filter("gpus=32,precision=fp32")])
    assert [c.key for c in cells] == ["1n1g-fp32-bs128", "1n1g-amp-bs256", "4n8g-fp32-bs128"]
    assert len(m.select([])) == 10


@pytest.mark.parametrize(("cells", "message", "hint"), [
    ("nodes=four", "error: bad cell filter 'nodes=four': 'four' is not a whole number\n", None),
    ("gpu=8", "error: bad cell filter 'gpu=8'\n",
     "hint: use KEY=VALUE[,KEY=VALUE], KEY one of batch_size, gpus, gpus_per_node, nodes, precision\n"),
    ("nodes", "error: bad cell filter 'nodes'\n", None),
    ("nodes=3", "error: no cell of dlperf-ngc-pytorch-rn50-v100 matches nodes=3\n",
     "hint: `repro show TARGET` lists its cells\n"),
])
def test_cells_filter_errors(cells: str, message: str, hint: str | None) -> None:
    proc = repro("plan", "--wide", DLPERF, "--cells", cells)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith(message)
    if hint:
        assert hint in proc.stderr
    assert "Traceback" not in proc.stderr


def test_too_few_hosts_for_a_cell(tmp_path: Path) -> None:
    hosts = tmp_path / "two.yaml"
    hosts.write_text("schema_version: 1\nnodes:\n  - {address: 10.11.0.2}\n  - {address: 10.11.0.3}\n")
    with pytest.raises(InputError, match="the cell needs 4 nodes, the inventory has 2"):
        plan_cell(find_target(DLPERF), Cell(4, 8, "amp", 256), load_hosts(hosts))
    proc = repro("plan", "--wide", DLPERF, "--hosts", str(hosts), "--cells", "nodes=4")
    assert proc.returncode == 2
    assert f"error: {hosts}: nodes: the cell needs 4 nodes, the inventory has 2" in proc.stderr
    assert "hint: add nodes to the hosts file or filter the cells with --cells" in proc.stderr


def test_a_hosts_file_without_the_targets_dataset_format_is_an_error(tmp_path: Path) -> None:
    hosts = tmp_path / "site.yaml"
    hosts.write_text("schema_version: 1\ndata: {imagenet-tfrecord: /data/tf}\nnodes:\n  - {address: 10.0.0.1}\n")
    proc = repro("plan", "--wide", DLPERF, "--hosts", str(hosts), "--cells", "nodes=1,gpus_per_node=1,precision=fp32")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: {hosts}: data: {DLPERF} reads dataset format imagenet-jpeg, and the inventory "
                           "names no directory for it (it has imagenet-tfrecord)\n"
                           "  hint: add `data: {imagenet-jpeg: /path/on/every/node}` to the hosts file\n")


def test_a_hosts_file_maps_formats_to_directories(tmp_path: Path) -> None:
    hosts = tmp_path / "site.yaml"
    hosts.write_text("schema_version: 1\ndata: {imagenet-jpeg: /srv/jpeg, imagenet-tfrecord: /srv/tf}\n"
                     "nodes:\n  - {address: 10.0.0.1}\n")
    site = load_hosts(hosts)
    cell = Cell(1, 1, "fp32", 256)
    (torch,) = plan_cell(find_target("ngc-pytorch-rn50-v100"), cell, site)
    (tf,) = plan_cell(find_target("ngc-tf1-rn50-v100"), cell, site)
    assert torch.container["volumes"] == {"/srv/jpeg": {"bind": "/imagenet", "mode": "ro"}}
    assert tf.container["volumes"] == {"/srv/tf": {"bind": "/data/tfrecords", "mode": "ro"}}


# --- without --hosts: placeholder nodes and dataset path, said so -----------------------------------------

NO_HOSTS_DOCKER = ("docker run --network=host --ipc=host --shm-size=16g --ulimit=memlock=-1 "
                   "'--gpus=\"device=0,1,2,3,4,5,6,7\"' --device=/dev/infiniband:/dev/infiniband --cap-add=IPC_LOCK "
                   "-v=/path/to/imagenet-jpeg:/data/image:ro "
                   "-w=/workspace/rn50/PyTorch/Classification/ConvNets -e=NCCL_DEBUG=INFO IMAGE")
NO_HOSTS_2N = f"""\
target dlperf-ngc-pytorch-rn50-v100: DLPerf NGC PyTorch 20.03 ResNet-50 v1.5 training throughput, 1-32 V100-SXM2-16GB, FP32 bs128 and AMP bs256
launcher torch, 1 cells x 5 repeats
nodes: placeholders node1..node2 (no --hosts file); --hosts FILE shows the real names and addresses
dataset: imagenet-jpeg at /path/to/imagenet-jpeg (a placeholder: the hosts file's `data:` names it)

cell 2n8g-amp-bs256: 2 node(s) x 8 GPU(s) = 16 GPU(s), amp, batch 256/GPU
  image: repro/dlperf-ngc-pytorch-rn50:20.03-5cc03ca
  rank 0 on node1 (node1) [worker]
    {NO_HOSTS_DOCKER}
    $ python ./multiproc.py --nnodes 2 --node_rank 0 --nproc_per_node 8 --master_addr node1 --master_port=22333 {DLPERF_MAIN}
  rank 1 on node2 (node2) [worker]
    {NO_HOSTS_DOCKER}
    $ python ./multiproc.py --nnodes 2 --node_rank 1 --nproc_per_node 8 --master_addr node1 --master_port=22333 {DLPERF_MAIN}
"""


def test_plan_without_hosts_shows_placeholder_nodes_and_dataset() -> None:
    proc = repro("plan", "--wide", DLPERF, "--cells", "nodes=2,precision=amp")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == NO_HOSTS_2N


def test_plan_without_hosts_on_one_node_is_this_machine() -> None:
    proc = repro("plan", "--wide", DLPERF, "--cells", "nodes=1,gpus_per_node=1,precision=fp32")
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()[2:6]
    assert head == ["nodes: this machine (no --hosts file)",
                    "dataset: imagenet-jpeg at /path/to/imagenet-jpeg (a placeholder: the hosts file's `data:` names it)",
                    "", "cell 1n1g-fp32-bs128: 1 node(s) x 1 GPU(s) = 1 GPU(s), fp32, batch 128/GPU"]
    assert f"  rank 0 on {socket.gethostname()} (127.0.0.1) [worker]" in proc.stdout


# --- --synthetic: only as the manifest declares it ----------------------------------------------------------

def test_synthetic_replaces_the_declared_tokens_and_drops_the_dataset_mount() -> None:
    proc = repro("plan", "--wide", DLPERF, "--synthetic", "--cells", "nodes=1,gpus_per_node=1,precision=fp32")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[3] == ("dataset: none: Synthetic data (--synthetic), not the publication's imagenet-jpeg: main.py "
                        "--data-backend syntetic (spelled so in DATA_BACKEND_CHOICES, image_classification/dataloaders.py "
                        "at 5cc03ca) feeds random tensors to training and validation")
    (docker,) = [ln for ln in lines if ln.startswith("    docker run")]
    assert "-v=" not in docker
    (cmd,) = [ln for ln in lines if ln.startswith("    $ ")]
    assert "./main.py --data-backend syntetic --raport-file" in cmd


@pytest.mark.parametrize(("target", "stderr"), [
    ("paddle-rn50-v100", "error: paddle-rn50-v100 declares no synthetic-data run (it reads imagenet-jpeg-list)\n"
                         "hint: give the hosts file `data: {imagenet-jpeg-list: /path}`, or declare dataset.synthetic "
                         "in the manifest\n"),
    ("torch-rn50-cpu", "error: torch-rn50-cpu declares no synthetic-data run (it reads no dataset)\n"
                       "hint: run it without --synthetic\n"),
])
def test_synthetic_where_the_target_declares_none_is_refused(target: str, stderr: str) -> None:
    proc = repro("plan", "--wide", target, "--synthetic")
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", stderr)


def test_cell_env_applies_to_matching_cells_and_site_env_wins(tmp_path: Path) -> None:
    from repro.spec.hosts import load_hosts
    from repro.spec.manifest import find_target
    from repro.run.plan import plan_cell

    hosts_file = tmp_path / "site.yaml"
    hosts_file.write_text("schema_version: 1\ndata: /data\nenv: {NCCL_SOCKET_IFNAME: ib0}\n"
                          "nodes:\n" + "".join(f"  - {{address: 10.0.0.{i}}}\n" for i in range(1, 5)))
    m = find_target("ngc-pytorch-rn50-v100")
    hosts = load_hosts(hosts_file)
    one, four = [next(c for c in m.cells() if c.nodes == n) for n in (1, 4)]
    env1 = plan_cell(m, one, hosts)[0].command.env
    env4 = plan_cell(m, four, hosts)[0].command.env
    assert "NCCL_IB_GID_INDEX" not in env1 and env1["NCCL_SOCKET_IFNAME"] == "ib0"
    assert env4["NCCL_DEBUG"] == "INFO" and env4["NCCL_SOCKET_IFNAME"] == "ib0"
    assert "NCCL_IB_GID_INDEX" not in env4  # the publisher's GID index is not a default


# --- tf-ps: a worker on every node, parameter servers beside them (TensorFlow benchmarks, EC2 distributed K80) -

# tf_cnn_benchmarks @9165a70 flags --job_name --ps_hosts --worker_hosts --task_index; the page's configuration for
# ResNet-50: distributed_replicated, cross_replica_sync True, batch 64, sgd, 10 warmup + 100 steps; workers on
# launch.master_port 50000 and parameter servers on 50001 of every node.
TF_PS_ARGS = ("tf_cnn_benchmarks.py --num_gpus=8 --batch_size=64 --model=resnet50 "
              "--variable_update=distributed_replicated --cross_replica_sync=True --optimizer=sgd "
              "--num_warmup_batches=10 --num_batches=100 --job_name={job} "
              "--ps_hosts=10.11.0.2:50001,10.11.0.3:50001 --worker_hosts=10.11.0.2:50000,10.11.0.3:50000 "
              "--task_index={rank}")
TF_PS_DOCKER = ("docker run --network=host --ipc=host --ulimit=memlock=-1 '--gpus=\"device=0,1,2,3,4,5,6,7\"' "
                "-w=/workspace/benchmarks/scripts/tf_cnn_benchmarks IMAGE")
TF_PS_RUNNER = """\
    file /tmp/repro-tf-ps-pair.py:
      \"\"\"Run one TensorFlow parameter server and one worker side by side (the ``tf-ps`` launcher).
      
      ... (52 lines)
"""
TF_PS_2N = ("  parameter servers: one beside the worker on every node (2), each without GPUs "
            "(CUDA_VISIBLE_DEVICES= empty)\n") + "".join(f"""\
  rank {r} on node{r + 1} (10.11.0.{r + 2}) [ps+worker]
    {TF_PS_DOCKER}
    $ python /tmp/repro-tf-ps-pair.py 16 env CUDA_VISIBLE_DEVICES= python {TF_PS_ARGS.format(job="ps", rank=r)} python {TF_PS_ARGS.format(job="worker", rank=r)}
{TF_PS_RUNNER}""" for r in (0, 1))

# The page's exception "ResNet-152: 8 instances / 4 parameter servers" (benchmarks.md line 363 at 5984ffe): on 8
# nodes, ps tasks 0-3 on nodes 1-4 beside their workers, nodes 5-8 a worker alone; ps_hosts names the four.
RN152_8N_ARGS = ("tf_cnn_benchmarks.py --num_gpus=8 --batch_size=32 --model=resnet152 "
                 "--variable_update=distributed_replicated --cross_replica_sync=True --optimizer=sgd "
                 "--num_warmup_batches=10 --num_batches=100 --job_name={job} "
                 "--ps_hosts=10.11.0.2:50001,10.11.0.3:50001,10.11.0.4:50001,10.11.0.5:50001 "
                 "--worker_hosts=10.11.0.2:50000,10.11.0.3:50000,10.11.0.4:50000,10.11.0.5:50000,"
                 "10.11.0.6:50000,10.11.0.7:50000,10.11.0.8:50000,10.11.0.9:50000 --task_index={rank}")
RN152_8N = ("cell 8n8g-fp32-bs32: 8 node(s) x 8 GPU(s) = 64 GPU(s), fp32, batch 32/GPU\n"
            "  image: repro/tf-cnn-benchmarks:1.2.0-9165a70\n"
            "  parameter servers: 4 of 8 nodes, on rank(s) 0, 1, 2, 3 in ps task order (launch.parameter_servers); "
            "a worker on every node; each ps without GPUs (CUDA_VISIBLE_DEVICES= empty)\n"
            + "".join(f"""\
  rank {r} on node{r + 1} (10.11.0.{r + 2}) [ps+worker]
    {TF_PS_DOCKER}
    $ python /tmp/repro-tf-ps-pair.py 16 env CUDA_VISIBLE_DEVICES= python {RN152_8N_ARGS.format(job="ps", rank=r)} python {RN152_8N_ARGS.format(job="worker", rank=r)}
{TF_PS_RUNNER}""" for r in (0, 1, 2, 3))
            + "".join(f"""\
  rank {r} on node{r + 1} (10.11.0.{r + 2}) [worker]
    {TF_PS_DOCKER}
    $ python {RN152_8N_ARGS.format(job="worker", rank=r)}
""" for r in (4, 5, 6, 7)))


def test_tf_ps_plan_two_nodes() -> None:
    proc = repro("plan", "--wide", "tf-cnn-rn50-k80-ec2-dist-synthetic", "--hosts", rel(GOOD / "hosts-4.yaml"),
                 "--cells", "nodes=2")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.endswith("cell 2n8g-fp32-bs64: 2 node(s) x 8 GPU(s) = 16 GPU(s), fp32, batch 64/GPU\n"
                                "  image: repro/tf-cnn-benchmarks:1.2.0-9165a70\n" + TF_PS_2N)


def test_tf_ps_plan_eight_nodes_four_parameter_servers() -> None:
    proc = repro("plan", "--wide", "tf-cnn-rn152-k80-ec2-dist-synthetic", "--hosts", rel(GOOD / "hosts-8.yaml"),
                 "--cells", "nodes=8")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.endswith("\n\n" + RN152_8N)


@pytest.mark.parametrize(("target", "nodes", "ps"), [
    ("tf-cnn-inception3-k80-ec2-dist-synthetic", 8, 6),  # page line 361: 8 instances / 6 parameter servers
    ("tf-cnn-rn152-k80-ec2-dist-synthetic", 8, 4),  # line 363: 8 instances / 4 parameter servers
    ("tf-cnn-rn50-k80-ec2-dist-synthetic", 8, 8),  # line 362's exception is ResNet-50 at batch 32: the -bs32 target
    ("tf-cnn-rn50-k80-ec2-dist-synthetic-bs32", 8, 4),  # line 362: (batch size 32) 8 instances / 4 parameter servers
    ("tf-cnn-inception3-k80-ec2-dist-synthetic-bs32", 8, 6),
    ("tf-cnn-inception3-k80-ec2-dist-synthetic", 4, 4),
    ("tf-cnn-rn152-k80-ec2-dist-synthetic", 2, 2),
])
def test_tf_ps_parameter_servers_per_the_page(target: str, nodes: int, ps: int) -> None:
    m = find_target(target)
    cell = next(c for c in m.cells() if c.nodes == nodes)
    plans = plan_cell(m, cell, load_hosts(GOOD / "hosts-8.yaml"))
    assert [p.command.role for p in plans] == ["ps+worker"] * ps + ["worker"] * (nodes - ps)
    ps_hosts = ",".join(f"10.11.0.{i + 2}:50001" for i in range(ps))
    assert all(f"--ps_hosts={ps_hosts}" in p.command.command for p in plans)


def test_tf_ps_placement_other_than_the_first_nodes(tmp_path: Path) -> None:
    """ps tasks in the order launch.parameter_servers lists their nodes: a ps's task_index is its place in
    ps_hosts, not its node's rank; a worker's is its rank, on every node."""
    text = (REPO / "manifests" / "tf-cnn-rn152-k80-ec2-dist-synthetic.yaml").read_text(encoding="utf-8")
    assert text.count("ranks: [0, 1, 2, 3]") == 1
    (tmp_path / "m.yaml").write_text(text.replace("ranks: [0, 1, 2, 3]", "ranks: [6, 2]"), encoding="utf-8")
    plans = plan_cell(load_manifest(tmp_path / "m.yaml"), Cell(8, 8, "fp32", 32), load_hosts(GOOD / "hosts-8.yaml"))
    hosts = "--ps_hosts=10.11.0.8:50001,10.11.0.4:50001"
    for rank, p in enumerate(plans):
        argv = list(p.command.command)
        if rank not in (6, 2):
            assert (p.command.role, argv[:2], p.command.files) == ("worker", ["python", "tf_cnn_benchmarks.py"], {})
            assert argv[-4:-2] == ["--job_name=worker", hosts] and argv[-1] == f"--task_index={rank}"
            continue
        assert p.command.role == "ps+worker" and argv[:3] == ["python", "/tmp/repro-tf-ps-pair.py", "16"]
        ps, worker = argv[3:19], argv[19:]
        assert ps[:3] == ["env", "CUDA_VISIBLE_DEVICES=", "python"]
        assert ps[-4:-2] == ["--job_name=ps", hosts] and ps[-1] == f"--task_index={(6, 2).index(rank)}"
        assert worker[-4:-2] == ["--job_name=worker", hosts] and worker[-1] == f"--task_index={rank}"


def test_tf_ps_render_at_api_level() -> None:
    m = find_target("tf-cnn-rn152-k80-ec2-dist-synthetic")
    hosts = load_hosts(GOOD / "hosts-4.yaml")
    plans = plan_cell(m, Cell(4, 8, "fp32", 32), hosts)
    assert [p.command.rank for p in plans] == [0, 1, 2, 3] and {p.command.role for p in plans} == {"ps+worker"}
    for rank, p in enumerate(plans):
        argv = list(p.command.command)
        assert argv[:2] == ["python", "/tmp/repro-tf-ps-pair.py"]
        n = int(argv[2])
        ps, worker = argv[3:3 + n], argv[3 + n:]
        # the upstream harness hides the GPUs from ps tasks (tensorflow/benchmarks 8fb7907
        # scripts/tf_cnn_benchmarks/benchmark_cnn_distributed_test.py line 225); the worker keeps its environment
        assert ps[:2] == ["env", "CUDA_VISIBLE_DEVICES="] and worker[0] == "python"
        ps = ps[2:]
        assert [a for a in ps if not a.startswith("--job_name")] == [a for a in worker if not a.startswith("--job_name")]
        assert "--job_name=ps" in ps and "--job_name=worker" in worker
        assert f"--task_index={rank}" in worker
        assert "--ps_hosts=" + ",".join(f"10.11.0.{i}:50001" for i in (2, 3, 4, 5)) in worker
        assert "--worker_hosts=" + ",".join(f"10.11.0.{i}:50000" for i in (2, 3, 4, 5)) in worker
        assert "--model=resnet152" in worker and "--batch_size=32" in worker
        runner = p.command.files["/tmp/repro-tf-ps-pair.py"]
        assert runner == (REPO / "repro/run/launchers/tf_ps_pair.py").read_text(encoding="utf-8")


def test_dlperf_tf2_multi_node_worker_hosts_carry_the_port() -> None:
    # DLPerf TensorFlow/resnet50v1.5/scripts/two_node_gpu.yaml @c89430b: worker_hosts '10.11.0.2:11111,10.11.0.3:11111'
    m = find_target("dlperf-tf2-rn50-v100")
    hosts = load_hosts(GOOD / "hosts-4.yaml")
    for rank, p in enumerate(plan_cell(m, Cell(2, 8, "fp32", 128), hosts)):
        assert p.command.command[-1] == (
            "--params_override={runtime: {distribution_strategy: multi_worker_mirrored, all_reduce_alg: nccl, "
            "batchnorm_spatial_persistent: false, worker_hosts: '10.11.0.2:11111,10.11.0.3:11111', "
            f"task_index: {rank}}}, model: {{learning_rate: {{initial_lr: 1.024, warmup_epochs: 1}}}}}}")
    one = plan_cell(m, Cell(1, 8, "fp32", 128), hosts)[0].command.command
    assert not any("worker_hosts" in a for a in one)
