"""Digests over the OCI distribution API against a real registry, with no Docker engine anywhere.

Each test module run starts its own reference registry (Debian's ``docker-registry`` binary) on a free
port of 127.0.0.1 in a temporary folder, one anonymous and one behind an htpasswd file, and pushes a tiny
image into them over the registry API itself (blob uploads and manifest PUTs): an OCI image manifest, an
OCI index naming it for linux/amd64, and an index naming only linux/arm64. ``repro lock`` and the digest
checks then run with DOCKER_HOST pointing nowhere.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from repro.errors import BuildError, EnvironmentUnavailable
from repro.images import oci
from repro.images.refs import parse_ref

pytestmark = pytest.mark.registry

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "repro-user", "s3cret-Pa55word"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class Registry:
    host: str                 # 127.0.0.1:PORT
    image: str                # digest of the image manifest (tag v1)
    index: str                # digest of the index naming it for linux/amd64 (tag multi)
    arm_index: str            # digest of an index naming only linux/arm64 (tag armonly)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp: Path, auth: str = "") -> tuple[subprocess.Popen, str]:
    """A registry in ``tmp`` on a free port of 127.0.0.1, with the ``auth`` section of its configuration."""
    port = _free_port()
    (tmp / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {tmp / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}", encoding="utf-8")
    log = (tmp / "registry.log").open("wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(tmp / "config.yml")], stdout=log,
                            stderr=subprocess.STDOUT)
    host = f"127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=2).close()
            return proc, host
        except urllib.error.HTTPError:  # 401: up, and asking for credentials
            return proc, host
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"docker-registry did not start: {(tmp / 'registry.log').read_text()}")


def _send(method: str, url: str, body: bytes = b"", ctype: str = "", auth: str = "") -> Any:
    headers = {"Content-Type": ctype} if ctype else {}
    if auth:
        headers["Authorization"] = auth
    return urllib.request.urlopen(urllib.request.Request(url, data=body if method != "POST" or body else b"",
                                                         headers=headers, method=method), timeout=30)


def _blob(host: str, name: str, data: bytes, auth: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with _send("POST", f"http://{host}/v2/{name}/blobs/uploads/", auth=auth) as r:
        location = urllib.parse.urljoin(f"http://{host}/", r.headers["Location"])
    sep = "&" if "?" in location else "?"
    with _send("PUT", f"{location}{sep}digest={digest}", data, "application/octet-stream", auth) as r:
        assert r.status == 201
    return {"digest": digest, "size": len(data)}


def _manifest(host: str, name: str, tag: str, doc: dict, auth: str) -> str:
    body = json.dumps(doc).encode()
    with _send("PUT", f"http://{host}/v2/{name}/manifests/{tag}", body, doc["mediaType"], auth) as r:
        assert r.status == 201
        assert r.headers["Docker-Content-Digest"] == "sha256:" + hashlib.sha256(body).hexdigest()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _push(host: str, auth: str = "") -> Registry:
    """A one-file image, as an image manifest (v1), an index naming it for linux/amd64 (multi), and an
    index naming it for linux/arm64 only (armonly)."""
    name = "repro-test/tiny"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers",
                                    "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]}})
    image = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
             "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                        **_blob(host, name, config.encode(), auth)},
             "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                         **_blob(host, name, layer, auth)}]}
    digest = _manifest(host, name, "v1", image, auth)
    entry = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(json.dumps(image).encode())}

    def index(arch: str, tag: str) -> str:
        return _manifest(host, name, tag, {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {**entry, "platform": {"architecture": arch, "os": "linux"}},
            {**entry, "platform": {"architecture": "unknown", "os": "unknown"}}]}, auth)

    return Registry(host, digest, index("amd64", "multi"), index("arm64", "armonly"))


@pytest.fixture(scope="module")
def anonymous(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    proc, host = _start(tmp_path_factory.mktemp("registry"))
    try:
        yield _push(host)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def protected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    import bcrypt

    tmp = tmp_path_factory.mktemp("registry-auth")
    htpasswd = tmp / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(5)).decode()}\n")
    proc, host = _start(tmp, f"auth:\n  htpasswd:\n    realm: repro-test\n    path: {htpasswd}\n")
    try:
        yield _push(host, "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture()
def no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Docker engine, and a HOME with no credentials in it: returns that HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("HOME", str(home))
    for var in ("DOCKER_CONFIG", "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "ENROOT_CONFIG_PATH"):
        monkeypatch.delenv(var, raising=False)
    return home


def _target(tmp_path: Path, ref: str) -> Path:
    """torch-rn50-cpu whose base image is ``ref``."""
    text = (ROOT / "manifests" / "torch-rn50-cpu.yaml").read_text(encoding="utf-8")
    path = tmp_path / "torch-rn50-cpu.yaml"
    path.write_text(text.replace("127.0.0.1:5000/repro-test/debian:bookworm", ref), encoding="utf-8")
    return path


def _repro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=os.environ)


def test_repro_lock_resolves_the_index_digest_with_no_docker_engine(anonymous: Registry, no_engine: Path,
                                                                     tmp_path: Path) -> None:
    ref = f"{anonymous.host}/repro-test/tiny:multi"
    path = _target(tmp_path, ref)
    done = _repro("lock", str(path))
    assert done.returncode == 0, done.stderr
    assert f"base {ref} -> {anonymous.index}\n" in done.stdout
    lock = json.loads(path.with_name("torch-rn50-cpu.lock.json").read_text())
    assert lock["images"] == {"base": {"ref": ref, "digest": anonymous.index}}
    again = _repro("lock", str(path))            # the digest check of a second lock: unchanged
    assert again.returncode == 0 and "lock unchanged" in again.stdout, again.stderr


def test_anonymous_digests_and_the_head_check(anonymous: Registry, no_engine: Path) -> None:
    tiny = f"{anonymous.host}/repro-test/tiny"
    assert oci.digest_of(parse_ref(f"{tiny}:v1")) == anonymous.image
    assert oci.exists(parse_ref(f"{tiny}@{anonymous.image}"))
    assert oci.exists(parse_ref(f"{tiny}@{anonymous.index}"))
    assert not oci.exists(parse_ref(f"{tiny}@sha256:{'0' * 64}"))
    with pytest.raises(BuildError) as err:
        oci.digest_of(parse_ref(f"{tiny}:no-such-tag"))
    assert str(err.value) == f"resolving {tiny}:no-such-tag: no such image in registry {anonymous.host}"


def test_an_index_is_the_digest_and_its_platform_is_checked(anonymous: Registry, no_engine: Path) -> None:
    tiny = f"{anonymous.host}/repro-test/tiny"
    assert oci.digest_of(parse_ref(f"{tiny}:multi")) == anonymous.index
    assert oci.digest_of(parse_ref(f"{tiny}:armonly"), platform=("linux", "arm64")) == anonymous.arm_index
    with pytest.raises(BuildError) as err:
        oci.digest_of(parse_ref(f"{tiny}:armonly"))
    assert str(err.value) == (f"resolving {tiny}:armonly: its index {anonymous.arm_index} names no linux/amd64 "
                              "manifest (it names: linux/arm64, unknown/unknown)")


def _docker_config(home: Path, host: str, password: str) -> Path:
    path = home / ".docker" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": "eDp5"},
                                          host: {"auth": auth}}}), encoding="utf-8")
    return path


@pytest.mark.parametrize("where", ["docker", "podman-runtime", "podman-config", "enroot"])
def test_credentials_from_the_files_users_have(protected: Registry, no_engine: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    entry = {"auths": {f"{protected.host}/repro-test": {"username": USER, "password": PASSWORD}}}
    if where == "docker":
        _docker_config(no_engine, protected.host, PASSWORD)
    elif where == "podman-runtime":
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
        (tmp_path / "run" / "containers").mkdir(parents=True)
        (tmp_path / "run" / "containers" / "auth.json").write_text(json.dumps(entry))
    elif where == "podman-config":
        (no_engine / ".config" / "containers").mkdir(parents=True)
        (no_engine / ".config" / "containers" / "auth.json").write_text(json.dumps(entry))
    else:
        (no_engine / ".config" / "enroot").mkdir(parents=True)
        (no_engine / ".config" / "enroot" / ".credentials").write_text(
            f"machine 127.0.0.2 login x password y\nmachine 127.0.0.1 login {USER} password {PASSWORD}\n")
    tiny = f"{protected.host}/repro-test/tiny"
    assert oci.digest_of(parse_ref(f"{tiny}:multi")) == protected.index
    assert oci.exists(parse_ref(f"{tiny}@{protected.image}"))


def test_missing_or_wrong_credentials_are_a_clear_error(protected: Registry, no_engine: Path,
                                                        tmp_path: Path) -> None:
    ref = f"{protected.host}/repro-test/tiny:multi"
    path = _target(tmp_path, ref)
    files = (f"{no_engine}/.docker/config.json, {no_engine}/.config/containers/auth.json, "
             f"{no_engine}/.config/enroot/.credentials")
    login = (f"log in (`docker login {protected.host}`, `podman login {protected.host}`, or a line of enroot's "
             "credentials)")
    done = _repro("lock", str(path))
    assert done.returncode == 4, done.stderr
    assert done.stderr == (f"error: resolving {ref}: registry {protected.host} asks for credentials and none were "
                           f"found for it (or there is no such repository)\nhint: {login}; credentials are read "
                           f"from {files}\n")
    config = _docker_config(no_engine, protected.host, "not-the-password")
    done = _repro("lock", str(path))
    assert done.returncode == 4, done.stderr
    assert done.stderr == (f"error: resolving {ref}: registry {protected.host} refused the credentials read from "
                           f"{config} (or there is no such repository)\nhint: {login} again; credentials are "
                           f"read from {files}\n")
    assert "not-the-password" not in done.stderr + done.stdout and USER not in done.stderr
    assert not path.with_name("torch-rn50-cpu.lock.json").exists()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _Tokens(BaseHTTPRequestHandler):
    """A token service as Docker Hub's: GET /token?service=&scope= answers a JWT the registry trusts (signed
    by the key of the certificate in its rootcertbundle); with the right basic credentials it grants the
    scope asked for, without them nothing."""

    key: object = None
    cert_der: bytes = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        good = self.headers.get("Authorization") == "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") and not good:
            self.send_response(401)
            self.end_headers()
            return
        access = []
        if good:
            for scope in query.get("scope", []):
                kind, name, actions = scope.split(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
        body = json.dumps({"token": _jwt(type(self).key, type(self).cert_der, access)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _jwt(key: object, cert_der: bytes, access: list) -> str:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    now = int(time.time())
    header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(cert_der).decode()]}
    claims = {"iss": "repro-test-issuer", "sub": USER, "aud": "repro-test-service", "exp": now + 600,
              "nbf": now - 60, "iat": now - 60, "jti": os.urandom(8).hex(), "access": access}
    signed = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    return f"{signed}.{_b64url(key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256()))}"  # type: ignore[attr-defined]


def _signing_cert(tmp: Path) -> tuple[object, bytes]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "repro-test-tokens")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (tmp / "tokens.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert.public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def bearer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry that answers 401 with ``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` and
    trusts the tokens of a token service of its own (the flow of Docker Hub, nvcr.io, ghcr.io)."""
    tmp = tmp_path_factory.mktemp("registry-token")
    key, der = _signing_cert(tmp)
    handler = type("Tokens", (_Tokens,), {"key": key, "cert_der": der})
    tokens = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=tokens.serve_forever, daemon=True).start()
    realm = f"http://127.0.0.1:{tokens.server_address[1]}/token"
    proc, host = _start(tmp, f"auth:\n  token:\n    realm: {realm}\n    service: repro-test-service\n"
                             f"    issuer: repro-test-issuer\n    rootcertbundle: {tmp / 'tokens.pem'}\n")
    push = [{"type": "repository", "name": "repro-test/tiny", "actions": ["pull", "push"]}]
    try:
        yield _push(host, f"Bearer {_jwt(key, der, push)}")
    finally:
        proc.terminate()
        proc.wait(10)
        tokens.shutdown()
        tokens.server_close()


