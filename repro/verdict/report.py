"""Render compared tables: the published layout side by side with the reproduction.

Pure functions from TableResult objects to text: a terminal form that fits 120 columns
(colour on request), full-width markdown, tidy long-form CSV and JSON records (one row per
table, target and cell) and JUnit XML (one testcase per cell); the CLI prints them. The chart
is drawn in ``repro.verdict.chart``, the self-contained HTML page in ``repro.verdict.html``.
Several publications stay separate tables, each under its own citation.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.verdict.reproduce import MATCH, CellResult, TableResult, non_monotonic
from repro.verdict.rules import (
    DEVIATES,
    FASTER,
    INCONCLUSIVE,
    INTERVAL,
    MEASURED,
    NEW_RUN,
    NOT_DERIVABLE,
    NOT_PUBLISHED,
    NOT_RUN,
    REDERIVATION,
    REPRODUCED,
    SLOWER,
    exit_code,
)

if TYPE_CHECKING:
    from repro.spec.manifest import PublishedCell


def tabulate(*args: Any, **kwargs: Any) -> str:
    """``tabulate.tabulate``, imported on first use (it costs ``repro parse`` a fifth of its start-up)."""
    from tabulate import tabulate as render

    return render(*args, **kwargs)


WIDTH = 120  # the terminal form's widest line
GOOD = {MATCH, REPRODUCED, MEASURED}
BAD = {SLOWER, FASTER, DEVIATES, NOT_DERIVABLE}
UNSURE = {INCONCLUSIVE, NOT_RUN}
ANSI = {**{v: "32" for v in GOOD}, **{v: "31" for v in BAD}, **{v: "33" for v in UNSURE}}
COLUMNS = ("table", "target", "framework", "model", "kind", "nodes", "gpus", "device", "precision",
           "batch_size", "published", "reproduced", "interval_low", "interval_high", "repeats", "spread_pct",
           "delta_pct", "verdict", "reason", "unit", "tolerance_pct", "tolerance_reason", "published_speedup",
           "speedup", "efficiency", "log")


def fmt(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def is_cpu(r: TableResult) -> bool:
    """A target that measures CPU workers (no publication, no GPU model expected)."""
    return r.table is None and "gpu_model" not in r.manifest.expect


def row_label(c: CellResult | PublishedCell, cpu: bool = False) -> str:
    unit = "worker" if cpu else "GPU"
    return (f"{c.gpus} {unit}" + ("s" if c.gpus > 1 else "")
            + f" ({c.nodes} node{'s' if c.nodes > 1 else ''})")


def _paint(text: str, verdict: str, colour: bool) -> str:
    return f"\x1b[{ANSI[verdict]}m{text}\x1b[0m" if colour and verdict in ANSI else text


def cell_text(c: CellResult, colour: bool = False) -> str:
    verdict = _paint(c.verdict, c.verdict, colour)
    spread = ""
    if c.low is not None and c.high is not None and c.reproduced:
        spread = f" ±{(c.high - c.low) / 2 / c.reproduced:.1%}"
    if c.published is None:
        if c.reproduced is None:
            return f"— ({verdict})" if c.verdict != NOT_RUN else "—"
        n = len(c.repeats)
        return f"{c.reproduced:.2f}{spread}" + (f" (median of {n})" if n > 1 else "")
    if c.reproduced is None:
        return f"{c.published} → — ({verdict})"
    if c.kind == NEW_RUN:
        n = len(c.repeats)
        return f"{c.published} → {c.reproduced:.2f}{spread} ({c.delta_pct:+.2f}%, n={n}) {verdict}"
    digits = len(c.published.partition(".")[2]) + 1  # one digit more than printed shows the rounding
    delta = "exact" if c.exact else f"{c.delta_pct:+.2f}%"
    return f"{c.published} → {c.reproduced:.{digits}f} ({delta}) {verdict}"


def groups(results: Sequence[TableResult]) -> list[list[TableResult]]:
    """One group per publication (or per measured-only target), in the order given."""
    out: dict[str, list[TableResult]] = {}
    for r in results:
        out.setdefault(r.table.id if r.table else f"target:{r.manifest.id}", []).append(r)
    return list(out.values())


def _yaml(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, default_flow_style=True, sort_keys=False, width=10**6).strip()


def protocol_text(r: TableResult) -> str:
    """The target's measure: block in its manifest's own YAML terms."""
    m = r.manifest.measure
    text = f"{r.manifest.id}: parser {m.parser}, protocol {_yaml(dict(m.protocol))}"
    text += "".join(f"; when {_yaml(dict(w))}: {_yaml(dict(p))}" for w, p in m.overrides)
    own = [c for c in (r.table.cells if r.table else ()) if c.protocol]  # a published cell's own protocol
    text += "".join(f"; cell {row_label(c)} {c.precision} bs{c.batch_size}: {_yaml(dict(c.protocol))}"
                    for c in own)
    return text + (f"; repeats {_yaml(dict(m.repeats))}" if m.repeats else "")


def kind_text(group: Sequence[TableResult]) -> str:
    kinds = {c.kind for r in group for c in r.cells if c.verdict != NOT_RUN}
    if not kinds or group[0].table is None:
        return ""
    if kinds == {NEW_RUN}:
        tol = next((c for r in group for c in r.cells if c.kind == NEW_RUN and c.tolerance_pct is not None),
                   None)
        why = f" Tolerance ±{tol.tolerance_pct:g}% ({tol.tolerance_reason})." if tol else ""
        return ("Compared as a new run: your repeats against the published figure; the estimate is the "
                f"repeats' aggregate, ± the half-width of the {INTERVAL}.{why}")
    if kinds == {NEW_RUN} or NEW_RUN in kinds:
        return ("Compared as a new run where your logs were given, by re-derivation where the publication's "
                "were.")
    return ("Compared by re-derivation: each published figure from the publication's own log, exact at the "
            "published precision, or not derivable with the reason.")


def sources_line(group: Sequence[TableResult]) -> str:
    """Which cells were judged on which logs: yours (a new run), the publication's, or none (not run)."""
    cells = [c for r in group for c in r.cells if c.verdict != NOT_PUBLISHED or c.logs]
    ran = [c for c in cells if c.logs]
    counts = [(sum(c.kind == NEW_RUN for c in ran), "from your logs (new run)"),
              (sum(c.kind == REDERIVATION for c in ran), "from the publication's logs (re-derivation)"),
              (len(cells) - len(ran), "with no log (not run)")]
    return "Cells: " + ", ".join(f"{n} {what}" for n, what in counts if n) + "."


