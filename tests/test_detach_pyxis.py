"""The detached batch script under ``container: pyxis``: the image imported once per node for the run by the
attached path's own image step (``enroot.image_argv``), every cell step started from that squashfs with the
image's PATH on every task, and the batch host's side of the image step run with ``sh`` against stand-ins
for srun, scancel, enroot and unsquashfs (the node script itself is the real one): the digest checked, the
PATH filled in, the squashfs removed when the script exits.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from repro.run.schedulers.slurm.detached import (JOBID, SAMPLING, Detach, Pyxis, _sampler_lines, detached,
                                                render_detached, sh_line, stand_ins)
from repro.run.schedulers.slurm.enroot import image_argv
from repro.run.schedulers.slurm.jobfiles import JobView, image_facts
from repro.spec.hosts import load_hosts
from repro.spec.manifest import find_target

DATA = Path(__file__).parent / "data" / "detach"
DIGEST = "sha256:" + "a" * 64
IMAGE = f"127.0.0.1:5000/repro-test/repro/cpu-paddle@{DIGEST}"
SLURM = {"kind": "slurm", "partition": "debug", "time": "15", "container": "pyxis"}


def pyxis_detach(target: str, nodes: int, **cfg: str) -> Detach:
    m = find_target(target)
    return Detach(m, m.select([{"nodes": nodes}]), load_hosts(DATA / "hosts-cpu.yaml"),
                  {**SLURM, **cfg}, IMAGE, run_id="RUN", repeats=2)


def test_the_image_step_is_the_attached_paths_and_runs_once():
    script = render_detached(pyxis_detach("paddle-rn50-cpu", 2)).text
    step = detached(image_argv(JOBID, ["__REPRO_N0__", "__REPRO_N1__"], IMAGE, "/tmp/repro-RUN.sqsh", DIGEST,
                               False), "job/image/%n-%N.log")
    assert script.count(sh_line(step) + " 2> job/image/srun.err &\n") == 1
    assert script.count("enroot import --output") == 1
    steps = [ln for ln in script.splitlines() if "--container-image=" in ln]
    assert len(steps) == 1 and "--container-image=/tmp/repro-RUN.sqsh " in steps[0]
    trap = script.index("trap 'unsample; release' EXIT")
    assert trap < script.index("event imported 2") < script.index("fill 2n1g")


def test_each_repeat_samples_with_the_attached_paths_sampler_step_stopped_after_the_cell():
    """The sampler's step is the attached path's (``render.sampler_srun``), its source the kit's sampler from
    ``job/sampler.py``, begun before the cell's step and stopped (``unsample``) right after it."""
    from repro.nodes.telemetry import SAMPLER, sampler_argv
    from repro.run.schedulers.slurm.render import sampler_srun

    d = pyxis_detach("paddle-rn50-cpu", 2)
    script = render_detached(d)
    assert script.files["sampler.py"] == SAMPLER.read_text()
    attached = sampler_srun(JOBID, ["__REPRO_N0__", "__REPRO_N1__"], "repro-2n1g-fp32-bs8-telemetry", 900)
    assert attached[-6:] == sampler_argv(900)
    step = detached([*attached[:-5], "job/sampler.py", *attached[-3:]],
                    "job/steps/2n1g-fp32-bs8/r__REPRO_R__a__REPRO_ATTEMPT__-telemetry-%n-%N.txt")
    lines = script.text.splitlines()
    at = lines.index(f'    {sh_line(step)} 2> "job/steps/2n1g-fp32-bs8/r${{r}}a$attempt-telemetry.srun" &')
    assert lines[at - 1].startswith("    begin 2n1g") and lines[at + 1].startswith("    sampling $! ")
    assert "--container-image=" in lines[at + 2] and lines[at + 3:at + 5] == ["    code=$?", "    unsample"]


def test_every_task_gets_the_images_path():
    paddle = render_detached(pyxis_detach("paddle-rn50-cpu", 2))
    ranks = paddle.inputs["2n1g-fp32-bs8.multi-prog.conf"].splitlines()
    assert len(ranks) == 2 and all(r.split()[1:3] == ["env", "PATH=__REPRO_PATH__"] for r in ranks)
    mpi = render_detached(pyxis_detach("mpi-rn50-cpu", 2)).text
    assert ' -- env PATH="${REPRO_PATH}" sh -c ' in mpi and " sh python3 /opt/repro/rn50_cpu.py " in mpi


def test_mpi_steps_use_the_hosts_files_pmi():
    """``mpi: pmi2`` reaches the detached step as it reaches the attached one; pmix where it says nothing."""
    steps = {mpi: [ln for ln in render_detached(pyxis_detach("mpi-rn50-cpu", 2, **cfg)).text.splitlines()
                   if "--container-image=" in ln]
             for mpi, cfg in (("pmi2", {"mpi": "pmi2"}), ("pmix", {}))}
    for mpi, lines in steps.items():
        assert len(lines) == 1 and lines[0].count(" --mpi=") == 1, lines
        assert f" srun --output=cells/2n1g-fp32-bs8/r\"${{r}}\"/%n-%N.log --mpi={mpi} --jobid=" in lines[0]


