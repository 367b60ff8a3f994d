"""Shared test setup.

Tests that need a real component (Docker engine, the SSH test cluster, its Slurm, pyxis/enroot in that
Slurm, the reference registry's binary) carry a marker.
Where the component is missing they are skipped with the reason locally, but they FAIL
when ``CI`` is set or ``REPRO_REQUIRE`` names the component: a CI lane that is meant to
have Docker can never go green by skipping.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

# Bytecode caches (the __pycache__ folders git ignores) are written whatever PYTHONDONTWRITEBYTECODE says:
# without them every test process compiles the kit and rewrites every test module's asserts again, about
# 4 s of each worker's start. Set here, before any test module or most of the kit is imported.
sys.dont_write_bytecode = False

ROOT = Path(__file__).resolve().parent.parent
#: Written by ``scripts/test-cluster up``; describes the engine, registry and nodes.
CLUSTER_ENV = Path(os.environ.get("REPRO_TEST_CLUSTER", "/tmp/repro-cluster/cluster.json"))


#: What CI cannot have: an upstream repository's source (CI reaches the package registries only).
NOT_IN_CI = {"upstream"}


def _required(component: str) -> bool:
    wanted = {c.strip() for c in os.environ.get("REPRO_REQUIRE", "").split(",") if c.strip()}
    if component in NOT_IN_CI:
        return component in wanted
    return bool(os.environ.get("CI")) or component in wanted or "all" in wanted


def _cluster() -> dict | None:
    try:
        return json.loads(CLUSTER_ENV.read_text())
    except (OSError, ValueError):
        return None


def _docker_reason() -> str | None:
    info = _cluster()
    if info is None:
        return f"no test cluster description at {CLUSTER_ENV} (run: scripts/test-cluster up)"
    try:
        import docker

        docker.DockerClient(base_url=info["docker_host"]).ping()
    except Exception as e:  # noqa: BLE001 - any failure means the engine is not usable
        return f"Docker engine {info.get('docker_host')} not reachable: {e}"
    return None


def _ssh_reason() -> str | None:
    info = _cluster()
    if info is None:
        return f"no test cluster description at {CLUSTER_ENV} (run: scripts/test-cluster up)"
    if not info.get("nodes"):
        return "the test cluster has no SSH nodes"
    return None


def _slurm_reason() -> str | None:

    info = _cluster()
    if info is None or not info.get("slurm_conf"):
        return f"no Slurm in the test cluster at {CLUSTER_ENV} (run: scripts/test-cluster up)"
    failed, out = _slurm_cli(["scontrol", "ping"], info)
    if failed:
        return failed
    return None if "UP" in out else f"slurmctld does not answer: {out.strip()}"


def _slurm_cli(argv: list[str], info: dict) -> tuple[str | None, str]:
    """A Slurm client command against the test cluster's slurm.conf: (why it failed, or None; its stdout)."""
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                              env={**os.environ, "SLURM_CONF": info["slurm_conf"]})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(argv)} failed: {e}", ""
    return None, done.stdout


def _pyxis_reason() -> str | None:
    """pyxis/enroot as ``scripts/test-cluster up`` installs them: in the description and in srun's options."""

    reason = _slurm_reason()
    if reason is not None:
        return reason
    info = _cluster() or {}
    if not info.get("pyxis"):
        return f"the test cluster at {CLUSTER_ENV} has no pyxis (REPRO_CLUSTER_PYXIS=0, or made before pyxis)"
    failed, help_ = _slurm_cli(["srun", "--help"], info)
    if failed:
        return failed
    if "--container-image" not in help_:
        return f"`srun --help` shows no --container-image (plugstack: {info['pyxis'].get('plugstack')})"
    return None


def _upstream_reason() -> str | None:
    """An upstream repository's code (tf_cnn_benchmarks) comes from GitHub, which CI machines cannot reach
    (only the package registries): such a test runs where REPRO_TEST_GIT_MIRROR names a mirror of it."""
    if os.environ.get("REPRO_TEST_GIT_MIRROR"):
        return None
    return "no REPRO_TEST_GIT_MIRROR=PREFIX=URL naming a mirror of the upstream repository"


