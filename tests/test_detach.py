"""Submit and walk away (``repro up --detach``): the batch script as exact text (docker, pyxis), the files it
reads (mode 0600, the only place per-run keys and secret values go), what ``repro status`` and ``repro
report`` read back from a run directory, and the refusals.

The docker script below was submitted as it is on the test cluster (tests/integration/test_detach_cluster.py
runs it for real); the pyxis scripts render the same job steps the attached path starts.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cli_helpers import run_cli
from repro.run.rundir import RunDir
from repro.run.schedulers.slurm import jobfiles
from repro.run.schedulers.slurm.detached import (SUBMITTED, Detach, render_detached, sh_word, stand_ins,
                                                 write_job)
from repro.spec.hosts import load_hosts
from repro.spec.manifest import find_target

DATA = Path(__file__).parent / "data" / "detach"
DIGEST = "sha256:" + "a" * 64
SLURM = {"kind": "slurm", "partition": "debug", "time": "15", "container": "docker"}


def detach_of(target: str, container: str = "docker", nodes: int | None = None, repeats: int = 2) -> Detach:
    m = find_target(target)
    cells = m.select([{"nodes": nodes}] if nodes else [])
    image = f"127.0.0.1:5000/repro-test/repro/cpu-{target.split('-')[0]}@{DIGEST}"
    return Detach(m, cells, load_hosts(DATA / "hosts-cpu.yaml"), {**SLURM, "container": container}, image,
                  run_id="RUN", repeats=repeats, environ={})


@pytest.mark.parametrize("target,container,nodes,expected", [
    ("torch-rn50-cpu", "docker", None, "torch-rn50-cpu-docker.sbatch"),
    ("paddle-rn50-cpu", "pyxis", 2, "paddle-rn50-cpu-pyxis.sbatch"),
    ("mpi-rn50-cpu", "pyxis", 2, "mpi-rn50-cpu-pyxis.sbatch"),
])
def test_detached_script_exact(target, container, nodes, expected):
    assert render_detached(detach_of(target, container, nodes)).text == (DATA / expected).read_text()


def test_tokens_become_quoted_shell_variables():
    assert sh_word("--nodelist=__REPRO_N0__,__REPRO_N1__") == '--nodelist="${REPRO_N0}","${REPRO_N1}"'
    assert sh_word("--jobid=__REPRO_JOB__") == '--jobid="${SLURM_JOB_ID}"'
    assert sh_word("cells/k/r__REPRO_R__/%n-%N.log") == 'cells/k/r"${r}"/%n-%N.log'
    assert sh_word("a b __REPRO_A12__'x") == "'a b '\"${REPRO_A12}\"''\"'\"'x'"
    assert sh_word("$(rm -rf /)") == "'$(rm -rf /)'"


def test_stand_in_nodes_keep_the_inventorys_gpu_count():
    hosts = stand_ins(load_hosts(DATA / "hosts-cpu.yaml"), 3)
    assert [(n.name, n.address, n.gpus) for n in hosts.nodes] == [
        ("__REPRO_N0__", "__REPRO_A0__", 0), ("__REPRO_N1__", "__REPRO_A1__", 0), ("__REPRO_N2__", "__REPRO_A2__", 0)]


def test_per_run_keys_stay_out_of_the_script_and_inputs_are_0600(tmp_path: Path):
    """An MPI target under docker: the agent's spec holds the per-run SSH keys; the script never does, and the
    files holding them are readable by their owner alone."""
    d = detach_of("mpi-rn50-cpu", nodes=2)
    script = render_detached(d)
    spec = json.loads(script.inputs["2n1g-fp32-bs8.json"])
    key = spec["ranks"][0]["files"]["/run/repro-mpi/id_ed25519"][0]
    assert key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert key not in script.text and "PRIVATE KEY" not in script.text
    assert [r["wait_for"] for r in spec["ranks"]] == [[["__REPRO_A1__", 12345]], []]
    run = tmp_path / "run"
    run.mkdir()
    path = write_job(run, d, script)
    assert path == run / "job" / "batch.sbatch" and path.read_text() == script.text
    assert stat.S_IMODE((run / "job" / "in").stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in (run / "job" / "in").iterdir()} == {
        "2n1g-fp32-bs8.json": 0o600}
    assert len((run / "job" / "token").read_text()) == 32


EVENTS = """\
2026-11-26T03:01:10Z job 13 rc-node[1-2]
2026-11-26T03:01:10Z shared 2
2026-11-26T03:01:11Z pulled
2026-11-26T03:01:12Z start 1n1g-fp32-bs8 1 1
2026-11-26T03:01:40Z exit 1n1g-fp32-bs8 1 1 0
2026-11-26T03:01:41Z start 1n1g-fp32-bs8 2 1
2026-11-26T03:02:20Z exit 1n1g-fp32-bs8 2 1 1
2026-11-26T03:02:21Z start 1n1g-fp32-bs8 2 2
2026-11-26T03:17:21Z exit 1n1g-fp32-bs8 2 2 124
2026-11-26T03:17:22Z start 2n1g-fp32-bs8 1 1
"""


def job_dir(tmp_path: Path, events: str, nodes: str = "0 rc-node1 10.77.0.11\n1 rc-node2 10.77.0.12\n") -> Path:
    run = RunDir.create(tmp_path, find_target("torch-rn50-cpu"), load_hosts(DATA / "hosts-cpu.yaml"),
                        run_id="20261126T030000Z-torch-rn50-cpu-abcdef").path
    (run / "job" / "shared").mkdir(parents=True)
    (run / "job" / "token").write_text("t" * 32)
    for i, name in enumerate(["rc-node1", "rc-node2"]):
        (run / "job" / "shared" / f"{i}-{name}").write_text("t" * 32)
    (run / "job" / "events").write_text(events)
    (run / "job" / "nodes").write_text(nodes)
    (run / SUBMITTED).write_text(json.dumps({
        "job_id": "13", "submitted": "2026-11-26T02:59:13.103+00:00", "host": "vm", "script": "job/batch.sbatch",
        "container": "docker", "image": "IMAGE", "timeout_s": 900, "attempts": 2,
        "repeats": {"1n1g-fp32-bs8": 2, "2n1g-fp32-bs8": 2}}))
    return run


def statuses(view: jobfiles.JobView) -> dict:
    return {f"{k} r{r}": (rep.status, rep.attempts, rep.why) for (k, r), rep in view.repeats.items()}


def test_progress_from_the_job_events_while_it_runs(tmp_path: Path):
    view = jobfiles.read_job(job_dir(tmp_path, EVENTS), lambda job: "RUNNING")
    assert view.nodes == [("rc-node1", "10.77.0.11"), ("rc-node2", "10.77.0.12")] and view.shared is True
    assert not view.over and view.state == "RUNNING"
    assert statuses(view) == {
        "1n1g-fp32-bs8 r1": ("done", 1, None),
        "1n1g-fp32-bs8 r2": ("failed", 2, "timed out after 900 s"),
        "2n1g-fp32-bs8 r1": ("running", 1, None),
        "2n1g-fp32-bs8 r2": ("pending", 0, None)}


def test_a_job_slurm_ended_leaves_the_running_repeat_pending_with_why(tmp_path: Path):
    view = jobfiles.read_job(job_dir(tmp_path, EVENTS), lambda job: "TIMEOUT")
    assert view.over and view.end is None
    assert statuses(view)["2n1g-fp32-bs8 r1"] == ("pending", 1, "stopped: Slurm ended job 13 (TIMEOUT)")
    assert statuses(view)["2n1g-fp32-bs8 r2"] == ("pending", 0, None)


def test_a_node_that_does_not_share_the_run_directory_is_seen(tmp_path: Path):
    run = job_dir(tmp_path, EVENTS.splitlines(keepends=True)[0] + "2026-11-26T03:01:11Z end 3 node rc-node2 "
                  "does not see the run directory /x (it must be on a filesystem the nodes share)\n")
    (run / "job" / "shared" / "1-rc-node2").unlink()
    view = jobfiles.read_job(run, lambda job: "FAILED")
    assert view.shared is None and view.over
    assert view.end == (3, "node rc-node2 does not see the run directory /x (it must be on a filesystem the "
                           "nodes share)", "2026-11-26T03:01:11Z")
    out = run_cli("status", str(run))
    assert out.returncode == 0
    assert "the job's script ended: exit 3 (node rc-node2 does not see the run directory /x" in out.stdout


def test_status_text_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from repro.run.schedulers.slurm import SlurmScheduler

    monkeypatch.setattr(SlurmScheduler, "job_state", classmethod(lambda cls, job: "RUNNING"))
    run = job_dir(tmp_path, EVENTS)
    out = run_cli("status", str(run))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"""\
