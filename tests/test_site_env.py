"""What reaches a rank under Slurm (pyxis, Apptainer), its locked-memory limit, its CPUs, its GPUs, and a
site's prelude: exact text of the rendered steps and scripts (``repro/run/schedulers/slurm/siteenv.py``).

The three publisher cells (a 4-node V100 Paddle cell, NGC TF1 under MPI, NGC PyTorch) are checked launch line
by launch line against the publisher's launch each mirrors, cited at each test; NVIDIA's practice only for
the site mechanics (the image imported once a node as a squashfs and started by pyxis's
``--container-image``; MPI ranks as srun's own tasks through Slurm's PMIx, ``srun --mpi=pmix``).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from cli_helpers import run_cli
from repro.errors import InputError
from repro.run.plan import plan_cell
from repro.run.schedulers.slurm.detached import Detach, render_detached
from repro.run.schedulers.slurm.render import pyxis_head, pyxis_step, srun_argv, step_spec
from repro.run.schedulers.slurm.siteenv import (MEMLOCK_CHECK, PROPAGATE, StepSite, clean_environ,
                                                with_prelude)
from repro.spec.hosts import Hosts, Node, load_hosts
from repro.spec.manifest import find_target
from repro.spec.scheduler import problems

DIGEST = "sha256:" + "a" * 64
#: a login shell's environment: none of it but HOME, USER, ENROOT_* and the pass-through name may reach a rank
LOGIN = {"HOME": "/home/u", "USER": "u", "PATH": "/opt/login/bin:/usr/bin", "PYTHONPATH": "/opt/login/py",
         "LD_PRELOAD": "/opt/login/lib/x.so", "LD_LIBRARY_PATH": "/opt/login/lib", "NCCL_DEBUG_SUBSYS": "ALL",
         "UCX_TLS": "tcp", "PYXIS_CONTAINER_MOUNTS": "/etc:/mnt", "ENROOT_CONFIG_PATH": "/etc/enroot",
         "NCCL_IB_HCA": "mlx5_0"}
IMAGE_PATH = "/usr/local/nvidia/bin:/usr/local/bin:/usr/bin:/bin"
#: the site: its GPUs asked as gres, NCCL_IB_HCA passed through, 80 CPUs a node (the publisher's Xeon Gold
#: 6271C x80, manifests/ngc-tf1-rn50-v100.yaml notes)
SITE = StepSite(clean_environ(LOGIN), {"export": ["NCCL_IB_HCA"], "gpu_request": "gres"}, 8, 80)
V100 = Hosts(tuple(Node(f"v{i}", f"10.0.0.{i}", gpus=8) for i in range(1, 5)), data="/data/imagenet", gpus=8)
PROPAGATED = "--propagate=AS,CORE,CPU,DATA,FSIZE,NOFILE,NPROC,RSS,STACK"  # every limit Slurm names but MEMLOCK
CHECK = ["sh", "-c", MEMLOCK_CHECK, "sh"]


def cell_of(target: str, nodes: int, gpus_per_node: int, precision: str):
    m = find_target(target)
    return m, next(c for c in m.select() if (c.nodes, c.gpus_per_node, c.precision) == (nodes, gpus_per_node,
                                                                                       precision))


def step(target: str, nodes: int, gpus_per_node: int, precision: str):
    m, cell = cell_of(target, nodes, gpus_per_node, precision)
    names = [n.name for n in V100.nodes[:nodes]]
    return pyxis_step(m, cell, plan_cell(m, cell, V100), "/tmp/repro-R.sqsh",
                      pyxis_head("42", names, f"repro-{cell.key}"), "/r/multi-prog.conf",
                      image_env={"PATH": IMAGE_PATH}, site=SITE)


def head(key: str, nodes: int, mpi: bool = False) -> list[str]:
    return ["srun", *(["--mpi=pmix"] if mpi else []), "--jobid=42",
            f"--nodelist={','.join(f'v{i}' for i in range(1, nodes + 1))}", "--overlap", "--kill-on-bad-exit=1",
            f"--job-name=repro-{key}"]


def test_paddle_4_node_v100_cell_exact():
    """PaddlePaddle/Perf ResNet50V1.5 (c1ad14b, clas_fp16.sh): ``python -m paddle.distributed.launch
    --gpus=0,...,7 --ips=NODE,...`` once a node, which starts that node's 8 trainers, no binding: one task a
    node keeping every CPU of the exclusive node (``--cpu-bind=none``)."""
    argv, env, conf = step("paddle-rn50-v100", 4, 8, "fp16")
    flags = sorted(k for k in env)
    assert argv == [*head("4n8g-fp16-bs256", 4), "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--label",
                    f"--export=PATH={IMAGE_PATH},{','.join(sorted(['ENROOT_CONFIG_PATH', 'HOME', 'NCCL_IB_HCA', 'USER', *flags]))}",
                    PROPAGATED, "--cpu-bind=none", "--gres=gpu:8", "--container-image=/tmp/repro-R.sqsh",
                    "--no-container-mount-home", "--container-writable",
                    "--container-mounts=/data/imagenet:/workspace/PaddleClas/dataset/ILSVRC2012:ro",
                    "--container-workdir=/workspace/PaddleClas",
                    f"--container-env={','.join(sorted([*flags, 'NCCL_IB_HCA']))}", "--multi-prog",
                    "/r/multi-prog.conf"]
    assert flags == ["FLAGS_conv_workspace_size_limit", "FLAGS_cudnn_batchnorm_spatial_persistent",
                     "FLAGS_cudnn_exhaustive_search", "FLAGS_eager_delete_tensor_gb",
                     "FLAGS_fraction_of_gpu_memory_to_use", "FLAGS_max_inplace_grad_add", "NCCL_DEBUG"]
    launch = ("python -m paddle.distributed.launch --gpus=0,1,2,3,4,5,6,7 --ips=10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4 "
              "ppcls/static/train.py -c ppcls/configs/ImageNet/ResNet/ResNet50_amp_O2_ultra.yaml "
              "-o DataLoader.Train.sampler.batch_size=256 -o Global.epochs=32 -o DataLoader.Train.loader.num_workers=8 "
              "-o Global.eval_during_train=False -o fuse_elewise_add_act_ops=True -o enable_addto=True")
    assert conf == "".join(f"{r} env PATH={IMAGE_PATH} POD_IP=10.0.0.{r + 1} {shlex.join(CHECK)} {launch}\n"
                           for r in range(4))


@pytest.mark.parametrize("nodes,bind", [(1, ["--cpu-bind=sockets", "--cpus-per-task=10"]), (4, ["--cpu-bind=none"])])
def test_ngc_tf1_mpi_cells_exact(nodes: int, bind: list[str]):
    """PaddlePaddle/Perf OtherReports/TensorFlow (c1ad14b): tf_test_all.sh runs 8 GPUs as ``mpiexec
    --allow-run-as-root --bind-to socket -np 8 python3 main.py`` (each rank its socket's CPUs: 80 / 8 = 10 a
    task); tf_test_dist_all.sh runs 32 GPUs under ``orterun`` with ``slots=8`` and ``--bind-to none``. Under
    Slurm the ranks are srun's tasks through PMIx (no mpirun, no sshd), 8 a node."""
    argv, env, conf = step("ngc-tf1-rn50-v100", nodes, 8, "amp")
    key = f"{nodes}n8g-amp-bs256"
    names = sorted(env)
    assert conf is None and argv == [
        *head(key, nodes, mpi=True), f"--nodes={nodes}", f"--ntasks={nodes * 8}", "--ntasks-per-node=8", "--label",
        f"--export=PATH={IMAGE_PATH},{','.join(sorted(['ENROOT_CONFIG_PATH', 'HOME', 'NCCL_IB_HCA', 'USER', *names]))}",
        PROPAGATED, *bind, "--gres=gpu:8", "--container-image=/tmp/repro-R.sqsh", "--no-container-mount-home",
        "--container-writable", "--container-mounts=/data/imagenet:/data/tfrecords:ro",
        "--container-workdir=/workspace/DeepLearningExamples/TensorFlow/Classification/ConvNets",
        f"--container-env={','.join(sorted([*names, 'NCCL_IB_HCA']))}", "--", "env", f"PATH={IMAGE_PATH}", *CHECK,
        "python3", "main.py", "--mode=training_benchmark", "--use_xla", "--warmup_steps", "200", "--num_iter", "500",
        "--iter_unit", "batch", "--batch_size", "256", "--data_dir=/data/tfrecords/",
        f"--results_dir=/tmp/result/gpu{nodes * 8}_amp_bs256", "--use_tf_amp", "--use_static_loss_scaling",
        "--loss_scale=128", *(["--lr_init=0.01"] if nodes == 4 else [])]
    assert "mpirun" not in argv and "sshd" not in shlex.join(argv)


