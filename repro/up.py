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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker

from repro.run.clean import clean_clients
from repro.images import lock
from repro.errors import ReproError, RunFailed, UsageError
from repro.spec.hosts import Hosts, load_hosts
from repro.images import ImagesOptions, check_pins, prepare
from repro.images.engine import node_client
from repro.events import Event, Progress, ignore
from repro.run.launch import CellFailed, NodeResult, launch_cell
from repro.spec.manifest import Cell, Manifest, find_target, synthetic
from repro.measure.parsers import PARSERS
from repro.measure.transport import transport_findings
from repro.run.plan import select_cells
from repro.run.schedulers import make_scheduler
from repro.run.schedulers.base import Scheduler
from repro.run.schedulers.slurm.jobfiles import is_detached
from repro.run.rundir import DONE, FAILED, PENDING, RUNNING, RunDir, make_run_id

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
    synthetic: bool = False  # the synthetic-data run the manifest declares (dataset.synthetic)
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
    verdicts: list[str] = field(default_factory=list)  # one per cell this invocation ran, once finished
    cells: Sequence[Cell] = ()  # the cells this invocation ran (--cells): what its exit status speaks of
    table: Any = None  # the run's judged table (a TableResult), once finished: what the results store keeps


def _manifest_and_hosts(target: str | None, opts: UpOptions) -> tuple[Manifest, Hosts, RunDir | None]:
    if opts.resume is None:
        if not target:
            raise UsageError("give a TARGET, or --resume RUN_DIR")
        manifest = find_target(target)
        return synthetic(manifest) if opts.synthetic else manifest, load_hosts(opts.hosts_file), None
    run = RunDir.open(opts.resume)
    if is_detached(run.path) and not run.file("provenance.json").is_file():
        raise UsageError(f"{opts.resume} is a detached run not judged yet: its state is in its job's files",
                         hint=f"repro report {opts.resume} first (repro status shows whether the job ended)")
    manifest = run.load_manifest()
    state = run.read_state()
    if state.get("redacted"):  # the recorded copy has <redacted> for its secrets: run the original again
        if not target:
            raise UsageError(f"{run.file('manifest.yaml')} has its secret values redacted, "
                             "so it cannot be run again",
                             hint="give the original manifest: repro up TARGET --resume RUN_DIR")
        original = find_target(target)
        if original.sha256 != state.get("manifest_sha256"):
            raise UsageError(f"{target} is not the manifest {opts.resume} ran (its digest differs)")
        manifest = original
    elif target and target != manifest.id:
        raise UsageError(f"{opts.resume} is a run of {manifest.id}, not {target}")
    if opts.synthetic and not manifest.synthetic_data:
        raise UsageError(f"{opts.resume} is a run on the dataset, not on synthetic data",
                         hint="resume it without --synthetic")
    recorded = run.file("hosts.yaml")
    if opts.hosts_file is None and "<redacted>" in recorded.read_text(encoding="utf-8"):
        raise UsageError(f"{recorded} has its secret values redacted, so it cannot be run again",
                         hint="give the original inventory: repro up --resume RUN_DIR --hosts FILE")
    return manifest, load_hosts(opts.hosts_file or recorded), run


def _preflight(hosts: Hosts, manifest: Manifest, cells: Sequence[Cell], opts: UpOptions,
               progress: Progress, sched: Scheduler) -> list[Any]:
    """Probe every node once, where the scheduler runs things (over SSH, or a Slurm job step); the reports
    also carry the host facts the provenance records. Unless ``--skip-preflight``, check them against the
    target. Returns the nodes' reports."""
    from repro.nodes.preflight import assess, compare, dataset_to_check, site_checks
    from repro.nodes.table import render_preflight

    progress(Event("step", f"{'probing' if opts.skip_preflight else 'preflight of'} "
                           f"{len(hosts.nodes)} node(s)"))
    reports = sched.preflight(hosts.nodes, accept_new_host_keys=opts.accept_new_host_keys,
                              dataset=None if opts.skip_preflight else dataset_to_check(manifest, hosts))
    if opts.skip_preflight:
        return reports
    deviations = compare(reports, manifest.expect, len(hosts.nodes))
    more, blocking = site_checks(reports, manifest, hosts.env, cells)
    deviations += more
    progress(Event("info", render_preflight(reports, deviations, blocking).rstrip(), data={"table": True}))
    assess(reports, deviations, strict=opts.strict, blocking=blocking)
    return reports


