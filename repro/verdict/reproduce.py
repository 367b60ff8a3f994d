"""Re-derive a published table from raw logs with the manifest's measurement protocol.

For each published cell: parse its log(s) with the manifest's parser, measure each
log with the cell's protocol, aggregate repeats as the publication did, and give a
verdict. With the publication's own logs that is a re-derivation, and the verdict never
rounds a number into a match: a published figure that lies outside every record its protocol
uses from the log (the records after its warm-up skip; per GPU where the log's records are per
GPU) cannot be derived from that log, whatever the tolerance says (:func:`not_derivable_text`).
With other logs (a run directory, your own) it is a new run, judged by its repeats' own variance
(repro.verdict).
"""

from __future__ import annotations

import filecmp
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from repro.errors import ReproError
from repro.measure.protocol import Measurement, Protocol, aggregate_repeats, measure, speedup
from repro.measure.parsers import PARSERS, ParseResult, Series, parse_file
from repro.measure.userlogs import LogTree, cell_key, cell_logs, mapped_for, scan_logs
from repro.verdict.rules import (
    DEVIATES,
    MATCH,
    MEASURED,
    NEW_RUN,
    NOT_RUN,
    NOT_DERIVABLE,
    NOT_PUBLISHED,
    REDERIVATION,
    estimate,
    judge_new_run,
    run_tolerance,
)

if TYPE_CHECKING:  # imported where used: `repro parse` reads no manifest and need not load YAML
    from repro.spec.manifest import Cell, Manifest, PublishedCell, PublishedTable


@dataclass
class CellResult:
    target: str
    column: str
    nodes: int
    gpus: int
    precision: str
    batch_size: int
    published: str | None
    reproduced: float | None = None
    repeats: list[float] = field(default_factory=list)
    delta_pct: float | None = None
    verdict: str = NOT_RUN
    exact: bool = False
    detail: str = ""
    flags: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    records_used: list[int] = field(default_factory=list)
    published_speedup: str | None = None
    speedup: float | None = None
    efficiency: float | None = None
    label: str | None = None
    kind: str = REDERIVATION  # or NEW_RUN: see repro.verdict
    low: float | None = None  # a new run's interval (repro.verdict.rules.INTERVAL)
    high: float | None = None
    spread_pct: float | None = None  # sample standard deviation of the repeats, % of the figure
    tolerance_pct: float | None = None
    tolerance_reason: str = ""

    @property
    def column_key(self) -> str:
        return f"{self.precision} bs{self.batch_size}"


@dataclass
class TableResult:
    manifest: Manifest
    table: PublishedTable | None  # None: the target reproduces no publication, it only measures
    cells: list[CellResult]
    source: str  # where the logs came from


def _series_for(result: ParseResult, gpus: int) -> Series | None:
    exact = [s for s in result.series if s.gpus == gpus]
    if exact:
        return exact[0]
    unknown = [s for s in result.series if s.gpus is None]
    return unknown[0] if len(unknown) == 1 and len(result.series) == 1 else None


def _contradictions(result: ParseResult, cell: Cell | PublishedCell) -> list[str]:
    """What the log says about the run of this cell (its own facts: a log may hold several runs) that
    disagrees with the cell it is meant to measure."""
    series = _series_for(result, cell.gpus)
    facts, out = (series.facts if series is not None and series.facts else result.facts), []
    if "batch_size" in facts and int(facts["batch_size"]) != cell.batch_size:  # type: ignore[call-overload]
        out.append(f"log says batch size {facts['batch_size']}/GPU, the cell says {cell.batch_size}")
    if "precision" in facts and facts["precision"] != cell.precision:
        out.append(f"log says precision {facts['precision']}, the cell says {cell.precision}")
    label = getattr(cell, "label", None)
    if label and "amp" in label.lower() and facts.get("amp") is False:
        out.append(f"published as {label!r} but the log says amp False"
                   + (f", dtype {facts['dtype']}" if "dtype" in facts else ""))
    return out


