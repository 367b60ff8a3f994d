"""The probes against real components.

Container probe: four images, each with the CPU build of one framework (torch,
paddlepaddle, tensorflow-cpu, mxnet 1.9.1 with numpy<1.24), built FROM the test
cluster's local Debian base with dockerfiles/cpu-frameworks; the probe must report
the versions pip installed. Host probe: run over SSH on the test cluster's namespace
nodes; it must see each node's own hostname and Docker engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "dockerfiles" / "cpu-frameworks"
CA_BUNDLE = Path(os.environ.get("REPRO_TEST_CA", "/etc/ssl/certs/ca-certificates.crt"))
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
SOURCE_COMMIT = "0123456789abcdef0123456789abcdef01234567"

#: framework -> build arguments, local wheels it needs, the module and version the probe must report
FRAMEWORKS: dict[str, dict[str, Any]] = {
    "torch": {"packages": "torch==2.13.0+cpu", "wheels": "torch-2.13.0+cpu-*.whl", "version": "2.13.0+cpu"},
    "paddle": {"packages": "paddlepaddle==3.3.1", "version": "3.3.1"},
    "tensorflow": {"packages": "tensorflow-cpu==2.21.0", "version": "2.21.0"},
    # the smallest image also carries the distribution's verbs library, for the rdma-core probe
    # mxnet's bundled libgfortran needs libquadmath, which the minimal base lacks
    "mxnet": {"packages": "mxnet==1.9.1 numpy<1.24", "version": "1.9.1",
              "apt": "libquadmath0 libibverbs1 ibverbs-providers"},
}


def _context(dest: Path, spec: dict[str, Any], git_source: bool) -> Path:
    shutil.copytree(DOCKERFILE, dest)
    shutil.copyfile(CA_BUNDLE, dest / "repro-ca.crt")
    (dest / "wheels").mkdir()
    if spec.get("wheels"):
        found = sorted(WHEELS.glob(spec["wheels"]))
        if not found:
            pytest.fail(f"no {spec['wheels']} in {WHEELS} (set REPRO_TEST_WHEELS)", pytrace=False)
        os.link(found[-1], dest / "wheels" / found[-1].name) if found[-1].stat().st_dev == dest.stat().st_dev \
            else shutil.copyfile(found[-1], dest / "wheels" / found[-1].name)
    src = dest / "source"
    src.mkdir()
    if git_source:
        # a real checkout (no git in the image: the probe reads .git itself)
        (src / "train.py").write_text("print('hello')\n")
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
               "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}
        for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "x"]):
            subprocess.run(["git", *args], cwd=src, env=env, check=True)
    else:
        # what the kit's image build writes into a checkout it copies without .git
        (src / ".repro-source.json").write_text(json.dumps({"repository": "https://example.org/bench.git",
                                                            "commit": SOURCE_COMMIT, "patches": []}))
    return dest


def build_framework_image(client: Any, base: str, name: str, work: Path,
                          nocache: bool = False) -> tuple[str, float, bool]:
    """Build (or reuse) the CPU image of one framework; returns (tag, seconds, reused)."""
    spec = FRAMEWORKS[name]
    args = {"BASE": base, "PACKAGES": spec["packages"], "APT_PACKAGES": spec.get("apt", "")}
    dockerfile = hashlib.sha256((DOCKERFILE / "Dockerfile").read_bytes()).hexdigest()
    key = hashlib.sha256(json.dumps([dockerfile, args, base], sort_keys=True).encode()).hexdigest()[:12]
    tag = f"repro-test/cpu-{name}:{key}"
    try:
        if not nocache:
            client.images.get(tag)
            return tag, 0.0, True
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound: build it
        pass
    ctx = _context(work / f"ctx-{name}", spec, git_source=name == "torch")
    t0 = time.monotonic()
    image_id, tail = "", []
    for chunk in client.api.build(path=str(ctx), tag=tag, buildargs=args, network_mode="host", rm=True,
                                  forcerm=True, decode=True, pull=False, nocache=nocache):
        if "error" in chunk:
            raise AssertionError(f"build of {tag} failed: {chunk['error']}\n" + "".join(tail[-30:]))
        if "stream" in chunk:
            tail.append(chunk["stream"])
        if chunk.get("aux", {}).get("ID"):
            image_id = chunk["aux"]["ID"]
    assert image_id, f"build of {tag} gave no image ID"
    shutil.rmtree(ctx, ignore_errors=True)
    return tag, time.monotonic() - t0, False


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def engine(cluster: dict) -> Any:
    import docker

    return docker.DockerClient(base_url=cluster["docker_host"], timeout=1800)


@pytest.fixture(scope="module")
def images(engine: Any, cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The four framework images (built once; a rebuild happens only when the Dockerfile changes)."""
    work = tmp_path_factory.mktemp("framework-images")
    out, times = {}, {}
    for name in FRAMEWORKS:
        tag, seconds, reused = build_framework_image(engine, cluster["base_image_local"], name, work)
        out[name] = tag
        times[name] = "reused" if reused else f"{seconds:.0f} s"
    print(f"framework images: {times}")
    return out