def _image_mofed(manifest: Manifest, cells: Sequence[Cell], reports: Sequence[Any],
                 client: docker.DockerClient, image: str, opts: UpOptions, progress: Progress) -> None:
    """For a target that uses its image's MOFED user space: every node's MOFED at least as new as it."""
    from repro.nodes.preflight import PreflightFailed, compare_rdma, image_env

    if not reports or manifest.rdma_strategy != "image":
        return
    env = image_env(client.images.get(image).attrs)
    found = [d for d in compare_rdma(reports, manifest, multi_node=any(c.nodes > 1 for c in cells),
                                     image_env=env) if d.what == "mofed"]
    for d in found:
        progress(Event("warn", str(d)))
    if found and opts.strict:
        raise PreflightFailed(f"{len(found)} node(s) with a MOFED older than the image's user space "
                              "(--strict)",
                              hint="update the host's MLNX_OFED, or run without --strict to go on")


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


def _remove_stale(clients: Mapping[str, docker.DockerClient], run_id: str, progress: Progress) -> None:
    """Containers of this run still on a node (a killed earlier attempt of a resumed run) hold GPUs: remove
    them."""
    for r in clean_clients(clients, run_id):
        if r.removed:
            progress(Event("warn", f"removed {len(r.removed)} stale container(s) of this run: "
                           f"{', '.join(r.removed)}", node=r.node))
        elif r.error:
            progress(Event("warn", f"could not look for stale containers of this run: {r.error}",
                           node=r.node))


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
    if manifest.synthetic_data:
        progress(Event("warn", manifest.synthetic_data))
    need = max(c.nodes for c in cells)
    sched = make_scheduler(hosts, manifest, cells, opts.scheduler, progress)
    opts = replace(opts, images=sched.image_options(opts.images))  # e.g. no sshd layer under Slurm's PMI
    sched.check(need)  # what the scheduler can refuse, before anything is built or submitted
    progress(Event("step", "checking the pins against the lock file"))
    check_pins(manifest, opts.images, progress=progress)
    if not sched.engines and "build" in manifest.image and not opts.images.push:
        raise UsageError(f"{manifest.id} builds its image, and {sched.runtime(sched.cfg)} takes images "
                         "from a registry by digest",
                         hint="give --push REGISTRY (a registry the cluster's nodes can pull from)")
    if sched.allocates:
        # no allocation is held while the image is built and pushed; the nodes are known only once Slurm
        # allocates them, so the transfer to them (a pull by digest with --push) is done inside it
        progress(Event("step", "the image, before the allocation"))
        prepare(manifest, Hosts((), hosts.path, hosts.data, hosts.env), opts.images, progress=progress)
    try:  # open inside: a signal while Slurm has not yet given the nodes still cancels the submitted job
        used = sched.open(need)
        return _up(manifest, cells, used, run, sched, opts, progress, started,
                   record=used if sched.allocates else hosts)
    except KeyboardInterrupt:
        sched.close(interrupted=True)
        raise
    finally:
        sched.close()


