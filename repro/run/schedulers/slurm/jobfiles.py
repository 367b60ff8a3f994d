"""What a detached run's batch script wrote into the run directory, read back (``repro status``,
``repro report``): nothing but the run directory is needed, and Slurm only for the job's state.

``job/submitted.json`` (written by ``repro up --detach``): the job id, when and from where it was submitted,
the repeats and attempts the script runs. ``job/events`` (the batch host's lines, in order): ``job ID
NODELIST``, ``shared N``, ``pulled`` or ``imported N``, ``start KEY R A``, ``exit KEY R A CODE``, ``end CODE
TEXT``.
``job/nodes``: ``RANK NAME ADDRESS`` a line. ``job/shared/RANK-NAME``: the token each node read.
``job/image/RANK-NAME.log`` (pyxis): each node's image step, its ``##repro`` lines as the attached path
reads them (``image_facts``).

Once the job is over, what the kit's ``adopt`` (``repro.up.detached``) takes from the job's files to leave
the run as an attached run leaves it: the environments of the job's inputs (``job_envs``, their secret values
scrubbed), each node's probe output (``probe_output``), each rank's start and exit (``rank_outcomes``), the
telemetry the sampler steps wrote (``copy_telemetry``), the image as each node's image step left it
(``pyxis_image``, ``image_failure``) and the job's facts (``job_facts``). ``job/record.json`` and
``job/image.json`` (``RECORD``, ``IMAGE``): the provenance record as the submitting side began it, and the
image's facts.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.errors import ProvenanceError, ReproError, RunFailed
from repro.run.rundir import DONE, FAILED, PENDING, RUNNING, RunDir, read_head
from repro.run.schedulers.slurm.commands import ENDED_BY_SLURM, cli, fields, stamp
from repro.run.schedulers.slurm.detached import EVENTS, JOB_DIR, NODES, SUBMITTED, TOKEN, telemetry_output
from repro.run.schedulers.slurm.enroot import NOT_READY, image_problems, node_facts
from repro.run.schedulers.slurm.steps import task_exits

RECORD, IMAGE = "job/record.json", "job/image.json"
MAX_EVENTS = 1 << 20  # bytes of job/events read (a run of thousands of repeats writes well under this)
_EVENT = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) (\S+)(?: (.*))?$")
#: timeout(1)'s status when the repeat's time ran out, and when its kill after the grace time was needed
TIMED_OUT = (124, 137)


@dataclass
class Repeat:
    cell: str
    repeat: int
    status: str = PENDING
    attempts: int = 0
    why: str | None = None
    started: str | None = None
    ended: str | None = None
    code: int | None = None


@dataclass
class JobView:
    """A detached run as its files say."""

    job_id: str
    submitted: dict[str, Any]
    nodes: list[tuple[str, str]] = field(default_factory=list)
    started: str | None = None
    shared: bool | None = None        # every node saw the run directory (None: not checked yet)
    end: tuple[int, str, str] | None = None  # exit status, text, time
    repeats: dict[tuple[str, int], Repeat] = field(default_factory=dict)
    last: str | None = None           # the time of the latest event
    state: str | None = None          # Slurm's word on the job, where squeue/sacct can tell
    times: dict[str, str] = field(default_factory=dict)  # when the job said shared, pulled, imported

    @property
    def over(self) -> bool:
        """The job ended: its script said so, or Slurm no longer runs it."""
        return self.end is not None or (self.state is not None and self.state not in ("PENDING", "RUNNING",
                                                                                         "CONFIGURING",
                                                                                         "COMPLETING"))


def is_detached(run: Path) -> bool:
    return (Path(run) / SUBMITTED).is_file()


def read_job(run: Path, state_of: Callable[[str], str | None] | None = None) -> JobView:
    """The job's progress from the run directory, and the job's state from ``state_of`` (e.g.
    ``slurm_state``) where it can tell."""
    run = Path(run)
    try:
        sub = json.loads((run / SUBMITTED).read_text(encoding="utf-8"))
        view = JobView(str(sub["job_id"]), sub)
        planned = {k: int(n) for k, n in sub["repeats"].items()}
        attempts = int(sub["attempts"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProvenanceError(f"{run / SUBMITTED}: not a detached run's record ({e})",
                              hint="give a run directory `repro up --detach` wrote") from None
    view.repeats = {(k, r): Repeat(k, r) for k, n in planned.items() for r in range(1, n + 1)}
    view.nodes = _nodes(run)
    _events(run, view, attempts)
    view.shared = _shared(run, view) if view.shared else view.shared
    if state_of is not None:
        view.state = state_of(view.job_id)
    _settle(view)
    return view


def _nodes(run: Path) -> list[tuple[str, str]]:
    path = run / NODES
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:4096]:
        parts = line.split()
        if len(parts) == 3 and parts[0] == str(len(out)):
            out.append((parts[1], parts[2]))
    return out


def _events(run: Path, view: JobView, attempts: int) -> None:
    path = run / EVENTS
    if not path.is_file():
        return
    for line in read_head(path, MAX_EVENTS).splitlines():
        m = _EVENT.match(line)
        if not m:
            continue
        when, word, rest = m.group(1), m.group(2), (m.group(3) or "").split()
        view.last = when
        if word in ("shared", "pulled", "imported"):
            view.times.setdefault(word, when)
        if word == "job":
            view.started = when
        elif word == "shared":
            view.shared = True
        elif word == "end" and rest and rest[0].lstrip("-").isdigit():
            view.end = (int(rest[0]), " ".join(rest[1:]), when)
        elif word in ("start", "exit") and len(rest) >= 3 and rest[1].isdigit() and rest[2].isdigit():
            rep = view.repeats.get((rest[0], int(rest[1])))
            if rep is None:
                continue
            rep.attempts = max(rep.attempts, int(rest[2]))
            if word == "start":
                rep.status, rep.started, rep.ended, rep.code, rep.why = RUNNING, when, None, None, None
            elif len(rest) >= 4 and rest[3].lstrip("-").isdigit():
                rep.code, rep.ended = int(rest[3]), when
                rep.status = DONE if rep.code == 0 else FAILED if int(rest[2]) >= attempts else PENDING
                rep.why = None if rep.code == 0 else why_failed(rep.code, view, srun_said(run, *rest[:3]))


def why_failed(code: int, view: JobView, said: str | None = None) -> str:
    limit = view.submitted.get("timeout_s")
    if code in TIMED_OUT:
        return f"timed out after {limit} s" if limit else f"timed out (exit {code})"
    return f"the job step exited {code}" + (f": {said}" if said else "")


def srun_said(run: Path, key: str, repeat: str, attempt: str) -> str | None:
    """The first error srun, slurmstepd or pyxis reported of an attempt other than a task's exit status or
    the step's cancellation (e.g. an execve or an import failing), as one short line: from srun's own
    report, else from the ranks' output (``*.log``, or ``*.attemptA`` once a later attempt set them aside)."""
    logs = run / "cells" / key / f"r{repeat}"
    later = sorted(logs.glob(f"*.attempt{attempt}")) if logs.is_dir() else []
    paths = [run / "job" / "steps" / key / f"r{repeat}a{attempt}.srun",
             *(later or (sorted(logs.glob("*.log")) if logs.is_dir() else []))]
    for path in paths:
        if not path.is_file():
            continue
        errors = [ln for ln in read_head(path, 1 << 20).splitlines()
                  if "error:" in ln and "Exited with exit code" not in ln and "CANCELLED AT" not in ln
                  and ("slurmstepd" in ln or ln.startswith(("srun:", "pyxis:")))]
        if errors:
            return " ".join(errors[0].split())[:200]
    return None


