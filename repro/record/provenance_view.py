"""The provenance record as its readers see it: typed and read-only.

:func:`repro.record.provenance.read_record` reads ``provenance.json`` (bounded, validated against
``repro/spec/schemas/provenance.v1.json``) into a :class:`ProvenanceRecord`; the record ``repro up`` is still
writing (its own dict) is viewed through :func:`repro.record.provenance.as_record`. The classes here take a
document that passed that validation or that the kit built itself: every field the schema requires is
there, with the type it names. A fact that fails soft (``{"value": ..., "reason": ...}``,
:data:`repro.nodes.facts.Fact`) stays a mapping: what a probe found is whatever the probe found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from repro.nodes.facts import Fact


def _frozen(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True)
class RecordedKit:
    version: str
    commit: str | None  # the checkout's commit (+dirty); None for an installed wheel
    python: str


@dataclass(frozen=True)
class RecordedManifest:
    id: str
    path: str  # where it was loaded from
    sha256: str  # canonical digest of the manifest as loaded
    redacted: tuple[str, ...]  # fields whose secret values manifest.yaml omits
    redacted_sha256: str | None  # canonical digest of manifest.yaml as written, when it omits any


@dataclass(frozen=True)
class RecordedImage:
    ref: str | None
    id: str | None
    digest: str | None
    repo_digests: tuple[str, ...]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class RecordedNode:
    """One node's facts: its host probes, the image it ran, the container probe."""

    name: str
    address: str
    host: Mapping[str, Fact]
    image: RecordedImage
    container: Fact


@dataclass(frozen=True)
class RecordedCommand:
    """One container a cell ran on one node."""

    cell: str
    repeat: int
    rank: int
    node: str
    role: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    image: str
    workdir: str | None
    started: str
    ended: str | None
    exit_code: int | None
    log: str  # relative to the run directory
    log_sha256: str | None
    nccl_transport: Fact | None
    #: each rank as it saw itself in its container (Slurm steps; ``repro.record.rankfacts``): none elsewhere
    seen: tuple[RankSeen, ...] = ()


@dataclass(frozen=True)
class RankSeen:
    """One rank's facts read inside its container: its Slurm rank, locked memory, CPUs, environment."""

    rank: int | None
    memlock_kib: int | str  # a number, or "unlimited"
    cpu_count: int | None
    cpu_list: str  # Cpus_allowed_list, e.g. "0-3,8"
    env: Mapping[str, str]  # secret values blanked


@dataclass(frozen=True)
class Finding:
    """Something a finished cell's logs show against the target (``nccl-transport``...)."""

    cell: str
    repeat: int
    kind: str
    text: str


@dataclass(frozen=True)
class ProvenanceRecord:
    """What one run ran, where, from what, and what it produced (schema provenance.v1)."""

    schema_version: int
    run_id: str
    target: str
    kit: RecordedKit
    manifest: RecordedManifest
    lock: Mapping[str, Any] | None  # the resolved pins (image, base, source) the run used
    hosts_source: str | None  # the hosts file it ran on (None: the local machine)
    host_names: tuple[str, ...]  # the inventory's nodes, in its order
    dataset: Mapping[str, Any]
    protocol: Mapping[str, Any]
    started: str
    finished: str | None
    nodes: tuple[RecordedNode, ...]
    commands: tuple[RecordedCommand, ...]
    findings: tuple[Finding, ...]
    logs: Mapping[str, str]  # relative path -> sha256
    results: Mapping[str, str]  # report file -> sha256
    outcome: Mapping[str, int]  # repeats per status at the end of the run
    scheduler: tuple[Mapping[str, Any], ...]  # the Slurm allocations it ran in (none over SSH)

    @classmethod
    def from_checked(cls, doc: Mapping[str, Any]) -> ProvenanceRecord:
        """The view of a document that passed the schema (see the module's docstring)."""
        m, k = doc["manifest"], doc["kit"]
        return cls(
            schema_version=doc["schema_version"], run_id=doc["run_id"], target=doc["target"],
            kit=RecordedKit(k["version"], k["commit"], k["python"]),
            manifest=RecordedManifest(m["id"], m["path"], m["sha256"], tuple(m["redacted"]),
                                      m.get("redacted_sha256")),
            lock=_frozen(doc["lock"]) if doc["lock"] is not None else None,
            hosts_source=doc["hosts"]["source"], host_names=tuple(n["name"] for n in doc["hosts"]["nodes"]),
            dataset=_frozen(doc["dataset"]), protocol=_frozen(doc["protocol"]),
            started=doc["started"], finished=doc["finished"],
            nodes=tuple(_node(n) for n in doc["nodes"]), commands=tuple(_command(c) for c in doc["commands"]),
            findings=tuple(Finding(f["cell"], f["repeat"], f["kind"], f["text"])
                           for f in doc.get("findings", [])),
            logs=_frozen(doc["logs"]), results=_frozen(doc["results"]), outcome=_frozen(doc["outcome"]),
            scheduler=tuple(_frozen(a) for a in doc.get("scheduler", [])))


def _node(n: Mapping[str, Any]) -> RecordedNode:
    i = n["image"]
    image = RecordedImage(i["ref"], i["id"], i["digest"], tuple(i["repo_digests"]), _frozen(i.get("labels")))
    return RecordedNode(n["name"], n["address"], _frozen(n["host"]), image, n["container"])


def _command(c: Mapping[str, Any]) -> RecordedCommand:
    return RecordedCommand(c["cell"], c["repeat"], c["rank"], c["node"], c["role"], tuple(c["argv"]),
                           _frozen(c["env"]), c["image"], c["workdir"], c["started"], c["ended"],
                           c["exit_code"], c["log"], c["log_sha256"], c["nccl_transport"],
                           tuple(RankSeen(s["rank"], s["memlock_kib"], s["cpus"]["count"], s["cpus"]["list"],
                                          _frozen(s["env"])) for s in c.get("seen", ())))
