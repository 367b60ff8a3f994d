"""Every job step the kit starts, not only a cell's, names what it passes (``srun --export=NAMES``), attached
and detached: preflight, the image import, the SIF build, the telemetry sampler, the docker agent, the
detached script's own steps. Nothing of a login shell (``PYTHONPATH``, ``LD_PRELOAD``, ``PYXIS_*``) reaches
them; what the node's tools read (``ENROOT_*``, ``NVIDIA_*``, a site's proxy, ``APPTAINER_*``,
``DOCKER_CONFIG``) does where it is set, and so does the hosts file's pass-through list."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from repro.nodes.telemetry import sampler_argv
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.apptainer import build_argv, rm_argv, seen_argv
from repro.run.schedulers.slurm.detached import Detach, render_detached
from repro.run.schedulers.slurm.enroot import IMPORT_SCRIPT, image_argv
from repro.run.schedulers.slurm.render import PREFLIGHT_STEP, preflight_argv, sampler_srun, srun_argv
from repro.run.schedulers.slurm.siteenv import host_export
from repro.spec.hosts import Hosts, Node, load_hosts
from repro.spec.manifest import find_target

DIGEST = "sha256:" + "a" * 64
#: a login shell: only HOME, USER, PATH, ENROOT_*, NVIDIA_*, the proxy, APPTAINER_*, DOCKER_CONFIG and the
#: pass-through name may reach a step on the node
LOGIN = {"HOME": "/home/u", "USER": "u", "PATH": "/opt/login/bin:/usr/bin", "PYTHONPATH": "/opt/login/py",
         "LD_PRELOAD": "/opt/login/lib/x.so", "LD_LIBRARY_PATH": "/opt/login/lib", "UCX_TLS": "tcp",
         "PYXIS_CONTAINER_MOUNTS": "/etc:/mnt", "ENROOT_CONFIG_PATH": "/etc/enroot",
         "NVIDIA_DRIVER_CAPABILITIES": "all", "https_proxy": "http://proxy:3128", "DOCKER_HOST": "tcp://login:2375",
         "APPTAINER_CACHEDIR": "/scratch/u/apptainer", "DOCKER_CONFIG": "/home/u/.docker", "NCCL_IB_HCA": "mlx5_0",
         "MY_API_TOKEN": "s3cr3t-value-0123456789"}
CFG = {"export": ["NCCL_IB_HCA"]}
EXPORT = ("--export=APPTAINER_CACHEDIR,DOCKER_CONFIG,ENROOT_CONFIG_PATH,HOME,NCCL_IB_HCA,NVIDIA_DRIVER_CAPABILITIES,"
          "PATH,USER,https_proxy")
NOT_PASSED = ("PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "UCX_TLS", "PYXIS_CONTAINER_MOUNTS", "DOCKER_HOST",
              "MY_API_TOKEN")


def test_a_step_on_the_node_names_what_its_tools_read_and_nothing_else():
    assert host_export(LOGIN, CFG) == EXPORT
    assert host_export({}, {}) == "--export=HOME,PATH,USER"
    assert host_export({}, {}, ["REPRO_MARKS"]) == "--export=HOME,PATH,REPRO_MARKS,USER"


def test_every_attached_host_step_exact():
    nodes = ["n1", "n2"]
    assert preflight_argv("42", nodes, True, EXPORT)[:12] == [
        "srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap",
        "--label", "--input=all", EXPORT, "--job-name=repro-preflight", "--"]
    assert preflight_argv("42", nodes)[9:11] == ["--export=HOME,PATH,USER", "--job-name=repro-preflight"]
    assert preflight_argv("42", nodes)[12:] == PREFLIGHT_STEP
    assert image_argv("42", nodes, "r.io/a@" + DIGEST, "/tmp/f.sqsh", DIGEST, False, export=EXPORT) == [
        "srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap",
        "--label", EXPORT, "--job-name=repro-image", "--", "sh", "-c", IMPORT_SCRIPT, "sh",
        "docker://r.io#a@" + DIGEST, "/tmp/f.sqsh", DIGEST, "no", ""]
    assert sampler_srun("42", nodes, "repro-k-telemetry", 300, export=EXPORT) == [
        "srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap",
        "--label", EXPORT, "--job-name=repro-k-telemetry", "--", *sampler_argv(300)]
    assert srun_argv("42", nodes, "repro-k", EXPORT)[:-1] == [
        "srun", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap",
        "--label", "--input=all", "--kill-on-bad-exit=1", EXPORT, "--job-name=repro-k", "--", "python3", "-c"]
    assert build_argv("42", "n1", "/s/r.sif", "r.io/a@" + DIGEST, EXPORT)[:8] == [
        "srun", "--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n1", "--overlap", EXPORT,
        "--job-name=repro-sif"]
    assert seen_argv("42", nodes, "/s/r.sif")[8:10] == ["--export=HOME,PATH,USER", "--job-name=repro-sif-seen"]
    assert rm_argv("42", "n1", "/s/r.sif") == [
        "srun", "--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n1", "--overlap", "--export=HOME,PATH,USER",
        "--job-name=repro-sif-rm", "rm", "-f", "--", "/s/r.sif"]


def test_the_allocation_exports_this_processs_names(monkeypatch: pytest.MonkeyPatch):
    """The attached steps (preflight, image, sampler, agent, SIF build) take their list from here."""
    for k in list(__import__("os").environ):
        monkeypatch.delenv(k)
    for k, v in LOGIN.items():
        monkeypatch.setenv(k, v)
    alloc = Allocation({"kind": "slurm", **CFG}, None, [], Hosts(()), lambda e: None)
    assert alloc.export() == EXPORT


def srun_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if re.search(r"(^|[ (])srun --", ln)]


@pytest.mark.parametrize("target,container,nodes", [("torch-rn50-cpu", "docker", None),
                                                    ("paddle-rn50-cpu", "pyxis", 2),
                                                    ("mpi-rn50-cpu", "pyxis", 2)])
def test_every_srun_of_the_detached_script_names_what_it_passes(target: str, container: str, nodes):
    m = find_target(target)
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0), Node("n2", "10.0.0.2", gpus=0)))
    text = render_detached(Detach(m, m.select([{"nodes": nodes}] if nodes else []), hosts,
                                  {"kind": "slurm", "container": container, **CFG}, "r.io/a@" + DIGEST,
                                  run_id="RUN", environ=LOGIN)).text
    lines = srun_lines(text)
    assert len(lines) >= 4  # shared, probe, sampler, cell (and pull or image)
    for ln in lines:
        exported = re.search(r" --export=(\S+)", ln)
        assert exported, ln
        names = {w.partition("=")[0] for w in exported.group(1).split(",")}
        assert not names & set(NOT_PASSED), ln
        assert "HOME" in names and "USER" in names and "PATH" in names, ln
        if "--container-image" not in ln:
            assert "ENROOT_CONFIG_PATH" in names and "NCCL_IB_HCA" in names, ln
    if container == "docker":  # the agent reads where its marks go from its environment
        agent = next(ln for ln in lines if "REPRO_MARKS=" in ln)
        assert "REPRO_MARKS" in re.search(r" --export=(\S+)", agent).group(1).split(",")


SECRET = LOGIN["MY_API_TOKEN"]
SECRET_HOSTS = """\
schema_version: 1
defaults: {gpus: 0}
nodes:
  - {name: n1, address: 10.0.0.1}
  - {name: n2, address: 10.0.0.2}
