"""The mpi launcher in an NGC-like image, for real on the namespace nodes.

The image (dockerfiles/cpu-ngc-mpi) is built by the kit once per engine (the layer cache and
the kit's "is current" check make later sessions reuse it): OpenMPI 4.1 lives only under
/usr/local/mpi and is reached through the image's ENV, as in NGC containers, and the image
has no sshd until the kit's mpi layer adds one. Two nodes run a training-shaped mpi4py
program under mpirun with the NGC TensorFlow 1 / MXNet flag shape; the ranks started
through sshd must see the image's environment. No container may survive any test.
"""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from repro.spec.hosts import load_hosts
from repro.images import BuildOptions, ImagesOptions, lock_target, prepare
from repro.run.cell import CellJob
from repro.run.launch import CellFailed, launch_cell
from repro.spec.manifest import load_manifest

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "data" / "launch" / "mpi-ngc.yaml"
NGC_PATH = "PATH=/usr/local/mpi/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def ngc_mpi(cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The NGC-like image with the kit's mpi layer, built by the kit, on every node."""
    d = tmp_path_factory.mktemp("mpi-ngc")
    path = d / "mpi-ngc.yaml"
    path.write_text(MANIFEST.read_text().replace("127.0.0.1:5000/repro-test/debian:bookworm", cluster["base_image"]))
    events: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", cluster["docker_host"])
        mp.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
        manifest = load_manifest(path)
        lock_target(manifest)
        opts = ImagesOptions(push=f"{cluster['registry']}/repro-test", build=BuildOptions())
        result = prepare(manifest, load_hosts(Path(cluster["hosts_file"])), opts,
                         progress=lambda e: events.append(e.message))
    return {"manifest": path, "image": result.reference, "image_id": result.image_id, "built": result.built,
            "events": events}


def leftovers(node_engines: list[docker.DockerClient], run_id: str) -> list[str]:
    return [c.name for e in node_engines for c in e.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"})]


def run(ngc_mpi: dict, hosts_file: Path, clients, tmp_path: Path, run_id: str, manifest_text: str | None = None,
        nodes: int = 2):
    path = ngc_mpi["manifest"]
    if manifest_text is not None:
        path = tmp_path / "variant.yaml"
        path.write_text(manifest_text)
    m = load_manifest(path)
    cell = next(c for c in m.cells() if c.nodes == nodes)
    return launch_cell(CellJob(m, cell, load_hosts(hosts_file), tmp_path / "logs", run_id=run_id, clients=clients,
                       image=ngc_mpi["image"], timeout_s=180))


def test_the_image_is_ngc_like_and_the_kit_added_sshd(ngc_mpi, engine):
    dockerfile = (ROOT / "dockerfiles" / "cpu-ngc-mpi" / "Dockerfile").read_text()
    assert "openssh" not in dockerfile.replace("openssh-server is deliberately absent", "")
    if ngc_mpi["built"] is not None:  # built in this session (else reused: the kit found it current)
        assert "building the mpi layer (sshd)" in ngc_mpi["events"]
    probe = ("test -x /usr/sbin/sshd && command -v ssh && command -v orted && echo \"$OPAL_PREFIX\" "
             "&& env -i /bin/sh -c 'command -v orted || echo no-orted-without-the-image-env'")
    out = engine.containers.run(ngc_mpi["image_id"], ["sh", "-c", probe], entrypoint=[], network_mode="none",
                                remove=True).decode()
    assert out.split() == ["/usr/bin/ssh", "/usr/local/mpi/bin/orted", "/usr/local/mpi",
                           "no-orted-without-the-image-env"]


def test_two_nodes_remote_ranks_get_the_image_env(ngc_mpi, hosts_file, clients, node_engines, tmp_path):
    head, worker = run(ngc_mpi, hosts_file, clients, tmp_path, "t-mpi-ngc")
    assert (head.role, head.exit_code, worker.role, worker.ok) == ("mpi-head", 0, "mpi-sshd", True)
    assert head.command[0] == "mpirun" and "--prefix" not in head.command  # orted found on the image's PATH
    lines = Path(head.log).read_text().splitlines()
    # -tag-output: [jobid,rank]<stdout>: after -timestamp-output's date
    rank1 = [ln.split("<stdout>:", 1)[1] for ln in lines if "[1,1]<stdout>:rank 1 of 2" in ln]
    assert rank1 == [f"rank 1 of 2 on rc-node2: {NGC_PATH} OPAL_PREFIX=/usr/local/mpi MPI=Open MPI v4.1.4"]
    assert any("[1,0]<stdout>:rank 0 of 2 on rc-node1: " + NGC_PATH in ln for ln in lines)
    for rank in (0, 1):
        assert any(f"[1,{rank}]<stdout>:rank {rank}: gradient mean 1.5000 (expected 1.5000)" in ln for ln in lines)
    assert sum("[1,0]<stdout>:step " in ln and "total_ips" in ln for ln in lines) == 4
    assert "Server listening on 10.77.0.12 port 12346" in Path(worker.log).read_text()
    assert leftovers(node_engines, "t-mpi-ngc") == []


def test_one_node_cell_runs_mpirun_alone(ngc_mpi, hosts_file, clients, node_engines, tmp_path):
    [head] = run(ngc_mpi, hosts_file, clients, tmp_path, "t-mpi-ngc-1n", nodes=1)
    assert (head.role, head.exit_code) == ("mpi-head", 0)
    assert "[1,0]<stdout>:rank 0: gradient mean 1.0000 (expected 1.0000)" in Path(head.log).read_text()
    assert leftovers(node_engines, "t-mpi-ngc-1n") == []


def test_without_the_image_env_orted_is_not_found(ngc_mpi, hosts_file, clients, node_engines, tmp_path,
                                                  monkeypatch):
    """The control: the same run with an empty session environment fails as it would without the kit."""
    monkeypatch.setattr("repro.run.launch.session_environment", lambda env: "")
    with pytest.raises(CellFailed) as err:
        run(ngc_mpi, hosts_file, clients, tmp_path, "t-mpi-ngc-bare")
    head = err.value.results[0]
    assert head.exit_code not in (0, None)
    assert "orted: command not found" in Path(head.log).read_text()
    assert leftovers(node_engines, "t-mpi-ngc-bare") == []


def test_mpirun_prefix_reaches_orted_on_its_own(ngc_mpi, hosts_file, clients, node_engines, tmp_path, monkeypatch):
    """``--prefix /usr/local/mpi`` (in launch.mpi.args) starts orted and its ranks even with a bare session."""
    monkeypatch.setattr("repro.run.launch.session_environment", lambda env: "")
    text = ngc_mpi["manifest"].read_text().replace("args: [-tag-output,", "args: [--prefix, /usr/local/mpi, -tag-output,")
    head, worker = run(ngc_mpi, hosts_file, clients, tmp_path, "t-mpi-ngc-prefix", text)
    assert head.command[head.command.index("--prefix") + 1] == "/usr/local/mpi"
    assert (head.exit_code, worker.ok) == (0, True)
    lines = Path(head.log).read_text().splitlines()
    assert any("[1,1]<stdout>:rank 1: gradient mean 1.5000 (expected 1.5000)" in ln for ln in lines)
    assert leftovers(node_engines, "t-mpi-ngc-prefix") == []
