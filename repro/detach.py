"""Submit and walk away: ``repro up --detach``, ``repro status RUN_DIR`` and ``repro report RUN_DIR`` of a
detached run.

``submit`` does what ``repro up`` does before the nodes are needed (the scheduler's checks, the pins, the
image built and pushed, the run directory with the provenance record begun and the image's facts), then asks
the scheduler to submit the whole run as one batch job writing into the run directory, and returns.
``view`` reads the run directory (and the scheduler's word on the job) for ``repro status``. ``adopt``
turns what the job wrote into the run's state and provenance record once the job is over, so that
``repro.up.finish`` judges and seals it as it does an attached run.
"""

from __future__ import annotations

import json
import shutil
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro.errors import RunFailed, UsageError
from repro.events import Event, Progress, ignore
from repro.redact import Redactor
from repro.run.rundir import DONE, FAILED, SUMS, RunDir, make_run_id
from repro.run.schedulers import KEYS, SCHEDULERS, make_scheduler
from repro.run.schedulers.slurm.enroot import NOT_READY, image_problems
from repro.run.schedulers.slurm.jobfiles import (JobView, image_facts, is_detached, rank_marks, read_job,
                                                 task_codes)
from repro.spec.hosts import Hosts, Node, load_hosts
from repro.spec.manifest import find_target, synthetic
from repro.up import UpOptions, UpResult

RECORD, IMAGE = "job/record.json", "job/image.json"

__all__ = ["adopt", "image_failure", "is_detached", "status_text", "submit", "view"]


def submit(target: str | None, opts: UpOptions, progress: Progress = ignore) -> tuple[RunDir, str]:
    """A new run as one batch job: checked, its image pushed, its run directory written, submitted; returns
    the run directory and the job's id."""
    from repro.images import check_pins, lock, prepare
    from repro.run.plan import select_cells

    if opts.resume is not None:
        raise UsageError("--detach starts a new run; --resume finishes one attached",
                         hint="repro up --resume RUN_DIR (without --detach)")
    if not target:
        raise UsageError("give a TARGET")
    manifest = find_target(target)
    manifest = synthetic(manifest) if opts.synthetic else manifest
    hosts = load_hosts(opts.hosts_file)
    cells = select_cells(manifest, opts.cells)
    if not cells:
        raise UsageError(f"no cell of {manifest.id} matches the --cells filter")
    sched = make_scheduler(hosts, manifest, cells, opts.scheduler, progress)
    sched.check_detach()
    if "build" in manifest.image and not opts.images.push:
        raise UsageError(f"{manifest.id} builds its image, and a detached run's nodes pull it by digest "
                         "from a registry: nothing streams it to them while you are away",
                         hint="give --push REGISTRY (a registry the cluster's nodes can pull from)")
    sched.check(max(c.nodes for c in cells))
    progress(Event("step", "checking the pins against the lock file"))
    check_pins(manifest, opts.images, progress=progress)
    progress(Event("step", "the image, before the job is submitted"))
    images = prepare(manifest, Hosts((), hosts.path, hosts.data, hosts.env), opts.images, progress=progress)
    image = (images.pushed or images.pins.images["image"]).pinned
    settings = {k: sched.cfg[k] for k in KEYS if sched.cfg.get(k)}
    recorded = Hosts(hosts.nodes, hosts.path, hosts.data, hosts.env, scheduler=settings)
    run = RunDir.create(opts.out, manifest, recorded, run_id=make_run_id(manifest.id))
    lock.write_lock(lock.lock_path(run.load_manifest()), manifest, images.pins)
    progress(Event("info", f"run directory {run.path}", data={"run_dir": str(run.path)}))
    _begin_record(run, manifest, recorded, images, image, progress)
    job = sched.detach(run.path, image, repeats=opts.repeats, fail_fast=opts.fail_fast)
    progress(Event("done", f"submitted job {job}", data={"job_id": job, "run_dir": str(run.path)}))
    return run, job