def _registry_reason() -> str | None:
    """The reference registry's own binary (Debian's docker-registry) and bcrypt for its htpasswd file: the
    registry API tests start a registry of their own, no test cluster needed."""
    import shutil

    if shutil.which("docker-registry") is None:
        return "no docker-registry on PATH (Debian: apt-get install docker-registry)"
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        return "no python bcrypt (fabric's paramiko brings it)"
    return None


_CHECKS = {"docker": _docker_reason, "registry": _registry_reason, "ssh": _ssh_reason, "slurm": _slurm_reason, "pyxis": _pyxis_reason,
           "upstream": _upstream_reason}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """A session of unit tests alone keeps its temporary files on the machine's tmpfs where it has one: a
    unit test writes run directories, archives and log trees thousands of times, and a directory made on
    this kind of machine's journaled disk costs milliseconds. Integration tests keep the disk (a run
    directory there must be a filesystem the test cluster's nodes and jobs see as an ordinary one)."""
    shm = Path("/dev/shm")
    if hasattr(config, "workerinput") or config.option.basetemp or not os.access(shm, os.W_OK):
        return
    integration = ROOT / "tests" / "integration"
    ignored = {Path(p).resolve() for p in config.getoption("ignore") or []}
    asked = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    if integration not in ignored and any(a == integration or a in integration.parents or integration in a.parents
                                          for a in asked):
        return
    base = Path(tempfile.mkdtemp(prefix="repro-unit-", dir=shm))
    config.option.basetemp = str(base)

    def remove() -> None:
        from repro.tree import remove

        remove(base)

    config.add_cleanup(remove)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name, check in _CHECKS.items():
        if item.get_closest_marker(name) is None:
            continue
        reason = check()
        if reason is None:
            continue
        if _required(name):
            pytest.fail(f"{name} is required here (CI or REPRO_REQUIRE) but unavailable: {reason}", pytrace=False)
        pytest.skip(f"{name} unavailable: {reason}")


@pytest.fixture(scope="session")
def cluster() -> dict:
    """The test cluster description (engine, registry, nodes); marker checks ran first."""
    info = _cluster()
    assert info is not None, f"missing {CLUSTER_ENV}"
    return info


@pytest.fixture(scope="session")
def cpu_torch(cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The cpu-torch image, built once by the kit from torch-rn50-cpu on this cluster's base,
    pushed to the cluster's registry and present on every node.

    Returns the manifest copy (its lock file beside it) and the reference the nodes run.
    """
    from repro.spec.hosts import load_hosts
    from repro.images import BuildOptions, ImagesOptions, lock_target, prepare
    from repro.spec.manifest import load_manifest

    wheels = Path(os.environ.get("REPRO_TEST_WHEELS", "/opt/wheels"))
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    d = tmp_path_factory.mktemp("cpu-torch")
    text = (ROOT / "manifests" / "torch-rn50-cpu.yaml").read_text()
    path = d / "torch-rn50-cpu.yaml"
    path.write_text(text.replace("127.0.0.1:5000/repro-test/debian:bookworm", cluster["base_image"]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", cluster["docker_host"])
        mp.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])
        manifest = load_manifest(path)
        lock_target(manifest)
        opts = ImagesOptions(push=f"{cluster['registry']}/repro-test",
                             build=BuildOptions(wheels=wheels, ca_bundle=ca if ca.is_file() else None))
        result = prepare(manifest, load_hosts(Path(cluster["hosts_file"])), opts)
    return {"manifest": path, "image": result.reference, "image_id": result.image_id}


@pytest.fixture(autouse=True, scope="session")
def own_results_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`repro report` and `repro up` record what they judge in the results store: the tests record into a
    store of their own (and their subprocesses inherit it), never the user's; a test that checks the store
    gives its own REPRO_RESULTS."""
    os.environ["REPRO_RESULTS"] = str(tmp_path_factory.mktemp("results") / "results.sqlite")
