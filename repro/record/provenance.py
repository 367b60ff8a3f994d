"""The provenance record of one run: what ran, where, from what, and what it produced.

``repro up`` builds the record as the run goes (:func:`new_record`, :func:`add_node`,
:func:`add_command`) and seals the run directory with :func:`finalize`: digests of the reports it wrote,
``provenance.json`` (validated against ``repro/spec/schemas/provenance.v1.json``), the same
facts as an in-toto Statement with a SLSA Provenance v1 predicate, and ``SHA256SUMS``.
Environment values under secret-looking names are redacted before anything is written.

Every reader of a run's record reads it with :func:`read_record`: bounded, validated, and typed
(:mod:`repro.record.provenance_view`).
"""

from __future__ import annotations

import json
import os
import platform
import stat
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


from repro import __version__, paths
from repro.digest import sha256_file
from repro.errors import ProvenanceError
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Cell, Manifest
from repro.nodes.facts import Fact, fail, ok
from repro.redact import redact_argv, redact_env
from repro.layout import CHART, HOSTS, INTOTO, MANIFEST, PROVENANCE, REPORTS, STATE, SUMS, is_cell_file
from repro.record.dsse import SIGNED
from repro.record.rankfacts import log_facts
from repro.record.provenance_view import ProvenanceRecord
from repro.run.rundir import RunDir
from repro.spec.schema import load_schema, strict_validator_class

SCHEMA = "provenance.v1"
SCHEMA_VERSION = 1
BUILD_TYPE = "https://repro.invalid/buildtypes/repro-run/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kit_identity() -> dict[str, Any]:
    """The kit's version and, from a checkout, its commit (with ``+dirty`` when modified)."""
    root = paths.data_root()
    commit = None
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                                  capture_output=True, text=True, timeout=10)
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
                                    "repro"], capture_output=True, text=True, timeout=30)
            if head.returncode == 0:
                commit = head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.TimeoutExpired):
            commit = None
    return {"name": "repro", "version": __version__, "commit": commit, "python": platform.python_version()}


def dataset_identity(manifest: Manifest, hosts: Hosts,
                     digest: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What data the run read: the hosts file's data directory when the manifest mounts it."""
    mounts = manifest.launch.container.get("mounts", [])
    if not any("{data}" in str(m.get("source", "")) for m in mounts):
        return {"uri": "repro:none", "digest": {},
                "note": manifest.synthetic_data or "the manifest mounts no dataset (synthetic data)"}
    where = hosts.data_dir(manifest.dataset_format) if manifest.dataset_format else None
    if not where:
        return {"uri": "repro:unspecified", "digest": {}, "note": "the hosts file names no data directory"}
    return {"uri": f"file://{where}", "digest": dict(digest or {}), "format": manifest.dataset_format,
            "note": "" if digest else "the directory's content was not hashed"}


def new_record(run: RunDir, manifest: Manifest, hosts: Hosts, *, lock: Mapping[str, Any] | None = None,
               dataset: Mapping[str, Any] | None = None, started: str | None = None) -> dict[str, Any]:
    """The record of a run that is starting; fill it with add_node/add_command, then finalize."""
    state = run.read_state()
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run.run_id,
        "target": manifest.id,
        "kit": kit_identity(),
        "manifest": {"id": manifest.id, "path": str(manifest.path), "sha256": manifest.sha256,
                     "file": MANIFEST, "redacted": list(state.get("redacted", [])),
                     **({"redacted_sha256": state["redacted_sha256"]}
                        if state.get("redacted_sha256") else {})},
        "lock": dict(lock) if lock else None,
        "hosts": {"file": HOSTS, "source": str(hosts.path) if hosts.path else None,
                  "nodes": [{"name": n.name, "address": n.address} for n in hosts.nodes]},
        "dataset": dict(dataset) if dataset else dataset_identity(manifest, hosts),
        "protocol": {"parser": manifest.measure.parser, "protocol": dict(manifest.measure.protocol),
                     "overrides": [{"when": dict(w), "protocol": dict(p)}
                                   for w, p in manifest.measure.overrides],
                     "repeats": manifest.repeats, "aggregate_repeats": dict(manifest.measure.repeats),
                     "retries": manifest.retries, "timeout_s": manifest.launch.timeout_s},
        "started": started or now(),
        "finished": None,
        "nodes": [],
        "commands": [],
        "findings": [],
        "logs": {},
        "results": {},
        "outcome": None,
    }


def add_node(record: dict[str, Any], node: Node, *, host: Mapping[str, Fact], image: Mapping[str, Any],
             container: Fact) -> None:
    """One node's facts: host probes, the image it ran (ref, id, digest, labels), the container probe."""
    record["nodes"].append({"name": node.name, "address": node.address, "host": dict(host),
                            "image": {"ref": image.get("ref"), "id": image.get("id"),
                                      "digest": image.get("digest"),
                                      "repo_digests": list(image.get("repo_digests", [])),
                                      "labels": dict(image.get("labels") or {})},
                            "container": dict(container)})


