"""SSH to the nodes of a hosts inventory, with host keys verified, and fan work out over them.

A node is reached the way ``ssh`` would reach it: ``~/.ssh/config`` (or the file named by
``REPRO_SSH_CONFIG``) supplies HostName, User, Port, IdentityFile, ConnectTimeout and
proxies; the inventory's user/port/identity win over it. Host keys are checked against
``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts`` and every ``UserKnownHostsFile`` of the
ssh config. fabric's own default would add an unknown key silently; here an unknown key is
refused with the fix in the hint, unless ``accept_new_host_keys`` is given, which accepts
and records keys of hosts not yet known - never a key that differs from a recorded one.

``run_on_all`` runs one function per node in parallel threads; each node's outcome is
its result or its error, so one dead node never hides the others.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import fabric
import invoke
import paramiko

from repro.errors import EnvironmentUnavailable, ReproError
from repro.spec.hosts import Node

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 30.0
MAX_THREADS = 64
_RECORD_LOCK = threading.Lock()


class NodeError(EnvironmentUnavailable):
    """One node could not be reached or did not finish; ``node`` names it."""

    def __init__(self, node: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.node = node


class NodeUnreachable(NodeError):
    """No SSH session could be opened (refused, no route, timed out, authentication)."""


class HostKeyUnknown(NodeError):
    """The node's host key is in no known_hosts file."""


class HostKeyChanged(NodeError):
    """The node presents a key other than the one known_hosts records for it."""


class NodeTimedOut(NodeError):
    """The node did not finish within its timeout."""


class Remote(Protocol):
    """An open fabric Connection, or this machine for a ``local`` node."""

    def run(self, command: str, **kwargs: Any) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Session:
    """What ``run_on_all`` hands the per-node function: the node, its open remote, the connect time."""

    node: Node
    remote: Remote
    connect_s: float | None  # None for a local node (no SSH)

    def run(self, command: str, **kwargs: Any) -> Any:
        """``remote.run``: invoke's keyword arguments (hide, warn, timeout, ...)."""
        return self.remote.run(command, **kwargs)

    def ping(self) -> float:
        """Seconds for one SSH protocol round trip (a global request the server answers itself, no shell)."""
        transport = getattr(self.remote, "transport", None)
        if transport is None:
            return 0.0
        t0 = time.monotonic()
        transport.global_request("keepalive@openssh.com", wait=True)
        return time.monotonic() - t0


class LocalMachine:
    """Stands in for a Connection for a ``local`` node: commands run here, no SSH."""

    host = "localhost"

    def __init__(self) -> None:
        self._ctx = invoke.Context()

    def run(self, command: str, **kwargs: Any) -> Any:
        return self._ctx.run(command, **kwargs)

    def close(self) -> None:
        pass


def ssh_config_path() -> Path | None:
    """The ssh config to read instead of the usual ones (``REPRO_SSH_CONFIG``), if set."""
    path = os.environ.get("REPRO_SSH_CONFIG")
    return Path(path).expanduser() if path else None


def fabric_config() -> fabric.Config:
    path = ssh_config_path()
    return fabric.Config(runtime_ssh_path=str(path)) if path else fabric.Config()


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def known_hosts_files(ssh_config: dict[str, Any]) -> tuple[list[Path], Path]:
    """The known_hosts files to trust, and the one new keys are recorded in (OpenSSH: the first user file)."""
    user = [Path(os.path.expanduser(p)) for p in str(ssh_config.get("userknownhostsfile", "")).split()]
    default = Path(os.path.expanduser("~/.ssh/known_hosts"))
    files = list(dict.fromkeys([default, Path("/etc/ssh/ssh_known_hosts"), *user]))
    return files, (user[0] if user else default)


class Unknown(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey, checked: list[Path],
                 why: str | None = None) -> None:
        super().__init__(why or (f"it is in none of {', '.join(map(str, checked))}" if checked
                                 else "no known_hosts file exists"))
        self.hostname, self.key, self.why = hostname, key, why


@dataclass
class KnownHosts:
    """known_hosts as OpenSSH reads it: plain keys (loaded into the client), ``@cert-authority``
    keys that may sign host certificates for matching hosts, and ``@revoked`` keys."""

    authorities: list[tuple[list[str], paramiko.PKey]]
    revoked: list[paramiko.PKey]


