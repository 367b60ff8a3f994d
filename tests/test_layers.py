"""The package is a house by pipeline stage, with rooms that keep their insides to themselves.

The rules, which ``check(root)`` holds a package tree to:

1. **Every import points down a stage.** Stages, lowest first: the base modules (errors, events, paths,
   digest, redact, registry, labels, throwaway, tree, fit, fastyaml, layout, and any new flat module), ``spec``,
   ``nodes`` (below ``images``: images reach the nodes' engines through the SSH transport), ``images``,
   ``run``, ``measure``, ``verdict``, ``record``, then the top (``cli``, ``up``, ``progress``,
   ``__main__``, and anything inside them). A module may import its own stage or a lower one. The one
   declared exception is ``ALLOWED_UP``.
2. **A package's private modules are imported only from within it.** A *stage* (``repro.spec``,
   ``repro.run``, ...) is a floor of public modules: the stages above import ``repro.spec.manifest``
   directly. A *subpackage* (a package inside a stage: ``repro.run.launchers``, ``repro.run.schedulers``,
   ``repro.run.schedulers.slurm``, ``repro.measure.parsers``) is one room with one door, its
   ``__init__``: every module in it (a nested subpackage included) is private to it, so a module outside
   it imports what its ``__init__`` exports (``from repro.run.launchers import LAUNCHERS``), never
   ``repro.run.launchers.mpi``. In any package, a module whose name begins with ``_`` is private to that
   package, and a name that begins with ``_`` is private to its module (dunders such as ``__version__``
   are not). The reach-ins that still stand are named in ``REACH_INS``.
3. **No import closes a circle.** Importing ``P.m`` from outside ``P`` runs ``P/__init__`` first, so it
   counts as importing ``P`` too.

What counts as an import: ``import`` and ``from ... import`` anywhere in a module (inside functions, and
type-only ones under ``if TYPE_CHECKING:``: a type a module names is a dependency on the module that
defines it, and an upward or circular import hidden there still shapes what a reader must know), relative
imports resolved against the importing module's package (ruff's TID252 also bans them), ``from P import x``
as an import of module ``P.x`` where that is a module, attribute reach-ins through an imported module
(``repro.run.schedulers.slurm.jobfiles.X`` after ``import repro.run``), ``importlib.import_module`` and
``__import__`` (by any alias, relative ones with a literal or ``__package__``/``__name__`` anchor, and
``fromlist``) of a literal name, of a name with a literal prefix (``f"repro.cli.{verb}"`` imports every
module under ``repro.cli``), and a ``Registry``'s list of its built-in plugin modules. A plugin list counts
for rules 1 and 2 but not for circles: a plugin registers itself with the registry that lists it, a circle
by design, closed lazily when the registry is first asked. A dynamic import whose name the source does not
spell out (a variable, a plugin list not written in the ``Registry`` call) is itself a breach, except where
``UNRESOLVED_OK`` says where the names come from. The check reads the source and runs nothing, so what
only running shows (``exec``, a loader reached through ``getattr``) is beyond it and left to review.
``tests/test_layers_meta.py`` plants each kind of breach in a copy of the package and proves it is caught,
and each kind of allowed import passes. Allow-list entries that no longer match a breach fail too, so the
lists only shrink.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent / "repro"
STAGES = ["base", "spec", "nodes", "images", "run", "measure", "verdict", "record", "top"]
TOP = {"repro.cli", "repro.up", "repro.progress", "repro.__main__"}
#: the one deliberate exception: a manifest names its parser, and loading it checks that parser exists
ALLOWED_UP = {("repro.spec.manifest", "repro.measure.parsers")}
#: dynamic imports of names the module's source does not spell out, and where those names come from
UNRESOLVED_OK = {"repro.registry": "the modules a Registry lists; each list is read where it is written"}
#: Reach-ins into a room's private modules that still stand, each with what it takes and where that should
#: come from: the lifecycle's reading of a detached job (only Slurm detaches), and the launchers' names the
#: containers and steps need. The mpi launcher's names need a module beside launchers/base.py that the face can
#: export (mpi.py registers itself through the face, so the face cannot import mpi.py without closing a circle).
SLURM, LAUNCHERS = "repro.run.schedulers.slurm", "repro.run.launchers"
REACH_INS: dict[tuple[str, str], str] = {
    ("repro.up.attached", SLURM): "is_detached: only Slurm detaches; the Scheduler interface does not say yet",
    ("repro.up.detached", SLURM): "a detached job's files, read back through the Slurm package's face",
    ("repro.run.launch", f"{LAUNCHERS}.base"): "IB_DEVICE_DIR, rdma_container_options: the face exports them",
    ("repro.run.launch", f"{LAUNCHERS}.mpi"): "SESSION_ENV, session_environment, DEFAULT_SSH_PORT",
    ("repro.run.cell", f"{LAUNCHERS}.mpi"): "MPI_DIR",
    (f"{SLURM}.apptainer", f"{LAUNCHERS}.base"): "fill, which repro.run.launchers exports",
    (f"{SLURM}.render", f"{LAUNCHERS}.base"): "fill, which repro.run.launchers exports",
    (f"{SLURM}.steps", f"{LAUNCHERS}.base"): "fill, which repro.run.launchers exports",
    (f"{SLURM}.detached", f"{LAUNCHERS}.mpi"): "DEFAULT_SSH_PORT",
    (f"{SLURM}.dockerstep", f"{LAUNCHERS}.mpi"): "DEFAULT_SSH_PORT",
}
LOADERS = {"import_module", "__import__"}


@dataclass(frozen=True, order=True)
class Edge:
    """One import: who, of what, on which line, how it was written; a lazy one does not close circles."""

    importer: str
    target: str
    line: int
    how: str
    lazy: bool = False


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` (a directory holding ``__init__.py``) by its dotted name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def stage(module: str) -> str:
    if any(within(module, t) for t in TOP):
        return "top"
    part = module.split(".")[1] if module.count(".") else "base"
    return part if part in STAGES else "base"


def private_to(module: str) -> str | None:
    """The package that ``module`` is private to (rule 2), or None where every module may import it."""
    package, _, leaf = module.rpartition(".")
    if leaf.startswith("_") and not leaf.startswith("__") or len(package.split(".")) >= 3:
        return package
    return None


def literal_prefix(node: ast.expr) -> tuple[str, bool]:
    """The text a string expression starts with, and whether that is all of it."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, True
    if isinstance(node, ast.JoinedStr):
        text, whole = "", True
        for part in node.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                return text, False
            text += part.value
        return text, whole
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, whole = literal_prefix(node.left)
        if not whole:
            return left, False
        right, whole = literal_prefix(node.right)
        return left + right, whole
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return literal_prefix(node.left)[0].partition("%")[0], False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return literal_prefix(node.func.value)[0].partition("{")[0], False
    return "", False


