"""The site options of a Slurm allocation (hosts file ``scheduler:``) against the test cluster's real Slurm:
the batch script the kit renders with them is accepted by ``sbatch --test-only`` where the nodes have no
GPUs (``gpus: 0``: no GPU request), and a GPU request the cluster cannot meet is Slurm's refusal, named by
the setting, before anything is submitted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.run.schedulers import make_scheduler
from repro.spec.hosts import load_hosts
from repro.spec.manifest import find_target

pytestmark = [pytest.mark.slurm]
QUEUE_S = 1200  # a job step waits in the queue while other tests hold the two nodes

SITE = """\
schema_version: 1
defaults: {{gpus: {gpus}}}
scheduler:
  kind: slurm
  partition: debug
  time: 20
  gpu_request: {request}
  sbatch_extra: [--signal=B:USR1@120, --comment=siteopts, --mail-type=NONE]
"""


@pytest.fixture
def slurm_env(cluster: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", cluster["slurm_conf"])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def jobs() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True, timeout=30)
    return set(out.stdout.split())


def scheduler(tmp_path: Path, gpus: int, request: str):
    inv = tmp_path / "site.yaml"
    inv.write_text(SITE.format(gpus=gpus, request=request))
    m = find_target("torch-rn50-cpu")
    return make_scheduler(load_hosts(inv), m, [c for c in m.select() if c.nodes == 2], None)


def test_site_options_are_accepted_by_sbatch_test_only_on_gpu_less_nodes(slurm_env, tmp_path):
    before = jobs()
    sched = scheduler(tmp_path, 0, "gres")
    sched.check(2)  # sbatch --test-only of the script: Slurm accepts it
    script = sched.allocation.script
    assert script.splitlines()[6:12] == ["#SBATCH --partition=debug", "#SBATCH --time=20", "#SBATCH --mem=0",
                                         "#SBATCH --signal=B:USR1@120", "#SBATCH --comment=siteopts",
                                         "#SBATCH --mail-type=NONE"]
    assert "gres" not in script and "gpus" not in script
    assert jobs() == before  # --test-only: nothing submitted


@pytest.mark.parametrize("request_kind,line", [("gres", "--gres=gpu:2"), ("gpus-per-node", "--gpus-per-node=2")])
def test_a_gpu_request_the_cluster_cannot_meet_is_slurms_refusal_named_by_the_setting(slurm_env, tmp_path,
                                                                                         request_kind, line):
    before = jobs()
    sched = scheduler(tmp_path, 2, request_kind)
    with pytest.raises(UsageError) as e:
        sched.check(2)
    assert f"#SBATCH {line}" in sched.allocation.script.splitlines()  # what Slurm was shown
    assert str(e.value) == (f"{tmp_path / 'site.yaml'}: scheduler.gpu_request: Slurm refuses the job: "
                            "Invalid generic resource (gres) specification")
    assert jobs() == before


# --- the Slurm half of an Apptainer cell ----------------------------------------------------------------------
# Apptainer cannot be installed here (no package in Debian 12, no release download reachable): a stand-in
# named `apptainer` on the tasks' PATH prints the arguments and APPTAINERENV_* variables it is given, so that
# what Slurm does with the kit's step (srun's parsing of the --multi-prog file, the PMI variables the wrapper
# forwards) runs for real; apptainer's own flags are checked as text (tests/test_slurm_site.py).

STAND_IN = """#!/bin/sh
for a in "$@"; do printf 'ARG %s\\n' "$a"; done
env | grep '^APPTAINERENV_' | sort
"""


def run_step(tmp_path: Path, target: str, mpi: bool) -> dict[int, list[str]]:
    import os
    import shlex

    from repro.run.plan import plan_cell
    from repro.run.schedulers.slurm.apptainer import apptainer_step

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(STAND_IN)
    (bin_dir / "apptainer").chmod(0o755)
    m = find_target(target)
    cell = next(c for c in m.select() if c.nodes == 2)
    hosts = load_hosts(Path(os.environ["REPRO_CLUSTER_HOSTS"]))
    conf = tmp_path / "multi-prog.conf"
    name = f"repro-test-apptainer-{os.getpid()}-{tmp_path.name}"
    argv, env, text = apptainer_step(m, cell, plan_cell(m, cell, hosts), "/shared/r.sif",
                                     ["srun", f"--job-name={name}"], str(conf), per_node=1)
    if text is not None:
        conf.write_text(text)
    try:  # the job may wait in the queue while other tests hold the two nodes
        out = subprocess.run(argv, capture_output=True, text=True, timeout=QUEUE_S,
                             env={**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    finally:
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, timeout=30)
    assert out.returncode == 0, (shlex.join(argv), out.stdout, out.stderr)
    ranks: dict[int, list[str]] = {}
    for line in out.stdout.splitlines():
        rank, _, said = line.partition(": ")
        ranks.setdefault(int(rank), []).append(said)
    return ranks


@pytest.fixture
def hosts_env(cluster: dict, slurm_env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_CLUSTER_HOSTS", cluster["hosts_file"])


def test_apptainer_multi_prog_lines_reach_each_rank_whole_with_its_own_pod_ip(hosts_env, tmp_path):
    ranks = run_step(tmp_path, "paddle-rn50-cpu", mpi=False)
    for rank, addr in ((0, "10.77.0.11"), (1, "10.77.0.12")):
        args = [s[4:] for s in ranks[rank] if s.startswith("ARG ")]
        assert args[:5] == ["exec", "--cleanenv", "--no-home", "--writable-tmpfs", f"--env=POD_IP={addr}"]
        # the image, the kit's rank wrapper (each rank's facts, the memlock check) and then the rank's command
        assert args[5:7] == ["/shared/r.sif", "sh"] and args[7] == "-c" and "#repro-site rank" in args[8]
        assert args[9:12] == ["sh", "python", "/opt/repro/with_node_address.py"]
        env = [s for s in ranks[rank] if s.startswith("APPTAINERENV_")]
        assert f"APPTAINERENV_SLURM_PROCID={rank}" in env and "APPTAINERENV_PYTHONUNBUFFERED=1" in env


def test_apptainer_mpi_ranks_get_slurms_pmix_variables_through_cleanenv(hosts_env, tmp_path):
    ranks = run_step(tmp_path, "mpi-rn50-cpu", mpi=True)
    assert sorted(ranks) == [0, 1]
    for rank, said in ranks.items():
        assert f"APPTAINERENV_PMIX_RANK={rank}" in said and f"APPTAINERENV_SLURM_PROCID={rank}" in said
        assert any(s.startswith("APPTAINERENV_PMIX_SERVER_URI") for s in said), said
        assert "APPTAINERENV_OMPI_ALLOW_RUN_AS_ROOT=1" in said


def test_a_sif_dir_one_node_does_not_share_is_found(cluster, slurm_env, tmp_path):
    """The SIF check step (every node of a cell asked for the SIF's size) against real nodes: a file in a
    directory both share, and one in a node's own directory (each slurmd sees DIR/node-local as its node's)."""
    import os

    from repro.run.schedulers.slurm.apptainer import seen_argv, unseen

    names = [n["name"] for n in cluster["nodes"]]
    shared = tmp_path / "r.sif"
    shared.write_bytes(b"x" * 4096)
    work = Path(cluster["work_dir"])
    own = work / "nodes" / names[0] / "local" / f"repro-test-{os.getpid()}.sif"
    own.write_bytes(b"x" * 4096)
    try:
        for path, missing in ((str(shared), []), (str(work / "node-local" / own.name), names[1:])):
            job = f"repro-test-sif-seen-{os.getpid()}"
            argv = [a for a in seen_argv("X", names, path) if a != "--jobid=X"]
            argv[argv.index("--job-name=repro-sif-seen")] = f"--job-name={job}"
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=QUEUE_S)
            finally:
                subprocess.run(["scancel", f"--name={job}"], capture_output=True, timeout=30)
            assert unseen(out.stdout.splitlines(), names, 4096) == missing, (out.stdout, out.stderr)
    finally:
        own.unlink()