def _header(group: Sequence[TableResult]) -> list[str]:
    first = group[0]
    if first.table is None:
        out = [f"# {first.manifest.id}: {first.manifest.title}", "",
               f"Measured only: this target reproduces no publication ({first.manifest.unit}).",
               f"Measured from: {', '.join(sorted({r.source for r in group}))}."]
        if any(c.low is not None for r in group for c in r.cells):
            out.append(f"± is the half-width of the {INTERVAL}, as a share of the median.")
    else:
        cite = first.table.cite
        out = [f"# {first.table.id}: {cite['title']}", "",
               (f"Published in {cite['repository']} @ {cite['commit'][:12]} `{cite['path']}` "
                f"({first.table.unit})."),
               f"Reproduced from: {', '.join(sorted({r.source for r in group}))}."]
        kind = kind_text(group)
        out += [kind] if kind else []
        out.append(sources_line(group))
    return [*out, "", "Protocols (each manifest's measure):", "", *[f"- {protocol_text(r)}" for r in group]]


def _grid(group: Sequence[TableResult],
          text: Any) -> tuple[list[str], list[tuple[str, list[str]]], list[str]]:
    """(row labels, [(framework, [column headers])], ...) and the cells as text: {(row, header): text}."""
    cpu = is_cpu(group[0])
    several = len(group) > 1
    rows: dict[tuple[int, int], str] = {}
    frameworks: dict[str, list[str]] = {}
    cells: dict[tuple[str, str], str] = {}
    for r in group:
        for c in r.cells:
            label = row_label(c, cpu)
            rows[(c.gpus, c.nodes)] = label
            fw = c.column
            head = f"{fw} {c.column_key}" if several else c.column_key
            frameworks.setdefault(fw, [])
            if head not in frameworks[fw]:
                frameworks[fw].append(head)
            cells[(label, head)] = text(c)
    labels = [rows[k] for k in sorted(rows)]
    return labels, list(frameworks.items()), cells  # type: ignore[return-value]