run {run}
job 13 (submitted 2026-11-26T02:59:13.103+00:00 from vm): RUNNING
nodes: rc-node1 (10.77.0.11), rc-node2 (10.77.0.12)
run directory shared with every node: yes (each node read the token back, and this side sees what they wrote)

cell           repeat  status   attempts  started               ended                 why
1n1g-fp32-bs8  1       done     1         2026-11-26T03:01:12Z  2026-11-26T03:01:40Z
1n1g-fp32-bs8  2       failed   2         2026-11-26T03:02:21Z  2026-11-26T03:17:21Z  timed out after 900 s
2n1g-fp32-bs8  1       running  1         2026-11-26T03:17:22Z  -
2n1g-fp32-bs8  2       pending  0         -                     -

1 done, 1 running, 1 failed, 1 pending of 4 repeat(s)
"""
    doc = json.loads(run_cli("status", str(run), "--format", "json").stdout)
    assert doc["job_id"] == "13" and doc["over"] is False and len(doc["repeats"]) == 4

    # report refuses to judge a job that still runs, and says where to look
    out = run_cli("report", str(run))
    assert out.returncode == 2 and "job 13 is RUNNING; nothing to judge yet" in out.stderr
    assert f"repro status {run}" in out.stderr and "Traceback" not in out.stderr
    # nor does --resume run it again attached while its state is still in the job's files
    out = run_cli("up", "--resume", str(run))
    assert out.returncode == 2 and "is a detached run not judged yet" in out.stderr
    assert f"repro report {run} first" in out.stderr


def test_status_of_an_ended_job_says_whether_it_is_judged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from repro.run.schedulers.slurm import SlurmScheduler

    monkeypatch.setattr(SlurmScheduler, "job_state", classmethod(lambda cls, job: "COMPLETED"))
    run = job_dir(tmp_path, EVENTS)
    last = run_cli("status", str(run)).stdout.splitlines()[-1]
    assert last == f"judge it and seal its provenance: repro report {run}"
    (run / "SHA256SUMS").write_text("")  # what sealing leaves
    last = run_cli("status", str(run)).stdout.splitlines()[-1]
    assert last == f"judged and sealed: repro report {run} shows its table, repro audit {run} checks it"


def test_status_of_a_run_that_was_not_detached(tmp_path: Path):
    run = RunDir.create(tmp_path, find_target("torch-rn50-cpu"), load_hosts(DATA / "hosts-cpu.yaml")).path
    out = run_cli("status", str(run))
    assert out.returncode == 2 and f"{run} is not a detached run (no job/submitted.json)" in out.stderr
    out = run_cli("status", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "is not a run directory" in out.stderr and "Traceback" not in out.stderr


def test_detach_refusals_before_anything_is_built(tmp_path: Path):
    # the default scheduler (ssh) submits no batch job
    out = run_cli("up", "torch-rn50-cpu", "--detach", "--out", str(tmp_path))
    assert out.returncode == 2 and "--detach needs a scheduler that queues the run as a batch job; ssh" in out.stderr
    # a built image must go to a registry: nothing streams it to the nodes while the user is away
    out = run_cli("up", "torch-rn50-cpu", "--detach", "--hosts", str(DATA / "hosts-cpu.yaml"), "--out",
                  str(tmp_path))
    assert out.returncode == 2, out.stderr
    assert "torch-rn50-cpu builds its image, and a detached run's nodes pull it by digest from a registry" in out.stderr
    assert "give --push REGISTRY" in out.stderr
    out = run_cli("up", "--detach", "--resume", str(tmp_path))
    assert out.returncode == 2 and "--detach starts a new run" in out.stderr
    assert os.listdir(tmp_path) == []


def test_plan_script_prints_exactly_the_detached_script(tmp_path: Path):
    out = run_cli("plan", "torch-rn50-cpu", "--script", "--hosts", str(DATA / "hosts-cpu.yaml"), "--cells",
                  "nodes=2", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    d = detach_of("torch-rn50-cpu", nodes=2, repeats=1)
    d.image = "REGISTRY/repro/cpu-torch:2.13.0@DIGEST"
    assert out.stdout == render_detached(d).text
    out = run_cli("plan", "torch-rn50-cpu", "--script")
    assert out.returncode == 2 and "--script prints a batch script; scheduler ssh submits none" in out.stderr


def test_secret_values_the_jobs_inputs_held_are_scrubbed_when_judged(tmp_path: Path):
    """What ``report`` scrubs from the job's files before it seals: the secret-looking values of the
    environments the job's inputs held (a pyxis step's env file, the agent's ``docker create -e``)."""
    from repro.run.schedulers.slurm.jobfiles import job_envs
    from repro.redact import Redactor

    run = RunDir(tmp_path)
    (tmp_path / "job" / "in").mkdir(parents=True)
    (tmp_path / "job" / "in" / "k.env").write_text("export HF_TOKEN='s3cr3t value'\nexport OMP_NUM_THREADS=2\n")
    (tmp_path / "job" / "in" / "k.json").write_text(json.dumps(
        {"ranks": [{"create": ["--network=host", "-e=WANDB_API_KEY=abc123xyz", "-e=A=1", "IMAGE", "run"]}]}))
    envs = job_envs(run.path)
    assert envs[1:] == [{"HF_TOKEN": "s3cr3t value", "OMP_NUM_THREADS": "2"},
                        {"WANDB_API_KEY": "abc123xyz", "A": "1"}]
    scrub = Redactor.from_envs(*envs[1:])
    assert scrub.text("token s3cr3t value key abc123xyz threads 2") == \
        "token <redacted> key <redacted> threads 2"