def load_known_hosts(client: paramiko.SSHClient, files: Sequence[Path]) -> KnownHosts:
    """Load ``files`` into ``client``'s trusted keys; marker lines (which paramiko's own loader
    rejects with a bare InvalidHostKey) are kept apart; unreadable lines are skipped."""
    known = KnownHosts([], [])
    system = client._system_host_keys  # noqa: SLF001 - load_system_host_keys would choke on marker lines
    for path in files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            marker, _, rest = line.partition(" ") if line.startswith("@") else ("", "", line)
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(rest.strip())
            except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
                entry = None
            if entry is None or entry.key is None:
                log.info("%s: skipped a known_hosts line it cannot read: %.60s", path, line)
            elif marker == "@cert-authority":
                known.authorities.append((entry.hostnames, entry.key))
            elif marker == "@revoked":
                known.revoked.append(entry.key)
            elif not marker:
                for name in entry.hostnames:
                    system.add(name, entry.key.get_name(), entry.key)
    return known


def _matches(hostname: str, patterns: Sequence[str]) -> bool:
    """OpenSSH host pattern list semantics: any positive match, no negated match; hashed names too."""
    name = hostname.lower()
    hit = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat[1:] if neg else pat
        if pat.startswith("|1|"):
            ok = paramiko.HostKeys.hash_host(hostname, pat) == pat
        else:
            ok = re.fullmatch(re.escape(pat.lower()).replace(r"\*", ".*").replace(r"\?", "."),
                              name) is not None
        if ok and neg:
            return False
        hit = hit or ok
    return hit


def host_certificate_problem(key: paramiko.PKey, hostname: str, known: KnownHosts,
                             now: float | None = None) -> str | None:
    """None when ``key`` carries a host certificate that a trusted ``@cert-authority`` for
    ``hostname`` signed, naming it, valid now; otherwise what is wrong (or that it has none)."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not blob.key_type.endswith("-cert-v01@openssh.com"):
        return "it presents no host certificate"
    m = paramiko.Message(blob.key_blob)
    ktype = m.get_text()
    m.get_string()  # nonce
    for _ in range({"ssh-ed25519": 1, "ecdsa-sha2": 2, "ssh-rsa": 2, "rsa-sha2": 2}.get(
            next((k for k in ("ssh-ed25519", "ecdsa-sha2", "ssh-rsa", "rsa-sha2")
                  if ktype.startswith(k)), ""), 0)):
        m.get_string()
    m.get_int64()  # serial
    cert_type, key_id = m.get_int(), m.get_text()
    principals_msg = paramiko.Message(m.get_string())
    valid_after, valid_before = m.get_int64(), m.get_int64()
    m.get_string(), m.get_string(), m.get_string()  # critical options, extensions, reserved
    ca_blob = m.get_string()
    signed = m.get_so_far()
    signature = m.get_string()
    host = hostname[1:].split("]:")[0] if hostname.startswith("[") else hostname
    principals = []
    while principals_msg.get_remainder():
        principals.append(principals_msg.get_text())
    when = time.time() if now is None else now
    if cert_type != 2:
        return f"certificate {key_id!r} is a user certificate, not a host certificate"
    if principals and host not in principals:
        return f"certificate {key_id!r} names {', '.join(principals)}, not {host}"
    if not valid_after <= when < valid_before:
        return f"certificate {key_id!r} is not valid now (expired or not yet valid)"
    cas = [ca for patterns, ca in known.authorities
           if _matches(hostname, patterns) or _matches(host, patterns)]
    signer = next((ca for ca in cas if ca.asbytes() == ca_blob), None)
    if signer is None:
        return (f"certificate {key_id!r} is signed by a CA that no @cert-authority line trusts for {hostname}"
                if known.authorities else f"certificate {key_id!r}: no @cert-authority line in known_hosts")
    if any(r.asbytes() in (signer.asbytes(), key.asbytes()) for r in known.revoked):
        return f"certificate {key_id!r}: its key or CA is @revoked"
    if not signer.verify_ssh_sig(signed, paramiko.Message(signature)):
        return f"certificate {key_id!r} has a bad signature"
    return None


def preferring_certificates(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """A Transport that asks for the host's certificate first (so @cert-authority can vouch for
    it); a host without one answers with its plain key, checked against known_hosts as before."""
    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    certs = [f"{k}-cert-v01@openssh.com" for k in opts.key_types
             if f"{k}-cert-v01@openssh.com" in t._key_info]  # noqa: SLF001
    opts.key_types = [*certs, *opts.key_types]
    return t


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys unless a trusted CA signed the host's certificate, or accept and
    record them; changed keys never reach a policy."""

    def __init__(self, accept_new: bool, record_to: Path, checked: list[Path],
                 known: KnownHosts | None = None) -> None:
        self.accept_new, self.record_to, self.checked = accept_new, record_to, checked
        self.known = known or KnownHosts([], [])

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        problem = host_certificate_problem(key, hostname, self.known)
        if problem is None:
            log.info("host %s: certificate signed by a trusted @cert-authority", hostname)
            return
        if not self.accept_new:
            raise Unknown(hostname, key, self.checked, problem if self.known.authorities else None)
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _RECORD_LOCK:
            self.record_to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.record_to.open("a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning("accepted the new %s host key %s of %s; recorded in %s",
                    key.get_name(), fingerprint(key), hostname, self.record_to)


