"""``repro images`` / ``repro lock`` against the real engine, registry and nodes of the test cluster.

The base is the cluster's Debian image (debootstrap + ``docker import``, pushed to the
cluster's registry on 127.0.0.1); the source is a local git repository. Nothing here
needs the internet except the Debian mirror (apt inside builds) and, for cpu-torch, the
package index.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from repro.errors import BuildError, EnvironmentUnavailable, ProvenanceError
from repro.spec.hosts import load_hosts, local_hosts
from repro.images import BuildOptions, ImagesOptions, ImagesResult, lock_target, prepare, registry
from repro.images.build import CA_IMAGE_PATH
from repro.images.engine import connect
from repro.images.rdma import render_rdma_layer
from repro.images.refs import parse_ref
from repro.images.sshd import render_sshd_layer
from repro.images.lock import lock_path, read_lock
from repro.spec.manifest import Manifest, load_manifest

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
CA_BUNDLE = Path(os.environ.get("REPRO_TEST_CA", "/etc/ssl/certs/ca-certificates.crt"))
WHEELS = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
ZERO = "sha256:" + "0" * 64


def repro(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, **(env or {})})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def options(track: Any, work: Path, **kw: Any) -> ImagesOptions:
    build_kw = {k: kw.pop(k) for k in ("ca_bundle", "dockerfiles", "wheels") if k in kw}
    return ImagesOptions(build=BuildOptions(work_dir=work, extra_labels=track.labels, **build_kw), **kw)


@dataclass
class Smoke:
    root: Path
    source: Any
    manifest: Manifest
    tag: str
    result: ImagesResult
    events: list[Any]


@pytest.fixture(scope="module")
def smoke(cluster: dict, engine: docker.DockerClient, module_track: Any, helpers: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Smoke:
    """cpu-smoke built once at the pinned commit of a local repository (module-wide, removed at the end)."""
    root = tmp_path_factory.mktemp("smoke")
    source = helpers.make_git_source(root / "src")
    tag = module_track.image(f"repro-test/smoke-{module_track.run_id}:pinned")
    path = helpers.write_manifest(root / "m", cluster, source, name=f"smoke-{module_track.run_id}", tag=tag)
    manifest = load_manifest(path)
    events: list[Any] = []
    result = prepare(manifest, local_hosts(), options(module_track, root / "work", mode="build"),
                     progress=events.append, client=engine)
    forget_stages(module_track, result)
    return Smoke(root, source, manifest, tag, result, events)


def forget_stages(track: Any, result: ImagesResult) -> None:
    """The earlier stages of a multi-stage build stay in the engine as cache; the tests remove theirs."""
    assert result.built is not None
    for stage in result.built.stages:
        track.image(stage)


# --- build at the pinned commit ----------------------------------------------------------------------

def test_build_pins_commit_patches_and_labels(smoke: Smoke, cluster: dict, engine: docker.DockerClient,
                                              module_track: Any, helpers: Any) -> None:
    r = smoke.result
    assert r.built is not None and r.reference == smoke.tag and engine.images.get(smoke.tag).id == r.image_id
    labels = helpers.labels_of(engine, smoke.tag)
    assert labels["org.opencontainers.image.revision"] == smoke.source.commit
    assert labels["org.opencontainers.image.source"] == str(smoke.source.path)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["org.opencontainers.image.created"])
    assert labels["repro.manifest.sha256"] == smoke.manifest.sha256
    assert labels["repro.rdma"] == "none"
    assert labels["org.opencontainers.image.base.digest"] == cluster["base_digest"]
    assert "REPRO_SMOKE_UPSTREAM_ENV=carried" in engine.images.get(smoke.tag).attrs["Config"]["Env"]  # image.build.env
    out = helpers.run_in(engine, smoke.tag, ["sh", "-c", "python3 bench/run.py; cat .repro-source.json"], module_track)
    assert out.startswith("steps 3\n"), out            # the manifest's patch is in the image
    assert json.loads(out.split("\n", 1)[1])["commit"] == smoke.source.commit
    assert "Step 1/" in r.built.log.read_text() and any(e.kind == "step" for e in smoke.events)


def test_moving_the_branch_changes_nothing(smoke: Smoke, engine: docker.DockerClient, module_track: Any,
                                           helpers: Any) -> None:
    head = smoke.source.move_branch()
    assert head != smoke.source.commit
    again = prepare(smoke.manifest, local_hosts(), options(module_track, smoke.root / "work", mode="build"),
                    client=engine)
    forget_stages(module_track, again)
    assert helpers.labels_of(engine, smoke.tag)["org.opencontainers.image.revision"] == smoke.source.commit
    out = helpers.run_in(engine, smoke.tag, ["sh", "-c", "python3 bench/run.py; ls bench"], module_track)
    assert out == "steps 3\nrun.py\n"
    # the lock records where the branch pointed; a branch that moves again is drift
    path, pins, written = lock_target(smoke.manifest)
    assert written and pins.sources["source"]["branch_commit"] == head
    moved = smoke.source.move_branch("7")
    with pytest.raises(ProvenanceError) as err:
        lock_target(smoke.manifest)
    assert head in str(err.value) and moved in str(err.value)
    path.unlink()


def test_push_remove_pull_back_by_digest(smoke: Smoke, cluster: dict, engine: docker.DockerClient,
                                         module_track: Any, helpers: Any) -> None:
    r = prepare(smoke.manifest, local_hosts(), options(module_track, smoke.root / "work", push=cluster["registry"]),
                client=engine)
    assert r.built is None and r.pushed is not None and r.pushed.digest.startswith("sha256:")
    module_track.push(r.pushed.repository, r.pushed.digest)
    module_track.image(r.pushed.tagged)
    wanted = helpers.labels_of(engine, smoke.tag)
    engine.images.remove(r.pushed.tagged)
    engine.images.remove(smoke.tag)
    with pytest.raises(docker.errors.ImageNotFound):
        engine.images.get(r.image_id)
    pulled = registry.pull(engine, r.pushed)
    assert pulled.id == r.image_id and r.pushed.pinned in pulled.attrs["RepoDigests"]
    assert pulled.labels == wanted
    engine.api.tag(r.image_id, *smoke.tag.rsplit(":", 1))  # back under the manifest's tag for what follows


# --- distribution ------------------------------------------------------------------------------------

@pytest.mark.ssh
def test_distribution_to_two_nodes(smoke: Smoke, cluster: dict, engine: docker.DockerClient,
                                   node_engines: list[docker.DockerClient], module_track: Any,
                                   cluster_env: dict[str, str]) -> None:
    hosts = load_hosts(Path(cluster["hosts_file"]))
    assert len(hosts.nodes) >= 2
    work = smoke.root / "work"
    first = prepare(smoke.manifest, hosts, options(module_track, work, push=cluster["registry"]), client=engine)
    assert {n.how for n in first.nodes} == {"pulled"}
    image_id = first.image_id
    assert [e.images.get(smoke.tag).id for e in node_engines] == [image_id] * len(node_engines)
    # a second call finds everything in place: no transfer, and quick
    timings = []
    for _ in range(3):
        again = prepare(smoke.manifest, hosts, options(module_track, work), client=engine)
        assert {n.how for n in again.nodes} == {"present"} and again.built is None
        timings.append(again.seconds)
    assert min(timings) < 2.0, timings
    # a node that lost the image, with no registry copy named: streamed from this machine
    node_engines[1].images.remove(smoke.tag, force=True)
    streamed = prepare(smoke.manifest, hosts, options(module_track, work), client=engine)
    assert [n.how for n in streamed.nodes] == ["present", "streamed"]
    assert node_engines[1].images.get(smoke.tag).id == image_id


@pytest.mark.ssh
def test_nodes_that_cannot_reach_the_registry_get_a_stream(smoke: Smoke, cluster: dict,
                                                           engine: docker.DockerClient,
                                                           node_engines: list[docker.DockerClient],
                                                           module_track: Any, tmp_path: Path,
                                                           cluster_env: dict[str, str]) -> None:
    if shutil.which("docker-registry") is None:
        pytest.fail("docker-registry is not installed (scripts/test-cluster up installs it)", pytrace=False)
    port = free_port()  # served on this machine's loopback only: the nodes have no forwarder to it
    config = {"version": 0.1, "log": {"level": "error"}, "http": {"addr": f"127.0.0.1:{port}"},
              "storage": {"filesystem": {"rootdirectory": str(tmp_path / "data")}}}
    (tmp_path / "reg.yml").write_text(json.dumps(config))  # JSON is YAML
    proc = subprocess.Popen(["docker-registry", "serve", str(tmp_path / "reg.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        for e in node_engines:
            e.images.remove(smoke.tag, force=True) if _has(e, smoke.tag) else None
        events: list[Any] = []
        r = prepare(smoke.manifest, load_hosts(Path(cluster["hosts_file"])),
                    options(module_track, smoke.root / "work", push=f"127.0.0.1:{port}"),
                    progress=events.append, client=engine)
        module_track.image(r.pushed.tagged)
        assert [n.how for n in r.nodes] == ["streamed", "streamed"]
        assert sum(e.kind == "warn" and "streaming" in e.message for e in events) == 2
        assert {e.images.get(smoke.tag).id for e in node_engines} == {r.image_id}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _has(engine: docker.DockerClient, name: str) -> bool:
    try:
        engine.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


@pytest.mark.ssh
def test_a_registry_image_is_pulled_by_its_digest_on_every_node(cluster: dict, engine: docker.DockerClient,
                                                                 node_engines: list[docker.DockerClient],
                                                                 track: Any, helpers: Any, tmp_path: Path,
                                                                 cluster_env: dict[str, str]) -> None:
    remote, tag = f"{cluster['registry']}/repro-test/runimage", f"t{track.run_id}"
    base = engine.images.get(cluster["base_image_local"])
    base.tag(remote, tag)
    track.image(f"{remote}:{tag}")
    pushed = registry.push(engine, base.id, parse_ref(f"{remote}:{tag}"))
    track.push(remote, pushed.digest)
    for e in (engine, *node_engines):
        track.image(pushed.pinned, e)
    path = helpers.write_registry_manifest(tmp_path, name="runimage", ref=f"{remote}:{tag}", digest="")
    hosts = ["--hosts", cluster["hosts_file"]]
    refused = repro("images", str(path), *hosts)
    assert refused.returncode == 2 and "tag without a digest" in refused.stderr
    first = repro("images", str(path), *hosts, "--allow-unpinned")
    assert first.returncode == 0, first.stderr
    assert f"image {remote}:{tag}@{pushed.digest}\n" in first.stdout and f"resolves to {pushed.digest}" in first.stderr
    assert first.stdout.count(" pulled ") == 2 and "(written)" in first.stdout   # the digest is recorded
    assert {e.images.get(pushed.pinned).id for e in node_engines} == {base.id}
    again = repro("images", str(path), *hosts, "--pull")                         # pinned by the lock now
    assert again.returncode == 0 and again.stdout.count(" present ") == 2, again.stderr
    assert repro("images", str(path), "--build").returncode == 2


# --- OFED and the CA bundle --------------------------------------------------------------------------

def test_inbox_rdma_layer_has_a_working_verbs_stack(smoke: Smoke, cluster: dict, engine: docker.DockerClient,
                                                    track: Any, helpers: Any, tmp_path: Path) -> None:
    tag = track.image(f"repro-test/smoke-inbox-{track.run_id}:t")
    m = load_manifest(helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="smoke-inbox", tag=tag,
                                             rdma="inbox"))
    r = prepare(m, local_hosts(), options(track, tmp_path / "work"), client=engine)
    forget_stages(track, r)
    labels = helpers.labels_of(engine, tag)
    assert labels["repro.rdma"] == "inbox"
    assert re.search(r"(^| )rdma-core=\d", labels["repro.rdma.versions"]) and r.built is not None
    assert r.built.rdma_versions["perftest"]
    out = helpers.run_in(engine, tag, ["sh", "-c", "command -v ibv_devinfo; ibv_devinfo; echo rc=$?"], track)
    assert out.startswith("/usr/bin/ibv_devinfo\n") and "error while loading" not in out


#: as in an image built FROM nvidia/cuda before NVIDIA's April 2022 key rotation: an apt source in
#: sources.list.d/cuda.list whose signing key the image does not hold (here the base's own mirror, a suite
#: the base does not list, signed-by a keyring that is not there), so that apt-get update over it fails
#: with NO_PUBKEY
NO_KEY_SOURCE = (
    "RUN uri=$(sed -n 's/^URIs: *\\([^ ]*\\).*/\\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null "
    "| head -n 1); [ -n \"$uri\" ] || uri=$(awk '$1 == \"deb\" {print $2; exit}' /etc/apt/sources.list); "
    ". /etc/os-release; echo \"deb [signed-by=/usr/share/keyrings/repro-test-absent.gpg] $uri "
    "$VERSION_CODENAME-backports main\" "
    "> /etc/apt/sources.list.d/cuda.list\n")


def _build_log(engine: docker.DockerClient, text: str, **kw: Any) -> str:
    _, log = engine.images.build(fileobj=_dockerfile(text), network_mode="host", rm=True, forcerm=True, **kw)
    return "".join(str(e.get("stream", "")) for e in log)


def test_the_kits_apt_layers_build_on_a_base_with_an_apt_source_whose_key_is_missing(
        smoke: Smoke, cluster: dict, engine: docker.DockerClient, track: Any, helpers: Any,
        tmp_path: Path) -> None:
    base = track.image(f"repro-test/no-pubkey-{track.run_id}:t")
    _build_log(engine, f"FROM {cluster['base_image']}\n{NO_KEY_SOURCE}", tag=base, labels=track.labels)
    with pytest.raises(docker.errors.BuildError) as plain:   # what any layer that updates every source meets
        _build_log(engine, f"FROM {base}\nRUN apt-get update\n", labels=track.labels)
    assert "NO_PUBKEY" in "".join(str(e.get("stream", "")) for e in plain.value.build_log)
    m = load_manifest(helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="smoke-nokey",
                                             tag="unused:t", rdma="inbox"))
    layers = (("rdma", render_rdma_layer(m, base), "dpkg-query -W rdma-core perftest && echo rc=0"),
              ("sshd", render_sshd_layer(base), "test -x /usr/sbin/sshd && echo rc=0"))
    for name, layer, check in layers:
        tag = track.image(f"repro-test/no-pubkey-{name}-{track.run_id}:t")
        _build_log(engine, layer, tag=tag, labels=track.labels)
        show = f"{check}; cat /etc/apt/sources.list.d/cuda.list; ls /var/lib/apt/lists /tmp"
        out = helpers.run_in(engine, tag, ["sh", "-c", show], track)
        assert "rc=0" in out and "repro-test-absent.gpg" in out, out   # the image's own apt sources are kept
        assert "repro-apt" not in out and "_Packages" not in out, out


def test_ca_bundle_reaches_the_build_but_not_the_image(smoke: Smoke, cluster: dict, engine: docker.DockerClient,
                                                      track: Any, helpers: Any, tmp_path: Path) -> None:
    tag = track.image(f"repro-test/smoke-ca-{track.run_id}:t")
    m = load_manifest(helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="smoke-ca", tag=tag))
    forget_stages(track, prepare(m, local_hosts(), options(track, tmp_path / "work", ca_bundle=CA_BUNDLE),
                                 client=engine))
    used = helpers.run_in(engine, tag, ["cat", "/opt/repro-deps/ca-bundle.sha256"], track).strip()
    assert used == hashlib.sha256(CA_BUNDLE.read_bytes()).hexdigest()
    probe = engine.containers.create(tag, ["true"], entrypoint=[], labels=track.labels)
    try:
        with pytest.raises(docker.errors.NotFound):
            probe.get_archive(CA_IMAGE_PATH)
    finally:
        probe.remove(force=True)


def test_a_dockerfile_that_leaks_the_ca_bundle_is_refused(smoke: Smoke, cluster: dict,
                                                          engine: docker.DockerClient, track: Any, helpers: Any,
                                                          tmp_path: Path) -> None:
    leaky = tmp_path / "dockerfiles" / "cpu-smoke"
    leaky.mkdir(parents=True)
    (leaky / "Dockerfile").write_text(f"ARG BASE\nFROM ${{BASE}}\nCOPY repro-ca.crt {CA_IMAGE_PATH}\n")
    tag = track.image(f"repro-test/smoke-leak-{track.run_id}:t")
    m = load_manifest(helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="smoke-leak", tag=tag))
    with pytest.raises(BuildError, match="CA bundle .* is in the final image"):
        prepare(m, local_hosts(), options(track, tmp_path / "work", ca_bundle=CA_BUNDLE, dockerfiles=tmp_path /
                                          "dockerfiles"), client=engine)
    assert not _has(engine, tag)


@pytest.mark.slow
def test_cpu_torch_image(smoke: Smoke, cluster: dict, engine: docker.DockerClient, track: Any, helpers: Any,
                         tmp_path: Path) -> None:
    if not list(WHEELS.glob("torch-2.13.0+cpu-*.whl")):
        pytest.fail(f"no torch 2.13.0 CPU wheel in {WHEELS} (set REPRO_TEST_WHEELS)", pytrace=False)
    tag = track.image(f"repro-test/cpu-torch-{track.run_id}:t")
    m = load_manifest(helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="cpu-torch", tag=tag,
                                             dockerfile="cpu-torch"))
    r = prepare(m, local_hosts(), options(track, tmp_path / "work", ca_bundle=CA_BUNDLE, wheels=WHEELS),
                client=engine)
    forget_stages(track, r)
    out = helpers.run_in(engine, tag, ["python3", "-c", "import torch; print(torch.__version__)"], track)
    assert out.strip() == "2.13.0+cpu" and r.built is not None


# --- the lock fails closed ---------------------------------------------------------------------------

def test_lock_mismatch_is_refused_naming_both_digests(smoke: Smoke, cluster: dict, engine: docker.DockerClient,
                                                      track: Any, helpers: Any, tmp_path: Path,
                                                      cluster_env: dict[str, str]) -> None:
    remote = f"{cluster['registry']}/repro-test/lockbase"
    tag = f"t{track.run_id}"
    engine.images.get(cluster["base_image_local"]).tag(remote, tag)
    track.image(f"{remote}:{tag}")
    first = registry.push(engine, engine.images.get(f"{remote}:{tag}").id, parse_ref(f"{remote}:{tag}"))
    track.push(remote, first.digest)
    track.image(f"{remote}@{first.digest}")  # the digest reference only: the image is the cluster's base
    target_tag = track.image(f"repro-test/smoke-lock-{track.run_id}:t")
    path = helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="smoke-lock", tag=target_tag,
                                  base_ref=f"{remote}:{tag}", base_digest="")
    refused = repro("images", str(path))
    assert refused.returncode == 2 and "tag without a digest" in refused.stderr
    locked = repro("lock", str(path))
    assert locked.returncode == 0, locked.stderr
    assert read_lock(lock_path(load_manifest(path))).images["base"].digest == first.digest
    # the tag moves to another image
    other = engine.images.build(fileobj=_dockerfile(f"FROM {remote}@{first.digest}\nLABEL moved={track.run_id}\n"),
                                labels=track.labels, rm=True)[0]
    second = registry.push(engine, other.id, parse_ref(f"{remote}:{tag}"))
    track.push(remote, second.digest)
    moved = repro("images", str(path), "--allow-unpinned")
    assert moved.returncode == 6, moved.stderr
    assert first.digest in moved.stderr and second.digest in moved.stderr and "--update-lock" in moved.stderr
    assert not _has(engine, target_tag)                 # nothing was built or tagged
    assert repro("lock", str(path)).returncode == 6
    dry = repro("images", str(path), "--dry-run")
    assert f"FROM {remote}@{first.digest} AS deps" in dry.stdout
    assert repro("lock", str(path), "--update-lock").returncode == 0
    assert read_lock(lock_path(load_manifest(path))).images["base"].digest == second.digest


def _dockerfile(text: str) -> Any:
    import io

    return io.BytesIO(text.encode())


# --- bad input and faults ----------------------------------------------------------------------------

def test_unknown_image_and_registry_down(cluster: dict, engine: docker.DockerClient, track: Any) -> None:
    with pytest.raises(BuildError, match="no such image") as err:
        registry.pull(engine, parse_ref(f"{cluster['registry']}/repro-test/never-{track.run_id}", ZERO))
    assert err.value.exit_code == 4
    with pytest.raises(EnvironmentUnavailable, match="not reachable") as down:
        registry.pull(engine, parse_ref(f"127.0.0.1:{free_port()}/repro-test/x", ZERO))
    assert down.value.exit_code == 3


def test_a_failing_build_shows_its_step_and_last_lines_and_tags_nothing(
        smoke: Smoke, cluster: dict, engine: docker.DockerClient, track: Any, helpers: Any, tmp_path: Path) -> None:
    d = tmp_path / "dockerfiles" / "cpu-smoke"
    d.mkdir(parents=True)
    (d / "Dockerfile").write_text('ARG BASE\nFROM ${BASE}\nRUN for i in $(seq 1 30); do echo "out $i"; done; exit 3\n')
    tag = track.image(f"repro-test/smoke-fail-{track.run_id}:t")
    m = load_manifest(helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="smoke-fail", tag=tag))
    before = {c.id for c in engine.containers.list(all=True, ignore_removed=True)}
    with pytest.raises(BuildError) as err:
        prepare(m, local_hosts(), options(track, tmp_path / "work", dockerfiles=tmp_path / "dockerfiles"),
                client=engine)
    text = str(err.value)
    assert "build failed at step 3/4: RUN for i in" in text and "returned a non-zero code: 3" in text
    assert "  | out 11\n" in text and "  | out 30\n" in text and "  | out 10\n" not in text
    assert not _has(engine, tag)
    assert {c.id for c in engine.containers.list(all=True, ignore_removed=True)} - before == set()   # forcerm: no leftovers


def test_a_patch_that_no_longer_matches_stops_the_build(cluster: dict, engine: docker.DockerClient, track: Any,
                                                        helpers: Any, tmp_path: Path) -> None:
    source = helpers.make_git_source(tmp_path / "src")
    (source.path / "bench" / "run.py").write_text("STEPS = 5\n")
    helpers.git(source.path, "commit", "-qam", "upstream changed the line the patch expects")
    source.commit = helpers.git(source.path, "rev-parse", "HEAD")
    tag = track.image(f"repro-test/smoke-patch-{track.run_id}:t")
    path = helpers.write_manifest(tmp_path / "m", cluster, source, name="smoke-patch", tag=tag)
    r = repro("images", str(path), "--work-dir", str(tmp_path / "work"), env={"DOCKER_HOST": cluster["docker_host"]})
    assert r.returncode == 4   # the message names the file and the text
    assert "source.patches[0] (bench/run.py): the old text 'STEPS = 10\\n' occurs 0 times, not once" in r.stderr
    assert not _has(engine, tag)


def test_engine_not_running_says_how_to_start_it(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentUnavailable) as err:
        connect(f"unix://{tmp_path}/no-engine.sock")
    assert err.value.exit_code == 3 and "dockerd" in (err.value.hint or "")


def test_engine_not_running_through_the_cli(smoke: Smoke, tmp_path: Path) -> None:
    r = repro("images", str(smoke.manifest.path), env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert r.returncode == 3 and "is not answering" in r.stderr and "hint: start the engine" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_disk_full_is_a_clear_error_and_tags_nothing(smoke: Smoke, cluster: dict, engine: docker.DockerClient,
                                                     track: Any, helpers: Any, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(full)], check=True)
    try:
        with (full / "filler").open("wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        tag = track.image(f"repro-test/smoke-full-{track.run_id}:t")
        m = load_manifest(helpers.write_manifest(tmp_path / "m", cluster, smoke.source, name="smoke-full", tag=tag))
        with pytest.raises(BuildError, match="disk full") as err:
            prepare(m, local_hosts(), options(track, full / "work", mode="build"), client=engine)
        assert err.value.exit_code == 4 and not _has(engine, tag)
    finally:
        subprocess.run(["umount", str(full)], check=False)
