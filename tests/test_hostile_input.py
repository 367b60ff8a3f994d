"""Hostile input, as an attacker or a careless user writes it: manifests, hosts files, logs and
run archives, each through the real CLI (in process).

Every case must end within its time bound with the exit code it names (2 for bad input, 6 for
an archive or run directory that fails an integrity check), with no traceback, and with a
message that names the file and, where there is one, the field or archive member.
Cases are rows of tables: a base document and one change to it.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
import signal
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from repro.record.archive import create
from repro.cli import cli

DATA = Path(__file__).resolve().parent / "data"
BASE_MANIFEST = yaml.safe_load((DATA / "good" / "minimal.yaml").read_text())
BASE_HOSTS = yaml.safe_load((DATA / "good" / "hosts-4.yaml").read_text())
TIME_BOUND_S = 5.0


class Hung(Exception):
    pass


def run_cli(args: list[str], bound: float = TIME_BOUND_S) -> tuple[int, str, float]:
    """Exit code, output (stdout and stderr) and CPU seconds of ``repro ARGS`` (what it cost, whatever else
    the machine runs); a hang, past twice the bound of wall time, fails the case."""

    def alarm(signum: int, frame: object) -> None:
        raise Hung(f"repro {' '.join(args)} ran past {2 * bound:g} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 2 * bound)
    t0 = time.process_time()
    try:
        res = CliRunner().invoke(cli, args, catch_exceptions=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    took = time.process_time() - t0
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"uncaught {type(res.exception).__name__}: {res.exception}\n{res.output}")
    assert "Traceback" not in res.output
    return res.exit_code, res.output, took


def check(args: list[str], code: int, *needles: str) -> None:
    got, out, took = run_cli(args)
    assert got == code, f"exit {got}, expected {code}:\n{out}"
    for n in needles:
        assert n in out, f"{n!r} not in:\n{out}"
    assert took < TIME_BOUND_S, f"took {took:.1f} s of CPU"


def put(path: list[str | int], value: Any) -> Callable[[Any], Any]:
    def change(doc: Any) -> Any:
        doc = copy.deepcopy(doc)
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
        return doc

    return change


def text(s: str) -> Callable[[Any], str]:
    return lambda doc: s


def add_lines(*lines: str, after: str) -> Callable[[Any], str]:
    """The document as YAML with ``lines`` inserted after the line starting with ``after``."""

    def change(doc: Any) -> str:
        out = []
        for ln in dump(doc).splitlines():
            out.append(ln)
            if ln.startswith(after):
                out.extend(lines)
        return "\n".join(out) + "\n"

    return change


def write(tmp_path: Path, name: str, content: Any) -> Path:
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content)
    else:
        p.write_text(dump(content))
    return p


def dump(doc: Any) -> str:
    """A document as YAML text, written by libyaml (the hostile part is the content, not the writing)."""
    return yaml.dump(doc, Dumper=yaml.CSafeDumper, sort_keys=False)


CMD = ["launch", "command"]
NESTED = "a: " + "[" * 100_000 + "]" * 100_000 + "\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(9))

# (case, change to the base manifest, field the message names, words it must hold)
MANIFEST_CASES: list[tuple[str, Callable[[Any], Any], str, str]] = [
    ("alias-bomb", text(BOMB), "", "alias *a is not allowed"),
    ("merge-key-alias", text("base: &b {x: 1}\nother:\n  <<: *b\n"), "", "alias *b is not allowed"),
    ("nested-100k", text(NESTED), "", "nested too deeply"),
    ("over-size-notes", lambda d: {**d, "notes": ["n" * 60] * 20_000}, "", "-byte limit"),
    ("python-tag", text("id: !!python/object/apply:os.system [true]\n"), "", "invalid YAML"),
    ("top-level-list", text("- 1\n- 2\n"), "", "expected a mapping"),
    ("format-spec-width", put([*CMD, 9], "{batch_size:>300000000}"), "launch.command[9]", "format spec"),
    ("format-spec-d", put([*CMD, 9], "{batch_size:d}"), "launch.command[9]", "format spec"),
    ("conversion-r", put([*CMD, 9], "{gpus!r}"), "launch.command[9]", "format spec or conversion"),
    ("conversion-unknown-name", put([*CMD, 9], "{x!r}"), "launch.command[9]", "unknown placeholder"),
    ("positional-field", put([*CMD, 9], "{0}"), "launch.command[9]", "unknown placeholder"),
    ("empty-field", put([*CMD, 9], "{}"), "launch.command[9]", "unknown placeholder"),
    ("attribute-field", put([*CMD, 9], "{batch_size.__class__}"), "launch.command[9]", "unknown placeholder"),
    ("index-field", put([*CMD, 9], "{batch_size[0]}"), "launch.command[9]", "unknown placeholder"),
    ("unbalanced-brace", put([*CMD, 9], "{batch_size"), "launch.command[9]", "unbalanced brace"),
    ("format-spec-in-precision-args", put(["launch", "precision_args", "amp", 0], "{gpus:x}"),
     "launch.precision_args.amp[0]", "format spec"),
    ("gpus-per-node-huge", put(["matrix", "gpus_per_node"], [50_000_000]), "matrix.gpus_per_node[0]", "maximum"),
    ("nodes-huge", put(["matrix", "nodes"], [100_000]), "matrix.nodes[0]", "maximum"),
    ("nodes-float", put(["matrix", "nodes"], [1.0]), "matrix.nodes[0]", "expected integer, found float"),
    ("batch-float", put(["matrix", "batch_size"], [256.0]), "matrix.batch_size[0]", "expected integer"),
    ("batch-bool", put(["matrix", "batch_size"], [True]), "matrix.batch_size[0]", "found bool"),
    ("batch-string", put(["matrix", "batch_size"], ["256"]), "matrix.batch_size[0]", "expected integer"),
    ("batch-negative", put(["matrix", "batch_size"], [-1]), "matrix.batch_size[0]", "minimum"),
    ("batch-list-long", put(["matrix", "batch_size"], list(range(1, 200))), "matrix.batch_size", "too long"),
    ("too-many-runs", lambda d: put(["matrix", "batch_size"], list(range(1, 64)))(put(["matrix", "repeats"], 1000)(d)),
     "matrix", "over the limit of 10000"),
    ("repeats-float", put(["matrix", "repeats"], 1.5), "matrix.repeats", "expected integer"),
    ("repeats-huge", put(["matrix", "repeats"], 10**9), "matrix.repeats", "maximum"),
    ("retries-bool", put(["matrix", "retries"], False), "matrix.retries", "found bool"),
    ("master-port-float", put(["launch", "master_port"], 29500.0), "launch.master_port", "expected integer"),
    ("master-port-string", put(["launch", "master_port"], "29500"), "launch.master_port", "expected integer"),
    ("timeout-bool", put(["launch", "timeout_s"], True), "launch.timeout_s", "found bool"),
    ("timeout-huge", put(["launch", "timeout_s"], 10**12), "launch.timeout_s", "maximum"),
    ("skip-records-float", put(["measure", "protocol", "skip"], {"records": 5.0}), "measure.protocol.skip.records",
     "expected integer"),
    ("id-newline", put(["id"], "test-minimal\n"), "id", "does not match"),
    ("commit-newline", put(["source", "commit"], "fc9c09b08d6d39fb13c79c8a7e08f85b03dbf3d1\n"), "source.commit",
     "does not match"),
    ("digest-newline", put(["image", "registry", "digest"], "sha256:" + "a" * 64 + "\n"), "image.registry.digest",
     "does not match"),
    ("ref-newline", put(["image", "registry", "ref"], "nvcr.io/nvidia/pytorch:21.03-py3\n"), "image.registry.ref",
     "does not match"),
    ("workdir-relative", put(["launch", "workdir"], "workspace"), "launch.workdir", "does not match"),
    ("value-newline", put(["published", 0, "cells", 0, "value"], "370.194\n"), "published[0].cells[0].value",
     "does not match"),
    ("value-unquoted", put(["published", 0, "cells", 0, "value"], 370.194), "published[0].cells[0].value",
     "expected string"),
    ("published-gpus-float", put(["published", 0, "cells", 0, "gpus"], 1.0), "published[0].cells[0].gpus",
     "expected integer"),
    ("tolerance-string", put(["published", 0, "tolerance_pct"], "3"), "published[0].tolerance_pct", "expected number"),
    ("env-key-off", add_lines("  env:", "    OFF: x", after="  kind:"), "launch.env.OFF", "is not text"),
    ("env-key-yes", add_lines("  env:", "    yes: x", after="  kind:"), "launch.env.yes", "is not text"),
    ("env-key-int", add_lines("  env:", "    1: x", after="  kind:"), "launch.env.1", "is not text"),
    ("env-key-null", add_lines("  env:", "    null: x", after="  kind:"), "launch.env.null", "is not text"),
    ("env-key-bad-name", put(["launch", "env"], {"BAD KEY": "x"}), "launch.env", "does not match"),
    ("env-key-dash", put(["launch", "env"], {"-e": "x"}), "launch.env", "does not match"),
    ("env-value-int", put(["launch", "env"], {"NCCL_DEBUG": 1}), "launch.env.NCCL_DEBUG", "expected string"),
    ("env-value-bool", put(["launch", "env"], {"NCCL_DEBUG": True}), "launch.env.NCCL_DEBUG", "expected string"),
    ("env-value-list", put(["launch", "env"], {"NCCL_DEBUG": ["a"]}), "launch.env.NCCL_DEBUG", "expected string"),
    ("cell-env-value-float", put(["launch", "cell_args"], [{"when": {"gpus": 8}, "env": {"X": 1.5}}]),
     "launch.cell_args[0].env.X", "expected string"),
    ("cell-when-float", put(["launch", "cell_args"], [{"when": {"gpus": 8.0}, "args": []}]),
     "launch.cell_args[0].when.gpus", "expected integer"),
    ("logs-dir-escapes", put(["published", 0, "logs"], "logs/published/../../../../etc"), "published[0].logs",
     "leaves logs/published/"),
    ("log-escapes", put(["published", 0, "cells", 0, "log"], "../../../../../../../../../../etc/passwd"),
     "published[0].cells[0].log", "leaves its table's directory"),
    ("log-absolute", put(["published", 0, "cells", 0, "log"], "/etc/passwd"), "published[0].cells[0].log",
     "leaves its table's directory"),
    ("mount-source-colon", put(["launch", "container"], {"mounts": [{"source": "/data:/etc", "target": "/x"}]}),
     "launch.container.mounts[0].source", "contains ':'"),
    ("mount-target-colon", put(["launch", "container"], {"mounts": [{"source": "/data", "target": "/x:rw"}]}),
     "launch.container.mounts[0].target", "contains ':'"),
    ("mount-source-relative", put(["launch", "container"], {"mounts": [{"source": "data", "target": "/x"}]}),
     "launch.container.mounts[0].source", "neither an absolute host path"),
    ("mount-read-only-string", put(["launch", "container"], {"mounts": [{"source": "/d", "target": "/x",
                                                                          "read_only": "yes"}]}),
     "launch.container.mounts[0].read_only", "expected boolean"),
    ("schema-version-true", put(["schema_version"], True), "schema_version", "unsupported version"),
    ("duplicate-key", text(yaml.safe_dump(BASE_MANIFEST, sort_keys=False) + "id: again\n"), "id", "duplicate key"),
]

HOSTS_CASES: list[tuple[str, Callable[[Any], Any], str, str]] = [
    ("address-newline", put(["nodes", 0, "address"], "10.11.0.2\n"), "nodes[0].address", "does not match"),
    ("address-option", put(["nodes", 0, "address"], "-oProxyCommand=touch /tmp/x"), "nodes[0].address",
     "does not match"),
    ("address-space", put(["nodes", 0, "address"], "10.0.0.1 -p 2"), "nodes[0].address", "does not match"),
    ("name-newline", put(["nodes", 0, "name"], "node1\n"), "nodes[0].name", "does not match"),
    ("user-newline", put(["defaults", "user"], "root\n"), "defaults.user", "does not match"),
    ("user-option", put(["defaults", "user"], "-oX"), "defaults.user", "does not match"),
    ("port-float", put(["defaults", "port"], 22.0), "defaults.port", "expected integer"),
    ("port-bool", put(["defaults", "port"], True), "defaults.port", "found bool"),
    ("port-string", put(["defaults", "port"], "22"), "defaults.port", "expected integer"),
    ("port-too-big", put(["defaults", "port"], 70_000), "defaults.port", "maximum"),
    ("gpus-float", put(["nodes", 1, "gpus"], 8.0), "nodes[1].gpus", "expected integer"),
    ("gpus-huge", put(["nodes", 1, "gpus"], 50_000_000), "nodes[1].gpus", "maximum"),
    ("docker-host-proxycommand", put(["nodes", 0, "docker_host"], "ssh://-oProxyCommand=touch /tmp/pwned"),
     "nodes[0].docker_host", "does not match"),
    ("docker-host-option-no-space", put(["nodes", 0, "docker_host"], "ssh://-oProxyCommand=id"),
     "nodes[0].docker_host", "does not match"),
    ("docker-host-user-option", put(["nodes", 0, "docker_host"], "ssh://-l@host"), "nodes[0].docker_host",
     "does not match"),
    ("docker-host-newline", put(["nodes", 0, "docker_host"], "ssh://node1\n"), "nodes[0].docker_host",
     "does not match"),
    ("docker-host-query", put(["nodes", 0, "docker_host"], "tcp://h:2375/?x=1"), "nodes[0].docker_host",
     "does not match"),
    ("docker-host-http", put(["nodes", 0, "docker_host"], "http://h:2375"), "nodes[0].docker_host", "does not match"),
    ("rendezvous-newline", put(["nodes", 0, "rendezvous_address"], "192.168.1.2\n"), "nodes[0].rendezvous_address",
     "does not match"),
    ("rendezvous-option", put(["nodes", 0, "rendezvous_address"], "-x"), "nodes[0].rendezvous_address",
     "does not match"),
    ("data-colon", put(["data"], "/datasets:/etc"), "data", "does not match"),
    ("data-relative", put(["data"], "datasets"), "data", "does not match"),
    ("data-newline", put(["data"], "/datasets\n"), "data", "does not match"),
    ("env-value-int", put(["env"], {"NCCL_IB_HCA": 1}), "env.NCCL_IB_HCA", "expected string"),
    ("env-key-bad", put(["env"], {"A=B": "x"}), "env", "does not match"),
    ("env-key-off", add_lines("env:", "  OFF: x", after="data:"), "env.OFF", "is not text"),
    ("identity-empty", put(["defaults", "identity"], ""), "defaults.identity", "non-empty"),
    ("nodes-empty", put(["nodes"], []), "nodes", "must not be empty"),
    ("node-float", put(["nodes"], [1.0]), "nodes[0]", "expected object"),
    ("unknown-key", put(["nodes", 0, "proxy_command"], "nc %h %p"), "nodes[0].proxy_command", "unknown key"),
    ("alias-bomb", text("schema_version: 1\n" + BOMB), "", "alias *a is not allowed"),
    ("over-size", lambda d: "# " + "x" * (1 << 20) + "\n" + yaml.safe_dump(d), "", "-byte limit"),
]


@pytest.mark.parametrize("case,change,field,words", MANIFEST_CASES, ids=[c[0] for c in MANIFEST_CASES])
def test_hostile_manifest(tmp_path: Path, case: str, change: Callable[[Any], Any], field: str, words: str) -> None:
    path = write(tmp_path, f"{case}.yaml", change(BASE_MANIFEST))
    check(["validate", str(path)], 2, f"{path}:" if field else str(path), f": {field}: " if field else "", words)


@pytest.mark.parametrize("case,change,field,words", HOSTS_CASES, ids=[c[0] for c in HOSTS_CASES])
def test_hostile_hosts(tmp_path: Path, case: str, change: Callable[[Any], Any], field: str, words: str) -> None:
    path = write(tmp_path, f"{case}.yaml", change(BASE_HOSTS))
    check(["validate", str(path)], 2, str(path), f": {field}: " if field else "", words)
    manifest = write(tmp_path, "m.yaml", BASE_MANIFEST)
    check(["plan", str(manifest), "--hosts", str(path)], 2, str(path), words)


# ------------------------------------------------------------------ files that are not files
def fifo(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    os.mkfifo(p)
    return p


SPECIAL: list[tuple[str, Callable[[Path], list[str]], int, str]] = [
    ("validate-fifo", lambda t: ["validate", str(fifo(t, "m.yaml"))], 2, "m.yaml: not a regular file"),
    ("validate-dev-zero", lambda t: ["validate", "/dev/zero"], 2, "/dev/zero: not a regular file"),
    ("validate-dev-null", lambda t: ["validate", "/dev/null"], 2, "/dev/null: not a regular file"),
    ("validate-missing", lambda t: ["validate", str(t / "nope.yaml")], 2, "nope.yaml: no such file"),
    ("validate-empty-dir", lambda t: ["validate", str(t)], 2, ": no *.yaml file"),
    ("validate-not-utf8", lambda t: ["validate", str(write(t, "b.yaml", b"id: \xff\xfe\n"))], 2, "b.yaml: cannot read: not UTF-8"),
    ("plan-fifo-manifest", lambda t: ["plan", str(fifo(t, "m.yaml"))], 2, "m.yaml: not a regular file"),
    ("plan-fifo-hosts", lambda t: ["plan", str(write(t, "m.yaml", BASE_MANIFEST)), "--hosts", str(fifo(t, "h.yaml"))],
     2, "h.yaml: not a regular file"),
    ("plan-dev-zero-hosts", lambda t: ["plan", str(write(t, "m.yaml", BASE_MANIFEST)), "--hosts", "/dev/zero"],
     2, "/dev/zero: not a regular file"),
    ("show-fifo", lambda t: ["show", str(fifo(t, "m.yaml"))], 2, "m.yaml: not a regular file"),
    ("audit-fifo-archive", lambda t: ["audit", str(fifo(t, "r.tar.gz"))], 2, "r.tar.gz is neither a run directory"),
    ("plan-directory-hosts", lambda t: ["plan", str(write(t, "m.yaml", BASE_MANIFEST)), "--hosts", str(t)],
     2, ": is a directory, not a file"),
    ("plan-directory-manifest", lambda t: ["plan", str(folder(t, "m.yaml"))], 2, "m.yaml: is a directory"),
    ("show-directory-manifest", lambda t: ["show", str(folder(t, "m.yaml"))], 2, "m.yaml: is a directory"),
    ("validate-directory-named-yaml", lambda t: ["validate", str(folder(t, "d.yaml").parent)], 2,
     "d.yaml: is a directory"),
]


def folder(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


@pytest.mark.parametrize("case,args,code,words", SPECIAL, ids=[c[0] for c in SPECIAL])
def test_special_files_refused_at_once(tmp_path: Path, case: str, args: Callable[[Path], list[str]], code: int,
                                       words: str) -> None:
    check(args(tmp_path), code, words)


# ------------------------------------------------------------------ logs (through parse / report as black boxes)
LOG_CASES: list[Any] = [
    ("empty", lambda t: write(t, "empty.log", b"")),
    ("binary", lambda t: write(t, "bin.log", bytes(range(256)) * 64)),
    ("nul-bytes", lambda t: write(t, "nul.log", b"\0" * 100_000)),
    ("bad-utf8", lambda t: write(t, "u.log", b"\xff\xfe\xfd ips: 12.5\n" * 100)),
    ("one-long-line", lambda t: write(t, "long.log", b"x" * 5_000_000)),
    ("fifo", lambda t: fifo(t, "f.log")),
    ("directory", lambda t: t),
    ("missing", lambda t: t / "missing.log"),
    ("numbers-only-garbage", lambda t: write(t, "g.log", b"ips: nan\nips: inf\nips: -1e400\n" * 1000)),
    ("huge-number", lambda t: write(t, "h.log", b"[2021-01-01] epoch 0 iter 1 ips: 9" + b"9" * 20000 + b"\n")),
]


@pytest.mark.parametrize("case,make", [c if hasattr(c, "marks") else pytest.param(*c, id=c[0])
                                       for c in LOG_CASES])
def test_hostile_log(tmp_path: Path, case: str, make: Callable[[Path], Path]) -> None:
    log = make(tmp_path)
    code, out, took = run_cli(["parse", str(log)])
    assert code == 2, out
    assert str(log) in out or log.name in out, out
    assert took < TIME_BOUND_S


def test_report_plot_into_unwritable_place(tmp_path: Path) -> None:
    check(["report", "perf-2.5-v100", "--plot", "/proc/repro-plot.png"], 2, "/proc/repro-plot.png")


# ------------------------------------------------------------------ run archives and directories
@pytest.fixture(scope="module")
def sealed_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_provenance import make_run

    run = make_run(tmp_path_factory.mktemp("runs"))
    return create(run)


def rebuild(src: Path, dest: Path, change: Callable[[tarfile.TarFile, tarfile.TarInfo, bytes | None], None],
            extra: Callable[[tarfile.TarFile, str], None] | None = None) -> Path:
    """A copy of an archive (no checksum file) with each member passed through ``change``."""
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dest, "w:gz") as tout:
        top = None
        for m in tin:
            top = top or m.name.split("/")[0]
            change(tout, m, tin.extractfile(m).read() if m.isfile() else None)
        if extra:
            extra(tout, top)
    return dest


def keep(tout: tarfile.TarFile, m: tarfile.TarInfo, data: bytes | None) -> None:
    tout.addfile(m, io.BytesIO(data) if data is not None else None)


def replace(name: str, data: bytes) -> Callable[[tarfile.TarFile, tarfile.TarInfo, bytes | None], None]:
    def change(tout: tarfile.TarFile, m: tarfile.TarInfo, old: bytes | None) -> None:
        if m.name.endswith("/" + name):
            m = copy.copy(m)
            m.size = len(data)
            tout.addfile(m, io.BytesIO(data))
        else:
            keep(tout, m, old)

    return change


def drop(name: str) -> Callable[[tarfile.TarFile, tarfile.TarInfo, bytes | None], None]:
    def change(tout: tarfile.TarFile, m: tarfile.TarInfo, old: bytes | None) -> None:
        if not m.name.endswith("/" + name):
            keep(tout, m, old)

    return change


def add(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", linkname: str = "",
        under_top: bool = True) -> Callable[[tarfile.TarFile, str], None]:
    def extra(tout: tarfile.TarFile, top: str) -> None:
        info = tarfile.TarInfo(f"{top}/{name}" if under_top else name)
        info.type, info.linkname, info.size = kind, linkname, len(data) if kind == tarfile.REGTYPE else 0
        tout.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    return extra


DEEP = b"[" * 100_000 + b"]" * 100_000
ARCHIVE_CASES: list[tuple[str, Callable[[Path, Path], Path], str]] = [
    ("state-list", lambda a, d: rebuild(a, d, replace("state.json", b"[1, 2]")), "state.json"),
    ("state-repeat-key-word", lambda a, d: rebuild(a, d, replace("state.json", json.dumps(
        {"cells": {"1n1g-fp32-bs256": {"repeats": {"one": {"status": "done"}}}}}).encode())), "state.json"),
    ("state-deep", lambda a, d: rebuild(a, d, replace("state.json", DEEP)), "state.json"),
    ("state-not-json", lambda a, d: rebuild(a, d, replace("state.json", b"{oops")), "state.json"),
    ("provenance-deep", lambda a, d: rebuild(a, d, replace("provenance.json", DEEP)), "provenance.json"),
    ("provenance-list", lambda a, d: rebuild(a, d, replace("provenance.json", b"[]")), "provenance.json"),
    ("provenance-string", lambda a, d: rebuild(a, d, replace("provenance.json", b'"x"')), "provenance.json"),
    ("provenance-nan", lambda a, d: rebuild(a, d, replace("provenance.json", b'{"schema_version": NaN}')),
     "provenance.json"),
    ("intoto-list", lambda a, d: rebuild(a, d, replace("provenance.intoto.json", b"[]")), "provenance.intoto.json"),
    ("report-json-deep", lambda a, d: rebuild(a, d, replace("report.json", DEEP)), "report.json"),
    ("manifest-alias-bomb", lambda a, d: rebuild(a, d, replace("manifest.yaml", BOMB.encode())), "manifest.yaml"),
    ("hosts-alias-bomb", lambda a, d: rebuild(a, d, replace("hosts.yaml", BOMB.encode())), "hosts.yaml"),
    ("state-missing", lambda a, d: rebuild(a, d, drop("state.json")), "no state.json"),
    ("manifest-missing", lambda a, d: rebuild(a, d, drop("manifest.yaml")), "no manifest.yaml"),
    ("member-dotdot", lambda a, d: rebuild(a, d, keep, add("../evil.txt", data=b"x")), "evil.txt"),
    ("member-absolute", lambda a, d: rebuild(a, d, keep, add("/tmp/evil.txt", data=b"x", under_top=False)),
     "/tmp/evil.txt"),
    ("member-symlink", lambda a, d: rebuild(a, d, keep, add("link", tarfile.SYMTYPE, linkname="/etc/passwd")), "link"),
    ("member-hardlink", lambda a, d: rebuild(a, d, keep, add("hard", tarfile.LNKTYPE, linkname="/etc/passwd")), "hard"),
    ("member-fifo", lambda a, d: rebuild(a, d, keep, add("pipe", tarfile.FIFOTYPE)), "pipe"),
    ("member-chardev", lambda a, d: rebuild(a, d, keep, add("zero", tarfile.CHRTYPE)), "zero"),
    ("member-second-top", lambda a, d: rebuild(a, d, keep, add("other/x.txt", data=b"x", under_top=False)),
     "other/x.txt"),
    ("member-twice", lambda a, d: rebuild(a, d, keep, add("state.json", data=b"{}")), "state.json"),
    ("gzip-no-trailer", lambda a, d: write(d.parent, d.name, a.read_bytes()[:-8]), "r.tar.gz"),
    ("gzip-cut-half", lambda a, d: write(d.parent, d.name, a.read_bytes()[: a.stat().st_size // 2]), "r.tar.gz"),
    ("gzip-crc-flipped", lambda a, d: write(d.parent, d.name, a.read_bytes()[:-8] + b"\0\0\0\0"
                                            + a.read_bytes()[-4:]), "r.tar.gz"),
    ("gzip-byte-flipped", lambda a, d: write(d.parent, d.name, flip(a.read_bytes())), "r.tar.gz"),
    ("trailing-garbage", lambda a, d: write(d.parent, d.name, a.read_bytes() + b"garbage!" * 4), "r.tar.gz"),
    ("not-gzip", lambda a, d: write(d.parent, d.name, b"just text\n"), "r.tar.gz"),
    ("empty-gzip", lambda a, d: write(d.parent, d.name, gzip.compress(b"")), "r.tar.gz"),
    ("empty-tar", lambda a, d: write(d.parent, d.name, gzip.compress(b"\0" * 10240)), "r.tar.gz"),
    ("gzip-bomb", lambda a, d: write(d.parent, d.name, bomb_tar()), "r.tar.gz"),
    ("checksum-mismatch", lambda a, d: with_sum(write(d.parent, d.name, a.read_bytes()), "0" * 64), "r.tar.gz"),
    ("member-deep-sealed", lambda a, d: sealed(rebuild(a, d, keep, add("a/" * 40 + "x.log", data=b"x"))),
     "a/a/a"),
    ("checksum-garbage", lambda a, d: with_sum(write(d.parent, d.name, a.read_bytes()), "not a sum"), "r.tar.gz.sha256"),
]


def flip(b: bytes) -> bytes:
    i = len(b) // 2
    return b[:i] + bytes([b[i] ^ 0xFF]) + b[i + 1:]


def bomb_tar() -> bytes:
    """A small .tar.gz whose one member unpacks to 64 MiB of zeros."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        info = tarfile.TarInfo("20260101T000000Z-x-abcdef/cells/zeros.log")
        info.size = 64 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    return raw.getvalue()


