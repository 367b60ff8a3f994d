"""``repro audit``: is a run what it says it is, and what the target asks for?

Four groups of checks, each a row ``ok | drift | missing | tampered`` (or one ``not sealed`` row for a run
that never wrote its provenance: there is nothing to verify, which is no evidence of tampering):

- integrity: SHA256SUMS against every file, the provenance record against its schema and
  the files it names, the in-toto export against the record, the manifest against its digest;
- pins: the image digest on every node, the framework version, the source commit, the
  manifest version (with ``--against``) - observed in the run against the manifest and lock;
- environment: the nodes' hardware and stack against the publication's (``expect``);
- results: every repeat finished, and the reports still follow from the logs;

and, where the run is signed or a key is given, its signature: the DSSE envelope beside the in-toto
statement must sign that very statement, and with keys, be by one of them (``not signed`` when there is
no envelope).

``missing`` (a fact the run could not observe) and ``not signed`` are reported but are not failures;
``drift`` and ``tampered`` are (exit 6 in the CLI), ``not sealed`` too (exit 10: no evidence either way).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tabulate import tabulate

from repro import __version__
from repro.record.archive import Limits, checksum_file, is_archive, opened_run
from repro.record.dsse import (MAX_ENVELOPE_BYTES, PAYLOAD_TYPE, SIGNED, Trusted, parse_envelope,
                                read_bounded, verify)
from repro.errors import ProvenanceError, ReproError
from repro.spec.manifest import Manifest, canonical_sha256
from repro.nodes.facts import value
from repro.record.provenance import as_record, read_json, read_record, statement_problems
from repro.record.provenance_view import ProvenanceRecord, RecordedNode
from repro.verdict.rules import Check
from repro.digest import sha256_file
from repro.layout import INTOTO, MANIFEST, PROVENANCE, REPORTS, SUMS, is_cell_file
from repro.run.rundir import RunDir
from repro.tree import walk

OK, DRIFT, MISSING, TAMPERED, NOT_SEALED = "ok", "drift", "missing", "tampered", "not sealed"
NOT_SIGNED = "not signed"
FAILING = (DRIFT, TAMPERED, NOT_SEALED)
#: manifest ``framework`` -> the container probe's key
PROBE_KEY = {"pytorch": "torch", "paddle": "paddle", "tensorflow": "tensorflow", "mxnet": "mxnet",
             "oneflow": "oneflow"}
GPU_MEMORY_TOLERANCE = 0.07
#: the label a built image carries: the digest of the base image it was built from
BASE_DIGEST = "org.opencontainers.image.base.digest"


def failing(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status in FAILING]


def render(checks: list[Check]) -> str:
    def cut(s: str, n: int) -> str:
        return s if len(s) <= n else s[: n - 1] + "…"
    rows = [[c.area, c.item, c.status.upper() if c.status in FAILING else c.status, cut(c.expected, 40),
             cut(c.observed, 48), cut(c.detail, 90)] for c in checks]
    counts = {s: sum(c.status == s for c in checks) for s in (OK, DRIFT, MISSING, TAMPERED)}
    for rare in (NOT_SEALED, NOT_SIGNED):
        if any(c.status == rare for c in checks):
            counts[rare] = sum(c.status == rare for c in checks)
    table = tabulate(rows, headers=["area", "check", "status", "expected", "observed", "detail"],
                     tablefmt="github", disable_numparse=True)
    summary = ", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(checks)} checks"
    return f"{table}\n\n{summary}\n"


# ------------------------------------------------------------------ integrity
def _safe_rel(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts and "\\" not in rel


def verify_sums(run: RunDir) -> list[Check]:
    sums = run.file(SUMS)
    if not sums.is_file():
        return [Check("integrity", SUMS, TAMPERED,
                      detail="missing: nothing in the run directory can be verified")]
    listed: dict[str, str] = {}
    out: list[Check] = []
    for i, line in enumerate(sums.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        m = re.match(r"^([0-9a-f]{64}) [ *](.+)$", line)
        if not m or not _safe_rel(m.group(2)):
            out.append(Check("integrity", f"{SUMS} line {i}", TAMPERED,
                             detail=f"not a checksum line: {line[:80]!r}"))
            continue
        if m.group(2) != SIGNED:
            listed[m.group(2)] = m.group(1)
    present = set()
    for p in walk(run.path, ProvenanceError):
        rel = p.relative_to(run.path).as_posix()
        if p.is_symlink():
            out.append(Check("integrity", rel, TAMPERED, detail=f"a symbolic link (to {p.readlink()})"))
        elif p.is_file() and rel not in (SUMS, SIGNED):  # the envelope is verified by its signature
            present.add(rel)
    for rel in sorted(listed):
        if rel not in present:
            out.append(Check("integrity", rel, TAMPERED, listed[rel][:12], "absent",
                             "listed in SHA256SUMS, not there"))
        elif (digest := sha256_file(run.path / rel)) != listed[rel]:
            out.append(Check("integrity", rel, TAMPERED, listed[rel][:12], digest[:12], "content changed"))
    for rel in sorted(present - set(listed)):
        out.append(Check("integrity", rel, TAMPERED, "", "present",
                         "not in SHA256SUMS: added after the run was sealed"))
    return out or [Check("integrity", SUMS, OK, observed=f"{len(listed)} files", detail="every file matches")]


def _record_checks(run: RunDir) -> tuple[ProvenanceRecord | None, list[Check]]:
    try:
        record = read_record(run.file(PROVENANCE))
    except ReproError as e:
        return None, [Check("integrity", PROVENANCE, TAMPERED, detail=str(e).replace("\n", " "))]
    out = [Check("integrity", f"{PROVENANCE} schema", OK, "provenance.v1", f"v{record.schema_version}")]
    if record.run_id != run.run_id:
        out.append(Check("integrity", "run id", TAMPERED, record.run_id, run.run_id,
                         "directory renamed or swapped"))
    on_disk = {rel: sha256_file(run.path / rel) for rel in run.files() if is_cell_file(rel)}
    bad = sorted(k for k in set(on_disk) | set(record.logs) if on_disk.get(k) != record.logs.get(k))
    out.append(Check("integrity", "log digests", TAMPERED if bad else OK, f"{len(record.logs)} logs",
                     f"{len(on_disk)} logs",
                     ("differ: " + ", ".join(bad[:3])) if bad else "match provenance.json"))
    for name, digest in record.results.items():
        path = run.path / name
        if not path.is_file() or sha256_file(path) != digest:
            out.append(Check("integrity", name, TAMPERED, digest[:12],
                             "absent" if not path.is_file() else "changed", "does not match provenance.json"))
    out += _statement_checks(run, record)
    out.append(_manifest_check(run, record))
    return record, out


def _statement_checks(run: RunDir, record: ProvenanceRecord) -> list[Check]:
    try:
        statement = read_json(run.file(INTOTO))
    except ReproError as e:
        return [Check("integrity", INTOTO, TAMPERED, detail=str(e))]
    problems = statement_problems(statement)
    if problems:
        return [Check("integrity", INTOTO, TAMPERED, detail="; ".join(problems[:3]))]
    want = {**record.results, **record.logs}
    have = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    meta = statement["predicate"]["runDetails"].get("metadata", {})
    byproducts = statement["predicate"]["runDetails"].get("byproducts", [])
    products = {b.get("name"): b.get("digest", {}).get("sha256") for b in byproducts}
    if have != want or meta.get("invocationId") != record.run_id:
        return [Check("integrity", INTOTO, TAMPERED,
                      detail="subjects or invocation differ from provenance.json")]
    if products.get(PROVENANCE) != sha256_file(run.file(PROVENANCE)):
        return [Check("integrity", INTOTO, TAMPERED,
                      detail="names another provenance.json than the one present")]
    return [Check("integrity", INTOTO, OK, observed=f"{len(have)} subjects", detail="in-toto v1 / SLSA v1")]


def _manifest_check(run: RunDir, record: ProvenanceRecord) -> Check:
    try:
        loaded = run.load_manifest()
    except ReproError as e:
        return Check("integrity", MANIFEST, TAMPERED,
                     detail=f"does not load: {str(e).splitlines()[0]}")
    want = record.manifest.sha256
    if record.manifest.redacted:
        redacted = record.manifest.redacted_sha256
        have = canonical_sha256(loaded.data)
        if redacted is None:  # written before redacted copies were recorded
            return Check("integrity", MANIFEST, MISSING, want[:12], have[:12],
                         "secret values were redacted, so its digest cannot be recomputed")
        n = len(record.manifest.redacted)
        return Check("integrity", f"{MANIFEST} (redacted)", OK if have == redacted else TAMPERED,
                     redacted[:12], have[:12],
                     f"the recorded redacted copy ({n} secret value(s) blanked)" if have == redacted
                     else "differs from the redacted copy the run recorded")
    status = OK if loaded.sha256 == want else TAMPERED
    return Check("integrity", MANIFEST, status, want[:12], loaded.sha256[:12],
                 "" if status == OK else "differs from the manifest the run recorded")


# ------------------------------------------------------------------ observations
def container(node: RecordedNode) -> Mapping[str, Any]:
    return value(node.container) or {}


def framework_build(node: RecordedNode, framework: str) -> Mapping[str, Any]:
    fw = value(container(node).get("frameworks", {}).get(PROBE_KEY.get(framework, framework))) or {}
    return fw


def gpus(node: RecordedNode) -> list[Mapping[str, Any]] | None:
    return value(node.host.get("gpus"))


def interconnect(node: RecordedNode) -> str | None:
    ports = value(node.host.get("hcas"))
    if ports is None:
        return "ethernet" if value(node.host.get("hostname")) else None
    active = [p for p in ports if str(p.get("state", "")).upper().endswith("ACTIVE")]
    layers = {str(p.get("link_layer", "")).lower() for p in active}
    return "infiniband" if "infiniband" in layers else "roce" if "ethernet" in layers else "ethernet"


def ib_rate(node: RecordedNode) -> float | None:
    ports = value(node.host.get("hcas")) or []
    rates = [p["rate_gbps"] for p in ports
             if str(p.get("state", "")).upper().endswith("ACTIVE") and p.get("rate_gbps")]
    return max(rates) if rates else None


def cudnn_text(v: Any) -> str | None:
    """cuDNN as frameworks report it (8902, 90100, '8.9.2') -> '8.9.2'."""
    if isinstance(v, int) or (isinstance(v, str) and v.isdigit()):
        n = int(v)
        major = n // 10000 if n >= 10000 else n // 1000
        rest = n - major * (10000 if n >= 10000 else 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return str(v) if v not in (None, "", False, "False") else None


def stack(node: RecordedNode, framework: str, key: str) -> str | None:
    """cuda/cudnn/nccl as the framework reports them, else the image's *_VERSION variables."""
    build = framework_build(node, framework).get("build", {})
    got = build.get(key) if key != "cudnn" else cudnn_text(build.get("cudnn"))
    if got in (None, "", False, True, "False", "0", 0):
        got = container(node).get("env_versions", {}).get(f"{key.upper()}_VERSION")
    return str(got) if got not in (None, "") else None