def test_why_a_repeat_failed_names_what_slurm_or_pyxis_said(tmp_path: Path):
    """The pyxis run on the test cluster: the image imported, then the task's command was not found (lines as
    its log and srun's report held them); the cancellation kill-on-bad-exit causes is not the reason."""
    run = job_dir(tmp_path, EVENTS.splitlines(keepends=True)[0] + (
        "2026-11-26T03:55:37Z start 2n1g-fp32-bs8 1 1\n2026-11-26T03:59:21Z exit 2n1g-fp32-bs8 1 1 2\n"
        "2026-11-26T03:59:21Z start 2n1g-fp32-bs8 1 2\n"))
    logs = run / "cells" / "2n1g-fp32-bs8" / "r1"
    logs.mkdir(parents=True)
    (logs / "0-rc-node1.attempt1").write_text(
        "pyxis: imported docker image: 127.0.0.1:5000#repro-test/repro/cpu-torch@" + DIGEST + "\n"
        "slurmstepd-rc-node1: error: *** STEP 46.1 ON rc-node1 CANCELLED AT 2026-11-26T03:59:20 ***\n"
        "slurmstepd-rc-node1: error: execve(): torchrun: No such file or directory\n")
    (run / "job" / "steps" / "2n1g-fp32-bs8").mkdir(parents=True)
    (run / "job" / "steps" / "2n1g-fp32-bs8" / "r1a1.srun").write_text(
        "srun: error: rc-node2: task 1: Exited with exit code 2\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=46.1\n")
    view = jobfiles.read_job(run, lambda job: "RUNNING")
    assert statuses(view)["2n1g-fp32-bs8 r1"] == ("running", 2, None)
    rep = jobfiles.Repeat("2n1g-fp32-bs8", 1)
    assert jobfiles.srun_said(run, rep.cell, "1", "1") == \
        "slurmstepd-rc-node1: error: execve(): torchrun: No such file or directory"
    assert jobfiles.srun_said(run, rep.cell, "1", "2") is None


