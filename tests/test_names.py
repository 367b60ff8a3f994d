"""One name per concept: no two modules of the package define a class or a type alias of the same name (three
``Event``\\ s, two ``NodeResult``\\ s and two ``Probe``\\ s made a reader ask which one a signature meant).

The list below names what is still being renamed, each by its owner's change; an entry no longer needed fails
too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "repro"
#: name -> why it is still defined twice
PENDING: dict[str, str] = {}


def _alias(node: ast.stmt) -> str | None:
    """The name a module-level ``Name = <type expression>`` defines (a CamelCase name given a type)."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    if (isinstance(target, ast.Name) and target.id[:1].isupper() and not target.id.isupper()
            and isinstance(value, (ast.Subscript, ast.Name, ast.BinOp, ast.Attribute))):
        return target.id
    return None


def definitions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            name = node.name if isinstance(node, ast.ClassDef) else _alias(node)
            if name:
                where[name].append(rel)
    return where


def test_no_two_modules_define_the_same_type_name() -> None:
    twice = {name: mods for name, mods in definitions().items() if len(mods) > 1}
    assert {n: m for n, m in twice.items() if n not in PENDING} == {}


def test_pending_list_only_shrinks() -> None:
    twice = {name for name, mods in definitions().items() if len(mods) > 1}
    assert set(PENDING) - twice == set()