def test_the_bearer_token_flow(bearer: Registry, no_engine: Path) -> None:
    tiny = f"{bearer.host}/repro-test/tiny"
    with pytest.raises(urllib.error.HTTPError) as asked:
        urllib.request.urlopen(f"http://{tiny.replace('/', '/v2/', 1)}/manifests/multi", timeout=10)
    assert asked.value.code == 401
    assert asked.value.headers["WWW-Authenticate"].startswith("Bearer realm=\"http://127.0.0.1:")
    assert 'scope="repository:repro-test/tiny:pull"' in asked.value.headers["WWW-Authenticate"]
    with pytest.raises(BuildError) as err:          # an anonymous token grants nothing here
        oci.digest_of(parse_ref(f"{tiny}:multi"))
    assert f"registry {bearer.host} asks for credentials and none were found for it" in str(err.value)
    _docker_config(no_engine, bearer.host, PASSWORD)
    assert oci.digest_of(parse_ref(f"{tiny}:multi")) == bearer.index
    assert oci.exists(parse_ref(f"{tiny}@{bearer.image}"))
    config = _docker_config(no_engine, bearer.host, "not-the-password")
    with pytest.raises(BuildError) as err:
        oci.digest_of(parse_ref(f"{tiny}:multi"))
    assert f"registry {bearer.host} refused the credentials read from {config}" in str(err.value)