def _in_image(engine: Any, tag: str, code: str) -> str:
    out = engine.containers.run(tag, ["python3", "-c", code], remove=True, network_mode="none")
    return out.decode().strip()


# ------------------------------------------------------------------ container probe
PIP_NAME = {"torch": "torch", "paddle": "paddlepaddle", "tensorflow": "tensorflow-cpu", "mxnet": "mxnet"}


@pytest.mark.docker
@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_probe_reports_the_installed_framework(engine: Any, images: dict[str, str], name: str) -> None:
    from repro.nodes.facts import probe_container

    tag = images[name]
    probe = probe_container(engine, tag, sources=["/workspace/source", "/nowhere"], timeout_s=600)
    doc = probe["value"]
    assert doc is not None, probe["reason"]
    fw = doc["frameworks"][name]
    assert fw["reason"] is None, fw["reason"]
    # the truth, asked independently of the probe: the installed distribution's metadata
    truth = _in_image(engine, tag, f"import importlib.metadata as m; print(m.version({PIP_NAME[name]!r}))")
    assert fw["value"]["version"] == truth == FRAMEWORKS[name]["version"]
    frozen = {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower(): line.split("==", 1)[-1]
              for line in doc["pip_freeze"]["value"]}
    assert frozen[PIP_NAME[name]] == truth
    others = {k: v for k, v in doc["frameworks"].items() if k != name}
    assert all(v["value"] is None and v["reason"].startswith("not installed") for v in others.values())
    build = fw["value"]["build"]
    if name == "torch":
        assert build["cuda"] is None and build["cuda_available"] is False and "nccl" not in build
    elif name == "tensorflow":
        assert build["build_info"]["is_cuda_build"] is False and build["git"].startswith("v2.21")
    elif name == "mxnet":
        assert "CUDA" not in build["features"] and build["cuda"] is False
        assert frozen["numpy"].startswith("1.23.")
        assert doc["rdma_core"]["value"]["version"][0].isdigit()
    elif name == "paddle":
        assert build["compiled_with_cuda"] is False and build["commit"]
    assert doc["python"]["value"]["version"].startswith("3.11")
    assert doc["os"]["value"]["id"] == "debian"
    assert doc["ofed"]["value"] is None and "not installed" in doc["ofed"]["reason"]
    assert doc["sources"]["/nowhere"] == {"value": None, "reason": "no such directory"}
    src = doc["sources"]["/workspace/source"]["value"]
    if name == "torch":  # a real .git, read without git in the image
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["how"] == ".git/refs/heads/main"
    else:
        assert src == {"commit": SOURCE_COMMIT, "repository": "https://example.org/bench.git",
                       "how": ".repro-source.json", "patches": 0}


@pytest.mark.docker
def test_build_ca_bundle_stays_out_of_the_images(engine: Any, images: dict[str, str]) -> None:
    import docker

    for tag in images.values():
        c = engine.containers.create(tag, ["true"], network_mode="none")
        try:
            with pytest.raises(docker.errors.NotFound):
                c.get_archive("/etc/ssl/certs/repro-build-ca.crt")
            with pytest.raises(docker.errors.NotFound):
                c.get_archive("/wheels")
        finally:
            c.remove(force=True)


@pytest.mark.docker
def test_probe_fails_soft_without_python(engine: Any, cluster: dict) -> None:
    from repro.nodes.facts import probe_container

    probe = probe_container(engine, "repro-test/no-such-image:none")
    assert probe["value"] is None and "no-such-image" in probe["reason"]
    bare = probe_container(engine, cluster["base_image_local"])   # Debian minbase: no Python at all
    assert bare["value"] is None and "no python3 or python" in bare["reason"]


@pytest.mark.docker
def test_a_throwaway_container_is_labelled_and_removed_however_its_block_ends(engine: Any, cluster: dict) -> None:
    import docker

    from repro.throwaway import throwaway

    run_id = "20261126T000000Z-throwaway-0a1b2c"
    with pytest.raises(RuntimeError):
        with throwaway(engine, cluster["base_image_local"], ["true"], probe="test", run_id=run_id,
                       labels={"keep": "me"}, network_mode="none") as c:
            seen = engine.containers.get(c.id).labels
            raise RuntimeError("the job failed")
    assert {k: seen[k] for k in ("keep", "repro.probe", "repro.run")} == {
        "keep": "me", "repro.probe": "test", "repro.run": run_id}
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(c.id)
    with throwaway(engine, cluster["base_image_local"], ["true"], probe="test") as c:
        c.remove(force=True)  # gone before its block ends: the removal's failure is logged, not raised
    assert engine.containers.list(all=True, ignore_removed=True, filters={"label": f"repro.run={run_id}"}) == []