def sealed(archive: Path) -> Path:
    """The archive with a checksum file that matches it, as `repro up` writes one."""
    from repro.digest import sha256_file

    return with_sum(archive, sha256_file(archive))


def with_sum(archive: Path, digest: str) -> Path:
    archive.with_name(archive.name + ".sha256").write_text(f"{digest}  {archive.name}\n")
    return archive


@pytest.mark.parametrize("case,make,member", ARCHIVE_CASES, ids=[c[0] for c in ARCHIVE_CASES])
def test_hostile_archive(sealed_archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, make: Callable[[Path, Path], Path],
                         member: str) -> None:
    archive = make(sealed_archive, tmp_path / "r.tar.gz")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    check(["audit", str(archive)], 6, member)
    assert not list(scratch.iterdir()), "the unpacked copy was left behind"
    run_cli(["report", str(archive)])  # re-derives tables (no integrity verdict): ends in time, no traceback
    assert not list(scratch.iterdir())


def test_run_directory_with_a_fifo_is_refused_at_once(sealed_archive: Path, tmp_path: Path) -> None:
    with tarfile.open(sealed_archive) as tar:
        tar.extractall(tmp_path, filter="data")
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    (run / "provenance.json").unlink()
    os.mkfifo(run / "provenance.json")
    check(["audit", str(run)], 6, "provenance.json", "not a regular file")


def test_sigterm_while_an_archive_is_unpacked_removes_the_copy(sealed_archive: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.record.archive import opened_run

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        with opened_run(sealed_archive) as run:
            assert run.path.is_relative_to(tmp_path) and (run.path / "state.json").is_file()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives before this ends
    assert stopped.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == before
