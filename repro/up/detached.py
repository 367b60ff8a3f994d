"""Submit and walk away: ``repro up --detach``, ``repro status RUN_DIR`` and ``repro report RUN_DIR`` of a
detached run.

``submit`` does what ``repro up`` does before the nodes are needed (the scheduler's checks, the pins, the
image built and pushed, the run directory with the provenance record begun and the image's facts), then asks
the scheduler to submit the whole run as one batch job writing into the run directory, and returns.
``view`` reads the run directory (and the scheduler's word on the job) for ``repro status``. ``adopt``
turns what the job wrote into the run's state and provenance record once the job is over, so that
``repro.up.finishing.finish`` judges and seals it as it does an attached run. What the job's files hold, and
where, the Slurm package knows (``repro.run.schedulers.slurm.jobfiles``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from repro.errors import ProvenanceError, RunFailed, UsageError
from repro.events import Event, Progress, ignore
from repro.images import ImagesResult
from repro.redact import Redactor
from repro.run.rundir import DONE, FAILED, SUMS, RunDir, make_run_id, read_json
from repro.run.schedulers import KEYS, SCHEDULERS
from repro.run.schedulers import slurm
from repro.run.schedulers.slurm import IMAGE, RECORD, JobView, is_detached, seconds_of
from repro.spec.hosts import Hosts, Node, load_hosts
from repro.up.finishing import keep_scheduler_facts
from repro.up.start import (Start, UpOptions, UpResult, before_nodes, image_record, new_run,
                            probe_image, start, target_manifest)

#: bytes of job/record.json or job/image.json read (the record as begun, the image's facts: well under this)
MAX_JOB_RECORD = 64 << 20

__all__ = ["adopt", "image_failure", "is_detached", "status_text", "submit", "view"]


def submit(target: str | None, opts: UpOptions, progress: Progress = ignore) -> tuple[RunDir, str]:
    """A new run as one batch job: checked, its image pushed, its run directory written, submitted; returns
    the run directory and the job's id."""
    if opts.resume is not None:
        raise UsageError("--detach starts a new run; --resume finishes one attached",
                         hint="repro up --resume RUN_DIR (without --detach)")
    if not target:
        raise UsageError("give a TARGET")
    s = start(target_manifest(target, opts), load_hosts(opts.hosts_file), opts, progress)
    images = before_nodes(s, detached=True)
    image = (images.pushed or images.pins.images["image"]).pinned
    settings = {k: s.sched.cfg[k] for k in KEYS if s.sched.cfg.get(k)}
    hosts = s.hosts
    recorded = dataclasses.replace(hosts, scheduler=settings, gpus=None)
    run = new_run(s, recorded, make_run_id(s.manifest.id), images.pins)
    _begin_record(s, run, recorded, images, image)
    job = s.sched.detach(run.path, image, repeats=opts.repeats, fail_fast=opts.fail_fast)
    progress(Event("done", f"submitted job {job}", data={"job_id": job, "run_dir": str(run.path)}))
    return run, job


def _begin_record(s: Start, run: RunDir, hosts: Hosts, images: ImagesResult, image: str) -> None:
    """The provenance record as far as the submitting side knows it, and the image's facts from the engine
    that built or pulled it (the nodes pull the same digest): the job adds the rest."""
    from repro.images.engine import connect
    from repro.record import provenance

    s.progress(Event("step", "recording the image's environment"))
    record = provenance.new_record(run, s.manifest, hosts, lock=images.pins.to_json(s.manifest))
    engine = connect()
    img = engine.images.get(images.reference)
    probe = probe_image(engine, s.manifest, images.reference, run.run_id)
    run.write_json(RECORD, record)
    run.write_json(IMAGE, {**image_record(img, image, image.partition("@")[2] or None), "container": probe})


