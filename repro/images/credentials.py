"""Registry credentials from the files users already have; never printed, never logged.

Read in this order, the first file holding an entry for the registry winning:

1. Docker's ``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``): ``auths`` entries, each an
   ``auth`` (base64 of ``user:password``) or a ``username`` and ``password``;
2. Podman's ``$REGISTRY_AUTH_FILE``, ``$XDG_RUNTIME_DIR/containers/auth.json`` and
   ``$XDG_CONFIG_HOME/containers/auth.json`` (default ``~/.config/containers/auth.json``), of the same shape,
   whose keys may also name a namespace (``quay.io/team``): the longest one that holds the repository wins;
3. enroot's ``$ENROOT_CONFIG_PATH/.credentials`` (default ``~/.config/enroot/.credentials``), in netrc
   format (``machine HOST login USER password SECRET``; HOST without a port, as curl matches it).

A file that cannot be read as its format says is a UsageError naming it; one that is absent is skipped.
Credential helpers (Docker's ``credsStore``/``credHelpers``) are not run.
"""

from __future__ import annotations

import base64
import binascii
import json
import netrc
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from repro.errors import UsageError

#: the names Docker Hub goes by in credential files (enroot's names the host its tokens come from)
DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io", "auth.docker.io")


@dataclass(frozen=True)
class Credential:
    username: str
    password: str = field(repr=False)
    source: Path = Path()


def files(env: Mapping[str, str] | None = None) -> list[tuple[str, Path]]:
    """(format, path) of every file credentials are read from, in order, whether it exists or not."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    out = [("auths", Path(env.get("DOCKER_CONFIG") or home / ".docker") / "config.json")]
    if env.get("REGISTRY_AUTH_FILE"):
        out.append(("auths", Path(env["REGISTRY_AUTH_FILE"])))
    if env.get("XDG_RUNTIME_DIR"):
        out.append(("auths", Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json"))
    out.append(("auths", config / "containers" / "auth.json"))
    out.append(("netrc", Path(env.get("ENROOT_CONFIG_PATH") or config / "enroot") / ".credentials"))
    return out


def where(env: Mapping[str, str] | None = None) -> str:
    """The files credentials are read from, for a message."""
    return ", ".join(str(p) for _, p in files(env))


def find(registry: str, repository: str = "", env: Mapping[str, str] | None = None) -> Credential | None:
    """The credential for ``registry`` (a host[:port]) and the repository path in it, or None."""
    for kind, path in files(env):
        found = (_from_auths if kind == "auths" else _from_netrc)(path, registry, repository)
        if found is not None:
            return found
    return None


def _same_host(a: str, b: str) -> bool:
    return a == b or (a in DOCKER_HUB and b in DOCKER_HUB)


def _key(key: str) -> tuple[str, str]:
    """An ``auths`` key as (host, namespace): ``https://index.docker.io/v1/`` -> (index.docker.io, "")."""
    rest = key.split("://", 1)[-1].strip("/")
    host, _, path = rest.partition("/")
    return host, "" if path in ("v1", "v2") else path


def _from_auths(path: Path, registry: str, repository: str) -> Credential | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(f"{path}: cannot read it as a credentials file: {type(e).__name__}",
                         hint="fix or remove it (`docker login` / `podman login` write it)") from None
    auths = data.get("auths") if isinstance(data, dict) else None
    if auths is None:
        return None
    if not isinstance(auths, dict):
        raise UsageError(f"{path}: auths: not a JSON object", hint="`docker login` writes {\"auths\": {...}}")
    best: tuple[int, str, dict] | None = None
    for key, entry in auths.items():
        host, namespace = _key(key)
        if not _same_host(host, registry) or (namespace and repository != namespace
                                               and not repository.startswith(namespace + "/")):
            continue
        if best is None or len(namespace) > best[0]:
            best = (len(namespace), key, entry)
    return None if best is None else _entry(path, best[1], best[2])


def _entry(path: Path, key: str, entry: object) -> Credential | None:
    where_ = f"{path}: auths.{key}"
    if not isinstance(entry, dict):
        raise UsageError(f"{where_}: not a JSON object", hint="log in again (`docker login`)")
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credential(entry["username"], entry["password"], path)
    auth = entry.get("auth")
    if not auth:
        return None
    try:
        user, sep, password = base64.b64decode(str(auth), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        sep, user, password = "", "", ""
    if not sep or not user:
        raise UsageError(f"{where_}.auth: not the base64 of USER:PASSWORD",
                         hint="log in again (`docker login` / `podman login`)")
    return Credential(user, password, path)


def _from_netrc(path: Path, registry: str, repository: str) -> Credential | None:
    del repository  # enroot's entries name hosts only, without a port (curl's netrc matching)
    host = urllib.parse.urlsplit(f"//{registry}").hostname or registry
    if not path.is_file():
        return None
    try:
        parsed = netrc.netrc(str(path))
    except (OSError, netrc.NetrcParseError) as e:
        line = getattr(e, "lineno", None)
        raise UsageError(f"{path}{f':{line}' if line else ''}: cannot read it as enroot's netrc credentials",
                         hint="each line reads: machine HOST login USER password SECRET") from None
    for machine, (login, _, password) in parsed.hosts.items():
        if _same_host(machine, host) and login:
            return Credential(login, password or "", path)
    return None
