"""What reaches a rank under the test cluster's Slurm + pyxis (2 nodes), for real (issue 35, items 1, 2, 5, 6):

- attached: a login shell's ``PYTHONPATH``, ``LD_PRELOAD``, ``NCCL_DEBUG_SUBSYS``, ``UCX_TLS`` and a
  ``PYXIS_CONTAINER_MOUNTS`` do not reach a rank or its container; a pass-through name does; a ``module``-like
  prelude (a shell function from a file the hosts file names) runs before the step and what it sets reaches
  the ranks through the pass-through list; each rank keeps every CPU Slurm gave its node (``--cpu-bind=none``,
  as the plan says for a one-launcher-a-node target);
- detached: the same environment rule in the batch script's steps;
- every other step the kit starts (the image import, the telemetry sampler, the detached script's shared and
  probe steps) names what it passes too (``--export=``): none of the login shell's variables above, and the
  import and the sampler still work with what they are given;
- a pass-through name that looks secret (``REPRO_SITE_TOKEN``) reaches the ranks, and its value, which each
  rank also prints bare, is in no file of the run directory once the run is judged: attached as it runs,
  detached once ``repro report`` judged it from a shell without it (the kept batch script included);
- what each rank said of itself in its container (its locked-memory limit, its CPUs, its environment) is in
  the provenance with its command, attached and detached, as the rank's own probe lines say it;
- a cell that asks for unlimited locked memory, with the submitting process under 64 KiB: each rank gets its
  node's limit (srun propagates every limit but MEMLOCK), and since the test cluster's nodes give 8 MiB, the
  check inside the container stops the cell with that value and the fix.

Each rank prints what it sees before torchrun starts (the probe target's command is wrapped), into its own
log in the run directory. Minutes on the test cluster: about 3 for the attached run (one import, one 2-node
repeat), 3 for the detached one, 3 for the locked-memory one.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slurm, pytest.mark.pyxis]
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
CA = Path("/etc/ssl/certs/ca-certificates.crt")
CELL = "2n1g-fp32-bs8"
#: what each rank prints before torchrun: no braces (the launcher fills {NAME}), no single quote
PROBE = ('echo "repro-probe cpus $(grep Cpus_allowed_list /proc/self/status | cut -f2)"; '
         'echo "repro-probe cpus-on-node $SLURM_CPUS_ON_NODE"; echo "repro-probe memlock $(ulimit -l)"; '
         'echo "repro-probe leak $(ls -d /mnt/repro-leak 2>/dev/null || echo none)"; '
         'echo "repro-probe bare $REPRO_SITE_TOKEN"; '
         'env | sort | sed "s/^/repro-env /"; exec "$@"')
#: a login node's LD_PRELOAD names a library that is there (a missing one makes every process of the login
#: shell, srun included, print ld.so's complaint)
PRELOAD = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6") if Path(p).is_file())
LEAKS = {"PYTHONPATH": f"{ROOT}:/opt/repro-leak/py", "LD_PRELOAD": PRELOAD,
         "NCCL_DEBUG_SUBSYS": "REPRO_LEAK", "UCX_TLS": "repro-leak", "PYXIS_CONTAINER_MOUNTS": "/etc:/mnt/repro-leak",
         "REPRO_SITE_VALUE": "through", "REPRO_SITE_TOKEN": "repro-site-secret-0123456789"}
SECRET = LEAKS["REPRO_SITE_TOKEN"]
#: the site's ``module``: a shell function from a file the prelude sources
MODULES_SH = 'module() { if [ "$1" = load ]; then SITE_MODULE="$2"; export SITE_MODULE; fi; }\n'


@pytest.fixture(scope="module")
def env(cluster: dict) -> dict[str, str]:
    enroot_dir = str(Path(cluster["pyxis"]["enroot"]).parent)
    return {**os.environ, "DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"],
            "SLURM_CONF": cluster["slurm_conf"], "PYTHONUNBUFFERED": "1",
            "PATH": f"{enroot_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", **LEAKS}


@pytest.fixture(scope="module")
def targets(cpu_torch: dict, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> dict[str, Path]:
    """torch-rn50-cpu on the session's cpu-torch base, each rank's command after PROBE; ``memlock``: the same
    asking for unlimited locked memory (as an RDMA cell does)."""
    d = tmp_path_factory.mktemp("site-env-targets")
    out = {}
    for key, port, memlock in (("probe", 29577, 8388608), ("memlock", 29578, -1)):
        doc = yaml.safe_load(cpu_torch["manifest"].read_text())
        doc["id"] = f"site-env-{key}"
        doc["launch"]["master_port"] = port
        doc["launch"]["command"] = ["sh", "-c", PROBE, "sh", *doc["launch"]["command"]]
        doc["launch"]["container"]["ulimits"] = {"memlock": memlock}
        path = d / f"site-env-{key}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        subprocess.run([sys.executable, "-m", "repro", "lock", str(path)], check=True, capture_output=True,
                       cwd=ROOT, env=env)
        out[key] = path
    return out


def inventory(cluster: dict, folder: Path) -> Path:
    """The cluster's nodes under pyxis, the pass-through list and the prelude (its file where every node and
    the batch host see it: the test's folder, as the run directory); each node imports the image into its own
    node-local folder (``/tmp`` is one folder for both nodes of the test cluster)."""
    (folder / "modules.sh").write_text(MODULES_SH)
    image_dir = f"{cluster['pyxis']['node_local']}/tmp/repro-site-env-{folder.name}"
    section = {"kind": "slurm", "partition": "debug", "time": "15", "container": "pyxis", "keep_image": "no",
               "image_dir": image_dir, "export": ["REPRO_SITE_VALUE", "SITE_MODULE", "REPRO_SITE_TOKEN"]}
    f = folder / "hosts.yaml"
    f.write_text(Path(cluster["hosts_file"]).read_text() + "scheduler: " + json.dumps(section) + "\n"
                 + "prelude: " + json.dumps([f". {folder / 'modules.sh'}"]) + "\nmodules: [site-mpi]\n")
    return f


def up(target: Path, hosts: Path, out: Path, cluster: dict, env: dict[str, str], *more: str,
       preexec=None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "repro", "up", str(target), "--hosts", str(hosts), "--out", str(out),
            "--cells", "nodes=2", "--repeats", "1", "--wheels", str(WHEELS),
            "--push", f"{cluster['registry']}/repro-test", *(["--ca-bundle", str(CA)] if CA.is_file() else []),
            *more]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1500,
                          preexec_fn=preexec)


def seen(log: Path) -> tuple[dict[str, str], dict[str, str]]:
    """What a rank printed before torchrun: its probe lines and its environment."""
    probe, environ = {}, {}
    for ln in log.read_text().splitlines():
        if ln.startswith("repro-probe "):
            k, _, v = ln[len("repro-probe "):].partition(" ")
            probe[k] = v
        elif ln.startswith("repro-env "):
            k, _, v = ln[len("repro-env "):].partition("=")
            environ[k] = v
    return probe, environ


def cpu_count(listing: str) -> int:
    """CPUs of a ``Cpus_allowed_list`` (``0-3,8``)."""
    n = 0
    for part in listing.split(","):
        a, _, b = part.partition("-")
        n += int(b or a) - int(a) + 1
    return n


def check_rank_env(logs: Path) -> list[tuple[dict[str, str], dict[str, str]]]:
    ranks = sorted(logs.glob("*.log"))
    assert [p.name for p in ranks] == ["0-rc-node1.log", "1-rc-node2.log"]
    out = [seen(p) for p in ranks]
    for probe, environ in out:
        assert probe["leak"] == "none", probe  # PYXIS_CONTAINER_MOUNTS changed no container
        assert "repro-leak" not in environ.get("PYTHONPATH", "") and "LD_PRELOAD" not in environ
        assert "NCCL_DEBUG_SUBSYS" not in environ and "UCX_TLS" not in environ
        assert environ["REPRO_SITE_VALUE"] == "through"  # named by the hosts file's scheduler.export
        assert environ["SITE_MODULE"] == "site-mpi"  # set by the prelude's `module load site-mpi`
        assert "REPRO_SITE_TOKEN" in environ and probe["bare"]  # a secret-looking pass-through reaches it
    return out


def exported(argv: list[str]) -> set[str]:
    """The names an srun argv's ``--export=`` passes (``PATH=VALUE`` as PATH); none of the login shell's."""
    (option,) = [a for a in argv if a.startswith("--export=")]
    names = {w.partition("=")[0] for w in option[len("--export="):].split(",")}
    assert not names & {"PYTHONPATH", "LD_PRELOAD", "NCCL_DEBUG_SUBSYS", "UCX_TLS", "PYXIS_CONTAINER_MOUNTS",
                        "DOCKER_HOST"}, option
    return names


def check_seen(run: Path, ranks: list[tuple[dict[str, str], dict[str, str]]]) -> None:
    """Each command of the cell in the provenance holds what its rank saw, as the rank's probe printed it."""
    prov = json.loads((run / "provenance.json").read_text())
    cmds = sorted((c for c in prov["commands"] if c["cell"] == CELL), key=lambda c: c["rank"])
    assert len(cmds) == 2, cmds
    for cmd, (probe, environ) in zip(cmds, ranks):
        (seen,) = cmd["seen"]
        assert seen["rank"] == cmd["rank"] and seen["cpus"]["list"] == probe["cpus"], (seen, probe)
        assert seen["cpus"]["count"] == cpu_count(probe["cpus"]) and str(seen["memlock_kib"]) == probe["memlock"]
        assert seen["env"]["REPRO_SITE_VALUE"] == "through" and seen["env"]["REPRO_SITE_TOKEN"] == "<redacted>"
        assert "LD_PRELOAD" not in seen["env"] and seen["env"]["SITE_MODULE"] == environ["SITE_MODULE"]