def _tables(group: Sequence[TableResult], text: Any, width: int | None) -> list[str]:
    """The group's grid as one markdown table, or (``width``) as several that each fit it."""
    labels, frameworks, cells = _grid(group, text)
    if not any(cells.values()):
        return []
    first = "workers" if is_cpu(group[0]) else "GPUs"

    def render(heads: list[str]) -> str:
        body = [[lab, *(cells.get((lab, h), "") for h in heads)] for lab in labels]
        body = [row for row in body if any(row[1:])]
        return tabulate(body, headers=[first, *heads], tablefmt="github", disable_numparse=True)

    if width is None:
        return [render([h for _, heads in frameworks for h in heads]), ""]
    def fits(heads: list[str]) -> bool:
        return max(map(_visible_len, render(heads).splitlines())) <= width

    out: list[str] = []
    chunk: list[str] = []
    for _, heads in frameworks:  # whole frameworks side by side while they fit; a wide one column by column
        if fits([*chunk, *heads]):
            chunk += heads
            continue
        if chunk:
            out += [render(chunk), ""]
            chunk = []
        for h in heads:
            if chunk and not fits([*chunk, h]):
                out += [render(chunk), ""]
                chunk = []
            chunk.append(h)
    return out + [render(chunk), ""]


def _visible_len(line: str) -> int:
    return len(re.sub(r"\x1b\[[0-9;]*m", "", line))


def _scaling_text(c: CellResult) -> str:
    if c.speedup is None:
        return f"published x{c.published_speedup}" if c.published_speedup else ""
    pub = f"; published x{c.published_speedup}" if c.published_speedup else ""
    return f"x{c.speedup:.2f} ({c.efficiency:.0%} of linear{pub})"


def notes(group: Sequence[TableResult]) -> list[str]:
    found = []
    for r in group:
        cpu = is_cpu(r)
        for c in r.cells:
            where = f"{c.target} {row_label(c, cpu).split(' (')[0]} {c.column_key}"
            if len(c.repeats) > 1:
                found.append(f"{where}: per-repeat values {', '.join(f'{v:.2f}' for v in c.repeats)}")
            if c.verdict not in (MATCH, MEASURED, REPRODUCED) and c.detail:
                found.append(f"{where}: {c.verdict}: {c.detail}")
            found += [f"{where}: log contradicts manifest: {f}" for f in c.flags]
        found += [f"non-monotonic scaling: {n}" for n in non_monotonic(r.cells, "workers" if cpu else "GPUs",
                                                                             r.manifest.unit)]
    return ["Notes:", "", *[f"- {n}" for n in found], ""] if found else []


def verdict_line(cells: Sequence[CellResult]) -> str:
    counts = Counter(c.verdict for c in cells)
    return "Verdict: " + ", ".join(f"{n} {v}" for v, n in counts.most_common()) + f" of {len(cells)} cells."


def _document(results: Sequence[TableResult], width: int | None, colour: bool) -> str:
    out: list[str] = []
    for group in groups(results):
        legend = ("Each cell: published → reproduced (delta) verdict." if group[0].table
                  else f"Each cell: measured {group[0].manifest.unit}.")
        out += [*_header(group), "", legend, ""]
        out += _tables(group, lambda c: cell_text(c, colour), width)
        scaling = _tables(group, _scaling_text, width)
        if scaling:
            out += ["Speedup over the base cell and scaling efficiency:", "", *scaling]
        out += notes(group)
        out += [verdict_line([c for r in group for c in r.cells]), ""]
    if width is not None:
        out = [_wrap(line, width) for line in out]
    return "\n".join(out).rstrip("\n") + "\n"


def _wrap(line: str, width: int) -> str:
    if line.startswith("|") or _visible_len(line) <= width:
        return line
    import textwrap

    indent = "  " if line.startswith("- ") else ""
    return "\n".join(textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False))


def render_markdown(results: Sequence[TableResult]) -> str:
    """Full width: one table per publication."""
    return _document(results, None, False)


def render_text(results: Sequence[TableResult], *, colour: bool = False, width: int = WIDTH) -> str:
    """For a terminal: tables split by framework to fit ``width``; verdicts coloured on request."""
    return _document(results, width, colour)


def _rel(paths: Sequence[str], bases: Iterable[Path]) -> str:
    """A cell's logs as one reference: the log, or the folder its repeats share, relative where possible."""
    if not paths:
        return ""
    ref = Path(paths[0]) if len(paths) == 1 else Path(os.path.commonpath(paths))
    if not ref.is_absolute():
        return ref.as_posix()
    for base in bases:
        try:
            return ref.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return ref.name