def _measure_log(path: Path, manifest: Manifest,
                 cell: Cell | PublishedCell) -> tuple[Measurement, ParseResult]:
    declared = manifest.measure.protocol_for(cell)
    protocol = Protocol.from_dict(declared)
    try:
        result = parse_file(path, manifest.measure.parser, protocol)
    except ReproError as e:  # this cell has no figure; the rest of the table goes on
        return Measurement(cell.gpus, None, 0, None, None, [e.message]), ParseResult("", [], {}, [], 0)
    if result.refused:
        return Measurement(cell.gpus, None, 0, None, None, [f"{path.name}: {result.refused}"]), result
    series = _series_for(result, cell.gpus)
    if series is None:
        found = ", ".join(str(s.gpus) for s in result.series) or "none"
        why = f"no run with {cell.gpus} GPUs in the log (found: {found})"
        return Measurement(cell.gpus, None, 0, None, None, [why]), result
    # a manifest that states its own minimum (a short CPU check run) is held to that, not the format's default
    floor = protocol.min_records if "min_records" in declared else _floor(result)
    return measure(series, protocol, gpus=cell.gpus, floor=floor, batch=cell.batch_size), result


def _floor(result: ParseResult) -> int:
    """The fewest records a figure of this log's format may come from."""
    return PARSERS.get(result.parser).min_records if result.parser else 1


def _are_published_logs(logs: Sequence[Path], published: Sequence[Path]) -> bool:
    """Whether ``logs`` are the publication's own logs of a cell: the same files, or copies of them
    byte for byte (a tree of the publisher's logs given to --from-logs is still a re-derivation)."""
    logs, published = [Path(p) for p in logs], [Path(p) for p in published]
    if logs == published:
        return True
    if len(logs) != len(published):
        return False
    try:
        return all(a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)
                   for a, b in zip(logs, published))
    except OSError:
        return False


def reproduce_cell(manifest: Manifest, table: PublishedTable, cell: PublishedCell, logs: Sequence[Path],
                   kind: str | None = None) -> CellResult:
    """Judge one published cell on ``logs``: a re-derivation when they are the publication's own logs
    (or byte-identical copies), otherwise (or when ``kind`` says so: a run) a new run."""
    if cell.value == "-":  # nothing to compare with; a run's own figure is still shown
        r = CellResult(manifest.id, table.column or manifest.framework, cell.nodes, cell.gpus, cell.precision,
                       cell.batch_size, None, verdict=NOT_PUBLISHED, label=cell.label,
                       logs=[str(p) for p in logs])
        if logs:
            _measure_logs(manifest, cell, logs, r)
        r.verdict, r.detail = NOT_PUBLISHED, cell.note or "the table prints '-' here"
        return r
    r = CellResult(manifest.id, table.column or manifest.framework, cell.nodes, cell.gpus, cell.precision,
                   cell.batch_size, cell.value, published_speedup=cell.speedup, label=cell.label,
                   logs=[str(p) for p in logs])
    r.kind = kind or (REDERIVATION if _are_published_logs(logs, cell.logs) else NEW_RUN)
    if not logs:
        none = "the kit bundles no publication log of this cell" if r.kind == REDERIVATION else ""
        about = ([none, table.logs_from, cell.note, _published_repeats_check(manifest, cell)]
                 if r.kind == REDERIVATION else [])
        r.detail = "; ".join(filter(None, about))
        return r
    low, high, issues = _measure_logs(manifest, cell, logs, r)
    if r.reproduced is None:
        return r
    if r.kind == REDERIVATION:
        protocol = manifest.measure.protocol_for(cell)
        _judge(r, cell, low, high, protocol.get("aggregate", "mean") == "summary",
               protocol.get("scale") == "per_gpu")
    else:  # your logs, not the publication's: judged with their own variance
        _judge_new_run(r, cell, run_tolerance(table.run_tolerance))
    if issues:
        r.detail = "; ".join([r.detail, *issues]).strip("; ")
    if cell.note and not r.exact:  # the manifest's reason why this cell does not re-derive exactly
        r.detail = "; ".join(filter(None, [r.detail, cell.note]))
    return r


