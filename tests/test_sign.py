"""Signed provenance: a run's in-toto statement as a DSSE envelope, signed by an ed25519 PEM key (standard
DSSE, checked here by securesystemslib) or an SSH key (an SSHSIG over the PAE, checked here by
``ssh-keygen -Y verify``), and ``repro audit --key`` on it."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key
from test_provenance import make_run

from repro.cli import cli
from repro.record import provenance
from repro.record.archive import create
from repro.record.dsse import SIGNED
from repro.layout import INTOTO
from repro.run.rundir import RunDir

@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    return make_run(tmp_path_factory.mktemp("runs"))


@pytest.fixture()
def run(sealed: RunDir, tmp_path: Path) -> RunDir:
    dest = tmp_path / "logs" / sealed.run_id
    shutil.copytree(sealed.path, dest)
    return RunDir.open(dest)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two ed25519 PEM key pairs, two SSH key pairs, an encrypted PEM key and an RSA PEM key."""
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("pem", "other_pem"):
        key = Ed25519PrivateKey.generate()
        out[name] = d / f"{name}.key"
        out[name].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
        out[name].chmod(0o600)
        out[f"{name}_pub"] = d / f"{name}.pub.pem"
        out[f"{name}_pub"].write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        out[f"{name}_ssh_pub"] = d / f"{name}.ssh.pub"
        out[f"{name}_ssh_pub"].write_bytes(key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b" pem-owner\n")
    for name, who in (("ssh", "alice@example.com"), ("other_ssh", "mallory@example.com")):
        out[name] = d / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(out[name])],
                       check=True)
        out[f"{name}_pub"] = d / f"{name}.pub"
        kind, b64 = out[f"{name}_pub"].read_text().split()[:2]
        out[f"{name}_allowed"] = d / f"{name}.allowed_signers"
        out[f"{name}_allowed"].write_text(f"# who may sign runs\n{who} {kind} {b64}\n")
    out["encrypted"] = d / "encrypted.key"
    out["encrypted"].write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"correct horse")))
    out["rsa"] = d / "rsa.key"
    out["rsa"].write_bytes(generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    out["junk"] = d / "junk.key"
    out["junk"].write_text("not a key at all\n")
    return out


def cli_run(*args: str | Path) -> tuple[int, str]:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def sign(run: RunDir, key: Path) -> str:
    code, out = cli_run("report", run.path, "--sign-key", key, "--no-record")
    assert code == 0, out
    assert f"signed {run.path} (keyid " in out
    return out


def pae(env: dict) -> bytes:
    body = base64.b64decode(env["payload"])
    return b"DSSEv1 %d %b %d %b" % (len(env["payloadType"]), env["payloadType"].encode(), len(body), body)


def envelope_of(run: RunDir) -> dict:
    return json.loads(run.file(SIGNED).read_text())


def reseal(run: RunDir, change) -> None:
    """Doctor the provenance record and seal it again, every digest consistent (as a forger would)."""
    record = provenance.load_record(run.file("provenance.json"))
    change(record)
    run.write_json("provenance.json", record)
    run.write_json(INTOTO, provenance.to_intoto(run, record))
    provenance.write_sums(run)


# ------------------------------------------------------------------ ed25519 PEM: standard DSSE
def test_ed25519_envelope_verifies_with_securesystemslib_and_audit(run: RunDir, keys: dict[str, Path]) -> None:
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    sign(run, keys["pem"])
    env = envelope_of(run)
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(env["payload"]) == run.file(INTOTO).read_bytes()
    assert json.loads(base64.b64decode(env["payload"]))["_type"] == "https://in-toto.io/Statement/v1"
    public = serialization.load_pem_public_key(keys["pem_pub"].read_bytes())
    key = SSlibKey.from_crypto(public)  # keyid as securesystemslib computes it, not taken from the envelope
    assert Envelope.from_dict(copy.deepcopy(env)).verify([key], 1) == {key.keyid: key}
    assert env["signatures"][0]["keyid"] == key.keyid
    other = SSlibKey.from_crypto(serialization.load_pem_public_key(keys["other_pem_pub"].read_bytes()))
    with pytest.raises(Exception, match="threshold"):
        Envelope.from_dict(copy.deepcopy(env)).verify([other], 1)

    for pub in (keys["pem_pub"], keys["pem_ssh_pub"]):  # the same key as PEM or as an SSH public key
        code, out = cli_run("audit", run.path, "--key", pub, "--require-signature", "--format", "json")
        assert code == 0, out
        row = [c for c in json.loads(out) if c["area"] == "signature"][0]
        assert row["status"] == "ok" and row["observed"].startswith("ed25519 key SHA256:"
                                                                    if pub.suffix == ".pem" else "pem-owner")
    code, out = cli_run("audit", run.path)  # the seal is as it was: SHA256SUMS does not list the envelope
    assert code == 0 and re.search(r"\| integrity +\| SHA256SUMS +\| ok ", out)
    assert "signed; who signed is checked only given the key (--key)" in out


# ------------------------------------------------------------------ SSH key: an SSHSIG over the PAE
def test_ssh_signature_verifies_with_ssh_keygen_and_audit(run: RunDir, keys: dict[str, Path],
                                                          tmp_path: Path) -> None:
    sign(run, keys["ssh"])
    env = envelope_of(run)
    sig = base64.b64decode(env["signatures"][0]["sig"])
    assert sig.startswith(b"SSHSIG") and env["signatures"][0]["keyid"].startswith("SHA256:")
    armored = tmp_path / "sig"
    body = base64.b64encode(sig).decode()
    armored.write_text("-----BEGIN SSH SIGNATURE-----\n" + "\n".join(body[i:i + 70] for i in range(0, len(body), 70))
                       + "\n-----END SSH SIGNATURE-----\n")
    got = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(keys["ssh_allowed"]), "-I", "alice@example.com",
                          "-n", "repro", "-s", str(armored)], input=pae(env), capture_output=True)
    assert got.returncode == 0, got.stderr
    assert b'Good "repro" signature for alice@example.com' in got.stdout
    assert subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(keys["ssh_allowed"]), "-I", "alice@example.com",
                           "-n", "repro", "-s", str(armored)], input=pae(env) + b" ",
                          capture_output=True).returncode != 0
    for pub, who in ((keys["ssh_pub"], "alice@example.com (ssh-ed25519 SHA256:"),
                     (keys["ssh_allowed"], "alice@example.com (ssh-ed25519 SHA256:")):
        code, out = cli_run("audit", run.path, "--key", pub, "--format", "json")
        assert code == 0, out
        row = [c for c in json.loads(out) if c["area"] == "signature"][0]
        assert row["status"] == "ok" and row["observed"].startswith(who)