def _words(s: str) -> list[str]:
    return re.sub(r"\((r|tm)\)|\bcpu\b|@", " ", s.lower()).replace("(", " ").replace(")", " ").split()


def words_match(expected: str, observed: str) -> bool:
    """Every word of ``expected`` begins a word of ``observed``
    ('CentOS 7.5' ~ 'CentOS Linux release 7.5.1804')."""
    have = _words(observed)
    return all(any(h.startswith(w) for h in have) for w in _words(expected))


def version_match(expected: str, observed: str) -> bool:
    return observed == expected or observed.startswith(expected + ".") or observed.startswith(expected + "+")


# key -> (per-node observation, comparison)
Observe = Callable[[RecordedNode, str], Any]
ENVIRONMENT: dict[str, tuple[Observe, Callable[[Any, Any], bool]]] = {
    "gpu_model": (lambda n, f: "/".join(sorted({g["name"] for g in gpus(n) or []})) or None,
                  lambda e, o: all(words_match(e, x) for x in o.split("/"))),
    "gpu_memory_gb": (lambda n, f: min((g["memory_mib"] / 1024 for g in gpus(n) or [] if g.get("memory_mib")),
                                       default=None),
                      lambda e, o: abs(o - e) <= GPU_MEMORY_TOLERANCE * e),
    "gpus_per_node": (lambda n, f: len(gpus(n)) if gpus(n) is not None else None, lambda e, o: e == o),
    "driver": (lambda n, f: (gpus(n) or [{}])[0].get("driver"), lambda e, o: str(e) == str(o)),
    "interconnect": (lambda n, f: interconnect(n), lambda e, o: e == "none" or e == o),
    "ib_rate_gbps": (lambda n, f: ib_rate(n), lambda e, o: abs(o - e) <= 0.01 * e),
    "cpu": (lambda n, f: (value(n.host.get("cpu")) or {}).get("model"), words_match),
    "os": (lambda n, f: " ".join(filter(None, [(value(n.host.get("os")) or {}).get(k)
                                               for k in ("pretty_name", "release")])) or None, words_match),
    "cuda": (lambda n, f: stack(n, f, "cuda"), version_match),
    "cudnn": (lambda n, f: stack(n, f, "cudnn"), version_match),
    "nccl": (lambda n, f: stack(n, f, "nccl"), version_match),
}


