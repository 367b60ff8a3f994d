"""DSSE envelopes of a run's in-toto statement, and the keys that sign and verify them.

A run is signed by a key its user already has, in one of two forms, told apart by the key file:

- an ed25519 private key in PEM (PKCS#8): standard DSSE, ``payloadType`` ``application/vnd.in-toto+json``,
  the signature an ed25519 signature over DSSE's pre-authentication encoding (PAE), the ``keyid`` the one
  securesystemslib computes for the key; in-toto's own tools verify it;
- an SSH key (an OpenSSH private key file, or a public key whose private half ssh-agent holds): the
  signature an SSHSIG over the same PAE bytes in the namespace ``repro``, made and checked by ``ssh-keygen
  -Y``; the ``keyid`` the key's SHA256 fingerprint. in-toto's tools cannot check this form.

The private key stays where it is: a PEM key is read into memory to sign; an SSH key is only named to
``ssh-keygen``. Neither reaches the run directory, its archive or any message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from repro.errors import EnvironmentUnavailable, ProvenanceError, UsageError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
NAMESPACE = "repro"
#: the envelope, beside provenance.intoto.json; SHA256SUMS does not list it (its signature verifies it)
SIGNED = "provenance.intoto.dsse.json"
MAX_KEY_BYTES = 1 << 20
MAX_ENVELOPE_BYTES = 64 << 20
MAX_SIGNATURES = 16
SSH_TIMEOUT_S = 300  # a passphrase typed at the terminal, or a hardware key touched
_SSHSIG = b"SSHSIG"
_ARMOR = "-----{} SSH SIGNATURE-----"
_KEY_TYPE = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+)(@openssh\.com)?$")
_PEM_PRIVATE = re.compile(rb"-----BEGIN (ENCRYPTED |RSA |EC |DSA )?PRIVATE KEY-----")
SIGN_HINT = ("give an ed25519 private key in PEM (openssl genpkey -algorithm ed25519 -out KEY.pem), an "
             "OpenSSH private key (ssh-keygen -t ed25519 -f KEY), or an SSH public key whose private half "
             "ssh-agent holds")


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """A regular file's bytes, not following a link, refused over ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise UsageError(f"{what} {path}: {e.strerror}", hint="give the path of a readable file") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UsageError(f"{what} {path} is not a regular file", hint="give the path of a file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{what} {path} is larger than {limit} bytes", hint="give the right file")
    return data


