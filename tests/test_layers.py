"""The package is a house by pipeline stage: every import points down a stage, and no import closes a circle.

Stages, lowest first: the base modules (errors, events, paths, digest, redact, registry, labels, throwaway),
``spec``, ``nodes`` (below ``images``: images reach the nodes' engines through the SSH transport), ``images``,
``run``, ``measure``, ``verdict``, ``record``, then the top (``cli``, ``up``, ``progress``). A module may
import its own stage or a lower one; function-level and type-checking imports count the same.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "repro"
STAGES = ["base", "spec", "nodes", "images", "run", "measure", "verdict", "record", "top"]
TOP = {"repro.cli", "repro.up", "repro.progress", "repro.__main__"}
#: the one deliberate exception: a manifest names its parser, and loading it checks that parser exists
ALLOWED_UP = {("repro.spec.manifest", "repro.measure.parsers")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage(module: str) -> str:
    if module in TOP or module.startswith(("repro.cli.", "repro.up.")):
        return "top"
    part = module.split(".")[1] if module.count(".") else "base"
    return part if part in STAGES else "base"


@functools.cache
def tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the tests here."""
    return ast.parse(path.read_text(encoding="utf-8"))


def imports(path: Path) -> set[str]:
    """Every repro module ``path`` imports, wherever the import statement stands."""
    found = set()
    me = module_name(path)
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("repro")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("repro"):
            for a in node.names:  # `from repro.x import y` names module repro.x.y where that is a module
                sub = f"{node.module}.{a.name}"
                found.add(sub if _is_module(sub) else node.module)
    found.discard(me)
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_import_points_down_a_stage() -> None:
    up = []
    for mod, deps in sorted(graph().items()):
        for dep in sorted(deps):
            if STAGES.index(stage(dep)) > STAGES.index(stage(mod)) and not any(
                    mod == a and (dep == b or dep.startswith(b + ".")) for a, b in ALLOWED_UP):
                up.append(f"{mod} ({stage(mod)}) imports {dep} ({stage(dep)})")
    assert up == []


def test_no_import_cycle() -> None:
    g = graph()
    cycles: list[str] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(g.get(node, ())):
            if dep not in g or dep == node:
                continue
            if state.get(dep) == "open":
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for mod in sorted(g):
        if mod not in state:
            visit(mod, [mod])
    assert cycles == []


def test_no_module_imports_another_modules_private_name() -> None:
    private = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("repro"):
                private += [f"{module_name(path)}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and a.name != "__version__"]
    assert private == []
