"""``repro up``: the whole reproduction of one target in one call.

validate → lock check → preflight → images on every node → for each matrix cell
(fewest nodes first) and each repeat: launch, wait, collect → parse with the
manifest's protocol → the published table beside the reproduced one → provenance.

Progress goes to a callback as events; the CLI renders them. Every repeat's status is
written to the run directory's state file as it changes, so a run stopped by a signal,
a failure or a lost machine resumes with exactly what is not done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from repro import lock
from repro.errors import ReproError, RunFailed, UsageError
from repro.hosts import Hosts, load_hosts
from repro.images import ImagesOptions, check_pins, prepare
from repro.images.engine import node_client
from repro.images.events import Event, Progress, ignore
from repro.launch import CellFailed, NodeResult, launch_cell
from repro.manifest import Cell, Manifest, find_target
from repro.parsers import PARSERS
from repro.plan import select_cells
from repro.rundir import DONE, FAILED, PENDING, RUNNING, RunDir

log = logging.getLogger(__name__)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the matrix: every container is gone; the run directory can be resumed."""

    def __init__(self, run_path: Path) -> None:
        super().__init__(str(run_path))
        self.run_path = run_path


@dataclass(frozen=True)
class UpOptions:
    hosts_file: Path | None = None
    cells: Sequence[Mapping[str, Any]] = ()
    repeats: int | None = None
    resume: Path | None = None
    fail_fast: bool = False
    out: Path = Path("logs")
    strict: bool = False
    accept_new_host_keys: bool = False
    skip_preflight: bool = False
    scheduler: str | None = None  # --scheduler KIND[:KEY=VALUE,...] (repro.schedulers)
    images: ImagesOptions = field(default_factory=ImagesOptions)


@dataclass
class UpResult:
    run: RunDir
    manifest: Manifest
    record: dict[str, Any] = field(default_factory=dict)  # the provenance record being filled
    done: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cell_seconds: float = 0.0


def _manifest_and_hosts(target: str | None, opts: UpOptions) -> tuple[Manifest, Hosts, RunDir | None]:
    if opts.resume is None:
        if not target:
            raise UsageError("give a TARGET, or --resume RUN_DIR")
        return find_target(target), load_hosts(opts.hosts_file), None
    run = RunDir.open(opts.resume)
    manifest = run.load_manifest()
    if target and target != manifest.id:
        raise UsageError(f"{opts.resume} is a run of {manifest.id}, not {target}")
    recorded = run.file("hosts.yaml")
    if opts.hosts_file is None and "<redacted>" in recorded.read_text(encoding="utf-8"):
        raise UsageError(f"{recorded} has its secret values redacted, so it cannot be run again",
                         hint="give the original inventory: repro up --resume RUN_DIR --hosts FILE")
    return manifest, load_hosts(opts.hosts_file or recorded), run


def _preflight(hosts: Hosts, manifest: Manifest, opts: UpOptions, progress: Progress) -> dict[str, bool]:
    """Check every node first; returns which nodes have InfiniBand devices to pass through."""
    from repro.preflight import assess, compare, render_preflight, run_preflight

    progress(Event("step", f"preflight of {len(hosts.nodes)} node(s)"))
    reports = run_preflight(hosts.nodes, accept_new_host_keys=opts.accept_new_host_keys)
    deviations = compare(reports, manifest.expect, len(hosts.nodes))
    progress(Event("info", render_preflight(reports, deviations).rstrip(), data={"table": True}))
    assess(reports, deviations, strict=opts.strict)
    return {r.node: bool(r.infiniband.value) for r in reports}