def test_kept_images_are_named_after_the_target():
    script = render_detached(pyxis_detach("paddle-rn50-cpu", 2, keep_image="yes", image_dir="/scratch")).text
    assert " /scratch/repro-paddle-rn50-cpu.sqsh " + DIGEST + " yes '' " in script


#: srun runs the step's command on node ``n0`` in its own process group, which the step's TERM goes to (as
#: slurmstepd signals a task); scancel TERMs srun. srun says where it is, and takes a TERM, before the task
#: starts: the script may scancel as soon as the task has spoken, and a TERM before the task began still ends it
STUBS = {
    "srun": """#!/bin/sh
out=
while [ "$1" != -- ]; do case "$1" in --output=*) out=${1#--output=};; esac; shift; done
shift
stop=
trap 'stop=1' TERM
echo $$ > "$STUBS/srun.pid"
SLURM_JOB_ID=7 SLURM_STEP_ID=3 setsid "$@" > "$(echo "$out" | sed 's/%n/0/; s/%N/n0/')" 2>&1 &
task=$!
trap 'kill -TERM -$task' TERM
[ -z "$stop" ] || kill -TERM -$task
wait
wait $task
""",
    "scancel": """#!/bin/sh
echo "$@" >> "$STUBS/scancel.args"
kill -TERM "$(cat "$STUBS/srun.pid")"
""",
    "enroot": """#!/bin/sh
case "$1" in version) echo 4.1.2;; import) echo squashfs > "$3";; esac
""",
    "unsquashfs": """#!/bin/sh
printf 'LANG=C\\nPATH=/opt/conda/bin:/usr/bin:/bin\\n'
""",
}


def run_prologue(tmp: Path, d: Detach, end: str = "quit 0 done") -> tuple[subprocess.CompletedProcess[str], str]:
    """The script's image lines between a stand-in of its prologue (one node, ``n0``) and its ``end``."""
    stubs = tmp / "stubs"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    body = "\n".join(["set -u", 'event() { echo "$*" >> events; }', 'quit() { event end "$@"; exit "$1"; }',
                      SAMPLING, "REPRO_N0=n0 SUBST=", *Pyxis.prologue(d, []), 'echo "$SUBST" > subst', end])
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUBS": str(stubs), "SLURM_JOB_ID": "7"}
    out = subprocess.run(["sh", "-c", body], cwd=tmp, env=env, capture_output=True, text=True, timeout=30)
    return out, (tmp / "events").read_text()


def test_the_script_checks_the_digest_fills_the_path_and_removes_the_file(tmp_path: Path):
    d = pyxis_detach("paddle-rn50-cpu", 1, image_dir=str(tmp_path / "node"))
    out, events = run_prologue(tmp_path, d)
    assert out.returncode == 0, out.stderr
    assert events == "imported 1\nend 0 done\n"
    assert (tmp_path / "subst").read_text() == " -e s|__REPRO_PATH__|/opt/conda/bin:/usr/bin:/bin|g\n"
    assert (tmp_path / "stubs" / "scancel.args").read_text() == "--signal=TERM -- 7.3\n"
    log = [ln for ln in (tmp_path / "job" / "image" / "0-n0.log").read_text().splitlines() if "##repro" in ln]
    assert log[-3:] == ["##repro path /opt/conda/bin:/usr/bin:/bin", "##repro ready", "##repro released"]
    assert list((tmp_path / "node").iterdir()) == []  # the squashfs and its digest record removed
    # what `repro report` records of it: the node's image step as the attached path records it
    assert image_facts(tmp_path, view_of(d)) == ({
        "image": IMAGE, "file": f"{tmp_path}/node/repro-RUN.sqsh", "kept": False,
        "nodes": [{"node": "n0", "enroot": "4.1.2", "action": "imported", "digest": DIGEST,
                   "path": "/opt/conda/bin:/usr/bin:/bin", "ready": True, "released": True}]}, [])


def view_of(d: Detach) -> JobView:
    """The job as ``repro report`` reads it: submitted as ``up --detach`` records it, on node ``n0``."""
    return JobView("7", {"container": "pyxis", "image": d.image, "image_file": Pyxis.squashfs(d)[0],
                         "keep_image": d.cfg.get("keep_image") == "yes"}, nodes=[("n0", "n0")])


