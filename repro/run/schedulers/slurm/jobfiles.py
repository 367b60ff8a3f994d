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

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.errors import ProvenanceError, ReproError, RunFailed
from repro.layout import CELL_KEY
from repro.run.rundir import DONE, FAILED, PENDING, RUNNING, RunDir, read_head, read_json, read_whole
from repro.run.schedulers.slurm.commands import ENDED_BY_SLURM, cli, fields, stamp
from repro.run.schedulers.slurm.detached import EVENTS, JOB_DIR, NODES, SUBMITTED, TOKEN, telemetry_output
from repro.run.schedulers.slurm.enroot import NOT_READY, image_problems, node_facts
from repro.run.schedulers.slurm.steps import task_exits
from repro.tree import remove

RECORD, IMAGE = "job/record.json", "job/image.json"
MAX_EVENTS = 1 << 20  # bytes of job/events read (a run of thousands of repeats writes well under this)
#: bytes of the job's small files read: job/submitted.json, job/nodes, a probe's output, marks, srun's report
MAX_SMALL = 1 << 20
#: bytes of what the submitting side wrote for the job (the record begun, the image's facts, the script)
MAX_RECORD = 64 << 20
_EVENT = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z) (\S+)(?: (.*))?", re.ASCII)
#: Slurm's job id: a job (``123``) or an array task (``123_4``)
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?", re.ASCII)
_EPOCH = re.compile(r"[0-9]{1,11}(?:\.[0-9]{1,9})?", re.ASCII)  # the agent's start mark: seconds
COUNT = re.compile(r"[0-9]{1,6}", re.ASCII)       # a repeat or attempt in the job's lines
CODE = re.compile(r"-?[0-9]{1,6}", re.ASCII)      # an exit status
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}", re.ASCII)
#: the most repeats of a cell and attempts of a repeat a manifest can ask for (its schema's limits)
MAX_REPEATS, MAX_ATTEMPTS, MAX_CELLS = 1000, 101, 4096
MAX_PLANNED = 100_000  # repeats of a run in all (each a line of `repro status`)
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
    sub, planned, attempts = submitted(run)
    view = JobView(sub["job_id"], sub)
    view.repeats = {(k, r): Repeat(k, r) for k, n in planned.items() for r in range(1, n + 1)}
    view.nodes = _nodes(run)
    _events(run, view, attempts)
    view.shared = _shared(run, view) if view.shared else view.shared
    if state_of is not None:
        view.state = state_of(view.job_id)
    _settle(view)
    return view


def submitted(run: Path) -> tuple[dict[str, Any], dict[str, int], int]:
    """``job/submitted.json``, checked as what it is (the run directory comes from anyone): the record, each
    cell's planned repeats and the attempts of a repeat."""
    path = run / SUBMITTED

    def bad(why: str) -> ProvenanceError:
        return ProvenanceError(f"{path}: {why}", hint="give a run directory `repro up --detach` wrote")

    try:
        sub = read_json(path, MAX_SMALL)
    except OSError as e:
        raise bad(f"cannot read it ({e.strerror})") from None
    if not isinstance(sub, dict):
        raise bad("not a detached run's record (an object)")
    job_id, repeats, attempts = sub.get("job_id"), sub.get("repeats"), sub.get("attempts")
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = sub["job_id"] = str(job_id)
    if not (isinstance(job_id, str) and JOB_ID.fullmatch(job_id)):
        raise bad(f"job_id {str(job_id)[:80]!r} is not a Slurm job id (123, or 123_4 for an array task)")
    if not (isinstance(repeats, dict) and 0 < len(repeats) <= MAX_CELLS and all(
            isinstance(k, str) and CELL_KEY.match(k) and type(n) is int and 0 <= n <= MAX_REPEATS
            for k, n in repeats.items()) and sum(repeats.values()) <= MAX_PLANNED):
        raise bad(f"repeats: not each cell's repeats (a cell key like 1n8g-fp32-bs256 to 0..{MAX_REPEATS}, "
                  f"at most {MAX_CELLS} cells and {MAX_PLANNED} repeats in all)")
    if sub.get("container") not in ("docker", "pyxis") or not isinstance(sub.get("image"), str):
        raise bad("container and image: not what `repro up --detach` records (docker or pyxis, an image)")
    if not (type(attempts) is int and 1 <= attempts <= MAX_ATTEMPTS):
        raise bad(f"attempts: {str(attempts)[:80]!r} is not 1..{MAX_ATTEMPTS}")
    return sub, dict(repeats), attempts


def _nodes(run: Path) -> list[tuple[str, str]]:
    path = run / NODES
    if not path.is_file():
        return []
    out = []
    for line in read_head(path, MAX_SMALL).splitlines()[:4096]:
        parts = line.split()
        if len(parts) == 3 and parts[0] == str(len(out)) and NODE.fullmatch(parts[1]) and len(parts[2]) < 256:
            out.append((parts[1], parts[2]))
    return out


