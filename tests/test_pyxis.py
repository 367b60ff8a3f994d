"""The pyxis runner's pure parts: each rank's own environment in its --multi-prog line, the per-run image
import step and the cell steps that start from its squashfs, as exact text."""

from __future__ import annotations

import shlex

from repro.run.plan import plan_cell
from repro.run.schedulers.slurm import pyxis_head, pyxis_step
from repro.spec.hosts import Hosts, Node
from repro.run.schedulers.slurm.siteenv import RANK_WRAP
from repro.spec.manifest import find_target

DIGEST = "sha256:" + "a" * 64
PADDLE = ("python /opt/repro/with_node_address.py 10.0.0.1,10.0.0.2 python -m paddle.distributed.launch "
          "--ips=10.0.0.1,10.0.0.2 --nnodes=2 --nproc_per_node 1 --start_port=6070 /opt/repro/rn50_paddle_cpu.py "
          "-b 8 --steps 15 --image-size 64 --precision fp32")


def two_nodes() -> Hosts:
    return Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)),
                 env={"GLOO_SOCKET_IFNAME": "eth0"})


#: each rank's command starts after its facts (siteenv.RANK_FACTS)
WRAP = ["sh", "-c", RANK_WRAP, "sh"]
W = shlex.join(WRAP)


def cell_of(target: str, nodes: int):
    m = find_target(target)
    return m, [c for c in m.select() if c.nodes == nodes][-1]


def test_each_paddle_rank_gets_its_own_pod_ip_not_the_first_ranks():
    """The Paddle launcher ranks a node by its POD_IP: the variables that differ between ranks go on each
    rank's --multi-prog line; only the shared ones go through srun's environment."""
    m, cell = cell_of("paddle-rn50-cpu", 2)
    argv, env, conf = pyxis_step(m, cell, plan_cell(m, cell, two_nodes()), "127.0.0.1:5000/repro/cpu-paddle@" + DIGEST,
                                 pyxis_head("42", ["n1", "n2"], "repro-2n1g-fp32-bs8"), "/runs/r/multi-prog.conf")
    assert env == {"GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
    assert "--container-env=GLOO_SOCKET_IFNAME,PYTHONUNBUFFERED" in argv
    assert conf == (f"0 env POD_IP=10.0.0.1 {W} {PADDLE}\n"
                    f"1 env POD_IP=10.0.0.2 {W} {PADDLE}\n")


def test_the_image_step_imports_by_digest_into_a_node_local_file_once_and_holds_it():
    from repro.run.schedulers.slurm.enroot import IMPORT_SCRIPT, enroot_uri, image_argv, image_file

    assert enroot_uri("127.0.0.1:5000/repro-test/repro/cpu-torch:2.13.0@" + DIGEST) == \
        "docker://127.0.0.1:5000#repro-test/repro/cpu-torch:2.13.0@" + DIGEST
    assert enroot_uri("nvcr.io/nvidia/pytorch:24.01-py3@" + DIGEST) == "docker://nvcr.io#nvidia/pytorch:24.01-py3@" + DIGEST
    assert enroot_uri("library/debian@" + DIGEST) == "docker://library/debian@" + DIGEST  # Docker Hub
    run = "20261126T025713Z-torch-rn50-cpu-637b78"
    assert image_file({}, run, "torch-rn50-cpu") == f"/tmp/repro-{run}.sqsh"
    assert image_file({"image_dir": "/local/"}, run, "torch-rn50-cpu") == f"/local/repro-{run}.sqsh"
    # kept for later runs: named after the target, reused only where its recorded digest is the lock's
    assert image_file({"image_dir": "/local", "keep_image": "True"}, run, "t") == "/local/repro-t.sqsh"
    argv = image_argv("42", ["n1", "n2"], "127.0.0.1:5000/a/b:1@" + DIGEST, "/local/x.sqsh", DIGEST, False)
    assert argv == ["srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2",
                    "--overlap", "--label", "--export=HOME,PATH,USER", "--job-name=repro-image", "--", "sh", "-c", IMPORT_SCRIPT, "sh",
                    "docker://127.0.0.1:5000#a/b:1@" + DIGEST, "/local/x.sqsh", DIGEST, "no", ""]
    # a resumed run first removes what pyxis left of its earlier jobs (ids: digits only)
    assert image_argv("42", ["n1"], "r/a@" + DIGEST, "/x", DIGEST, True, ["12", "40", "1;rm"])[-2:] == ["yes", "12 40"]


def test_cell_steps_start_from_the_runs_squashfs_and_mpi_through_the_chosen_pmi():
    m, cell = cell_of("mpi-rn50-cpu", 2)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)))
    argv, env, conf = pyxis_step(m, cell, plan_cell(m, cell, hosts), "/local/repro-run.sqsh",
                                 pyxis_head("42", ["n1", "n2"], "repro-2n1g-fp32-bs8"), "/c", mpi="pmi2")
    assert argv == ["srun", "--mpi=pmi2", "--jobid=42", "--nodelist=n1,n2", "--overlap", "--kill-on-bad-exit=1",
                    "--job-name=repro-2n1g-fp32-bs8", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--label",
                    "--export=HOME,OMPI_ALLOW_RUN_AS_ROOT,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM,OMP_NUM_THREADS,PATH,USER",
                    "--cpu-bind=none",
                    "--container-image=/local/repro-run.sqsh", "--no-container-mount-home", "--container-writable",
                    "--container-env=OMPI_ALLOW_RUN_AS_ROOT,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM,OMP_NUM_THREADS", "--",
                    *WRAP, "python3", "/opt/repro/rn50_cpu.py", "--dist", "mpi", "-b", "8", "--prof", "10", "--image-size",
                    "64", "--precision", "fp32"]
    assert conf is None and env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                                    "OMP_NUM_THREADS": "2"}