def _up(manifest: Manifest, cells: Sequence[Cell], used: Hosts, run: RunDir | None, sched: Scheduler,
        opts: UpOptions, progress: Progress, started: float, record: Hosts) -> UpResult:
    """``record``: the inventory the run directory keeps for --resume (under Slurm, the allocated nodes)."""
    recorded = run is not None and run.file("provenance.json").is_file()  # a resumed run keeps its record
    reports = ([] if opts.skip_preflight and recorded
               else _preflight(used, manifest, cells, opts, progress, sched))
    if sched.engines:
        progress(Event("step", f"images on {len(used.nodes)} node(s)"))
    # the build's check containers carry it
    run_id = run.run_id if run is not None else make_run_id(manifest.id)
    images = prepare(manifest, used if sched.engines else Hosts((), used.path, used.data, used.env),
                     replace(opts.images, build=replace(opts.images.build, run_id=run_id)), progress=progress)
    image = images.reference if sched.engines else (images.pushed or images.pins.images["image"]).pinned
    if run is None:
        run = RunDir.create(opts.out, manifest, record, run_id=run_id)
        # what --resume runs again
        lock.write_lock(lock.lock_path(run.load_manifest()), manifest, images.pins)
        progress(Event("info", f"run directory {run.path}", data={"run_dir": str(run.path)}))
    else:
        progress(Event("info", f"resuming {run.path}", data={"run_dir": str(run.path)}))
    clients = _clients(used) if sched.engines else {}  # under pyxis, enroot runs the containers
    _remove_stale(clients, run.run_id, progress)
    if clients:
        _image_mofed(manifest, cells, [] if opts.skip_preflight else reports, clients[used.nodes[0].name],
                     images.reference, opts, progress)
    result = UpResult(run, manifest, _record(run, manifest, used, images, clients, reports, progress),
                      cells=cells)
    try:
        _run_matrix(manifest, cells, used, run, clients, image, opts, progress, result, sched.launch_cell)
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


def _record(run: RunDir, manifest: Manifest, hosts: Hosts, images: Any,
            clients: Mapping[str, docker.DockerClient], reports: Sequence[Any],
            progress: Progress) -> dict[str, Any]:
    """The provenance record: resumed from the run directory, or new with every node's host facts (from the
    node script preflight ran) and image facts."""
    from concurrent.futures import ThreadPoolExecutor

    from repro.nodes import facts as probes
    from repro.record import provenance

    if run.file("provenance.json").is_file():
        return provenance.load_record(run.file("provenance.json"))
    from repro.images.engine import connect

    progress(Event("step", f"recording the environment of {len(hosts.nodes)} node(s)"))
    record = provenance.new_record(run, manifest, hosts, lock=images.pins.to_json(manifest))
    by_node = {r.node: r for r in reports}
    # no engine of the node's (pyxis): the image's facts from the engine that built or pulled it, same digest
    local = None if all(n.name in clients for n in hosts.nodes) else connect()
    engine = {n.name: clients.get(n.name) or local for n in hosts.nodes}
    host_facts = {n: r.host or probes.not_run(f"host probe did not run: {r.ssh.reason}")
                  for n, r in by_node.items()}
    sources = [manifest.source["path"]] if manifest.source else []
    with ThreadPoolExecutor(max(1, len(hosts.nodes))) as pool:
        containers = dict(zip([n.name for n in hosts.nodes], pool.map(
            lambda n: probes.probe_container(engine[n.name], images.reference, sources=sources,
                                             run_id=run.run_id),
            hosts.nodes)))
    for node in hosts.nodes:
        img = engine[node.name].images.get(images.reference)
        repo_digests = img.attrs.get("RepoDigests") or []
        provenance.add_node(record, node, host=host_facts[node.name], container=containers[node.name],
                            image={"ref": images.reference, "id": img.id, "repo_digests": repo_digests,
                                   "digest": repo_digests[0].partition("@")[2] if repo_digests else None,
                                   "labels": img.labels})
    return record


def _scheduler_facts(result: UpResult, sched: Scheduler) -> None:
    """The allocation this invocation ran in (job id, partition, nodes, batch script, steps), one entry per
    allocation."""
    facts = sched.facts()
    if facts:
        kept = [a for a in result.record.get("scheduler", []) if a.get("job_id") != facts["job_id"]]
        result.record["scheduler"] = [*kept, facts]
        if facts.get("sbatch_script"):
            result.run.write_text(f"slurm-{facts['job_id']}.sbatch", facts["sbatch_script"])