def _verify_host_keys(conn: fabric.Connection, accept_new: bool) -> Path:
    """Replace fabric's auto-adding policy on ``conn``; returns the file new keys would go to."""
    trusted, record_to = known_hosts_files(conn.ssh_config)
    checked = [p for p in trusted if p.is_file()]
    known = load_known_hosts(conn.client, checked)
    conn.client.set_missing_host_key_policy(HostKeyPolicy(accept_new, record_to, checked, known))
    conn.connect_kwargs["transport_factory"] = preferring_certificates
    return record_to


def jump_connection(host: str, port: int | None, user: str | None) -> fabric.Connection:
    """A Connection whose ``open_gateway()`` gives a channel to ``host`` through the ProxyJump
    hosts ``~/.ssh/config`` names, each hop's host key verified."""
    conn = fabric.Connection(host, user=user, port=port, config=fabric_config())
    hop = conn.gateway
    while isinstance(hop, fabric.Connection):
        _verify_host_keys(hop, False)
        hop = hop.gateway
    return conn


def connect(node: Node, *, accept_new_host_keys: bool = False, timeout: float = DEFAULT_TIMEOUT_S,
            config: fabric.Config | None = None) -> fabric.Connection:
    """An open, host-key-verified SSH connection to ``node``; raises a NodeError subclass."""
    connect_kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout}
    if node.identity:
        connect_kwargs.update(key_filename=[os.path.expanduser(node.identity)], look_for_keys=False)
    conn = fabric.Connection(node.address, user=node.user, port=node.port, config=config or fabric_config(),
                             connect_kwargs=connect_kwargs)
    conn.connect_timeout = max(1, int(min(timeout, conn.connect_timeout or timeout)))
    record_to = _verify_host_keys(conn, accept_new_host_keys)
    hop = conn.gateway
    while isinstance(hop, fabric.Connection):  # ProxyJump hosts: fabric would auto-add their keys too
        _verify_host_keys(hop, accept_new_host_keys)
        hop = hop.gateway
    try:
        conn.open()
    except Exception as e:  # noqa: BLE001 - every failure becomes this node's NodeError
        conn.close()
        err = translate(node, e, port=conn.port, record_to=record_to)
        raise err from (None if isinstance(err, HostKeyChanged) else e)
    return conn


