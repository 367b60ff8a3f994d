"""The bad-input corpus: every file in tests/data/bad/ must be rejected by the real CLI with
exit code 2, no traceback, and exactly the located messages its header declares.

Each corpus file starts with a comment block:

    # <what the mistake is>
    # expect: <name>.yaml:<line>: <field>: <message>     <- one error line of stderr
    # expect: <any other substring, e.g. of a hint>      <- must appear somewhere in stderr

An ``expect`` that starts with ``<file>.yaml:`` declares one ``error:`` line; the file must
produce exactly as many error lines as it declares (one mistake, one clear message). A
subdirectory is one case whose files are validated together (e.g. a duplicate id across files).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
BAD = DATA / "bad"
GOOD = DATA / "good"

#: Messages about a whole document or a whole mapping that carry no field name.
DOC_LEVEL = ("invalid YAML: ", "expected a mapping at the top level", "missing required key ")
FIELD = r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*|\[\d+\])*"
ERROR_LINE = re.compile(r"^error: (?P<file>\S+?\.ya?ml)(?::(?P<line>\d+))?: (?P<rest>.+)$")
LOCATED = re.compile(r"^[\w.@/-]+\.ya?ml(?::\d+)?: ")

#: Corpus cases the kit gets wrong today (see the reasons); strict, so they fail once fixed.
KNOWN_BUGS: dict[str, str] = {}


def rel(p: Path) -> str:
    return os.path.relpath(p, REPO)


def run_validate(*files: Path | str) -> subprocess.CompletedProcess[str]:
    return run_cli("validate", *map(str, files), cwd=REPO)


def header(path: Path) -> list[str]:
    """The leading comment lines of a corpus file."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        out.append(line)
    return out


def expects(path: Path) -> list[str]:
    return [ln.removeprefix("# expect:").strip() for ln in header(path) if ln.startswith("# expect:")]


def case_files(case: Path) -> list[Path]:
    return sorted(case.glob("*.yaml")) if case.is_dir() else [case]


def cases() -> list[Path]:
    return sorted(p for p in BAD.iterdir() if p.suffix == ".yaml" or p.is_dir())


def case_id(case: Path) -> str:
    return case.stem if case.is_file() else case.name + "/"


def params():
    for case in cases():
        name = case.stem if case.is_file() else case.name
        marks = [pytest.mark.xfail(reason=KNOWN_BUGS[name], strict=True)] if name in KNOWN_BUGS else []
        yield pytest.param(case, id=case_id(case), marks=marks)


def has_content(path: Path) -> bool:
    return any(ln.strip() and not ln.lstrip().startswith("#") for ln in path.read_text(encoding="utf-8").splitlines())


def check_error_lines(stderr: str, files: list[Path]) -> list[re.Match[str]]:
    """Every stderr line is an error or a hint; every error has the located shape."""
    names = {rel(f): f for f in files}
    errors = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        assert line.startswith(("error: ", "  hint: ")), f"stray stderr line: {line!r}"
        if line.startswith("  hint: "):
            continue
        m = ERROR_LINE.match(line)
        assert m, f"error line without the 'error: <file>[:<line>]: ...' shape: {line!r}"
        assert m["file"] in names, f"error names {m['file']!r}, not one of the inputs {sorted(names)}"
        path = names[m["file"]]
        if has_content(path):
            assert m["line"], f"no line number although {m['file']} has content: {line!r}"
            assert 1 <= int(m["line"]) <= len(path.read_text(encoding="utf-8").splitlines()), line
        rest = m["rest"]
        assert re.match(rf"{FIELD}: \S", rest) or rest.startswith(DOC_LEVEL), \
            f"error without a '<field>: <message>' part: {line!r}"
        errors.append(m)
    return errors


# --- the corpus --------------------------------------------------------------------------------------


def test_corpus_is_complete() -> None:
    all_cases = cases()
    assert len(all_cases) >= 35
    for case in all_cases:
        assert any(expects(f) for f in case_files(case)), f"{rel(case)} declares no '# expect:'"
        for f in case_files(case):
            assert header(f), f"{rel(f)} has no leading comment saying what is wrong"
    assert (BAD / "dup-id").is_dir() and len(case_files(BAD / "dup-id")) == 2