@dataclass(frozen=True)
class Ref:
    """An import as written: the dotted name it reaches for, before the package's modules are known.

    ``name`` resolves to its longest prefix that is a module (``from P import x``: ``P.x`` where that is a
    module, else ``P``); an ``attribute`` reach-in counts where that goes deeper than the name it starts from
    (``base``); a ``pattern`` stands for every module under the package ``name``; a ``private`` one names
    a ``_name`` that must not be imported unless it is a module.
    """

    name: str
    line: int
    how: str
    lazy: bool = False
    base: str | None = None
    pattern: bool = False
    private: bool = False


class Imports:
    """What one module imports (as ``Ref``s) and the breaches its source shows by itself."""

    def __init__(self, me: str, is_package: bool, text: str) -> None:
        self.me = me
        self.package = me if is_package else me.rpartition(".")[0]
        self.root = me.split(".")[0]
        self.refs: list[Ref] = []
        self.problems: list[str] = []
        self.unread: list[int] = []  # lines of dynamic imports whose names the source does not spell out
        self.bound: dict[str, str] = {}  # a local name -> the dotted name of the package it stands for
        self.loaders = set(LOADERS)
        nodes = list(ast.walk(ast.parse(text)))
        for node in nodes:  # the imports first: they bind the names that calls and attributes use
            if isinstance(node, ast.Import):
                self.plain(node)
            elif isinstance(node, ast.ImportFrom):
                self.from_(node)
        for node in nodes:
            if isinstance(node, ast.Call):
                self.call(node)
            elif isinstance(node, ast.Attribute):
                self.attribute(node)

    def ours(self, name: str) -> bool:
        return within(name, self.root)

    def add(self, name: str, node: ast.AST, how: str, **kw: Any) -> None:
        self.refs.append(Ref(name, getattr(node, "lineno", 0), how, **kw))

    def absolute(self, name: str, level: int, node: ast.AST, anchor: str | None = None) -> str | None:
        """A relative name made absolute against the package (or ``anchor``); None above the root."""
        if level == 0:
            return name
        parts = (anchor or self.package).split(".")
        if level - 1 >= len(parts):
            self.problems.append(f"{self.me}:{getattr(node, 'lineno', 0)} relative import of {'.' * level}"
                                 f"{name} reaches above the package")
            return None
        return ".".join(parts[:len(parts) - level + 1] + ([name] if name else []))

    def plain(self, node: ast.Import) -> None:
        for alias in node.names:
            if self.ours(alias.name):
                self.add(alias.name, node, "import")
                self.bound[alias.asname or self.root] = alias.name if alias.asname else self.root

    def from_(self, node: ast.ImportFrom) -> None:
        module = self.absolute(node.module or "", node.level, node)
        how = "relative import" if node.level else "from-import"
        if module == "importlib":
            self.loaders |= {a.asname or a.name for a in node.names if a.name == "import_module"}
        if module is None or not self.ours(module):
            return
        for alias in node.names:
            name = module if alias.name == "*" else f"{module}.{alias.name}"
            self.add(name, node, how, private=alias.name.startswith("_") and not alias.name.startswith("__"))
            self.bound[alias.asname or alias.name] = name

    def attribute(self, node: ast.Attribute) -> None:
        chain: list[str] = []
        value: ast.expr = node
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.bound:
            base = self.bound[value.id]
            self.add(".".join([base, *chain]), node, "attribute", base=base)

    def call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Subscript):  # Registry[LogParser](...)
            func = func.value
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name == "Registry":
            listed = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "builtin_modules"), ast.List(elts=[]))
            names = [literal_prefix(e) for e in getattr(listed, "elts", [None])]
            if not all(whole for _, whole in names):
                self.unread.append(node.lineno)
            for text in (text for text, whole in names if whole and self.ours(text)):
                self.add(text, node, "Registry list", lazy=True)
        elif name in self.loaders and node.args:
            self.dynamic(node, name)

    def dynamic(self, node: ast.Call, name: str) -> None:
        """``import_module(name, package)`` or ``__import__(name, globals, locals, fromlist, level)``."""
        args = {**dict(enumerate(node.args)), **{k.arg: k.value for k in node.keywords if k.arg}}
        text, whole = literal_prefix(args[0])
        how = f"{name}()"
        if not whole:
            self.pattern(text, node, how)
            return
        if name == "__import__":
            level = args.get(4, args.get("level"))
            level = level.value if isinstance(level, ast.Constant) and isinstance(level.value, int) else 0
            anchor = None
        else:
            level = len(text) - len(text.lstrip("."))
            text = text[level:]
            anchor = self.anchor(args.get(1, args.get("package")))
        module = self.absolute(text, level, node, anchor)
        if module is None or not self.ours(module):
            return
        self.add(module, node, how)
        for item in getattr(args.get(3, args.get("fromlist")), "elts", []):
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                self.add(f"{module}.{item.value}", node, how)

    def anchor(self, node: ast.expr | None) -> str | None:
        if isinstance(node, ast.Name) and node.id in ("__package__", "__name__"):
            return self.package if node.id == "__package__" else self.me
        return literal_prefix(node)[0] if node is not None else None

    def pattern(self, prefix: str, node: ast.Call, how: str) -> None:
        """A name built at run time: with a literal prefix ``P.``, every module under ``P``; else a breach."""
        if self.ours(prefix) and "." in prefix:
            self.add(prefix.rpartition(".")[0], node, f"{how} of {prefix!r}...", pattern=True)
        elif (self.root + ".").startswith(prefix) or self.ours(prefix):
            self.unread.append(node.lineno)