def _begin_record(run: RunDir, manifest: Any, hosts: Hosts, images: Any, image: str,
                  progress: Progress) -> None:
    """The provenance record as far as the submitting side knows it, and the image's facts from the engine
    that built or pulled it (the nodes pull the same digest): the job adds the rest."""
    from repro.images.engine import connect
    from repro.nodes import facts as probes
    from repro.record import provenance

    progress(Event("step", "recording the image's environment"))
    record = provenance.new_record(run, manifest, hosts, lock=images.pins.to_json(manifest))
    engine = connect()
    img = engine.images.get(images.reference)
    sources = [manifest.source["path"]] if manifest.source else []
    probe = probes.probe_container(engine, images.reference, sources=sources, run_id=run.run_id)
    facts = {"ref": image, "id": img.id, "repo_digests": img.attrs.get("RepoDigests") or [],
             "digest": image.partition("@")[2] or None, "labels": img.labels, "container": probe}
    run.write_json(RECORD, record)
    run.write_json(IMAGE, facts)


# -------------------------------------------------------------------------------- status
def view(run_path: Path) -> tuple[RunDir, JobView]:
    run = RunDir.open(run_path)
    if not is_detached(run.path):
        raise UsageError(f"{run.path} is not a detached run (no job/submitted.json)",
                         hint="repro status reads runs `repro up --detach` submitted; `repro report RUN_DIR` "
                              "judges any run")
    kind = (load_hosts(run.file("hosts.yaml")).scheduler or {}).get("kind", "slurm")
    return run, read_job(run.path, SCHEDULERS.get(kind).job_state)