def _seal(result: UpResult, progress: Progress) -> None:
    """Provenance and checksums on every way out, so even a stopped run is auditable as far as it got."""
    from repro.record import provenance

    try:
        provenance.finalize(result.run, result.record)
    except ReproError as e:
        progress(Event("warn", f"provenance not written: {e}"))


def _todo(run: RunDir, cells: Sequence[Cell], repeats: int | None) -> list[tuple[Cell, int]]:
    pending = set(run.pending())
    wanted = {c.key for c in cells}
    out = [(c, k) for c in cells for k in range(1, (repeats or 10**6) + 1)
           if (c.key, k) in pending and c.key in wanted]
    return sorted(out, key=lambda ck: (ck[0].nodes, cells.index(ck[0]), ck[1]))


def _run_matrix(manifest: Manifest, cells: Sequence[Cell], hosts: Hosts, run: RunDir,
                clients: Mapping[str, docker.DockerClient], image: str,
                opts: UpOptions, progress: Progress, result: UpResult, launch: Any = None) -> None:
    todo = _todo(run, cells, opts.repeats)
    total = len(todo)
    throughput = _Throughput(manifest.measure.parser)
    progress(Event("step", f"{total} repeat(s) to run", data={"total": total}))
    for i, (cell, repeat) in enumerate(todo, start=1):
        progress(Event("cell", f"{cell.key} repeat {repeat}",
                       data={"cell": cell.key, "repeat": repeat, "index": i, "total": total}))
        ok = _run_repeat(manifest, cell, repeat, hosts, run, clients, image, progress, throughput, result,
                         strict=opts.strict, launch=launch)
        if ok:
            result.done += 1
        else:
            result.failed.append(f"{cell.key} r{repeat}")
            if opts.fail_fast:
                raise RunFailed(f"{cell.key} repeat {repeat} failed; stopping (--fail-fast)",
                                hint=f"repro up --resume {run.path} reruns what is not done")


