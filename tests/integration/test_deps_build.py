"""A real build of dockerfiles/requirements with a dependency lock, on the test cluster's Debian base.

The base stands for a framework container whose pip installs into the system (Debian's python3-pip, with
PEP 668's guard off as a framework image has none); it is pushed to the cluster's registry so the build
takes it by digest. The lock is made by the kit against a PEP 691 index this test serves on 127.0.0.1
(the build runs with host networking and reaches it), its VCS requirement from a local git repository
through --git-mirror. The image must hold exactly the locked versions and the VCS wheel of the pinned
commit, and a lock edited after `repro lock` must stop the build before anything is built.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from repro.errors import BuildError
from repro.images import deps
from repro.images.build import BuildOptions, build_image
from repro.images.refs import Ref, parse_ref
from repro.images.registry import push
from repro.spec.manifest import load_manifest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_deps_index import RELEASES, Index  # noqa: E402
from test_vcs_locks import make_dllogger  # noqa: E402

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
PIP_BASE = """FROM {base}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-pip \\
 && rm -rf /var/lib/apt/lists/*
ENV PIP_BREAK_SYSTEM_PACKAGES=1
"""


@pytest.fixture(scope="module")
def pip_base(cluster: dict, engine: docker.DockerClient, module_track: Any) -> Ref:
    """The Debian base with python3-pip, pushed to the cluster's registry: a pinned Ref."""
    base = f"{cluster['base_image']}@{cluster['base_digest']}"
    image, _ = engine.images.build(fileobj=io.BytesIO(PIP_BASE.format(base=base).encode()), rm=True,
                                   network_mode="host", labels=module_track.labels, pull=False)
    target = parse_ref(f"{cluster['registry']}/repro-test/locks-pipbase:{module_track.run_id}")
    pushed = push(engine, image.id, target)
    module_track.image(target.tagged)
    module_track.push(target.repository, pushed.digest)
    return pushed


@pytest.fixture(scope="module")
def index() -> Iterator[Index]:
    idx = Index(RELEASES)
    yield idx
    idx.server.shutdown()


def manifest(tmp_path: Path, base: Ref, source: Any, tag: str) -> Path:
    """A requirements target on ``base``: an unpinned pyyaml (6.0 today, 5.3.1 as of the cutoff) and dllogger
    from git at its tag v1.0.0."""
    data = {
        "schema_version": 1, "id": "locks-build", "title": "a locked requirements build", "framework": "pytorch",
        "model": "resnet50v1.5",
        "image": {"build": {
            "dockerfile": "requirements", "tag": tag,
            "base": {"ref": base.tagged, "digest": base.digest,
                     "python": {"version": "3.11", "source": "Debian bookworm's python3 (the test's base)"},
                     "ships": []},
            "deps": {"cutoff": "2021-01-01T00:00:00Z", "why": "test",
                     "requirements": ["pyyaml", "git+https://github.com/NVIDIA/dllogger@v1.0.0#egg=dllogger"]}}},
        "source": {"repository": str(source.path), "commit": source.commit, "path": "/workspace/bench",
                   "subdir": "bench"},
        "launch": {"kind": "plain", "command": ["python3", "run.py"]},
        "matrix": {"nodes": [1], "gpus_per_node": [1], "precision": ["fp32"], "batch_size": [1]},
        "measure": {"parser": "ngc-pytorch", "protocol": {"aggregate": "mean"}},
    }
    path = tmp_path / "locks-build.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_a_locked_build_installs_the_locked_versions_and_the_vcs_wheel(
        cluster: dict, engine: docker.DockerClient, module_track: Any, helpers: Any, pip_base: Ref,
        index: Index, tmp_path: Path) -> None:
    source = helpers.make_git_source(tmp_path / "src")
    (source.path / "bench" / "requirements.txt").write_text("pyyaml\ngit+https://github.com/NVIDIA/dllogger"
                                                           "@v1.0.0#egg=dllogger\n")
    helpers.git(source.path, "add", "-A")
    helpers.git(source.path, "commit", "-qm", "requirements")
    source.commit = helpers.git(source.path, "rev-parse", "HEAD")
    repo, before, _ = make_dllogger(tmp_path / "dllogger")
    tag = module_track.image(f"repro-test/locks-build:{module_track.run_id}")
    path = manifest(tmp_path, pip_base, source, tag)
    m = load_manifest(path)
    lock, _ = deps.write_lock(m, index.url, (("https://github.com/NVIDIA/dllogger", str(repo)),))
    assert deps.pins(lock.read_text()) == {"pyyaml": "5.3.1"}
    opts = BuildOptions(work_dir=tmp_path / "work", extra_labels=module_track.labels)
    built = build_image(engine, m, pip_base, opts)
    out = helpers.run_in(engine, built.tag, ["python3", "-m", "pip", "list", "--format=freeze"], module_track)
    found = dict(line.split("==", 1) for line in out.split() if "==" in line)
    assert (found.get("PyYAML") or found.get("pyyaml"), found.get("dllogger")) == ("5.3.1", "1.0.0")
    log = built.log.read_text()
    assert "repro: base as declared: python 3.11." in log
    wheel = tmp_path / "wheels" / before / "dllogger-1.0.0-py3-none-any.whl"   # the commit v1.0.0 names
    assert wheel.is_file() and "dllogger-1.0.0-py3-none-any.whl" in log
    lock.write_text(lock.read_text().replace("pyyaml==5.3.1", "pyyaml==6.0"), encoding="utf-8")
    with pytest.raises(BuildError, match="was changed after `repro lock` wrote it"):
        build_image(engine, load_manifest(path), pip_base, opts)
