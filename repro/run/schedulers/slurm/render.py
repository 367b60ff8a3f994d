"""What the kit submits to Slurm, as text and argv, from the target and the nodes: pure functions.

The allocation's batch script (``render_sbatch``), a docker-mode cell's job step (``srun_argv`` running the
agent, ``step_spec`` on its stdin), the preflight job step (``preflight_argv``), a pyxis cell's job step
(``pyxis_step``), the telemetry sampler's step beside it (``sampler_srun``), the batch script that runs a
pyxis cell on its own (``render_pyxis``), and what ``repro plan`` shows of them all (``render_plan_slurm``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from repro import labels
from repro.errors import UsageError
from repro.nodes.telemetry import SHOWN, sampler_argv, shown_sampler
from repro.redact import redact_argv, redact_text
from repro.run.launchers.base import fill
from repro.run.plan import docker_run_flags, plan_cell
from repro.run.schedulers import KEYS
from repro.run.schedulers.slurm.apptainer import apptainer_step, build_argv, sif_path
from repro.run.schedulers.slurm.rankfiles import files_first
from repro.run.schedulers.slurm.enroot import image_file
from repro.run.schedulers.slurm.siteenv import (BASE_EXPORT, MEMLOCK_CHECK, RANK_WRAP, StepSite, binding,
                                                clean_environ,
                                                host_export, memlock_checked, prelude_lines, step_options,
                                                wants_memlock)
from repro.spec.hosts import Hosts
from repro.spec.manifest import Cell, Manifest
from repro.spec.scheduler import GPU_REQUEST, SETTINGS, lines_of, problems

#: the job-step agent, run on every node of a docker-mode step as ``python3 -c``
AGENT = Path(__file__).parent.parent / "agent.py"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOLD = ("# repro holds these nodes for the run and starts each cell in them as a job step (srun --jobid)\n"
        "exec sleep 2147483647")


def render_sbatch(cfg: Mapping[str, Any], name: str, nodes: int, body: str = HOLD, *, per_node: int = 1,
                  output: str = "/dev/null", gpus: int | None = None) -> str:
    """A batch script: by default the run's allocation (exact text: it goes into the provenance)."""
    lines = ["#!/bin/sh", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={per_node}", "#SBATCH --exclusive", "#SBATCH --no-requeue"]
    lines += [f"#SBATCH {option}" for option in site_options(cfg, gpus)]
    lines += [f"#SBATCH --output={output}", body]
    return "\n".join(lines) + "\n"


def site_options(cfg: Mapping[str, Any], gpus: int | None) -> list[str]:
    """The sbatch options the scheduler settings add, in the settings' order: the named ones, the GPUs of
    each node (the inventory's ``gpus``; none where it says 0 or nothing) as ``gpu_request`` says, ``--mem``
    (``0``, all of each node's memory, unless ``mem`` says otherwise or ``none``) and the site's own
    ``sbatch_extra``."""
    bad = problems({k: v for k, v in cfg.items() if k in SETTINGS})
    if bad:  # every caller checked already; a value that could add a line or an option never reaches a script
        raise UsageError(f"scheduler {bad[0][0]}: {bad[0][1]}", hint=bad[0][2])
    out = [f"{s.sbatch}={cfg[key]}" for key, s in SETTINGS.items() if s.sbatch and cfg.get(key)]
    if gpus:
        request = GPU_REQUEST[str(cfg.get("gpu_request", "gpus-per-node"))]
        out += [request.format(gpus)] if request else []
    mem = str(cfg.get("mem", "0"))
    out += [] if mem == "none" else [f"--mem={mem}"]
    return out + lines_of(cfg.get("sbatch_extra"))


def srun_argv(job: str, nodes: Sequence[str], step: str, export: str = BASE_EXPORT) -> list[str]:
    """The job step of one cell in docker mode: the agent once on each node, output labelled by rank;
    ``export``: what it passes (``siteenv.host_export``)."""
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--label", "--input=all",
            "--kill-on-bad-exit=1", export, f"--job-name={step}", "--", "python3", "-c",
            AGENT.read_text(encoding="utf-8")]


