"""Docstrings and comments name today's modules: every dotted ``repro.x.y`` name and every ``repro/<stage>/<module>.py`` path
in a docstring or comment of the package, the scripts and the tests resolves to a module, a package (or its
data folder), or a name a module defines at its top level.

Placeholders of one letter (``repro.x``) are not names. Container labels (``repro.run``, ``repro.rdma``...) read like module names; the kit spells them as string
literals in its code, and a name the code spells that way is a label, not a module reference. The list below
names stale references still to be fixed by their owner's change; an entry that is no longer found fails too,
so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\brepro(?:\.[A-Za-z_][A-Za-z0-9_]+)+|\brepro/[A-Za-z0-9_/]+\.py\b")
LABEL = re.compile(r"^repro(?:\.[a-z_]+)+$")
#: (file, name): stale references in files another change is moving (issue #34, item 1: repro/up/)
PENDING: set[tuple[str, str]] = set()


def sources() -> list[Path]:
    return sorted([*ROOT.glob("repro/**/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("tests/*.py")])


def prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module's source."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


@functools.cache
def top_level_names(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def resolves(name: str) -> bool:
    if "/" in name:
        return (ROOT / name).is_file()
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file() or base.is_dir():
            if i == len(parts):
                return True
            return module.is_file() and parts[i] in top_level_names(module)  # a name, or a class's member
    return False


@functools.cache
def labels() -> frozenset[str]:
    """Every ``repro.x`` the kit's code spells as a string literal outside docstrings (labels, keys)."""
    found = set()
    for path in ROOT.glob("repro/**/*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(n, clean=False) is not None}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                found |= {m for m in re.findall(r"repro(?:\.[a-z_]+)+", node.value) if LABEL.match(m)}
    return frozenset(found)


def stale_names() -> set[tuple[str, str]]:
    out = set()
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        for _, text in prose(path.read_text(encoding="utf-8")):
            for name in NAME.findall(text):
                if not name.startswith("repro.invalid") and name not in labels() and not resolves(name):
                    out.add((rel, name))
    return out


def test_docstrings_and_comments_name_modules_that_exist() -> None:
    assert stale_names() - PENDING == set()


def test_pending_list_only_shrinks() -> None:
    assert PENDING - stale_names() == set()


@pytest.mark.parametrize("name, exists", [
    ("repro.run.rundir", True), ("repro.run.rundir.RunDir", True), ("repro/run/rundir.py", True),
    ("repro.verdict.rules.INTERVAL", True), ("repro.spec.schemas", True),
    ("repro.rundir", False), ("repro.run.rundir.NoSuchName", False), ("repro/rundir.py", False),
    ("repro.verdict.INTERVAL", False), ("repro.run.rundir.RunDir.file", True),
])
def test_a_name_resolves_only_when_it_exists(name: str, exists: bool) -> None:
    assert resolves(name) is exists