# -------------------------------------------------------------------------------- status
def view(run_path: Path) -> tuple[RunDir, JobView]:
    run = RunDir.open(run_path)
    if not is_detached(run.path):
        raise UsageError(f"{run.path} is not a detached run (no job/submitted.json)",
                         hint="repro status reads runs `repro up --detach` submitted; `repro report RUN_DIR` "
                              "judges any run")
    kind = (load_hosts(run.file("hosts.yaml")).scheduler or {}).get("kind", "slurm")
    return run, slurm.read_job(run.path, SCHEDULERS.get(kind).job_state)


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
    values). ``repro.up.finishing.finish`` then judges and seals it."""
    run, jv = view(run_path)
    if not jv.over:
        raise UsageError(f"{run.path}: job {jv.job_id} is {jv.state or 'not over'}; nothing to judge yet",
                         hint=f"repro status {run.path} shows its progress")
    if not jv.nodes:
        raise UsageError(f"{run.path}: job {jv.job_id} ended ({jv.state}) before it named its nodes "
                         f"(job/nodes): nothing ran", hint=f"see {run.file('job')}/batch-*.out")
    run.redactor = Redactor.from_envs(*slurm.job_envs(run.path))
    image = slurm.pyxis_image(run.path, jv)
    _write_state(run, jv)
    slurm.drop_inputs(run.path)
    manifest = run.load_manifest()
    record = _job_json(run, RECORD, "hosts")
    inventory = load_hosts(run.file("hosts.yaml"))
    hosts = dataclasses.replace(inventory, nodes=tuple(Node(n, a) for n, a in jv.nodes), gpus=None)
    record["hosts"]["nodes"] = [{"name": n, "address": a} for n, a in jv.nodes]
    _add_nodes(run, record, hosts)
    result = UpResult(run, manifest, record, cells=[c for c in manifest.cells()
                                                     if any(k == c.key for k, _ in jv.repeats)])
    _add_commands(result, jv, hosts)
    slurm.copy_telemetry(run, jv)
    result.seconds = seconds_of(jv.started, jv.last)
    result.cell_seconds = sum(seconds_of(r.started, r.ended) for r in jv.repeats.values())
    keep_scheduler_facts(result, slurm.job_facts(run.path, jv, inventory.scheduler or {}, image))
    return result


def image_failure(result: UpResult) -> RunFailed | None:
    """The error the run stops with where a node's image held another digest than the run locks, or was
    not ready where the job's script ended the job for that; None otherwise."""
    return slurm.image_failure(result.record, result.run.path)


def _job_json(run: RunDir, name: str, key: str) -> dict:
    """What the submitting side wrote for the job (``job/record.json``, ``job/image.json``): an object with
    ``key``, or a ProvenanceError naming the file."""
    doc = read_json(run.file(name), MAX_JOB_RECORD)
    if not isinstance(doc, dict) or not isinstance(doc.get(key), dict if key == "hosts" else object):
        raise ProvenanceError(f"{run.file(name)}: not what `repro up --detach` writes (an object with "
                              f"{key!r})", hint="the run directory was damaged or altered")
    return doc


def _write_state(run: RunDir, jv: JobView) -> None:
    state = run.read_state()
    for (key, r), rep in jv.repeats.items():
        entry = state["cells"].get(key, {}).get("repeats", {}).get(str(r))
        if entry is not None:
            entry.update(status=rep.status, why=rep.why, attempts=rep.attempts, started=rep.started,
                         ended=rep.ended)
    run.write_state(state)


def _add_nodes(run: RunDir, record: dict, hosts: Hosts) -> None:
    """Every node's host facts from the probe step's output, and the image's facts (the digest it pulled)."""
    from repro.nodes import facts as probes
    from repro.nodes.facts import Fact
    from repro.nodes.preflight import node_report
    from repro.record import provenance

    image = _job_json(run, IMAGE, "container")
    for i, node in enumerate(hosts.nodes):
        said = slurm.probe_output(run.path, i, node.name)
        host = node_report(node, said[0], Fact(detail="srun"), said[1], "exit 0").host if said else None
        host = host or probes.not_run("the probe step of the job wrote nothing for this node")
        provenance.add_node(record, node, host=host, image=image, container=image["container"])


def _add_commands(result: UpResult, jv: JobView, hosts: Hosts) -> None:
    """Each rank of each repeat's last attempt: the command as the job ran it (rendered for the nodes it
    got), its times and exit status."""
    from repro.record import provenance
    from repro.run.plan import plan_cell

    run, manifest = result.run, result.manifest
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
            ranks = [(p.command.rank, p.command.node.name) for p in plans]
            for p, (started, exit_code) in zip(plans, slurm.rank_outcomes(run.path, rep, ranks)):
                c = p.command
                log = run.log_path(key, r, c.rank, c.node.name).relative_to(run.path)
                provenance.add_command(result.record, run, cell, r, rank=c.rank, node=c.node.name,
                                       role=c.role, argv=c.command, env=env,
                                       image=jv.submitted.get("image", ""),
                                       started=started or "", ended=rep.ended, exit_code=exit_code,
                                       workdir=manifest.launch.workdir, log=log)