prelude: ['export MY_API_TOKEN=%s']
scheduler: {kind: slurm, partition: debug, time: 20, container: pyxis, export: [MY_API_TOKEN]}
""" % SECRET


def test_a_secret_looking_pass_through_is_scrubbed_from_a_detached_runs_files(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    """Attached, the run directory's writer knows the value of a secret-looking name of this process's
    environment and blanks it in every log; detached, the job's files are scrubbed when judged, in another
    shell maybe: the pass-through value is kept for that among the job's inputs (0600, removed once
    judged), and the script kept in the run directory holds it blanked (the one submitted sits beside the
    inputs)."""
    from repro.redact import Redactor
    from repro.run.schedulers.slurm.detached import write_job
    from repro.run.schedulers.slurm.jobfiles import job_envs

    f = tmp_path / "hosts.yaml"
    f.write_text(SECRET_HOSTS)
    hosts = load_hosts(f)
    m = find_target("torch-rn50-cpu")
    d = Detach(m, m.select([{"nodes": 2}]), hosts, dict(hosts.scheduler), "r.io/a@" + DIGEST, run_id="RUN",
               environ=LOGIN)
    script = render_detached(d)
    run = tmp_path / "run"
    run.mkdir()
    submitted = write_job(run, d, script)
    kept = (run / "job" / "batch.sbatch").read_text()
    assert SECRET not in kept and "export MY_API_TOKEN=<redacted>" in kept
    assert submitted.read_text() == script.text and submitted.parent == run / "job" / "in"
    assert stat.S_IMODE(submitted.stat().st_mode) == 0o600
    monkeypatch.delenv("MY_API_TOKEN", raising=False)  # judged from a shell without it
    scrub = Redactor.from_envs(*job_envs(run))
    assert scrub.text(f"rank 0: token {SECRET}\n") == "rank 0: token <redacted>\n"


@pytest.mark.parametrize("local,code", [("0", 97), ("1", 0), ("7", 0)])
def test_the_locked_memory_check_runs_once_a_node(local: str, code: int):
    """An MPI cell starts 8 ranks a node, each after the check: the node's first task (``SLURM_LOCALID`` 0)
    alone reads the limit (every task of a node has the one slurmstepd gives) and stops the step with the
    value and the fix (``--kill-on-bad-exit``); the others start the target's command."""
    import subprocess

    from repro.run.schedulers.slurm.siteenv import MEMLOCK_CHECK

    done = subprocess.run(["sh", "-c", 'ulimit -l 64 && exec "$@"', "sh", "sh", "-c", MEMLOCK_CHECK, "sh", "echo",
                           "ran"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "SLURM_LOCALID": local})
    said = [ln for ln in done.stdout.splitlines() if not ln.startswith("#repro-site ")]  # the rank's facts
    assert (done.returncode, said) == (code, [] if code else ["ran"])
    assert ("locked memory is limited to 64 KiB" in done.stderr) == bool(code)


