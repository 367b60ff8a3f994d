"""A detached run directory is untrusted input: ``repro report`` and ``repro status`` of one whose job files
are hostile (links out of it, a job id that is a path, files without end, numbers without end, nesting
without end) refuse it before anything in it is read, written or removed, within a bound of time, and
write nothing outside it. A detached pyxis run whose launch environment holds any value ``validate``
accepts is judged and sealed.

Each case starts from a detached pyxis run as ``repro up --detach`` leaves it (``write_job`` of the rendered
script, ``job/submitted.json`` as ``submit`` writes it) and its job's files as the batch script leaves them
(every repeat done), nested a few levels down ``tmp_path`` so that whatever escapes it stays in the test's
folder, where the snapshot of everything but the run directory sees it.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from test_detach import DATA, DIGEST
from test_hostile_input import TIME_BOUND_S, run_cli
from repro.record import provenance
from repro.run.rundir import RunDir
from repro.run.schedulers.slurm.detached import SUBMITTED, Detach, Pyxis, render_detached, write_job
from repro.run.schedulers.slurm.jobfiles import IMAGE, RECORD
from repro.spec.hosts import load_hosts
from repro.spec.manifest import find_target, load_manifest

TARGET = "paddle-rn50-cpu"
IMAGE_REF = f"127.0.0.1:5000/repro-test/repro/cpu-paddle@{DIGEST}"
RUN_ID = "20261126T030000Z-paddle-rn50-cpu-abcdef"
NODES = ["rc-node1", "rc-node2"]
JUDGED_S = 30.0  # CPU seconds a report that judges and seals a run of four repeats may take (about 3)
SECRET = "the contents of a file outside the run directory\n"


@pytest.fixture(autouse=True)
def slurm_says_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.run.schedulers.slurm import SlurmScheduler

    monkeypatch.setattr(SlurmScheduler, "job_state", classmethod(lambda cls, job: "COMPLETED"))
    monkeypatch.setenv("XDG_DATA_HOME", "/nonexistent-store-never-written")


def detached_run(root: Path, env: dict[str, str] | None = None) -> Path:
    """A detached pyxis run of TARGET on two nodes whose job is over, every repeat done, under ``root``."""
    manifest = find_target(TARGET)
    if env is not None:
        doc = yaml.safe_load(manifest.path.read_text())
        doc["launch"]["env"] = {**doc["launch"].get("env", {}), **env}
        path = root.parent / f"{TARGET}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        manifest = load_manifest(path)
    hosts = load_hosts(DATA / "hosts-cpu.yaml")
    run = RunDir.create(root, manifest, hosts, run_id=RUN_ID)
    cfg = {"kind": "slurm", "partition": "debug", "time": "15", "container": "pyxis"}
    d = Detach(manifest, manifest.select([]), hosts, cfg, IMAGE_REF, run_id=RUN_ID, repeats=2)
    write_job(run.path, d, render_detached(d))
    job = run.path / "job"
    (job / "run").mkdir()
    for f in (job / "in").iterdir():  # the job's filled-in copies of its inputs
        (job / "run" / f.name).write_text(f.read_text())
    token = (job / "token").read_text()
    (job / "shared").mkdir()
    (job / "image").mkdir()
    for i, name in enumerate(NODES):
        (job / "shared" / f"{i}-{name}").write_text(token)
        (job / "image" / f"{i}-{name}.log").write_text(
            f"##repro step 13.1\n##repro enroot 4.1.2\n##repro imported {DIGEST}\n##repro path /usr/bin:/bin\n"
            "##repro ready\n##repro released\n")
    (job / "nodes").write_text("".join(f"{i} {n} 10.77.0.1{i + 1}\n" for i, n in enumerate(NODES)))
    events = ["job 13 rc-node[1-2]", "shared 2", "imported 2"]
    for c in d.order():
        for r in (1, 2):
            events += [f"start {c.key} {r} 1", f"exit {c.key} {r} 1 0"]
    (job / "events").write_text("".join(f"2026-11-26T03:01:{i:02d}Z {e}\n" for i, e in enumerate(events + ["end 0 done"])))
    (run.path / SUBMITTED).write_text(json.dumps({
        "job_id": "13", "submitted": "2026-11-26T02:59:13.103+00:00", "host": "vm", "script": "job/batch.sbatch",
        "container": "pyxis", "image": IMAGE_REF, "timeout_s": 900, "attempts": 1,
        "repeats": {c.key: 2 for c in d.order()}, "image_file": Pyxis.squashfs(d)[0], "keep_image": False}))
    run.write_json(RECORD, provenance.new_record(run, manifest, hosts))
    run.write_json(IMAGE, {"ref": IMAGE_REF, "id": "sha256:" + "c" * 64, "repo_digests": [], "digest": DIGEST,
                           "labels": {}, "container": {"value": None, "reason": "not probed"}})
    return run.path


def snapshot(top: Path, run: Path) -> dict[str, tuple[str, bytes | str]]:
    """Everything under ``top`` but ``run``: each path, its kind and its bytes (or a link's target)."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for folder, dirs, files in os.walk(top):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d != run]
        for name in dirs + files:
            p = here / name
            rel = p.relative_to(top).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", b"")
            else:
                out[rel] = ("file", p.read_bytes())
    return out


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """Where the run directory goes: five levels down, with a file outside it that no run may read."""
    root = tmp_path / "a" / "b" / "c" / "d" / "logs"
    root.mkdir(parents=True)
    (tmp_path / "outside.txt").write_text(SECRET)
    return root


def holds_secret(run: Path) -> list[str]:
    return [p.relative_to(run).as_posix() for p in run.rglob("*")
            if p.is_file() and not p.is_symlink() and SECRET.strip().encode() in p.read_bytes()]


def test_a_clean_detached_pyxis_run_is_judged_and_sealed(place: Path) -> None:
    """The base of every case below: judged, sealed, nothing but its archive written beside it."""
    run = detached_run(place)
    top = place.parents[4]
    before = snapshot(top, run)
    code, out, _ = run_cli(["report", str(run), "--no-record"], bound=60)
    assert (run / "provenance.json").is_file() and (run / "SHA256SUMS").is_file(), out
    assert not (run / "job" / "in").exists() and not (run / "job" / "run").exists()
    after = snapshot(top, run)
    added = {k for k in after if k not in before}
    assert added == {f"a/b/c/d/logs/{RUN_ID}.tar.gz", f"a/b/c/d/logs/{RUN_ID}.tar.gz.sha256"}, added
    assert {k: v for k, v in after.items() if k not in added} == before


def hostile(change: Callable[[Path, Path], None], code: int, *needles: str) -> Callable[[Path], None]:
    """A case: ``change(run, top)`` makes the run hostile; ``report`` must exit ``code`` naming ``needles``,
    within the time bound, leaving everything outside the run directory as it was and reading nothing of it."""
    def case(place: Path) -> None:
        run = detached_run(place)
        top = place.parents[4]
        change(run, top)
        before = snapshot(top, run)
        for verb in (["status", str(run)], ["report", str(run), "--no-record"]):
            got, out, took = run_cli(verb)
            assert snapshot(top, run) == before, f"{verb[0]} changed what is outside the run directory:\n{out}"
            assert holds_secret(run) == [], f"{verb[0]} copied a file from outside into the run:\n{out}"
            assert took < TIME_BOUND_S, f"{verb[0]} took {took:.1f} s of CPU"
            if verb[0] == "report":
                assert got == code, f"exit {got}, expected {code}:\n{out}"
                for n in needles:
                    assert n in out, f"{n!r} not in:\n{out}"
            else:
                assert got in (0, code), out
    return case


def set_submitted(**fields: object) -> Callable[[Path, Path], None]:
    def change(run: Path, top: Path) -> None:
        doc = json.loads((run / SUBMITTED).read_text())
        (run / SUBMITTED).write_text(json.dumps({**doc, **fields}))
    return change


def job_elsewhere(run: Path, top: Path) -> None:
    """``job/`` a link to a job folder outside the run directory (its ``in/`` and ``run/`` included)."""
    (run / "job").rename(top / "elsewhere")
    (run / "job").symlink_to(top / "elsewhere")


def linked(rel: str, target: str = "outside.txt") -> Callable[[Path, Path], None]:
    def change(run: Path, top: Path) -> None:
        path = run / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.symlink_to(top / target if not target.startswith("/") else target)
    return change


def state_elsewhere(run: Path, top: Path) -> None:
    """``state.json`` a link to the run's state as it was, moved out of the run directory."""
    (run / "state.json").rename(top / "state.json")
    (run / "state.json").symlink_to(top / "state.json")


def telemetry_link(run: Path, top: Path) -> None:
    (top / "outside.txt").write_text("telemetry v1 interval_ms=1000 max_bytes=4194304\n" + SECRET)
    linked("job/steps/1n1g-fp32-bs8/r1a1-telemetry-0-rc-node1.txt")(run, top)


def events(*lines: str) -> Callable[[Path, Path], None]:
    def change(run: Path, top: Path) -> None:
        with (run / "job" / "events").open("a") as f:
            f.writelines(f"2026-11-26T03:02:00Z {ln}\n" for ln in lines)
    return change


def write(rel: str, text: str) -> Callable[[Path, Path], None]:
    def change(run: Path, top: Path) -> None:
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    return change


DEEP = "[" * 100_000 + "]" * 100_000
BIG = "9" * 5000

CASES = {
    # writes, deletes and copies outside the run directory
    "job-id-a-path": (set_submitted(job_id="x/../../../../../escape"), 6, "job/submitted.json", "job_id"),
    "job-id-not-slurms": (set_submitted(job_id="13;rm"), 6, "job_id"),
    "job-a-link": (job_elsewhere, 6, "job", "link"),
    "batch-script-a-link": (linked("job/batch.sbatch"), 6, "batch.sbatch", "link"),
    "telemetry-a-link": (telemetry_link, 6, "r1a1-telemetry-0-rc-node1.txt", "link"),
    # hangs, memory, crashes
    "a-billion-repeats": (set_submitted(repeats={"1n1g-fp32-bs8": 10**9}), 6, "repeats"),
    "200k-planned-repeats": (set_submitted(repeats={f"{n}n1g-fp32-bs8": 1000 for n in range(1, 201)}), 6,
                             "repeats"),
    "container-not-known": (set_submitted(container=["pyxis"]), 6, "container"),
    "a-billion-attempts": (set_submitted(attempts=10**9), 6, "attempts"),
    "repeats-not-a-mapping": (set_submitted(repeats=[1, 2]), 6, "repeats"),
    "repeats-of-no-cell": (set_submitted(repeats={"../../x": 1}), 6, "repeats"),
    "events-a-dev-zero-link": (linked("job/events", "/dev/zero"), 6, "events", "link"),
    "nodes-a-dev-zero-link": (linked("job/nodes", "/dev/zero"), 6, "nodes", "link"),
    "input-a-dev-zero-link": (linked("job/in/2n1g-fp32-bs8.env", "/dev/zero"), 6, "2n1g-fp32-bs8.env", "link"),
    "state-a-link": (state_elsewhere, 6, "state.json", "link"),
    "events-5000-digits": (events(f"exit 1n1g-fp32-bs8 1 {BIG} 0", f"exit 1n1g-fp32-bs8 {BIG} 1 0",
                                  f"start 1n1g-fp32-bs8 1 {BIG}", f"end {BIG} done"), 0, "judged"),
    "events-non-ascii-digits": (events("exit 1n1g-fp32-bs8 1 \u00b2 0", "exit 1n1g-fp32-bs8 \u0663 1 0",
                                       "end \u00b2 done", "start 1n1g-fp32-bs8 1 \u0661"), 0, "judged"),
    "event-time-no-time": (write("job/events", "2026-11-26T03:01:00Z job 13 rc-node[1-2]\n"
                                                      "2026-13-40T03:01:00Z end 0 done\n"), 0, "judged"),
    "submitted-deep-json": (write(SUBMITTED, DEEP), 6, "job/submitted.json"),
    "record-deep-json": (write(RECORD, DEEP), 6, "job/record.json"),
    "in-deep-json": (write("job/in/2n1g-fp32-bs8.json", DEEP), 6, "job/in/2n1g-fp32-bs8.json"),
    "in-json-a-list": (write("job/in/2n1g-fp32-bs8.json", "[1]"), 6, "job/in/2n1g-fp32-bs8.json"),
    "in-env-unclosed-quote": (write("job/in/2n1g-fp32-bs8.env", "export A='x\n"), 6, "job/in/2n1g-fp32-bs8.env"),
    "probe-without-end": (write("job/probe/0-rc-node1.out", "rc-node1\n1764126000\n" + "@@repro:a\n" * 100_000),
                          0, "judged"),
    "probe-5000-digits": (write("job/probe/0-rc-node1.out", f"rc-node1\n1764126000\n@@repro:b\n@@repro-rc:{BIG}\n"
                                "@@repro:c\n@@repro-rc:\u00b2\n"), 0, "judged"),
    "srun-5000-digits": (write("job/steps/1n1g-fp32-bs8/r1a1.srun",
                               f"srun: error: rc-node1: task 0: Exited with exit code {BIG}\n"), 0, "judged"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_detached_run(place: Path, case: str) -> None:
    change, code, *needles = CASES[case]
    if code == 0:  # a line the kit cannot read is not what the job said: the run is judged without it
        _judged_despite(place, change)
    else:
        hostile(change, code, *needles)(place)


def _judged_despite(place: Path, change: Callable[[Path, Path], None]) -> None:
    run = detached_run(place)
    top = place.parents[4]
    change(run, top)
    before = snapshot(top, run)
    for verb in (["status", str(run)], ["report", str(run), "--no-record"]):
        bound = JUDGED_S if verb[0] == "report" else TIME_BOUND_S
        got, out, took = run_cli(verb, bound=bound)
        assert took < bound, f"{verb[0]} took {took:.1f} s of CPU"
        assert verb[0] == "report" or got == 0, out
    assert (run / "provenance.json").is_file(), out
    added = {k for k in snapshot(top, run) if k not in before}
    assert added <= {f"a/b/c/d/logs/{RUN_ID}.tar.gz", f"a/b/c/d/logs/{RUN_ID}.tar.gz.sha256"}


def test_a_launch_env_value_with_a_newline_is_judged_and_sealed(place: Path) -> None:
    """``validate`` accepts a newline in a launch.env value; the detached pyxis run's step reads it from
    ``job/in/KEY.env`` (shell-quoted), and ``report`` reads the same file back to scrub the values: it
    judges and seals the run, and the secret-looking value is scrubbed."""
    value = "first line\nsecond line"
    run = detached_run(place, env={"NOTE": value, "HF_TOKEN": "s3cr3t\nvalue"})
    env_file = next((run / "job" / "in").glob("*.env"))
    assert f"export NOTE={shlex.quote(value)}\n" in env_file.read_text()
    code, out, _ = run_cli(["validate", str(place.parent / f"{TARGET}.yaml")])
    assert code == 0, out
    code, out, _ = run_cli(["report", str(run), "--no-record"], bound=60)
    assert (run / "provenance.json").is_file(), out
    assert "Traceback" not in out
    assert holds_secret(run) == [] and not any(b"s3cr3t\nvalue" in p.read_bytes() for p in run.rglob("*")
                                               if p.is_file())


@pytest.mark.parametrize("verb", [["report", "{run}", "--no-record"], ["up", "--resume", "{run}"],
                                  ["explain", "{run}"], ["diff", "{run}", "{run}"]])
def test_any_run_directory_with_a_link_is_refused_before_it_is_read(place: Path, verb: list[str]) -> None:
    """Not only a detached run: a rank's log that is a link out of the run directory is refused (exit 6)
    by every verb that reads a run, before its figures could enter a table."""
    run = RunDir.create(place, find_target(TARGET), load_hosts(DATA / "hosts-cpu.yaml"), run_id=RUN_ID).path
    log = run / "cells" / "1n1g-fp32-bs8" / "r1" / "0-rc-node1.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(place.parents[4] / "outside.txt")
    before = snapshot(place.parents[4], run)
    code, out, took = run_cli([a.format(run=run) for a in verb])
    assert code == 6 and "0-rc-node1.log is a link" in out, out
    assert snapshot(place.parents[4], run) == before and took < TIME_BOUND_S