def sampler_srun(job: str, nodes: Sequence[str], step: str, max_s: float,
                 source: str | None = None, export: str = BASE_EXPORT) -> list[str]:
    """The telemetry sampler's job step beside a pyxis or Apptainer cell: one task per node on the host itself
    (no container options), output labelled by task; ``max_s``: the cell's deadline (the sampler ends by
    itself a margin after it). No ``--kill-on-bad-exit``: a node without python3 loses its own telemetry, not
    the other nodes'. ``source``: as ``sampler_argv`` takes it; ``export``: what it passes."""
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--label", export,
            f"--job-name={step}", "--", *sampler_argv(max_s, source=source)]


#: The preflight job step's command: the node's name, then preflight's probe script from stdin, run by the
#: node's sh without the DOCKER_HOST srun exports from where the kit runs (a job step uses its node's engine).
PREFLIGHT_STEP = ["env", "-u", "DOCKER_HOST", "sh", "-c",
                  'printf "%s\\n" "${SLURMD_NODENAME:-$(hostname)}"; exec sh -s']


#: Under pyxis, the step says the node's enroot version first (``enroot VERSION``, or ``enroot -`` where the
#: job step finds none on its PATH).
PREFLIGHT_ENROOT = 'printf "enroot %s\\n" "$(enroot version 2>/dev/null | head -n 1 | grep . || echo -)"; '


def preflight_argv(job: str, nodes: Sequence[str], enroot: bool = False,
                   export: str = BASE_EXPORT) -> list[str]:
    """The job step that runs preflight's probe script once on each node, output labelled by task;
    ``export``: what it passes."""
    last = PREFLIGHT_STEP[-1].replace("exec sh -s", PREFLIGHT_ENROOT + "exec sh -s") if enroot else None
    step = [*PREFLIGHT_STEP[:-1], last] if last else PREFLIGHT_STEP
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--label", "--input=all",
            export, "--job-name=repro-preflight", "--", *step]


def step_spec(plans: Sequence[Any], run_id: str, cell: Cell, image: str,
              files: Mapping[str, tuple[bytes, int]], ssh_port: int | None) -> dict[str, Any]:
    """What the agent on each node does: the docker create flags (the plan's container options, InfiniBand
    devices included), each rank's command after its facts (``siteenv.RANK_FACTS``), files, the ports to
    wait for."""
    workers = [p.command.node.rendezvous for p in plans if p.command.role == "mpi-sshd"]
    ranks = []
    for p in plans:
        c = p.command
        tags = {**p.container["labels"], labels.RUN: run_id}
        flags = [f"--label={k}={v}" for k, v in sorted(tags.items())] + docker_run_flags(p.container)
        mpi = c.role.startswith("mpi")
        mine = {path: (data.decode(), mode) for path, (data, mode) in files.items()} if mpi else {}
        mine.update({path: (text, 0o644) for path, text in c.files.items()})
        ranks.append({"node": c.node.name, "role": c.role, "name": f"repro-{run_id}-{cell.key}-rank{c.rank}",
                      "create": [*flags, image, "sh", "-c", RANK_WRAP, "sh", *c.command], "files": mine,
                      "wait_for": [[a, ssh_port] for a in workers] if c.role == "mpi-head" else []})
    return {"ranks": ranks, "ready_s": 60}


def pyxis_uri(image: str) -> str:
    """An image reference as pyxis/enroot name it: ``REGISTRY#PATH`` where the registry is named."""
    registry, _, path = image.partition("/")
    return f"{registry}#{path}" if "." in registry or ":" in registry else image