def _clients(hosts: Hosts) -> dict[str, docker.DockerClient]:
    """Every node's engine, connected in parallel; one error listing every node that failed."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(hosts.nodes))) as pool:
        futures = {n.name: pool.submit(node_client, n) for n in hosts.nodes}
    errors = {name: e for name, f in futures.items() if (e := f.exception()) is not None}
    if errors:
        hints = {e.hint for e in errors.values() if isinstance(e, ReproError) and e.hint}
        raise RunFailed("cannot reach the Docker engine of every node:\n  "
                        + "\n  ".join(f"{name}: {err}" for name, err in errors.items()),
                        hint="; ".join(sorted(hints)) or None)
    return {name: f.result() for name, f in futures.items()}


class _Throughput:
    """The latest throughput figure a node printed, read with the target's own parser."""

    def __init__(self, parser: str) -> None:
        self.parser = PARSERS.get(parser)()
        self.hints = getattr(self.parser, "record_hints", ())

    def __call__(self, line: str) -> float | None:
        if self.hints and not any(h in line for h in self.hints):
            return None
        for series in self.parser.parse([line]).series:
            if series.records:
                return series.records[-1].value
        return None


def up(target: str | None, opts: UpOptions = UpOptions(), progress: Progress = ignore) -> UpResult:
    started = time.monotonic()
    manifest, hosts, run = _manifest_and_hosts(target, opts)
    cells = select_cells(manifest, opts.cells)
    if not cells:
        raise UsageError(f"no cell of {manifest.id} matches the --cells filter")
    need = max(c.nodes for c in cells)
    sched = _scheduler(manifest, cells, hosts, opts, progress)
    used = sched.open(need)
    try:
        return _up(manifest, cells, used, run, sched, opts, progress, started,
                   record=hosts if sched.name == "ssh" else used)
    except KeyboardInterrupt:
        sched.close(interrupted=True)
        raise
    finally:
        sched.close()


def _scheduler(manifest: Manifest, cells: Sequence[Cell], hosts: Hosts, opts: UpOptions, progress: Progress) -> Any:
    from repro.schedulers import SCHEDULERS, scheduler_config

    cfg = scheduler_config(hosts.scheduler, opts.scheduler)
    return SCHEDULERS.get(cfg["kind"])(cfg, manifest, cells, hosts, progress)


def _up(manifest: Manifest, cells: Sequence[Cell], used: Hosts, run: RunDir | None, sched: Any, opts: UpOptions,
        progress: Progress, started: float, record: Hosts) -> UpResult:
    """``record``: the inventory the run directory keeps for --resume (under Slurm, the allocated nodes)."""
    progress(Event("step", "checking the pins against the lock file"))
    check_pins(manifest, opts.images, progress=progress)
    infiniband = {} if opts.skip_preflight else _preflight(used, manifest, opts, progress)
    progress(Event("step", f"images on {len(used.nodes)} node(s)"))
    images = prepare(manifest, used, opts.images, progress=progress)
    if run is None:
        run = RunDir.create(opts.out, manifest, record)
        lock.write_lock(lock.lock_path(run.load_manifest()), manifest, images.pins)  # what --resume runs again
        progress(Event("info", f"run directory {run.path}", data={"run_dir": str(run.path)}))
    else:
        progress(Event("info", f"resuming {run.path}", data={"run_dir": str(run.path)}))
    clients = _clients(used)
    result = UpResult(run, manifest, _record(run, manifest, used, images, clients, progress))
    try:
        _run_matrix(manifest, cells, used, run, clients, images.reference, infiniband, opts, progress, result,
                    sched.launch_cell)
    except KeyboardInterrupt as e:
        sched.close(interrupted=True)
        raise Interrupted(run.path) from e
    finally:
        for c in clients.values():
            c.close()
        result.seconds = time.monotonic() - started
        _scheduler_facts(result, sched)
        _seal(result, progress)
    return result


