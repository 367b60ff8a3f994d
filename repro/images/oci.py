"""Digests over the OCI distribution API: no Docker engine is asked.

``digest_of`` is what ``repro lock`` and every digest check ask: a ``GET`` of ``/v2/NAME/manifests/TAG``
with the OCI and Docker manifest media types in ``Accept``. The digest is the registry's
``Docker-Content-Digest``, checked against the sha256 of the body read; it is what the reference resolves
to (the index where there is one), and the platform's manifest is checked to be named in that index and
held by the registry. ``exists`` asks with a ``HEAD`` whether a registry holds a digest.

A registry that answers 401 is asked again with a bearer token (``WWW-Authenticate: Bearer realm=...``,
fetched with the credentials of :mod:`repro.images.credentials` where there are any) or with basic auth.
Credentials never appear in a message. Every answer is read whole within DEADLINE_S and MAX_BYTES.
HTTPS always, except for a loopback registry (``127.0.0.1:5000``, ``localhost:5000``: Docker treats those
as insecure by default) and the hosts listed in ``REPRO_INSECURE_REGISTRIES`` (comma-separated
``HOST[:PORT]``), which speak plain HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from email.message import Message

from repro import bounded
from repro.errors import BuildError, EnvironmentUnavailable
from repro.images import credentials
from repro.images.refs import Ref

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
IMAGE_TYPES = ("application/vnd.oci.image.manifest.v1+json",
               "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(INDEX_TYPES + IMAGE_TYPES)
#: the platform whose manifest an index must name
PLATFORM = ("linux", "amd64")
#: the whole of one answer (headers to last byte) within this many seconds
DEADLINE_S = 60.0
#: and no larger than this (the reference registry refuses manifests over 4 MiB)
MAX_BYTES = 4 << 20
#: where Docker Hub's API is
DOCKER_HUB_API = "registry-1.docker.io"


def media_kind(media_type: str) -> str | None:
    """``index`` (OCI index, Docker manifest list), ``image`` (an image manifest of either) or None."""
    base = media_type.split(";", 1)[0].strip().lower()
    return "index" if base in INDEX_TYPES else "image" if base in IMAGE_TYPES else None


_SCHEME = re.compile(r"\s*,?\s*([A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*)")
_PARAM = re.compile(r"""\s*,?\s*([A-Za-z0-9!#$%&'*+.^_`|~-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^,\s]*)""")


def parse_challenges(header: str) -> list[tuple[str, dict[str, str]]]:
    """``WWW-Authenticate`` (RFC 9110) as [(scheme in lower case, {param in lower case: value})]."""
    out: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while (m := _SCHEME.match(header, pos)) and m.group(1):
        params: dict[str, str] = {}
        pos = m.end()
        while p := _PARAM.match(header, pos):
            value = p.group(2)
            if value.startswith('"'):
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            params[p.group(1).lower()] = value
            pos = p.end()
        out.append((m.group(1).lower(), params))
    return out


def insecure(registry: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``registry`` speaks plain HTTP: a loopback host, or one REPRO_INSECURE_REGISTRIES lists."""
    env = os.environ if env is None else env
    listed = {h.strip() for h in env.get("REPRO_INSECURE_REGISTRIES", "").split(",") if h.strip()}
    if registry in listed:
        return True
    host = urllib.parse.urlsplit(f"//{registry}").hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def base_url(registry: str) -> str:
    host = DOCKER_HUB_API if registry == "docker.io" else registry
    return f"{'http' if insecure(registry) else 'https'}://{host}"


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """Redirects keep credentials only to the same scheme, host and port; none goes from https to http."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if old.scheme == "https" and new.scheme != "https":
            raise urllib.error.HTTPError(req.full_url, code, "a redirect from https to plain http", headers,
                                         fp)
        out = super().redirect_request(req, fp, code, msg, headers, newurl)
        if out is not None and (old.scheme, old.netloc) != (new.scheme, new.netloc):
            out.remove_header("Authorization")
        return out


_OPENER = urllib.request.build_opener(_SameOriginAuth())


def digest_of(ref: Ref, *, what: str = "resolving", platform: tuple[str, str] = PLATFORM) -> str:
    """The digest ``ref``'s tag resolves to now (the index where there is one, whose ``platform`` manifest
    is checked to be named in it and held by the registry)."""
    client = _Client(ref, what)
    answer = client.request("GET", f"manifests/{ref.tag or 'latest'}")
    if answer is None:
        raise BuildError(f"{what} {ref.tagged}: no such image in registry {ref.registry}",
                         hint="check the reference and digest in the manifest (or its lock file)")
    digest = _checked_digest(client, answer)
    doc = _document(client, answer.body)
    kind = media_kind(str(doc.get("mediaType") or answer.headers.get("Content-Type") or ""))
    if kind is None:
        raise BuildError(f"{what} {ref.tagged}: registry {ref.registry} answered a "
                         f"{str(doc.get('mediaType') or answer.headers.get('Content-Type'))[:80]!r}, "
                         f"none of the manifest types asked for ({ACCEPT})")
    if kind == "index":
        _check_platform(client, doc, digest, platform)
    return digest


def exists(ref: Ref, *, what: str = "looking up") -> bool:
    """Whether the registry of ``ref`` holds its digest (a ``HEAD``; the engine is not asked)."""
    client = _Client(ref, what)
    answer = client.request("HEAD", f"manifests/{ref.digest}")
    if answer is None:
        return False
    named = answer.headers.get("Docker-Content-Digest")
    return not named or named == ref.digest


def _checked_digest(client: _Client, answer: bounded.Answer) -> str:
    actual = "sha256:" + hashlib.sha256(answer.body).hexdigest()
    named = answer.headers.get("Docker-Content-Digest")
    if named and named != actual:
        raise BuildError(f"{client.what} {client.ref.tagged}: registry {client.ref.registry} named digest "
                         f"{named[:80]} for a manifest whose sha256 is {actual}",
                         hint="the registry or something between it and this machine altered the answer")
    return actual


def _document(client: _Client, body: bytes) -> dict:
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BuildError(f"{client.what} {client.ref.tagged}: registry {client.ref.registry} answered no "
                         f"JSON manifest: {type(e).__name__}") from None
    if not isinstance(doc, dict):
        raise BuildError(f"{client.what} {client.ref.tagged}: registry {client.ref.registry} answered no "
                         "JSON manifest (not an object)")
    return doc


def _check_platform(client: _Client, index: dict, digest: str, platform: tuple[str, str]) -> None:
    entries = [e for e in index.get("manifests") or [] if isinstance(e, dict)]
    plats = [((e.get("platform") or {}).get("os"), (e.get("platform") or {}).get("architecture"), e)
             for e in entries if isinstance(e.get("platform") or {}, dict)]
    child = next((e for os_, arch, e in plats if (os_, arch) == platform), None)
    name = "/".join(platform)
    if child is None or not isinstance(child.get("digest"), str):
        held = ", ".join(sorted({f"{o}/{a}" for o, a, _ in plats})) or "none"
        raise BuildError(f"{client.what} {client.ref.tagged}: its index {digest} names no {name} manifest "
                         f"(it names: {held})", hint=f"use a reference with a {name} image")
    if client.request("HEAD", f"manifests/{child['digest']}") is None:
        raise BuildError(f"{client.what} {client.ref.tagged}: its index {digest} names {child['digest']:.80} "
                         f"for {name}, which registry {client.ref.registry} does not hold")


class _Client:
    """Requests to one repository of one registry, authorized once the registry asks for it."""

    def __init__(self, ref: Ref, what: str) -> None:
        self.ref, self.what = ref, what
        self.base = f"{base_url(ref.registry)}/v2/{ref.path}"
        self.authorization: str | None = None
        self.credential: credentials.Credential | None = None

    def request(self, method: str, path: str) -> bounded.Answer | None:
        """The answer to ``method`` of ``path`` in the repository; None where the registry has no such thing
        (404). Asked again, authorized, after a 401."""
        for attempt in (1, 2):
            try:
                return self._fetch(method, f"{self.base}/{path}", ACCEPT, self.authorization)
            except urllib.error.HTTPError as e:
                e.close()
                if e.code == 401 and attempt == 1:
                    self.authorization = self._authorize(e.headers)
                    continue
                if e.code in (401, 403):
                    raise self._denied() from None
                if e.code == 404:
                    return None
                raise BuildError(f"{self.what} {self.ref.tagged}: registry {self.ref.registry} answered "
                                 f"{e.code} {str(e.reason)[:80]} to {method} {self.base}/{path}") from None
        raise AssertionError("unreachable")

    def _fetch(self, method: str, url: str, accept: str, authorization: str | None) -> bounded.Answer:
        headers = {"Accept": accept, "User-Agent": "repro"}
        if authorization:
            headers["Authorization"] = authorization
        try:
            return bounded.fetch(urllib.request.Request(url, headers=headers, method=method),
                                 deadline_s=DEADLINE_S, max_bytes=MAX_BYTES, opener=_OPENER)
        except urllib.error.HTTPError:
            raise
        except OSError as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            where = url.split("?", 1)[0]
            raise EnvironmentUnavailable(f"{self.what} {self.ref.tagged}: registry {self.ref.registry} "
                                         f"({where}) is not reachable: {reason}",
                                         hint="is the registry up and reachable from here?") from None

    def _authorize(self, headers: Message) -> str:
        challenges = parse_challenges(", ".join(headers.get_all("WWW-Authenticate") or []))
        self.credential = credentials.find(self.ref.registry, self.ref.path)
        for scheme, params in challenges:
            if scheme == "bearer" and params.get("realm"):
                return f"Bearer {self._token(params)}"
        if any(scheme == "basic" for scheme, _ in challenges) and self.credential is not None:
            return "Basic " + _basic(self.credential)
        raise self._denied()

    def _token(self, params: dict[str, str]) -> str:
        realm = urllib.parse.urlsplit(params["realm"])
        if realm.scheme not in ("http", "https") or (realm.scheme == "http" and not insecure(realm.netloc)):
            raise BuildError(f"{self.what} {self.ref.tagged}: registry {self.ref.registry} sends for its "
                             f"tokens to {params['realm'][:120]!r}, not an https address")
        query = {"scope": params.get("scope") or f"repository:{self.ref.path}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        url = params["realm"] + ("&" if realm.query else "?") + urllib.parse.urlencode(query)
        basic = "Basic " + _basic(self.credential) if self.credential else None
        try:
            answer = self._fetch("GET", url, "application/json", basic)
        except urllib.error.HTTPError as e:
            e.close()
            raise self._denied() from None
        try:
            doc = json.loads(answer.body.decode("utf-8"))
            token = doc.get("token") or doc.get("access_token")
        except (UnicodeDecodeError, ValueError, RecursionError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise BuildError(f"{self.what} {self.ref.tagged}: the token service of registry "
                             f"{self.ref.registry} answered no token")
        return token

    def _denied(self) -> BuildError:
        reg = self.ref.registry
        login = f"log in (`docker login {reg}`, `podman login {reg}`, or a line of enroot's credentials)"
        if self.credential is not None:
            return BuildError(f"{self.what} {self.ref.tagged}: registry {reg} refused the credentials read "
                              f"from {self.credential.source} (or there is no such repository)",
                              hint=f"{login} again; credentials are read from {credentials.where()}")
        return BuildError(f"{self.what} {self.ref.tagged}: registry {reg} asks for credentials and none "
                          "were found for it (or there is no such repository)",
                          hint=f"{login}; credentials are read from {credentials.where()}")


def _basic(credential: credentials.Credential) -> str:
    return base64.b64encode(f"{credential.username}:{credential.password}".encode()).decode("ascii")