def test_each_rank_says_its_facts_in_its_container_and_the_provenance_records_them(tmp_path: Path):
    """Every Slurm path starts each rank's command after ``RANK_FACTS`` (pyxis, Apptainer, the docker agent's
    containers; attached and detached render the same steps): the rank's Slurm rank, its locked-memory limit,
    its CPUs and its environment go into its log, and sealing the run records them per command, secret
    values blanked by name (``MY_API_TOKEN``) and by shape (a URL's password)."""
    import os
    import subprocess

    from repro.record import provenance
    from repro.record.rankfacts import rank_facts
    from repro.run.rundir import RunDir
    from repro.run.schedulers.slurm.siteenv import RANK_WRAP
    from repro.spec.manifest import Cell

    environ = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": "3", "MY_API_TOKEN": SECRET,
               "PIP_INDEX_URL": "https://u:pw0123456@pypi.example/simple"}
    done = subprocess.run(["sh", "-c", RANK_WRAP, "sh", "echo", "ran"], capture_output=True, text=True, env=environ)
    assert done.returncode == 0 and done.stdout.endswith("\nran\n")
    memlock = subprocess.run(["sh", "-c", "ulimit -l"], capture_output=True, text=True).stdout.strip()
    (facts,) = rank_facts("".join(f"3: {ln}\n" for ln in done.stdout.splitlines()))  # srun --label's form
    cpus = sorted(os.sched_getaffinity(0))
    assert facts["rank"] == 3 and facts["memlock_kib"] == (int(memlock) if memlock.isdigit() else memlock)
    assert facts["cpus"]["count"] == len(cpus) and facts["cpus"]["list"].split(",")[0].split("-")[0] == str(cpus[0])
    assert facts["env"]["MY_API_TOKEN"] == "<redacted>" and facts["env"]["SLURM_PROCID"] == "3"
    assert facts["env"]["PIP_INDEX_URL"] == "https://u:<redacted>@pypi.example/simple"
    assert rank_facts("0: #repro-site rank 0 memlock unlimited cpus 0-3,8\n") == [
        {"rank": 0, "memlock_kib": "unlimited", "cpus": {"count": 5, "list": "0-3,8"}, "env": {}}]
    # sealed: each command's ranks, through the typed reader
    m = find_target("torch-rn50-cpu")
    hosts = Hosts((Node("n1", "10.0.0.1", gpus=0),))
    run = RunDir.create(tmp_path, m, hosts, env={})
    record = provenance.new_record(run, m, hosts, started="2026-11-22T11:15:00Z")
    cell = Cell(1, 1, "fp32", 8)
    path = run.write_log(cell, 1, 0, "n1", done.stdout)
    provenance.add_command(record, run, cell, 1, rank=0, node="n1", role="worker", argv=["echo", "ran"],
                           env={}, image="img", started="2026-11-22T11:15:01Z", ended="2026-11-22T11:16:01Z",
                           exit_code=0, log=path)
    provenance.finalize(run, record, finished="2026-11-22T12:00:00Z")
    (cmd,) = provenance.read_record(run.file("provenance.json")).commands
    (seen,) = cmd.seen
    assert (seen.rank, seen.cpu_count, seen.env["MY_API_TOKEN"]) == (3, len(cpus), "<redacted>")
    assert SECRET not in run.file("provenance.json").read_text()