def _record(run: RunDir, manifest: Manifest, hosts: Hosts, images: Any, clients: Mapping[str, docker.DockerClient],
            progress: Progress) -> dict[str, Any]:
    """The provenance record: resumed from the run directory, or new with every node's host and image facts."""
    from concurrent.futures import ThreadPoolExecutor

    from repro import probes, provenance

    if run.file("provenance.json").is_file():
        return provenance.load_record(run.file("provenance.json"))
    progress(Event("step", f"recording the environment of {len(hosts.nodes)} node(s)"))
    record = provenance.new_record(run, manifest, hosts, lock=images.pins.to_json(manifest))
    host_facts = probes.probe_hosts(hosts.nodes, clients=clients)
    sources = [manifest.source["path"]] if manifest.source else []
    with ThreadPoolExecutor(max(1, len(hosts.nodes))) as pool:
        containers = dict(zip([n.name for n in hosts.nodes], pool.map(
            lambda n: probes.probe_container(clients[n.name], images.reference, sources=sources), hosts.nodes)))
    for node in hosts.nodes:
        img = clients[node.name].images.get(images.reference)
        repo_digests = img.attrs.get("RepoDigests") or []
        provenance.add_node(record, node, host=host_facts[node.name], container=containers[node.name],
                            image={"ref": images.reference, "id": img.id, "repo_digests": repo_digests,
                                   "digest": repo_digests[0].partition("@")[2] if repo_digests else None,
                                   "labels": img.labels})
    return record


def _scheduler_facts(result: UpResult, sched: Any) -> None:
    """The allocation this invocation ran in (job id, partition, nodes, batch script, steps), one entry per allocation."""
    facts = sched.facts()
    if facts:
        kept = [a for a in result.record.get("scheduler", []) if a.get("job_id") != facts["job_id"]]
        result.record["scheduler"] = [*kept, facts]
        if facts.get("sbatch_script"):
            result.run.write_text(f"slurm-{facts['job_id']}.sbatch", facts["sbatch_script"])


def _seal(result: UpResult, progress: Progress) -> None:
    """Provenance and checksums on every way out, so even a stopped run is auditable as far as it got."""
    from repro import provenance

    try:
        provenance.finalize(result.run, result.record, reports=False)
    except ReproError as e:
        progress(Event("warn", f"provenance not written: {e}"))


def _todo(run: RunDir, cells: Sequence[Cell], repeats: int | None) -> list[tuple[Cell, int]]:
    pending = set(run.pending())
    wanted = {c.key for c in cells}
    out = [(c, k) for c in cells for k in range(1, (repeats or 10**6) + 1) if (c.key, k) in pending and c.key in wanted]
    return sorted(out, key=lambda ck: (ck[0].nodes, cells.index(ck[0]), ck[1]))


def _run_matrix(manifest: Manifest, cells: Sequence[Cell], hosts: Hosts, run: RunDir,
                clients: Mapping[str, docker.DockerClient], image: str, infiniband: Mapping[str, bool],
                opts: UpOptions, progress: Progress, result: UpResult, launch: Any = launch_cell) -> None:
    todo = _todo(run, cells, opts.repeats)
    total = len(todo)
    throughput = _Throughput(manifest.measure.parser)
    progress(Event("step", f"{total} repeat(s) to run", data={"total": total}))
    for i, (cell, repeat) in enumerate(todo, start=1):
        progress(Event("cell", f"{cell.key} repeat {repeat}", data={"cell": cell.key, "repeat": repeat, "index": i,
                                                                      "total": total}))
        ok = _run_repeat(manifest, cell, repeat, hosts, run, clients, image, infiniband, progress, throughput,
                         result, launch)
        if ok:
            result.done += 1
        else:
            result.failed.append(f"{cell.key} r{repeat}")
            if opts.fail_fast:
                raise RunFailed(f"{cell.key} repeat {repeat} failed; stopping (--fail-fast)",
                                hint=f"repro up --resume {run.path} reruns what is not done")


