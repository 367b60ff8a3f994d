"""The job-step agent: one per node of a Slurm job step, run as ``python3 -c <this file>``.

It needs only the Python standard library and the node's ``docker`` client, because it
runs on the cluster node, not where the kit is installed. Its spec comes on stdin (srun
``--input=all``), never in argv, so per-run keys do not show in ``ps``. The task's rank is
``SLURM_NODEID`` (one task per node); the agent checks that Slurm put it on the node the
kit rendered that rank for, then creates the rank's container with the kit's labels,
copies the rank's files in, waits for the ports the rank needs, starts it attached (the
output goes to srun, which labels it with the rank) and removes it on every way out:
exit, failure, and the SIGTERM Slurm sends on scancel, a time limit or a stopped step.

Lines the kit reads start with ``##repro``: ``step JOB.STEP NODE``, ``started EPOCH``,
``exited CODE``, ``error TEXT``, ``telemetry LINE`` (a line of the telemetry sampler,
repro/nodes/sampler.py, which a spec's ``telemetry`` argv starts on the node beside the
rank's container and stops with it); with ``REPRO_MARKS=PATH`` in its environment (a detached run's
batch script) they go to the file ``PATH-RANK.marks`` instead, so the rank's output file holds its
output alone. With ``{"sweep": RUN_ID}`` it only removes every
container labelled with that run on its node; with ``{"probe": true}`` it prints what the
node offers a job step (``probe JSON``: its engine, CPUs, GPU and InfiniBand devices).
"""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time

MARK = "##repro"


def say(*words):
    line = " ".join([MARK, *map(str, words)]) + "\n"
    if os.environ.get("REPRO_MARKS"):
        with open(os.environ["REPRO_MARKS"] + "-" + os.environ.get("SLURM_NODEID", "0") + ".marks", "a") as f:
            f.write(line)
        return
    sys.stdout.write(line)
    sys.stdout.flush()


def docker(env, *args, **kw):
    return subprocess.run(["docker", *args], env=env, **kw)


def tar_of(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in sorted({os.path.dirname(p) for p in files}):
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(info)
        for path, (text, mode) in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def wait_ports(ports, seconds):
    deadline = time.monotonic() + seconds
    for host, port in ports:
        while True:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    return f"{host}:{port} did not accept connections in {seconds} s"
                time.sleep(0.1)
    return None


def sample(argv, container):
    """The telemetry sampler on this node, its lines marked for the kit; None without one."""
    if not argv:
        return None
    say("telemetry", "containers", container)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
    except OSError:
        return None

    def copy():
        for line in proc.stdout:
            say("telemetry", line.rstrip("\n"))

    threading.Thread(target=copy, daemon=True).start()
    return proc


def unsample(proc):
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


def main():
    spec = json.loads(sys.stdin.read())
    # the node's own engine: a DOCKER_HOST exported from where srun ran names another machine's
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    if spec.get("probe"):
        engine = docker(env, "version", "--format", "{{.Server.Version}}", capture_output=True, text=True)
        say("probe", json.dumps({
            "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
            "docker": engine.stdout.strip() if engine.returncode == 0 else None,
            "docker_error": " ".join(engine.stderr.split()) if engine.returncode != 0 else None,
            "cpus": os.cpu_count(),
            "gpus": len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()]),
            "infiniband": os.path.isdir("/dev/infiniband")}, sort_keys=True))
        return 0
    if "sweep" in spec:
        ids = docker(env, "ps", "-aq", "--filter", "label=repro.run=" + spec["sweep"],
                     capture_output=True, text=True).stdout.split()
        if ids:
            docker(env, "rm", "-f", *ids, capture_output=True)
        say("swept", len(ids))
        return 0
    rank = int(os.environ["SLURM_NODEID"])
    me = spec["ranks"][rank]
    here = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    say("step", os.environ.get("SLURM_JOB_ID", "?") + "." + os.environ.get("SLURM_STEP_ID", "?"), here)
    if here != me["node"]:
        say("error", f"rank {rank} was rendered for {me['node']} but Slurm started it on {here}")
        return 2
    name, sampler = me["name"], [None]

    def stop(signum, _frame):
        unsample(sampler[0])
        docker(env, "rm", "-f", name, capture_output=True)
        say("exited", "signal", signum)
        os._exit(0 if me["role"] == "mpi-sshd" else 128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, stop)
    created = docker(env, "create", "--name", name, *me["create"], capture_output=True, text=True)
    if created.returncode != 0:
        say("error", "docker create failed: " + " ".join(created.stderr.split()))
        return 1
    try:
        if me.get("files"):
            copied = docker(env, "cp", "-", name + ":/", input=tar_of(me["files"]), capture_output=True)
            if copied.returncode != 0:
                say("error", "docker cp failed: " + " ".join(copied.stderr.decode(errors="replace").split()))
                return 1
        late = wait_ports(me.get("wait_for", []), spec.get("ready_s", 60))
        if late:
            say("error", late)
            return 1
        sampler[0] = sample(spec.get("telemetry"), created.stdout.strip())
        say("started", f"{time.time():.6f}")
        code = docker(env, "start", "--attach", name).returncode
        say("exited", code)
        return code
    finally:
        unsample(sampler[0])
        docker(env, "rm", "-f", name, capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
