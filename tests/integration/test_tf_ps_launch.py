"""The tf-ps launch kind for real: tf-cnn-ps-cpu across the two namespace nodes of the test cluster.

The image is built through the kit (``repro.images.prepare``) from a copy of the shipped
manifest whose base is the cluster's Debian image: tensorflow-cpu and tf-keras from the package
index, tf_cnn_benchmarks at the manifest's commit (fetched from GitHub, or from the git
mirror ``REPRO_TEST_GIT_MIRROR`` names as ``PREFIX=URL``, e.g.
``https://github.com/tensorflow/benchmarks=/srv/mirrors/benchmarks.git``), pushed to the
cluster's registry and pulled by the nodes, and kept there under its shipped tag, so that a
later run finds it in place and moves no image. Then the 2-node cell runs with ``launch_cell``:
on each node a parameter server and a worker of tf_cnn_benchmarks' own code,
distributed_replicated over gRPC between the nodes. The test swaps ResNet-50 for
tf_cnn_benchmarks' ``trivial`` model and runs 6 steps, to keep it short.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import docker
import pytest

from repro.spec.hosts import load_hosts
from repro.images import BuildOptions, ImagesOptions, prepare
from repro.images.source import parse_mirror
from repro.run.cell import CellJob
from repro.run.launch import launch_cell
from repro.spec.manifest import load_manifest
from repro.measure.protocol import Protocol, measure
from repro.measure.parsers import parse_file

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.upstream]
ROOT = Path(__file__).resolve().parents[2]
CA = Path(os.environ.get("REPRO_TEST_CA", "/etc/ssl/certs/ca-certificates.crt"))
MIRROR = os.environ.get("REPRO_TEST_GIT_MIRROR", "")
SHIPPED_BASE = "127.0.0.1:5000/repro-test/debian:bookworm"


def shipped_on(cluster: dict) -> str:
    """The shipped manifest's text on this cluster's pinned base."""
    text = (ROOT / "manifests" / "tf-cnn-ps-cpu.yaml").read_text(encoding="utf-8")
    old = f'base: {{ref: "{SHIPPED_BASE}", digest: ""}}'
    assert text.count(old) == 1, "the shipped manifest changed"
    return text.replace(old, f'base: {{ref: "{cluster["base_image"]}", digest: "{cluster["base_digest"]}"}}')


@pytest.fixture(scope="module")
def image(cluster: dict, engine: docker.DockerClient, node_engines, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The kit's build of cpu-tf under its shipped tag, in the cluster registry and on every node.

    Like the cpu-torch image, it is kept between runs: the next run finds it current, in the
    registry and on the nodes, and moves no 2.4 GB image again.
    """
    path = tmp_path_factory.mktemp("tfps-image") / "tf-cnn-ps-cpu.yaml"
    path.write_text(shipped_on(cluster), encoding="utf-8")
    manifest = load_manifest(path)
    build = BuildOptions(work_dir=tmp_path_factory.mktemp("work"), ca_bundle=CA if CA.is_file() else None,
                         git_mirrors=(parse_mirror(MIRROR),) if MIRROR else ())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
        result = prepare(manifest, load_hosts(Path(cluster["hosts_file"])),
                         ImagesOptions(push=f"{cluster['registry']}/repro-test", build=build), client=engine)
    assert [e.images.get(result.reference).id for e in node_engines] == [result.image_id] * len(node_engines)
    return result.reference


@pytest.fixture(scope="module")
def target(cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's manifest: tf_cnn_benchmarks' trivial model for 6 steps instead of ResNet-50 for 10."""
    text = shipped_on(cluster)
    for old, new in {"--model=resnet50,": "--model=trivial,", "--num_batches=10,": "--num_batches=6,"}.items():
        assert text.count(old) == 1, f"the shipped manifest changed: {old!r}"
        text = text.replace(old, new)
    path = tmp_path_factory.mktemp("tfps") / "tf-cnn-ps-cpu.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_two_nodes_a_parameter_server_and_a_worker_each(cluster, target, image, clients, node_engines,
                                                        module_track, tmp_path):
    manifest = load_manifest(target)
    cell = next(c for c in manifest.cells() if c.nodes == 2)
    hosts = load_hosts(Path(cluster["hosts_file"]))
    run_id = f"t-tfps-{module_track.run_id}"
    results = launch_cell(CellJob(manifest, cell, hosts, tmp_path, run_id=run_id, clients=clients, image=image,
                          timeout_s=420))
    assert [(r.rank, r.exit_code, r.ok) for r in results] == [(0, 0, True), (1, 0, True)]
    workers = ",".join(f"{n['address']}:42210" for n in cluster["nodes"])
    ps = ",".join(f"{n['address']}:42211" for n in cluster["nodes"])
    for r in results:
        argv = list(r.command)
        assert f"--worker_hosts={workers}" in argv and f"--ps_hosts={ps}" in argv
        assert argv.count(f"--task_index={r.rank}") == 2 and "--job_name=ps" in argv and "--job_name=worker" in argv
        log = Path(r.log).read_text(encoding="utf-8")
        assert "Running parameter server" in log, log[-3000:]  # the ps of this node ran beside its worker
        assert re.search(r"^Variables: +distributed_replicated$", log, re.MULTILINE), log[-3000:]
        assert f"/job:worker/replica:0/task:{r.rank}/cpu:0" in log, log[-3000:]
        assert re.search(r"^total images/sec: [0-9.]+$", log, re.MULTILINE), log[-3000:]
    parsed = parse_file(results[0].log, "tf-cnn-benchmarks")
    assert parsed.facts["batch_size"] == 4
    (series,) = parsed.series
    assert len(series.values) == 6 and series.summary is not None and series.summary > 0
    m = measure(series, Protocol.from_dict(manifest.measure.protocol_for(cell)), gpus=cell.gpus)
    assert m.value == series.summary
    left = [c.name for e in node_engines for c in e.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"})]
    assert left == []
