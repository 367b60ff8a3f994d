"""Logs from anywhere, matched to the cells of a table by what they say.

``repro report --from-logs DIR`` walks the tree, detects each file's format and reads the facts
its log prints (GPUs, nodes, batch size per GPU, precision, GPU model where the log names it); a
log belongs to a cell when its format is the manifest's and every fact it states fits the cell. A
file name is only a hint: it breaks a tie between logs that fit equally (the publisher's file
name, a GPU model in the path). Two logs for one cell (beyond its repeats) are reported, never
chosen between, and so are logs that miss a cell by a fact (an A100 log against a V100 cell, a
different batch size). ``--map CELL=FILE`` names a cell's log outright.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from repro.errors import ReproError, UsageError
from repro.measure.protocol import Protocol
from repro.measure.parsers import parse_file

if TYPE_CHECKING:
    from repro.spec.manifest import Manifest, PublishedCell, PublishedTable

#: GPU families by CUDA compute capability (what a log may print instead of a GPU's name)
_CAPABILITY = {"6.0": "P100", "7.0": "V100", "7.5": "T4", "8.0": "A100", "9.0": "H100"}
_FAMILY = re.compile(r"(?<![A-Za-z0-9])([AHLPTV]\d{2,3})(?![0-9])", re.I)
_NOT_LOGS = {".json", ".md", ".yaml", ".yml", ".png", ".jpg", ".gz", ".tar", ".zip", ".py", ".sh", ".csv", ".lock"}


@dataclass
class LogFacts:
    """What one file of the tree says about its run(s)."""

    path: Path
    parser: str
    gpus: tuple[int, ...]  # one per run in the log (1 where a single process says nothing)
    nodes: int | None = None
    batch_size: int | None = None
    precision: str | None = None
    gpu_model: str | None = None  # a family (V100, A100) where the log names it

    def describe(self) -> str:
        said = [f"{'/'.join(map(str, self.gpus))} GPU(s)"]
        said += [f"{k} {v}" for k, v in (("batch", self.batch_size), ("precision", self.precision),
                                          ("GPU", self.gpu_model)) if v is not None]
        return ", ".join(said)


@dataclass
class LogTree:
    root: Path
    logs: list[LogFacts] = field(default_factory=list)


def scan_logs(root: Path) -> LogTree:
    """Every training log under ``root`` with its facts; other files are passed over."""
    from repro.tree import walk

    tree = LogTree(root)
    for path in walk(root, UsageError, skip=lambda name: name.startswith(".")):
        if path.suffix.lower() in _NOT_LOGS or not path.is_file():
            continue
        try:
            tree.logs.append(log_facts(path))
        except ReproError:
            continue  # not a log of a known format, or not readable as one
    return tree


def log_facts(path: Path) -> LogFacts:
    result = parse_file(path, protocol=Protocol(aggregate="summary"))  # its facts: no record is kept
    f = result.facts
    gpus = tuple(s.gpus or 1 for s in result.series) or (_int(f.get("gpus")) or 1,)
    model = _CAPABILITY.get(str(f.get("compute_capability")))
    return LogFacts(path, result.parser, gpus, _int(f.get("nodes")), _int(f.get("batch_size")),
                    f.get("precision") if isinstance(f.get("precision"), str) else None, model)  # type: ignore[arg-type]


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def gpu_family(text: str | None) -> str | None:
    m = _FAMILY.search(text or "")
    return m.group(1).upper() if m else None


def _half(precision: str | None) -> bool | None:
    return None if precision is None else precision != "fp32"


def misfits(log: LogFacts, manifest: Manifest, cell: PublishedCell) -> list[str]:
    """How the log's facts disagree with the cell ([] when it fits)."""
    out = []
    if cell.gpus not in log.gpus:
        out.append(f"{'/'.join(map(str, log.gpus))} GPU(s), the cell {cell.gpus}")
    if log.nodes is not None and log.nodes != cell.nodes:
        out.append(f"{log.nodes} node(s), the cell {cell.nodes}")
    if log.batch_size is not None and log.batch_size != cell.batch_size:
        out.append(f"batch {log.batch_size}/GPU, the cell {cell.batch_size}")
    if _half(log.precision) not in (None, _half(cell.precision)):
        out.append(f"precision {log.precision}, the cell {cell.precision}")
    want = gpu_family(manifest.expect.get("gpu_model"))
    if log.gpu_model and want and log.gpu_model != want:
        out.append(f"GPU {log.gpu_model}, the target {want}")
    return out


def _hints(log: LogFacts, root: Path, manifest: Manifest, cell: PublishedCell) -> int:
    """What the file's name says for (+) or against (-) the cell: a tie-break only."""
    score = 0
    if log.path.name in {p.name for p in cell.logs}:
        score += 1
    named = {m.upper() for m in _FAMILY.findall(str(log.path.relative_to(root)))}
    want = gpu_family(manifest.expect.get("gpu_model"))
    if want and named:
        score += 2 if want in named else -2
    return score