def observe(record: ProvenanceRecord, key: str, framework: str) -> dict[str, Any]:
    """One fact per node (nodes whose probe saw nothing are left out)."""
    fn = ENVIRONMENT[key][0]
    out = {}
    for n in record.nodes:
        try:
            v = fn(n, framework)
        except (KeyError, TypeError, AttributeError):
            v = None
        if v is not None:
            out[n.name] = v
    return out


def per_node_text(per_node: Mapping[str, Any]) -> str:
    per_node = {k: round(v, 2) if isinstance(v, float) else v for k, v in per_node.items()}
    vals = {json.dumps(v) if not isinstance(v, str) else v for v in per_node.values()}
    if len(vals) == 1:
        return next(iter(vals))
    return "; ".join(f"{k}: {v}" for k, v in per_node.items())


def _compare(area: str, item: str, expected: Any, per_node: Mapping[str, Any],
             same: Callable[[Any, Any], bool], unpinned: str = "not in expect") -> Check:
    if not per_node:
        return Check(area, item, MISSING, str(expected), "—", "not observed on any node")
    if expected in (None, ""):
        uniform = len({json.dumps(v) for v in per_node.values()}) == 1
        return Check(area, item, OK if uniform else DRIFT, "—", per_node_text(per_node),
                     unpinned if uniform else "nodes differ")
    bad = [k for k, v in per_node.items() if not same(expected, v)]
    return Check(area, item, DRIFT if bad else OK, str(expected), per_node_text(per_node),
                 f"differs on {', '.join(bad)}" if bad else "")