def test_ngc_pytorch_cell_exact():
    """PaddlePaddle/Perf OtherReports/PyTorch (c1ad14b): ``python ./multiproc.py --nnodes 4 --nproc_per_node 8
    --node_rank N`` once a node (32 GPUs: one MPI slot a node), which starts that node's 8 processes: one task
    a node, every CPU kept."""
    argv, env, conf = step("ngc-pytorch-rn50-v100", 4, 8, "amp")
    assert env == {"NCCL_DEBUG": "INFO", "IBV_DRIVERS": "mlx5"}
    assert argv == [*head("4n8g-amp-bs256", 4), "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--label",
                    f"--export=PATH={IMAGE_PATH},ENROOT_CONFIG_PATH,HOME,IBV_DRIVERS,NCCL_DEBUG,NCCL_IB_HCA,USER",
                    PROPAGATED, "--cpu-bind=none", "--gres=gpu:8", "--container-image=/tmp/repro-R.sqsh",
                    "--no-container-mount-home", "--container-writable", "--container-mounts=/data/imagenet:/imagenet:ro",
                    "--container-workdir=/workspace/DeepLearningExamples/PyTorch/Classification/ConvNets",
                    "--container-env=IBV_DRIVERS,NCCL_DEBUG,NCCL_IB_HCA", "--multi-prog", "/r/multi-prog.conf"]
    assert conf == "".join(
        f"{r} env PATH={IMAGE_PATH} {shlex.join(CHECK)} python ./multiproc.py --master_addr 10.0.0.1 --master_port 29500 "
        f"--nnodes 4 --nproc_per_node 8 --node_rank {r} ./main.py --arch resnet50 -b 256 --training-only -p 1 "
        "--raport-file benchmark.json --amp --epochs 1 --prof 100 /imagenet\n" for r in range(4))


