"""``repro show``: a manifest as a person reads it."""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Mapping
from typing import Any

from repro.spec.manifest import Manifest
from repro.redact import redact_argv, redact_env


def rdma_summary(m: Manifest) -> str:
    r = m.rdma
    if r is None:
        return "none"
    if r.strategy == "image":
        return "image (the base image's own MOFED user space; nothing installed)"
    if r.strategy == "inbox":
        return "inbox (the distribution's rdma-core)"
    os_ = m.image.get("build", {}).get("base", {}).get("os", "?")
    return (f"mlnx-ofed {r.version} for {os_}, user space only, mlnxofedinstall {' '.join(r.flags)}; sha256 "
            + (r.sha256 or "recorded by repro lock"))


def _flow(obj: object) -> str:
    """A value in YAML flow terms, as the manifest writes it (``{gpus: 8}``, not ``{'gpus': 8}``)."""
    import json

    import yaml

    if isinstance(obj, str) and (obj != obj.strip() or "\n" in obj or "\t" in obj):
        return json.dumps(obj, ensure_ascii=False)  # a YAML double-quoted scalar, one line
    text = yaml.safe_dump(obj, default_flow_style=True, sort_keys=False, width=10**6,
                          allow_unicode=True).strip()
    return text.removesuffix("\n...").strip()  # a lone scalar ends with YAML's document-end marker


def describe_manifest(m: Manifest) -> str:
    lines = [f"{m.id}: {m.title}", f"  file: {m.path}", f"  sha256: {m.sha256}",
             f"  framework: {m.framework}, model: {m.model}"]
    if "registry" in m.image:
        pinned = "pinned" if m.image["registry"]["digest"] else "NOT pinned: run `repro lock`"
        lines.append(f"  image: {m.image_reference} ({pinned})")
    else:
        b = m.image["build"]
        base = b["base"]["ref"] + (f"@{b['base']['digest']}" if b["base"]["digest"] else " (base not pinned)")
        lines.append(f"  image: built from dockerfiles/{b['dockerfile']} as {b['tag']}, FROM {base}")
        if b["base"].get("os") or b["base"].get("published"):
            lines.append(f"    base OS {b['base'].get('os', '(not declared)')}, tag published "
                         f"{b['base'].get('published', '(not recorded)')}")
        if b.get("env"):
            lines.append("    image env (the upstream Dockerfile's): "
                         + " ".join(f"{k}={v}" for k, v in redact_env(b["env"]).items()))
    if m.source:
        lines.append(f"  source: {m.source['repository']} @ {m.source['commit']} -> {m.source['path']}")
        for p in m.source.get("patches", []):
            lines += [f"    patch {p['file']}: {p['why']}", f"      {_flow(p['old'])} -> {_flow(p['new'])}"]
    lines.append(f"  rdma: {rdma_summary(m)}")
    lines.append(f"  launch ({m.launch.kind}): {shlex.join(redact_argv(m.launch.command))}")
    for prec, toks in m.launch.precision_args.items():
        lines.append(f"    {{precision_args}} for {prec}: {shlex.join(redact_argv(toks)) or '(none)'}")
    for when, toks in m.launch.cell_args:
        lines.append(f"    {{cell_args}} when {_flow(dict(when))}: {shlex.join(redact_argv(toks))}")
    for when, env in m.launch.cell_env:
        lines.append(f"    env when {_flow(dict(when))}: "
                     + " ".join(f"{k}={v}" for k, v in sorted(redact_env(env).items())))
    if m.launch.env:
        lines.append("    env: " + " ".join(f"{k}={v}" for k, v in sorted(redact_env(m.launch.env).items())))
    cells = m.cells()
    lines.append(f"  matrix: {len(cells)} cells x {m.repeats} repeats: {', '.join(c.key for c in cells)}")
    lines.append(f"  measure: parser {m.measure.parser}, protocol {_flow(dict(m.measure.protocol))}")
    lines += [f"    when {_flow(dict(w))}: {_flow(dict(p))}" for w, p in m.measure.overrides]
    if m.measure.repeats:
        lines.append(f"    repeats: {_flow(dict(m.measure.repeats))}")
    if m.measure.speedup:
        lines.append(f"    speedup: {_flow(dict(m.measure.speedup))}")
    for t in m.published:
        c = t.cite
        lines.append(f"  published {t.id}: {c['title']}")
        lines.append(f"    {c['repository']} @ {c['commit']} {c['path']} (tolerance {t.tolerance_pct}%)")
        for cell in t.cells:
            log = (f"  log: {cell.logs[0].name}" + (f" (+{len(cell.logs) - 1})" if len(cell.logs) > 1 else "")
                   if cell.logs else "")
            sp = f", speedup {cell.speedup}" if cell.speedup else ""
            lines.append(f"    {cell.nodes}n {cell.gpus} GPU {cell.precision} bs{cell.batch_size}: "
                         f"{cell.value} {t.unit}{sp}{log}")
    if m.expect:
        lines.append("  expect: " + ", ".join(f"{k}={v}" for k, v in m.expect.items()))
    lines += [f"  note: {n}" for n in m.notes]
    return "\n".join(lines) + "\n"


def target_rows(catalog: Mapping[str, Manifest]) -> list[dict[str, Any]]:
    """One row per target: id, framework, cells, the tables it reproduces and where each is published."""
    def cite(t: Any) -> str:
        return (f"{t.cite['repository'].removeprefix('https://github.com/')}@{t.cite['commit'][:7]} "
                f"{t.cite['path']}")

    return [{"id": m.id, "framework": m.framework, "cells": len(m.cells()),
             "tables": ", ".join(t.id for t in m.published) or "-",
             "published": ", ".join(cite(t) for t in m.published) or "(none: measures only)"}
            for m in catalog.values()]


def render_targets(catalog: Mapping[str, Manifest], *, wide: bool = False) -> str:
    """``repro list``: the targets (a line each, citations indented under it, 120 columns unless ``wide``),
    then every published table and the targets that reproduce it."""
    from tabulate import tabulate

    from repro.fit import fit_line

    rows = target_rows(catalog)
    if wide:
        out = [tabulate(rows, headers="keys", tablefmt="simple")]
    else:
        w = max(len(r["id"]) for r in rows) + 2
        out = [f"{'id':<{w}}{'framework':<12}{'cells':>5}  tables (indented: where each is published)",
               f"{'-' * (w - 2)}  {'-' * 10}  {'-' * 5}  {'-' * 50}"]
        for r in rows:
            out.append(fit_line(f"{r['id']:<{w}}{r['framework']:<12}{r['cells']:>5}  {r['tables']}"))
            out += [fit_line(f"    {c}") for c in r["published"].split(", ")]
    tables: dict[str, list[str]] = {}
    for m in catalog.values():
        for t in m.published:
            tables.setdefault(t.id, []).append(m.id)
    room = 120 - 2 - max(map(len, tables), default=0)

    def targets(ids: list[str]) -> str:  # wrapped between ids, never inside one
        joined = ", ".join(ids)
        return joined if wide else "\n".join(textwrap.wrap(joined, room, break_on_hyphens=False))

    out += ["\npublished tables (`repro report TABLE` re-derives a whole table; `repro report TARGET` one "
            "column):",
            tabulate([{"table": t, "targets": targets(ids)} for t, ids in sorted(tables.items())],
                     headers="keys", tablefmt="simple")]
    return "\n".join(out)