# ------------------------------------------------------------------ pins, environment, results
def _lock_digest(record: ProvenanceRecord, role: str) -> str | None:
    lock = record.lock or {}
    return (lock.get("images", {}).get(role) or {}).get("digest") or None


def pin_checks(record: ProvenanceRecord, ref: Manifest, against: bool) -> list[Check]:
    out = []
    if against:
        same = ref.sha256 == record.manifest.sha256
        out.append(Check("pins", "manifest", OK if same else DRIFT, ref.sha256[:12],
                         record.manifest.sha256[:12],
                         "" if same else f"the run used another version of {ref.id}'s manifest"))
    nodes = record.nodes
    if "registry" in ref.image:
        want = _lock_digest(record, "image") or ref.image["registry"].get("digest") or None
        seen = {n.name: n.image.digest for n in nodes if n.image.digest}
        out.append(_compare("pins", "image digest", want, seen, lambda e, o: e == o,
                            "not pinned; one image everywhere"))
    else:
        want = _lock_digest(record, "base") or ref.image["build"]["base"].get("digest") or None
        seen = {n.name: n.image.labels[BASE_DIGEST] for n in nodes if n.image.labels.get(BASE_DIGEST)}
        out.append(_compare("pins", "base image digest", want, seen, lambda e, o: e == o,
                            "not pinned; one base everywhere"))
        ids = {n.name: n.image.id for n in nodes if n.image.id}
        out.append(_compare("pins", "image id", None, ids, lambda e, o: e == o, "one image on every node"))
    fw_versions = {n.name: framework_build(n, ref.framework).get("version") for n in nodes
                   if framework_build(n, ref.framework).get("version")}
    out.append(_compare("pins", f"{ref.framework} version", ref.expect.get("framework_version"), fw_versions,
                        lambda e, o: e == o, "not in expect; the same on every node"))
    if ref.source:
        path = ref.source["path"]
        lock_src = ((record.lock or {}).get("sources", {}).get("source") or {}).get("commit")
        commits = {n.name: (value(container(n).get("sources", {}).get(path)) or {}).get("commit")
                   for n in nodes}
        out.append(_compare("pins", "source commit", lock_src or ref.source["commit"],
                            {k: v for k, v in commits.items() if v}, lambda e, o: e == o))
    return out


