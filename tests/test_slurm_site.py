"""What a site asks of a Slurm allocation (GPUs per node, memory, its own #SBATCH lines), checked by the one
settings table before anything is rendered; what ``repro plan`` shows under pyxis and Apptainer; and the
exact text of an Apptainer cell (Apptainer is not installable here: every flag is checked against its
documentation, cited beside each assertion)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cli_helpers import run_cli
from repro.errors import InputError, UsageError
from repro.run.plan import plan_cell
from repro.run.schedulers import parse_spec, scheduled_plan, scheduler_config
from repro.run.schedulers.slurm import render_sbatch
from repro.run.schedulers.slurm.apptainer import (BUILD, FORWARD, apptainer_step, build_argv, build_result,
                                                  seen_argv, sif_path, sif_source, unseen)
from repro.run.schedulers.slurm.render import pyxis_head
from repro.run.schedulers.slurm.siteenv import RANK_WRAP
from repro.spec.hosts import Hosts, Node, load_hosts
from repro.spec.manifest import find_target
from repro.spec.scheduler import problems

DIGEST = "sha256:" + "a" * 64
HEAD = ["#!/bin/sh", "#SBATCH --job-name=j", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive", "#SBATCH --no-requeue"]
TAIL = ["#SBATCH --output=/dev/null",
        "# repro holds these nodes for the run and starts each cell in them as a job step (srun --jobid)",
        "exec sleep 2147483647"]


def script(*site: str) -> str:
    return "\n".join([*HEAD, *(f"#SBATCH {s}" for s in site), *TAIL]) + "\n"


# --- the batch script's site options ---------------------------------------------------------------------

def test_gpus_per_node_by_default_gres_where_the_site_prefers_and_none_for_gpu_less_nodes():
    assert render_sbatch({"partition": "gpu"}, "j", 2, gpus=8) == script(
        "--partition=gpu", "--gpus-per-node=8", "--mem=0")
    assert render_sbatch({"partition": "gpu", "gpu_request": "gres"}, "j", 2, gpus=8) == script(
        "--partition=gpu", "--gres=gpu:8", "--mem=0")
    assert render_sbatch({"gpu_request": "none"}, "j", 2, gpus=8) == script("--mem=0")
    for gpus in (0, None):  # the GPU-less test cluster (gpus: 0) and an inventory that does not say
        assert render_sbatch({"gpu_request": "gres"}, "j", 2, gpus=gpus) == script("--mem=0")


def test_memory_all_of_each_node_unless_the_site_says_otherwise():
    assert render_sbatch({"mem": "200G"}, "j", 2) == script("--mem=200G")
    assert render_sbatch({"mem": "none"}, "j", 2) == script()


def test_every_site_option_in_the_settings_order_then_the_sites_own_lines():
    cfg = {"sbatch_extra": ["--signal=B:USR1@120", "--mail-type=END", "--comment=rn50"], "exclude": "n[3-4]",
           "qos": "high", "reservation": "maint", "partition": "gpu", "account": "bench", "time": "2:00:00",
           "constraint": "v100&ib", "gpu_request": "gres", "mem": "0"}
    assert render_sbatch(cfg, "j", 2, gpus=4) == script(
        "--partition=gpu", "--account=bench", "--qos=high", "--reservation=maint", "--time=2:00:00",
        "--constraint=v100&ib", "--exclude=n[3-4]", "--gres=gpu:4", "--mem=0", "--signal=B:USR1@120",
        "--mail-type=END", "--comment=rn50")
    # one line from --scheduler (its values are split at ','), checked the same way
    assert parse_spec("slurm:sbatch_extra=--mail-type=END") == {"kind": "slurm", "sbatch_extra": "--mail-type=END"}
    assert render_sbatch({"sbatch_extra": "--mail-type=END"}, "j", 2) == script("--mem=0", "--mail-type=END")


@pytest.mark.parametrize("key,value,why", [
    ("gpu_request", "gpus", "is not one of gpus-per-node, gres, none"),
    ("mem", "all", "is not a Slurm memory size"), ("mem", "0\n#SBATCH --wrap=id", "is not a Slurm memory size"),
    ("mem", "-1", "is not a Slurm memory size"),
    ("sbatch_extra", ["--comment=a", "--comment=b\n#SBATCH --wrap=id"], "'--comment=b\\n#SBATCH --wrap=id' holds '\\n'"),
    ("sbatch_extra", ["--comment=$(id)"], "'--comment=$(id)' holds '$'"),
    ("sbatch_extra", ["--comment=a;b"], "holds ';'"), ("sbatch_extra", ["--comment=a b"], "holds ' '"),
    ("sbatch_extra", ["--comment=`id`"], "holds '`'"), ("sbatch_extra", ["--x='a'"], "holds \"'\""),
    ("sbatch_extra", ["-N 4"], "holds ' '"), ("sbatch_extra", ["comment=x"], "is not --OPTION or --OPTION=VALUE"),
    ("sbatch_extra", ["--partition=other"], "sets --partition, which the kit writes itself from the setting partition"),
    ("sbatch_extra", ["--nodes=8"], "sets --nodes, which the kit writes itself"),
    ("sbatch_extra", ["--output=/tmp/x"], "sets --output, which the kit writes itself"),
    ("sbatch_extra", ["--mem-per-cpu=4G"], "sets --mem-per-cpu, which the kit writes unless mem: none"),
    ("sbatch_extra", ["--gres=gpu:4,nic:1"], "sets --gres, which the kit writes unless gpu_request: none"),
    ("sif_dir", "relative/dir", "is not an absolute path"), ("sif_dir", "/a b", "is not an absolute path"),
    ("container", "singularity", "is not one of docker, pyxis, apptainer"),
])
def test_site_values_that_could_add_a_line_an_option_or_a_conflict_are_refused(key, value, why):
    found = problems({key: value})
    assert len(found) == 1 and found[0][0] == key and why in found[0][1], found


def test_an_option_a_setting_renders_is_the_sites_own_where_that_setting_is_none():
    assert problems({"gpu_request": "none", "sbatch_extra": ["--gres=gpu:4,nic:1"]}) == []
    assert problems({"mem": "none", "sbatch_extra": ["--mem-per-cpu=4G"]}) == []
    assert render_sbatch({"gpu_request": "none", "mem": "none", "sbatch_extra": ["--gres=gpu:4,nic:1"]}, "j", 2,
                         gpus=4) == script("--gres=gpu:4,nic:1")


def test_a_bad_site_value_never_reaches_a_script():
    with pytest.raises(UsageError, match="scheduler sbatch_extra: '--wrap=id;id' holds"):
        render_sbatch({"sbatch_extra": ["--wrap=id;id"]}, "j", 1)


# --- the inventory -------------------------------------------------------------------------------------------

SITE = """\
schema_version: 1
defaults: {gpus: 8}
scheduler:
  kind: slurm
  partition: gpu
  gpu_request: gres
  mem: 0
  sbatch_extra:
    - --signal=B:USR1@120
    - --comment=rn50