def _shared(run: Path, view: JobView) -> bool:
    """Here (the submitting side) the run directory holds every node's token: what the nodes wrote is seen
    here."""
    try:
        token = (run / TOKEN).read_text(encoding="utf-8")
    except OSError:
        return False
    for i, (name, _) in enumerate(view.nodes):
        f = run / "job" / "shared" / f"{i}-{name}"
        if not f.is_file() or f.read_text(encoding="utf-8", errors="replace") != token:
            return False
    return True


def _settle(view: JobView) -> None:
    """Once the job is over, a repeat it left running or retrying did not finish: pending, with why."""
    if not view.over:
        return
    why = (f"stopped: Slurm ended job {view.job_id} ({view.state})" if view.state in ENDED_BY_SLURM
           else f"stopped: job {view.job_id} ended ({view.end[1] if view.end else view.state})")
    for rep in view.repeats.values():
        if rep.status == RUNNING or (rep.status == PENDING and rep.attempts):
            rep.status, rep.why = PENDING, why


def slurm_state(job_id: str) -> str | None:
    """The job's state as squeue (while Slurm holds it), scontrol (until MinJobAge passed) or sacct (where
    accounting keeps it) says; None where none can."""
    for argv in (["squeue", "-h", "-j", job_id, "-o", "%T"],
                 ["scontrol", "show", "job", "-o", "--", job_id],
                 ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]):
        try:
            out = cli(argv, timeout=15)
        except ReproError:  # no Slurm client here, or it does not answer: the files alone speak
            continue
        words = out.stdout.split()
        if argv[0] == "scontrol":
            words = [fields(out.stdout).get("JobState", "")]
        if out.returncode == 0 and words and words[0]:
            return words[0].split("+")[0]
    return None


