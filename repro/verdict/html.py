"""Render compared tables as one self-contained HTML page.

Citations, tables with verdict colours, the chart (embedded), environment and deviations from the
published hardware, links to the logs. Every text from a manifest, log or record is escaped, with
secrets blanked and control characters removed; the only absolute links are http(s) URLs.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from repro.redact import shown
from repro.verdict.chart import plot_report
from repro.verdict.report import (
    BAD,
    GOOD,
    UNSURE,
    fmt,
    groups,
    kind_text,
    notes,
    protocol_text,
    records,
    verdict_line,
)
from repro.verdict.reproduce import CellResult, TableResult
from repro.verdict.rules import REDERIVATION, Check, exit_code

HTML_COLOUR = {**{v: "#d8f0d8" for v in GOOD}, **{v: "#f8d0d0" for v in BAD},
               **{v: "#fbeec2" for v in UNSURE}}
HTML_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#1a202c}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #cbd5e0;padding:3px 8px;text-align:right}th{background:#edf2f7}
td.l,th.l{text-align:left}img{max-width:100%}code{background:#f4f4f4;padding:0 3px}
"""
CELL_HEADS = ("target", "framework", "model", "cell", "published", "reproduced", "interval", "repeats",
              "delta %", "verdict", "reason", "log")
CHECK_HEADS = ("check", "status", "published", "observed", "detail")


def render_html(results: Sequence[TableResult], *, environment: Sequence[Check] = (),
                fail_on: set[str] | None = None, chart: bytes | None = None) -> str:
    """One self-contained page: citations, tables with verdict colours, the chart (embedded),
    environment and deviations from the published hardware, links to the logs. ``chart``: the PNG of a
    one-publication page's chart where it is drawn already (a run's report.png), not drawn again."""
    names = ", ".join(g[0].table.id if g[0].table else g[0].manifest.id for g in groups(results))
    parts = [(f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(names)}: repro report</title>"
              f"<style>{HTML_STYLE}</style></head><body>")]
    found = groups(results)
    for group in found:
        parts += _group_html(group, chart if len(found) == 1 else None)
    if environment:
        parts += _environment_html(environment)
    code = exit_code((c.verdict for r in results for c in r.cells), fail_on)
    parts.append(f"<p>Exit status of this report: {code}.</p></body></html>")
    return "\n".join(parts) + "\n"


def _e(text: Any) -> str:
    """Every text from a manifest, log or record: secrets blanked, control characters removed, escaped."""
    return html.escape(shown(str(text)))


def _group_html(group: Sequence[TableResult], chart: bytes | None = None) -> list[str]:
    """One publication (or one measured-only target): citation, protocols, cells, notes, chart."""
    parts = _citation_html(group)
    parts.append("<ul>" + "".join(f"<li><code>{_e(protocol_text(r))}</code></li>" for r in group) + "</ul>")
    parts.append(_cells_html(group))
    parts.append(f"<p>{_e(verdict_line([c for r in group for c in r.cells]))}</p>")
    found = notes(group)[2:]
    if found:
        parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_e(n[2:])}</li>" for n in found if n) + "</ul>")
    parts.append(_chart_html(group, chart))
    return parts


def _citation_html(group: Sequence[TableResult]) -> list[str]:
    t = group[0].table
    if not t:
        return [(f"<h1>{_e(group[0].manifest.id)}: {_e(group[0].manifest.title)}</h1>"
                 "<p>Measured only: this target reproduces no publication.</p>")]
    cite = t.cite
    url = (f"{cite['repository']}/blob/{cite['commit']}/{cite['path']}"
           if _is_web(cite["repository"]) and "github.com" in cite["repository"] else "")
    return [f"<h1>{_e(t.id)}: {_e(cite['title'])}</h1><p>Published in "
            + (f"<a href='{_e(url)}'>{_e(cite['repository'])}</a>" if url else _e(cite["repository"]))
            + f" @ <code>{_e(cite['commit'][:12])}</code> <code>{_e(cite['path'])}</code>"
            + f" ({_e(t.unit)}).</p>",
            f"<p>{_e(kind_text(group))}</p>"]


def _cells_html(group: Sequence[TableResult]) -> str:
    """The group's cells as one table, a row per cell in the verdict's colour."""
    rows = [_cell_row(rec, c, _log_href(rec["log"], r) if rec["log"] else "")
            for rec, (r, c) in zip(records(group), ((r, c) for r in group for c in r.cells))]
    return ("<table><tr>" + "".join(f"<th class=l>{h}</th>" for h in CELL_HEADS) + "</tr>" + "".join(rows)
            + "</table>")