@functools.cache
def read_module(me: str, is_package: bool,
                text: str) -> tuple[tuple[Ref, ...], tuple[str, ...], tuple[int, ...]]:
    """One module's imports, breaches and unread dynamic imports, read once per text (the meta-test's copies
    read only what changed)."""
    imports = Imports(me, is_package, text)
    return tuple(imports.refs), tuple(imports.problems), tuple(imports.unread)


def deepest(name: str, known: frozenset[str]) -> str:
    """The longest prefix of ``name`` that is a module (``repro.x.Y`` names module ``repro.x``)."""
    parts = name.split(".")
    while len(parts) > 1 and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts)


def resolve(me: str, refs: tuple[Ref, ...], known: frozenset[str]) -> tuple[set[Edge], list[str]]:
    """A module's ``Ref``s as edges to the package's modules, and the private names among them."""
    edges, problems = set(), []
    for ref in refs:
        target = deepest(ref.name, known)
        if ref.private and ref.name not in known:
            problems.append(f"{me}:{ref.line} imports {ref.name}, a name private to {target}")
        if ref.base is not None and target == deepest(ref.base, known):
            continue
        for module in sorted(m for m in known if within(m, target)) if ref.pattern else [target]:
            if module != me:
                edges.add(Edge(me, module, ref.line, ref.how, ref.lazy))
    return edges, problems