"""


def test_the_inventory_gives_the_gpus_and_keeps_the_sites_lines_a_list(tmp_path: Path):
    f = tmp_path / "slurm.yaml"
    f.write_text(SITE)
    hosts = load_hosts(f)
    assert hosts.gpus == 8 and hosts.nodes == ()
    cfg = scheduler_config(hosts.scheduler, "slurm:qos=high")
    assert cfg["sbatch_extra"] == ["--signal=B:USR1@120", "--comment=rn50"] and cfg["mem"] == "0"
    f.write_text("schema_version: 1\nnodes:\n  - {address: a, gpus: 8}\n  - {address: b, gpus: 4}\n")
    assert load_hosts(f).gpus == 4  # the fewest any node has: what every node of the allocation can give
    f.write_text("schema_version: 1\nnodes:\n  - {address: a, gpus: 8}\n  - {address: b}\n")
    assert load_hosts(f).gpus is None  # not said for every node: no GPU request


def test_bad_site_values_in_the_inventory_name_file_line_and_field(tmp_path: Path):
    f = tmp_path / "slurm.yaml"
    f.write_text(SITE.replace("--comment=rn50", "'--comment=rn50; id'").replace("mem: 0", "mem: lots"))
    with pytest.raises(InputError) as e:
        load_hosts(f)
    assert str(e.value).splitlines() == [
        f"{f}:7: scheduler.mem: 'lots' is not a Slurm memory size (0 for all of a node's memory, e.g. 200G) or none",
        f"{f}:10: scheduler.sbatch_extra[1]: '--comment=rn50; id' holds ';': each item is one long option of "
        "sbatch"]
    f.write_text(SITE.replace("gpu_request: gres", "gpu_request: [gres]"))
    with pytest.raises(InputError, match=r":6: scheduler.gpu_request: "):
        load_hosts(f)


def test_plan_refuses_a_bad_site_value_and_an_unknown_runtime_with_exit_2(tmp_path: Path):
    f = tmp_path / "slurm.yaml"
    f.write_text(SITE.replace("--comment=rn50", "--comment=$(id)"))
    res = run_cli("plan", "torch-rn50-cpu", "--hosts", f)
    assert res.returncode == 2 and "Traceback" not in res.stderr + res.stdout
    assert f"{f}:10: scheduler.sbatch_extra[1]: '--comment=$(id)' holds '$'" in res.stderr
    for spec in ("slurm:container=singularity", "slurm:container=enroot"):
        res = run_cli("plan", "torch-rn50-cpu", "--scheduler", spec)
        assert res.returncode == 2 and "Traceback" not in res.stderr + res.stdout, res
        assert f"--scheduler container: '{spec.partition('=')[2]}' is not one of docker, pyxis, apptainer" \
            in res.stderr


# --- what repro plan shows -----------------------------------------------------------------------------------

PLAN_HOSTS = """\
schema_version: 1
defaults: {gpus: 0}
env: {GLOO_SOCKET_IFNAME: eth0}
nodes:
  - {name: n1, address: 10.0.0.1}
  - {name: n2, address: 10.0.0.2}