def test_ssh_key_held_by_an_agent_signs_through_its_public_key(run: RunDir, keys: dict[str, Path],
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        code, out = cli_run("report", run.path, "--sign-key", keys["ssh_pub"], "--no-record")
        assert code == 2 and "is a public key, and no ssh-agent holds its private half" in out
        subprocess.run(["ssh-add", "-q", str(keys["ssh"])], check=True, capture_output=True)
        sign(run, keys["ssh_pub"])
    finally:
        agent.terminate()
        agent.wait()
    code, out = cli_run("audit", run.path, "--key", keys["ssh_allowed"])
    assert code == 0 and "alice@example.com" in out


# ------------------------------------------------------------------ what audit refuses
@pytest.mark.parametrize("signer,other", [("pem", "other_pem_pub"), ("ssh", "other_ssh_pub"),
                                          ("pem", "ssh_allowed"), ("ssh", "pem_pub")])
def test_a_signature_by_another_key_is_tampered(run: RunDir, keys: dict[str, Path], signer: str, other: str) -> None:
    sign(run, keys[signer])
    code, out = cli_run("audit", run.path, "--key", keys[other])
    assert code == 6, out
    assert "TAMPERED" in out and "not signed by the key given" in out


@pytest.mark.parametrize("signer,pub", [("pem", "pem_pub"), ("ssh", "ssh_pub")])
def test_a_doctored_statement_is_tampered(run: RunDir, keys: dict[str, Path], signer: str, pub: str) -> None:
    """A forger who edits the record and re-seals every digest passes every other check; not the signature."""
    sign(run, keys[signer])
    genuine = envelope_of(run)
    reseal(run, lambda r: r["kit"].update(commit="0" * 40))
    code, out = cli_run("audit", run.path, "--key", keys[pub])
    assert code == 6 and "signs another statement than provenance.intoto.json" in out
    # the forger puts the doctored statement in the genuine envelope: its signature is over the old one
    forged = dict(genuine, payload=base64.b64encode(run.file(INTOTO).read_bytes()).decode())
    run.file(SIGNED).write_text(json.dumps(forged))
    code, out = cli_run("audit", run.path, "--key", keys[pub])
    assert code == 6 and "not signed by the key given, or the signed statement was changed" in out
    # or signs the doctored statement with their own key: not the key the reviewer trusts
    sign(run, keys["other_" + signer])
    code, out = cli_run("audit", run.path, "--key", keys[pub])
    assert code == 6 and "not signed by the key given" in out
    # the same forgery, unsigned: only the demand for a signature catches it
    run.file(SIGNED).unlink()
    assert cli_run("audit", run.path)[0] == 0
    assert cli_run("audit", run.path, "--key", keys[pub], "--require-signature")[0] == 9


def test_unsigned_run_is_a_warning_or_its_own_exit_code(run: RunDir, keys: dict[str, Path]) -> None:
    code, out = cli_run("audit", run.path, "--key", keys["pem_pub"])
    assert code == 0 and "not signed" in out and "1 not signed of" in out
    code, out = cli_run("audit", run.path, "--key", keys["pem_pub"], "--require-signature")
    assert code == 9 and f"error: {run.path} is not signed" in out
    code, out = cli_run("audit", run.path, "--require-signature")
    assert code == 2 and "--require-signature needs a key (--key)" in out
    run.file(SIGNED).write_text("{\"payloadType\": 1}")
    code, out = cli_run("audit", run.path, "--key", keys["pem_pub"], "--require-signature")
    assert code == 6 and "is not a DSSE envelope" in out


def test_signing_refuses_a_run_that_does_not_match_its_seal(run: RunDir, keys: dict[str, Path]) -> None:
    log = run.path / "cells/1n1g-amp-bs256/r1/0-node0.log"
    log.write_bytes(log.read_bytes() + b"\n")
    code, out = cli_run("report", run.path, "--sign-key", keys["pem"], "--no-record")
    assert code == 6 and "does not match its seal" in out and not run.file(SIGNED).exists()


# ------------------------------------------------------------------ archives and repro up's finish
def test_an_archive_is_signed_in_place_and_one_beside_a_run_packed_again(run: RunDir,
                                                                         keys: dict[str, Path]) -> None:
    packed = create(run)
    sign(run, keys["ssh"])  # the run directory: its archive beside it is packed again, with the envelope
    code, out = cli_run("audit", packed, "--key", keys["ssh_pub"])
    assert code == 0 and "| signature " in out and "alice@example.com" in out
    code, out = cli_run("report", packed, "--sign-key", keys["pem"], "--no-record")
    assert code == 0 and f"archive {packed} packed again" in out
    assert cli_run("audit", packed, "--key", keys["pem_pub"])[0] == 0
    assert cli_run("audit", packed, "--key", keys["ssh_pub"])[0] == 6  # replaced by the PEM key's


def test_the_end_of_up_signs_before_it_packs(tmp_path: Path, keys: dict[str, Path]) -> None:
    from repro.record.dsse import load_signer
    from repro.spec.manifest import find_target
    from repro.up import UpResult, finish

    run = make_run(tmp_path)
    result = UpResult(run, find_target(run.load_manifest().id),
                      record=provenance.load_record(run.file("provenance.json")), done=6)
    text = finish(result, sign_key=load_signer(keys["pem"]))
    packed = tmp_path / f"{run.run_id}.tar.gz"
    assert f"signed by keyid {envelope_of(run)['signatures'][0]['keyid']}\n" in text
    code, out = cli_run("audit", packed, "--key", keys["pem_pub"], "--require-signature")
    assert code == 0, out


def test_up_refuses_a_bad_key_before_anything_runs(keys: dict[str, Path]) -> None:
    code, out = cli_run("up", "no-such-target", "--sign-key", keys["junk"])
    assert code == 2 and f"error: {keys['junk']} is not a signing key this kit reads" in out
    code, out = cli_run("up", "no-such-target", "--sign-key", keys["pem"], "--detach")
    assert code == 2 and "sign it then: repro report RUN_DIR (with --sign-key)" in out


# ------------------------------------------------------------------ bad keys, and the key never shown
@pytest.mark.parametrize("name,said", [
    ("missing", "signing key {path}: No such file or directory"),
    ("junk", "{path} is not a signing key this kit reads"),
    ("rsa", "{path} is not an ed25519 key"),
    ("encrypted", "{path} is encrypted and no passphrase was given"),
    ("pem_pub", "{path} is not a signing key this kit reads"),
])
def test_a_bad_signing_key_is_a_clear_error(run: RunDir, keys: dict[str, Path], tmp_path: Path,
                                            name: str, said: str) -> None:
    path = keys.get(name, tmp_path / "absent.key")
    code, out = cli_run("report", run.path, "--sign-key", path, "--no-record")
    assert code == 2 and f"error: {said.format(path=path)}" in out and "hint: " in out
    assert not run.file(SIGNED).exists()


@pytest.mark.parametrize("name,said", [("pem", "is a private key; verifying takes the public key"),
                                       ("junk", "line 1: not a public key line")])
def test_a_bad_verifying_key_is_a_clear_error(run: RunDir, keys: dict[str, Path], name: str, said: str) -> None:
    code, out = cli_run("audit", run.path, "--key", keys[name])
    assert code == 2 and said in out and str(keys[name]) in out


def test_the_private_key_reaches_no_file_and_no_output(run: RunDir, keys: dict[str, Path]) -> None:
    outputs = sign(run, keys["pem"]) + sign(run, keys["ssh"])
    outputs += cli_run("audit", run.path, "--key", keys["ssh_pub"])[1]
    outputs += "".join(cli_run("report", run.path, "--sign-key", keys[k], "--no-record")[1]
                       for k in ("rsa", "encrypted", "junk"))
    packed = create(run)
    blobs = [p.read_bytes() for p in run.path.rglob("*") if p.is_file()] + [gzip.decompress(packed.read_bytes())]
    blobs.append(outputs.encode())
    secrets = []
    for k in ("pem", "ssh", "rsa", "encrypted"):
        text = keys[k].read_bytes()
        secrets.append(text)
        secrets += [line for line in text.splitlines() if len(line) > 20 and b"-----" not in line]
    pem = serialization.load_pem_private_key(keys["pem"].read_bytes(), None)
    seed = pem.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    secrets += [seed, seed.hex().encode(), base64.b64encode(seed)]
    assert [s[:12] for s in secrets if any(s in b for b in blobs)] == []


def test_an_encrypted_pem_key_signs_with_its_passphrase_and_not_a_wrong_one(keys: dict[str, Path]) -> None:
    from repro.errors import UsageError
    from repro.record.dsse import is_encrypted_pem, load_signer, pae as dsse_pae

    assert is_encrypted_pem(keys["encrypted"]) and not is_encrypted_pem(keys["pem"])
    kid, sig = load_signer(keys["encrypted"], b"correct horse").sign(dsse_pae("t", b"x"))
    assert len(sig) == 64 and len(kid) == 64
    with pytest.raises(UsageError, match="not a readable PEM private key .or the passphrase is wrong."):
        load_signer(keys["encrypted"], b"wrong")


def test_sealing_again_drops_the_signature_of_the_statement_it_replaces(run: RunDir,
                                                                         keys: dict[str, Path]) -> None:
    """``repro up --resume`` of a signed run seals it again: the old envelope would sign a statement that is
    gone, so it goes with it (the run is then unsigned, not tampered)."""
    sign(run, keys["pem"])
    provenance.finalize(run, provenance.load_record(run.file("provenance.json")))
    assert not run.file(SIGNED).exists()
    code, out = cli_run("audit", run.path, "--key", keys["pem_pub"])
    assert code == 0 and "not signed" in out


def test_an_envelope_of_too_many_signatures_is_refused(run: RunDir, keys: dict[str, Path]) -> None:
    sign(run, keys["ssh"])
    env = envelope_of(run)
    env["signatures"] *= 17
    run.file(SIGNED).write_text(json.dumps(env))
    code, out = cli_run("audit", run.path, "--key", keys["ssh_pub"], "--format", "json")
    assert code == 6 and "not 1 to 16 signatures" in [c for c in json.loads(out.split("\nerror:")[0])
                                                      if c["area"] == "signature"][0]["detail"]