def test_the_pmi_probe_step_exact_and_what_a_rank_in_its_container_says(tmp_path: Path):
    """Before an MPI cell under pyxis: one task a node in a container from the run's squashfs, started as the
    ranks are (``srun --mpi``), says whether Slurm's PMIx server reaches it (a ``PMIX_SERVER_URI*`` variable
    and the directory ``PMIX_SERVER_TMPDIR`` names, which enroot's ``50-slurm-pmi.sh`` hook carries and
    mounts), or PMI-2's ``PMI_FD``, and the image's Open MPI's pmix components."""
    import subprocess

    from repro.run.schedulers.slurm.pmicheck import PMI_PROBE, pmi_probe_argv, pmi_said

    assert pmi_probe_argv("42", ["n1", "n2"], "/tmp/repro-R.sqsh", "pmix", LOGIN, "/usr/bin:/bin") == [
        "srun", "--mpi=pmix", "--jobid=42", "--nodelist=n1,n2", "--overlap", "--nodes=2", "--ntasks=2",
        "--ntasks-per-node=1", "--label", "--export=PATH=/usr/bin:/bin,ENROOT_CONFIG_PATH,HOME,"
        "NVIDIA_DRIVER_CAPABILITIES,USER", "--job-name=repro-pmi", "--container-image=/tmp/repro-R.sqsh",
        "--no-container-mount-home", "--", "sh", "-c", PMI_PROBE]

    def said(**env: str) -> str:
        done = subprocess.run(["sh", "-c", PMI_PROBE], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", **env})
        return done.stdout

    server = tmp_path / "pmix.7.0"
    server.mkdir()
    assert said(PMIX_SERVER_URI41="pmix-server.1;tcp4://10.0.0.1:4000", PMIX_SERVER_TMPDIR=str(server)) == \
        f"##repro pmi PMIX_SERVER_URI41 {server} there nofd -\n"
    assert said(PMIX_SERVER_URI3="x", PMIX_SERVER_TMPDIR="/var/spool/slurmd/pmix.7.0") == \
        "##repro pmi PMIX_SERVER_URI3 /var/spool/slurmd/pmix.7.0 missing nofd -\n"
    assert said(PMI_FD="5") == "##repro pmi - - missing fd -\n"
    assert pmi_said(["0: ##repro pmi PMIX_SERVER_URI41 /s/pmix.7.0 there nofd ext3x,isolated", "1: enroot says",
                     "srun: error"]) == {0: {"uri": "PMIX_SERVER_URI41", "dir": "/s/pmix.7.0", "dir_there": True,
                                             "pmi_fd": False, "components": ["ext3x", "isolated"]}}


def test_a_node_whose_container_lacks_slurms_pmi_stops_the_run_with_enroots_hook_as_the_fix():
    from repro.errors import RunFailed
    from repro.run.schedulers.slurm.pmicheck import FIX, check_pmi, default_mpi, mpi_problem, pmi_said

    said = pmi_said(["0: ##repro pmi PMIX_SERVER_URI41 /s/pmix.7.0 there nofd ext3x",
                     "1: ##repro pmi - - missing nofd ext3x"])
    check_pmi({0: said[0]}, ["n1"], "pmix")  # the first node's container sees the server
    with pytest.raises(RunFailed) as e:
        check_pmi(said, ["n1", "n2", "n3"], "pmix", "srun: error: n3: task 2: Exited with exit code 1")
    assert str(e.value) == ("Slurm's PMI (pmix) does not reach the ranks' containers:\n"
                            "  n2: a rank's container sees no PMIX_SERVER_URI* variable\n"
                            "  n3: the step's task said nothing (see srun's output above)\n"
                            "  srun: srun: error: n3: task 2: Exited with exit code 1")
    assert e.value.hint == FIX and "50-slurm-pmi.sh" in FIX and "/etc/enroot/hooks.d/" in FIX
    nodir = pmi_said(["0: ##repro pmi PMIX_SERVER_URI41 /s/pmix.7.0 missing nofd -"])
    with pytest.raises(RunFailed, match="the PMIx server's directory /s/pmix.7.0 is not in a rank's container"):
        check_pmi(nodir, ["n1"], "pmix")
    with pytest.raises(RunFailed, match="n1: a rank's container sees no PMI_FD"):
        check_pmi(said, ["n1"], "pmi2")
    # the plugin: the first of pmix, pmi2 that srun --mpi=list offers, and one the image's Open MPI speaks
    assert default_mpi(["none", "pmi2", "cray_shasta"]) == "pmi2" and default_mpi(["pmi2", "pmix"]) == "pmix"
    assert mpi_problem("pmix", ["ext3x", "isolated"]) is None and mpi_problem("pmix", []) is None
    assert mpi_problem("pmix", ["s1", "s2", "isolated"]) == (
        "the image's Open MPI has no PMIx component (s1, s2, isolated): set mpi: pmi2 in the hosts file's scheduler")
    assert mpi_problem("pmi2", ["ext3x"]) == (
        "the image's Open MPI has no PMI-2 component (s2; it has ext3x): set mpi: pmix in the hosts file's scheduler")
    with pytest.raises(RunFailed, match="Slurm's PMI is pmi2, but the image's Open MPI has no PMI-2 component"):
        check_pmi({0: {**said[0], "pmi_fd": True}}, ["n1"], "pmi2")


def test_the_pmi_check_runs_once_a_node_before_the_first_mpi_step(monkeypatch: pytest.MonkeyPatch):
    from types import SimpleNamespace

    from repro.errors import RunFailed
    from repro.run.schedulers.slurm import pyxisstep

    asked: list[list[str]] = []

    def cli(argv, timeout=None):
        asked.append(argv)
        nodes = next(a for a in argv if a.startswith("--nodelist="))[len("--nodelist="):]
        lines = [f"{i}: ##repro pmi PMIX_SERVER_URI41 /s there nofd -" if n != "bad" else f"{i}: ##repro pmi - - "
                 "missing nofd -" for i, n in enumerate(nodes.split(","))]
        return SimpleNamespace(stdout="\n".join(lines) + "\n", stderr="", returncode=0)

    monkeypatch.setattr(pyxisstep, "cli", cli)
    alloc = SimpleNamespace(job="42", cfg={"mpi": "pmix"}, extra={}, run_image=SimpleNamespace(env={}))
    pyxisstep.PyxisStep.pmi(alloc, ["n1"], "/f.sqsh")
    pyxisstep.PyxisStep.pmi(alloc, ["n1", "n2"], "/f.sqsh")  # a 2-node cell: the new node alone
    pyxisstep.PyxisStep.pmi(alloc, ["n1", "n2"], "/f.sqsh")  # its next repeat: nothing asked
    assert [a[3] for a in asked] == ["--nodelist=n1", "--nodelist=n2"] and asked[0][1] == "--mpi=pmix"
    assert alloc.extra["pmi"] == {"mpi": "pmix", "seen_on": ["n1", "n2"]}  # into the provenance's allocation
    with pytest.raises(RunFailed, match="bad: a rank's container sees no PMIX_SERVER_URI"):
        pyxisstep.PyxisStep.pmi(alloc, ["n1", "bad"], "/f.sqsh")


def test_an_unnamed_mpi_plugin_is_the_first_of_pmix_pmi2_srun_offers(monkeypatch: pytest.MonkeyPatch):
    from types import SimpleNamespace

    from repro.errors import UsageError
    from repro.run.schedulers.slurm import allocation

    # srun --mpi=list of a Slurm without libpmix (with it, "pmix" and its versions follow)
    offered = "MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n"
    monkeypatch.setattr(allocation, "cli", lambda argv, **_: SimpleNamespace(stdout=offered, stderr=""))
    m = find_target("mpi-rn50-cpu")
    alloc = Allocation({"kind": "slurm", "container": "pyxis"}, m, [], Hosts(()), lambda e: None)
    alloc._check_mpi()
    assert alloc.cfg["mpi"] == "pmi2"
    named = Allocation({"kind": "slurm", "container": "pyxis", "mpi": "pmix"}, m, [], Hosts(()), lambda e: None)
    with pytest.raises(UsageError, match="pmix, but `srun --mpi=list` here offers none, cray_shasta, pmi2"):
        named._check_mpi()