def records(results: Sequence[TableResult]) -> list[dict[str, Any]]:
    """Tidy long form: one record per (table, target, cell); the same columns in CSV and JSON. The framework
    and model are the manifest's words (one vocabulary, the manifest schema's); the published column heading
    is the text form's."""
    from repro.paths import data_root

    out = []
    for r in results:
        bases = [Path(r.source), data_root(), Path.cwd()]
        cpu = is_cpu(r)
        for c in r.cells:
            out.append({
                "table": r.table.id if r.table else None, "target": c.target,
                "framework": r.manifest.framework, "model": r.manifest.model,
                "kind": c.kind if c.verdict != NOT_RUN else None, "nodes": c.nodes, "gpus": c.gpus,
                "device": "CPU" if cpu else "GPU", "precision": c.precision, "batch_size": c.batch_size,
                "published": float(c.published) if c.published is not None else None,
                "reproduced": c.reproduced,
                "interval_low": c.low, "interval_high": c.high, "repeats": len(c.repeats),
                "spread_pct": c.spread_pct, "delta_pct": c.delta_pct, "verdict": c.verdict,
                "reason": c.detail,
                "unit": r.manifest.unit, "tolerance_pct": c.tolerance_pct,
                "tolerance_reason": c.tolerance_reason or None,
                "published_speedup": float(c.published_speedup) if c.published_speedup else None,
                "speedup": c.speedup, "efficiency": c.efficiency, "log": _rel(c.logs, bases) or None})
    return out


def render_json(results: Sequence[TableResult]) -> str:
    """JSON records (``pandas.read_json(..., orient="records")`` reads them back)."""
    return json.dumps(records(results), indent=1) + "\n"


#: what makes a spreadsheet read a cell as a formula (OWASP's CSV injection list)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A text cell a spreadsheet would evaluate, prefixed with ``'`` as OWASP recommends (numbers stay
    numbers: only text is touched); the raw value is the text after the ``'``."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def render_csv(results: Sequence[TableResult]) -> str:
    """The records as CSV (the standard library's writer: ``pandas.read_csv`` reads it back)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows({k: spreadsheet_safe(v) for k, v in rec.items()} for rec in records(results))
    return buf.getvalue()


def render_junit(results: Sequence[TableResult], fail_on: set[str] | None = None) -> str:
    """JUnit XML: a testsuite per publication, a testcase per cell; a counted verdict is a failure, a cell
    with nothing to judge (``not published``, or ``not run`` where ``fail_on`` does not count it) skipped."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="repro")
    for group in groups(results):
        name = group[0].table.id if group[0].table else group[0].manifest.id
        suite = ET.SubElement(root, "testsuite", name=name)
        cells = [(r, c) for r in group for c in r.cells]
        failures = skipped = 0
        for r, c in cells:
            case = ET.SubElement(suite, "testcase", classname=f"{name}.{c.target}",
                                 name=f"{row_label(c, is_cpu(r))} {c.precision} bs{c.batch_size}")
            if exit_code([c.verdict], fail_on):
                failures += 1
                why = c.detail or cell_text(c)
                fail = ET.SubElement(case, "failure", message=f"{c.verdict}: {why}"[:500], type=c.verdict)
                fail.text = cell_text(c) + (f"\n{c.detail}" if c.detail else "")
            elif c.verdict in (NOT_PUBLISHED, NOT_RUN):
                skipped += 1
                ET.SubElement(case, "skipped", message=f"{c.verdict}: {c.detail or cell_text(c)}"[:500])
            else:
                ET.SubElement(case, "system-out").text = cell_text(c)
        suite.set("tests", str(len(cells)))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
        suite.set("skipped", str(skipped))
    for total in ("tests", "failures", "skipped"):
        root.set(total, str(sum(int(s.get(total, 0)) for s in root)))
    ET.indent(root)
    return xml_safe('<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n")


#: characters XML 1.0 forbids (ElementTree writes them as they are, which makes the file unreadable)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """XML text without the characters XML forbids (control characters, lone surrogates, U+FFFE/U+FFFF);
    the markup holds none, so the whole serialised document may be cleaned at once."""
    return _NOT_XML.sub("", text)


RENDERERS = {"md": render_markdown, "json": render_json, "csv": render_csv}


def render_parse_text(out: dict[str, Any]) -> str:
    how = "detected" if out["detected"] else "given"
    lines = [f"{out['file']}: parser {out['parser']} ({how}), {out['lines']} lines"]
    if out["facts"]:
        lines.append("  log says: " + ", ".join(f"{k}={v}" for k, v in out["facts"].items()))
    for r in out["results"]:
        unit = out.get("unit", "images/s")
        figure = f"{fmt(r['throughput'])} {unit}" if r["throughput"] is not None else "no figure"
        own = f" (log's own summary: {r['summary']})" if r["summary"] is not None else ""
        lines.append(f"  {r['gpus'] or '?'} GPU(s): {figure} from {r['records_used']} of {r['records']} "
                     f"records{own}")
    lines += [f"  issue: {i}" for i in out["issues"]]
    return "\n".join(lines)
