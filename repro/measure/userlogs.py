"""Logs from anywhere, matched to the cells of a table by what they say.

``repro report --from-logs DIR`` walks the tree, detects each file's format and reads the facts
its log states (GPUs, nodes, batch size per GPU, precision, GPU model where the log names it).
A fact is either *stated* by the log or *defaulted* by the kit (a log that states no GPU count
is taken as one process on one GPU); only stated facts make a log fit a cell, defaulted ones can
only rule it out. A GPU model named in the log's path (``V100_LOG/``) counts as stated; one that
differs from the target's rules the log out.

A tree is a *new run* (your logs), judged by its repeats, except for files that are byte for
byte the publication's own logs: those are the publication, never a repeat of your run, and a
cell that has only them is re-derived as ``repro report TARGET`` would. For a cell of a new run
every log of yours whose stated facts fit it is one of its repeats, however many the publisher
ran; logs that state more of the cell's facts outrank those that state fewer (a truncated log
that states nothing is never a repeat of a cell that complete logs fit). Fitting logs are
ambiguous only when they state different facts and so would fit different cells of the table;
a file name then breaks the tie where it can, otherwise the cell is not run and the detail says
which facts the logs leave unstated. ``--map CELL=FILE`` names a cell's log outright.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from repro.errors import ReproError, UsageError
from repro.measure.protocol import Protocol
from repro.measure.parsers import parse_file
from repro.paths import data_root

if TYPE_CHECKING:
    from repro.spec.manifest import Manifest, PublishedCell, PublishedTable

#: GPU families by CUDA compute capability (what a log may print instead of a GPU's name)
_CAPABILITY = {"6.0": "P100", "7.0": "V100", "7.5": "T4", "8.0": "A100", "9.0": "H100"}
_FAMILY = re.compile(r"(?<![A-Za-z0-9])([AHLPTV]\d{2,3})(?![0-9])", re.I)
_NOT_LOGS = {".json", ".md", ".yaml", ".yml", ".png", ".jpg", ".gz", ".tar", ".zip", ".py", ".sh", ".csv",
             ".lock"}


@dataclass
class LogFacts:
    """What one file of the tree says about its run(s)."""

    path: Path
    parser: str
    gpus: tuple[int, ...]  # one per run in the log (1 where the log states no count: the kit's default)
    nodes: int | None = None
    batch_size: int | None = None
    precision: str | None = None
    gpu_model: str | None = None  # a family (V100, A100) where the log names it
    gpus_stated: bool = True
    path_models: frozenset[str] = frozenset()  # GPU families its path (below the tree's root) names
    size: int = -1
    _digest: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        said = [f"{'/'.join(map(str, self.gpus))} GPU(s)" + ("" if self.gpus_stated else " (not stated)")]
        said += [f"{k} {v}" for k, v in (("batch", self.batch_size), ("precision", self.precision),
                                          ("GPU", self.gpu_model)) if v is not None]
        return ", ".join(said)

    def digest(self) -> str:
        if self._digest is None:
            self._digest = _sha256(self.path)
        return self._digest


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
            facts = log_facts(path)
        except ReproError:
            continue  # not a log of a known format, or not readable as one
        facts.path_models = frozenset(m.upper() for m in _FAMILY.findall(str(path.relative_to(root))))
        tree.logs.append(facts)
    return tree


def log_facts(path: Path) -> LogFacts:
    result = parse_file(path, protocol=Protocol(aggregate="summary"))  # its facts: no record is kept
    f = result.facts
    counts = tuple(s.gpus for s in result.series if s.gpus is not None) or tuple(
        [g] if (g := _int(f.get("gpus"))) else [])
    model = _CAPABILITY.get(str(f.get("compute_capability")))
    return LogFacts(path, result.parser, counts or (1,), _int(f.get("nodes")), _int(f.get("batch_size")),
                    f.get("precision") if isinstance(f.get("precision"), str) else None,  # type: ignore[arg-type]
                    model, gpus_stated=bool(counts), size=_size(path))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return ""
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def published_logs() -> dict[int, dict[str, Path]]:
    """The publication logs the kit bundles: size -> {sha256: path} (a tree's copies of them are told by
    these)."""
    out: dict[int, dict[str, Path]] = {}
    root = data_root() / "logs" / "published"
    for p in sorted(root.rglob("*")) if root.is_dir() else ():
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() not in _NOT_LOGS:
            out.setdefault(_size(p), {})[_sha256(p)] = p
    return out


def is_publication_copy(log: LogFacts) -> bool:
    """Whether the file is byte for byte one of the publication logs the kit bundles."""
    same_size = published_logs().get(log.size)
    return bool(same_size) and log.digest() in same_size  # type: ignore[operator]


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def gpu_family(text: str | None) -> str | None:
    m = _FAMILY.search(text or "")
    return m.group(1).upper() if m else None


def _half(precision: str | None) -> bool | None:
    return None if precision is None else precision != "fp32"


def misfits(log: LogFacts, manifest: Manifest, cell: PublishedCell, defaults: bool = True) -> list[str]:
    """How the log's facts (stated, or with ``defaults`` the kit's default GPU count) disagree with the cell
    ([] when none do)."""
    out = []
    if cell.gpus not in log.gpus and (defaults or log.gpus_stated):
        out.append(f"{'/'.join(map(str, log.gpus))} GPU(s)" + ("" if log.gpus_stated else " (none stated)")
                   + f", the cell {cell.gpus}")
    if log.nodes is not None and log.nodes != cell.nodes:
        out.append(f"{log.nodes} node(s), the cell {cell.nodes}")
    if log.batch_size is not None and log.batch_size != cell.batch_size:
        out.append(f"batch {log.batch_size}/GPU, the cell {cell.batch_size}")
    if _half(log.precision) not in (None, _half(cell.precision)):
        out.append(f"precision {log.precision}, the cell {cell.precision}")
    want = gpu_family(manifest.expect.get("gpu_model"))
    if log.gpu_model and want and log.gpu_model != want:
        out.append(f"GPU {log.gpu_model}, the target {want}")
    elif want and log.path_models and want not in log.path_models:
        out.append(f"its path names GPU {'/'.join(sorted(log.path_models))}, the target {want}")
    return out


#: the facts of a cell a log can state, and how the detail names them
FACTS = {"gpus": "GPU count", "nodes": "node count", "batch_size": "batch size", "precision": "precision",
         "gpu_model": "GPU model"}


def stated(log: LogFacts, manifest: Manifest) -> frozenset[str]:
    """The cell facts the log states (by its content, or the GPU model by its path)."""
    want = gpu_family(manifest.expect.get("gpu_model"))
    said = {"gpus"} if log.gpus_stated else set()
    said |= {k for k in ("nodes", "batch_size", "precision") if getattr(log, k) is not None}
    if log.gpu_model or (want and want in log.path_models):
        said.add("gpu_model")
    return frozenset(said)


@dataclass
class CellLogs:
    logs: list[Path]
    detail: str = ""  # why none were taken, or what was passed over
    kind: str | None = None  # "new run" or "re-derivation" where the tree decides it; None: by the logs


def cell_logs(tree: LogTree, manifest: Manifest, cell: PublishedCell, mapped: Sequence[Path] = (),
              cells: Sequence[PublishedCell] = ()) -> CellLogs:
    """The logs of ``tree`` for one cell of a table (``cells``: all of the table's, to tell which logs
    would fit another cell): your logs that fit it, all of them its repeats; or, where you gave none,
    the copies of the cell's own publication logs (a re-derivation)."""
    if mapped:
        return CellLogs(list(mapped), "log named by --map")
    mine = [log for log in tree.logs if log.parser == manifest.measure.parser]
    own = [log for log in mine if not is_publication_copy(log)]
    fits = [(log, stated(log, manifest)) for log in own if not misfits(log, manifest, cell)]
    fits = [(log, said) for log, said in fits if said]
    if fits:
        return _repeats(tree, manifest, cell, fits, cells or [cell])
    copies = _copies(mine, cell)
    if copies:
        have = len(copies)
        note = (f"{have} of {len(cell.logs)} publication logs of this cell found"
                if have < len(cell.logs) else "")
        return CellLogs(copies, note, "re-derivation")
    return CellLogs([], _why_none(tree, manifest, cell, mine, own))