def rank_marks(run: Path, key: str, repeat: int, attempt: int, rank: int) -> dict[str, str]:
    """What the agent marked for one rank of one attempt (docker): started, exited, error."""
    path = run / "job" / "steps" / key / f"r{repeat}a{attempt}-{rank}.marks"
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:64]:
        word, _, rest = line.removeprefix("##repro ").partition(" ")
        out.setdefault(word, rest)
    return out


def task_codes(run: Path, key: str, repeat: int, attempt: int, nodes: list[str]) -> dict[str, int]:
    """The non-zero exit statuses srun reported for the attempt's tasks, by node."""
    path = run / "job" / "steps" / key / f"r{repeat}a{attempt}.srun"
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[:4096] if path.is_file() else []
    return task_exits(lines, nodes)


MAX_IMAGE_LOG = 1 << 22  # bytes of a node's image step log read (enroot's own output is a few kB)


def image_facts(run: Path, view: JobView) -> tuple[dict[str, Any], list[str]]:
    """Under pyxis, the run's image as the job's image step left it on every node (what the attached path
    records: the reference, the node-local file, kept or not, each node's action, digest, enroot, PATH),
    and each node whose image was not of the digest the run locks, or not ready where the job's script
    ended the job for the image (exit 4; not where Slurm or the shared-directory check ended it first)."""
    sub = view.submitted
    image, path = str(sub.get("image", "")), str(sub.get("image_file", ""))
    nodes = []
    for i, (name, _) in enumerate(view.nodes):
        log = run / "job" / "image" / f"{i}-{name}.log"
        nodes.append(node_facts(name, read_head(log, MAX_IMAGE_LOG) if log.is_file() else ""))
    facts = {"image": image, "file": path, "kept": bool(sub.get("keep_image")), "nodes": nodes}
    ended_for_image = view.end is not None and view.end[0] == 4
    return facts, image_problems(nodes, path, image.rpartition("@")[2], unready=ended_for_image)


# -------------------------------------------------------------------------------- once the job is over
def job_envs(run: Path) -> list[Mapping[str, str]]:
    """The environments the job's inputs held (their secret values are scrubbed from what it wrote)."""
    import os

    envs: list[Mapping[str, str]] = [os.environ]
    for f in sorted((run / JOB_DIR / "in").glob("*")):
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix == ".env":  # export NAME=VALUE a line
            words = [shlex.split(ln)[-1] for ln in text.splitlines() if ln.startswith("export ")]
            envs.append(dict(w.split("=", 1) for w in words if "=" in w))
        elif f.suffix == ".json":
            flags = [a for rank in json.loads(text).get("ranks", []) for a in rank.get("create", [])]
            envs.append(dict(a[3:].split("=", 1) for a in flags if a.startswith("-e=") and "=" in a[3:]))
    return envs


def drop_inputs(run: Path) -> None:
    """The job's inputs removed (per-run keys, secret values), once what the job wrote is scrubbed."""
    for secret in ("in", "run"):
        shutil.rmtree(run / JOB_DIR / secret, ignore_errors=True)


def probe_output(run: Path, i: int, node: str) -> tuple[str, float] | None:
    """What the probe step wrote for node ``i`` (after its name line), and when it arrived (the node's clock
    against the shared filesystem's); None where it wrote nothing."""
    out = run / JOB_DIR / "probe" / f"{i}-{node}.out"
    if not out.is_file():
        return None
    return out.read_text(encoding="utf-8", errors="replace").partition("\n")[2], out.stat().st_mtime


def rank_outcomes(run: Path, rep: Repeat,
                  ranks: Sequence[tuple[int, str]]) -> list[tuple[str | None, int | None]]:
    """Each rank's (rank, node) start and exit status in the repeat's last attempt: the agent's marks
    (docker), else srun's report of the step."""
    codes = task_codes(run, rep.cell, rep.repeat, rep.attempts, [node for _, node in ranks])
    out = []
    for rank, node in ranks:
        marks = rank_marks(run, rep.cell, rep.repeat, rep.attempts, rank)
        started = stamp(float(marks["started"])) if "started" in marks else rep.started
        code = marks.get("exited", "")
        out.append((started, int(code) if code.lstrip("-").isdigit() else
                    codes.get(node, 0 if rep.code == 0 else None)))
    return out


