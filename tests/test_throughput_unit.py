"""The throughput unit comes from the manifest (measure.unit) and the parser, never from the verdict code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import ROOT, run_cli
from repro.errors import InputError
from repro.spec.manifest import find_target, load_manifest, manifest_files


def test_a_target_without_measure_unit_counts_images() -> None:
    assert find_target("dlperf-tf2-rn50-v100").unit == "images/s"


def test_every_published_table_is_in_its_targets_unit() -> None:
    for f in manifest_files():
        m = load_manifest(f)
        assert all(t.unit == m.unit for t in m.published), m.id


def test_a_table_in_another_unit_than_the_target_is_refused(tmp_path: Path) -> None:
    text = (ROOT / "manifests" / "dlperf-oneflow-bert-v100.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "dlperf-oneflow-bert-v100.yaml"
    bad.write_text(text.replace("  unit: sentences/s\n  protocol:", "  protocol:"), encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_manifest(bad)
    message = str(err.value)
    assert "published[0].unit" in message and "'sentences/s' is not the target's unit 'images/s'" in message


def test_the_report_of_a_sentences_target_says_sentences() -> None:
    res = run_cli("report", "dlperf-oneflow-bert-v100", "--format", "json")
    assert res.returncode == 8, res.stderr  # every cell not run: the kit bundles no log of DLPerf's
    records = json.loads(res.stdout)
    assert records and {r["unit"] for r in records} == {"sentences/s"}
    assert {r["model"] for r in records} == {"bert-base"}
    assert {r["verdict"] for r in records} == {"not run"}
    md = run_cli("report", "dlperf-oneflow-bert-v100")
    assert "(sentences/s)" in md.stdout and "images/s" not in md.stdout