def test_nothing_of_the_login_shell_but_what_is_named_reaches_a_rank():
    argv, _, _ = step("ngc-pytorch-rn50-v100", 4, 8, "amp")
    exported = next(a for a in argv if a.startswith("--export=")).split(",")
    for name in ("PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "NCCL_DEBUG_SUBSYS", "UCX_TLS"):
        assert not any(e == name or e.startswith(name + "=") for e in exported)
    # srun's own environment holds no PYXIS_*: pyxis would read it as an option of the container
    assert "PYXIS_CONTAINER_MOUNTS" not in clean_environ(LOGIN) and "NCCL_IB_HCA" in clean_environ(LOGIN)


def test_the_docker_path_passes_what_it_passed():
    """The agent's step names what it passes (the agent runs on the host: ``siteenv.host_export``); each
    container gets the manifest's and the hosts file's environment alone, as ``docker create -e``."""
    m, cell = cell_of("torch-rn50-cpu", 2, 1, "fp32")
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)), env={"GLOO_SOCKET_IFNAME": "eth0"})
    assert srun_argv("42", ["n1", "n2"], "s")[:-1] == [
        "srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap",
        "--label", "--input=all", "--kill-on-bad-exit=1", "--export=HOME,PATH,USER", "--job-name=s", "--",
        "python3", "-c"]
    spec = step_spec(plan_cell(m, cell, hosts), "RUN", cell, "img", {}, None)
    assert [[w for w in r["create"] if w.startswith("-e=")] for r in spec["ranks"]] == [
        ["-e=GLOO_SOCKET_IFNAME=eth0"]] * 2
    # a CPU target's container asks for no GPU
    assert not any(w.startswith("--gpus") for r in spec["ranks"] for w in r["create"])


@pytest.mark.parametrize("how,flag", [("gpus-per-node", "--gpus-per-node=8"), ("gres", "--gres=gpu:8"),
                                      ("none", "--gres=gpu:8")])
def test_every_step_of_a_gpu_cell_asks_for_the_nodes_gpus(how: str, flag: str):
    """Under ``gpu_request: none`` with ``--exclusive`` alone the job holds no GPU and a step asked for none
    got none; each step now asks for the node's GPUs, and Slurm refuses it where the job holds none."""
    m, cell = cell_of("ngc-pytorch-rn50-v100", 4, 8, "amp")
    site = StepSite({}, {"gpu_request": how}, 8)
    argv, _, _ = pyxis_step(m, cell, plan_cell(m, cell, V100), "/f", ["srun"], "/c", site=site)
    assert [a for a in argv if a.startswith(("--gpus", "--gres"))] == [flag]
    cpu, cell = cell_of("torch-rn50-cpu", 2, 1, "fp32")
    argv, _, _ = pyxis_step(cpu, cell, plan_cell(cpu, cell, V100), "/f", ["srun"], "/c", site=site)
    assert not any(a.startswith(("--gpus", "--gres")) for a in argv)


