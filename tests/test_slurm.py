"""The Slurm back end's pure parts: times, --scheduler specs, the inventory section, and the
exact text of what it submits (the allocation's batch script, a cell's job step, the agent's
per-node spec, and a cell under pyxis, which cannot be installed here and is tested only as text).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from repro.errors import InputError, UnknownPlugin, UsageError
from repro.spec.hosts import Hosts, Node, load_hosts
from repro.spec.manifest import find_target
from repro.run.plan import plan_cell
from repro.run.schedulers import parse_spec, scheduler_config
from repro.run.schedulers.slurm import AGENT, render_pyxis, render_sbatch, seconds, srun_argv, step_spec
from repro.run.schedulers.slurm.siteenv import RANK_WRAP

#: each rank's command starts after its facts (siteenv.RANK_FACTS)
WRAP = ["sh", "-c", RANK_WRAP, "sh"]
W = shlex.join(WRAP)
DIGEST = "sha256:" + "a" * 64


def cell_of(target: str, nodes: int, gpus_per_node: int | None = None):
    m = find_target(target)
    cells = [c for c in m.select() if c.nodes == nodes and gpus_per_node in (None, c.gpus_per_node)]
    return m, cells[-1]


@pytest.mark.parametrize("text,expected", [
    ("30", 1800), ("0:45", 45), ("10:30", 630), ("1:02:03", 3723), ("2-0", 172800), ("1-02:03", 93780),
    ("1-00:00:10", 86410), ("UNLIMITED", None), ("infinite", None),
])
def test_slurm_times_in_seconds(text, expected):
    assert seconds(text) == expected


def test_scheduler_spec_and_inventory_section_merge_key_by_key():
    assert parse_spec("slurm:partition=gpu,time=2:00:00") == {"kind": "slurm", "partition": "gpu",
                                                              "time": "2:00:00"}
    inv = {"kind": "slurm", "partition": "debug", "time": 20, "container": "docker"}
    assert scheduler_config(inv, "slurm:time=45") == {"kind": "slurm", "partition": "debug", "time": "45",
                                                      "container": "docker", "_option": "kind,time"}
    assert scheduler_config(inv, "ssh") == {"kind": "ssh", "_option": "kind"}  # another kind drops the section
    assert scheduler_config(None, None) == {"kind": "ssh"}


def test_bad_scheduler_specs_name_the_fix():
    with pytest.raises(UsageError, match=r"'queue=gpu' is not KEY=VALUE with KEY one of partition, account, qos, reservation, time"):
        parse_spec("slurm:queue=gpu")
    with pytest.raises(UnknownPlugin, match=r"no scheduler 'pbs'; available: slurm, ssh"):
        scheduler_config(None, "pbs")


def test_inventory_with_only_a_slurm_section_is_valid(tmp_path: Path):
    f = tmp_path / "hosts.yaml"
    f.write_text("schema_version: 1\nscheduler: {kind: slurm, partition: gpu, time: '1:00:00', container: pyxis}\n")
    hosts = load_hosts(f)
    assert hosts.nodes == () and hosts.scheduler == {"kind": "slurm", "partition": "gpu", "time": "1:00:00",
                                                     "container": "pyxis"}


def test_inventory_scheduler_errors_name_file_and_field(tmp_path: Path):
    f = tmp_path / "hosts.yaml"
    f.write_text("schema_version: 1\nscheduler: {kind: slurm, container: singularity}\n")
    with pytest.raises(InputError) as e:
        load_hosts(f)
    assert str(e.value) == f"{f}:2: scheduler.container: 'singularity' is not one of: docker, pyxis, apptainer"
    f.write_text("schema_version: 1\nscheduler: {kind: ssh}\n")  # ssh needs nodes
    with pytest.raises(InputError) as e:
        load_hosts(f)
    assert str(e.value).endswith("nodes: no nodes: only a Slurm inventory may leave them to the scheduler")
    assert e.value.hint == "list the nodes, or add scheduler: {kind: slurm, partition: NAME}"


def test_allocation_batch_script_exact():
    cfg = {"kind": "slurm", "partition": "gpu", "account": "bench", "time": "2:00:00", "constraint": "v100"}
    assert render_sbatch(cfg, "repro-torch-rn50-cpu", 2) == """\