def test_a_node_image_of_another_digest_fails_the_report_as_attached(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    """A pyxis job whose batch host ended it (exit 4) since rc-node2 kept a squashfs of another digest: `repro
    report` records what each node's image step said (as the attached path records it), leaves the repeats
    it never started pending with why, seals the run and fails it with the attached path's error (exit 5)."""
    from repro.run.schedulers.slurm.jobfiles import IMAGE, RECORD
    from repro.record import provenance
    from repro.run.schedulers.slurm import SlurmScheduler

    monkeypatch.setattr(SlurmScheduler, "job_state", classmethod(lambda cls, job: "FAILED"))
    image, other, kept = f"127.0.0.1:5000/repro-test/repro/cpu-torch@{DIGEST}", "sha256:" + "b" * 64, "/l/x.sqsh"
    run = job_dir(tmp_path, EVENTS.splitlines(keepends=True)[0] + "2026-11-26T03:01:11Z shared 2\n"
                  f"2026-11-26T03:01:30Z end 4 node rc-node2: {kept} holds {other}, the run locks {DIGEST}\n")
    sub = json.loads((run / SUBMITTED).read_text())
    (run / SUBMITTED).write_text(json.dumps({**sub, "container": "pyxis", "image": image, "image_file": kept,
                                             "keep_image": True}))
    (run / "job" / "batch.sbatch").write_text("#!/bin/sh\n")
    (run / "job" / "image").mkdir()
    for i, (name, action, digest) in enumerate([("rc-node1", "imported", DIGEST), ("rc-node2", "reused", other)]):
        (run / "job" / "image" / f"{i}-{name}.log").write_text(
            f"##repro step 13.1\n##repro enroot 4.1.2\n##repro {action} {digest}\n##repro path /usr/bin:/bin\n"
            "##repro ready\n##repro released\n")
    rd = RunDir.open(run)
    rd.write_json(RECORD, provenance.new_record(rd, rd.load_manifest(), load_hosts(run / "hosts.yaml")))
    rd.write_json(IMAGE, {"ref": image, "id": "sha256:" + "c" * 64, "repo_digests": [], "digest": DIGEST,
                          "labels": {}, "container": {"value": None, "reason": "not probed"}})
    out = run_cli("report", str(run))
    assert out.returncode == 5, out.stdout[-2000:] + out.stderr[-2000:]
    assert (f"the image could not be made ready on every node (enroot):\n  rc-node2: {kept} holds {other} "
            f"(imported earlier and kept), the run locks {DIGEST}") in out.stderr
    assert "rc-node1:" not in out.stderr and "Traceback" not in out.stderr
    alloc = json.loads((run / "provenance.json").read_text())["scheduler"][0]
    assert alloc["image"] == {"image": image, "file": kept, "kept": True, "nodes": [
        {"node": n, "enroot": "4.1.2", "action": a, "digest": d, "path": "/usr/bin:/bin", "ready": True,
         "released": True} for n, a, d in [("rc-node1", "imported", DIGEST), ("rc-node2", "reused", other)]]}
    why = {(k, n): r["why"] for k, c in json.loads((run / "state.json").read_text())["cells"].items()
           for n, r in c["repeats"].items() if n in ("1", "2")}  # the repeats the job was to run
    assert len(why) == 4 and set(why.values()) == {"stopped: the image could not be made ready on every node (enroot): rc-node2: "
                                 f"{kept} holds {other} (imported earlier and kept), the run locks {DIGEST}"}


@pytest.mark.parametrize("end,problems", [
    # the job ended before the image step: the shared-directory check (exit 3), or Slurm (no end line)
    ("2026-11-26T03:01:11Z end 3 node rc-node2 does not see the run directory /x\n", []),
    ("", []),
    # the batch host ended it for the image: the node that said an error, and the one that said nothing
    ("2026-11-26T03:01:11Z end 4 the image on node rc-node1: enroot import failed (job/image/0-rc-node1.log)\n",
     ["rc-node1: enroot import failed", "rc-node2: no enroot output"]),
])
def test_an_image_not_ready_is_the_images_failure_only_where_the_job_ended_for_it(tmp_path: Path, end, problems):
    run = job_dir(tmp_path, EVENTS.splitlines(keepends=True)[0] + end)
    sub = json.loads((run / SUBMITTED).read_text())
    (run / SUBMITTED).write_text(json.dumps({**sub, "container": "pyxis", "image": f"r/i@{DIGEST}",
                                             "image_file": "/l/x.sqsh", "keep_image": False}))
    (run / "job" / "image").mkdir()
    (run / "job" / "image" / "0-rc-node1.log").write_text("##repro step 13.1\n##repro enroot 4.1.2\n"
                                                          "##repro error enroot import failed\n")
    facts, found = jobfiles.image_facts(run, jobfiles.read_job(run, lambda job: "FAILED"))
    assert found == problems
    assert facts["nodes"] == [{"node": "rc-node1", "enroot": "4.1.2", "error": "enroot import failed"},
                              {"node": "rc-node2"}]


def test_judging_copies_each_repeats_last_attempt_telemetry_as_the_attached_path_writes_it(tmp_path: Path):
    """The sampler's job step wrote each node's lines to ``job/steps/KEY/rNaA-telemetry-I-NODE.txt`` (the
    kit's sampler as it ran on rc-node1 of the test cluster, its lines as srun --output writes them): the
    repeat's ``telemetry-NODE.txt`` holds the last attempt's lines and ``telemetry.json`` what they say, as
    the attached path's ``TelemetryFiles`` writes them; an earlier attempt's and a stray file are left."""
    from repro.nodes.telemetry import repeat_summary, summary

    lines = (Path(__file__).parent / "data" / "telemetry" / "cpu-sampler-rc-node1.txt").read_text()
    sampled = "".join(lines.splitlines(keepends=True)[1:])  # the kit's own `containers` line: not a sampler's
    run = job_dir(tmp_path, EVENTS)
    steps = run / "job" / "steps" / "1n1g-fp32-bs8"
    steps.mkdir(parents=True)
    (steps / "r2a2-telemetry-0-rc-node1.txt").write_text(sampled)
    (steps / "r2a1-telemetry-0-rc-node1.txt").write_text("telemetry v1 interval_ms=1000 max_bytes=4194304\n")
    (steps / "r2a2-telemetry-0-elsewhere.txt").write_text(sampled)
    jobfiles.copy_telemetry(RunDir.open(run), jobfiles.read_job(run, lambda job: "RUNNING"))
    r2 = run / "cells" / "1n1g-fp32-bs8" / "r2"
    assert sorted(p.name for p in r2.iterdir()) == ["telemetry-rc-node1.txt", "telemetry.json"]
    assert (r2 / "telemetry-rc-node1.txt").read_text() == sampled
    written = json.loads((r2 / "telemetry.json").read_text())
    assert written == repeat_summary(r2) and written["rc-node1"]["cpu"]["samples"] == 13
    assert not (run / "cells" / "1n1g-fp32-bs8" / "r1").exists()  # its attempt's step wrote nothing
    assert summary(run, "1n1g-fp32-bs8")["repeats"] == {2: written}