def test_only_cells_that_ask_for_unlimited_locked_memory_propagate_all_but_memlock():
    assert PROPAGATE == PROPAGATED
    m, cell = cell_of("torch-rn50-cpu", 2, 1, "fp32")
    argv, _, conf = pyxis_step(m, cell, plan_cell(m, cell, V100), "/f", ["srun"], "/c")
    assert PROPAGATED not in argv and "PropagateResourceLimitsExcept" not in conf


def test_a_limited_locked_memory_stops_the_rank_with_the_value_and_the_fix():
    done = subprocess.run(["sh", "-c", 'ulimit -l 64 && exec "$@"', "sh", *CHECK, "echo", "ran"],
                          capture_output=True, text=True)
    assert done.returncode == 97 and done.stdout.startswith("#repro-site rank - memlock 64 cpus ")
    assert not any(ln == "ran" for ln in done.stdout.splitlines())
    assert done.stderr == ("repro: locked memory is limited to 64 KiB in the container of this rank; the cell asks "
                           "for unlimited (RDMA): give slurmd LimitMEMLOCK=infinity (its systemd unit) on every "
                           "compute node, or set PropagateResourceLimitsExcept=MEMLOCK in slurm.conf\n")


@pytest.mark.parametrize("option", ["--export=ALL,LD_PRELOAD=/x.so", "--propagate=ALL", "--cpu-bind=cores",
                                    "--cpus-per-task=4"])
def test_sbatch_extra_refuses_what_the_kits_steps_set(option: str):
    assert [p.why for p in problems({"sbatch_extra": [option]})] == [
        f"{option!r} sets {option.partition('=')[0]}, which the kit writes itself"]


def test_the_pass_through_list_is_names(tmp_path: Path):
    assert problems({"export": ["NCCL_IB_HCA", "UCX_NET_DEVICES"]}) == []
    assert [p.why for p in problems({"export": ["A", "LD_PRELOAD=/x"]})] == [
        "'LD_PRELOAD=/x' is not an environment variable's name (letters, digits and '_', not a digit first; "
        "not PYXIS_*, which the kit gives pyxis itself)"]
    assert problems({"export": ["PYXIS_CONTAINER_MOUNTS"]})[0].item == 0
    f = tmp_path / "h.yaml"
    f.write_text('schema_version: 1\nprelude: [". /etc/a\\nrm -rf /"]\nscheduler: {kind: slurm}\n')
    with pytest.raises(InputError, match="holds a line break or NUL"):
        load_hosts(f)


PRELUDE_HOSTS = """\
schema_version: 1
defaults: {gpus: 0}
nodes:
  - {name: n1, address: 10.0.0.1}
  - {name: n2, address: 10.0.0.2}
prelude: ['. /shared/site/modules.sh', 'export SITE_READY=1']
modules: [site-mpi/4.1]
scheduler: {kind: slurm, partition: debug, time: 20, container: pyxis, export: [SITE_READY]}
"""


def test_the_prelude_runs_before_every_step_in_the_batch_script_and_the_attached_allocation(tmp_path: Path):
    f = tmp_path / "hosts.yaml"
    f.write_text(PRELUDE_HOSTS)
    hosts = load_hosts(f)
    m = find_target("torch-rn50-cpu")
    cells = m.select([{"nodes": 2}])
    text = render_detached(Detach(m, cells, hosts, dict(hosts.scheduler), "r/i@" + DIGEST, run_id="RUN",
                                  environ={"SITE_READY": "0"})).text
    lines = text.splitlines()
    at = lines.index("# the site's prelude (the hosts file's prelude and modules)")
    assert lines[at - 1:at + 6] == [
        'for v in $(env | sed -n "s/^\\(PYXIS_[A-Za-z0-9_]*\\)=.*/\\1/p"); do unset "$v"; done',
        "# the site's prelude (the hosts file's prelude and modules)", "set +u", ". /shared/site/modules.sh",
        "export SITE_READY=1", "module load site-mpi/4.1", "set -u"]
    assert at < min(i for i, ln in enumerate(lines) if ln.startswith("srun "))  # before any step
    step = next(ln for ln in lines if "--job-name=repro-2n1g-fp32-bs8 " in ln)
    # what the prelude set reaches the ranks through the pass-through list alone
    assert "--export=PATH=\"${REPRO_PATH}\",HOME,SITE_READY,USER --cpu-bind=none " in step
    assert "--container-env=SITE_READY " in step
    # the attached allocation: srun started by sh after the same lines
    assert with_prelude(["a", "b"], ["srun", "x"]) == ["sh", "-c", 'a\nb\nexec "$@"', "sh", "srun", "x"]
    res = run_cli("plan", "torch-rn50-cpu", "--hosts", f, "--cells", "nodes=2", "--wide")
    assert res.returncode == 0, res.stderr
    assert ("prelude (the hosts file's prelude and modules, verbatim: in the batch script, and before each attached "
            "step):\n  . /shared/site/modules.sh\n  export SITE_READY=1\n  module load site-mpi/4.1\n") in res.stdout