scheduler: {kind: slurm, partition: debug, qos: high, sbatch_extra: [--comment=rn50]}
"""
TORCH = ("torchrun --nnodes 2 --node-rank {r} --nproc-per-node 1 --master-addr 10.0.0.1 --master-port 29500 "
         "/opt/repro/rn50_cpu.py -b 8 --prof 10 --image-size 64 --precision fp32")


def test_plan_shows_the_site_options_in_the_allocation(tmp_path: Path):
    f = tmp_path / "hosts.yaml"
    f.write_text(PLAN_HOSTS)
    res = run_cli("plan", "torch-rn50-cpu", "--hosts", f, "--cells", "nodes=2")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    start = text.index("\nslurm: ")
    assert text[start:text.index("# repro holds")] == (
        "\nslurm: partition debug, qos high, sbatch_extra --comment=rn50\n"
        "allocation (sbatch; none where the kit runs inside one, SLURM_JOB_ID):\n"
        "  #!/bin/sh\n  #SBATCH --job-name=repro-torch-rn50-cpu\n  #SBATCH --nodes=2\n"
        "  #SBATCH --ntasks-per-node=1\n  #SBATCH --exclusive\n  #SBATCH --no-requeue\n"
        "  #SBATCH --partition=debug\n  #SBATCH --qos=high\n  #SBATCH --mem=0\n  #SBATCH --comment=rn50\n"
        "  #SBATCH --output=/dev/null\n  ")
    assert "    docker run --network=host" in text  # docker: each rank's container options


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_plan_under_pyxis_or_apptainer_prints_no_docker_run_line(tmp_path: Path, runtime: str):
    f = tmp_path / "hosts.yaml"
    f.write_text(PLAN_HOSTS)
    res = run_cli("plan", "torch-rn50-cpu", "--hosts", f, "--cells", "nodes=2", "--wide",
                  "--scheduler", f"slurm:container={runtime},sif_dir=/shared/sif")
    assert res.returncode == 0, res.stderr
    assert "docker run" not in res.stdout and "docker create" not in res.stdout
    cell = res.stdout[res.stdout.index("cell 2n1g-fp32-bs8: 2 node(s)"):res.stdout.index("\nslurm:")]
    assert cell == (f"cell 2n1g-fp32-bs8: 2 node(s) x 1 worker(s) = 2 worker(s), fp32, batch 8/worker\n"
                    f"  image: repro/cpu-torch:2.13.0\n"
                    f"  rank 0 on n1 (10.0.0.1) [worker]\n    {runtime}: in the cell's job step (below)\n"
                    f"    $ {TORCH.format(r=0)}\n"
                    f"  rank 1 on n2 (10.0.0.2) [worker]\n    {runtime}: in the cell's job step (below)\n"
                    f"    $ {TORCH.format(r=1)}\n")
    step = res.stdout[res.stdout.index("cell 2n1g-fp32-bs8: job step"):]
    # under pyxis each step starts from the node-local squashfs the run's image step imports
    launch = "--container-image=/tmp/repro-RUN.sqsh" if runtime == "pyxis" else \
        "--multi-prog RUN_DIR/cells/2n1g-fp32-bs8/rN/multi-prog.conf"
    assert launch in step


# --- apptainer -----------------------------------------------------------------------------------------------

def cell_of(target: str, nodes: int, gpus_per_node: int | None = None):
    m = find_target(target)
    cells = [c for c in m.select() if c.nodes == nodes and gpus_per_node in (None, c.gpus_per_node)]
    return m, cells[-1]


HEAD_ARGV = ["srun", "--jobid=42", "--nodelist=n1,n2", "--overlap", "--kill-on-bad-exit=1",
             "--job-name=repro-2n1g-fp32-bs8"]
# the wrapper every task runs apptainer under: --cleanenv keeps only APPTAINERENV_* (apptainer
# internal/pkg/util/env/create.go, SetContainerEnv; the user guide's environment_and_metadata.rst), so the
# task's PMIX_*/PMI_*/SLURM_* variables are re-exported with that prefix first
WRAP = ["sh", "-c", FORWARD, "sh"]
#: inside the container each rank's command starts after its facts (siteenv.RANK_FACTS)
FACTS = ["sh", "-c", RANK_WRAP, "sh"]


def test_the_sif_is_built_once_from_the_locked_image_by_digest_and_its_sha256_read_back():
    sif = sif_path("/shared/sif/", "RUN1")
    assert sif == "/shared/sif/repro-RUN1.sif"
    # apptainer build [options] IMAGE_PATH BUILD_SPEC with BUILD_SPEC docker://REF (the user guide's
    # build_a_container.rst); -F/--force "overwrite an image file if it exists" (commonForceFlag in
    # cmd/internal/cli/apptainer.go, registered for build in build.go); `apptainer --version` prints
    # "apptainer version X" (SetVersionTemplate in apptainer.go)
    assert build_argv("42", "n1", sif, "reg:5000/repro/cpu-torch@" + DIGEST) == [
        "srun", "--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n1", "--overlap", "--export=HOME,PATH,USER",
        "--job-name=repro-sif",
        "sh", "-c", 'apptainer --version && apptainer build --force "$1" "$2" >&2 && sha256sum "$1" && '
        'stat -c "size %s" "$1"', "sh", sif, "docker://reg:5000/repro/cpu-torch@" + DIGEST]
    assert BUILD.count("apptainer build") == 1
    out = ["apptainer version 1.3.4", f"{'b' * 64}  {sif}", "size 334000128"]
    assert build_result(out, sif) == {"apptainer": "apptainer version 1.3.4", "sha256": "b" * 64,
                                      "size": 334000128}
    assert build_result(["apptainer version 1.3.4"], sif) == {"apptainer": "apptainer version 1.3.4",
                                                              "sha256": None, "size": None}


def test_every_node_of_a_cell_must_see_the_sif_where_it_was_built():
    assert seen_argv("42", ["n1", "n2"], "/shared/sif/r.sif") == [
        "srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap",
        "--label", "--export=HOME,PATH,USER", "--job-name=repro-sif-seen", "stat", "-c", "%s", "--", "/shared/sif/r.sif"]
    said = ["0: 334000128", "1: stat: cannot statx '/shared/sif/r.sif': No such file or directory",
            "srun: error: n2: task 1: Exited with exit code 1"]
    assert unseen(said, ["n1", "n2"], 334000128) == ["n2"]
    assert unseen(["1: 334000128", "0: 334000128"], ["n1", "n2"], 334000128) == []
    assert unseen(["0: 1024"], ["n1"], 334000128) == ["n1"]  # another file of that name: not the one built
    with pytest.raises(UsageError, match="by digest"):
        sif_source("repro/cpu-torch:2.13.0")


def test_apptainer_torch_cell_exact():
    m, cell = cell_of("torch-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)), env={"GLOO_SOCKET_IFNAME": "eth0"})
    argv, env, conf = apptainer_step(m, cell, plan_cell(m, cell, hosts), "/shared/sif/repro-R.sif", HEAD_ARGV,
                                     "/runs/r/multi-prog.conf")
    # the host's PATH by name (apptainer runs there), the target's variables as APPTAINERENV_*, nothing else
    assert argv == [*HEAD_ARGV, "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--label",
                    "--export=APPTAINERENV_GLOO_SOCKET_IFNAME,HOME,PATH,USER", "--cpu-bind=none", "--multi-prog",
                    "/runs/r/multi-prog.conf"]
    assert env == {"APPTAINERENV_GLOO_SOCKET_IFNAME": "eth0"}  # values to srun's environment, not argv
    # exec: --cleanenv, --no-home, --writable-tmpfs (cmd/internal/cli/action_flags.go); no --nv on a CPU target
    words = [*WRAP, "apptainer", "exec", "--cleanenv", "--no-home", "--writable-tmpfs", "/shared/sif/repro-R.sif"]
    assert conf == "".join(f"{r} {shlex.join([*words, *FACTS])} {TORCH.format(r=r)}\n" for r in (0, 1))


def test_apptainer_paddle_cell_gives_each_rank_its_own_pod_ip():
    m, cell = cell_of("paddle-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)))
    _, env, conf = apptainer_step(m, cell, plan_cell(m, cell, hosts), "/s/r.sif", HEAD_ARGV, "c")
    assert "APPTAINERENV_POD_IP" not in env
    lines = [shlex.split(ln) for ln in conf.splitlines()]
    # --env NAME=VALUE (action_flags.go: "pass environment variable to contained process"), one rank's own
    assert [ln[ln.index("--writable-tmpfs") + 1] for ln in lines] == ["--env=POD_IP=10.0.0.1", "--env=POD_IP=10.0.0.2"]


def test_apptainer_mpi_cell_one_task_per_rank_through_slurms_pmi_and_no_sshd():
    m, cell = cell_of("mpi-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)))
    argv, env, conf = apptainer_step(m, cell, plan_cell(m, cell, hosts), "/s/r.sif", HEAD_ARGV, "c", mpi="pmi2")
    assert conf is None
    # the hybrid model of the user guide's mpi.rst: srun starts apptainer once per rank, the image's MPI
    # reaches Slurm's PMI
    assert argv == ["srun", "--mpi=pmi2", *HEAD_ARGV[1:], "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                    "--label", "--export=APPTAINERENV_OMPI_ALLOW_RUN_AS_ROOT,APPTAINERENV_OMPI_ALLOW_RUN_AS_ROOT_CONFIRM,"
                    "APPTAINERENV_OMP_NUM_THREADS,HOME,PATH,USER", "--cpu-bind=none", *WRAP, "apptainer", "exec", "--cleanenv", "--no-home", "--writable-tmpfs", "/s/r.sif",
                    *FACTS, "python3", "/opt/repro/rn50_cpu.py", "--dist", "mpi", "-b", "8", "--prof", "10", "--image-size",
                    "64", "--precision", "fp32"]
    assert env == {"APPTAINERENV_OMPI_ALLOW_RUN_AS_ROOT": "1", "APPTAINERENV_OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "APPTAINERENV_OMP_NUM_THREADS": "2"}
    assert "sshd" not in shlex.join(argv) and "mpirun" not in shlex.join(argv)


def test_apptainer_gpu_cell_nv_binds_the_dataset_read_only_and_sets_the_workdir():
    m, cell = cell_of("dlperf-ngc-pytorch-rn50-v100", 2, 8)
    hosts = Hosts((Node("g1", "10.0.0.1", gpus=8), Node("g2", "10.0.0.2", gpus=8)), data="/data/imagenet")
    _, _, conf = apptainer_step(m, cell, plan_cell(m, cell, hosts), "/s/r.sif", HEAD_ARGV, "c")
    words = shlex.split(conf.splitlines()[0])[1:]
    # --nv (NVIDIA support), -B/--bind src[:dest[:opts]] with opts ro, --cwd (action_flags.go)
    assert words[len(WRAP):words.index("/s/r.sif") + 1] == [
        "apptainer", "exec", "--nv", "--cleanenv", "--no-home", "--writable-tmpfs",
        "--bind=/data/imagenet:/data/image:ro", "--cwd=/workspace/rn50/PyTorch/Classification/ConvNets", "/s/r.sif"]


def test_apptainer_refuses_what_its_formats_cannot_carry():
    m, cell = cell_of("dlperf-ngc-pytorch-rn50-v100", 2, 8)
    hosts = Hosts((Node("g1", "10.0.0.1", gpus=8), Node("g2", "10.0.0.2", gpus=8)), data="/data/a,b")
    with pytest.raises(UsageError, match="--bind separates entries with ','"):
        apptainer_step(m, cell, plan_cell(m, cell, hosts), "/s/r.sif", HEAD_ARGV, "c")
    m, cell = cell_of("torch-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)), env={"X": "it's"})
    hosts_plans = plan_cell(m, cell, hosts)
    hosts_plans[0].container["environment"]["Y"] = "a'b"  # a per-rank value with a quote
    with pytest.raises(UsageError, match="holds a quote"):
        apptainer_step(m, cell, hosts_plans, "/s/r.sif", HEAD_ARGV, "c")


def test_apptainer_plan_shows_the_sif_build_and_each_cells_step(tmp_path: Path):
    f = tmp_path / "hosts.yaml"
    f.write_text(PLAN_HOSTS)
    m, cell = cell_of("torch-rn50-cpu", 2)
    _, text = scheduled_plan(m, [cell], f, "slurm:container=apptainer,sif_dir=/shared/sif")
    lines = text.splitlines()
    i = lines.index("SIF (built once per run, on the first node; its sha256 goes into the provenance):")
    assert lines[i - 1] == ("image: REGISTRY/repro/cpu-torch:2.13.0@DIGEST (the SIF is built from the image pushed "
                            "with --push REGISTRY, by digest)")
    assert shlex.split(lines[i + 1][4:]) == build_argv("JOBID", "n1", "/shared/sif/repro-RUN.sif",
                                                        "REGISTRY/repro/cpu-torch:2.13.0@sha256:DIGEST")
    assert lines[i + 2:i + 7] == ["", "cell 2n1g-fp32-bs8: job step",
                                  "  CPUs: none binding, as the publisher's launch had it (the manifest names no "
                                  "binding: every CPU of the node)",
                                  "  env APPTAINERENV_GLOO_SOCKET_IFNAME=eth0",
                                  "  $ " + shlex.join([*pyxis_head("JOBID", ["n1", "n2"], "repro-2n1g-fp32-bs8"),
                                                       "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--label",
                                                       "--export=APPTAINERENV_GLOO_SOCKET_IFNAME,HOME,PATH,USER",
                                                       "--cpu-bind=none", "--multi-prog",
                                                       "RUN_DIR/cells/2n1g-fp32-bs8/rN/multi-prog.conf"])]
    assert lines[i + 7] == "  multi-prog.conf:" and lines[i + 8].startswith("    0 sh -c ")


def test_a_run_directory_keeps_the_gpus_a_resumed_allocation_asks_for(tmp_path: Path):
    from repro.run.rundir import RunDir

    f = tmp_path / "slurm.yaml"
    f.write_text(SITE)
    inv = load_hosts(f)
    # what Allocation.open records: the nodes Slurm named (no gpus of their own), the site's settings
    allocated = Hosts((Node("gpu17", "10.1.0.17"), Node("gpu18", "10.1.0.18")), f, scheduler=inv.scheduler,
                      gpus=inv.gpus)
    run = RunDir.create(tmp_path / "runs", find_target("torch-rn50-cpu"), allocated, env={})
    again = load_hosts(run.file("hosts.yaml"))
    assert again.gpus == 8 and [n.gpus for n in again.nodes] == [8, 8]
    assert again.scheduler["sbatch_extra"] == ["--signal=B:USR1@120", "--comment=rn50"]
    cfg = scheduler_config(again.scheduler, None)
    assert render_sbatch(cfg, "j", 2, gpus=again.gpus) == script("--partition=gpu", "--gres=gpu:8", "--mem=0",
                                                                 "--signal=B:USR1@120", "--comment=rn50")


def test_apptainer_tf_ps_ranks_write_the_pair_runner_in_their_container_first():
    """As under pyxis (render.rank_argv): the tf-ps launcher's pair runner is a file of the rank's own, which
    nothing copies in; each rank's line writes it inside the container (its text as one base64 word), then
    runs the launcher's command."""
    import base64

    from repro.run.launchers.tf_ps import PAIR_PATH
    from repro.run.schedulers.slurm.rankfiles import WRITE_FILE

    m, cell = cell_of("tf-cnn-ps-cpu", 2)
    plans = plan_cell(m, cell, Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0))))
    _, _, conf = apptainer_step(m, cell, plans, "/s/r.sif", HEAD_ARGV, "c")
    runner = (Path(__file__).parents[1] / "repro" / "run" / "launchers" / "tf_ps_pair.py").read_text()
    b64 = base64.b64encode(runner.encode()).decode()
    words = [*WRAP, "apptainer", "exec", "--cleanenv", "--no-home", "--writable-tmpfs",
             "--cwd=/workspace/benchmarks/scripts/tf_cnn_benchmarks", "/s/r.sif"]
    assert plans[0].command.files == {PAIR_PATH: runner}
    assert conf == "".join(f"{r} {shlex.join([*words, *FACTS, 'sh', '-c', WRITE_FILE, 'sh', b64, PAIR_PATH])} "
                           f"{shlex.join(plans[r].command.command)}\n" for r in (0, 1))