def _events(run: Path, view: JobView, attempts: int) -> None:
    path = run / EVENTS
    if not path.is_file():
        return
    for line in read_head(path, MAX_EVENTS).splitlines():
        m = _EVENT.fullmatch(line)
        if not m or not _a_time(m.group(1)):
            continue
        when, word, rest = m.group(1), m.group(2), (m.group(3) or "").split()
        view.last = when
        if word in ("shared", "pulled", "imported"):
            view.times.setdefault(word, when)
        if word == "job":
            view.started = when
        elif word == "shared":
            view.shared = True
        elif word == "end" and rest and CODE.fullmatch(rest[0]):
            view.end = (int(rest[0]), " ".join(rest[1:]), when)
        elif word in ("start", "exit") and len(rest) >= 3 and all(COUNT.fullmatch(w) for w in rest[1:3]):
            rep = view.repeats.get((rest[0], int(rest[1])))
            if rep is None or int(rest[2]) > attempts:
                continue
            rep.attempts = max(rep.attempts, int(rest[2]))
            if word == "start":
                rep.status, rep.started, rep.ended, rep.code, rep.why = RUNNING, when, None, None, None
            elif len(rest) >= 4 and CODE.fullmatch(rest[3]):
                rep.code, rep.ended = int(rest[3]), when
                rep.status = DONE if rep.code == 0 else FAILED if int(rest[2]) >= attempts else PENDING
                rep.why = None if rep.code == 0 else why_failed(rep.code, view, srun_said(run, *rest[:3]))


def _a_time(when: str) -> bool:
    from datetime import datetime

    try:
        datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


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
        token = read_head(run / TOKEN, 256)
    except OSError:
        return False
    for i, (name, _) in enumerate(view.nodes):
        f = run / "job" / "shared" / f"{i}-{name}"
        if not f.is_file() or read_head(f, 256) != token:
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
    for line in read_head(path, MAX_SMALL).splitlines()[:64]:
        word, _, rest = line.removeprefix("##repro ").partition(" ")
        out.setdefault(word, rest)
    return out


def task_codes(run: Path, key: str, repeat: int, attempt: int, nodes: list[str]) -> dict[str, int]:
    """The non-zero exit statuses srun reported for the attempt's tasks, by node."""
    path = run / "job" / "steps" / key / f"r{repeat}a{attempt}.srun"
    lines = read_head(path, MAX_SMALL).splitlines()[:4096] if path.is_file() else []
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
    """The environments the job's inputs held (their secret values are scrubbed from what it wrote): a
    pyxis step's ``KEY.env`` (``export NAME=VALUE``, shell-quoted, a value may hold a newline), the agent's
    ``docker create -e`` flags in ``KEY.json``. An input that is neither: a ProvenanceError naming it."""
    import os

    envs: list[Mapping[str, str]] = [os.environ]
    for f in sorted((run / JOB_DIR / "in").glob("*")):
        if f.suffix not in (".env", ".json"):
            continue
        try:
            envs.append(_env_of(f))
        except (ValueError, TypeError, AttributeError) as e:
            raise ProvenanceError(f"{f}: not an input the job's script reads ({e})",
                                  hint="the run directory was damaged or altered") from None
    return envs


def _env_of(f: Path) -> dict[str, str]:
    if f.suffix == ".env":
        words = shlex.split(read_whole(f, MAX_RECORD))
        return dict(w.split("=", 1) for before, w in zip(words, words[1:]) if before == "export" and "=" in w)
    ranks = read_json(f, MAX_RECORD).get("ranks", [])
    flags = [a for rank in ranks for a in rank.get("create", []) if isinstance(a, str)]
    return dict(a[3:].split("=", 1) for a in flags if a.startswith("-e=") and "=" in a[3:])


def drop_inputs(run: Path) -> None:
    """The job's inputs removed (per-run keys, secret values), once what the job wrote is scrubbed; no link
    is followed."""
    for secret in ("in", "run"):
        remove(run / JOB_DIR / secret)


def probe_output(run: Path, i: int, node: str) -> tuple[str, float] | None:
    """What the probe step wrote for node ``i`` (after its name line), and when it arrived (the node's clock
    against the shared filesystem's); None where it wrote nothing."""
    out = run / JOB_DIR / "probe" / f"{i}-{node}.out"
    if not out.is_file():
        return None
    return read_head(out, MAX_SMALL).partition("\n")[2], out.lstat().st_mtime


def rank_outcomes(run: Path, rep: Repeat,
                  ranks: Sequence[tuple[int, str]]) -> list[tuple[str | None, int | None]]:
    """Each rank's (rank, node) start and exit status in the repeat's last attempt: the agent's marks
    (docker), else srun's report of the step."""
    codes = task_codes(run, rep.cell, rep.repeat, rep.attempts, [node for _, node in ranks])
    out = []
    for rank, node in ranks:
        marks = rank_marks(run, rep.cell, rep.repeat, rep.attempts, rank)
        said = marks.get("started", "")
        started = stamp(float(said)) if _EPOCH.fullmatch(said) else rep.started
        code = marks.get("exited", "")
        out.append((started, int(code) if CODE.fullmatch(code) else
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
             "sbatch_script": read_whole(run / JOB_DIR / "batch.sbatch", MAX_RECORD),
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