def environment_checks(record: ProvenanceRecord | Mapping[str, Any], ref: Manifest) -> list[Check]:
    """The nodes' hardware and stack against the publication's; ``record`` a view, or the record ``repro up``
    is writing (a dict)."""
    record = as_record(record)
    out = []
    ran = {c.cell for c in record.commands}
    expect = ref.expect_for(c for c in ref.cells() if c.key in ran)
    if "nodes" in expect:
        n = len(record.nodes)
        out.append(Check("environment", "nodes", OK if n == expect["nodes"] else DRIFT,
                         str(expect["nodes"]), str(n)))
    for key, (_, same) in ENVIRONMENT.items():
        if key in expect:
            out.append(_compare("environment", key, expect[key], observe(record, key, ref.framework), same))
    return out


def result_checks(run: RunDir, record: ProvenanceRecord) -> list[Check]:
    counts = record.outcome
    unfinished = sum(v for k, v in counts.items() if k != "done")
    out = [Check("results", "repeats", MISSING if unfinished else OK, "all done",
                 ", ".join(f"{v} {k}" for k, v in counts.items() if v),
                 f"{unfinished} did not finish" if unfinished else "")]
    if REPORTS["json"] not in record.results:
        return out
    from repro.verdict.reproduce import reproduce_run

    try:
        now = {_cell_id(c.__dict__): c.reproduced for c in reproduce_run(run.path).cells}
        doc = json.loads(run.file(REPORTS["json"]).read_text())
        saved = {_cell_id(c): c.get("reproduced") for c in (doc["cells"] if isinstance(doc, dict) else doc)}
    except (ReproError, OSError, ValueError, KeyError) as e:
        return out + [Check("results", "report.json", TAMPERED, detail=f"cannot be re-derived: {e}")]
    differ = sorted(k for k in set(now) | set(saved) if not _close(now.get(k), saved.get(k)))
    same_kit = record.kit.version == __version__
    status = OK if not differ else (TAMPERED if same_kit else DRIFT)
    detail = ("" if not differ else f"differs for {', '.join(differ[:3])}"
              + ("" if same_kit else f" (written by kit {record.kit.version}, this is {__version__})"))
    return out + [Check("results", "report.json re-derived from the logs", status, f"{len(saved)} cells",
                        f"{len(now)} cells", detail)]