def test_plan_script_needs_no_run_directory(tmp_path: Path):
    f = tmp_path / "hosts.yaml"
    f.write_text(PRELUDE_HOSTS)
    res = run_cli("plan", "torch-rn50-cpu", "--hosts", f, "--cells", "nodes=2", "--script", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("#!/bin/sh\n#SBATCH --job-name=repro-torch-rn50-cpu\n")
    assert "module load site-mpi/4.1\n" in res.stdout and not list(tmp_path.glob("runs*"))


def test_the_plan_shows_the_squashfs_and_the_publishers_binding(tmp_path: Path):
    f = tmp_path / "hosts.yaml"
    f.write_text("schema_version: 1\ndefaults: {gpus: 8}\ndata: /data/imagenet\nnodes:\n"
                 "  - {name: v1, address: 10.0.0.1}\nscheduler: {kind: slurm, container: pyxis}\n")
    res = run_cli("plan", "ngc-tf1-rn50-v100", "--hosts", f, "--cells", "nodes=1,gpus_per_node=8,precision=amp",
                  "--wide")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "image file: /tmp/repro-RUN.sqsh on every node (node-local), which enroot imports from " in out
    assert ("  CPUs: socket binding, as the publisher's launch had it (PaddlePaddle/Perf OtherReports/TensorFlow "
            "(c1ad14b): tf_test_all.sh runs 8 GPUs as mpiexec") in out
    assert "--cpu-bind=sockets --cpus-per-task=CPUS_PER_NODE/8 " in out
    assert "--container-image=/tmp/repro-RUN.sqsh " in out
    # srun --mpi starts the ranks: no mpirun or sshd line that never runs under Slurm
    assert "$ mpirun" not in out and "sshd" not in out


def test_srun_starts_without_pyxis_options_from_this_process(monkeypatch: pytest.MonkeyPatch):
    """Every job step's srun (attached) starts in this process's environment less ``PYXIS_*``."""
    from repro.run.schedulers.slurm import steps

    seen_env: dict[str, str] = {}

    class Stop(Exception):
        pass

    def popen(argv, env=None, **_):
        seen_env.update(env)
        raise Stop

    monkeypatch.setenv("PYXIS_CONTAINER_MOUNTS", "/etc:/mnt")
    monkeypatch.setenv("REPRO_KEPT", "1")
    monkeypatch.setattr(steps.subprocess, "Popen", popen)
    with pytest.raises(Stop):
        steps.JobStep(None, ["srun"], steps.Demux([]), env={"A": "1"}).start()
    assert "PYXIS_CONTAINER_MOUNTS" not in seen_env and seen_env["REPRO_KEPT"] == "1" and seen_env["A"] == "1"


def test_an_image_path_srun_cannot_export_is_refused():
    from repro.errors import UsageError

    m, cell = cell_of("torch-rn50-cpu", 2, 1, "fp32")
    with pytest.raises(UsageError, match="cannot go to srun --export"):
        pyxis_step(m, cell, plan_cell(m, cell, V100), "/f", ["srun"], "/c", image_env={"PATH": "/a,/b"})


def test_a_detached_socket_bound_step_shares_the_batch_nodes_cpus(tmp_path: Path):
    """tf_test_all.sh's ``--bind-to socket`` at 8 GPUs (above), in the batch script: each task's share of
    the node's CPUs from Slurm's own count, filled in before the repeats."""
    f = tmp_path / "hosts.yaml"
    f.write_text(PRELUDE_HOSTS.replace("defaults: {gpus: 0}", "defaults: {gpus: 8}\ndata: /data"))
    hosts = load_hosts(f)
    m, cell = cell_of("ngc-tf1-rn50-v100", 1, 8, "amp")
    lines = render_detached(Detach(m, [cell], hosts, dict(hosts.scheduler), "r/i@" + DIGEST, run_id="RUN",
                                   environ={})).text.splitlines()
    share = lines.index("REPRO_CPT=$((${SLURM_CPUS_ON_NODE:-8} / 8))")
    step = next(i for i, ln in enumerate(lines) if "--job-name=repro-1n8g-amp-bs256 " in ln)
    assert share < step and ' --cpu-bind=sockets --cpus-per-task="${REPRO_CPT}" --gpus-per-node=8 ' in lines[step]