def _run_repeat(manifest: Manifest, cell: Cell, repeat: int, hosts: Hosts, run: RunDir,
                clients: Mapping[str, docker.DockerClient], image: str, infiniband: Mapping[str, bool],
                progress: Progress, throughput: _Throughput, result: UpResult, launch: Any = launch_cell) -> bool:
    """One repeat, retried up to the manifest's limit; its status is in the state file on every path."""
    attempts = manifest.retries + 1
    for attempt in range(1, attempts + 1):
        run.set_status(cell, repeat, RUNNING)
        log_dir = run.log_dir(cell, repeat)
        for stale in log_dir.glob("*.log") if log_dir.is_dir() else []:
            stale.rename(stale.with_suffix(f".attempt{attempt - 1}"))

        def on_event(ev: tuple[str, str, str]) -> None:
            kind, node, text = ev
            if kind == "line":
                value = throughput(text)
                if value is not None:
                    progress(Event("throughput", f"{value:.2f}", node=node, data={"value": value}))
            elif kind in ("exited", "error"):
                progress(Event("node", f"{kind} {text}", node=node))

        t0 = time.monotonic()
        env = manifest.launch.env_for(cell, hosts.env)
        try:
            nodes_ran = launch(manifest, cell, hosts, log_dir, run_id=run.run_id, clients=clients, image=image,
                                    on_event=on_event, infiniband=infiniband,
                                    log_writer=lambda rank, node: run.open_log(cell, repeat, rank, node))
            _commands(result, cell, repeat, nodes_ran, env, image)
        except CellFailed as e:
            _commands(result, cell, repeat, e.results, env, image)
            why = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
            last = attempt == attempts
            run.set_status(cell, repeat, FAILED if last else PENDING, why)
            progress(Event("warn", f"{cell.key} repeat {repeat} attempt {attempt}/{attempts} failed: {why}"
                           + ("" if last else "; retrying")))
            if last:
                return False
            continue
        except BaseException as e:  # Ctrl-C, or the environment failing under the run: resumable
            run.set_status(cell, repeat, PENDING, "interrupted" if isinstance(e, KeyboardInterrupt) else f"stopped: {e}")
            raise
        finally:
            result.cell_seconds += time.monotonic() - t0
        run.set_status(cell, repeat, DONE)
        progress(Event("done", f"{cell.key} repeat {repeat} done", data={"cell": cell.key, "repeat": repeat}))
        return True
    return False


def _commands(result: UpResult, cell: Cell, repeat: int, nodes: Sequence[NodeResult], env: Mapping[str, str],
              image: str) -> None:
    from repro import provenance

    for r in nodes:
        if r.started:
            provenance.add_command(result.record, result.run, cell, repeat, rank=r.rank, node=r.node, role=r.role,
                                   argv=r.command, env=env, image=image, started=r.started, ended=r.ended,
                                   exit_code=r.exit_code, workdir=result.manifest.launch.workdir, log=r.log)


def finish(result: UpResult) -> str:
    """Parse the run's logs with the manifest's protocol, write the reports into the run
    directory, and return the table with a closing summary for the CLI to print."""
    from repro.report import RENDERERS, plot_scaling
    from repro.reproduce import reproduce_run

    from repro import archive

    run = result.run
    table = reproduce_run(run.path)
    for fmt, render in RENDERERS.items():
        run.write_text(f"report.{fmt}", render([table]))
    plot_scaling([table], run.file("report.png"))
    _seal(result, ignore)
    packed = archive.create(run)
    overhead = result.seconds - result.cell_seconds
    summary = (f"\nrun {run.path}: {result.done} repeat(s) done, {len(result.failed)} failed"
               + (f" ({', '.join(result.failed)})" if result.failed else "")
               + f"; {result.seconds:.0f} s in all, {result.cell_seconds:.0f} s in cells\n")
    summary += f"archive {packed} (check it with: repro audit {packed})\n"
    if result.failed:
        summary += f"finish it with: repro up --resume {run.path}\n"
    log.debug("kit overhead outside cells: %.1f s", overhead)
    return RENDERERS["md"]([table]) + summary
