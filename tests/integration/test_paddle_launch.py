"""The paddle launch kind for real: paddle-rn50-cpu across the two namespace nodes of the test cluster.

The image is built through the kit (``repro.images.prepare``) from a copy of the shipped
manifest whose base is the cluster's Debian image, pushed to the cluster's registry and
pulled by the nodes. Then the 2-node cell runs with ``launch_cell``: the same
``python -m paddle.distributed.launch --ips=a,b`` command on both nodes, the launcher taking
each node's rank from the node's own address (``with_node_address.py`` hands it over as
POD_IP, since the nodes' hostnames resolve nowhere; see the manifest's notes). Ten steps of
two 32x32 images keep the cell short.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import docker
import pytest

from repro.spec.hosts import load_hosts
from repro.images import BuildOptions, ImagesOptions, prepare
from repro.run.cell import CellJob
from repro.run.launch import launch_cell
from repro.spec.manifest import load_manifest
from repro.measure.protocol import Protocol, measure
from repro.measure.parsers import parse_file

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
CA = Path(os.environ.get("REPRO_TEST_CA", "/etc/ssl/certs/ca-certificates.crt"))
#: paddle needs no local wheel; the directory `repro up` gets is passed anyway so that the build's
#: context, and so its layer cache, is the one a `repro up paddle-rn50-cpu --wheels DIR` made
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
SHIPPED_BASE = "127.0.0.1:5000/repro-test/debian:bookworm"


@pytest.fixture(scope="module")
def target(cluster: dict, module_track, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """paddle-rn50-cpu with the cluster's pinned base, a tag of the test's own, 10 steps of 2 32x32 images."""
    text = (ROOT / "manifests" / "paddle-rn50-cpu.yaml").read_text(encoding="utf-8")
    swaps = {
        f'base: {{ref: "{SHIPPED_BASE}", digest: ""}}':
            f'base: {{ref: "{cluster["base_image"]}", digest: "{cluster["base_digest"]}"}}',
        'tag: "repro/cpu-paddle:3.3.1"': f'tag: "repro-test/cpu-paddle-{module_track.run_id}:3.3.1"',
        '--steps, "15"': '--steps, "10"',
        '--image-size, "64"': '--image-size, "32"',
        "batch_size: [8]": "batch_size: [2]",
    }
    for old, new in swaps.items():
        assert text.count(old) == 1, f"the shipped manifest changed: {old!r}"
        text = text.replace(old, new)
    path = tmp_path_factory.mktemp("paddle") / "paddle-rn50-cpu.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def image(cluster: dict, target: Path, engine: docker.DockerClient, node_engines, module_track,
          tmp_path_factory: pytest.TempPathFactory) -> str:
    """The kit's build of cpu-paddle, pushed to the cluster registry and pulled by every node; its tag."""
    before = {i.id for i in engine.images.list(all=True)}
    manifest = load_manifest(target)
    tag = module_track.image(manifest.image["build"]["tag"])
    build = BuildOptions(work_dir=tmp_path_factory.mktemp("work"), extra_labels=module_track.labels,
                         ca_bundle=CA if CA.is_file() else None, wheels=WHEELS if WHEELS.is_dir() else None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
        result = prepare(manifest, load_hosts(Path(cluster["hosts_file"])),
                         ImagesOptions(push=f"{cluster['registry']}/repro-test", build=build), client=engine)
    assert result.pushed is not None
    module_track.push(result.pushed.repository, result.pushed.digest)
    module_track.image(result.pushed.tagged)
    for node in node_engines:
        module_track.image(tag, node)
        module_track.image(result.pushed.tagged, node)
    # stage images this build added to the engine's cache go too; cache that was there before stays
    for stage in result.built.stages if result.built else ():
        if engine.images.get(stage).id not in before:  # stages are short ids, the listing has full ones
            module_track.image(stage)
    assert [e.images.get(tag).id for e in node_engines] == [result.image_id] * len(node_engines)
    return tag


def leftovers(node_engines: list[docker.DockerClient], run_id: str) -> list[str]:
    return [c.name for e in node_engines for c in e.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"})]


def test_two_nodes_rank_from_address_and_a_paddleclas_figure(cluster, target, image, clients, node_engines,
                                                             module_track, tmp_path):
    manifest = load_manifest(target)
    cell = next(c for c in manifest.cells() if c.nodes == 2)
    hosts = load_hosts(Path(cluster["hosts_file"]))
    run_id = f"t-paddle-{module_track.run_id}"
    results = launch_cell(CellJob(manifest, cell, hosts, tmp_path, run_id=run_id, clients=clients, image=image,
                          timeout_s=300))
    assert [(r.rank, r.exit_code, r.ok) for r in results] == [(0, 0, True), (1, 0, True)]
    assert results[0].command == results[1].command, "the paddle kind runs the same command on every node"
    checksums = []
    for r, node in zip(results, cluster["nodes"], strict=True):
        log = Path(r.log).read_text(encoding="utf-8")
        # the launcher took the node's own address, and the rank it gave is that address's place in --ips
        assert f"Host ip reset to {node['address']}" in log, log[-3000:]
        assert f"rank {r.rank} of 2 on {node['name']}, endpoint {node['address']}:6070" in log, log[-3000:]
        assert re.search(rf"^distributed env: PADDLE_TRAINER_ID +{r.rank}$", log, re.MULTILINE)
        checksums += re.findall(rf"^rank {r.rank} of 2: parameter checksum (\S+)$", log, re.MULTILINE)
    assert len(checksums) == 2 and checksums[0] == checksums[1], "data parallelism keeps the replicas identical"
    assert "ppcls INFO: epoch:0" not in Path(results[1].log).read_text(encoding="utf-8"), "only rank 0 logs steps"

    parsed = parse_file(results[0].log, "paddleclas")
    assert parsed.facts["gpus"] == 2 and parsed.facts["nodes"] == 2
    assert parsed.facts["batch_size"] == 2 and parsed.facts["precision"] == "fp32"
    (series,) = parsed.series
    assert len(series.values) == 10
    m = measure(series, Protocol.from_dict(manifest.measure.protocol_for(cell)), gpus=cell.gpus)
    assert m.issues == [] and m.records_used == 5
    assert m.value is not None and m.value > 0
    assert leftovers(node_engines, run_id) == []


def test_a_node_owning_none_of_the_addresses_stops_instead_of_running_as_rank_0(image, engine, module_track):
    with pytest.raises(docker.errors.ContainerError) as err:
        engine.containers.run(image, ["python", "/opt/repro/with_node_address.py", "192.0.2.1,192.0.2.2",
                                      "python", "-m", "paddle.distributed.launch", "--ips=192.0.2.1,192.0.2.2",
                                      "/opt/repro/rn50_paddle_cpu.py"],
                              network_mode="none", remove=True, labels=module_track.labels)
    assert err.value.exit_status == 2
    assert b"none of 192.0.2.1, 192.0.2.2 is an address of this node" in err.value.stderr