def measure_cell(manifest: Manifest, cell: Cell, logs: Sequence[Path]) -> CellResult:
    """A matrix cell of a target that reproduces no publication: the measured figure only."""
    r = CellResult(manifest.id, manifest.framework, cell.nodes, cell.gpus, cell.precision, cell.batch_size,
                   None, logs=[str(p) for p in logs], kind=NEW_RUN)
    if not logs:
        r.detail = "no log of this cell in the run"
    else:
        _, _, issues = _measure_logs(manifest, cell, logs, r)
        if r.reproduced is not None:
            r.verdict, r.detail = MEASURED, "; ".join(issues)
            est = estimate(r.reproduced, r.repeats)
            r.low, r.high, r.spread_pct = est.low, est.high, est.spread_pct
    return r


def _measure_logs(manifest: Manifest, cell: Cell | PublishedCell, logs: Sequence[Path],
                  r: CellResult) -> tuple[float | None, float | None, list[str]]:
    """Measure every repeat's log and aggregate as the manifest says; fills ``r``; (low, high, issues)."""
    lows, highs, issues = [], [], []
    for path in logs:
        m, parsed = _measure_log(path, manifest, cell)
        r.flags += [f for f in _contradictions(parsed, cell) if f not in r.flags]
        issues += m.issues
        r.records_used.append(m.records_used)
        if m.value is None:
            r.verdict, r.detail = NOT_DERIVABLE, "; ".join(issues) or "no figure"
            return None, None, issues
        r.repeats.append(m.value)
        if m.low is not None and m.high is not None:
            lows.append(m.low)
            highs.append(m.high)
    how = manifest.measure.repeats
    r.reproduced = (r.repeats[0] if len(r.repeats) == 1
                    else aggregate_repeats(r.repeats, how.get("aggregate", "median"), how.get("round")))
    return (min(lows) if lows else None), (max(highs) if highs else None), issues


def is_exact(value: float, published: str) -> bool:
    """Does ``value``, written out and rounded half-up to the published decimals, read ``published``?

    Publications round the decimal figure they computed (363.765 -> 363.77), not the
    binary float behind it, so the comparison works on the shortest decimal repr.
    """
    step = Decimal(1).scaleb(-len(published.partition(".")[2]))
    return Decimal(repr(value)).quantize(step, rounding=ROUND_HALF_UP) == Decimal(published)


def _published_repeats_check(manifest: Manifest, cell: PublishedCell) -> str:
    """With per-repeat figures but no logs, at least check the publication's own aggregation."""
    if not cell.repeats:
        return ""
    how = manifest.measure.repeats
    agg = aggregate_repeats([float(v) for v in cell.repeats], how.get("aggregate", "median"),
                            how.get("round"))
    verdict = "consistent with" if is_exact(agg, cell.value) else "INCONSISTENT with"
    return (f"the {len(cell.repeats)} published repeats give {how.get('aggregate', 'median')} {agg}, "
            f"{verdict} the published {cell.value}")


def not_derivable_text(r: CellResult, published: str, low: float, high: float, per_gpu: bool) -> str:
    """Why a published figure cannot come from its log: it lies outside every record the protocol uses
    (per GPU where the log's records are per GPU), with the figure the log does give."""
    pub = float(published)
    side = "above" if pub > high else "below"
    n = r.gpus if per_gpu and r.gpus > 1 else 1
    mine = f"{pub / n:.3f} per GPU" if n > 1 else ""
    each = " per GPU" if n > 1 else ""
    given = f"; the log gives {r.reproduced:.3f} ({r.delta_pct:+.2f}%)" if r.reproduced is not None else ""
    return (f"published {published}{f' ({mine})' if mine else ''} lies {side} every record the protocol uses "
            f"from its log ({low / n:.3f} .. {high / n:.3f}{each}), so no window of them gives it{given}")