def status_text(run: RunDir, jv: JobView) -> str:
    """What ``repro status`` prints: the job, the nodes, and every cell's repeats."""
    counts = {s: 0 for s in ("done", "running", "failed", "pending")}
    for rep in jv.repeats.values():
        counts[rep.status] += 1
    state = jv.state or "unknown to squeue/sacct here"
    lines = [f"run {run.path}", f"job {jv.job_id} (submitted {jv.submitted.get('submitted')} from "
             f"{jv.submitted.get('host')}): {state}"]
    if jv.nodes:
        lines.append("nodes: " + ", ".join(f"{n} ({a})" for n, a in jv.nodes))
    if jv.shared is not None:
        lines.append("run directory shared with every node: " + ("yes (each node read the token back, and "
                     "this side sees what they wrote)" if jv.shared else "NO"))
    rows = [["cell", "repeat", "status", "attempts", "started", "ended", "why"]]
    for (key, r), rep in sorted(jv.repeats.items()):
        rows.append([key, str(r), rep.status, str(rep.attempts), rep.started or "-", rep.ended or "-",
                     rep.why or ""])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["", *("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows), ""]
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(jv.repeats)} repeat(s)")
    if jv.end is not None:
        lines.append(f"the job's script ended: exit {jv.end[0]} ({jv.end[1]}) at {jv.end[2]}")
    if jv.over and run.file(SUMS).exists():
        lines.append(f"judged and sealed: repro report {run.path} shows its table, repro audit {run.path} "
                     "checks it")
    elif jv.over:
        lines.append(f"judge it and seal its provenance: repro report {run.path}")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- adopt
def adopt(run_path: Path) -> UpResult:
    """A detached run whose job is over, as ``repro up`` leaves a run: state.json from the job's events,
    the provenance record completed (the nodes, their host and image facts, every rank's command, the
    job), each repeat's telemetry files and summary written, the job's inputs removed (per-run keys, secret
    values). ``repro.up.finish`` then judges and seals it."""
    run, jv = view(run_path)
    if not jv.over:
        raise UsageError(f"{run.path}: job {jv.job_id} is {jv.state or 'not over'}; nothing to judge yet",
                         hint=f"repro status {run.path} shows its progress")
    if not jv.nodes:
        raise UsageError(f"{run.path}: job {jv.job_id} ended ({jv.state}) before it named its nodes "
                         f"(job/nodes): nothing ran", hint=f"see {run.file('job')}/batch-*.out")
    run.redactor = Redactor.from_envs(*job_envs(run))
    image = _image(run, jv)
    _write_state(run, jv)
    for secret in ("in", "run"):
        shutil.rmtree(run.path / "job" / secret, ignore_errors=True)
    manifest = run.load_manifest()
    record = json.loads(run.file(RECORD).read_text(encoding="utf-8"))
    inventory = load_hosts(run.file("hosts.yaml"))
    hosts = Hosts(tuple(Node(n, a) for n, a in jv.nodes), inventory.path, inventory.data, inventory.env,
                  scheduler=inventory.scheduler)
    record["hosts"]["nodes"] = [{"name": n, "address": a} for n, a in jv.nodes]
    _add_nodes(run, record, hosts)
    result = UpResult(run, manifest, record, cells=[c for c in manifest.cells()
                                                     if any(k == c.key for k, _ in jv.repeats)])
    _add_commands(run, jv, result, hosts)
    _add_telemetry(run, jv)
    result.seconds = seconds_of(jv.started, jv.last)
    result.cell_seconds = sum(seconds_of(r.started, r.ended) for r in jv.repeats.values())
    facts = _job_facts(run, jv, inventory.scheduler or {})
    record["scheduler"] = [{**facts, "image": image} if image else facts]
    run.write_text(f"slurm-{jv.job_id}.sbatch", run.file("job/batch.sbatch").read_text(encoding="utf-8"))
    return result


def _image(run: RunDir, jv: JobView) -> dict[str, Any] | None:
    """Under pyxis, what each node's image step said (``image_facts``), with the seconds from the shared
    check until every node was ready; where a node's image was not ready or not of the locked digest, the
    repeats the job never started are pending, stopped by that (``image_failure`` fails the report)."""
    if jv.submitted.get("container") != "pyxis":
        return None
    facts, problems = image_facts(run.path, jv)
    if "imported" in jv.times and "shared" in jv.times:
        facts["ready_s"] = seconds_of(jv.times["shared"], jv.times["imported"])
    for rep in jv.repeats.values():
        if problems and not rep.attempts:
            rep.why = f"stopped: {NOT_READY}: {problems[0]}"
    return facts


def image_failure(result: UpResult) -> RunFailed | None:
    """The error an attached run stops with where a node's image held another digest than the run locks,
    or was not ready where the job's script ended the job for that (its image step's facts and the script's
    exit in the provenance record); None otherwise."""
    alloc = next((a for a in result.record.get("scheduler") or [] if a.get("image")), None)
    if alloc is None:
        return None
    image, ended = alloc["image"], alloc.get("script_exit") or [None]
    bad = image_problems(image.get("nodes") or [], str(image.get("file")), str(image.get("image"))
                         .rpartition("@")[2], unready=ended[0] == 4)
    if not bad:
        return None
    return RunFailed(f"{NOT_READY}:\n  " + "\n  ".join(bad),
                     hint=f"each node's enroot output is in {result.run.file('job/image')}; a kept image "
                          f"that differs from the lock: remove {image.get('file')} on the nodes, or set "
                          "keep_image: no")


def job_envs(run: RunDir) -> list[Mapping[str, str]]:
    """The environments the job's inputs held (their secret values are scrubbed from what it wrote)."""
    import os

    envs: list[Mapping[str, str]] = [os.environ]
    for f in sorted((run.path / "job" / "in").glob("*")):
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix == ".env":  # export NAME=VALUE a line
            words = [shlex.split(ln)[-1] for ln in text.splitlines() if ln.startswith("export ")]
            envs.append(dict(w.split("=", 1) for w in words if "=" in w))
        elif f.suffix == ".json":
            flags = [a for rank in json.loads(text).get("ranks", []) for a in rank.get("create", [])]
            envs.append(dict(a[3:].split("=", 1) for a in flags if a.startswith("-e=") and "=" in a[3:]))
    return envs


def _write_state(run: RunDir, jv: JobView) -> None:
    state = run.read_state()
    for (key, r), rep in jv.repeats.items():
        entry = state["cells"].get(key, {}).get("repeats", {}).get(str(r))
        if entry is not None:
            entry.update(status=rep.status, why=rep.why, attempts=rep.attempts, started=rep.started,
                         ended=rep.ended)
    run.write_state(state)


def _add_nodes(run: RunDir, record: dict[str, Any], hosts: Hosts) -> None:
    """Every node's host facts from the probe step's output, and the image's facts (the digest it pulled)."""
    from repro.nodes import facts as probes
    from repro.nodes.preflight import node_report
    from repro.nodes.facts import Probe
    from repro.record import provenance

    image = json.loads(run.file(IMAGE).read_text(encoding="utf-8"))
    for i, node in enumerate(hosts.nodes):
        out = run.path / "job" / "probe" / f"{i}-{node.name}.out"
        if out.is_file():
            text = out.read_text(encoding="utf-8", errors="replace")
            arrival = out.stat().st_mtime  # the node's clock against the shared filesystem's
            host = node_report(node, text.partition("\n")[2], Probe(detail="srun"), arrival, "exit 0").host
        else:
            host = None
        host = host or probes.not_run("the probe step of the job wrote nothing for this node")
        provenance.add_node(record, node, host=host, image=image, container=image["container"])


def _add_commands(run: RunDir, jv: JobView, result: UpResult, hosts: Hosts) -> None:
    """Each rank of each repeat's last attempt: the command as the job ran it (rendered for the nodes it
    got), its times and exit status (the agent's marks, or srun's report of the step)."""
    from repro.record import provenance
    from repro.run.plan import plan_cell
    from repro.run.schedulers.slurm.commands import stamp

    manifest = result.manifest
    for cell in result.cells:
        plans = plan_cell(manifest, cell, hosts)
        env = manifest.launch.env_for(cell, hosts.env)
        for (key, r), rep in sorted(jv.repeats.items()):
            if key != cell.key or not rep.attempts:
                continue
            if rep.status == DONE:
                result.done += 1
            elif rep.status == FAILED:
                result.failed.append(f"{key} r{r}")
            codes = task_codes(run.path, key, r, rep.attempts, [p.command.node.name for p in plans])
            for p in plans:
                c = p.command
                marks = rank_marks(run.path, key, r, rep.attempts, c.rank)
                started = stamp(float(marks["started"])) if "started" in marks else rep.started
                code = marks.get("exited", "")
                exit_code = int(code) if code.lstrip("-").isdigit() else \
                    codes.get(c.node.name, 0 if rep.code == 0 else None)
                log = run.log_path(key, r, c.rank, c.node.name).relative_to(run.path)
                provenance.add_command(result.record, run, cell, r, rank=c.rank, node=c.node.name,
                                       role=c.role, argv=c.command, env=env,
                                       image=jv.submitted.get("image", ""),
                                       started=started or "", ended=rep.ended, exit_code=exit_code,
                                       workdir=manifest.launch.workdir, log=log)


def _add_telemetry(run: RunDir, jv: JobView) -> None:
    """Each repeat's telemetry, from its last attempt's sampler step (``job/steps/KEY/rNaA-telemetry-I-NODE
    .txt``), through ``TelemetryFiles`` as the attached path's lines: each node's ``telemetry-NODE.txt``
    in the repeat's directory, bounded, and ``telemetry.json``."""
    from repro.nodes.telemetry import MAX_BYTES
    from repro.run.rundir import read_head
    from repro.run.sampling import SLACK, TelemetryFiles
    from repro.run.schedulers.slurm.detached import telemetry_output

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


def _job_facts(run: RunDir, jv: JobView, settings: Mapping[str, str]) -> dict[str, Any]:
    steps = [{"cell": k, "repeat": r, "attempts": rep.attempts, "exit_code": rep.code, "started": rep.started,
              "ended": rep.ended} for (k, r), rep in sorted(jv.repeats.items()) if rep.attempts]
    return {"kind": "slurm", "job_id": jv.job_id, "allocation": "detached",
            "partition": settings.get("partition"),
            **{k: settings.get(k) for k in ("account", "qos", "reservation", "time", "constraint",
                                            "exclude")},
            "container": jv.submitted.get("container"), "nodes": [n for n, _ in jv.nodes],
            "sbatch_script": run.file("job/batch.sbatch").read_text(encoding="utf-8"),
            "submitted": jv.submitted.get("submitted"), "state": jv.state,
            "script_exit": list(jv.end[:2]) if jv.end else None, "steps": steps}


def seconds_of(start: str | None, end: str | None) -> float:
    """Seconds between two of the job's event times (0 where one is missing)."""
    from datetime import datetime

    if not (start and end):
        return 0.0
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()