# ------------------------------------------------------------------ host probe
@pytest.mark.ssh
def test_host_probe_on_the_namespace_nodes(cluster: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import docker

    from repro.spec.hosts import load_hosts
    from repro.nodes.preflight import run_preflight

    monkeypatch.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
    hosts = load_hosts(Path(cluster["hosts_file"]))
    t0 = time.monotonic()
    reports = run_preflight(hosts.nodes)   # the one script per node: preflight's checks and the host facts
    facts = {r.node: r.host for r in reports}
    seconds = time.monotonic() - t0
    for info in cluster["nodes"]:
        f = facts[info["name"]]
        assert f["hostname"]["value"] == info["name"], f["hostname"]
        assert f["kernel"]["value"]["release"] == os.uname().release
        assert f["os"]["value"]["id"] == "debian" and f["memory"]["value"]["total_bytes"] > 0
        assert f["cpu"]["value"]["logical_cpus"] == os.cpu_count()
        engine = docker.DockerClient(base_url=info["docker_host"])
        sdk = engine.info()   # the engine's own account, through its API
        assert f["docker"]["value"] == {"version": engine.version()["Version"], "storage_driver": sdk["Driver"],
                                        "runtimes": sorted(sdk["Runtimes"]), "default_runtime": sdk["DefaultRuntime"]}
        assert "runc" in f["docker"]["value"]["runtimes"]
        report = next(r for r in reports if r.node == info["name"])
        assert (report.docker.value, report.docker.detail) == (sdk["ServerVersion"], sdk["DockerRootDir"])
        engine.close()
        for missing in ("gpus", "gpu_topology", "hcas", "mlx5_core"):
            assert f[missing]["value"] is None and f[missing]["reason"], missing
    assert seconds < 60, f"host probes took {seconds:.1f} s"


@pytest.mark.ssh
def test_host_probe_refuses_unknown_host_keys(cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.spec.hosts import Node
    from repro.nodes.preflight import run_preflight

    info = cluster["nodes"][0]
    personal = Path.home() / ".ssh" / "known_hosts"   # trusted whatever the config says, as by ssh
    if personal.is_file() and info["address"] in personal.read_text():
        pytest.skip(f"{personal} already trusts {info['address']}")
    config = tmp_path / "config"   # the cluster's key, but no known_hosts
    config.write_text(f"Host {info['address']}\n  User root\n  IdentityFile {cluster['ssh']['key']}\n"
                      f"  UserKnownHostsFile {tmp_path / 'empty'}\n")
    monkeypatch.setenv("REPRO_SSH_CONFIG", str(config))
    [report] = run_preflight([Node(info["name"], info["address"], user="root")])
    reason = report.ssh.reason
    assert "unknown ssh-ed25519 host key SHA256:" in reason, reason
    assert report.host == {} and report.docker.value is None  # nothing ran on the node


# ------------------------------------------------------------------ real facts in a record
@pytest.mark.docker
@pytest.mark.ssh
def test_real_probes_make_a_valid_record(cluster: dict, engine: Any, images: dict[str, str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Host facts from the namespace nodes and the torch image's probe, sealed, archived and audited."""
    from repro.record import provenance
    from repro.record.archive import create
    from repro.record.audit import TAMPERED, audit
    from repro.spec.hosts import load_hosts
    from repro.spec.manifest import load_manifest
    from repro.nodes.preflight import run_preflight
    from repro.nodes.facts import probe_container
    from repro.run.rundir import DONE, RUNNING, RunDir

    manifest = load_manifest(ROOT / "tests" / "data" / "launch" / "echo.yaml")
    hosts = load_hosts(Path(cluster["hosts_file"]))
    run = RunDir.create(tmp_path / "logs", manifest, hosts)
    record = provenance.new_record(run, manifest, hosts)
    monkeypatch.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
    facts = {r.node: r.host for r in run_preflight(hosts.nodes)}
    image = engine.images.get(images["torch"])
    in_image = probe_container(engine, images["torch"], sources=["/workspace/source"])
    for node in hosts.nodes:
        provenance.add_node(record, node, host=facts[node.name], container=in_image,
                            image={"ref": images["torch"], "id": image.id, "digest": None,
                                   "labels": image.labels or {}})
    cell = manifest.cells()[0]
    run.set_status(cell, 1, RUNNING)
    run.write_log(cell, 1, 0, hosts.nodes[0].name, "rank 0 of 1\ndone\n")
    provenance.add_command(record, run, cell, 1, rank=0, node=hosts.nodes[0].name, role="worker",
                           argv=["sh", "-c", "echo"], env={"GREETING": "hi"}, image=image.id,
                           started=provenance.now(), ended=provenance.now(), exit_code=0)
    run.set_status(cell, 1, DONE)
    sealed = provenance.finalize(run, record)
    again = provenance.load_record(run.file("provenance.json"))
    assert again == sealed
    torch = again["nodes"][0]["container"]["value"]["frameworks"]["torch"]["value"]
    assert torch["version"] == FRAMEWORKS["torch"]["version"]
    assert [n["host"]["hostname"]["value"] for n in again["nodes"]] == [n["name"] for n in cluster["nodes"]]
    checks = audit(create(run))
    assert not [c for c in checks if c.status == TAMPERED], checks
    rows = {c.item: c for c in checks}
    assert rows["image digest"].status == "missing"   # a locally built image has no registry digest
    assert rows["SHA256SUMS"].status == "ok" and rows["provenance.intoto.json"].status == "ok"