def _judge(r: CellResult, cell: PublishedCell, low: float | None, high: float | None, summary: bool,
           per_gpu: bool = False) -> None:
    assert r.reproduced is not None
    pub = float(cell.value)
    r.tolerance_pct = cell.tolerance_pct
    r.tolerance_reason = "re-derivation: the published figure from its own log"
    r.delta_pct = (r.reproduced - pub) / pub * 100
    r.exact = is_exact(r.reproduced, cell.value)
    half_ulp = 0.5 * 10 ** -cell.decimals
    if (not r.exact and not summary and low is not None and high is not None
            and not (low - half_ulp <= pub <= high + half_ulp)):
        r.verdict, r.detail = NOT_DERIVABLE, not_derivable_text(r, cell.value, low, high, per_gpu)
    elif r.exact or abs(r.delta_pct) <= cell.tolerance_pct:
        r.verdict = MATCH
        r.detail = "exact at published precision" if r.exact else f"within {cell.tolerance_pct}%"
    else:
        r.verdict = DEVIATES
        r.detail = f"{r.delta_pct:+.2f}% is outside the {cell.tolerance_pct}% tolerance"


def _judge_new_run(r: CellResult, cell: PublishedCell, tolerance: tuple[float, str]) -> None:
    assert r.reproduced is not None
    pub = float(cell.value)
    est = estimate(r.reproduced, r.repeats)
    r.kind, r.low, r.high, r.spread_pct = NEW_RUN, est.low, est.high, est.spread_pct
    r.tolerance_pct, r.tolerance_reason = tolerance
    r.delta_pct = (r.reproduced - pub) / pub * 100
    r.exact = is_exact(r.reproduced, cell.value)
    r.verdict, r.detail = judge_new_run(est, pub, r.tolerance_pct)


def _add_scaling(manifest: Manifest, cells: list[CellResult]) -> None:
    """Speedup and scaling efficiency per row, against the manifest's speedup base (default 1 GPU), from
    figures of one kind only: a new run's speedup comes from its own cells, never from a re-derived one."""
    sp = manifest.measure.speedup or {"base": {"gpus": 1}}
    digits = sp.get("round")
    for r in cells:
        base = next((b for b in cells if b.column_key == r.column_key and b.column == r.column
                     and all(getattr(b, k) == v for k, v in sp["base"].items() if hasattr(b, k))), None)
        if base is None:
            continue
        if r.reproduced is None:
            if r.kind == REDERIVATION and r.published_speedup and base.published:
                _published_speedup_check(r, base, digits)
            continue
        if base.reproduced is None or base.kind != r.kind:
            unsettled = f" ({base.verdict})" if base.verdict in (NOT_RUN, NOT_DERIVABLE) else ""
            why = ("has no figure" + unsettled if base.reproduced is None
                   else f"is a {base.kind}, this cell a {r.kind}")
            r.detail = "; ".join(filter(None, [r.detail, f"no speedup: its base cell "
                                               f"({base.gpus} GPU{'s' if base.gpus > 1 else ''}) {why}"]))
            continue
        r.speedup = speedup(r.reproduced, base.reproduced, digits)
        r.efficiency = r.reproduced / base.reproduced / (r.gpus / base.gpus)


def _published_speedup_check(r: CellResult, base: CellResult, digits: int | None) -> None:
    """Without a log, at least check the publication's speedup against its own figures."""
    assert r.published and base.published and r.published_speedup
    got = speedup(float(r.published), float(base.published), digits)
    verdict = "consistent with" if is_exact(got, r.published_speedup) else "INCONSISTENT with"
    check = (f"published {r.published} / {base.published} gives speedup {got}, "
             f"{verdict} the published {r.published_speedup}")
    r.detail = "; ".join(filter(None, [r.detail, check]))


