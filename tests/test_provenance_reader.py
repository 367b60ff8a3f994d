"""The one reader of the provenance record: a typed, read-only view of ``provenance.json``, which it reads as
untrusted input (a regular file, bounded in size, valid against its schema) and refuses with a clear error
naming the file and what is wrong."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from test_provenance import IMAGE_ID, TARGET, make_run

from repro.errors import ProvenanceError
from repro.record import provenance
from repro.record.audit import audit, failing
from repro.record.provenance_view import ProvenanceRecord, RecordedCommand, RecordedNode
from repro.run.rundir import RunDir


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    return make_run(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def copy(sealed: RunDir, tmp_path: Path) -> Path:
    """A copy of the sealed run's provenance.json to damage."""
    dest = tmp_path / "provenance.json"
    shutil.copy(sealed.file("provenance.json"), dest)
    return dest


def test_the_view_has_the_record_typed(sealed: RunDir) -> None:
    doc = provenance.load_record(sealed.file("provenance.json"))
    r = provenance.read_record(sealed.file("provenance.json"))
    assert isinstance(r, ProvenanceRecord)
    assert (r.schema_version, r.run_id, r.target) == (1, sealed.run_id, TARGET)
    assert r.manifest.sha256 == doc["manifest"]["sha256"] and r.kit.version == doc["kit"]["version"]
    assert r.host_names == ("node0", "node1", "node2", "node3") and r.hosts_source is None
    assert all(isinstance(n, RecordedNode) for n in r.nodes) and r.nodes[0].image.id == IMAGE_ID
    assert all(isinstance(c, RecordedCommand) for c in r.commands) and len(r.commands) == len(doc["commands"])
    assert r.commands[0].argv == tuple(doc["commands"][0]["argv"])
    assert dict(r.logs) == doc["logs"] and dict(r.results) == doc["results"] and r.outcome["done"] == 6


def test_the_view_is_read_only(sealed: RunDir) -> None:
    r = provenance.read_record(sealed.file("provenance.json"))
    with pytest.raises(FrozenInstanceError):
        r.run_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.logs["cells/x"] = "0" * 64  # type: ignore[index]


def test_a_record_being_written_is_viewed_as_it_is(sealed: RunDir) -> None:
    doc = provenance.load_record(sealed.file("provenance.json"))
    view = provenance.as_record(doc)
    assert view == provenance.read_record(sealed.file("provenance.json"))
    assert provenance.as_record(view) is view


@pytest.mark.parametrize("damage, said", [
    (lambda d: d.update(run_id=7), "run_id: 7 is not of type 'string'"),
    (lambda d: d["nodes"][0].update(image="sha256:x"), "nodes/0/image"),
    (lambda d: d["commands"][0].update(repeat="1"), "commands/0/repeat: '1' is not of type 'integer'"),
    (lambda d: d.pop("logs"), "'logs' is a required property"),
    (lambda d: d.update(schema_version=2), "schema_version 2 is not supported"),
])
def test_wrong_types_are_a_clear_error(copy: Path, damage, said: str) -> None:
    doc = json.loads(copy.read_text())
    damage(doc)
    copy.write_text(json.dumps(doc))
    with pytest.raises(ProvenanceError, match="is not a valid provenance record") as e:
        provenance.read_record(copy)
    assert str(copy) in str(e.value) and said in str(e.value)


def test_a_record_over_the_bound_is_refused_unread(copy: Path) -> None:
    with pytest.raises(ProvenanceError, match="over the 1024-byte bound of a run's record"):
        provenance.read_json(copy, limit=1024)
    with open(copy, "ab") as f:  # the default bound, 64 MiB: one byte more is refused
        f.truncate((64 << 20) + 1)
    with pytest.raises(ProvenanceError, match=f"{copy} is over the {64 << 20}-byte bound"):
        provenance.read_record(copy)


@pytest.mark.parametrize("text, said", [("{", "is unreadable"), ("[" * 100_000, "unreadable"),
                                        ("\udcff", "is unreadable")])
def test_a_record_that_is_not_json_is_a_clear_error(copy: Path, text: str, said: str) -> None:
    copy.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ProvenanceError, match=said):
        provenance.read_record(copy)


def test_not_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProvenanceError, match=f"no {tmp_path / 'none.json'}"):
        provenance.read_record(tmp_path / "none.json")
    with pytest.raises(ProvenanceError, match="not a regular file"):
        provenance.read_record(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ProvenanceError, match="not a regular file"):  # refused at once, not blocked on
        provenance.read_record(fifo)


def test_audit_reports_a_record_of_wrong_types_as_tampered(sealed: RunDir, tmp_path: Path) -> None:
    run = tmp_path / sealed.run_id
    shutil.copytree(sealed.path, run)
    doc = json.loads((run / "provenance.json").read_text())
    doc["nodes"] = {"node0": doc["nodes"][0]}
    (run / "provenance.json").write_text(json.dumps(doc))
    bad = [(c.item, c.status) for c in failing(audit(run))]
    assert ("provenance.json", "tampered") in bad
