"""Lock files and package index answers as untrusted input: a dependency lock installs pinned, hashed
distributions and nothing else; an image lock that cannot be read fails `check` and `plan --script`; the
index client behind `check --resolve` (PEP 691) gives up within a deadline and a size cap and checks the
shape of what it reads, against a real HTTP server on loopback started here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_check import failures, manifest, upstream  # noqa: F401  (the fixture)

from repro.images import deps
from repro.spec.manifest import load_manifest


def resealed(path: Path, *extra: str, index: str | None = None) -> None:
    """The target's dependency lock with ``extra`` lines after its pins, sealed again (a lock a hostile sender
    edited and sealed as `repro lock` does); ``index``: its ``# index:`` line says that URL."""
    m = load_manifest(path)
    lock = deps.deps_lock_path(m)
    lines = lock.read_text(encoding="utf-8").splitlines()[:-1]
    if index is not None:
        lines = [f"# index: {index}" if ln.startswith("# index: ") else ln for ln in lines]
    lock.write_text(deps.seal([*lines, *extra]), encoding="utf-8")


HASH = "    --hash=sha256:" + "3" * 64
LINES = [
    ("extra-index-url", ["--extra-index-url https://evil.example/simple"]),
    ("index-url-other", ["--index-url https://evil.example/simple"]),
    ("find-links", ["--find-links https://evil.example/"]),
    ("requirement-file", ["-r /etc/other.txt"]),
    ("constraint-file", ["-c other.txt"]),
    ("editable-git", ["-e git+https://evil.example/x.git#egg=x"]),
    ("file-url", ["file:///tmp/x.whl"]),
    ("http-url", ["http://evil.example/x-1.0-py3-none-any.whl"]),
    ("direct-http", ["x @ http://evil.example/x-1.0-py3-none-any.whl \\", HASH]),
    ("direct-file-elsewhere", ["x @ file:///home/u/x-1.0-py3-none-any.whl \\", HASH]),
    ("no-hash", ["six==1.15.0"]),
    ("range", ["six>=1.15.0 \\", HASH]),
    ("hash-md5", ["six==1.15.0 \\", "    --hash=md5:" + "3" * 32]),
    ("hash-alone", [HASH]),
    ("continued-into-nothing", ["six==1.15.0 \\", HASH + " \\"]),
    ("option-after-pin", ["six==1.15.0 \\", "    --global-option=--evil \\", HASH]),
    ("pin-with-marker-url", ["six==1.15.0; python_version > '3' --index-url http://evil.example \\", HASH]),
]


@pytest.mark.parametrize("case,extra", LINES, ids=[c[0] for c in LINES])
def test_a_lock_line_that_is_no_hashed_pin_fails_check(upstream: tuple[Path, str], tmp_path: Path,  # noqa: F811
                                                        case: str, extra: list[str]) -> None:
    mirror, commit = upstream
    path = manifest(tmp_path, commit)
    assert failures(path, mirror) == []
    resealed(path, *extra)
    got = failures(path, mirror)
    assert len(got) == 1 and got[0].startswith("test-check-t: deps: t.requirements.lock line "), got
    assert "is not a pinned distribution with its hashes" in got[0]


def test_a_lock_that_is_not_utf8_fails_check_clearly(upstream: tuple[Path, str], tmp_path: Path) -> None:  # noqa: F811
    mirror, commit = upstream
    path = manifest(tmp_path, commit)
    lock = deps.deps_lock_path(load_manifest(path))
    lock.write_bytes(lock.read_bytes().replace(b"pytorch-ignite", b"pytorch-\xffgnite"))
    at = lock.read_bytes().index(b"\xff")
    assert failures(path, mirror) == [f"test-check-t: deps: {lock}: not UTF-8 text (byte 0xff at offset {at}): "
                                      "run `repro lock test-check-t --deps-only` again"]


def test_an_http_index_in_a_lock_fails_unless_named_on_the_command_line(upstream: tuple[Path, str],  # noqa: F811
                                                                         tmp_path: Path) -> None:
    from repro.images.check import CheckOptions, check_target

    mirror, commit = upstream
    path = manifest(tmp_path, commit)
    m = load_manifest(path)
    resealed(path, index="http://mirror.example/simple")
    got = failures(path, mirror)
    assert got == ["test-check-t: deps: t.requirements.lock reads its index over plain http "
                   "(http://mirror.example/simple): anyone on the way can answer for it; give it with "
                   "--index-url to accept it"], got
    named = check_target(m, CheckOptions(git_mirrors=(("https://github.com/example/", f"{mirror}/"),),
                                         index_url="http://mirror.example/simple"))
    assert not [f for f in named.failures if f.check == "deps"], named.failures


def test_the_seed_locks_pass_the_line_check() -> None:
    from repro.spec.manifest import find_target, manifest_files

    checked = 0
    for f in manifest_files():
        m = find_target(f.stem)
        lock = deps.deps_lock_path(m)
        if lock.is_file():
            assert deps.line_problems(lock.read_text(encoding="utf-8"), lock.name) == [], lock
            checked += 1
    assert checked >= 10


# ------------------------------------------------------------------ the image lock
BROKEN_LOCKS = [("not-json", "{oops"), ("a-list", "[1]"), ("images-a-list", '{"lock_version": 1, "images": [1]}'),
                ("sources-a-string", '{"lock_version": 1, "images": {}, "sources": "x"}'),
                ("no-image", '{"lock_version": 1, "images": {}}')]


@pytest.mark.parametrize("case,text", BROKEN_LOCKS[:-1], ids=[c[0] for c in BROKEN_LOCKS[:-1]])
def test_a_broken_image_lock_fails_check(upstream: tuple[Path, str], tmp_path: Path, case: str,  # noqa: F811
                                         text: str) -> None:
    mirror, commit = upstream
    path = manifest(tmp_path, commit)
    (tmp_path / "t.lock.json").write_text(text)
    got = failures(path, mirror)
    assert len(got) == 1 and got[0].startswith(f"test-check-t: lock: {tmp_path / 't.lock.json'}"), got


@pytest.mark.parametrize("case,text", BROKEN_LOCKS, ids=[c[0] for c in BROKEN_LOCKS])
def test_a_broken_image_lock_fails_plan_script(tmp_path: Path, case: str, text: str) -> None:
    from test_hostile_input import run_cli

    good = Path(__file__).parent / "data" / "good"
    doc = yaml.safe_load((good / "minimal.yaml").read_text())
    assert doc["image"]["registry"]["digest"] == ""  # pinned by the lock
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(SLURM_HOSTS)
    if case == "no-image":
        code, out, _ = run_cli(["plan", str(path), "--script", "--hosts", str(hosts)])
        assert code == 2 and "no lock pins its image" in out, out
    (tmp_path / "m.lock.json").write_text(text)
    code, out, _ = run_cli(["plan", str(path), "--script", "--hosts", str(hosts)])
    assert code == 2, out
    assert "m.lock.json" in out, out


SLURM_HOSTS = """schema_version: 1
defaults: {user: root, gpus: 8}
nodes:
  - {name: g1, address: 10.77.0.11}
scheduler: {kind: slurm, partition: debug, time: 15, container: docker}
"""