def translate(node: Node, exc: BaseException, *, port: int | None = None,
              record_to: Path | None = None) -> ReproError:
    """A ReproError for anything that went wrong on one node, with the fix where there is one.

    The message leaves the low-level error out; raising it ``from exc`` appends that.
    """
    if isinstance(exc, ReproError):
        return exc
    where = f"node {node.name} ({node.address}{f':{port}' if port and port != 22 else ''})"
    if isinstance(exc, (Unknown, paramiko.BadHostKeyException)):
        host = exc.hostname.strip("[").split("]")[0]
        if host != node.address:  # a ProxyJump host, or the HostName an alias stands for
            where += f" via {host}"
    if isinstance(exc, Unknown) and exc.why:
        return HostKeyUnknown(node.name, f"{where} presents a host key no known_hosts line trusts: {exc.why}",
                              hint="check the CA's @cert-authority line in known_hosts (its host pattern and "
                                   "key) and the node's HostCertificate (ssh-keygen -L -f on it)")
    if isinstance(exc, Unknown):
        known = record_to or Path("~/.ssh/known_hosts")
        return HostKeyUnknown(
            node.name, f"{where} presents an unknown {exc.key.get_name()} host key {fingerprint(exc.key)}",
            hint=f"compare that fingerprint with the node's own (ssh-keygen -lf on its host key, checked "
                 f"out of band), then `ssh-keyscan -p {port or 22} {host} >> {known}`;"
                 " or rerun with --accept-new-host-keys (records new hosts' keys, never changed ones)")
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyChanged(
            node.name, f"{where} presents host key {fingerprint(exc.key)}, but known_hosts records "
                       f"{fingerprint(exc.expected_key)} for it",
            hint="a reinstalled node or a machine in its place: find out which before removing the old "
                 f"key (ssh-keygen -R {node.address})")
    if isinstance(exc, paramiko.AuthenticationException):
        return NodeUnreachable(node.name, f"{where} refused authentication",
                               hint="check user and identity in the hosts file (or ~/.ssh/config) and "
                                    "that the key is in the node's authorized_keys")
    if isinstance(exc, invoke.CommandTimedOut):
        return NodeTimedOut(node.name, f"{where}: a command ran past its time limit")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return NodeUnreachable(node.name, f"{where} did not answer in time",
                               hint="is the node up and sshd listening? `ssh` to it by hand")
    if isinstance(exc, (OSError, EOFError, paramiko.SSHException)):
        return NodeUnreachable(node.name, f"cannot reach {where}",
                               hint="is the node up and sshd listening? `ssh` to it by hand")
    return NodeError(node.name, f"{where}: {type(exc).__name__}")


def run_on_all(nodes: Sequence[Node], fn: Callable[[Session], T], *, timeout: float = DEFAULT_TIMEOUT_S,
               accept_new_host_keys: bool = False) -> dict[str, T | ReproError]:
    """``fn`` on every node in parallel, each over its own connection; node name -> result or error.

    ``timeout`` bounds each node from the moment its turn starts: connecting plus ``fn``. A
    node that overruns gets NodeTimedOut and its connection is closed under it; the others'
    results are kept whatever happens to one node.
    """
    config = fabric_config()
    started: dict[str, float] = {}
    live: dict[str, Remote] = {}

    def one(node: Node) -> T:
        started[node.name] = t0 = time.monotonic()
        remote: Remote = (LocalMachine() if node.local else
                          connect(node, accept_new_host_keys=accept_new_host_keys, timeout=timeout,
                                  config=config))
        live[node.name] = remote
        try:
            return fn(Session(node, remote, None if node.local else time.monotonic() - t0))
        except Exception as e:
            raise translate(node, e, port=getattr(remote, "port", None)) from e
        finally:
            remote.close()

    out: dict[str, T | ReproError] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(nodes), MAX_THREADS)),
                              thread_name_prefix="repro-node")
    futures: dict[Future[T], Node] = {pool.submit(one, n): n for n in nodes}
    pending = set(futures)
    try:
        while pending:
            now = time.monotonic()
            deadlines = [started[futures[f].name] + timeout for f in pending if futures[f].name in started]
            done, pending = wait(pending, timeout=max(0.0, min(deadlines, default=now + 0.05) - now) or 0.01,
                                 return_when=FIRST_COMPLETED)
            for f in done:
                node = futures[f]
                exc = f.exception()
                out[node.name] = f.result() if exc is None else translate(node, exc)
                if exc is not None:
                    log.info("node %s: %s", node.name, out[node.name])
            now = time.monotonic()
            for f in list(pending):
                node = futures[f]
                if node.name in started and now - started[node.name] >= timeout:
                    pending.discard(f)
                    out[node.name] = NodeTimedOut(node.name,
                                                  f"node {node.name} ({node.address}) did not finish "
                                                  f"within {timeout:g} s")
                    if node.name in live:
                        live[node.name].close()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {n.name: out[n.name] for n in nodes}
