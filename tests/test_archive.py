"""Run archives: reproducible packing, safe extraction, and tamper detection (no Docker needed).

Every tampering the issue names - one byte of a log, one byte of the provenance, an
added file, a ``../`` entry, a link out - must be caught, and the CLI must exit 6.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_provenance import SECRET_CMD, SECRET_HOSTS, SECRET_PROC, make_run

from repro.record import provenance
from repro.record.archive import FIXED_MTIME, Limits, checksum_file, create, extract, opened_run, verify_checksum
from repro.record.audit import TAMPERED, audit, failing
from repro.cli import cli
from repro.errors import ProvenanceError
from repro.run.rundir import RunDir


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    return make_run(tmp_path_factory.mktemp("runs"))


@pytest.fixture()
def run(sealed: RunDir, tmp_path: Path) -> RunDir:
    """A private copy of the sealed run, free to damage."""
    dest = tmp_path / "logs" / sealed.run_id
    shutil.copytree(sealed.path, dest)
    return RunDir.open(dest)


@pytest.fixture()
def archive(run: RunDir) -> Path:
    return create(run)


def audit_exit(path: Path) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["audit", str(path)])
    return res.exit_code, res.output


def repack(src: Path, dest: Path, mutate) -> Path:
    """A copy of an archive with members changed by ``mutate(tar_out, member, data)``; no checksum file."""
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dest, "w:gz") as tout:
        for m in tin:
            data = tin.extractfile(m).read() if m.isfile() else None
            mutate(tout, m, data)
    return dest


def keep(tout: tarfile.TarFile, m: tarfile.TarInfo, data: bytes | None) -> None:
    tout.addfile(m, io.BytesIO(data) if data is not None else None)


# ------------------------------------------------------------------ packing
def test_archive_is_byte_reproducible(run: RunDir, tmp_path: Path) -> None:
    a = create(run)
    first = a.read_bytes()
    os.utime(run.file("report.md"), (1, 1))          # file times do not matter
    b = create(run, tmp_path / "again.tar.gz")
    assert b.read_bytes() == first
    assert checksum_file(a).read_text() == f"{hashlib.sha256(first).hexdigest()}  {a.name}\n"
    assert verify_checksum(a) is None
    with tarfile.open(a, "r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and names[0] == run.run_id
    assert {m.mtime for m in members} == {FIXED_MTIME} and {m.uid for m in members} == {0}
    assert {m.mode for m in members if m.isfile()} == {0o644} and {m.uname for m in members} == {""}
    assert gzip.open(a).read() and first[4:8] == b"\0\0\0\0"  # no time in the gzip header


def test_report_and_audit_from_archive_anywhere(archive: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / archive.name
    moved.parent.mkdir()
    shutil.copy(archive, moved)
    shutil.copy(checksum_file(archive), checksum_file(moved))
    res = CliRunner().invoke(cli, ["report", str(moved), "--format", "json"])
    assert res.exit_code == 0, res.output
    cells = json.loads(res.stdout)
    assert len(cells) == 6 and {c["verdict"] for c in cells} == {"reproduced"}
    code, out = audit_exit(moved)
    assert code == 0, out
    assert not list(tmp_path.glob("elsewhere/*/"))  # nothing unpacked beside it


# ------------------------------------------------------------------ tampering in a run directory
def flip_byte(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_one_byte_of_a_log(run: RunDir) -> None:
    flip_byte(run.path / "cells/1n8g-fp32-bs256/r1/0-node0.log")
    bad = failing(audit(run.path))
    assert ("cells/1n8g-fp32-bs256/r1/0-node0.log", TAMPERED) in [(c.item, c.status) for c in bad]
    assert any(c.item == "log digests" for c in bad)
    assert audit_exit(run.path)[0] == 6


def test_one_byte_of_the_provenance(run: RunDir) -> None:
    text = run.file("provenance.json").read_text()
    run.file("provenance.json").write_text(text.replace('"525.60.11"', '"525.60.12"', 1))
    bad = failing(audit(run.path))
    assert ("provenance.json", TAMPERED) in [(c.item, c.status) for c in bad]
    assert any(c.item == "provenance.intoto.json" for c in bad)
    assert audit_exit(run.path)[0] == 6


def test_an_added_file(run: RunDir) -> None:
    (run.path / "cells/1n1g-fp32-bs256/r1/9-extra.log").write_text("extra\n")
    bad = failing(audit(run.path))
    assert ("cells/1n1g-fp32-bs256/r1/9-extra.log", TAMPERED) in [(c.item, c.status) for c in bad]
    assert audit_exit(run.path)[0] == 6


def test_a_symlink_in_the_run_directory(run: RunDir) -> None:
    (run.path / "cells" / "link").symlink_to("/etc/passwd")
    assert any("symbolic link" in c.detail for c in failing(audit(run.path)))
    with pytest.raises(ProvenanceError, match="not a regular file"):
        create(run)


def test_resealed_checksums_still_caught(run: RunDir) -> None:
    """Whoever edits a log and rewrites SHA256SUMS is caught by the provenance record's digests."""
    log = run.path / "cells/1n1g-amp-bs256/r1/0-node0.log"
    log.write_bytes(log.read_bytes().replace(b"train.total_ips", b"train.total_ipz", 3))
    provenance.write_sums(run)
    bad = {c.item for c in failing(audit(run.path))}
    assert "log digests" in bad and "SHA256SUMS" not in bad


