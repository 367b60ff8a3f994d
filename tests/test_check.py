"""``repro check`` against git repositories the test makes: every failure kind, one line each.

The repository below is laid out like NVIDIA DeepLearningExamples' PyTorch ConvNets at the
commits the seed targets pin (a requirements file with a git:// dllogger URL, a statement
that spans two lines); manifests name it by its GitHub URL and reach it through
``--git-mirror``, so nothing touches the network.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import run_cli

from repro.images import deps, vcs
from repro.images.check import CheckOptions, check_target, upstream_from
from repro.images.source import mirrored, parse_mirror, prepare_source
from repro.spec.manifest import load_manifest

ROOT = Path(__file__).resolve().parent.parent
GOOD = ROOT / "tests" / "data" / "good"
URL = "https://github.com/example/ConvNets"
GIT_URL = "git+git://github.com/NVIDIA/dllogger.git@26a0f8f1958de2c0c460925ff6102a4d2486d6cc#egg=dllogger"
RUNNER = ("        config.inter_op_parallelism_threads = max(\n"
          "            2, (multiprocessing.cpu_count() // max(hvd.size(), 8) - 2))\n")
BUNDLE = "MLNX_OFED_LINUX-5.0-2.1.8.0-ubuntu16.04-x86_64"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A repository ``ConvNets`` under a mirror directory; its pinned commit."""
    mirror = tmp_path_factory.mktemp("mirror")
    repo = mirror / "ConvNets"
    (repo / "bench" / "runtime").mkdir(parents=True)
    (repo / "bench" / "requirements.txt").write_text(f"pytorch-ignite\n{GIT_URL}\n")
    (repo / "bench" / "runtime" / "runner.py").write_text("import multiprocessing\n" + RUNNER)
    (repo / "bench" / "main.py").write_text("x = 1\nx = 1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pinned")
    return mirror, git(repo, "rev-parse", "HEAD")


REWRITE = {"file": "bench/requirements.txt", "old": GIT_URL, "new": GIT_URL.replace("git+git://", "git+https://"),
           "why": "GitHub no longer serves git://"}


def manifest(tmp_path: Path, commit: str, *, name: str = "t", patches: list[dict[str, str]] | None = None,
             dockerfile: str = "requirements", rdma: dict[str, Any] | None = None,
             base: str = "paddlepaddle/paddle-benchmark:2.5.0-cuda11.2-cudnn8-runtime-ubuntu16.04",
             os_: str | None = "ubuntu16.04", published: str | None = None, lock: bool = True) -> Path:
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text(encoding="utf-8"))
    data.pop("published")
    data["id"] = f"test-check-{name}"
    data["image"] = {"build": {"dockerfile": dockerfile, "base": {"ref": base, "digest": ""},
                               "tag": "repro/test-check:1"}}
    if os_:
        data["image"]["build"]["base"]["os"] = os_
    if published:
        data["image"]["build"]["base"]["published"] = published
    data["source"] = {"repository": URL, "commit": commit, "path": "/workspace/src", "subdir": "bench",
                      "patches": [REWRITE] if patches is None else patches}
    if rdma:
        data["rdma"] = rdma
    if dockerfile == "requirements":
        data["image"]["build"]["base"]["python"] = {"version": "3.6", "source": "test"}
        data["image"]["build"]["deps"] = {"cutoff": "2020-03-31", "why": "test", "requirements": LOCKED}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    if dockerfile == "requirements" and lock:
        write_lock(path)
    return path


#: the requirement lines of bench/requirements.txt with the git:// rewrite applied
LOCKED = ["pytorch-ignite", REWRITE["new"]]


def write_lock(path: Path) -> None:
    """A sealed dependency lock for the manifest at ``path``, as `repro lock` writes one (pins and the dllogger
    wheel stand-in made up here: these tests are about the sources, tests/integration/test_deps_index.py about resolving)."""
    m = load_manifest(path)
    wheel = path.parent / "wheels" / ("1" * 40) / "dllogger-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    wheel.write_bytes(b"stand-in")
    req = vcs.parse(REWRITE["new"])
    assert req is not None
    built = vcs.Wheel(req, "1" * 40, wheel, hashlib.sha256(b"stand-in").hexdigest())
    text = deps.seal([*deps.header(m, "https://pypi.org/simple"), "pytorch-ignite==0.3.0 \\",
                      f"    --hash=sha256:{'2' * 64}", *vcs.lock_lines(built)])
    deps.deps_lock_path(m).write_text(text, encoding="utf-8")


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", *args, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                  "HOME": str(ROOT / "tests")})