def pyxis_step(manifest: Manifest, cell: Cell, plans: Sequence[Any], image: str, head: Sequence[str],
               conf: str, mpi: str = "pmix", image_env: Mapping[str, str] | None = None,
               site: StepSite | None = None) -> tuple[list[str], dict[str, str], str | None]:
    """One cell under pyxis/enroot: the srun argv (``head``: ``srun`` and its job-step options), the
    environment srun passes to the tasks (``--container-env`` names it; values never go into argv), and the
    ``--multi-prog`` configuration written to ``conf`` (None for MPI targets: ``srun --mpi=MPI``, Slurm's
    PMIx or PMI-2, starts one task per rank, no sshd, as NVIDIA's recipes do). ``image``: the run's
    squashfs on the nodes (a path), or a reference by digest from its registry; the manifest's mounts and
    workdir; every task's output labelled with its rank. Variables whose values differ between ranks (the
    Paddle launcher's ``POD_IP``) go on each rank's ``--multi-prog`` line (``env NAME=VALUE``); the
    others through srun's environment (an MPI target's ranks all get the head's, as mpirun gives them).
    ``image_env`` (the image's own PATH) is set on every task's command line with ``env`` and is the PATH
    srun exports. ``site``: what the step exports, its limits, CPUs and GPUs (``siteenv``); every pyxis
    option the kit relies on is given here (srun's environment holds no ``PYXIS_*``: ``clean_environ``)."""
    site = site or StepSite()
    first = plans[0]
    mounts = pyxis_mounts(first.container.get("volumes", {}))
    env = dict(first.container["environment"])
    if manifest.launch.kind != "mpi":
        env = {k: v for k, v in env.items() if all(p.container["environment"].get(k) == v for p in plans)}
    bad_env = sorted(k for k in env if not ENV_NAME.fullmatch(k))
    if bad_env:
        raise UsageError(f"environment name {bad_env[0]!r} cannot go to pyxis: --container-env is a "
                         "comma-separated list of names",
                         hint="name environment variables with letters, digits and '_' only")
    # writable as a Docker container's root is (paddle's launcher writes log/ in its working directory); each
    # step's container is a new one made from the image, so nothing written reaches the next repeat
    opts = [f"--container-image={pyxis_uri(image)}", "--no-container-mount-home", "--container-writable"]
    opts += [f"--container-mounts={mounts}"] if mounts else []
    if "working_dir" in first.container:
        opts.append(f"--container-workdir={first.container['working_dir']}")
    if env or site.passed():
        opts.append(f"--container-env={','.join(sorted({*env, *site.passed()}))}")
    per_node = pyxis_tasks_per_node(manifest, cell)
    opts = [*step_options(manifest, cell, per_node, env, site, (image_env or {}).get("PATH")), *opts]
    if manifest.launch.kind == "mpi":
        argv = memlock_checked(manifest, cell, fill(manifest.launch.command, manifest.launch, cell,
                                                    [p.command.node for p in plans], 0))
        if image_env:
            argv = ["env", *(f"{k}={v}" for k, v in sorted(image_env.items())), *argv]
        return ([head[0], f"--mpi={mpi}", *head[1:], f"--nodes={cell.nodes}",
                 f"--ntasks={cell.nodes * per_node}", f"--ntasks-per-node={per_node}", "--label", *opts, "--",
                 *argv], env, None)
    check = wants_memlock(manifest, cell)
    for p in plans:
        bad = next((t for t in rank_argv(p, env, check=check) if any(c in t for c in "\n\r\0")), None)
        if bad is not None:
            raise UsageError(f"rank {p.command.rank}'s command holds a line break or NUL in {bad!r}: a "
                             "--multi-prog file takes one line per rank",
                             hint="remove line breaks from launch.command, its args and the environment")
    text = "".join(f"{p.command.rank} {shlex.join(rank_argv(p, env, image_env, check))}\n" for p in plans)
    return ([*head, f"--nodes={cell.nodes}", f"--ntasks={cell.nodes}", "--ntasks-per-node=1", "--label",
             *opts, "--multi-prog", conf], env, text)


def pyxis_mounts(volumes: Mapping[str, Any]) -> str:
    """The manifest's mounts as ``--container-mounts`` takes them (which escapes neither ',' nor ':')."""
    for src, m in volumes.items():
        if any(c in path for path in (src, m["bind"]) for c in ",:\n\r\0"):
            raise UsageError(f"the mount {src!r} -> {m['bind']!r} cannot go to pyxis: --container-mounts "
                             "separates entries with ',' and fields with ':', and escapes neither",
                             hint="use a directory (the hosts file's data:, the manifest's mounts) whose "
                                  "path has no ',' or ':', e.g. a link to it")
    return ",".join(f"{src}:{m['bind']}" + (":ro" if m["mode"] == "ro" else "") for src, m in volumes.items())


