"""VCS requirements in a dependency lock (repro/images/vcs.py): a git repository the test makes stands for
NVIDIA/dllogger (reached through ``--git-mirror``, as a site without GitHub would), the package index is the
loopback PEP 691 index of tests/integration/test_deps_index.py. The requirement is pinned by commit as of the cutoff, built into
a wheel kept beside the manifests, and the lock installs that wheel by hash. Never the network."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import run_cli
from test_deps_index import RELEASES, Index

from repro.errors import BuildError, UsageError
from repro.images import deps, vcs
from repro.images.build import _dependency_lock
from repro.images.check import CheckOptions, check_target
from repro.spec.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]
TARGET = "ngc-tf1-rn50-v100"                      # requirements: dllogger at its default branch, and mpi4py
URL = "https://github.com/NVIDIA/dllogger"
#: a PEP 517 backend in the repository itself, so that building the wheel needs nothing from an index
BACKEND = '''import os, zipfile
NAME, VERSION = "dllogger", open(os.path.join(os.path.dirname(__file__), "VERSION")).read().strip()
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist = f"{NAME}-{VERSION}"
    when = (1980, 1, 1, 0, 0, 0)
    files = {"dllogger/__init__.py": open(os.path.join(os.path.dirname(__file__), "dllogger.py")).read(),
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{p},,\\n" for p in [*files, f"{dist}.dist-info/RECORD"])
    name = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, text in files.items():
            z.writestr(zipfile.ZipInfo(path, when), text)
    return name
'''


def git(cwd: Path, *args: str, when: str | None = None) -> str:
    env = {**os.environ, **({"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when} if when else {})}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, env=env).stdout.strip()


def make_dllogger(repo: Path) -> tuple[Path, str, str]:
    """A dllogger repository: 1.0.0 committed and tagged v1.0.0 before the target's cutoff, 1.1.0 after it;
    the repository and the two commits."""
    repo.mkdir(parents=True)
    (repo / "backend.py").write_text(BACKEND)
    (repo / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                         'backend-path = ["."]\n')
    (repo / "dllogger.py").write_text("LEVEL = 1\n")
    (repo / "VERSION").write_text("1.0.0\n")
    git(repo, "init", "-q", "-b", "master")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "1.0.0", when="2022-03-31T13:49:06+02:00")
    git(repo, "tag", "v1.0.0")
    before = git(repo, "rev-parse", "HEAD")
    (repo / "VERSION").write_text("1.1.0\n")
    git(repo, "commit", "-qam", "1.1.0", when="2025-03-31T15:15:39+02:00")
    return repo, before, git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def dllogger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    return make_dllogger(tmp_path_factory.mktemp("mirror") / "dllogger")


@pytest.fixture(scope="module")
def index() -> Iterator[Index]:
    idx = Index([*RELEASES, ("mpi4py", "3.1.4", "2022-11-01T10:00:00Z", []),
                 ("mpi4py", "3.1.5", "2023-10-01T10:00:00Z", [])])
    yield idx
    idx.server.shutdown()


def target(tmp_path: Path, requirement: str | None = None) -> Path:
    text = (ROOT / "manifests" / f"{TARGET}.yaml").read_text(encoding="utf-8")
    if requirement:
        text = text.replace('        - "git+https://github.com/NVIDIA/dllogger#egg=dllogger"\n',
                            f'        - "{requirement}"\n')
    (tmp_path / f"{TARGET}.yaml").write_text(text, encoding="utf-8")
    return tmp_path / f"{TARGET}.yaml"


def mirrors(repo: Path) -> tuple[tuple[str, str], ...]:
    return ((URL, str(repo)),)


def test_the_default_branch_is_pinned_as_it_stood_at_the_cutoff(dllogger: tuple[Path, str, str], index: Index,
                                                                  tmp_path: Path) -> None:
    repo, before, _ = dllogger
    manifest = load_manifest(target(tmp_path))
    lock, changed = deps.write_lock(manifest, index.url, mirrors(repo))
    text = lock.read_text(encoding="utf-8")
    wheel = tmp_path / "wheels" / before / "dllogger-1.0.0-py3-none-any.whl"
    assert changed and wheel.is_file()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert text.splitlines()[6:] == [
        f"--index-url {index.url}",   # the build's pip reads the index the lock was made from
        "mpi4py==3.1.4 \\", f"    --hash=sha256:{index.projects['mpi4py'][0]['hashes']['sha256']}",
        f"# vcs: dllogger from git+{URL}#egg=dllogger at {before}: wheels/{before}/dllogger-1.0.0-py3-none-any.whl",
        "dllogger @ file:///tmp/wheels/dllogger-1.0.0-py3-none-any.whl \\", f"    --hash=sha256:{digest}",
        text.splitlines()[-1]]
    assert deps.pin_count(text) == 2 and vcs.direct_pins(text) == {"dllogger": "1.0.0"}
    assert deps.lock_problems(manifest, text) == []
    assert deps.write_lock(manifest, index.url, mirrors(repo)) == (lock, False)   # the wheel is reused


def test_a_tag_or_a_commit_is_taken_as_named(dllogger: tuple[Path, str, str], index: Index,
                                              tmp_path: Path) -> None:
    repo, before, after = dllogger
    (tmp_path / "tag").mkdir()
    tagged = deps.compile_lock(load_manifest(target(tmp_path / "tag", f"git+{URL}@v1.0.0#egg=dllogger")),
                               index.url, mirrors(repo))
    assert [c for _, c, _, _ in vcs.locked(tagged)] == [before]
    (tmp_path / "commit").mkdir()
    named = deps.compile_lock(load_manifest(target(tmp_path / "commit", f"git+{URL}.git@{after}#egg=dllogger")),
                              index.url, mirrors(repo))   # ".git" or not, the same repository
    assert [(c, f) for _, c, f, _ in vcs.locked(named)] == [(after, "dllogger-1.1.0-py3-none-any.whl")]


def test_a_missing_or_changed_wheel_fails_the_check_and_the_build(dllogger: tuple[Path, str, str],
                                                                   index: Index, tmp_path: Path) -> None:
    repo, before, _ = dllogger
    manifest = load_manifest(target(tmp_path))
    lock, _ = deps.write_lock(manifest, index.url, mirrors(repo))
    context = tmp_path / "ctx"
    context.mkdir()
    shutil.copyfile(ROOT / "dockerfiles" / "requirements" / "Dockerfile", context / "Dockerfile")
    _dependency_lock(manifest, context)
    wheel = tmp_path / "wheels" / before / "dllogger-1.0.0-py3-none-any.whl"
    assert (context / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    assert (context / "requirements.lock").read_text() == lock.read_text()
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("dllogger/extra.py", "x = 1\n")
    changed = f"wheels/{before}/{wheel.name} is not the wheel the lock records (sha256 differs)"
    assert deps.lock_problems(manifest, lock.read_text()) == [changed]
    assert [str(f) for f in check_target(manifest, CheckOptions()).failures if f.check == "deps"] == [
        f"{TARGET}: deps: {changed}"]
    with pytest.raises(BuildError, match="is not the wheel the lock records"):
        _dependency_lock(manifest, context)
    wheel.unlink()
    assert deps.lock_problems(manifest, lock.read_text()) == [
        f"the wheel of dllogger at {before[:12]} (wheels/{before}/{wheel.name}) is missing: run "
        "`repro lock TARGET --deps-only` and commit manifests/wheels/"]


def test_requirements_the_kit_cannot_lock(dllogger: tuple[Path, str, str], index: Index, tmp_path: Path) -> None:
    repo, _, _ = dllogger
    with pytest.raises(UsageError, match="is a VCS URL the kit cannot lock"):
        vcs.parse(f"git+{URL}@v1.0.0")
    assert vcs.parse("mpi4py") is None
    assert vcs.parse(f"-e git+{URL}#egg=dllogger") == vcs.Requirement(f"-e git+{URL}#egg=dllogger", URL, None,
                                                                     "dllogger")
    with pytest.raises(BuildError, match=f"dllogger: {URL}@v9 has no commit as of 2022-11-24T03:54:04Z"):
        deps.compile_lock(load_manifest(target(tmp_path, f"git+{URL}@v9#egg=dllogger")), index.url, mirrors(repo))


def test_repro_lock_reaches_the_vcs_source_through_git_mirror(dllogger: tuple[Path, str, str], index: Index,
                                                               tmp_path: Path) -> None:
    repo, before, _ = dllogger
    path = target(tmp_path)
    proc = run_cli("lock", str(path), "--deps-only", "--index-url", index.url, "--git-mirror", f"{URL}={repo}",
                   timeout=300)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (f"dependency lock written: {tmp_path / (TARGET + '.requirements.lock')} "
                           "(2 pins as of 2022-11-24T03:54:04Z)\n")
    assert (tmp_path / "wheels" / before / "dllogger-1.0.0-py3-none-any.whl").is_file()