@pytest.mark.parametrize("case", list(params()))
def test_bad_file_is_rejected_with_its_message(case: Path) -> None:
    files = case_files(case)
    proc = run_validate(*(rel(f) for f in files))
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "", "nothing is reported as ok when the input is bad"
    errors = check_error_lines(proc.stderr, files)
    wanted = [e for f in files for e in expects(f)]
    for e in wanted:
        assert e in proc.stderr, f"expected {e!r} in stderr:\n{proc.stderr}"
    located = [e for e in wanted if LOCATED.match(e)]
    for e in located:
        assert any(e in m.group(0) for m in errors), f"{e!r} is not part of an error line:\n{proc.stderr}"
    assert len(errors) == len(located), f"expected {len(located)} error line(s):\n{proc.stderr}"


@pytest.mark.parametrize("name", ["multi-schema-3", "multi-meaning-3"])
def test_all_problems_of_a_file_are_reported_at_once(name: str) -> None:
    f = BAD / f"{name}.yaml"
    proc = run_validate(rel(f))
    assert proc.returncode == 2
    errors = check_error_lines(proc.stderr, [f])
    assert len(errors) == 3, proc.stderr
    assert len({m["line"] for m in errors}) == 3, "three different places"


def test_problems_of_several_files_are_reported_together() -> None:
    files = [BAD / "unknown-parser.yaml", BAD / "hosts-unknown-key-node.yaml", BAD / "schema-version-2.yaml"]
    proc = run_validate(*(rel(f) for f in files))
    assert proc.returncode == 2
    errors = check_error_lines(proc.stderr, files)
    assert sorted(Path(m["file"]).name for m in errors) == sorted(f.name for f in files)


def test_a_yaml_syntax_error_does_not_hide_other_files_problems() -> None:
    files = [BAD / "yaml-tab-indent.yaml", BAD / "unknown-parser.yaml", BAD / "hosts-unknown-key-node.yaml"]
    proc = run_validate(*(rel(f) for f in files))
    assert proc.returncode == 2
    errors = check_error_lines(proc.stderr, files)
    assert sorted(Path(m["file"]).name for m in errors) == sorted(f.name for f in files)


def test_unbalanced_brace_is_called_an_unbalanced_brace() -> None:
    proc = run_validate(rel(BAD / "command-unbalanced-brace.yaml"))
    assert proc.returncode == 2
    assert "{{}" not in proc.stderr
    assert "brace" in proc.stderr.lower()


def test_unclosed_quote_error_names_the_line_where_the_quote_opened(tmp_path: Path) -> None:
    f = tmp_path / "unclosed.yaml"
    f.write_text("schema_version: 1\nid: x\ntitle: \"Perf 2.5 NGC PyTorch\nframework: pytorch\nmodel: resnet50\n")
    proc = run_cli("validate", str(f), cwd=REPO)
    assert proc.returncode == 2
    assert re.search(r":3: |line 3\b", proc.stderr), proc.stderr
    corpus = run_validate(rel(BAD / "yaml-unclosed-quote.yaml"))  # the quote opens in the cell on line 44
    assert re.search(r":44: |line 44\b", corpus.stderr), corpus.stderr


def test_missing_file_is_a_usage_error() -> None:
    proc = run_validate("tests/data/bad/no-such-manifest.yaml")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: tests/data/bad/no-such-manifest.yaml: no such file")
    assert "Traceback" not in proc.stderr


# --- the good files the corpus derives from -------------------------------------------------------------


def test_minimal_manifest_validates() -> None:
    proc = run_validate(rel(GOOD / "minimal.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok tests/data/good/minimal.yaml (test-minimal-ngc-pytorch)\n"
    assert proc.stderr == ""


def test_every_good_file_validates() -> None:
    files = sorted(GOOD.glob("*.yaml"))
    proc = run_validate(*(rel(f) for f in files))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(
        ln for ln in proc.stdout.splitlines() if ln.startswith("ok tests/data/good/"))
    assert len(proc.stdout.splitlines()) == len(files)


def test_each_dup_id_file_is_valid_alone() -> None:
    for f in case_files(BAD / "dup-id"):
        proc = run_validate(rel(f))
        assert proc.returncode == 0, proc.stderr
