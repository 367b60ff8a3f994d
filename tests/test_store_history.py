"""`repro history`'s text reads only each cell's latest runs (Store.history_latest): the same text as reading
every row (Store.history, then group), whatever the order the runs were recorded in, their ties, gaps and
filters.

The runs are a sealed run of the target as the provenance tests make it (its cells judged on the
publisher's own logs), recorded again and again with each figure scaled by a seeded factor and judged
again as the kit judges; some runs lack cells, have no figure, another published figure, another target of
the same table, or were recorded again (their old record replaced).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_provenance import make_run

from repro.record import snapshot
from repro.record.history import PUBLISHED, RUN_NO, STARTED, VALUE, group, latest, render_text
from repro.record.store import Snapshot, open_store
from repro.verdict.rules import estimate, judge_new_run

TARGET = "ngc-pytorch-rn50-v100"
ROOT = Path(__file__).resolve().parent.parent
TABLE = "perf-2.5-v100"


def _cell(c: dict, f: float, rng: random.Random) -> dict:
    repeats = [v * f for v in c["repeats"]]
    est = estimate(c["value"] * f, repeats)
    published = float(c["published"]) * (1.05 if rng.random() < 0.1 else 1.0)  # a corrected publication
    verdict, reason = judge_new_run(est, published, c["tolerance_pct"])
    out = {**c, "value": est.value, "repeats": repeats, "low": est.low, "high": est.high,
           "delta_pct": (est.value - published) / published * 100, "verdict": verdict, "reason": reason,
           "published": f"{published:g}"}
    if rng.random() < 0.1:  # a cell without a figure of its own
        out.update(value=None, low=None, high=None, delta_pct=None)
    if rng.random() < 0.1:  # another target of the same table
        out["target"] = "other-rn50-v100"
    return out


def _runs(first: Snapshot, n: int, seed: int) -> list[Snapshot]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        cells = [_cell(c, rng.uniform(0.9, 1.1), rng) for c in first.cells if rng.random() < 0.85]
        day, hour = rng.randint(1, 9), rng.choice((0, 12))  # many runs start at the same time
        out.append(replace(first, digest=f"test:{i}", run_id=f"run-{rng.randint(0, n // 2)}", cells=cells,
                           cluster=rng.choice(("lab-a", "lab-b")), started=f"2026-10-0{day}T{hour:02d}:00:00Z"))
    return out


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history")
    first = snapshot.of_path(make_run(root / "run").path)
    path = root / "results.sqlite"
    store = open_store(path)
    for snap in _runs(first, 120, seed=29):  # run ids repeat: a run recorded again replaces its old record
        store.record(snap, now="2026-11-26T00:00:00Z")
    store.close()
    return path


@pytest.mark.parametrize("name", [TARGET, TABLE, "other-rn50-v100", "nothing"])
@pytest.mark.parametrize(("cluster", "since"), [(None, None), ("lab-a", None), (None, "2026-10-05T00:00:00Z"),
                                                ("lab-b", "2026-10-03T12:00:00Z")])
def test_the_latest_runs_give_the_text_of_every_run(store_path: Path, name: str, cluster: str | None,
                                                    since: str | None) -> None:
    store = open_store(store_path, create=False)
    every = group(store.history(name, cluster=cluster, since=since))
    assert (name == "nothing") == (not every)
    for last in (1, 3, 20, 500):
        fast = latest(store.history_latest(name, last, cluster=cluster, since=since))
        assert [(h.table, h.target, h.cell, h.title, h.published, h.unit) for h in fast] == \
            [(h.table, h.target, h.cell, h.title, h.published, h.unit) for h in every]
        assert [h.runs for h in fast] == [h.runs[-last:] for h in every]
        assert render_text(fast, last) == render_text(every, last)
    store.close()


def test_the_store_holds_what_the_comparison_needs(store_path: Path) -> None:
    """The runs above exercise what they should: gaps, missing figures, ties, several targets, replaced runs."""
    store = open_store(store_path, create=False)
    every = group(store.history(TABLE))
    store.close()
    assert {h.target for h in every} == {TARGET, "other-rn50-v100"}
    runs = [r for h in every for r in h.runs]
    assert any(r[VALUE] is None for r in runs)
    assert any(len({r[PUBLISHED] for r in h.runs}) > 1 for h in every)  # the title's figure: the first row's
    assert len({r[STARTED] for r in runs}) < len({r[RUN_NO] for r in runs})  # runs started at the same time
    assert len({r[RUN_NO] for r in runs}) < 120  # runs recorded again replaced their old record
    assert len({len(h.runs) for h in every}) > 1  # cells missing from some runs


def test_the_text_imports_no_heavy_module(store_path: Path) -> None:
    """`repro history TARGET` (the text) in a process of its own: the store and the text, not the chart's
    matplotlib, the site's docker and SSH, the manifests' YAML and schemas, nor the other verbs."""
    code = ("import json, sys\nfrom repro.cli import cli\n"
            f"cli(['history', {TARGET!r}, '--results', {str(store_path)!r}], standalone_mode=False)\n"
            "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "repro.cli.history" in loaded and "repro.record.store" in loaded
    heavy = {"matplotlib", "numpy", "docker", "paramiko", "jsonschema", "yaml", "tabulate", "repro.verdict",
             "repro.measure", "repro.spec", "repro.run", "repro.cli.site", "repro.cli.tables", "repro.cli.explain"}
    assert {m for m in loaded if m.split(".")[0] in heavy or ".".join(m.split(".")[:2]) in heavy} == set()