class _Hostile(BaseHTTPRequestHandler):
    """/v2/drip/...: a manifest a byte at a time; /v2/huge/...: a manifest without end; /v2/lying/...: a
    manifest under another digest than its own."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", OCI_MANIFEST)
        if self.path.startswith("/v2/lying/"):
            body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST}).encode()
            self.send_header("Docker-Content-Digest", f"sha256:{'0' * 64}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.end_headers()
        drip = self.path.startswith("/v2/drip/")
        try:
            for _ in range(10 ** 6):
                self.wfile.write(b" " if drip else b" " * 65536)
                self.wfile.flush()
                if drip:
                    time.sleep(0.2)
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("case,words", [("drip", "no whole answer within 2 s"),
                                        ("huge", "an answer over 4194304 bytes")])
def test_a_slow_or_huge_answer_is_cut_off(no_engine: Path, monkeypatch: pytest.MonkeyPatch, case: str,
                                          words: str) -> None:
    monkeypatch.setattr(oci, "DEADLINE_S", 2.0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        t0 = time.monotonic()
        with pytest.raises(EnvironmentUnavailable) as err:
            oci.digest_of(parse_ref(f"{host}/{case}/x:1"))
        assert time.monotonic() - t0 < 6
    finally:
        server.shutdown()
        server.server_close()
    assert str(err.value) == (f"resolving {host}/{case}/x:1: registry {host} "
                              f"(http://{host}/v2/{case}/x/manifests/1) is not reachable: {words}")


def test_a_digest_that_is_not_the_body_s_is_refused(no_engine: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST}).encode()
    try:
        with pytest.raises(BuildError) as err:
            oci.digest_of(parse_ref(f"{host}/lying/x:1"))
    finally:
        server.shutdown()
        server.server_close()
    assert str(err.value) == (f"resolving {host}/lying/x:1: registry {host} named digest sha256:{'0' * 64} for a "
                              f"manifest whose sha256 is sha256:{hashlib.sha256(body).hexdigest()}")