def _cell_row(rec: dict[str, Any], c: CellResult, href: str) -> str:
    interval = (f"{rec['interval_low']:.2f} .. {rec['interval_high']:.2f}"
                if rec["interval_low"] is not None else "")
    unit = "worker" if rec["device"] == "CPU" else "GPU"
    log = rec["log"]
    delta = "" if rec["delta_pct"] is None else f"{rec['delta_pct']:+.2f}"
    link = f"<a href='{_e(href)}'>{_e(Path(log).name)}</a>" if log else ""
    digits = (2 if rec["kind"] != REDERIVATION or c.published is None
              else len(c.published.partition(".")[2]) + 1)
    reproduced = fmt(rec["reproduced"], digits) if rec["reproduced"] is not None else ""
    published = "" if rec["published"] is None else rec["published"]
    return (f"<tr style='background:{HTML_COLOUR.get(rec['verdict'], '#fff')}'>"
            f"<td class=l>{_e(rec['target'])}</td><td class=l>{_e(rec['framework'])}</td>"
            f"<td class=l>{_e(rec['model'])}</td>"
            f"<td class=l>{rec['gpus']} {unit}{'s' if rec['gpus'] > 1 else ''}, {rec['nodes']} node(s), "
            f"{_e(rec['precision'])} bs{rec['batch_size']}</td><td>{published}</td><td>{reproduced}</td>"
            f"<td>{interval}</td><td>{rec['repeats']}</td><td>{delta}</td>"
            f"<td class=l><b>{_e(rec['verdict'])}</b></td><td class=l>{_e(rec['reason'] or '')}</td>"
            f"<td class=l>{link}</td></tr>")


def _environment_html(environment: Sequence[Check]) -> list[str]:
    """The environment checks as a table, each row coloured by its status."""
    parts = ["<h2>Environment and deviations from the published hardware</h2><table><tr>"
             + "".join(f"<th class=l>{h}</th>" for h in CHECK_HEADS) + "</tr>"]
    for ch in environment:
        colour = {"ok": "#d8f0d8", "drift": "#f8d0d0"}.get(ch.status, "#fbeec2")
        values = (ch.item, ch.status, ch.expected, ch.observed, ch.detail)
        cells = "".join(f"<td class=l>{_e(str(v))}</td>" for v in values)
        parts.append(f"<tr style='background:{colour}'>{cells}</tr>")
    parts.append("</table>")
    return parts


def _is_web(url: str) -> bool:
    """An http(s) URL with a host: the only kind of absolute link the page holds."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _log_href(log: str, r: TableResult) -> str:
    """Where a cell's log opens from the page, wherever the page is read. A publication's log the kit
    bundles (``logs/published/<set>@<commit>/<group>/<path in the repository>``, in a checkout or an installed
    kit's ``repro/_data``) is its file in the cited repository at that commit; any other log (a run's,
    inside its run directory or archive, where the run's own report.html sits) a link relative to that
    directory."""
    from urllib.parse import quote, urlsplit

    from repro.paths import data_root

    parts = PurePosixPath(log).parts
    if r.table is not None and len(parts) > 4 and parts[:2] == ("logs", "published"):
        repo = r.table.cite["repository"].rstrip("/")
        name, _, short = parts[2].partition("@")
        owner_repo = urlsplit(repo).path.strip("/").split("/")
        if (_is_web(repo) and urlsplit(repo).netloc == "github.com" and len(owner_repo) == 2
                and name in ("-".join(owner_repo), owner_repo[1]) and re.fullmatch("[0-9a-f]{7,40}", short)):
            commit = r.table.cite["commit"] if r.table.cite["commit"].startswith(short) else short
            kind = "tree" if (data_root() / log).is_dir() else "blob"
            return f"{repo}/{kind}/{commit}/{quote('/'.join(parts[4:]))}"
    return _relative_href(log)


def _relative_href(path: str) -> str:
    """A log's path as a relative link, percent-encoded: a file named ``javascript:...`` stays a file."""
    from urllib.parse import quote

    return quote(path.lstrip("/"), safe="/")


def _chart_html(group: Sequence[TableResult], png: bytes | None = None) -> str:
    """The group's chart as an embedded image; a chart that cannot be drawn is said so on the page."""
    if png is None:
        buf = io.BytesIO()
        try:
            plot_report(group, buf)
        except Exception as err:  # noqa: BLE001 - matplotlib raises many kinds; the page matters more
            return f"<p>The chart could not be drawn: {html.escape(shown(str(err)))}</p>"
        png = buf.getvalue()
    data = base64.b64encode(png).decode()
    return f"<img alt='published vs reproduced' src='data:image/png;base64,{data}'>"