def fingerprint(blob: bytes) -> str:
    """An SSH public key's SHA256 fingerprint, as ``ssh-keygen -l`` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _ssh_blob(key: Ed25519PublicKey) -> tuple[str, bytes]:
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    kind, b64 = line.split()[:2]
    return kind, base64.b64decode(b64)


def keyid(key: Ed25519PublicKey) -> str:
    """The key id securesystemslib gives an ed25519 key: SHA-256 of its canonical JSON."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    meta = {"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": raw.hex()}}
    return hashlib.sha256(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ------------------------------------------------------------------ signing
class Signer(Protocol):
    path: Path

    def sign(self, data: bytes) -> tuple[str, bytes]:
        """(keyid, signature) over ``data``."""


@dataclass(frozen=True, repr=False)
class Ed25519Signer:
    path: Path
    key: Ed25519PrivateKey

    def sign(self, data: bytes) -> tuple[str, bytes]:
        return keyid(self.key.public_key()), self.key.sign(data)


@dataclass(frozen=True)
class SshSigner:
    path: Path

    def sign(self, data: bytes) -> tuple[str, bytes]:
        out = _ssh_keygen(["-Y", "sign", "-n", NAMESPACE, "-f", str(self.path)], data, "sign with")
        if out.returncode != 0:
            why = out.stderr.decode("utf-8", "replace").strip().splitlines()
            reason = why[-1] if why else "no reason given"
            raise UsageError(f"ssh-keygen could not sign with {self.path}: {reason}",
                             hint="an encrypted key needs its passphrase typed at a terminal, or the key in "
                                  f"ssh-agent (ssh-add {self.path}); a private key file must be mode 600")
        blob = unarmor(out.stdout)
        return fingerprint(sshsig_public_key(blob)), blob


def _ssh_keygen(args: list[str], data: bytes, doing: str, cwd: Path | None = None) -> Any:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise EnvironmentUnavailable(f"ssh-keygen is not installed: it is needed to {doing} an SSH key",
                                     hint="install OpenSSH 8.2 or later (openssh-client)")
    try:
        return subprocess.run([exe, *args], input=data, capture_output=True, timeout=SSH_TIMEOUT_S, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise UsageError(f"ssh-keygen did not {doing} the key within {SSH_TIMEOUT_S} s",
                         hint="type the key's passphrase, or add the key to ssh-agent") from None


def load_signer(path: Path, passphrase: bytes | None = None) -> Signer:
    """The signer a key file names (UsageError naming the file and the fix when it cannot sign)."""
    path = Path(path)
    data = read_bounded(path, MAX_KEY_BYTES, "signing key")
    if b"-----BEGIN OPENSSH PRIVATE KEY-----" in data:
        return SshSigner(path)
    if (m := _PEM_PRIVATE.search(data)) is not None:
        encrypted = m.group(1) == b"ENCRYPTED "
        return Ed25519Signer(path, _pem_private(path, data, passphrase, encrypted=encrypted))
    line = data.decode("utf-8", "replace").strip()
    if line and _KEY_TYPE.match(line.split()[0]) and len(line.splitlines()) == 1:
        _in_agent(path, line)
        return SshSigner(path)
    raise UsageError(f"{path} is not a signing key this kit reads", hint=SIGN_HINT)


def is_encrypted_pem(path: Path) -> bool:
    """Whether a key file is a passphrase-protected PEM key (the CLI asks for the passphrase)."""
    try:
        return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in read_bounded(Path(path), MAX_KEY_BYTES, "key")
    except UsageError:
        return False


def _pem_private(path: Path, data: bytes, passphrase: bytes | None, encrypted: bool) -> Ed25519PrivateKey:
    if encrypted and not passphrase:
        raise UsageError(f"{path} is encrypted and no passphrase was given",
                         hint="run at a terminal to be asked for it, or sign with an SSH key ssh-agent holds")
    try:
        key = serialization.load_pem_private_key(data, password=passphrase if encrypted else None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise UsageError(f"{path} is not a readable PEM private key"
                         + (" (or the passphrase is wrong)" if encrypted else ""), hint=SIGN_HINT) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"{path} is not an ed25519 key: DSSE signatures here are ed25519",
                         hint=SIGN_HINT)
    return key


def _in_agent(path: Path, line: str) -> None:
    """A public key signs only through ssh-agent: it must hold the private half."""
    b64 = line.split()[1] if len(line.split()) > 1 else ""
    agent = shutil.which("ssh-add")
    listed = (subprocess.run([agent, "-L"], capture_output=True, timeout=30, text=True)
              if agent and os.environ.get("SSH_AUTH_SOCK") else None)
    if listed is None or listed.returncode != 0 or b64 not in listed.stdout.split():
        raise UsageError(f"{path} is a public key, and no ssh-agent holds its private half",
                         hint=f"ssh-add the private key, or give the private key file instead of {path.name}")


# ------------------------------------------------------------------ envelopes
def envelope(statement: bytes, signer: Signer) -> dict[str, Any]:
    kid, sig = signer.sign(pae(PAYLOAD_TYPE, statement))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(statement).decode(),
            "signatures": [{"keyid": kid, "sig": base64.b64encode(sig).decode()}]}


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]  # (keyid, signature)

    def pae(self) -> bytes:
        return pae(self.payload_type, self.payload)


def parse_envelope(data: bytes) -> Envelope:
    """An envelope's fields, checked for shape (ProvenanceError when it is not a DSSE envelope)."""
    try:
        doc = json.loads(data)
        sigs = tuple((str(s.get("keyid", "")), base64.b64decode(s["sig"], validate=True))
                     for s in doc["signatures"])
        env = Envelope(doc["payloadType"], base64.b64decode(doc["payload"], validate=True), sigs)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, RecursionError):
        raise ProvenanceError(f"{SIGNED} is not a DSSE envelope") from None
    if not isinstance(env.payload_type, str) or not 0 < len(env.signatures) <= MAX_SIGNATURES:
        raise ProvenanceError(f"{SIGNED} is not a DSSE envelope of this kit "
                              f"(no payloadType, or not 1 to {MAX_SIGNATURES} signatures)")
    return env


def unarmor(text: bytes) -> bytes:
    """An armored SSH signature's binary blob."""
    lines = text.decode("ascii", "replace").strip().splitlines()
    if len(lines) < 3 or (lines[0], lines[-1]) != (_ARMOR.format("BEGIN"), _ARMOR.format("END")):
        raise UsageError("ssh-keygen wrote no SSH signature")
    return base64.b64decode("".join(lines[1:-1]))


def armor(blob: bytes) -> bytes:
    b64 = base64.b64encode(blob).decode()
    body = "\n".join(b64[i:i + 70] for i in range(0, len(b64), 70))
    return f"{_ARMOR.format('BEGIN')}\n{body}\n{_ARMOR.format('END')}\n".encode()


def is_sshsig(sig: bytes) -> bool:
    return sig.startswith(_SSHSIG)