def nowhere_in(run: Path, value: str) -> None:
    """``value`` in no file of the run directory."""
    found = [str(f.relative_to(run)) for f in run.rglob("*") if f.is_file() and value.encode() in f.read_bytes()]
    assert not found, found


def test_attached_what_reaches_a_rank_its_cpus_and_the_prelude(cluster, env, targets, tmp_path):
    done = up(targets["probe"], inventory(cluster, tmp_path), tmp_path / "runs", cluster, env)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    ranks = check_rank_env(run / "cells" / CELL / "r1")
    prov = json.loads((run / "provenance.json").read_text())
    step = next(s for s in prov["scheduler"][0]["steps"] if s["cell"] == CELL)
    assert "--cpu-bind=none" in step["srun"] and step["srun"][:2] == ["sh", "-c"]  # after the prelude
    for probe, _ in ranks:  # every CPU Slurm gave the node, as the plan's --cpu-bind=none says
        assert cpu_count(probe["cpus"]) >= int(probe["cpus-on-node"]), probe
    # the sampler's step names what it passes, and sampled on both nodes with it
    assert {"PATH", "HOME", "USER", "REPRO_SITE_TOKEN"} <= exported(step["telemetry"]["srun"])
    assert all((run / "cells" / CELL / "r1" / f"telemetry-rc-node{i}.txt").stat().st_size for i in (1, 2))
    nowhere_in(run, SECRET)
    check_seen(run, ranks)


