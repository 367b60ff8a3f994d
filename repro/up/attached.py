"""``repro up``: the whole reproduction of one target in one call, attached.

validate → lock check → preflight → images on every node → for each matrix cell (fewest nodes first) and
each repeat: launch, wait, collect (``matrix``) → provenance; ``finish`` then judges, reports and archives.

Progress goes to a callback as events; the CLI renders them. Every repeat's status is written to the run
directory's state file as it changes, so a run stopped by a signal, a failure or a lost machine resumes with
exactly what is not done.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import docker

from repro.errors import ReproError, RunFailed, UsageError
from repro.events import Event, Progress, ignore
from repro.images import ImagesResult, prepare
from repro.images.engine import node_client
from repro.layout import PROVENANCE
from repro.run.clean import clean_clients
from repro.run.rundir import RunDir, make_run_id
from repro.run.schedulers.slurm import is_detached
from repro.spec.hosts import Hosts, load_hosts
from repro.spec.manifest import Cell, Manifest, find_target
from repro.up.finishing import keep_scheduler_facts, seal
from repro.up.matrix import Repeats, run_matrix
from repro.up.start import (Interrupted, Start, UpOptions, UpResult, before_nodes, image_record,
                            new_run, no_nodes, probe_image, start, target_manifest)


def up(target: str | None, opts: UpOptions = UpOptions(), progress: Progress = ignore) -> UpResult:
    started = time.monotonic()
    manifest, hosts, run = manifest_and_hosts(target, opts)
    s = start(manifest, hosts, opts, progress)
    if manifest.synthetic_data:
        progress(Event("warn", manifest.synthetic_data))
    sched = s.sched
    s.opts = replace(opts, images=sched.image_options(opts.images))  # e.g. no sshd layer under Slurm's PMI
    before_nodes(s)
    try:  # open inside: a signal while Slurm has not yet given the nodes still cancels the submitted job
        return _up(s, sched.open(s.need), run, started)
    except KeyboardInterrupt:
        sched.close(interrupted=True)
        raise
    finally:
        sched.close()


def manifest_and_hosts(target: str | None, opts: UpOptions) -> tuple[Manifest, Hosts, RunDir | None]:
    """The target, the inventory and, with ``--resume``, the run directory to finish."""
    if opts.resume is None:
        return target_manifest(target, opts), load_hosts(opts.hosts_file), None
    run = RunDir.open(opts.resume)
    if is_detached(run.path) and not run.file(PROVENANCE).is_file():
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


def _up(s: Start, used: Hosts, run: RunDir | None, started: float) -> UpResult:
    """The run on the nodes ``used``; a new run directory keeps the inventory for --resume (under Slurm,
    the allocated nodes)."""
    manifest, opts, progress, sched = s.manifest, s.opts, s.progress, s.sched
    recorded = run is not None and run.file(PROVENANCE).is_file()  # a resumed run keeps its record
    reports = [] if opts.skip_preflight and recorded else _preflight(s, used)
    if sched.engines:
        progress(Event("step", f"images on {len(used.nodes)} node(s)"))
    # the build's check containers carry it
    run_id = run.run_id if run is not None else make_run_id(manifest.id)
    images = prepare(manifest, used if sched.engines else no_nodes(used),
                     replace(opts.images, build=replace(opts.images.build, run_id=run_id)), progress=progress)
    image = images.reference if sched.engines else (images.pushed or images.pins.images["image"]).pinned
    if run is None:
        run = new_run(s, used if sched.allocates else s.hosts, run_id, images.pins)
    else:
        progress(Event("info", f"resuming {run.path}", data={"run_dir": str(run.path)}))
    clients = _clients(used) if sched.engines else {}  # under pyxis, enroot runs the containers
    _remove_stale(clients, run.run_id, progress)
    if clients:
        _image_mofed(manifest, s.cells, [] if opts.skip_preflight else reports, clients[used.nodes[0].name],
                     images.reference, opts, progress)
    result = UpResult(run, manifest, _record(run, manifest, used, images, clients, reports, progress),
                      cells=s.cells)
    repeats = Repeats(result, used, image, sched.launch_cell, progress, clients, strict=opts.strict)
    try:
        run_matrix(repeats, s.cells, opts.repeats, opts.fail_fast)
    except KeyboardInterrupt as e:
        sched.close(interrupted=True)
        raise Interrupted(run.path) from e
    finally:
        for c in clients.values():
            c.close()
        result.seconds = time.monotonic() - started
        keep_scheduler_facts(result, sched.facts())
        seal(result, progress)
    return result


def _preflight(s: Start, hosts: Hosts) -> list[Any]:
    """Probe every node once, where the scheduler runs things (over SSH, or a Slurm job step); the reports
    also carry the host facts the provenance records. Unless ``--skip-preflight``, check them against the
    target. Returns the nodes' reports."""
    from repro.nodes.preflight import assess, compare, dataset_to_check, site_checks
    from repro.nodes.table import render_preflight

    opts, progress = s.opts, s.progress
    progress(Event("step", f"{'probing' if opts.skip_preflight else 'preflight of'} "
                           f"{len(hosts.nodes)} node(s)"))
    reports = s.sched.preflight(hosts.nodes, accept_new_host_keys=opts.accept_new_host_keys,
                                dataset=None if opts.skip_preflight else dataset_to_check(s.manifest, hosts))
    if opts.skip_preflight:
        return reports
    deviations = compare(reports, s.manifest.expect_for(s.cells), len(hosts.nodes))
    more, blocking = site_checks(reports, s.manifest, hosts.env, s.cells)
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


def _record(run: RunDir, manifest: Manifest, hosts: Hosts, images: ImagesResult,
            clients: Mapping[str, docker.DockerClient], reports: Sequence[Any],
            progress: Progress) -> dict[str, Any]:
    """The provenance record: resumed from the run directory, or new with every node's host facts (from the
    node script preflight ran) and image facts."""
    from concurrent.futures import ThreadPoolExecutor

    from repro.images.engine import connect
    from repro.nodes import facts as probes
    from repro.record import provenance

    if run.file(PROVENANCE).is_file():
        return provenance.load_record(run.file(PROVENANCE))
    progress(Event("step", f"recording the environment of {len(hosts.nodes)} node(s)"))
    record = provenance.new_record(run, manifest, hosts, lock=images.pins.to_json(manifest))
    # no engine of the node's (pyxis): the image's facts from the engine that built or pulled it, same digest
    local = None if all(n.name in clients for n in hosts.nodes) else connect()
    engine = {n.name: clients.get(n.name) or local for n in hosts.nodes}
    host_facts = {r.node: r.host or probes.not_run(f"host probe did not run: {r.ssh.reason}")
                  for r in reports}
    with ThreadPoolExecutor(max(1, len(hosts.nodes))) as pool:
        containers = dict(zip([n.name for n in hosts.nodes], pool.map(
            lambda n: probe_image(engine[n.name], manifest, images.reference, run.run_id), hosts.nodes)))
    for node in hosts.nodes:
        img = engine[node.name].images.get(images.reference)
        digests = img.attrs.get("RepoDigests") or []
        provenance.add_node(record, node, host=host_facts[node.name], container=containers[node.name],
                            image=image_record(img, images.reference,
                                               digests[0].partition("@")[2] if digests else None))
    return record
