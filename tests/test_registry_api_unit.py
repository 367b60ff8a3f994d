"""The registry API client's pure parts: credential files, WWW-Authenticate, media types, plain HTTP.

Against a real registry: tests/integration/test_registry_api.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.images import credentials, oci
from repro.images.credentials import Credential


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture()
def home(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path)}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_files_read_and_their_order(tmp_path: Path) -> None:
    env = {"HOME": "/h", "DOCKER_CONFIG": "/d", "REGISTRY_AUTH_FILE": "/r.json", "XDG_RUNTIME_DIR": "/run/u",
           "XDG_CONFIG_HOME": "/c", "ENROOT_CONFIG_PATH": "/e"}
    assert credentials.where(env) == ("/d/config.json, /r.json, /run/u/containers/auth.json, /c/containers/auth.json, "
                                      "/e/.credentials")
    assert credentials.where({"HOME": "/h"}) == ("/h/.docker/config.json, /h/.config/containers/auth.json, "
                                                 "/h/.config/enroot/.credentials")


def test_docker_auths_base64_and_docker_hub_names(tmp_path: Path, home: dict[str, str]) -> None:
    path = _write(tmp_path / ".docker" / "config.json", json.dumps({"auths": {
        "https://index.docker.io/v1/": {"auth": _b64("hub-user:hub:pass")},
        "registry.example.org:5443": {"auth": _b64("me:pw")},
        "https://other.example.org": {"username": "u2", "password": "p2"}}}))
    assert credentials.find("docker.io", "library/debian", home) == Credential("hub-user", "hub:pass", path)
    assert credentials.find("registry.example.org:5443", "a/b", home) == Credential("me", "pw", path)
    assert credentials.find("other.example.org", "x", home) == Credential("u2", "p2", path)
    assert credentials.find("registry.example.org", "a/b", home) is None   # another port is another registry
    assert credentials.find("nvcr.io", "nvidia/pytorch", home) is None


def test_podman_namespaces_the_longest_that_holds_the_repository_wins(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    path = _write(tmp_path / "run" / "containers" / "auth.json", json.dumps({"auths": {
        "quay.io": {"auth": _b64("any:1")}, "quay.io/team": {"auth": _b64("team:2")},
        "quay.io/team/app": {"auth": _b64("app:3")}}}))
    assert credentials.find("quay.io", "team/app", env) == Credential("app", "3", path)
    assert credentials.find("quay.io", "team/application", env) == Credential("team", "2", path)
    assert credentials.find("quay.io", "teams/x", env) == Credential("any", "1", path)


def test_the_first_file_with_an_entry_wins(tmp_path: Path, home: dict[str, str]) -> None:
    _write(tmp_path / ".docker" / "config.json", json.dumps({"auths": {"a.example": {"auth": _b64("d:1")}},
                                                            "credsStore": "desktop"}))
    podman = _write(tmp_path / ".config" / "containers" / "auth.json",
                    json.dumps({"auths": {"b.example": {"auth": _b64("p:2")}, "a.example": {"auth": _b64("p:3")}}}))
    assert credentials.find("a.example", "x", home).username == "d"
    assert credentials.find("b.example", "x", home) == Credential("p", "2", podman)


def test_enroot_netrc_matches_the_host_without_its_port(tmp_path: Path, home: dict[str, str]) -> None:
    path = _write(tmp_path / ".config" / "enroot" / ".credentials",
                  "machine nvcr.io login $oauthtoken password nvapi-xyz\n"
                  "machine auth.docker.io login hub password hubpw\n"
                  "machine registry.example.org login me password pw\n")
    assert credentials.find("nvcr.io", "nvidia/pytorch", home) == Credential("$oauthtoken", "nvapi-xyz", path)
    assert credentials.find("docker.io", "library/debian", home) == Credential("hub", "hubpw", path)
    assert credentials.find("registry.example.org:5000", "a", home) == Credential("me", "pw", path)


def test_a_credential_never_shows_its_password() -> None:
    shown = repr(Credential("me", "hunter2", Path("/h/.docker/config.json")))
    assert shown == "Credential(username='me', source=PosixPath('/h/.docker/config.json'))"


@pytest.mark.parametrize("text,message,hint", [
    ("{not json", "{p}: cannot read it as a credentials file: JSONDecodeError",
     "fix or remove it (`docker login` / `podman login` write it)"),
    ('{"auths": []}', "{p}: auths: not a JSON object", '`docker login` writes {"auths": {...}}'),
    ('{"auths": {"a.example": "x"}}', "{p}: auths.a.example: not a JSON object", "log in again (`docker login`)"),
    ('{"auths": {"a.example": {"auth": "%%%"}}}', "{p}: auths.a.example.auth: not the base64 of USER:PASSWORD",
     "log in again (`docker login` / `podman login`)"),
    ('{"auths": {"a.example": {"auth": "' + _b64("no-colon") + '"}}}',
     "{p}: auths.a.example.auth: not the base64 of USER:PASSWORD", "log in again (`docker login` / `podman login`)"),
])
def test_a_bad_auths_file_names_the_file_and_field(tmp_path: Path, home: dict[str, str], text: str, message: str,
                                                   hint: str) -> None:
    path = _write(tmp_path / ".docker" / "config.json", text)
    with pytest.raises(UsageError) as err:
        credentials.find("a.example", "x", home)
    assert (err.value.message, err.value.hint) == (message.format(p=path), hint)


def test_a_bad_enroot_file_names_the_file_and_line_not_its_contents(tmp_path: Path, home: dict[str, str]) -> None:
    path = _write(tmp_path / ".config" / "enroot" / ".credentials", "machine a.example login me password s3cret\n"
                                                                   "bogus s3cret-two\n")
    with pytest.raises(UsageError) as err:
        credentials.find("a.example", "x", home)
    assert str(err.value) == f"{path}:2: cannot read it as enroot's netrc credentials"
    assert err.value.hint == "each line reads: machine HOST login USER password SECRET"


@pytest.mark.parametrize("header,parsed", [
    ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
     'scope="repository:library/debian:pull"',
     [("bearer", {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                  "scope": "repository:library/debian:pull"})]),
    ('Basic realm="repro-test"', [("basic", {"realm": "repro-test"})]),
    ('bearer Realm="https://r/t", scope="repository:a:pull,push", error="insufficient_scope"',
     [("bearer", {"realm": "https://r/t", "scope": "repository:a:pull,push", "error": "insufficient_scope"})]),
    ('Basic realm="a, b", Bearer realm="https://r/t",service=reg', [("basic", {"realm": "a, b"}),
                                                                  ("bearer", {"realm": "https://r/t", "service": "reg"})]),
    ('Bearer realm="say \\"hi\\""', [("bearer", {"realm": 'say "hi"'})]),
    ("", []),
])
def test_www_authenticate_is_parsed(header: str, parsed: list) -> None:
    assert oci.parse_challenges(header) == parsed


@pytest.mark.parametrize("media_type,kind", [
    ("application/vnd.oci.image.index.v1+json", "index"),
    ("application/vnd.docker.distribution.manifest.list.v2+json", "index"),
    ("application/vnd.oci.image.manifest.v1+json", "image"),
    ("application/vnd.docker.distribution.manifest.v2+json; charset=utf-8", "image"),
    ("application/vnd.docker.distribution.manifest.v1+prettyjws", None),
    ("application/json", None),
])
def test_media_types(media_type: str, kind: str | None) -> None:
    assert oci.media_kind(media_type) == kind


def test_accept_names_every_manifest_type() -> None:
    assert oci.ACCEPT == ("application/vnd.oci.image.index.v1+json, "
                          "application/vnd.docker.distribution.manifest.list.v2+json, "
                          "application/vnd.oci.image.manifest.v1+json, "
                          "application/vnd.docker.distribution.manifest.v2+json")


@pytest.mark.parametrize("registry,env,url", [
    ("127.0.0.1:5000", {}, "http://127.0.0.1:5000"),
    ("localhost:5000", {}, "http://localhost:5000"),
    ("[::1]:5000", {}, "http://[::1]:5000"),
    ("docker.io", {}, "https://registry-1.docker.io"),
    ("nvcr.io", {}, "https://nvcr.io"),
    ("10.0.0.5:5000", {}, "https://10.0.0.5:5000"),
    ("10.0.0.5:5000", {"REPRO_INSECURE_REGISTRIES": "reg.lan, 10.0.0.5:5000"}, "http://10.0.0.5:5000"),
    ("10.0.0.5:5001", {"REPRO_INSECURE_REGISTRIES": "10.0.0.5:5000"}, "https://10.0.0.5:5001"),
])
def test_plain_http_only_for_loopback_and_listed_registries(registry: str, env: dict, url: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPRO_INSECURE_REGISTRIES", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert oci.base_url(registry) == url