@dataclass
class CellLogs:
    logs: list[Path]
    detail: str = ""  # why none were taken, or what was passed over


def cell_logs(tree: LogTree, manifest: Manifest, cell: PublishedCell,
              mapped: Sequence[Path] = ()) -> CellLogs:
    """The logs of ``tree`` for one cell (its repeats: as many as the publisher listed)."""
    if mapped:
        return CellLogs(list(mapped), "log named by --map")
    want = max(1, len(cell.logs))
    mine = [log for log in tree.logs if log.parser == manifest.measure.parser]
    fits = [log for log in mine if not misfits(log, manifest, cell)]
    if len(fits) > want:
        ranked = sorted(fits, key=lambda log: -_hints(log, tree.root, manifest, cell))
        best = _hints(ranked[0], tree.root, manifest, cell)
        top = [log for log in ranked if _hints(log, tree.root, manifest, cell) == best]
        if len(top) <= want:
            fits = top
        else:
            names = ", ".join(str(log.path.relative_to(tree.root)) for log in top)
            return CellLogs([], f"ambiguous: {len(top)} logs fit this cell equally ({names}); "
                                f"{_tied(top, manifest, cell, want)}")
    if fits:
        note = f"{len(fits)} of {want} repeat logs found" if len(fits) < want else ""
        return CellLogs([log.path for log in fits], note)
    near = [(log, misfits(log, manifest, cell)) for log in mine if cell.gpus in log.gpus]  # the rest: other cells
    if not near:
        return CellLogs([], f"no {manifest.measure.parser} log under {tree.root} fits this cell")
    said = "; ".join(f"{log.path.relative_to(tree.root)} says {', '.join(why)}" for log, why in near[:3])
    more = f" (and {len(near) - 3} more)" if len(near) > 3 else ""
    return CellLogs([], f"no log fits this cell: {said}{more}")


def _tied(logs: Sequence[LogFacts], manifest: Manifest, cell: PublishedCell, want: int) -> str:
    """Why logs that fit a cell equally cannot be told apart, and how to say which one is meant."""
    key = f"--map {cell_key(manifest, cell)}=FILE"
    family = gpu_family(manifest.expect.get("gpu_model"))
    silent = sorted({log.parser for log in logs if log.gpu_model is None})
    if family and silent:
        return (f"{' and '.join(silent)} logs do not print the GPU model, so this {family} run cannot be told "
                f"by content from the same configuration run on another GPU; name the one to use with {key}, "
                f"or put the GPU model in its file or folder name (e.g. {family}_LOG/)")
    return (f"they state the same facts ({logs[0].describe()}) and the cell takes {want} log(s); name the "
            f"one(s) to use with {key}")


def cell_key(manifest: Manifest, cell: PublishedCell) -> str:
    """How ``--map`` names a cell: ``TARGET/NnMg-PRECISION-bsB``."""
    return f"{manifest.id}/{cell.nodes}n{cell.gpus // max(cell.nodes, 1)}g-{cell.precision}-bs{cell.batch_size}"


def parse_maps(items: Sequence[str]) -> dict[str, list[Path]]:
    """``--map CELL=FILE`` options: cell key (with or without ``TARGET/``) -> files (repeats)."""
    out: dict[str, list[Path]] = {}
    for item in items:
        key, sep, file = item.partition("=")
        if not sep or not key or not file:
            raise UsageError(f"--map {item!r}: expected CELL=FILE, e.g. paddle-rn50-v100/1n8g-fp32-bs256=run.log")
        path = Path(file)
        if not path.is_file():
            raise UsageError(f"--map {item!r}: {file}: no such file")
        out.setdefault(key, []).append(path)
    return out


def check_maps(maps: Mapping[str, list[Path]], tables: Sequence[tuple[Manifest, PublishedTable]]) -> None:
    """Every ``--map`` key names a cell of the tables reported (``TARGET/KEY`` or ``KEY``); else exit 2 with
    the cells there are (a key ignored silently would report the cell from another log, or none)."""
    keys = [cell_key(m, c) for m, t in tables for c in t.cells]
    known = set(keys) | {k.partition("/")[2] for k in keys}
    unknown = [k for k in maps if k not in known]
    if unknown:
        raise UsageError(f"--map {', '.join(unknown)}: no such cell in what is reported",
                         hint="the cells: " + ", ".join(keys))


def mapped_for(maps: Mapping[str, list[Path]], manifest: Manifest, cell: PublishedCell) -> list[Path]:
    key = cell_key(manifest, cell)
    return maps.get(key) or maps.get(key.partition("/")[2]) or []