def _run_repeat(manifest: Manifest, cell: Cell, repeat: int, hosts: Hosts, run: RunDir,
                clients: Mapping[str, docker.DockerClient], image: str, progress: Progress,
                throughput: _Throughput, result: UpResult, *, strict: bool = False,
                launch: Any = None) -> bool:
    """One repeat, retried up to the manifest's limit; its status is in the state file on every path.
    ``launch``: the scheduler's cell launcher (default: over SSH, :func:`repro.launch.launch_cell`)."""
    launch = launch or launch_cell
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
            nodes_ran = launch(manifest, cell, hosts, log_dir, run_id=run.run_id, clients=clients,
                               image=image, on_event=on_event,
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
            run.set_status(cell, repeat, PENDING,
                           "interrupted" if isinstance(e, KeyboardInterrupt) else f"stopped: {e}")
            raise
        finally:
            result.cell_seconds += time.monotonic() - t0
        found = transport_findings(manifest, cell, nodes_ran)
        if found:
            from repro.record import provenance
            for text in found:
                provenance.add_finding(result.record, cell, repeat, "nccl-transport", text)
                progress(Event("warn", f"{cell.key} repeat {repeat}: {text}"))
            if strict:
                run.set_status(cell, repeat, FAILED,
                               f"NCCL did not use InfiniBand between nodes (--strict): {found[0]}")
                return False
        run.set_status(cell, repeat, DONE)
        progress(Event("done", f"{cell.key} repeat {repeat} done", data={"cell": cell.key, "repeat": repeat}))
        return True
    return False


def _commands(result: UpResult, cell: Cell, repeat: int, nodes: Sequence[NodeResult],
              env: Mapping[str, str], image: str) -> None:
    from repro.record import provenance

    for r in nodes:
        if r.started:
            provenance.add_command(result.record, result.run, cell, repeat, rank=r.rank, node=r.node,
                                   role=r.role, argv=r.command, env=env, image=image, started=r.started,
                                   ended=r.ended, exit_code=r.exit_code,
                                   workdir=result.manifest.launch.workdir, log=r.log)


def finish(result: UpResult, *, colour: bool = False, sign_key: Any = None) -> str:
    """Parse the run's logs with the manifest's protocol, write the reports into the run directory
    (report.md/csv/json/png, report.html), seal it, sign it with ``sign_key`` (a repro.record.dsse.Signer),
    fill ``result.verdicts`` and return the table with a closing summary for the CLI to print."""
    from repro.record.audit import environment_checks
    from repro.verdict.html import render_html
    from repro.verdict.report import render_text
    from repro.verdict.reproduce import reproduce_run
    from repro.record import archive, sign

    run = result.run
    table = result.table = reproduce_run(run.path)
    ran = {(c.nodes, c.gpus, c.precision, c.batch_size) for c in result.cells}
    result.verdicts = [c.verdict for c in table.cells
                       if not ran or (c.nodes, c.gpus, c.precision, c.batch_size) in ran]
    findings = findings_section(result.record)
    write_reports(run, [table], findings)
    chart = _draw_chart(table, run)
    try:  # the environment against the publication's, as far as the record has it
        environment = environment_checks(result.record, result.manifest) if result.record.get("nodes") else []
    except (KeyError, TypeError, ValueError):
        environment = []
    png = run.file("report.png").read_bytes() if chart is None else None  # drawn once, for both
    run.write_text("report.html", render_html([table], environment=environment, chart=png))
    _seal(result, ignore)
    signed = f"signed by keyid {sign.sign_run(run.path, sign_key)}\n" if sign_key is not None else ""
    packed = archive.create(run)
    overhead = result.seconds - result.cell_seconds
    summary = (f"\nrun {run.path}: {result.done} repeat(s) done, {len(result.failed)} failed"
               + (f" ({', '.join(result.failed)})" if result.failed else "")
               + f"; {result.seconds:.0f} s in all, {result.cell_seconds:.0f} s in cells\n")
    summary += f"report {run.file('report.html')}\n" + (f"chart not drawn: {chart}\n" if chart else "")
    summary += f"archive {packed} (check it with: repro audit {packed})\n" + signed
    if result.failed:
        summary += f"finish it with: repro up --resume {run.path}\n"
    log.debug("kit overhead outside cells: %.1f s", overhead)
    return render_text([table], colour=colour) + findings + summary


def _draw_chart(table: Any, run: RunDir) -> str | None:
    """report.png; a chart that cannot be drawn is said so (returned) and never stops the run's sealing."""
    from repro.verdict.chart import plot_report

    try:
        plot_report([table], run.file("report.png"))
    except Exception as err:  # noqa: BLE001 - matplotlib raises many kinds; the archive matters more
        if run.file("report.png").is_file():
            run.file("report.png").unlink()
        return f"{type(err).__name__}: {err}"
    return None


def write_reports(run: RunDir, tables: Sequence[Any], findings: str = "") -> None:
    """report.md/csv/json of the run's tables; ``findings`` (a markdown section) closes report.md."""
    from repro.verdict.report import RENDERERS

    for fmt, render in RENDERERS.items():
        run.write_text(f"report.{fmt}", render(tables) + (findings if fmt == "md" else ""))


def findings_section(record: Mapping[str, Any]) -> str:
    """The run's findings (e.g. NCCL over sockets where InfiniBand was expected) as a report section."""
    found = record.get("findings") or []
    if not found:
        return ""
    lines = [f"- {f['cell']} repeat {f['repeat']}: {f['kind']}: {f['text']}" for f in found]
    return "\nFindings:\n\n" + "\n".join(lines) + "\n"