def copy_telemetry(run: RunDir, jv: JobView) -> None:
    """Each repeat's telemetry, from its last attempt's sampler step (``job/steps/KEY/rNaA-telemetry-I-NODE
    .txt``), through ``TelemetryFiles`` as the attached path's lines: each node's ``telemetry-NODE.txt``
    in the repeat's directory, bounded, and ``telemetry.json``."""
    from repro.nodes.telemetry import MAX_BYTES
    from repro.run.sampling import SLACK, TelemetryFiles

    names = {n for n, _ in jv.nodes}
    for (key, r), rep in sorted(jv.repeats.items()):
        if not rep.attempts:
            continue
        pattern = telemetry_output(key, r, rep.attempts).replace("%n-%N", "*")
        files = TelemetryFiles(run.log_dir(key, r))
        for path in sorted(run.path.glob(pattern)):
            node = path.name.removeprefix(f"r{r}a{rep.attempts}-telemetry-").removesuffix(".txt")
            node = node.partition("-")[2]
            if node not in names:  # a file the job's nodes did not write
                continue
            for line in read_head(path, MAX_BYTES + SLACK).splitlines():  # what its file in the repeat holds
                files.write(node, line)
        files.close()


def pyxis_image(run: Path, jv: JobView) -> dict[str, Any] | None:
    """Under pyxis, what each node's image step said (``image_facts``), with the seconds from the shared
    check until every node was ready; where a node's image was not ready or not of the locked digest, the
    repeats the job never started are pending, stopped by that (``image_failure`` fails the report)."""
    if jv.submitted.get("container") != "pyxis":
        return None
    facts, problems = image_facts(run, jv)
    if "imported" in jv.times and "shared" in jv.times:
        facts["ready_s"] = seconds_of(jv.times["shared"], jv.times["imported"])
    for rep in jv.repeats.values():
        if problems and not rep.attempts:
            rep.why = f"stopped: {NOT_READY}: {problems[0]}"
    return facts


def image_failure(record: Mapping[str, Any], run: Path) -> RunFailed | None:
    """The error a run stops with where a node's image held another digest than the run locks, or was not
    ready where the job's script ended the job for that (its image step's facts and the script's exit in the
    provenance ``record``); None otherwise."""
    alloc = next((a for a in record.get("scheduler") or [] if a.get("image")), None)
    if alloc is None:
        return None
    image, ended = alloc["image"], alloc.get("script_exit") or [None]
    bad = image_problems(image.get("nodes") or [], str(image.get("file")), str(image.get("image"))
                         .rpartition("@")[2], unready=ended[0] == 4)
    if not bad:
        return None
    return RunFailed(f"{NOT_READY}:\n  " + "\n  ".join(bad),
                     hint=f"each node's enroot output is in {run / JOB_DIR / 'image'}; a kept image "
                          f"that differs from the lock: remove {image.get('file')} on the nodes, or set "
                          "keep_image: no")


def job_facts(run: Path, jv: JobView, settings: Mapping[str, str],
              image: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the provenance records of the job, as of an attached run's allocation (``image``: the pyxis
    image's facts)."""
    steps = [{"cell": k, "repeat": r, "attempts": rep.attempts, "exit_code": rep.code, "started": rep.started,
              "ended": rep.ended} for (k, r), rep in sorted(jv.repeats.items()) if rep.attempts]
    facts = {"kind": "slurm", "job_id": jv.job_id, "allocation": "detached",
             "partition": settings.get("partition"),
             **{k: settings.get(k) for k in ("account", "qos", "reservation", "time", "constraint",
                                             "exclude")},
             "container": jv.submitted.get("container"), "nodes": [n for n, _ in jv.nodes],
             "sbatch_script": (run / JOB_DIR / "batch.sbatch").read_text(encoding="utf-8"),
             "submitted": jv.submitted.get("submitted"), "state": jv.state,
             "script_exit": list(jv.end[:2]) if jv.end else None, "steps": steps}
    return {**facts, "image": image} if image else facts


def seconds_of(start: str | None, end: str | None) -> float:
    """Seconds between two of the job's event times (0 where one is missing)."""
    from datetime import datetime

    if not (start and end):
        return 0.0
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