def reproduce_table(manifest: Manifest, table: PublishedTable, from_logs: Path | LogTree | None = None,
                    maps: Mapping[str, list[Path]] | None = None) -> TableResult:
    """Re-derive one table from the bundled logs; or, given a tree of logs (matched to the cells by content,
    see :mod:`repro.measure.userlogs`) or logs ``maps`` names for cells (``--map``), judge those as a new run:
    a cell none of them is for is ``not run``, never filled from the publication's logs."""
    tree = scan_logs(from_logs) if isinstance(from_logs, Path) else from_logs
    if tree is None and not maps:
        cells = [reproduce_cell(manifest, table, cell, list(cell.logs)) for cell in table.cells]
        _add_scaling(manifest, cells)
        bundled = any(cell.logs for cell in table.cells)
        source = "the publication's logs bundled with the kit" if bundled else "no log (the kit bundles none)"
        return TableResult(manifest, table, cells, source)
    cells = []
    for cell in table.cells:
        mapped = mapped_for(maps or {}, manifest, cell)
        if tree is None and not mapped:
            r = reproduce_cell(manifest, table, cell, [], NEW_RUN)
            r.detail = "; ".join(filter(None, [f"no --map names {cell_key(manifest, cell)}", r.detail]))
            cells.append(r)
            continue
        found = cell_logs(tree or LogTree(Path(".")), manifest, cell, mapped, table.cells)
        r = reproduce_cell(manifest, table, cell, found.logs, found.kind or (None if mapped else NEW_RUN))
        if found.detail:
            r.detail = "; ".join(filter(None, [found.detail, r.detail]))
        cells.append(r)
    _add_scaling(manifest, cells)
    where = [f"your logs under {tree.root}"] if tree is not None else []
    return TableResult(manifest, table, cells, " and ".join([*where, "--map"] if maps else where))


def reproduce_run(run_dir: Path, table_id: str | None = None, *, source: str | None = None) -> TableResult:
    """Re-derive a published table from a ``repro up`` run directory (see repro.run.rundir).

    Each published cell is measured on the rank-0 log of every repeat of its matrix cell
    that finished; the manifest is the one the run recorded, not today's. A target that
    reproduces no publication gets its measured table, one row per matrix cell run.
    """
    from repro.spec.manifest import Cell
    from repro.run.rundir import DONE, RunDir

    run = RunDir.open(run_dir)
    manifest = run.load_manifest()
    state = run.read_state().get("cells", {})

    def logs_of(key: str) -> list[Path]:
        repeats = state.get(key, {}).get("repeats", {})
        return [log for k in sorted(repeats, key=int) if repeats[k].get("status") == DONE
                and (log := run.rank0_log(key, int(k))) is not None]

    table = manifest.table(table_id) if manifest.published else None
    if table is None:
        cells = [measure_cell(manifest, c, logs_of(c.key)) for c in manifest.cells() if c.key in state]
    else:
        cells = [reproduce_cell(manifest, table, pc, logs_of(Cell(pc.nodes, pc.gpus // pc.nodes, pc.precision,
                                                                   pc.batch_size).key), NEW_RUN)
                 for pc in table.cells]
    for c in cells:
        c.logs = [Path(p).relative_to(run.path).as_posix() for p in c.logs]
    _add_scaling(manifest, cells)
    return TableResult(manifest, table, cells, source or str(run_dir))


def non_monotonic(cells: Iterable[CellResult], devices: str = "GPUs", unit: str = "images/s") -> list[str]:
    """Columns whose reproduced throughput drops as devices are added; ``devices``: the target's word for them
    (``workers`` for a CPU target); ``unit``: the target's throughput unit."""
    out = []
    by_col: dict[tuple[str, str], list[CellResult]] = {}
    for c in cells:
        by_col.setdefault((c.column, c.column_key), []).append(c)
    for (col, key), group in by_col.items():
        pts = sorted((c.gpus, c.reproduced) for c in group if c.reproduced is not None)
        for (g1, v1), (g2, v2) in zip(pts, pts[1:]):
            if v2 < v1:
                out.append(f"{col} {key}: {v2:.2f} {unit} on {g2} {devices} is below {v1:.2f} on {g1}")
    return out