#!/bin/sh
#SBATCH --job-name=repro-torch-rn50-cpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --no-requeue
#SBATCH --partition=gpu
#SBATCH --account=bench
#SBATCH --time=2:00:00
#SBATCH --constraint=v100
#SBATCH --mem=0
#SBATCH --output=/dev/null
# repro holds these nodes for the run and starts each cell in them as a job step (srun --jobid)
exec sleep 2147483647
"""


def test_cell_job_step_argv_exact():
    argv = srun_argv("42", ["n1", "n2"], "repro-2n1g-fp32-bs8")
    assert argv[:-1] == ["srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2",
                         "--overlap", "--label", "--input=all", "--kill-on-bad-exit=1",
                         "--export=HOME,PATH,USER", "--job-name=repro-2n1g-fp32-bs8", "--", "python3", "-c"]
    assert argv[-1] == AGENT.read_text()
    compile(argv[-1], "agent", "exec")  # the agent runs as python3 -c on the node


def test_mpi_step_spec_head_waits_for_worker_sshd_and_only_mpi_ranks_get_keys():
    m, cell = cell_of("mpi-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)))
    spec = step_spec(plan_cell(m, cell, hosts), "RUN", cell, "img@" + DIGEST, {"/run/repro-mpi/id": (b"KEY", 0o600)},
                     12345)
    head, worker = spec["ranks"]
    common = ["--label=repro.cell=2n1g-fp32-bs8", "--label=repro.rank={}", "--label=repro.run=RUN",
              "--label=repro.target=mpi-rn50-cpu", "--network=host", "--ipc=host", "--shm-size=1g",
              "--ulimit=memlock=8388608", "-e=OMPI_ALLOW_RUN_AS_ROOT=1", "-e=OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
              "-e=OMP_NUM_THREADS=2"]
    assert head["node"] == "n1" and head["role"] == "mpi-head" and head["name"] == "repro-RUN-2n1g-fp32-bs8-rank0"
    assert head["create"][:len(common)] == [c.format(0) for c in common]
    assert head["create"][len(common):len(common) + 9] == ["img@" + DIGEST, *WRAP, "mpirun", "--allow-run-as-root", "-np",
                                                           "2"]
    assert head["files"] == {"/run/repro-mpi/id": ("KEY", 0o600),
                             "/run/repro-mpi/hostfile": ("10.0.0.1 slots=1\n10.0.0.2 slots=1\n", 0o644)}
    assert head["wait_for"] == [["10.0.0.2", 12345]]
    assert worker["create"][:len(common)] == [c.format(1) for c in common]
    # the plan's container options as they are (a CPU target: no InfiniBand devices), as over SSH
    assert worker["create"][len(common):len(common) + 6] == ["img@" + DIGEST, *WRAP, "/usr/sbin/sshd"]
    assert worker["wait_for"] == [] and worker["files"]["/run/repro-mpi/id"] == ("KEY", 0o600)
    sshd_config, mode = worker["files"]["/run/repro-mpi/sshd_config"]  # the per-run sshd of the worker
    assert set(worker["files"]) == {"/run/repro-mpi/id", "/run/repro-mpi/sshd_config"} and mode == 0o644
    assert sshd_config.startswith("Port 12345\nListenAddress 10.0.0.2\n")


def test_torch_step_spec_carries_the_launchers_argv_unchanged():
    m, cell = cell_of("torch-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)))
    plans = plan_cell(m, cell, hosts)
    spec = step_spec(plans, "RUN", cell, "img@" + DIGEST, {}, None)
    for plan, rank in zip(plans, spec["ranks"], strict=True):
        i = rank["create"].index("img@" + DIGEST)
        assert rank["create"][i + 1:i + 5] == WRAP  # the rank's facts first (siteenv.RANK_FACTS)
        assert tuple(rank["create"][i + 5:]) == plan.command.command
        assert rank["files"] == {} and rank["wait_for"] == []


PYXIS_TORCH = """\
#!/bin/sh
#SBATCH --job-name=repro-torch-rn50-cpu-2n1g-fp32-bs8
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --no-requeue
#SBATCH --partition=gpu
#SBATCH --time=30
#SBATCH --mem=0
#SBATCH --output=repro-torch-rn50-cpu-2n1g-fp32-bs8-%j.out
export GLOO_SOCKET_IFNAME=eth0
cat > repro-multi-prog.conf <<'REPRO_EOF'
0 {W} torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 10.0.0.1 --master-port 29500 \
/opt/repro/rn50_cpu.py -b 8 --prof 10 --image-size 64 --precision fp32
1 {W} torchrun --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 10.0.0.1 --master-port 29500 \
/opt/repro/rn50_cpu.py -b 8 --prof 10 --image-size 64 --precision fp32
REPRO_EOF
srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --label --export=GLOO_SOCKET_IFNAME,HOME,PATH,USER --cpu-bind=none \
'--container-image=registry.example.org:5000#repro/cpu-torch@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' \
--no-container-mount-home --container-writable --container-env=GLOO_SOCKET_IFNAME --multi-prog repro-multi-prog.conf
"""


def _unwrap(text: str) -> str:
    return text.replace(" \\\n", " ").replace("\\\n", "")


def test_pyxis_torch_cell_exact():
    m, cell = cell_of("torch-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)), env={"GLOO_SOCKET_IFNAME": "eth0"})
    text = render_pyxis(m, cell, plan_cell(m, cell, hosts), "registry.example.org:5000/repro/cpu-torch@" + DIGEST,
                        {"partition": "gpu", "time": "30"})
    assert text == _unwrap(PYXIS_TORCH).replace("{W}", W)


def test_pyxis_mpi_cell_uses_pmix_tasks_and_no_sshd():
    m, cell = cell_of("mpi-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)))
    text = render_pyxis(m, cell, plan_cell(m, cell, hosts), "nvcr.io/nvidia/pytorch@" + DIGEST, {})
    last = shlex.split(text.splitlines()[-1])
    assert last == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--label",
                    "--export=HOME,OMPI_ALLOW_RUN_AS_ROOT,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM,OMP_NUM_THREADS,PATH,USER",
                    "--cpu-bind=none", "--container-image=nvcr.io#nvidia/pytorch@" + DIGEST, "--no-container-mount-home", "--container-writable",
                    "--container-env=OMPI_ALLOW_RUN_AS_ROOT,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM,OMP_NUM_THREADS",
                    "--", *WRAP, "python3", "/opt/repro/rn50_cpu.py", "--dist", "mpi", "-b", "8", "--prof", "10",
                    "--image-size", "64", "--precision", "fp32"]
    assert "sshd" not in text and "mpirun" not in text
    assert text.splitlines()[-4:-1] == ["export OMPI_ALLOW_RUN_AS_ROOT=1", "export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                        "export OMP_NUM_THREADS=2"]


def test_pyxis_gpu_cell_mounts_dataset_read_only_and_sets_workdir():
    m, cell = cell_of("dlperf-ngc-pytorch-rn50-v100", 2, 8)
    hosts = Hosts((Node("g1", "10.0.0.1", gpus=8), Node("g2", "10.0.0.2", gpus=8)), data="/data/imagenet")
    last = shlex.split(render_pyxis(m, cell, plan_cell(m, cell, hosts), "nvcr.io/nvidia/pytorch@" + DIGEST,
                                    {}).splitlines()[-1])
    assert last[:14] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--label",
                        "--export=HOME,NCCL_DEBUG,PATH,USER",
                        "--propagate=AS,CORE,CPU,DATA,FSIZE,NOFILE,NPROC,RSS,STACK", "--cpu-bind=none",
                        "--gpus-per-node=8",
                        "--container-image=nvcr.io#nvidia/pytorch@" + DIGEST, "--no-container-mount-home", "--container-writable",
                        "--container-mounts=/data/imagenet:/data/image:ro",
                        "--container-workdir=/workspace/rn50/PyTorch/Classification/ConvNets"]


PLAN_HOSTS = """\
schema_version: 1
defaults: {gpus: 0}
env: {GLOO_SOCKET_IFNAME: eth0}
nodes:
  - {name: n1, address: 10.0.0.1}
  - {name: n2, address: 10.0.0.2}