def add_command(record: dict[str, Any], run: RunDir, cell: Cell, repeat: int, *, rank: int, node: str,
                role: str, argv: Sequence[str], env: Mapping[str, str], image: str, started: str,
                ended: str | None, exit_code: int | None, workdir: str | None = None,
                log: Path | str | None = None) -> None:
    """One container a cell ran on one node: the exact argv, its (redacted) env, times, exit status.

    ``log`` is where its output went (default: ``RunDir.log_path``); it must lie in the run directory.
    """
    path = Path(log) if log is not None else run.log_path(cell, repeat, rank, node)
    log = ((path if path.is_absolute() else run.path / path).resolve()
           .relative_to(run.path.resolve()).as_posix())
    record["commands"].append({"cell": cell.key, "repeat": repeat, "rank": rank, "node": node, "role": role,
                               "argv": redact_argv(argv), "env": redact_env(env), "image": image,
                               "workdir": workdir,
                               "started": started, "ended": ended, "exit_code": exit_code, "log": log,
                               "log_sha256": None, "nccl_transport": None})


def add_finding(record: dict[str, Any], cell: Cell, repeat: int, kind: str, text: str) -> None:
    """Something a finished cell's logs show against the target (``nccl-transport``: sockets where IB was
    expected)."""
    record.setdefault("findings", []).append({"cell": cell.key, "repeat": repeat, "kind": kind, "text": text})


def nccl_transport(path: Path) -> Fact:
    """The transport NCCL used, as the rank's log says (NCCL_DEBUG=INFO lines; see repro.measure.nccl)."""
    try:
        from repro.measure.nccl import scan
    except ImportError:
        return fail("this kit has no NCCL log scanner (repro.measure.nccl)")
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            s = scan(f)
    except OSError as e:
        return fail(f"log unreadable: {e}")
    if s.transport is None and s.missing_driver is None:
        return fail("no NCCL transport lines in the log (NCCL_DEBUG=INFO unset, or the rank used no NCCL)")
    return ok({"transport": s.transport, "evidence": s.evidence, "missing_driver": s.missing_driver})


def finalize(run: RunDir, record: dict[str, Any], *, finished: str | None = None) -> dict[str, Any]:
    """Seal the run directory: digests of its reports and logs, provenance.json, the in-toto export,
    SHA256SUMS.

    Files other code wrote (logs streamed by the launcher) are scrubbed of known secrets first;
    the reports are ``repro up``'s (:func:`repro.up.write_reports`), taken as they are.
    """
    run.scrub_files()
    record["results"] = {name: sha256_file(run.file(name)) for name in (*REPORTS.values(), CHART)
                         if run.file(name).is_file()}
    for cmd in record["commands"]:
        path = run.path / cmd["log"]
        cmd["log_sha256"] = sha256_file(path) if path.is_file() else None
        cmd["nccl_transport"] = nccl_transport(path) if path.is_file() else fail("no log")
        seen = log_facts(path)  # each rank's own facts, where its step said them (Slurm)
        if seen:
            cmd["seen"] = seen
    record["logs"] = {rel: sha256_file(run.path / rel) for rel in run.files() if is_cell_file(rel)}
    state = run.read_state()
    counts = {s: 0 for s in ("done", "failed", "pending", "running")}
    for c in state["cells"].values():
        for r in c["repeats"].values():
            counts[r["status"]] = counts.get(r["status"], 0) + 1
    record["outcome"] = counts
    record["finished"] = finished or now()
    record = run.redactor.data(record)
    check_record(record)
    run.file(SIGNED).unlink(missing_ok=True)  # a signature of the statement this seal replaces
    run.write_json(PROVENANCE, record)
    run.write_json(INTOTO, to_intoto(run, record))
    write_sums(run)
    return record


def write_sums(run: RunDir) -> None:
    lines = [f"{sha256_file(run.path / rel)}  {rel}\n" for rel in run.files()]
    run.write_text(SUMS, "".join(lines))


