"""``test_layers``'s check cannot be fooled: each kind of forbidden import, planted in a copy of the package,
is caught, and each kind of allowed one passes.

A plant is text appended to one module of a fresh copy of ``repro/`` (its ``.py`` files only), or a new
module; ``check`` then runs on the copy. The check reads source and runs nothing, so a plant need not be
importable. Only what a plant changed is parsed again (``read_module`` caches by text): a case takes
milliseconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from test_layers import PACKAGE, REACH_INS, UNRESOLVED_OK, check, stage

TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
TORCH = "run/launchers/torch.py"  # a launcher: the stage ``run``, the room ``repro.run.launchers``
SLURM = "repro.run.schedulers.slurm"


def in_function(*lines: str) -> str:
    return "def planted(name):\n" + "".join(f"    {line}\n" for line in lines)


#: (the kind of breach, {module file: text appended (a new module where none is)}, what the catch says)
FORBIDDEN = [
    ("absolute upward", {"spec/hosts.py": "from repro.cli.common import fail\n"},
     ["repro.spec.hosts:", "imports repro.cli.common", "by from-import: upward"]),
    ("import statement upward", {"nodes/table.py": "import repro.run.plan as plan\n"},
     ["repro.nodes.table:", "(nodes) imports repro.run.plan (run) by import: upward"]),
    ("relative upward", {"spec/hosts.py": "from ..run import plan\n"},
     ["repro.spec.hosts:", "imports repro.run.plan", "by relative import: upward"]),
    ("relative from the root", {"spec/hosts.py": "from .. import up\n"},
     ["repro.spec.hosts:", "(spec) imports repro.up (top)"]),
    ("relative above the package", {"spec/hosts.py": "from ... import elsewhere\n"},
     ["repro.spec.hosts:", "reaches above the package"]),
    ("import_module literal",
     {"nodes/table.py": "import importlib\n" + in_function("return importlib.import_module('repro.record.archive')")},
     ["repro.nodes.table:", "imports repro.record.archive", "by import_module(): upward"]),
    ("import_module imported by name, aliased",
     {"images/refs.py": "from importlib import import_module as load\nPLANTED = load('repro.verdict.rules')\n"},
     ["repro.images.refs:", "imports repro.verdict.rules", "by load(): upward"]),
    ("import_module relative to __package__",
     {TORCH: "import importlib\nPLANTED = importlib.import_module('..schedulers.slurm.jobfiles', __package__)\n"},
     ["repro.run.launchers.torch:", f"imports {SLURM}.jobfiles", f"private to {SLURM} "]),
    ("import_module of an f-string",
     {"nodes/table.py": "import importlib\n" + in_function("return importlib.import_module(f'repro.cli.{name}')")},
     ["repro.nodes.table:", "imports repro.cli.site", "import_module() of 'repro.cli.'...: upward"]),
    ("import_module of a name the source does not spell",
     {"nodes/table.py": "import importlib\n" + in_function("return importlib.import_module(name)")},
     ["repro.nodes.table:", "imports a name the source does not spell out"]),
    ("__import__ literal", {"spec/hosts.py": in_function("return __import__('repro.images.lock')")},
     ["repro.spec.hosts:", "imports repro.images.lock", "by __import__(): upward"]),
    ("__import__ fromlist", {"spec/hosts.py": "PLANTED = __import__('repro.verdict', fromlist=['html'])\n"},
     ["repro.spec.hosts:", "imports repro.verdict.html", "by __import__(): upward"]),
    ("Registry list upward",
     {"nodes/table.py": "from repro.registry import Registry\nPLANTED = Registry('probe', ['repro.verdict.html'])\n"},
     ["repro.nodes.table:", "imports repro.verdict.html", "by Registry list: upward"]),
    ("Registry list not written in the call",
     {"nodes/table.py": "from repro.registry import Registry\nPLANTED = Registry('probe', [*MORE])\n"},
     ["repro.nodes.table:", "imports a name the source does not spell out"]),
    ("type-only upward", {"images/refs.py": TYPE_ONLY + "    from repro.verdict.report import Row\n"},
     ["repro.images.refs:", "imports repro.verdict.report", "upward"]),
    ("inside a function upward", {"images/refs.py": in_function("from repro.run import plan")},
     ["repro.images.refs:", "imports repro.run.plan", "upward"]),
    ("a launcher imports the Slurm package's internals", {TORCH: f"from {SLURM}.steps import CellJob\n"},
     ["repro.run.launchers.torch:", f"imports {SLURM}.steps",
      f"private to {SLURM} (import what {SLURM}'s __init__ exports)"]),
    ("from-import of a private module", {TORCH: f"from {SLURM} import jobfiles\n"},
     ["repro.run.launchers.torch:", f"imports {SLURM}.jobfiles by from-import", "private to"]),
    ("relative import of a private module", {TORCH: "from ..schedulers.slurm import steps\n"},
     ["repro.run.launchers.torch:", f"imports {SLURM}.steps by relative import", "private to"]),
    ("a nested room from outside its parent", {"progress.py": "from repro.run.schedulers import slurm\n"},
     ["repro.progress:", f"imports {SLURM}", "private to repro.run.schedulers "]),
    ("a private module through attributes",
     {TORCH: "import repro.run.schedulers\n" + in_function(f"return {SLURM}.jobfiles.read_job")},
     ["repro.run.launchers.torch:", f"imports {SLURM}.jobfiles by attribute", "private to"]),
    ("a private module through an imported stage",
     {TORCH: "from repro.run import schedulers\nPLANTED = schedulers.slurm.steps.CellJob\n"},
     ["repro.run.launchers.torch:", f"imports {SLURM}.steps by attribute", "private to"]),
    ("an underscore module of another package",
     {"nodes/_wire.py": "", "images/engine.py": "from repro.nodes import _wire\n"},
     ["repro.images.engine:", "imports repro.nodes._wire", "private to repro.nodes "]),
    ("a private name", {"images/engine.py": "from repro.spec.manifest import _planted\n"},
     ["repro.images.engine:", "imports repro.spec.manifest._planted, a name private to repro.spec.manifest"]),
    ("a circle", {"spec/scheduler.py": in_function("from repro.spec import hosts")},
     ["circle: repro.spec.hosts -> repro.spec.scheduler -> repro.spec.hosts"]),
    ("a type-only circle", {"spec/hosts.py": TYPE_ONLY + "    from repro.spec.manifest import Manifest\n"},
     ["circle: repro.spec.hosts -> repro.spec.manifest -> repro.spec.hosts"]),
    ("a circle through a package's __init__",
     {"measure/protocol.py": "from repro.measure.parsers.text import clean_text\n"},
     ["circle: ", "repro.measure.parsers -> repro.measure.protocol -> repro.measure.parsers"]),
]

#: imports the rules allow: each planted alone, the check finds nothing
ALLOWED = [
    ("a private module from within its room", {TORCH: "from repro.run.launchers.mpi import MPI_DIR\n"}),
    ("a nested room's insides from within it",
     {"run/schedulers/slurm/rankfiles.py": f"from {SLURM} import commands\n"}),
    ("a stage's modules from a stage above", {"run/plan.py": "from repro.nodes import preflight\n"}),
    ("a room's face from outside", {"verdict/rules.py": in_function("from repro.measure.parsers import PARSERS")}),
    ("relative downward", {"run/plan.py": "from ..spec import hosts\nfrom .launchers import NodeCommand\n"}),
    ("an underscore module from its own package", {"nodes/_wire.py": "", "nodes/table.py": "from . import _wire\n"}),
    ("import_module downward and of other packages",
     {"run/plan.py": "import importlib\nPLANTED = [importlib.import_module('repro.spec.hosts'), "
                     "importlib.import_module('json'), __import__('os.path')]\n"}),
    ("a dunder name", {"images/refs.py": "from repro import __version__ as planted\n"}),
]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the package's modules (nothing else)."""
    root = tmp_path / "repro"
    shutil.copytree(PACKAGE, root, ignore=lambda where, names: [
        n for n in names if n == "__pycache__" or not (n.endswith(".py") or (Path(where) / n).is_dir())])
    return root


def plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.write_text((path.read_text(encoding="utf-8") + "\n" if path.exists() else "") + text,
                        encoding="utf-8")


def test_the_copy_is_clean_before_anything_is_planted(copy: Path) -> None:
    assert check(copy) == []


@pytest.mark.parametrize("files, expect", [p[1:] for p in FORBIDDEN], ids=[p[0] for p in FORBIDDEN])
def test_each_forbidden_import_is_caught(copy: Path, files: dict[str, str], expect: list[str]) -> None:
    plant(copy, files)
    found = check(copy)
    assert any(all(part in problem for part in expect) for problem in found), found


@pytest.mark.parametrize("files", [p[1] for p in ALLOWED], ids=[p[0] for p in ALLOWED])
def test_each_allowed_import_passes(copy: Path, files: dict[str, str]) -> None:
    plant(copy, files)
    assert check(copy) == []


def test_an_allow_list_entry_no_longer_needed_fails(copy: Path) -> None:
    reach_ins = {**REACH_INS, ("repro.spec.hosts", "repro.run.launchers.mpi"): "never happened"}
    assert check(copy, allowed_reach_ins=reach_ins) == [
        "REACH_INS names repro.spec.hosts -> repro.run.launchers.mpi, which no longer happens: delete the entry"]
    unresolved = {**UNRESOLVED_OK, "repro.spec.hosts": "never happened"}
    assert check(copy, unresolved_ok=unresolved) == [
        "UNRESOLVED_OK names repro.spec.hosts, which no longer imports a name it does not spell out"]
    [upward] = check(copy, allowed_up=set())
    assert upward.startswith("repro.spec.manifest:") and "imports repro.measure.parsers (measure)" in upward


def test_the_top_floor_includes_what_is_inside_its_packages() -> None:
    assert [stage(m) for m in ("repro.up.attached", "repro.cli.site", "repro.upkeep", "repro.run.plan")] == [
        "top", "top", "base", "run"]