def sshsig_public_key(blob: bytes) -> bytes:
    """The signing public key an SSHSIG blob carries (magic, version, then the key as an SSH string)."""
    if not is_sshsig(blob) or len(blob) < 14:
        raise ProvenanceError("not an SSH signature")
    n = int.from_bytes(blob[10:14], "big")
    if n <= 0 or 14 + n > len(blob):
        raise ProvenanceError("not an SSH signature")
    return blob[14:14 + n]


# ------------------------------------------------------------------ verifying
@dataclass(frozen=True, repr=False)
class Trusted:
    """One public key a signature may be by: ``allowed`` is its allowed_signers line for ssh-keygen."""

    principal: str
    allowed: str
    blob: bytes  # the key in SSH wire format
    name: str  # how a signature it made names its signer
    ed25519: Ed25519PublicKey | None


KEY_HINT = ("give an ed25519 public key in PEM (openssl pkey -in KEY.pem -pubout), an SSH public key "
            "(KEY.pub) or an allowed_signers file")


def load_keys(path: Path) -> list[Trusted]:
    """The public keys a ``--key`` file holds: PEM ed25519, SSH public key lines or allowed_signers lines."""
    path = Path(path)
    data = read_bounded(path, MAX_KEY_BYTES, "public key file")
    if _PEM_PRIVATE.search(data) or b"PRIVATE KEY-----" in data:
        raise UsageError(f"{path} is a private key; verifying takes the public key", hint=KEY_HINT)
    if b"-----BEGIN" in data:
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, UnsupportedAlgorithm):
            raise UsageError(f"{path} is not a readable PEM public key", hint=KEY_HINT) from None
        if not isinstance(key, Ed25519PublicKey):
            raise UsageError(f"{path} is not an ed25519 public key", hint=KEY_HINT)
        kind, blob = _ssh_blob(key)
        b64 = base64.b64encode(blob).decode()
        name = f"ed25519 key {fingerprint(blob)} ({path.name})"
        return [Trusted("key", f"key {kind} {b64}", blob, name, key)]
    keys = []
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            keys.append(_key_line(path, n, line.strip()))
    if not keys:
        raise UsageError(f"{path} holds no public key", hint=KEY_HINT)
    return keys


def _key_line(path: Path, n: int, line: str) -> Trusted:
    """One ``TYPE BASE64 [COMMENT]`` or ``PRINCIPALS [OPTIONS] TYPE BASE64 [COMMENT]`` line."""
    tokens = line.split()
    for i, kind in enumerate(tokens[:-1]):
        if _KEY_TYPE.match(kind):
            try:
                blob = base64.b64decode(tokens[i + 1], validate=True)
            except (binascii.Error, ValueError):
                break
            ed = None
            if kind == "ssh-ed25519":
                try:
                    loaded = serialization.load_ssh_public_key(f"{kind} {tokens[i + 1]}".encode())
                except (ValueError, UnsupportedAlgorithm):
                    break
                ed = loaded if isinstance(loaded, Ed25519PublicKey) else None
            who = tokens[0] if i else " ".join(tokens[2:])
            principal = tokens[0].split(",")[0] if i else f"key{n}"
            allowed = line if i else f"{principal} {kind} {tokens[1]}"
            name = f"{who} ({kind} {fingerprint(blob)})" if who else f"{kind} {fingerprint(blob)}"
            return Trusted(principal, allowed, blob, name, ed)
    raise UsageError(f"{path} line {n}: not a public key line", hint=KEY_HINT)


def verify(env: Envelope, keys: list[Trusted]) -> str | None:
    """The signer of the first of the envelope's signatures one of ``keys`` made, named; None if none did."""
    for _, sig in env.signatures:
        check = _verify_sshsig if is_sshsig(sig) else _verify_ed25519
        name = check(env.pae(), sig, keys)
        if name:
            return name
    return None


def _verify_ed25519(data: bytes, sig: bytes, keys: list[Trusted]) -> str | None:
    for k in keys:
        if k.ed25519 is not None:
            try:
                k.ed25519.verify(sig, data)
                return k.name
            except InvalidSignature:
                continue
    return None


def _verify_sshsig(data: bytes, sig: bytes, keys: list[Trusted]) -> str | None:
    """``ssh-keygen -Y verify`` of the signature, for each key that is the one the signature names."""
    try:
        by = sshsig_public_key(sig)
    except ProvenanceError:
        return None
    candidates = [k for k in keys if k.blob == by]
    if not candidates:
        return None
    with tempfile.TemporaryDirectory(prefix="repro-verify-") as tmp:
        (Path(tmp) / "allowed_signers").write_text("".join(k.allowed + "\n" for k in candidates))
        (Path(tmp) / "signature").write_bytes(armor(sig))
        for k in candidates:
            out = _ssh_keygen(["-Y", "verify", "-f", "allowed_signers", "-I", k.principal, "-n", NAMESPACE,
                               "-s", "signature"], data, "verify a signature by", cwd=Path(tmp))
            if out.returncode == 0:
                return k.name
    return None