def _problems(instance: Any, schema: Mapping[str, Any]) -> list[str]:
    validator = strict_validator_class()(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def record_problems(record: Any) -> list[str]:
    if isinstance(record, Mapping) and record.get("schema_version") not in (None, SCHEMA_VERSION):
        return [f"schema_version {record.get('schema_version')!r} is not supported; "
                f"this kit reads {SCHEMA_VERSION}"]
    return _problems(record, load_schema(SCHEMA))


def statement_problems(statement: Any) -> list[str]:
    schema = load_schema(SCHEMA)
    return _problems(statement, {"$ref": "#/$defs/statement", "$defs": schema["$defs"]})


def check_record(record: Any, where: str = PROVENANCE) -> None:
    problems = record_problems(record)
    if problems:
        raise ProvenanceError(f"{where} is not a valid provenance record:\n  " + "\n  ".join(problems[:20]),
                              hint="it was written by another kit version, or edited by hand")


#: a provenance.json larger than this is not a run's record (a big run's is a few MiB; archives bound JSON so)
MAX_RECORD_BYTES = 64 << 20


def read_json(path: Path, limit: int = MAX_RECORD_BYTES) -> Any:
    """A JSON file of a run directory, read as untrusted: a regular file, at most ``limit`` bytes, UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ProvenanceError(f"no {path}") from None
    except OSError as e:
        raise ProvenanceError(f"{path} is unreadable: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a directory its own way
        os.close(fd)
        raise ProvenanceError(f"{path} is not a regular file (a directory, FIFO, socket or device)")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1) if st.st_size <= limit else b""
    if st.st_size > limit or len(data) > limit:
        raise ProvenanceError(f"{path} is over the {limit}-byte bound of a run's record",
                              hint="a run directory written by `repro up` holds a record of a few MiB")
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise ProvenanceError(f"{path} is unreadable: {e}") from e
    except RecursionError:
        raise ProvenanceError(f"{path} is unreadable: nested too deeply") from None


def load_record(path: Path) -> dict[str, Any]:
    """A provenance.json as the document it is, validated (ProvenanceError when missing, unreadable, too large
    or invalid): for a run that goes on writing its record. Readers use :func:`read_record`."""
    record = read_json(path)
    check_record(record, str(path))
    return record


def read_record(path: Path) -> ProvenanceRecord:
    """A provenance.json as a typed, read-only view: the one reader of the record (checked as
    :func:`load_record` checks it)."""
    return ProvenanceRecord.from_checked(load_record(path))


def as_record(record: ProvenanceRecord | Mapping[str, Any]) -> ProvenanceRecord:
    """The view of a record this process is writing (the dict :func:`new_record` began: the kit's own, so not
    validated again; KeyError or TypeError where a part is missing); a view as it is."""
    return record if isinstance(record, ProvenanceRecord) else ProvenanceRecord.from_checked(record)


def _image_uri(ref: str | None, digest: str) -> str:
    name = (ref or "image").split("@", 1)[0]
    return f"docker://{name}@{digest}"


def resolved_dependencies(run: RunDir, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Manifest, images (by digest), source commit, dataset and the published tables it reproduces."""
    deps: list[dict[str, Any]] = [{"name": MANIFEST, "uri": f"repro:target/{record['target']}",
                                   "digest": {"sha256": sha256_file(run.file(MANIFEST))},
                                   "annotations": {"canonicalSha256": record["manifest"]["sha256"]}}]
    images: dict[str, dict[str, Any]] = {}
    for n in record["nodes"]:
        img = n["image"]
        key = img.get("digest") or img.get("id") or "unknown"
        entry = images.setdefault(key, {"name": f"image:{img.get('ref')}",
                                        "uri": _image_uri(img.get("ref"), key)
                                        if key.startswith("sha256:") else f"docker://{img.get('ref')}",
                                        "digest": {"sha256": key.removeprefix("sha256:")}
                                        if key.startswith("sha256:") else {},
                                        "annotations": {"nodes": [], "imageId": img.get("id")}})
        entry["annotations"]["nodes"].append(n["name"])
    deps += images.values()
    data = run.load_manifest().data
    if src := data.get("source"):
        deps.append({"name": "source", "uri": f"git+{src['repository']}@{src['commit']}",
                     "digest": {"gitCommit": src["commit"]}})
    ds = record["dataset"]
    deps.append({"name": "dataset", "uri": ds["uri"], "digest": dict(ds.get("digest") or {})})
    for t in data.get("published", []):
        cite = t["cite"]
        deps.append({"name": f"published-table:{t['id']}",
                     "uri": f"git+{cite['repository']}@{cite['commit']}#{cite['path']}",
                     "digest": {"gitCommit": cite["commit"]}})
    return deps


def to_intoto(run: RunDir, record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as an in-toto Statement v1 with a SLSA Provenance v1 predicate."""
    subjects = [{"name": name, "digest": {"sha256": digest}}
                for name, digest in sorted(record["results"].items())]
    subjects += [{"name": name, "digest": {"sha256": digest}}
                 for name, digest in sorted(record["logs"].items())]
    state = run.read_state()
    engines = sorted({str(n["host"].get("docker", {}).get("value", {}).get("version"))
                      for n in record["nodes"] if n["host"].get("docker", {}).get("value")})
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"target": record["target"],
                                       "manifest": {"path": record["manifest"]["path"],
                                                    "sha256": record["manifest"]["sha256"]},
                                       "cells": sorted(state["cells"]),
                                       "repeats": record["protocol"]["repeats"],
                                       "hosts": [n["name"] for n in record["hosts"]["nodes"]]},
                "internalParameters": {"measurement": record["protocol"], "lock": record["lock"]},
                "resolvedDependencies": resolved_dependencies(run, record),
            },
            "runDetails": {
                "builder": {"id": f"https://repro.invalid/kit@{record['kit']['version']}",
                            "version": {"repro": record["kit"]["version"],
                                        "commit": str(record["kit"]["commit"]),
                                        "python": record["kit"]["python"], "docker": ", ".join(engines)}},
                "metadata": {"invocationId": record["run_id"], "startedOn": record["started"],
                             "finishedOn": record["finished"]},
                "byproducts": [{"name": name, "digest": {"sha256": sha256_file(run.file(name))}}
                               for name in (PROVENANCE, STATE, HOSTS) if run.file(name).is_file()],
            },
        },
    }