def _cell_id(c: Mapping[str, Any]) -> str:
    return f"{c['nodes']}n/{c['gpus']}g {c['precision']} bs{c['batch_size']}"


def _close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and abs(a - b) <= 1e-9 * max(1.0, abs(a)))


def integrity(run: RunDir) -> tuple[dict[str, Any] | None, list[Check]]:
    """The integrity checks of a sealed run: its files against SHA256SUMS, the record and the statement."""
    record, checks = _record_checks(run)
    return record, verify_sums(run) + checks


def signature_checks(run: RunDir, keys: list[Trusted] | None) -> list[Check]:
    """The envelope signs the statement present, and with ``keys``, one of them made it (none: not
    signed, a row only where keys are given)."""
    path = run.file(SIGNED)
    if not path.exists() and not path.is_symlink():
        return [] if keys is None else [Check(
            "signature", SIGNED, NOT_SIGNED, "a signature by the key", "none",
            "the run is not signed (repro report RUN signs it, given --sign-key)")]
    try:
        env = parse_envelope(read_bounded(path, MAX_ENVELOPE_BYTES, "envelope"))
        statement = read_bounded(run.file(INTOTO), MAX_ENVELOPE_BYTES, "statement")
    except ReproError as e:
        return [Check("signature", SIGNED, TAMPERED, detail=str(e).replace(str(run.path) + "/", ""))]
    signed_by = ", ".join(k or "(no keyid)" for k, _ in env.signatures)
    if env.payload_type != PAYLOAD_TYPE or env.payload != statement:
        return [Check("signature", SIGNED, TAMPERED, detail=f"signs another statement than {INTOTO}")]
    if keys is None:
        return [Check("signature", SIGNED, MISSING, "—", f"keyid {signed_by}",
                      "signed; who signed is checked only given the key (--key)")]
    signer = verify(env, keys)
    if signer is None:
        return [Check("signature", SIGNED, TAMPERED, "a signature by the key", f"keyid {signed_by}",
                      "not signed by the key given, or the signed statement was changed")]
    return [Check("signature", SIGNED, OK, "a signature by the key", signer, f"DSSE over {INTOTO}")]


def audit_run(run: RunDir, against: Manifest | None = None, keys: list[Trusted] | None = None) -> list[Check]:
    if not run.file(SUMS).exists() and not run.file(PROVENANCE).exists():
        return [Check("integrity", PROVENANCE, NOT_SEALED, f"{PROVENANCE} and {SUMS}", "absent",
                      "the run never sealed itself (it did not finish, or was stopped before the end): "
                      "nothing in it can be verified; `repro up --resume RUN_DIR` finishes and seals it")]
    record, checks = integrity(run)
    checks += signature_checks(run, keys)
    if record is None:
        return checks
    try:
        ref = against or run.load_manifest()
    except ReproError:
        return checks
    return checks + pin_checks(record, ref, against is not None) + environment_checks(record, ref) \
        + result_checks(run, record)


def audit(path: Path, against: str | None = None, limits: Limits = Limits(),
          keys: list[Trusted] | None = None) -> list[Check]:
    """Audit a run directory or archive (unpacked safely first); ``against``: a target id or manifest;
    ``keys``: who may have signed it (:func:`repro.record.dsse.load_keys`)."""
    target = None
    if against:
        from repro.spec.manifest import find_target

        target = find_target(against)
    with opened_run(path, limits, links=True) as run:
        checks = audit_run(run, target, keys)
    if is_archive(Path(path)):
        has = checksum_file(Path(path)).is_file()
        checks.insert(0, Check("integrity", checksum_file(Path(path)).name, OK if has else MISSING,
                               detail="archive matches it" if has else "no checksum file beside the archive"))
    return checks