def test_an_image_that_only_runs_under_pmi_has_no_sshd_layer_and_says_so():
    from repro.images import build
    from repro.images.lock import Pins
    from repro.images.refs import parse_ref
    from repro.images.render import render_build

    m, torch = find_target("mpi-rn50-cpu"), find_target("torch-rn50-cpu")
    base = parse_ref("127.0.0.1:5000/repro-test/debian:bookworm", DIGEST)
    assert "# then the mpi layer" in render_build(m, base)
    pmi = render_build(m, base, sshd=False)
    assert "# then the mpi layer" not in pmi and "repro mpi layer" not in pmi
    assert pmi.endswith("\n# no mpi layer: the ranks start through Slurm's PMI (pyxis), not mpirun over ssh\n")
    assert [build.variant(m), build.variant(m, sshd=False), build.variant(torch)] == ["sshd", "pmi", None]
    # a different image: its own build digest and label, so neither variant is mistaken for the other
    assert build.build_inputs_sha256(m, sshd=False) != build.build_inputs_sha256(m)
    assert build.build_inputs_sha256(torch, sshd=False) == build.build_inputs_sha256(torch)
    labels = build.identity_labels(m, base, "sha256:x", sshd=False)
    assert labels["repro.mpi.variant"] == "pmi" and "repro.mpi.variant" not in build.identity_labels(torch, base, "x")
    # the run's lock records which variant was built
    pins = Pins({"base": base}, variant="pmi").to_json(m)
    assert pins["variant"] == "pmi" and "variant" not in Pins({"base": base}).to_json(m)


def test_pyxis_mpi_runs_build_the_pmi_variant_through_the_scheduler():
    from repro.images import ImagesOptions
    from repro.run.schedulers import make_scheduler

    m = find_target("mpi-rn50-cpu")
    for option, sshd in (("slurm:container=pyxis", False), ("slurm:container=docker", True), (None, True)):
        sched = make_scheduler(two_nodes(), m, m.select(), option)
        assert sched.image_options(ImagesOptions()).build.sshd is sshd, option
    torch = find_target("torch-rn50-cpu")
    sched = make_scheduler(two_nodes(), torch, torch.select(), "slurm:container=pyxis")
    assert sched.image_options(ImagesOptions()).build.sshd is True