def _repeats(tree: LogTree, manifest: Manifest, cell: PublishedCell,
             fits: list[tuple[LogFacts, frozenset[str]]], cells: Sequence[PublishedCell]) -> CellLogs:
    """Your logs that fit a cell: those that state the most of its facts, one repeat each."""
    top = max(len(said) for _, said in fits)
    best = [log for log, said in fits if len(said) == top]
    fewer = [log for log, said in fits if len(said) < top]
    note = ""
    if fewer:
        names = (", ".join(_rel(log, tree) for log in fewer[:3])
                 + (f" and {len(fewer) - 3} more" if len(fewer) > 3 else ""))
        note = f"passed over {names}: stating fewer of this cell's facts than the {len(best)} used"
    groups: dict[frozenset[str], list[LogFacts]] = {}
    for log in best:
        groups.setdefault(_fit_set(log, manifest, cells), []).append(log)
    if len(groups) > 1:
        named = [log for log in best if log.path.name in {p.name for p in cell.logs}]
        if named and len({_fit_set(log, manifest, cells) for log in named}) == 1:
            return CellLogs([log.path for log in named], "; ".join(filter(None, [
                "told apart from logs that state other facts by the publisher's file name", note])),
                "new run")
        return CellLogs([], _ambiguous(tree, manifest, cell, best))
    return CellLogs([log.path for log in best], note, "new run")


