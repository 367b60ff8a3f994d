"""Fixtures for tests against the real test cluster (``scripts/test-cluster up``).

Everything a test creates is tracked and removed afterwards: images (on the main engine
and on every node engine), containers, and manifests pushed to the cluster's registry.
Builds made through the kit carry the label ``repro.test=<run id>`` so that whatever
they left behind is found by label as well as by name.
"""

from __future__ import annotations

import contextlib
import os
import string
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest

from repro.spec.hosts import load_hosts
from repro.images.engine import node_client

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "tests" / "data" / "images-manifests"
LABEL = "repro.test"


@dataclass
class Tracker:
    """What a test made; ``cleanup`` removes all of it, quietly, in a safe order."""

    engines: list[docker.DockerClient]
    registry: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    images: list[tuple[docker.DockerClient, str]] = field(default_factory=list)
    pushed: list[tuple[str, str]] = field(default_factory=list)  # (repository path, digest)

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL: self.run_id}

    def image(self, name: str, engine: docker.DockerClient | None = None) -> str:
        self.images.append((engine or self.engines[0], name))
        return name

    def push(self, repository: str, digest: str) -> None:
        """``repository`` as pushed (``127.0.0.1:5000/a/b``); removed from the registry afterwards."""
        self.pushed.append((repository.partition("/")[2], digest))

    def cleanup(self) -> None:
        for engine in self.engines:
            for c in engine.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL}={self.run_id}"}):
                c.remove(force=True)
        named = [(e, n) for e, n in self.images]
        for engine in self.engines:
            named += [(engine, img.id) for img in engine.images.list(filters={"label": f"{LABEL}={self.run_id}"})]
        for engine, name in reversed(named):
            try:
                engine.images.remove(name, force=True)
            except docker.errors.ImageNotFound:
                pass
            except docker.errors.APIError:
                pass  # a parent already gone with its child
        for path, digest in self.pushed:
            req = urllib.request.Request(f"http://{self.registry}/v2/{path}/manifests/{digest}", method="DELETE")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(req, timeout=10).close()


@pytest.fixture(scope="session")
def engine(cluster: dict) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=cluster["docker_host"], timeout=600)
    yield client
    client.close()


@pytest.fixture(scope="session")
def node_engines(cluster: dict) -> Iterator[list[docker.DockerClient]]:
    """Each node's engine through its socket (for checks and cleanup; the kit itself goes over SSH)."""
    clients = [docker.DockerClient(base_url=n["docker_host"], timeout=600) for n in cluster["nodes"]]
    yield clients
    for c in clients:
        c.close()


def _tracker(cluster: dict, engine: docker.DockerClient, node_engines: list[docker.DockerClient]) -> Tracker:
    return Tracker([engine, *node_engines], cluster["registry"])


@pytest.fixture
def track(cluster: dict, engine: docker.DockerClient, node_engines: list[docker.DockerClient]) -> Iterator[Tracker]:
    t = _tracker(cluster, engine, node_engines)
    yield t
    t.cleanup()


@pytest.fixture(scope="module")
def module_track(cluster: dict, engine: docker.DockerClient,
                 node_engines: list[docker.DockerClient]) -> Iterator[Tracker]:
    t = _tracker(cluster, engine, node_engines)
    yield t
    t.cleanup()


@pytest.fixture(scope="session")
def cluster_env(cluster: dict) -> Iterator[dict[str, str]]:
    """The environment the kit needs to reach the cluster: its engine and its SSH settings (host keys pinned)."""
    env = {"DOCKER_HOST": cluster["docker_host"], "REPRO_SSH_CONFIG": cluster["ssh"]["config"]}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield env


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


@dataclass
class GitSource:
    """A local repository on branch ``main``: the benchmark source the kit must pin."""

    path: Path
    commit: str

    def move_branch(self, steps: str = "99") -> str:
        """Commit a change on ``main`` (as an upstream would after the publication); the new head."""
        (self.path / "bench" / "run.py").write_text(f"STEPS = {steps}\nprint('steps', STEPS)\n")
        (self.path / "bench" / "added-later.txt").write_text("not in the pinned commit\n")
        git(self.path, "add", "-A")
        git(self.path, "commit", "-qm", "moved")
        return git(self.path, "rev-parse", "HEAD")


def make_git_source(path: Path) -> GitSource:
    (path / "bench").mkdir(parents=True)
    (path / "bench" / "run.py").write_text("STEPS = 10\nprint('steps', STEPS)\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "pinned")
    return GitSource(path, git(path, "rev-parse", "HEAD"))


def write_manifest(directory: Path, cluster: dict, source: GitSource, *, name: str, tag: str, rdma: str | None = None,
                   dockerfile: str = "cpu-smoke", base_ref: str | None = None, base_digest: str | None = None) -> Path:
    """The cpu-smoke test manifest, filled in, as ``directory/<name>.yaml``."""
    text = string.Template((MANIFESTS / "cpu-smoke.yaml").read_text(encoding="utf-8")).substitute(
        target=name, dockerfile=dockerfile, tag=tag, repository=str(source.path), commit=source.commit,
        base_ref=base_ref or cluster["base_image"],
        base_digest=cluster["base_digest"] if base_digest is None else base_digest,
        rdma=f"rdma: {{strategy: {rdma}}}" if rdma else "")
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}.yaml"
    out.write_text(text, encoding="utf-8")
    return out


def write_registry_manifest(directory: Path, *, name: str, ref: str, digest: str) -> Path:
    """A target that runs the registry image ``ref`` (digest may be empty), as ``directory/<name>.yaml``."""
    text = string.Template((MANIFESTS / "registry.yaml").read_text(encoding="utf-8")).substitute(
        target=name, ref=ref, digest=digest)
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}.yaml"
    out.write_text(text, encoding="utf-8")
    return out


def labels_of(engine: docker.DockerClient, name: str) -> dict[str, Any]:
    return dict(engine.images.get(name).labels or {})


def run_in(engine: docker.DockerClient, image: str, command: list[str], track: Tracker) -> str:
    out = engine.containers.run(image, command, entrypoint=[], network_mode="none", remove=True,
                                labels=track.labels)
    return out.decode()


@dataclass(frozen=True)
class Helpers:
    """The helpers above, handed to tests as a fixture (test modules do not import conftest)."""

    git = staticmethod(git)
    make_git_source = staticmethod(make_git_source)
    write_manifest = staticmethod(write_manifest)
    write_registry_manifest = staticmethod(write_registry_manifest)
    labels_of = staticmethod(labels_of)
    run_in = staticmethod(run_in)


@pytest.fixture(scope="session")
def helpers() -> Helpers:
    return Helpers()


@pytest.fixture(scope="module")
def hosts_file(cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's inventory as a CPU cluster: no GPUs, gloo on the nodes' eth0."""
    nodes = "".join(f"  - {{name: {n['name']}, address: {n['address']}}}\n" for n in cluster["nodes"])
    path = tmp_path_factory.mktemp("hosts") / "cpu-cluster.yaml"
    path.write_text("schema_version: 1\n"
                    f"defaults: {{user: root, identity: {cluster['ssh']['key']}, gpus: 0}}\n"
                    "env: {GLOO_SOCKET_IFNAME: eth0}\n"
                    f"nodes:\n{nodes}")
    return path


@pytest.fixture(scope="module")
def clients(cluster: dict, hosts_file: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
        out = {n.name: node_client(n) for n in load_hosts(hosts_file).nodes}
        yield out
    for c in out.values():
        c.close()