def mirror_args(mirror: Path) -> list[str]:
    return ["--git-mirror", f"https://github.com/example/={mirror}/"]


def failures(path: Path, mirror: Path, cache: Path | None = None,
             dockerfiles: Path | None = None) -> list[str]:
    r = check_target(load_manifest(path), CheckOptions(git_mirrors=(("https://github.com/example/", f"{mirror}/"),),
                                                       ofed_cache=cache, dockerfiles=dockerfiles))
    return [str(f) for f in r.failures]


CLEAN = ("ok   test-check-t: commit {commit:.12} in {mirror}/ConvNets; 1 patch(es) apply once each; "
         "bench/requirements.txt: no git:// URL; image.build.deps.requirements is bench/requirements.txt at "
         "{commit:.12}; 5 file(s) dockerfiles/requirements/Dockerfile copies exist; t.requirements.lock: 2 pins as of "
         "2020-03-31, no second distribution of what the base ships")


def test_a_clean_target_passes_through_the_mirror(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    proc = run_check(str(manifest(tmp_path, commit)), *mirror_args(mirror))
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == CLEAN.format(commit=commit, mirror=mirror) + "\n"


def test_every_failure_is_one_line_and_a_nonzero_exit(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    bad = manifest(tmp_path, commit, name="bad", patches=[
        {"file": "bench/runtime/runner.py", "why": "one line in the report's copy",
         "old": "config.inter_op_parallelism_threads = max(2, (multiprocessing.cpu_count() // max(hvd.size(), 8) - 2))",
         "new": "config.inter_op_parallelism_threads = 4"}])
    proc = run_check(str(bad), str(manifest(tmp_path, commit)), *mirror_args(mirror))
    assert proc.returncode == 1 and proc.stderr == ""
    assert proc.stdout.splitlines() == [
        "FAIL test-check-bad: patch: source.patches[0] (bench/runtime/runner.py): the old text "
        "'config.inter_op_parallelism_threads = max(2, (multiprocessing.cpu_count() // max...' occurs 0 times, "
        "not once",
        f"FAIL test-check-bad: requirements: bench/requirements.txt:2: {GIT_URL} uses git://, which GitHub no longer "
        "serves; add a source.patches entry that rewrites it to git+https://",
        f"FAIL test-check-bad: deps: image.build.deps.requirements {LOCKED} differs from bench/requirements.txt at "
        f"{commit[:12]} (patches applied): ['pytorch-ignite', '{GIT_URL}']; copy the file's requirement lines into "
        "the manifest",
        CLEAN.format(commit=commit, mirror=mirror),
    ]


def test_a_bad_manifest_exits_2_before_any_check(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text((GOOD / "minimal.yaml").read_text(encoding="utf-8").replace("framework: pytorch", "framework: x"))
    proc = run_check(str(path))
    assert proc.returncode == 2 and proc.stdout == "" and "framework" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_commit(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, _ = upstream
    assert failures(manifest(tmp_path, "0" * 40), mirror) == [
        f"test-check-t: commit: {'0' * 40} is not in {mirror}/ConvNets"]


def test_a_source_that_cannot_be_reached_is_unverifiable_never_ok(upstream: tuple[Path, str], tmp_path: Path) -> None:
    """Offline (no route to the repository's host), nothing of the source is checked: the target says so and fails;
    a mirror (--git-mirror) is the way to check it."""
    _, commit = upstream
    path = manifest(tmp_path, commit)
    proc = run_check(str(path), "--git-mirror", "https://github.com/example/=https://nonexistent.invalid/")
    assert (proc.returncode, proc.stderr) == (1, "")
    assert proc.stdout == (
        "FAIL test-check-t: unverifiable: offline: cannot reach https://nonexistent.invalid/ConvNets (Could not "
        "resolve host: nonexistent.invalid), so its commit, patches and files were not checked; read it from a "
        "mirror with --git-mirror PREFIX=URL: PREFIX the start of the repository's address, URL a directory or "
        "git server holding the rest as a repository with commit " + commit[:12] + ", e.g. --git-mirror "
        "https://github.com/=/srv/git/ reads https://github.com/example/ConvNets from /srv/git/example/ConvNets\n")


@pytest.mark.parametrize("patch, message", [
    ({"file": "bench/main.py", "old": "x = 1\n", "new": "x = 2\n"},
     "source.patches[1] (bench/main.py): the old text 'x = 1\\n' occurs 2 times, not once"),
    ({"file": "bench/gone.py", "old": "x", "new": "y"}, "source.patches[1]: no file bench/gone.py at {short}"),
    ({"file": "bench/requirements.txt", "old": "git+git://", "new": "git+https://"},   # applied already
     "source.patches[1] (bench/requirements.txt): the old text 'git+git://' occurs 0 times, not once"),
])
def test_a_patch_that_does_not_apply_exactly_once(upstream: tuple[Path, str], tmp_path: Path,
                                                  patch: dict[str, str], message: str) -> None:
    mirror, commit = upstream
    path = manifest(tmp_path, commit, patches=[REWRITE, {**patch, "why": "test"}])
    assert failures(path, mirror) == [f"test-check-t: patch: {message.format(short=commit[:12])}"]


def test_the_two_line_statement_matches_once(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    path = manifest(tmp_path, commit, patches=[REWRITE, {"file": "bench/runtime/runner.py", "why": "test",
                                                         "old": RUNNER.strip(), "new": "x = 4"}])
    assert failures(path, mirror) == []


def test_a_copied_file_that_is_not_at_the_commit(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    data = yaml.safe_load(manifest(tmp_path, commit).read_text())
    data["source"]["subdir"] = "mxnet"          # like DLE 99b1c89 MxNet RN50v1.5: no requirements.txt
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    assert failures(tmp_path / "t.yaml", mirror) == [
        f"test-check-t: copy: dockerfiles/requirements installs the requirements of mxnet/requirements.txt, which is "
        f"not in {URL} at {commit[:12]}"]
    assert failures(manifest(tmp_path, commit, dockerfile="source"), mirror) == []


def test_the_mirror_option_maps_a_prefix_and_is_checked() -> None:
    assert parse_mirror("https://github.com/=/srv/git/") == ("https://github.com/", "/srv/git/")
    assert mirrored("https://github.com/NVIDIA/DLE", (("https://github.com/", "/srv/git/"),
                                                      ("https://github.com/NVIDIA/", "/srv/nv/"))) == "/srv/nv/DLE"
    assert mirrored("https://gitlab.com/x", (("https://github.com/", "/srv/"),)) == "https://gitlab.com/x"
    with pytest.raises(ValueError, match="not PREFIX=URL"):
        parse_mirror("/srv/git")
    proc = run_check("ngc-pytorch-rn50-v100", "--git-mirror", "nothing")
    assert proc.returncode == 2 and "not PREFIX=URL" in proc.stderr


def test_images_fetch_the_source_through_the_mirror(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    src = {"repository": URL, "commit": commit, "path": "/w", "patches": [REWRITE]}
    stamp = prepare_source(src, tmp_path / "source", (("https://github.com/example/", f"{mirror}/"),))
    assert stamp["repository"] == URL and stamp["commit"] == commit
    assert "git+https://github.com/NVIDIA/dllogger" in (tmp_path / "source" / "bench" / "requirements.txt").read_text()


# --- RDMA: the OFED bundle's distro and checksum -----------------------------------------------------

MLNX = {"strategy": "mlnx-ofed", "version": "5.0-2.1.8.0", "sha256": "", "flags": ["--user-space-only"]}


def bundle(cache: Path, top: str = BUNDLE) -> str:
    cache.mkdir(exist_ok=True)
    path = cache / f"{BUNDLE}.tgz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"{top}/mlnxofedinstall")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"#!\n"))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_mlnx_ofed_needs_the_base_os(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    proc = run_check(str(manifest(tmp_path, commit, rdma=MLNX, os_=None, lock=False)), *mirror_args(mirror))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "t.yaml:" in proc.stderr and "rdma.strategy: strategy mlnx-ofed needs the base image's OS" in proc.stderr


def test_mlnx_ofed_distro_must_match_the_base_os(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    # the old recipe: an ubuntu18.04 bundle on the ubuntu16.04 Paddle benchmark image
    assert failures(manifest(tmp_path, commit, rdma=MLNX, os_="ubuntu18.04"), mirror) == [
        "test-check-t: rdma: the base paddlepaddle/paddle-benchmark:2.5.0-cuda11.2-cudnn8-runtime-ubuntu16.04 names "
        "ubuntu16.04, but image.build.base.os is ubuntu18.04"]
    cache = tmp_path / "cache"
    bundle(cache, top="MLNX_OFED_LINUX-5.0-2.1.8.0-ubuntu18.04-x86_64")
    assert failures(manifest(tmp_path, commit, rdma=MLNX), mirror, cache) == [
        f"test-check-t: rdma: {cache / BUNDLE}.tgz holds MLNX_OFED_LINUX-5.0-2.1.8.0-ubuntu18.04-x86_64, not a "
        "build for ubuntu16.04"]


def test_declared_and_locked_checksums_are_verified(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    cache = tmp_path / "cache"
    sha = bundle(cache)
    assert failures(manifest(tmp_path, commit, rdma={**MLNX, "sha256": sha}), mirror, cache) == []
    assert failures(manifest(tmp_path, commit, rdma={**MLNX, "sha256": "a" * 64}), mirror, cache) == [
        f"test-check-t: checksum: {cache / BUNDLE}.tgz: sha256 {sha}, rdma.sha256 has {'a' * 64}"]
    path = manifest(tmp_path, commit, rdma=MLNX)
    (tmp_path / "t.lock.json").write_text(json.dumps({"lock_version": 1, "target": "test-check-t", "images": {},
                                                      "sources": {}, "files": {BUNDLE: "b" * 64}}))
    assert failures(path, mirror, cache) == [
        f"test-check-t: checksum: {cache / BUNDLE}.tgz: sha256 {sha}, the lock t.lock.json has {'b' * 64}"]


def test_inbox_needs_apt(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    path = manifest(tmp_path, commit, rdma={"strategy": "inbox"}, base="nvcr.io/nvidia/pytorch:21.03-py3",
                    os_="centos7")
    assert failures(path, mirror) == [
        "test-check-t: rdma: strategy inbox installs rdma-core with apt-get; the base OS centos7 has no apt-get"]


# --- apt on CUDA bases older than NVIDIA's April 2022 key rotation ------------------------------------------

NGC_2003 = "nvcr.io/nvidia/pytorch:20.03-py3"
APT_FAIL = ("test-check-t: apt: {part} runs apt-get update on nvcr.io/nvidia/pytorch:20.03-py3, a CUDA base "
            "{when}: over the base's CUDA sources it fails with NO_PUBKEY A4B469963BF863CC; read the "
            "distribution's sources only (repro.images.apt.dist_apt_install) or install NVIDIA's "
            "cuda-keyring by pinned sha256 first")
BEFORE = "published 2020-03, before NVIDIA's April 2022 CUDA apt key rotation"


def dockerfiles_with(tmp_path: Path, run: str) -> Path:
    """The shipped requirements Dockerfile with one more RUN at its end, in a --dockerfiles directory."""
    text = (ROOT / "dockerfiles" / "requirements" / "Dockerfile").read_text(encoding="utf-8")
    (tmp_path / "dockerfiles" / "requirements").mkdir(parents=True)
    (tmp_path / "dockerfiles" / "requirements" / "Dockerfile").write_text(text + run, encoding="utf-8")
    return tmp_path / "dockerfiles"


def test_an_apt_update_over_every_source_of_an_old_cuda_base_fails(upstream: tuple[Path, str],
                                                                    tmp_path: Path) -> None:
    mirror, commit = upstream
    path = manifest(tmp_path, commit, base=NGC_2003, os_="ubuntu18.04", published="2020-03 (NGC 20.03)")
    run = "RUN apt-get update \\\n && apt-get install -y --no-install-recommends numactl\n"
    assert failures(path, mirror, dockerfiles=dockerfiles_with(tmp_path, run)) == [
        APT_FAIL.format(part="dockerfiles/requirements/Dockerfile", when=BEFORE)]


def test_apt_over_a_cuda_base_of_unknown_date_fails_and_after_the_rotation_passes(upstream: tuple[Path, str],
                                                                                   tmp_path: Path) -> None:
    mirror, commit = upstream
    run = "RUN apt -o Acquire::Retries=3 update && apt install -y numactl\n"
    dockerfiles = dockerfiles_with(tmp_path, run)
    unknown = manifest(tmp_path, commit, name="t", base=NGC_2003, os_="ubuntu18.04")
    assert failures(unknown, mirror, dockerfiles=dockerfiles) == [
        APT_FAIL.format(part="dockerfiles/requirements/Dockerfile",
                        when="of unknown date (image.build.base.published)")]
    later = manifest(tmp_path, commit, name="t", base=NGC_2003, os_="ubuntu18.04", published="2022-05")
    assert failures(later, mirror, dockerfiles=dockerfiles) == []
    cpu = manifest(tmp_path, commit, name="t", base="debian:bookworm", os_=None, published="2020-03")
    assert failures(cpu, mirror, dockerfiles=dockerfiles) == []


def test_nvidias_keyring_by_checksum_is_accepted(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    path = manifest(tmp_path, commit, base=NGC_2003, os_="ubuntu18.04", published="2020-03")
    run = ("RUN curl -fsSLO https://developer.download.nvidia.com/compute/cuda/repos/ubuntu1804/x86_64/"
           "cuda-keyring_1.0-1_all.deb \\\n"
           " && echo \"$SHA  cuda-keyring_1.0-1_all.deb\" | sha256sum -c - \\\n"
           " && dpkg -i cuda-keyring_1.0-1_all.deb && apt-get update\n")
    assert failures(path, mirror, dockerfiles=dockerfiles_with(tmp_path, run)) == []


def test_the_kits_own_layers_read_the_distribution_sources_only(upstream: tuple[Path, str],
                                                                 tmp_path: Path) -> None:
    """The RDMA inbox layer on an old CUDA base: its apt-get update passes the check, and says so."""
    mirror, commit = upstream
    path = manifest(tmp_path, commit, rdma={"strategy": "inbox"}, base=NGC_2003, os_="ubuntu18.04",
                    published="2020-03")
    mirrors = (("https://github.com/example/", f"{mirror}/"),)
    r = check_target(load_manifest(path), CheckOptions(git_mirrors=mirrors))
    assert r.failures == ()
    assert "apt reads the distribution's sources only (CUDA base published 2020-03)" in r.passed


def test_a_requirements_build_without_a_declared_lock_fails(upstream: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream
    data = yaml.safe_load(manifest(tmp_path, commit).read_text())
    del data["image"]["build"]["deps"]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    assert failures(tmp_path / "t.yaml", mirror) == [
        "test-check-t: deps: dockerfiles/requirements installs from a dependency lock, but the manifest declares no "
        "image.build.deps: declare image.build.base.python and ships and image.build.deps (cutoff, why, "
        "requirements), then run `repro lock test-check-t --deps-only`"]


def test_the_image_a_dockerfile_is_from() -> None:
    assert upstream_from("ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:20.06-py3\nFROM ${FROM_IMAGE_NAME}\n") == \
        "nvcr.io/nvidia/pytorch:20.06-py3"
    assert upstream_from("# x\nFROM nvcr.io/nvidia/mxnet:19.07-py3\nFROM other AS b\n") == "nvcr.io/nvidia/mxnet:19.07-py3"
    assert upstream_from("ARG B=a:1\nFROM --platform=linux/amd64 $B AS build\n") == "a:1"
    assert upstream_from("RUN true\n") is None


@pytest.fixture(scope="module")
def upstream_dockerfile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The upstream repository with a Dockerfile of its own beside the code, FROM another image than the base."""
    mirror = tmp_path_factory.mktemp("mirror-dockerfile")
    repo = mirror / "ConvNets"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "requirements.txt").write_text(f"pytorch-ignite\n{GIT_URL}\n")
    (repo / "bench" / "Dockerfile").write_text("ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:20.06-py3\n"
                                                "FROM ${FROM_IMAGE_NAME}\nADD . /workspace/rn50\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pinned")
    return mirror, git(repo, "rev-parse", "HEAD")


def test_the_sources_own_dockerfile_is_from_the_base_or_the_manifest_says_why(
        upstream_dockerfile: tuple[Path, str], tmp_path: Path) -> None:
    mirror, commit = upstream_dockerfile
    other = manifest(tmp_path, commit, name="other", base="nvcr.io/nvidia/pytorch:20.03-py3", os_="ubuntu18.04")
    assert [f for f in failures(other, mirror) if ": base: " in f] == [
        f"test-check-other: base: bench/Dockerfile at {commit[:12]} is FROM nvcr.io/nvidia/pytorch:20.06-py3, the "
        "manifest builds on nvcr.io/nvidia/pytorch:20.03-py3: build on it, or give image.build.upstream_from "
        "{ref: nvcr.io/nvidia/pytorch:20.06-py3, why: ...}"]
    same = manifest(tmp_path, commit, name="same", base="nvcr.io/nvidia/pytorch:20.06-py3", os_="ubuntu18.04")
    assert [f for f in failures(same, mirror) if ": base: " in f] == []
    data = yaml.safe_load(other.read_text())
    data["image"]["build"]["upstream_from"] = {"ref": "nvcr.io/nvidia/pytorch:20.06-py3", "why": "the report's image"}
    other.write_text(yaml.safe_dump(data, sort_keys=False))
    write_lock(other)
    assert [f for f in failures(other, mirror) if ": base: " in f] == []
    r = check_target(load_manifest(other), CheckOptions(git_mirrors=(("https://github.com/example/", f"{mirror}/"),)))
    assert "bench/Dockerfile is FROM nvcr.io/nvidia/pytorch:20.06-py3, the base is nvcr.io/nvidia/pytorch:20.03-py3 " \
           "(image.build.upstream_from says why)" in r.passed


def test_a_fail_is_one_line_with_the_cause_and_the_tools_output_indented_under_it(tmp_path: Path) -> None:
    """A repository git cannot read: the FAIL line names the target, the check and the cause; git's own lines
    follow, indented, never run into the cause."""
    proc = run_check(str(manifest(tmp_path, "1" * 40)), "--git-mirror", f"https://github.com/example/={tmp_path}/no/")
    assert proc.returncode == 1 and proc.stderr == ""
    head, *rest = proc.stdout.splitlines()
    assert head == f"FAIL test-check-t: commit: cannot read {tmp_path}/no/ConvNets: git fetch failed"
    assert rest and all(ln.startswith("    ") for ln in rest) and any("fatal:" in ln for ln in rest), rest


def test_each_target_is_reported_as_it_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check of several targets (each a fetch of its sources) says each target's outcome before the next
    target's check starts, not all of them at the end."""
    from click.testing import CliRunner

    import repro.cli.site as site
    import repro.images.check as check
    from repro.cli import cli

    order: list[str] = []

    def checked(m, opts):  # noqa: ANN001, ANN202
        order.append(f"check {m.id}")
        return check.Checked(m.id, ("nothing slow",))

    monkeypatch.setattr(check, "check_target", checked)
    monkeypatch.setattr(site, "echo", lambda text, **kw: order.append(f"echo {text}"))
    res = CliRunner().invoke(cli, ["check", "torch-rn50-cpu", "paddle-rn50-cpu"])
    assert res.exit_code == 0, res.output
    assert order == ["check torch-rn50-cpu", "echo ok   torch-rn50-cpu: nothing slow",
                     "check paddle-rn50-cpu", "echo ok   paddle-rn50-cpu: nothing slow"]
