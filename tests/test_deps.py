"""Python dependency locks of the seed targets: every manifest whose build runs pip declares its base and has a
lock that is current for its requirements, and ``repro lock`` refuses an index that is not a URL. Resolving
against a package index (uv, a loopback PEP 691 index) is tests/integration/test_deps_index.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from cli_helpers import run_cli

from repro.images import deps
from repro import paths
from repro.spec.manifest import Manifest, find_target, load_manifest, manifest_files

ROOT = Path(__file__).resolve().parents[1]


TARGET = "dlperf-tf2-rn50-v100"


#: CPU check targets: built on the test cluster's own Debian base (127.0.0.1:5000/repro-test/debian), they stand
#: for no publication, so there is no run date to lock as of; they pin their framework by version (torch from a
#: local wheel the index does not serve) and install into a venv of their own, not over a base's packages
def target_copy(tmp_path: Path, edit: dict[str, str] | None = None) -> Path:
    text = (ROOT / "manifests" / f"{TARGET}.yaml").read_text(encoding="utf-8")
    for old, new in (edit or {}).items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / f"{TARGET}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


CPU_CHECK_BASE = "127.0.0.1:5000/repro-test/"


_RUNS_PIP = re.compile(r"\bpip3?\s+(install|wheel)\b")


def runs_pip(m: Manifest) -> bool:
    build = m.image.get("build")
    if build is None:
        return False
    return bool(_RUNS_PIP.search((paths.dockerfiles_dir() / build["dockerfile"] / "Dockerfile").read_text()))


def base_and_lock_problems(m: Manifest) -> list[str]:
    """What a seed manifest whose build runs pip lacks: its base declared, its dependency lock current."""
    build, fix = m.image["build"], f"run `repro lock {m.id} --deps-only` and commit the lock"
    out = [f"{m.path.name}: image.build.base.{key} is not declared (read it from the image's release notes, "
           "Dockerfile or the publisher's logs, with its source)" for key in ("python", "ships")
           if key not in build["base"]]
    if deps.declared(m) is None:
        return [*out, f"{m.path.name}: image.build.deps is not declared (cutoff, why, requirements); then {fix}"]
    path = deps.deps_lock_path(m)
    text = path.read_text(encoding="utf-8") if path.is_file() else None
    return out + [f"{m.path.name}: {p}" + ("" if "repro lock" in p else f"; {fix}")
                  for p in deps.lock_problems(m, text)]


def test_every_seed_whose_build_runs_pip_declares_its_base_and_has_a_current_lock() -> None:
    """Made against the real index (https://pypi.org/simple) and committed: each lock matches its manifest's
    requirements, cutoff, Python and base, and every VCS wheel it names is beside the manifests."""
    seeds = [load_manifest(f) for f in manifest_files()]
    pip = [m for m in seeds if runs_pip(m)]
    exempt = {m.id for m in pip if m.image["build"]["base"]["ref"].startswith(CPU_CHECK_BASE)}
    assert exempt == {"mpi-rn50-cpu", "torch-rn50-cpu", "paddle-rn50-cpu", "tf-cnn-ps-cpu"}
    # OneFlow's CUDA wheels are on OneFlow's own find-links page, which no dependency lock can resolve (pinned by
    # version only; see dockerfiles/oneflow and the targets' notes), and gluon-cv's Horovod is an sdist built
    # against what the image installed before it (dockerfiles/gluoncv)
    unlockable = {m.id for m in pip if m.image["build"]["dockerfile"] in ("oneflow", "gluoncv")}
    assert unlockable == {"dlperf-oneflow-bert-v100", "dlperf-oneflow-bert-noclip-v100", "dlperf-oneflow-rn50-v100",
                          "dlperf-mxnet-gluoncv-rn50-v100"}
    locked = [m for m in pip if m.id not in exempt | unlockable]
    assert len(locked) == 21
    assert [p for m in locked for p in base_and_lock_problems(m)] == []
    tf2 = deps.pins(deps.deps_lock_path(find_target(TARGET)).read_text(encoding="utf-8"))
    assert tf2["pyyaml"] == "5.3.1" and "tensorflow" not in tf2 and "tensorflow-gpu" not in tf2


def test_the_seed_check_names_the_manifest_and_the_fix(tmp_path: Path) -> None:
    text = (ROOT / "manifests" / "paddle-rn50-a100.yaml").read_text(encoding="utf-8")
    start = text.index("      python:\n")
    undeclared = text[:start] + text[text.index("      ships:\n", start):]
    (tmp_path / "paddle-rn50-a100.yaml").write_text(undeclared, encoding="utf-8")
    assert base_and_lock_problems(load_manifest(tmp_path / "paddle-rn50-a100.yaml")) == [
        "paddle-rn50-a100.yaml: image.build.base.python is not declared (read it from the image's release notes, "
        "Dockerfile or the publisher's logs, with its source)",
        "paddle-rn50-a100.yaml: paddle-rn50-a100.requirements.lock is missing: run `repro lock paddle-rn50-a100 "
        "--deps-only`"]
    (tmp_path / "paddle-rn50-a100.yaml").write_text(text.replace('"faiss-cpu"', '"faiss-gpu"'), encoding="utf-8")
    shutil.copyfile(ROOT / "manifests" / "paddle-rn50-a100.requirements.lock",
                    tmp_path / "paddle-rn50-a100.requirements.lock")
    (stale,) = base_and_lock_problems(load_manifest(tmp_path / "paddle-rn50-a100.yaml"))
    assert stale.startswith("paddle-rn50-a100.yaml: paddle-rn50-a100.requirements.lock was made for other inputs: "
                            "it says 'requirements: prettytable; ")
    assert stale.endswith("easydict'; run `repro lock paddle-rn50-a100 --deps-only` and commit the lock")
    assert "faiss-cpu; easydict', the manifest gives 'requirements: " in stale and "faiss-gpu" in stale


def test_an_index_url_that_is_not_a_url_is_refused(tmp_path: Path) -> None:
    path = target_copy(tmp_path)
    proc = run_cli("lock", str(path), "--deps-only", "--index-url", "--find-links=/tmp")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert "index URL '--find-links=/tmp' is not an http://, https:// or file:// URL" in proc.stderr
