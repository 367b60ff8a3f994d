"""pyxis/enroot in the test cluster's Slurm, with plain srun job steps (no kit code): what a
``container: pyxis`` run relies on, proven on the real plugin (scripts/test-cluster builds it).

- a 2-node step with ``--container-image=REGISTRY#REPO@sha256:...`` imports the image by digest from
  the cluster's plain-HTTP registry on every node, each into that node's own enroot paths;
- ``--container-name`` reuses it: no second import, the same container filesystem;
- ``--multi-prog`` gives every rank its own environment (each node's own ``POD_IP``);
- mpi4py's ``MPI_Init`` and an allreduce across 2 nodes, 4 ranks, through Slurm's PMIx
  (``srun --mpi=pmix``): Debian's python3-mpi4py uses Debian's Open MPI 4.1, built against PMIx and
  without Slurm's PMI-2 library, which refuses ``--mpi=pmi2``.

The image (Debian's python3-mpi4py on the cluster's base, with a marker of this session) is built
and pushed once, and imported on the nodes once per session; everything is removed at the end.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
import uuid
from collections.abc import Iterator

import docker
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slurm, pytest.mark.pyxis]

DOCKERFILE = """\
FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends python3-mpi4py \\
 && rm -rf /var/lib/apt/lists/*
ARG MARKER
RUN echo "$MARKER" > /etc/repro-test-marker
"""

#: rank, size, node and the allreduce of every rank's ``rank + 1``, printed by each rank
ALLREDUCE = ("from mpi4py import MPI\n"
             "c = MPI.COMM_WORLD\n"
             "s = c.allreduce(c.Get_rank() + 1, op=MPI.SUM)\n"
             "print('rank', c.Get_rank(), 'size', c.Get_size(), 'node', MPI.Get_processor_name(), 'sum', s,"
             " 'lib', MPI.Get_library_version().splitlines()[0], flush=True)\n")


def srun(env: dict[str, str], *args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["srun", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def slurm_env(cluster: dict) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": cluster["slurm_conf"]}


@pytest.fixture(scope="session")
def names(cluster: dict) -> list[str]:
    return [n["name"] for n in cluster["nodes"][:2]]


@pytest.fixture(scope="session")
def mpi_image(cluster: dict) -> Iterator[dict[str, str]]:
    """The mpi4py image, built on the main engine and pushed to the cluster's registry: its pyxis reference
    (``REGISTRY#REPO@sha256:...``) and this session's marker (what /etc/repro-test-marker holds)."""
    client = docker.DockerClient(base_url=cluster["docker_host"], timeout=900)
    marker = uuid.uuid4().hex[:12]
    repo = f"{cluster['registry']}/repro-test/pyxis-mpi4py"
    tag = f"{repo}:{marker}"
    text = DOCKERFILE.format(base=f"{cluster['base_image'].rsplit(':', 1)[0]}@{cluster['base_digest']}")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(text.encode())
        tar.addfile(info, io.BytesIO(text.encode()))
    context.seek(0)
    for chunk in client.api.build(fileobj=context, custom_context=True, tag=tag, buildargs={"MARKER": marker},
                                  network_mode="host", rm=True, forcerm=True, decode=True,
                                  labels={"repro.test": marker}):
        assert "error" not in chunk, chunk["error"]
    for chunk in client.api.push(repo, tag=marker, stream=True, decode=True):
        assert "error" not in chunk, chunk["error"]
    digest = next(d.split("@", 1)[1] for d in client.images.get(tag).attrs["RepoDigests"] if d.startswith(repo))
    yield {"ref": f"{cluster['registry']}#repro-test/pyxis-mpi4py@{digest}", "marker": marker}
    client.images.remove(tag, force=True, noprune=True)   # its apt layer stays as the next session's build cache
    req = f"http://{cluster['registry']}/v2/repro-test/pyxis-mpi4py/manifests/{digest}"
    subprocess.run(["curl", "-sf", "-X", "DELETE", req], capture_output=True, check=False, timeout=30)
    client.close()


@pytest.fixture(scope="session")
def imported(cluster: dict, slurm_env: dict[str, str], mpi_image: dict[str, str],
             names: list[str]) -> Iterator[dict]:
    """The session's one import: a 2-node step that imports the image by digest into a named container,
    writes a file into that container's filesystem and prints, per node, the marker and the container's root.
    The named container is removed from both nodes afterwards."""
    name = f"repro-test-{mpi_image['marker']}"
    proc = srun(slurm_env, "-N2", f"--nodelist={','.join(names)}", "--ntasks-per-node=1", "--label",
                f"--container-image={mpi_image['ref']}", f"--container-name={name}", "--container-writable",
                "sh", "-c", 'hostname >/written-by-first-step; echo "$(hostname) $(cat /etc/repro-test-marker)";'
                            " awk '$5 == \"/\" {print $4}' /proc/self/mountinfo", timeout=600)
    yield {"name": name, "proc": proc}
    enroot = cluster["pyxis"]["enroot"]
    srun(slurm_env, "-N2", f"--nodelist={','.join(names)}", "--ntasks-per-node=1", enroot, "remove", "-f",
         f"pyxis_{name}")


def by_rank(stdout: str) -> dict[int, list[str]]:
    """srun --label output: rank -> its lines."""
    out: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        rank, _, text = line.partition(": ")
        out.setdefault(int(rank), []).append(text)
    return out


def test_two_node_step_imports_the_image_by_digest(cluster, imported, mpi_image, names):
    proc = imported["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    # pyxis reports the import by digest once per node
    assert proc.stderr.count(f"pyxis: imported docker image: {mpi_image['ref']}") == 2, proc.stderr
    lines = by_rank(proc.stdout)
    for rank, node in enumerate(names):
        # this session's image, on that node, its root in that node's own enroot data path (node-local)
        assert lines[rank] == [f"{node} {mpi_image['marker']}",
                               f"{cluster['work_dir']}/nodes/{node}/local/enroot/data/user-0/pyxis_{imported['name']}"]


def test_container_name_reuses_the_imported_container(slurm_env, imported, mpi_image, names):
    assert imported["proc"].returncode == 0, imported["proc"].stderr[-3000:]
    proc = srun(slurm_env, "-N2", f"--nodelist={','.join(names)}", "--ntasks-per-node=1", "--label",
                f"--container-name={imported['name']}", "sh", "-c",
                'echo "$(hostname) $(cat /written-by-first-step) $(cat /etc/repro-test-marker)"')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "imported" not in proc.stderr
    # the file the first step wrote is there: the same container filesystem, not a new import (no timing
    # assertion: a step may wait for the previous job's nodes, and other test runs share the cores)
    assert by_rank(proc.stdout) == {r: [f"{n} {n} {mpi_image['marker']}"] for r, n in enumerate(names)}


def test_multi_prog_gives_each_rank_its_own_environment(cluster, slurm_env, imported, tmp_path, names):
    address = {n["name"]: n["address"] for n in cluster["nodes"]}
    conf = tmp_path / "multi-prog.conf"
    conf.write_text("".join(f"{r} env POD_IP={address[n]} printenv SLURM_PROCID SLURMD_NODENAME POD_IP\n"
                            for r, n in enumerate(names)))
    proc = srun(slurm_env, "-N2", f"--nodelist={','.join(names)}", "--ntasks-per-node=1", "--label",
                f"--container-name={imported['name']}", "--multi-prog", str(conf))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert by_rank(proc.stdout) == {r: [str(r), n, address[n]] for r, n in enumerate(names)}


def test_mpi4py_allreduce_across_two_nodes_through_pmix(slurm_env, imported, names):
    assert "pmix" in srun(slurm_env, "--mpi=list").stdout.split()
    proc = srun(slurm_env, "--mpi=pmix", "-N2", f"--nodelist={','.join(names)}", "--ntasks-per-node=2",
                f"--container-name={imported['name']}", "python3", "-c", ALLREDUCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = sorted(re.findall(r"^rank (\d+) size (\d+) node (\S+) sum (\d+) lib (.*)$", proc.stdout, re.M))
    size = 4
    assert [(int(r), int(s), int(total)) for r, s, _, total, _ in got] == \
        [(r, size, size * (size + 1) // 2) for r in range(size)]
    # two ranks on each node: the allreduce crossed the nodes
    assert sorted(node for _, _, node, _, _ in got) == sorted(names * 2)
    assert all(lib.startswith("Open MPI v4.1") for *_, lib in got), got


def test_debians_open_mpi_refuses_pmi2(slurm_env, imported, names):
    """Open MPI 4.1 as Debian builds it has no PMI-2 client (no --with-pmi): ``--mpi=pmi2`` is no way
    for this image; MPI_Init says so and the step fails."""
    assert "pmi2" in srun(slurm_env, "--mpi=list").stdout.split()
    proc = srun(slurm_env, "--mpi=pmi2", "-N2", f"--nodelist={','.join(names)}", "--ntasks-per-node=1",
                f"--container-name={imported['name']}", "python3", "-c", ALLREDUCE)
    assert proc.returncode != 0 and "rank" not in proc.stdout
    assert "build Open MPI using --with-pmi" in proc.stdout + proc.stderr