def test_preflight_under_pyxis_reads_each_nodes_enroot_version():
    from repro.run.schedulers.slurm.render import PREFLIGHT_STEP, preflight_argv
    from repro.run.schedulers.slurm.steps import enroot_probe

    argv = preflight_argv("7", ["n1"], enroot=True)
    assert argv[:-1] == preflight_argv("7", ["n1"])[:-1]
    # after the node's name, before the probe script
    assert argv[-1] == ('printf "%s\\n" "${SLURMD_NODENAME:-$(hostname)}"; '
                        'printf "enroot %s\\n" "$(enroot version 2>/dev/null | head -n 1 | grep . || echo -)"; '
                        'exec sh -s')
    assert PREFLIGHT_STEP[-1] == 'printf "%s\\n" "${SLURMD_NODENAME:-$(hostname)}"; exec sh -s'
    assert enroot_probe(["enroot 4.1.2"]).detail == "enroot 4.1.2" and enroot_probe(["enroot 4.1.2"]).value == "pyxis"
    assert enroot_probe(["enroot -"]).value is None
    assert enroot_probe(["enroot -"]).reason == "no enroot on the PATH srun gives job steps (pyxis needs it on every node)"


def test_every_task_gets_the_images_own_path_on_its_command_line():
    path = {"PATH": "/opt/venv/bin:/usr/bin:/bin"}
    m, cell = cell_of("paddle-rn50-cpu", 2)
    _, _, conf = pyxis_step(m, cell, plan_cell(m, cell, two_nodes()), "/local/x.sqsh",
                            pyxis_head("42", ["n1", "n2"], "s"), "/c", image_env=path)
    assert conf == (f"0 env PATH=/opt/venv/bin:/usr/bin:/bin POD_IP=10.0.0.1 {W} {PADDLE}\n"
                    f"1 env PATH=/opt/venv/bin:/usr/bin:/bin POD_IP=10.0.0.2 {W} {PADDLE}\n")
    m, cell = cell_of("mpi-rn50-cpu", 2)
    argv, _, _ = pyxis_step(m, cell, plan_cell(m, cell, two_nodes()), "/local/x.sqsh",
                            pyxis_head("42", ["n1", "n2"], "s"), "/c", image_env=path)
    assert argv[argv.index("--") + 1:][:7] == ["env", "PATH=/opt/venv/bin:/usr/bin:/bin", *WRAP, "python3"]


def test_the_plan_shows_the_pmi_the_hosts_file_chooses(tmp_path):
    import shlex

    from repro.run.schedulers import scheduled_plan

    f = tmp_path / "hosts.yaml"
    f.write_text("schema_version: 1\ndefaults: {gpus: 0}\nnodes:\n  - {name: n1, address: 10.0.0.1}\n"
                 "  - {name: n2, address: 10.0.0.2}\nscheduler: {kind: slurm, container: pyxis, mpi: pmi2}\n")
    m, cell = cell_of("mpi-rn50-cpu", 2)
    _, text = scheduled_plan(m, [cell], f, None)
    step = next(shlex.split(ln.strip()[2:]) for ln in text.splitlines() if ln.startswith("  $ srun"))
    assert step[:2] == ["srun", "--mpi=pmi2"]


def test_tf_ps_ranks_write_the_pair_runner_in_their_container_first(tmp_path):
    """pyxis copies nothing into a container: a tf-ps rank with a parameter server writes the launcher's pair
    runner itself (its text as one base64 word of its --multi-prog line) before it runs it."""
    import base64
    import shlex
    import subprocess
    from pathlib import Path

    from repro.run.launchers.tf_ps import PAIR_PATH
    from repro.run.schedulers.slurm.rankfiles import WRITE_FILE

    m, cell = cell_of("tf-cnn-ps-cpu", 2)
    plans = plan_cell(m, cell, two_nodes())
    _, _, conf = pyxis_step(m, cell, plans, "/l/x.sqsh", pyxis_head("42", ["n1", "n2"], "s"), "/c")
    runner = (Path(__file__).parents[1] / "repro" / "run" / "launchers" / "tf_ps_pair.py").read_text()
    b64 = base64.b64encode(runner.encode()).decode()
    for rank, line in enumerate(conf.splitlines()):
        words = shlex.split(line)
        assert words[:11] == [str(rank), *WRAP, "sh", "-c", WRITE_FILE, "sh", b64, PAIR_PATH]
        assert words[11:] == list(plans[rank].command.command)  # then the rank's command as the launcher made it
        assert words[12:14] == [PAIR_PATH, "18"]
    # the wrapper as sh runs it: the file written, then the command run with its arguments and exit status
    target = tmp_path / "pair.py"
    argv = ["sh", "-c", WRITE_FILE, "sh", b64, str(target), "sh", "-c", 'echo "$@"; exit 3', "sh", "a b", "c"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (3, "a b c\n") and target.read_text() == runner