def rank_argv(plan: Any, shared: Mapping[str, str], image_env: Mapping[str, str] | None = None,
              check: bool = False) -> list[str]:
    """A rank's command, after ``env NAME=VALUE`` for each of its variables not ``shared`` by every rank
    (and the ``image_env`` every rank gets), each of its files written first (``rankfiles.files_first``),
    after the rank's facts (``siteenv.RANK_FACTS``) and the locked-memory check where ``check``
    (``siteenv.MEMLOCK_CHECK``)."""
    own = [f"{k}={v}" for k, v in sorted({**(image_env or {}), **plan.container["environment"]}.items())
           if k not in shared]
    argv = files_first(plan.command.command, plan.command.files)
    return [*(["env", *own] if own else []), "sh", "-c", MEMLOCK_CHECK if check else RANK_WRAP, "sh", *argv]


def pyxis_tasks_per_node(manifest: Manifest, cell: Cell) -> int:
    """Tasks per node of a pyxis cell: one per rank for MPI targets (srun starts them), else one launcher
    per node."""
    if manifest.launch.kind == "mpi" and manifest.launch.mpi.get("slots", "gpus_per_node") == "gpus_per_node":
        return cell.gpus_per_node
    return 1


def pyxis_head(job: str, nodes: Sequence[str], step: str) -> list[str]:
    """srun's options for a pyxis cell as a job step of the run's allocation."""
    return ["srun", f"--jobid={job}", f"--nodelist={','.join(nodes)}", "--overlap", "--kill-on-bad-exit=1",
            f"--job-name={step}"]


