"""Python dependency locks (``repro lock``, ``repro check``, the build's refusal) against a package index the
test serves on loopback: the JSON simple API (PEP 691) with upload times, the way the real index answers,
holding small wheels with the dependency structure of tf-models-official 2.3.0 (tensorflow>=2.3.0 and an
unpinned pyyaml) and the releases that made it drift (tensorflow 2.3.1 and 2.6.2, PyYAML 6.0). Never the
network. Integration lane: each case runs uv, a real resolver, against the index served here."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import shutil
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import run_cli
from test_deps import ROOT, TARGET, target_copy

from repro.errors import BuildError
from repro.images import deps
from repro.images.build import _dependency_lock
from repro.images.check import CheckOptions, check_target
from repro.spec.manifest import load_manifest

#: (name, version, upload time, requirements): the upload dates of the real releases
RELEASES = [
    ("tf-models-official", "2.3.0", "2020-08-10T18:23:51Z", ["tensorflow>=2.3.0", "pyyaml"]),
    ("tensorflow-datasets", "3.0.0", "2020-05-12T21:21:11Z", []),
    ("tensorflow", "2.3.0", "2020-07-27T17:59:23Z", ["numpy<1.19.0,>=1.16.0"]),
    ("tensorflow", "2.3.1", "2020-09-24T22:48:02Z", ["numpy<1.19.0,>=1.16.0"]),
    ("tensorflow", "2.6.2", "2021-11-01T22:50:35Z", ["numpy~=1.19.2"]),
    ("tensorflow-gpu", "2.3.0", "2020-07-27T18:06:55Z", ["numpy<1.19.0,>=1.16.0"]),
    ("numpy", "1.18.5", "2020-06-04T20:17:06Z", []),
    ("numpy", "1.19.5", "2021-01-05T17:39:23Z", []),
    ("pyyaml", "5.3.1", "2020-03-18T21:23:45Z", []),
    ("pyyaml", "6.0", "2021-10-13T19:39:15Z", []),
]


def wheel(name: str, version: str, requires: list[str]) -> tuple[str, bytes]:
    dist = f"{name.replace('-', '_')}-{version}"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    files = {f"{dist}.dist-info/METADATA": meta,
             f"{dist}.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                         "Tag: py3-none-any\n")}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{dist}.dist-info/RECORD"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return f"{dist}-py3-none-any.whl", buf.getvalue()


class Index:
    """A PEP 691 index on 127.0.0.1: /simple/<project>/ as JSON with upload times, /files/<wheel>."""

    def __init__(self, releases: list[tuple[str, str, str, list[str]]]) -> None:
        self.files: dict[str, bytes] = {}
        self.projects: dict[str, list[dict]] = {}
        for name, version, uploaded, requires in releases:
            filename, data = wheel(name, version, requires)
            self.files[filename] = data
            self.projects.setdefault(name, []).append(
                {"filename": filename, "url": f"../../files/{filename}", "upload-time": uploaded,
                 "hashes": {"sha256": hashlib.sha256(data).hexdigest()}})
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self.do_GET(send=False)

            def do_GET(self, send: bool = True) -> None:
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "simple" and parts[1] in index.projects:
                    content = json.dumps({"meta": {"api-version": "1.1"}, "name": parts[1],
                                          "files": index.projects[parts[1]]}).encode()
                    kind = "application/vnd.pypi.simple.v1+json"
                elif len(parts) == 2 and parts[0] == "files" and parts[1] in index.files:
                    content, kind = index.files[parts[1]], "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                if send:
                    self.wfile.write(content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def index() -> Iterator[Index]:
    idx = Index(RELEASES)
    yield idx
    idx.server.shutdown()


def failures(path: Path, resolve: bool, index_url: str | None = None) -> list[str]:
    r = check_target(load_manifest(path), CheckOptions(resolve=resolve, index_url=index_url))
    return [str(f) for f in r.failures if f.check == "deps"]


#: what plain pip does today: no cutoff, and nothing tells it the base's tensorflow-gpu is a TensorFlow
AS_PIP_TODAY = {'cutoff: "2020-08-26T15:10:08Z"': 'cutoff: "2026-01-01"',
                "provides: [tensorflow]": "provides: []"}


def test_the_lock_as_of_the_cutoff_and_without_a_second_tensorflow(index: Index, tmp_path: Path) -> None:
    path = target_copy(tmp_path)
    lock, changed = deps.write_lock(load_manifest(path), index.url)
    text = lock.read_text(encoding="utf-8")
    assert changed and lock == tmp_path / f"{TARGET}.requirements.lock"
    # tensorflow-gpu is the base's: resolved against, not installed again
    assert deps.pins(text) == {"numpy": "1.18.5", "pyyaml": "5.3.1", "tensorflow-datasets": "3.0.0",
                               "tf-models-official": "2.3.0"}
    assert text.splitlines()[:6] == [
        f"# repro dependency lock for {TARGET}: pip install --require-hashes --no-deps -r this file",
        "# cutoff: 2020-08-26T15:10:08Z", "# python: 3.6 x86_64-manylinux_2_17",
        "# base ships (not installed again): tensorflow-gpu==2.3.0 (provides tensorflow)",
        "# requirements: tf-models-official==2.3.0; tensorflow-datasets==3.0.0", f"# index: {index.url}"]
    yaml_wheel = next(f for f in index.projects["pyyaml"] if "5.3.1" in f["filename"])
    assert f"--hash=sha256:{yaml_wheel['hashes']['sha256']}" in text
    assert deps.write_lock(load_manifest(path), index.url) == (lock, False)   # resolved again: the same lock
    assert failures(path, resolve=False) == [] and failures(path, resolve=True) == []


def test_before_the_fix_pyyaml_6_and_a_second_tensorflow_each_fail(index: Index, tmp_path: Path) -> None:
    """A lock as pip resolves it today (no cutoff; nothing says tensorflow-gpu is a TensorFlow): PyYAML 6.0
    and a second TensorFlow (2.3.1, the newest here the base's numpy pin admits), each failing the check."""
    (tmp_path / "today").mkdir()
    naive = deps.compile_lock(load_manifest(target_copy(tmp_path / "today", AS_PIP_TODAY)), index.url)
    assert deps.pins(naive) == {"numpy": "1.18.5", "pyyaml": "6.0", "tensorflow": "2.3.1",
                                "tensorflow-datasets": "3.0.0", "tf-models-official": "2.3.0"}
    path = target_copy(tmp_path)
    (tmp_path / f"{TARGET}.requirements.lock").write_text(naive, encoding="utf-8")
    other = f"{TARGET}: deps: {TARGET}.requirements.lock was made for other inputs: it says "
    offline = [
        other + "'cutoff: 2026-01-01', the manifest gives 'cutoff: 2020-08-26T15:10:08Z'",
        other + ("'base ships (not installed again): tensorflow-gpu==2.3.0', the manifest gives "
                 "'base ships (not installed again): tensorflow-gpu==2.3.0 (provides tensorflow)'"),
        (f"{TARGET}: deps: tensorflow==2.3.1 is a second distribution of tensorflow 2.3.0 "
         "(as tensorflow-gpu), which the base ships (image.build.base.ships)")]
    assert failures(path, resolve=False) == offline
    late = "after the cutoff 2020-08-26 15:10:08Z (image.build.deps.cutoff)"
    assert failures(path, resolve=True, index_url=index.url) == [
        *offline,
        f"{TARGET}: deps: pyyaml==6.0 was uploaded 2021-10-13, {late}",
        f"{TARGET}: deps: tensorflow==2.3.1 was uploaded 2020-09-24, {late}",
        f"{TARGET}: deps: pyyaml==6.0 in the lock resolves as 5.3.1 now from {index.url}",
        f"{TARGET}: deps: tensorflow==2.3.1 in the lock resolves as nothing now from {index.url}"]


def test_a_range_that_no_longer_resolves_fails(index: Index, tmp_path: Path) -> None:
    path = target_copy(tmp_path)
    deps.write_lock(load_manifest(path), index.url)
    # PyYAML 6.0 alone, uploaded after the cutoff
    gone = Index([r for r in RELEASES if not (r[0] == "pyyaml" and r[1] == "5.3.1")])
    try:
        (only,) = failures(path, resolve=True, index_url=gone.url)[-1:]
        assert only.startswith(f"{TARGET}: deps: the requirements no longer resolve from {gone.url}: "
                               f"{TARGET}: the requirements do not resolve as of 2020-08-26T15:10:08Z: ")
        assert "pyyaml" in only
    finally:
        gone.server.shutdown()


def test_missing_and_edited_locks_fail_the_check_and_the_build(index: Index, tmp_path: Path) -> None:
    path = target_copy(tmp_path)
    manifest = load_manifest(path)
    (tmp_path / "ctx").mkdir()
    shutil.copyfile(ROOT / "dockerfiles" / "tf2-models" / "Dockerfile", tmp_path / "ctx" / "Dockerfile")
    assert failures(path, resolve=False) == [
        f"{TARGET}: deps: {TARGET}.requirements.lock is missing: run `repro lock {TARGET} --deps-only`"]
    with pytest.raises(BuildError, match="requirements.lock is missing"):
        _dependency_lock(manifest, tmp_path / "ctx")
    lock, _ = deps.write_lock(manifest, index.url)
    _dependency_lock(manifest, tmp_path / "ctx")
    assert (tmp_path / "ctx" / "requirements.lock").read_text() == lock.read_text()
    lock.write_text(lock.read_text().replace("pyyaml==5.3.1", "pyyaml==6.0"), encoding="utf-8")
    edited = (f"{TARGET}.requirements.lock was changed after `repro lock` wrote it "
              "(its last line's sha256 does not match)")
    assert failures(path, resolve=False) == [f"{TARGET}: deps: {edited}"]
    with pytest.raises(BuildError, match="was changed after"):
        _dependency_lock(manifest, tmp_path / "ctx")


def test_repro_lock_deps_only_through_the_cli(index: Index, tmp_path: Path) -> None:
    path = target_copy(tmp_path)
    proc = run_cli("lock", str(path), "--deps-only", "--index-url", index.url, timeout=300)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (f"dependency lock written: {tmp_path / (TARGET + '.requirements.lock')} "
                           "(4 pins as of 2020-08-26T15:10:08Z)\n")
