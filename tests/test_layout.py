"""The run directory's layout has one owner (repro.layout): the run directory, the nodes' telemetry and the record
find a repeat's files where it says, and no other module spells the layout as strings."""

from __future__ import annotations

import re
from pathlib import Path

from repro import layout
from repro.nodes import telemetry
from repro.run.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
#: the detached job's own files (``job/``) and the batch script's shell text that writes ``cells/`` as the job
#: runs: the Slurm package's sub-layout, spelled where the script is rendered and read back
PENDING = {"repro/run/schedulers/slurm/detached.py", "repro/run/schedulers/slurm/jobfiles.py"}
SPELLED = re.compile(r"""["'](?:cells/|provenance\.json|state\.json|SHA256SUMS)|/ "cells"|\{rank\}-\{node\}\.log|"""
                     r"""\{[a-z.]+rank\}-\{[a-z.]+\}\.log""")


def spelling_modules() -> set[str]:
    """The modules whose code (docstrings aside) spells a part of the layout as a string."""
    out = set()
    for path in sorted((ROOT / "repro").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        code = re.sub(r'"""[\s\S]*?"""', "", path.read_text(encoding="utf-8"))
        if rel != "repro/layout.py" and SPELLED.search(code):
            out.add(rel)
    return out


def test_only_the_layout_spells_the_layout() -> None:
    assert spelling_modules() - PENDING == set()


def test_pending_list_only_shrinks() -> None:
    assert PENDING - spelling_modules() == set()


def test_repeat_folders_in_repeat_order(tmp_path: Path) -> None:
    for name in ("r10", "r2", "r1", "rx", "notes"):
        (layout.cell_dir(tmp_path, "1n8g-fp32-bs256") / name).mkdir(parents=True)
    (layout.cell_dir(tmp_path, "1n8g-fp32-bs256") / "r3").write_text("a file, not a repeat")
    assert [(k, d.name) for k, d in layout.repeat_dirs(tmp_path, "1n8g-fp32-bs256")] == [
        (1, "r1"), (2, "r2"), (10, "r10")]
    assert layout.repeat_dirs(tmp_path, "2n8g-fp32-bs256") == []


def test_every_reader_finds_a_repeat_where_the_layout_puts_it(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    where = layout.repeat_dir(tmp_path, "1n8g-fp32-bs256", 2)
    assert run.log_dir("1n8g-fp32-bs256", 2) == where == tmp_path / "cells" / "1n8g-fp32-bs256" / "r2"
    assert run.log_path("1n8g-fp32-bs256", 2, 0, "n1") == where / layout.log_name(0, "n1") == where / "0-n1.log"
    assert telemetry.node_file(where, "n1") == where / "telemetry-n1.txt"
    assert layout.is_cell_file("cells/1n8g-fp32-bs256/r2/0-n1.log") and not layout.is_cell_file("report.md")