scheduler: {kind: slurm, partition: debug, time: 20}
"""

ALLOCATION = """\
  #!/bin/sh
  #SBATCH --job-name=repro-{target}
  #SBATCH --nodes=2
  #SBATCH --ntasks-per-node=1
  #SBATCH --exclusive
  #SBATCH --no-requeue
  #SBATCH --partition=debug
  #SBATCH --time=20
  #SBATCH --mem=0
  #SBATCH --output=/dev/null
  # repro holds these nodes for the run and starts each cell in them as a job step (srun --jobid)
  exec sleep 2147483647
"""

TORCH = ("torchrun --nnodes 2 --node-rank {r} --nproc-per-node 1 --master-addr 10.0.0.1 --master-port 29500 "
         "/opt/repro/rn50_cpu.py -b 8 --prof 10 --image-size 64 --precision fp32")
CREATE = ("  task {r} on n{n}: docker create --name repro-RUN-2n1g-fp32-bs8-rank{r} --label=repro.cell=2n1g-fp32-bs8 "
          "--label=repro.rank={r} --label=repro.run=RUN --label=repro.target=torch-rn50-cpu --network=host --ipc=host "
          "--shm-size=1g --ulimit=memlock=8388608 -e=GLOO_SOCKET_IFNAME=eth0 repro/cpu-torch:2.13.0 {w} " + TORCH + "\n")


def test_plan_under_slurm_shows_the_allocation_and_each_cells_job_step_exactly(tmp_path: Path):
    from repro.run.schedulers import scheduled_plan

    f = tmp_path / "hosts.yaml"
    f.write_text(PLAN_HOSTS)
    m, cell = cell_of("torch-rn50-cpu", 2)
    hosts, text = scheduled_plan(m, [cell], f, None)
    assert [n.name for n in hosts.nodes] == ["n1", "n2"]
    assert text == ("\nslurm: partition debug, time 20\n"
                    "allocation (sbatch; none where the kit runs inside one, SLURM_JOB_ID):\n"
                    + ALLOCATION.format(target="torch-rn50-cpu") + "\ncell 2n1g-fp32-bs8: job step\n"
                    "  $ srun --jobid=JOBID --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=n1,n2 --overlap "
                    "--label --input=all --kill-on-bad-exit=1 --export=HOME,PATH,USER --job-name=repro-2n1g-fp32-bs8 -- python3 -c "
                    "<repro/run/schedulers/agent.py> < SPEC\n"
                    + CREATE.format(r=0, n=1, w=W) + CREATE.format(r=1, n=2, w=W))
    # the allocation in the plan is the batch script up submits
    assert ALLOCATION.format(target="torch-rn50-cpu").replace("  ", "", 1).replace("\n  ", "\n") == render_sbatch(
        {"partition": "debug", "time": "20"}, "repro-torch-rn50-cpu", 2)


def test_plan_under_slurm_pyxis_mpi_exact_and_stand_in_nodes_said_so(tmp_path: Path):
    from repro.run.schedulers import scheduled_plan

    f = tmp_path / "hosts.yaml"
    f.write_text(PLAN_HOSTS)
    m, cell = cell_of("mpi-rn50-cpu", 2)
    _, text = scheduled_plan(m, [cell], f, "slurm:container=pyxis")
    assert text == ("\nslurm: partition debug, time 20, container pyxis\n"
                    "allocation (sbatch; none where the kit runs inside one, SLURM_JOB_ID):\n"
                    + ALLOCATION.format(target="mpi-rn50-cpu")
                    + "image: REGISTRY/repro/cpu-torch-mpi:2.13.0@DIGEST (enroot imports the image pushed with --push "
                      "REGISTRY, by digest)\n"
                      "image file: /tmp/repro-RUN.sqsh on every node (node-local), which enroot imports from "
                      "REGISTRY/repro/cpu-torch-mpi:2.13.0@DIGEST once for the run (a job step of its own); every cell "
                      "step starts from it\n\ncell 2n1g-fp32-bs8: job step\n"
                      "  CPUs: none binding, as the publisher's launch had it (the manifest names no binding: every "
                      "CPU of the node)\n"
                      "  env GLOO_SOCKET_IFNAME=eth0\n  env OMPI_ALLOW_RUN_AS_ROOT=1\n"
                      "  env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n  env OMP_NUM_THREADS=2\n"
                      "  $ srun --mpi=pmix --jobid=JOBID --nodelist=n1,n2 --overlap --kill-on-bad-exit=1 "
                      "--job-name=repro-2n1g-fp32-bs8 --nodes=2 --ntasks=2 --ntasks-per-node=1 --label "
                      "--export=PATH=IMAGE_PATH,GLOO_SOCKET_IFNAME,HOME,OMPI_ALLOW_RUN_AS_ROOT,"
                      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM,OMP_NUM_THREADS,USER --cpu-bind=none "
                      "--container-image=/tmp/repro-RUN.sqsh --no-container-mount-home --container-writable "
                      "--container-env=GLOO_SOCKET_IFNAME,OMPI_ALLOW_RUN_AS_ROOT,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM,"
                      f"OMP_NUM_THREADS -- env PATH=IMAGE_PATH {W} python3 /opt/repro/rn50_cpu.py --dist mpi -b 8 --prof 10 "
                      "--image-size 64 --precision fp32\n"
                      "  telemetry (a job step of its own beside it, on each host, no container):\n"
                      "    $ srun --jobid=JOBID --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=n1,n2 --overlap "
                      "--label --export=HOME,PATH,USER --job-name=repro-2n1g-fp32-bs8-telemetry -- python3 -c <repro/nodes/sampler.py> 1000 "
                      "4194304 1500\n")  # launch.timeout_s 900 and the sampler's margin, 600 s
    f.write_text("schema_version: 1\nscheduler: {kind: slurm}\n")  # no nodes: Slurm names them
    hosts, text = scheduled_plan(m, [cell], f, None)
    assert [n.name for n in hosts.nodes] == ["node1", "node2"]
    assert text.splitlines()[1:3] == ["slurm", ("nodes: node1..node2 stand for the nodes Slurm allocates; `repro up` "
                                                "renders every cell with their names and addresses")]


def test_pyxis_job_step_in_the_allocation_exact():
    from repro.run.schedulers.slurm import pyxis_head, pyxis_step

    m, cell = cell_of("torch-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)), env={"GLOO_SOCKET_IFNAME": "eth0"})
    argv, env, conf = pyxis_step(m, cell, plan_cell(m, cell, hosts), "127.0.0.1:5000/repro/cpu-torch@" + DIGEST,
                                 pyxis_head("42", ["n1", "n2"], "repro-2n1g-fp32-bs8"), "/runs/r/multi-prog.conf")
    assert argv == ["srun", "--jobid=42", "--nodelist=n1,n2", "--overlap", "--kill-on-bad-exit=1",
                    "--job-name=repro-2n1g-fp32-bs8", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--label",
                    "--export=GLOO_SOCKET_IFNAME,HOME,PATH,USER", "--cpu-bind=none",
                    "--container-image=127.0.0.1:5000#repro/cpu-torch@" + DIGEST, "--no-container-mount-home", "--container-writable",
                    "--container-env=GLOO_SOCKET_IFNAME", "--multi-prog", "/runs/r/multi-prog.conf"]
    assert env == {"GLOO_SOCKET_IFNAME": "eth0"}  # to srun's environment, not its argv
    assert conf == "".join(f"{r} {W} {TORCH.format(r=r)}\n" for r in (0, 1))


def test_task_exit_statuses_from_srun_own_lines():
    from repro.run.schedulers.slurm import task_exits

    lines = ["srun: error: n2: task 1: Exited with exit code 3", "srun: error: n1: tasks 0-1: Exited with exit code 1",
             "srun: error: n1: task 2: Exited with exit code 7", "srun: Job step aborted: Waiting up to 32 seconds",
             "srun: error: elsewhere: task 9: Exited with exit code 4"]
    assert task_exits(lines, ["n1", "n2"]) == {"n1": 7, "n2": 3}


def test_pyxis_allocation_holds_a_task_per_mpi_rank():
    from repro.run.schedulers import scheduled_plan

    m = find_target("ngc-tf1-rn50-a100")
    cells = [c for c in m.select() if c.nodes == 1 and c.gpus_per_node == 8]
    _, text = scheduled_plan(m, cells, None, "slurm:container=pyxis")
    assert "  #SBATCH --ntasks-per-node=8\n" in text
    steps = [shlex.split(ln.strip()[2:]) for ln in text.splitlines() if ln.startswith("  $ srun")]
    assert len(steps) == len(cells) and all(s[:2] == ["srun", "--mpi=pmix"] and "--ntasks=8" in s for s in steps)
    _, text = scheduled_plan(m, cells, None, "slurm")  # docker: mpirun in the head container, one agent a node
    assert "  #SBATCH --ntasks-per-node=1\n" in text