def scan(root: Path) -> tuple[dict[str, frozenset[Edge]], list[str], dict[str, tuple[int, ...]]]:
    """Every module's imports, the breaches found while reading them, and where each module imports a name
    its source does not spell out."""
    found = modules(root)
    known = frozenset(found)
    edges: dict[str, frozenset[Edge]] = {}
    problems: list[str] = []
    unread: dict[str, tuple[int, ...]] = {}
    for name, path in found.items():
        text = path.read_text(encoding="utf-8")
        refs, more, unread[name] = read_module(name, path.name == "__init__.py", text)
        mine, private = resolve(name, refs, known)
        edges[name] = frozenset(mine)
        problems += [*more, *private]
    return edges, problems, {name: lines for name, lines in unread.items() if lines}


def upward(edges: Mapping[str, frozenset[Edge]], allowed: set[tuple[str, str]]) -> tuple[list[str], set]:
    """Rule 1's breaches, and the allowed exceptions that were used."""
    out, used = [], set()
    for edge in sorted(e for es in edges.values() for e in es):
        if STAGES.index(stage(edge.target)) <= STAGES.index(stage(edge.importer)):
            continue
        hit = {(a, b) for a, b in allowed if edge.importer == a and within(edge.target, b)}
        used |= hit
        if not hit:
            out.append(f"{edge.importer}:{edge.line} ({stage(edge.importer)}) imports {edge.target} "
                       f"({stage(edge.target)}) by {edge.how}: upward")
    return out, used


def reach_ins(edges: Mapping[str, frozenset[Edge]],
              allowed: Mapping[tuple[str, str], str]) -> tuple[list[str], set]:
    """Rule 2's breaches (a private module imported from outside its package), and the allowed ones used."""
    out, used = [], set()
    for edge in sorted(e for es in edges.values() for e in es):
        owner = private_to(edge.target)
        if owner is None or within(edge.importer, owner):
            continue
        if (edge.importer, edge.target) in allowed:
            used.add((edge.importer, edge.target))
        else:
            out.append(f"{edge.importer}:{edge.line} imports {edge.target} by {edge.how}: private to {owner} "
                       f"(import what {owner}'s __init__ exports)")
    return out, used


def circles(edges: Mapping[str, frozenset[Edge]]) -> list[str]:
    """Rule 3's breaches: each circle a depth-first walk closes (``P.m`` from outside ``P`` imports ``P``)."""
    graph: dict[str, set[str]] = {name: set() for name in edges}
    for edge in (e for es in edges.values() for e in es if not e.lazy):
        parts = edge.target.split(".")
        graph[edge.importer] |= {p for p in (".".join(parts[:n]) for n in range(2, len(parts) + 1))
                                 if p in graph and not within(edge.importer, p)} | {edge.target}
    found: list[str] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if dep not in graph or dep == node:
                continue
            if state.get(dep) == "open":
                ring = path[path.index(dep):]
                first = ring.index(min(ring))  # each circle told from its first module by name
                found.append("circle: " + " -> ".join(ring[first:] + ring[:first] + [ring[first]]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def check(root: Path, *, allowed_up: set[tuple[str, str]] = ALLOWED_UP,
          allowed_reach_ins: Mapping[tuple[str, str], str] = REACH_INS,
          unresolved_ok: Mapping[str, str] = UNRESOLVED_OK) -> list[str]:
    """Every breach of the rules above in the package at ``root`` (a directory named ``repro`` holding
    ``__init__.py``: the real one or a copy), and each allow-list entry that matches no breach."""
    edges, problems, unread = scan(root)
    problems += [f"{name}:{line} imports a name the source does not spell out (write it as a literal, or say "
                 f"where it comes from in UNRESOLVED_OK)"
                 for name, lines in unread.items() if name not in unresolved_ok for line in lines]
    up, used_up = upward(edges, allowed_up)
    reach, used_reach = reach_ins(edges, allowed_reach_ins)
    stale = [f"ALLOWED_UP names {a} -> {b}, which no longer happens" for a, b in sorted(allowed_up - used_up)]
    stale += [f"REACH_INS names {a} -> {b}, which no longer happens: delete the entry"
              for a, b in sorted(set(allowed_reach_ins) - used_reach)]
    stale += [f"UNRESOLVED_OK names {m}, which no longer imports a name it does not spell out"
              for m in sorted(set(unresolved_ok) - set(unread))]
    return problems + up + reach + circles(edges) + stale


def test_the_package_keeps_every_rule() -> None:
    assert check(PACKAGE) == []