def render_pyxis(manifest: Manifest, cell: Cell, plans: Sequence[Any], image: str,
                 cfg: Mapping[str, str]) -> str:
    """A batch script that runs one cell under pyxis/enroot on its own (exact text; pyxis is not installable
    here): the same job step ``repro up`` starts in its allocation, after the env it passes."""
    argv, env, conf = pyxis_step(manifest, cell, plans, image, ["srun"], "repro-multi-prog.conf",
                                 site=StepSite(cfg=cfg, gpus=cell.gpus_per_node))
    body = [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    if conf is not None:
        body += ["cat > repro-multi-prog.conf <<'REPRO_EOF'", conf.rstrip("\n"), "REPRO_EOF"]
    body.append(shlex.join(argv))
    per_node = int(next(a for a in argv if a.startswith("--ntasks-per-node=")).partition("=")[2])
    return render_sbatch(cfg, f"repro-{manifest.id}-{cell.key}", cell.nodes, "\n".join(body),
                         per_node=per_node, output=f"repro-{manifest.id}-{cell.key}-%j.out")


def render_plan_slurm(cfg: Mapping[str, Any], manifest: Manifest, hosts: Hosts, cells: Sequence[Cell], *,
                      stand_ins: bool = False) -> str:
    """What ``repro up`` submits under Slurm, from the functions that render it there: the allocation's batch
    script, then each cell's job step (``JOBID``: the allocation's id, known once submitted)."""
    need = max(c.nodes for c in cells)
    runtime = cfg.get("container", "docker")
    settings = ", ".join(f"{k} {' '.join(lines_of(cfg[k]))}" for k in KEYS[1:] if cfg.get(k))
    lines = ["", "slurm: " + settings if settings else "slurm",
             "allocation (sbatch; none where the kit runs inside one, SLURM_JOB_ID):"]
    if stand_ins:
        lines.insert(2, f"nodes: node1..node{need} stand for the nodes Slurm allocates; `repro up` renders "
                        "every cell with their names and addresses")
    per_node = max(pyxis_tasks_per_node(manifest, c) for c in cells) if runtime != "docker" else 1
    script = render_sbatch(cfg, f"repro-{manifest.id}", need, per_node=per_node, gpus=hosts.gpus)
    lines += [f"  {redact_text(ln)}" for ln in script.splitlines()]
    lines += _prelude_plan(hosts)
    image = manifest.image_reference
    if runtime != "docker" and "build" in manifest.image:
        image = f"REGISTRY/{image}@DIGEST"
        how = "enroot imports" if runtime == "pyxis" else "the SIF is built from"
        lines.append(f"image: {image} ({how} the image pushed with --push REGISTRY, by digest)")
    if runtime == "pyxis":
        squashfs = image_file(cfg, "RUN", manifest.id)
        lines.append(f"image file: {squashfs} on every node (node-local), which enroot imports from {image} "
                     "once for the run (a job step of its own); every cell step starts from it")
        image = squashfs
    if runtime == "apptainer":
        sif = sif_path(str(cfg.get("sif_dir", "SIF_DIR")), "RUN")
        head = build_argv("JOBID", hosts.nodes[0].name, sif, image.replace("@DIGEST", "@sha256:DIGEST"),
                          host_export(None, cfg))
        lines += ["SIF (built once per run, on the first node; its sha256 goes into the provenance):",
                  f"  $ {shlex.join(head)}"]
    for cell in cells:
        plans = plan_cell(manifest, cell, hosts)
        lines += ["", f"cell {cell.key}: job step"]
        if runtime != "docker":
            lines.append(f"  CPUs: {binding(manifest, cell)} binding, as the publisher's launch had it"
                         + (f" ({manifest.launch.cpu_binding['source']})" if manifest.launch.cpu_binding else
                            " (the manifest names no binding: every CPU of the node)"))
        lines += _plan_step(cfg, runtime, manifest, cell, plans, image, hosts)
    return "\n".join(lines) + "\n"


def _prelude_plan(hosts: Hosts) -> list[str]:
    found = prelude_lines(hosts)
    if not found:
        return []
    return ["prelude (the hosts file's prelude and modules, verbatim: in the batch script, and before each "
            "attached step):", *(f"  {ln}" for ln in found)]


def _plan_step(cfg: Mapping[str, Any], runtime: str, manifest: Manifest, cell: Cell, plans: Sequence[Any],
               image: str, hosts: Hosts) -> list[str]:
    """One cell's job step as ``repro plan`` shows it: srun's environment, argv and --multi-prog file and the
    telemetry sampler's step (pyxis, apptainer), or srun running the agent and each node's ``docker create``
    (docker)."""
    names = [p.command.node.name for p in plans]
    conf = "RUN_DIR/cells/" + cell.key + "/rN/multi-prog.conf"
    if runtime == "docker":
        agent = srun_argv("JOBID", names, f"repro-{cell.key}", host_export(None, cfg))
        lines = [f"  $ {shlex.join(agent[:-1])} <repro/run/schedulers/agent.py> < SPEC"]
        spec = step_spec(plans, "RUN", cell, image, {}, None)
        for i, rank in enumerate(spec["ranks"]):
            lines.append(f"  task {i} on {rank['node']}: docker create --name "
                         f"{rank['name']} {shlex.join(redact_argv(rank['create']))}")
        return lines
    head = pyxis_head("JOBID", names, f"repro-{cell.key}")
    per_node = pyxis_tasks_per_node(manifest, cell)
    site = StepSite(clean_environ(), cfg, hosts.gpus or cell.gpus_per_node, f"CPUS_PER_NODE/{per_node}")
    if runtime == "apptainer":
        sif = sif_path(str(cfg.get("sif_dir", "SIF_DIR")), "RUN")
        argv, env, text = apptainer_step(manifest, cell, plans, sif, head, conf,
                                         mpi=str(cfg.get("mpi", "pmix")), per_node=per_node, site=site)
    else:
        argv, env, text = pyxis_step(manifest, cell, plans, image, head, conf,
                                     mpi=str(cfg.get("mpi", "pmix")), image_env={"PATH": "IMAGE_PATH"},
                                     site=site)
    lines = [f"  env {k}={shell_word(v)}" for k, v in sorted(redact_env(env).items())]
    lines.append(f"  $ {shlex.join(redact_argv(argv))}")
    if text is not None:
        lines.append("  multi-prog.conf:")
        lines += [f"    {redact_text(ln)}" for ln in text.splitlines()]
    sampler = shown_sampler(sampler_srun("JOBID", names, f"repro-{cell.key}-telemetry",
                                         manifest.launch.timeout_s, export=host_export(None, cfg)))
    return lines + ["  telemetry (a job step of its own beside it, on each host, no container):",
                    "    $ " + " ".join(w if w == SHOWN else shlex.quote(w) for w in sampler)]


def shell_word(value: str) -> str:
    """``value`` as one word bash reads back exactly, on one line: shlex.quote, or where it holds a control
    character (a line break would read as another command), bash's ``$'...'`` with that character escaped."""
    if not any(ord(c) < 32 or ord(c) == 127 for c in value):
        return shlex.quote(value)
    return "$'" + "".join(c if 32 <= ord(c) != 127 and c not in "\\'" else f"\\x{ord(c):02x}"
                          for c in value) + "'"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: redact_argv([f"{k}={v}"])[0].partition("=")[2] for k, v in env.items()}