def test_edited_report_with_consistent_digests_is_caught(run: RunDir) -> None:
    """Even with every digest recomputed, report.json must still follow from the logs."""
    report = json.loads(run.file("report.json").read_text())
    report[0]["reproduced"] *= 1.10
    run.write_json("report.json", report)
    record = provenance.load_record(run.file("provenance.json"))
    record["results"]["report.json"] = hashlib.sha256(run.file("report.json").read_bytes()).hexdigest()
    run.write_json("provenance.json", record)
    run.write_json("provenance.intoto.json", provenance.to_intoto(run, record))
    provenance.write_sums(run)
    bad = failing(audit(run.path))
    assert [(c.item, c.status) for c in bad] == [("report.json re-derived from the logs", TAMPERED)]


# ------------------------------------------------------------------ tampering in an archive
def test_archive_changed_without_its_checksum(archive: Path, tmp_path: Path) -> None:
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(ProvenanceError, match="does not match"):
        extract(archive, tmp_path / "x")
    code, out = audit_exit(archive)
    assert code == 6 and "does not match" in out


def test_archive_with_a_changed_log_and_no_checksum_file(archive: Path, tmp_path: Path) -> None:
    def mutate(tout: tarfile.TarFile, m: tarfile.TarInfo, data: bytes | None) -> None:
        if m.name.endswith("1n1g-fp32-bs256/r1/0-node0.log"):
            data = data[:50] + bytes([data[50] ^ 1]) + data[51:]
        keep(tout, m, data)
    bad = repack(archive, tmp_path / archive.name, mutate)
    code, out = audit_exit(bad)
    assert code == 6 and "content changed" in out and "no checksum file" in out


WHY = {"dotdot": "leaves its directory", "absolute": "absolute path", "symlink": "is a link",
       "hardlink": "is a link", "device": "device", "outside-top": "outside the run directory"}


@pytest.mark.parametrize("kind", sorted(WHY))
def test_unsafe_members_are_refused(archive: Path, tmp_path: Path, kind: str) -> None:
    top = archive.name.removesuffix(".tar.gz")
    victim = tmp_path / "victim.txt"

    def mutate(tout: tarfile.TarFile, m: tarfile.TarInfo, data: bytes | None) -> None:
        keep(tout, m, data)
        if m.name != top:
            return
        evil = tarfile.TarInfo({"dotdot": f"{top}/../../victim.txt", "absolute": str(victim),
                                "outside-top": "other/victim.txt"}.get(kind, f"{top}/cells/evil"))
        if kind == "symlink":
            evil.type, evil.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink":
            evil.type, evil.linkname = tarfile.LNKTYPE, "/etc/passwd"
        elif kind == "device":
            evil.type, evil.devmajor, evil.devminor = tarfile.CHRTYPE, 1, 3
        payload = b"pwned\n" if evil.type == tarfile.REGTYPE else None
        if payload:
            evil.size = len(payload)
        tout.addfile(evil, io.BytesIO(payload) if payload else None)

    (tmp_path / "in").mkdir()
    bad = repack(archive, tmp_path / "in" / archive.name, mutate)
    out_dir = tmp_path / "out"
    with pytest.raises(ProvenanceError, match=WHY[kind]):
        extract(bad, out_dir)
    assert not victim.exists() and not (tmp_path / "in" / "victim.txt").exists()
    assert not out_dir.exists() or not any(out_dir.iterdir())
    code, out = audit_exit(bad)
    assert code == 6, out


def test_size_and_count_limits(archive: Path, tmp_path: Path) -> None:
    biggest = max(m.size for m in tarfile.open(archive, "r:gz"))
    with pytest.raises(ProvenanceError, match="over the .* limit"):
        extract(archive, tmp_path / "a", Limits(max_file_bytes=biggest - 1))
    with pytest.raises(ProvenanceError, match="unpacks to more than"):
        extract(archive, tmp_path / "b", Limits(max_total_bytes=biggest + 10))
    with pytest.raises(ProvenanceError, match="more than 5 members"):
        extract(archive, tmp_path / "c", Limits(max_members=5))
    with opened_run(archive) as run:
        assert run.file("provenance.json").is_file()
        unpacked = run.path
    assert not unpacked.exists()


def test_not_an_archive(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip at all")
    with pytest.raises(ProvenanceError, match="not a readable"):
        extract(junk, tmp_path / "x")


def test_secrets_absent_from_the_archive(archive: Path) -> None:
    raw = gzip.decompress(archive.read_bytes())
    for secret in (SECRET_HOSTS, SECRET_PROC, SECRET_CMD):
        assert secret.encode() not in raw
    assert b"<redacted>" in raw