def resolve_tables(names: Sequence[str],
                   table_id: str | None = None) -> list[tuple[Manifest, PublishedTable]]:
    """Targets (or a published table id shared by several targets) -> (manifest, table) pairs."""
    from repro.errors import UsageError
    from repro.spec.manifest import find_target, load_catalog, manifest_files

    catalog: dict[str, Manifest] | None = None
    out: list[tuple[Manifest, PublishedTable]] = []
    for name in names:
        if catalog is None:
            catalog = load_catalog(manifest_files())
        if name in catalog or Path(name).suffix in (".yaml", ".yml"):
            m = catalog[name] if name in catalog else find_target(name)
            out.append((m, m.table(table_id)))
            continue
        shared = [(m, t) for m in catalog.values() for t in m.published if t.id == name]
        if not shared:
            raise UsageError(f"unknown target or published table {name!r}",
                             hint="`repro list` shows targets; `repro show TARGET` shows its published "
                                  "tables")
        out += shared
    return out


def parse_and_measure(log: Path, parser: str | None = None, *, gpus: int | None = None,
                      batch: int | None = None, **protocol: object) -> dict:
    """``repro parse``: one protocol applied to every run found in one log. Per-GPU figures
    (PaddleClas rank-0 logs) are multiplied by ``gpus``, or by the GPU count the log states; step
    rates (logs of step times) by ``gpus`` x ``batch`` (per GPU)."""
    proto = Protocol.from_dict({k: v for k, v in protocol.items() if v is not None})
    result = parse_file(log, parser, proto)
    if result.parser and getattr(PARSERS.get(result.parser), "step_rates", False):
        proto = replace(proto, scale="global_batch")
    out = {"parser": result.parser, "unit": PARSERS.get(result.parser).unit if result.parser else "images/s",
           "detected": parser is None, "file": str(log), "lines": result.lines, "facts": result.facts,
           "results": [], "issues": list(result.issues)}
    several = len(result.series) > 1
    for s in result.series:
        count = gpus if gpus is not None else s.gpus
        m = measure(s, replace(proto, scale="per_gpu") if s.per_gpu else proto, gpus=count,
                    floor=_floor(result), batch=batch)
        value = None if result.refused else m.value
        out["results"].append({"gpus": count, "throughput": value, "records_used": m.records_used,
                               "records": len(s), "summary": s.summary})
        issues = [i + (" (give it with --gpus N)" if "GPU count" in i else " (give it with --batch-size B)"
                       if "batch size" in i else "") for i in m.issues]
        out["issues"] += [f"{s.gpus or '?'} GPU run: {i}" if several else i for i in issues]
    return out


def parse_logs(logs: Sequence[Path], parser: str | None = None, *, jobs: int = 1,
               **options: object) -> Iterator[dict]:
    """``repro parse`` over several logs, in their order: :func:`parse_and_measure` of each, or
    ``{"file", "error"}`` for a log that cannot be read as a training log. With ``jobs`` > 1 the
    logs are parsed by that many worker processes (forked: nothing is imported again)."""
    work = partial(_parse_or_error, parser=parser, options=options)
    if jobs <= 1 or len(logs) <= 1:
        yield from map(work, logs)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=min(jobs, len(logs)), mp_context=ctx) as pool:
        yield from pool.map(work, logs)


def _parse_or_error(log: Path, parser: str | None, options: dict) -> dict:
    try:
        return parse_and_measure(log, parser, **options)
    except ReproError as e:
        return {"file": str(log), "error": e.message, "results": [], "issues": []}