def _fit_set(log: LogFacts, manifest: Manifest, cells: Sequence[PublishedCell]) -> frozenset[str]:
    """The table's cells whose facts the log's stated facts fit."""
    return frozenset(cell_key(manifest, c) for c in cells if not misfits(log, manifest, c))


def _copies(mine: Sequence[LogFacts], cell: PublishedCell) -> list[Path]:
    """Copies in the tree of the cell's own publication logs, in the publication's order (one each)."""
    out = []
    for pub in cell.logs:
        size = _size(pub)
        twin = next((log.path for log in mine if log.size == size and log.digest() == _sha256(pub)), None)
        if twin is not None:
            out.append(twin)
    return out


def _rel(log: LogFacts, tree: LogTree) -> str:
    try:
        return str(log.path.relative_to(tree.root))
    except ValueError:
        return str(log.path)


def _ambiguous(tree: LogTree, manifest: Manifest, cell: PublishedCell, logs: Sequence[LogFacts]) -> str:
    """Logs that fit one cell but state different facts: which facts each leaves unstated."""
    key = f"--map {cell_key(manifest, cell)}=FILE"
    said = [f"{_rel(log, tree)} states no "
            f"{', no '.join(FACTS[f] for f in FACTS if f not in stated(log, manifest))}"
            for log in logs[:4]]
    more = f" (and {len(logs) - 4} more)" if len(logs) > 4 else ""
    return (f"ambiguous: {len(logs)} logs fit this cell but state different facts, so they may be runs of "
            f"different cells: {'; '.join(said)}{more}; name this cell's logs with {key} (once per repeat)")


def _why_none(tree: LogTree, manifest: Manifest, cell: PublishedCell, mine: Sequence[LogFacts],
              own: Sequence[LogFacts]) -> str:
    """Why no log of the tree is this cell's: the nearest misses, or logs that state none of its facts."""
    if not mine:
        return f"no {manifest.measure.parser} log under {tree.root}"
    silent = [log for log in own
              if not stated(log, manifest) and not misfits(log, manifest, cell, defaults=False)]
    near = [(log, misfits(log, manifest, cell)) for log in mine
            if cell.gpus in log.gpus and log not in silent]
    near = [(log, why if log in own else [*why, "a copy of another publication log"]) for log, why in near]
    near = [(log, why) for log, why in near if why]
    parts = [f"{_rel(log, tree)} says {', '.join(why)}" for log, why in near[:3]]
    parts += [f"{_rel(log, tree)} states none of the cell's facts ({', '.join(FACTS.values())}): give it "
              f"with --map {cell_key(manifest, cell)}=FILE if it is this cell's" for log in silent[:2]]
    more = len(near) - 3 if len(near) > 3 else 0
    if not parts:
        return f"no log of yours under {tree.root} fits this cell"
    return f"no log fits this cell: {'; '.join(parts)}" + (f" (and {more} more)" if more else "")


def cell_key(manifest: Manifest, cell: PublishedCell) -> str:
    """How ``--map`` names a cell: ``TARGET/NnMg-PRECISION-bsB``."""
    return (f"{manifest.id}/{cell.nodes}n{cell.gpus // max(cell.nodes, 1)}g-"
            f"{cell.precision}-bs{cell.batch_size}")


def parse_maps(items: Sequence[str]) -> dict[str, list[Path]]:
    """``--map CELL=FILE`` options: cell key (with or without ``TARGET/``) -> files (repeats)."""
    out: dict[str, list[Path]] = {}
    for item in items:
        key, sep, file = item.partition("=")
        if not sep or not key or not file:
            raise UsageError(f"--map {item!r}: expected CELL=FILE, "
                             "e.g. paddle-rn50-v100/1n8g-fp32-bs256=run.log")
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