def test_detached_what_reaches_a_rank(cluster, env, targets, tmp_path):
    done = up(targets["probe"], inventory(cluster, tmp_path), tmp_path / "runs", cluster, env, "--detach")
    assert done.returncode == 0, done.stderr[-3000:]
    run = Path(done.stdout.splitlines()[1].split(" ", 2)[2])
    deadline = time.monotonic() + 1800
    while True:
        status = subprocess.run([sys.executable, "-m", "repro", "status", str(run), "--format", "json"],
                                capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        doc = json.loads(status.stdout)
        if doc["over"]:
            break
        assert time.monotonic() < deadline, doc
        time.sleep(2)
    assert doc["end"][0] == 0, doc
    script = (run / "job" / "batch.sbatch").read_text()
    steps = [ln for ln in script.splitlines() if re.search(r"(^|[ (])srun --", ln)]
    assert len(steps) >= 5 and all(" --export=" in ln for ln in steps), steps  # shared, image, probe, ...
    for ln in steps:
        exported(ln.split())
    assert (run / "job" / "probe" / "0-rc-node1.out").stat().st_size  # the probe step ran with its list
    ranks = check_rank_env(run / "cells" / CELL / "r1")
    # judged from a shell without the token: what the ranks printed of it is scrubbed all the same
    judge = {k: v for k, v in env.items() if k != "REPRO_SITE_TOKEN"}
    report = subprocess.run([sys.executable, "-m", "repro", "report", str(run)], capture_output=True, text=True,
                            env=judge, cwd=ROOT, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    nowhere_in(run, SECRET)
    check_seen(run, ranks)


def test_a_rank_gets_the_nodes_locked_memory_never_the_submitting_processs(cluster, env, targets, tmp_path):
    """The cell asks for unlimited locked memory (as an RDMA cell does); ``repro up`` runs under 64 KiB. srun
    propagates every limit but MEMLOCK, so each rank gets its node's limit, not 64 KiB; the test cluster's slurmd
    has 8 MiB (its hard limit here, which this machine cannot raise; a GPU node's slurmd.service gives infinity),
    so the check inside the container stops the cell before the target starts, with the value and the fix."""
    def low() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))

    node_kib = {int(ln.split()[3]) // 1024 for pid in subprocess.run(["pgrep", "-x", "slurmd"], capture_output=True,
                                                                       text=True).stdout.split()
                for ln in Path(f"/proc/{pid}/limits").read_text().splitlines() if ln.startswith("Max locked memory")}
    assert len(node_kib) == 1 and node_kib != {64}, node_kib
    done = up(targets["memlock"], inventory(cluster, tmp_path), tmp_path / "runs", cluster, env, preexec=low)
    assert done.returncode == 5, done.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    said = "".join(f.read_text(errors="replace") for f in (run / "cells" / CELL).rglob("*") if f.is_file())
    seen_kib = {int(k) for k in re.findall(r"locked memory is limited to (\d+) KiB in the container", said)}
    assert seen_kib == node_kib, said[-3000:]  # the node's limit reached every rank; 64 KiB reached none
    assert "LimitMEMLOCK=infinity" in said and "PropagateResourceLimitsExcept=MEMLOCK" in said
    assert not re.search(r"^(\d+: )?repro-probe ", said, re.M)  # stopped before the target's command printed
    record = json.loads((run / "provenance.json").read_text())
    step = next(s for s in record["scheduler"][0]["steps"] if s["cell"] == CELL)
    assert "--propagate=AS,CORE,CPU,DATA,FSIZE,NOFILE,NPROC,RSS,STACK" in step["srun"]