def test_slurm_ending_the_job_mid_run_still_removes_the_file(tmp_path: Path):
    """A node failure, the time limit or scancel: Slurm TERMs the batch script while a cell step runs (here a
    ``sleep``). The script's EXIT trap still stops the image step, whose node script removes the squashfs; the
    job's events end without an ``end`` line, so `repro status` and `repro report` take the running repeat
    for pending, stopped by Slurm (jobfiles, with the state Slurm gives the job: NODE_FAIL, TIMEOUT)."""
    d = pyxis_detach("paddle-rn50-cpu", 1, image_dir=str(tmp_path / "node"))
    out, events = run_prologue(tmp_path, d, "event start 1n1g-fp32-bs8 1 1\nsleep 30 > /dev/null 2>&1 & kill -TERM $$; wait")
    assert out.returncode == 143, out.stderr
    assert events == "imported 1\nstart 1n1g-fp32-bs8 1 1\n"
    assert (tmp_path / "stubs" / "scancel.args").read_text() == "--signal=TERM -- 7.3\n"
    log = [ln for ln in (tmp_path / "job" / "image" / "0-n0.log").read_text().splitlines() if "##repro" in ln]
    assert log[-2:] == ["##repro ready", "##repro released"]
    assert list((tmp_path / "node").iterdir()) == []


def test_a_kept_image_of_another_digest_ends_the_job(tmp_path: Path):
    node = tmp_path / "node"
    node.mkdir()
    (node / "repro-paddle-rn50-cpu.sqsh").write_text("squashfs")
    (node / "repro-paddle-rn50-cpu.sqsh.digest").write_text("sha256:" + "b" * 64 + "\n")
    d = pyxis_detach("paddle-rn50-cpu", 1, image_dir=str(node), keep_image="yes")
    out, events = run_prologue(tmp_path, d)
    assert out.returncode == 4
    assert events == (f"end 4 node n0: {node}/repro-paddle-rn50-cpu.sqsh holds sha256:{'b' * 64}, the run "
                      f"locks {DIGEST}\n")
    assert sorted(p.name for p in node.iterdir()) == ["repro-paddle-rn50-cpu.sqsh",
                                                      "repro-paddle-rn50-cpu.sqsh.digest"]  # kept: the user's
    # `repro report` fails it as the attached path fails it, from what the node's image step said
    facts, problems = image_facts(tmp_path, view_of(d))
    assert facts["kept"] is True and facts["nodes"][0]["action"] == "reused"
    assert problems == [f"n0: {node}/repro-paddle-rn50-cpu.sqsh holds sha256:{'b' * 64} (imported earlier and "
                        f"kept), the run locks {DIGEST}"]


def sampler_processes(cwd: Path) -> list[str]:
    """This machine's processes running the kit's sampler from ``cwd``."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if b"job/sampler.py" in (proc / "cmdline").read_bytes().split(b"\0") and \
                    (proc / "cwd").resolve() == cwd.resolve():
                out.append(proc.name)
        except OSError:
            continue
    return out


@pytest.mark.parametrize("end,code", [("code=0\n    unsample\nquit 0 done", 0),  # the cell's step ended
                                      ("quit 5 'the cell failed'", 5),  # any other way out of the script
                                      ("kill -TERM $$; wait", 143)])  # Slurm ended the job (TERM)
def test_the_repeats_sampler_samples_from_before_the_cell_and_is_stopped_on_every_way_out(tmp_path, end, code):
    """The repeat's sampler lines as the script holds them, with the kit's real sampler and a stand-in srun
    (one node): the cell's step begins once the node's sampler wrote its first line; once the script goes
    on, or ends however it ends, no sampler is left and its file holds what it said."""
    d = pyxis_detach("paddle-rn50-cpu", 1, image_dir=str(tmp_path / "node"))
    cell = d.order()[0]
    (tmp_path / "job" / "steps" / cell.key).mkdir(parents=True)
    (tmp_path / "job" / "sampler.py").write_text(render_detached(d).files["sampler.py"])
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "srun").write_text(STUBS["srun"])
    (stubs / "srun").chmod(0o755)
    body = "\n".join(["set -u", 'event() { echo "$*" >> events; }', 'quit() { event end "$@"; exit "$1"; }',
                      "trap 'exit 143' TERM", SAMPLING, "REPRO_N0=n0 r=1 attempt=1",
                      *_sampler_lines(d, cell, stand_ins(d.hosts, 1)), 'event cell "$(cat job/steps/*/r1a1-telemetry-0-n0.txt)"',
                      end])
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUBS": str(stubs), "SLURM_JOB_ID": "7"}
    out = subprocess.run(["sh", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stderr
    assert (tmp_path / "events").read_text().startswith("cell telemetry v1 interval_ms=1000 max_bytes=4194304")
    assert sampler_processes(tmp_path) == []
    said = (tmp_path / "job" / "steps" / cell.key / "r1a1-telemetry-0-n0.txt").read_text().splitlines()
    assert said[0] == "telemetry v1 interval_ms=1000 max_bytes=4194304"
