"""Manifests: the shipped catalog, matrix expansion, hashing, and the schema/registry meta-tests."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from cli_helpers import run_cli

from repro import paths
from repro.errors import UsageError
from repro.run.launchers import LAUNCHERS
from repro.spec.manifest import Cell, Measure, PublishedCell, canonical_sha256, find_target, load_catalog, \
    load_manifest, manifest_files
from repro.spec.schema import load_schema

REPO = Path(__file__).resolve().parents[1]
GOOD = Path(__file__).resolve().parent / "data" / "good"
DLPERF = "dlperf-ngc-pytorch-rn50-v100"


def shipped() -> list[tuple[Path, dict]]:
    """Each shipped manifest and its data, read by libyaml (the kit's own reading is what the tests check)."""
    return [(f, yaml.load(f.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)) for f in manifest_files()]


def shipped_ids() -> list[str]:
    return [doc["id"] for _, doc in shipped()]


# --- the shipped catalog -----------------------------------------------------------------------------------


def test_manifests_dir_is_the_checkout() -> None:
    assert paths.manifests_dir() == REPO / "manifests"
    assert manifest_files() == sorted((REPO / "manifests").glob("*.yaml"))
    assert manifest_files(), "no shipped manifests"


def test_every_shipped_manifest_validates() -> None:
    catalog = load_catalog(manifest_files())
    assert sorted(catalog) == sorted(shipped_ids())
    for m in catalog.values():
        assert m.cells(), f"{m.id}: empty matrix"


def test_shipped_ids_are_unique() -> None:
    ids = shipped_ids()
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_repro_list_shows_every_shipped_id() -> None:
    text = run_cli("list", cwd=REPO)
    assert text.returncode == 0, text.stderr
    targets, _, tables = text.stdout.partition("\n\n")
    listed = [ln.split()[0] for ln in targets.splitlines()[2:] if ln.strip() and not ln.startswith(" ")]  # citations
    assert all(ln.startswith("    ") for ln in targets.splitlines()[2:] if ln.split()[0] not in listed)  # are indented
    assert "perf-2.5-v100 " in tables  # the published tables `repro report` takes, after the targets
    assert sorted(listed) == sorted(shipped_ids())
    as_json = run_cli("list", "--format", "json", cwd=REPO)
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert sorted(r["id"] for r in rows) == sorted(shipped_ids())
    assert {r["id"] for r in rows if "perf-2.5-a100" in r["tables"].split(", ")} == {
        "paddle-rn50-a100", "ngc-tf1-rn50-a100", "ngc-pytorch-rn50-a100", "ngc-mxnet-rn50-a100"}
    dlperf = next(r for r in rows if r["id"] == DLPERF)
    assert dlperf == {"id": DLPERF, "framework": "pytorch", "cells": 10,
                      "tables": "dlperf-ngc-pytorch-v1, dlperf-v1-rn50-fp32, dlperf-v1-rn50-amp",
                      "published": "Oneflow-Inc/DLPerf@c89430b NVIDIADeepLearningExamples/PyTorch/resnet50v1.5/README.md, "
                                   "Oneflow-Inc/DLPerf@c89430b README.md, Oneflow-Inc/DLPerf@c89430b README.md"}
    summary = {r["id"] for r in rows if "dlperf-v1-rn50-fp32" in r["tables"].split(", ")}
    assert len(summary) == 8  # DLPerf's ResNet-50 summary: every row with a target, FP32 in one table


def test_every_shipped_parser_is_registered() -> None:
    from repro.measure.parsers import PARSERS

    names = PARSERS.names()
    for f, doc in shipped():
        parser = doc["measure"]["parser"]
        assert parser in names, f"{f.name}: parser {parser!r} not in {names}"


def test_every_published_cell_is_a_matrix_cell() -> None:
    for m in load_catalog(manifest_files()).values():
        runs = {(c.nodes, c.gpus, c.precision, c.batch_size) for c in m.cells()}
        for t in m.published:
            for c in t.cells:
                assert (c.nodes, c.gpus, c.precision, c.batch_size) in runs, f"{m.id} {t.id}: {c} is never run"


# --- schema meta-tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["manifest.v1", "hosts.v1"])
def test_schema_is_a_valid_json_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(load_schema(name))


def test_launch_kinds_in_schema_are_the_registered_launchers() -> None:
    kinds = load_schema("manifest.v1")["$defs"]["launch"]["properties"]["kind"]["enum"]
    assert sorted(kinds) == LAUNCHERS.names()


def test_precisions_agree_everywhere() -> None:
    defs = load_schema("manifest.v1")["$defs"]
    precisions = defs["precision"]["enum"]
    assert defs["matrix"]["properties"]["precision"]["items"] == {"$ref": "#/$defs/precision"}
    assert defs["cell_filter"]["properties"]["precision"] == {"$ref": "#/$defs/precision"}
    assert defs["launch"]["properties"]["precision_args"]["propertyNames"] == {"$ref": "#/$defs/precision"}
    assert len(precisions) == len(set(precisions))


# --- the DLPerf target -------------------------------------------------------------------------------------


def test_dlperf_cells_after_excludes() -> None:
    m = find_target(DLPERF)
    assert [c.key for c in m.cells()] == [
        "1n1g-fp32-bs128", "1n1g-amp-bs256", "1n4g-fp32-bs128", "1n4g-amp-bs256", "1n8g-fp32-bs128",
        "1n8g-amp-bs256", "2n8g-fp32-bs128", "2n8g-amp-bs256", "4n8g-fp32-bs128", "4n8g-amp-bs256"]
    assert [c.gpus for c in m.cells()] == [1, 1, 4, 4, 8, 8, 16, 16, 32, 32]
    assert (m.repeats, m.retries) == (5, 1)


def test_excludes_remove_exactly_what_they_match() -> None:
    m = find_target(DLPERF)
    kept = set(m.cells())
    full = {Cell(n, g, p, b) for n in (1, 2, 4) for g in (1, 4, 8) for p in ("fp32", "amp") for b in (128, 256)}
    assert len(full) == 36
    dropped = full - kept
    for c in dropped:
        assert any(c.matches(x) for x in m.matrix["exclude"]), c
    for c in kept:
        assert not any(c.matches(x) for x in m.matrix["exclude"]), c
    assert not any(c.nodes > 1 and c.gpus_per_node < 8 for c in kept)
    assert {(c.precision, c.batch_size) for c in kept} == {("fp32", 128), ("amp", 256)}


def test_dlperf_published_cells_are_matrix_cells() -> None:
    m = find_target(DLPERF)
    table = m.table()
    assert table.id == "dlperf-ngc-pytorch-v1" and m.table("dlperf-ngc-pytorch-v1") is table
    published = {(c.nodes, c.gpus, c.precision, c.batch_size) for c in table.cells}
    assert published == {(c.nodes, c.gpus, c.precision, c.batch_size) for c in m.cells()}
    four = next(c for c in table.cells if c.nodes == 4 and c.precision == "amp")
    assert (four.value, four.decimals, four.speedup, four.tolerance_pct) == ("22551.16", 2, "28.09", 3)
    assert four.repeats == ("22978.13", "22053.98", "22551.16", "23049.75", "22364.13")
    with pytest.raises(UsageError, match="no published table 'nope'; it has: dlperf-ngc-pytorch-v1, dlperf-v1-rn50"):
        m.table("nope")


def test_find_target_by_id_and_by_path() -> None:
    by_id = find_target(DLPERF)
    by_path = find_target(str(REPO / "manifests" / f"{DLPERF}.yaml"))
    assert by_id.id == by_path.id == DLPERF and by_id.sha256 == by_path.sha256
    with pytest.raises(UsageError, match="unknown target 'dlperf-ngc-pytorch-rn50-v10'") as e:
        find_target("dlperf-ngc-pytorch-rn50-v10")
    assert "did you mean dlperf-ngc-pytorch-rn50-v100" in (e.value.hint or "")


# --- building a manifest -----------------------------------------------------------------------------------


def test_minimal_manifest_is_built() -> None:
    m = load_manifest(GOOD / "minimal.yaml")
    assert m.launch.kind == "torch" and m.launch.master_port == 29500 and m.launch.timeout_s == 3600
    assert m.launch.precision_args == {"fp32": (), "amp": ("--amp", "--static-loss-scale", "256")}
    assert [c.key for c in m.cells()] == ["1n1g-fp32-bs256", "1n1g-amp-bs256", "1n8g-fp32-bs256", "1n8g-amp-bs256"]
    table = m.table()
    assert table.logs_dir == REPO / "logs/published/PaddlePaddle-Perf@c1ad14b/ngc-pytorch/ResNet50V1.5/OtherReports/PyTorch/logs/V100-LOG"
    for c in table.cells:
        assert len(c.logs) == 1 and c.logs[0].is_file(), c
        assert c.tolerance_pct == 3  # inherited from the table
    assert [c.decimals for c in table.cells] == [3, 2, 3, 2]


# --- sha256 ------------------------------------------------------------------------------------------------


def test_sha256_is_stable_across_loads() -> None:
    a, b = load_manifest(GOOD / "minimal.yaml"), load_manifest(GOOD / "minimal.yaml")
    assert a.sha256 == b.sha256
    assert len(a.sha256) == 64 and int(a.sha256, 16) >= 0
    assert a.sha256 == canonical_sha256(yaml.safe_load((GOOD / "minimal.yaml").read_text(encoding="utf-8")))
    assert find_target(DLPERF).sha256 == find_target(DLPERF).sha256


def test_sha256_ignores_comments_and_layout(tmp_path: Path) -> None:
    text = (GOOD / "minimal.yaml").read_text(encoding="utf-8")
    f = tmp_path / "m.yaml"
    assert "\nframework: pytorch\n" in text
    f.write_text("# a new comment\n" + text.replace("\nframework: pytorch\n", "\nframework:   pytorch  # inline\n"))
    assert load_manifest(f).sha256 == load_manifest(GOOD / "minimal.yaml").sha256


@pytest.mark.parametrize(("old", "new"), [
    ('value: "370.194"', 'value: "370.195"'),
    ('value: "370.194"', 'value: "370.1940"'),  # same number, different printed precision
    ("batch_size: [256]", "batch_size: [256, 128]"),
    ('amp: [--amp, --static-loss-scale, "256"]', 'amp: [--amp, --static-loss-scale, "128"]'),
])
def test_sha256_changes_when_a_value_changes(tmp_path: Path, old: str, new: str) -> None:
    text = (GOOD / "minimal.yaml").read_text(encoding="utf-8")
    assert old in text
    f = tmp_path / "m.yaml"
    f.write_text(text.replace(old, new, 1))
    assert load_manifest(f).sha256 != load_manifest(GOOD / "minimal.yaml").sha256


# --- protocol overrides ------------------------------------------------------------------------------------


def test_protocol_for_merges_matching_overrides_in_order() -> None:
    measure = Measure(
        parser="ngc-pytorch",
        protocol={"skip": {"from_iteration": 25}, "window": 100, "aggregate": "mean"},
        overrides=(
            ({"gpus": 1}, {"window": 50, "min_records": 40}),
            ({"precision": "amp"}, {"window": 80, "aggregate": "median"}),
            ({"nodes": 4}, {"skip": {"records": 10}, "scale": "per_gpu"}),
        ),
    )
    assert measure.protocol_for(Cell(1, 8, "fp32", 128)) == {
        "skip": {"from_iteration": 25}, "window": 100, "aggregate": "mean"}
    assert measure.protocol_for(Cell(1, 1, "fp32", 128)) == {
        "skip": {"from_iteration": 25}, "window": 50, "aggregate": "mean", "min_records": 40}
    # both match: the later override wins where they overlap
    assert measure.protocol_for(Cell(1, 1, "amp", 256)) == {
        "skip": {"from_iteration": 25}, "window": 80, "aggregate": "median", "min_records": 40}
    # a key is replaced whole: skip never ends up with both records and from_iteration
    assert measure.protocol_for(Cell(4, 8, "amp", 256)) == {
        "skip": {"records": 10}, "window": 80, "aggregate": "median", "scale": "per_gpu"}
    # published cells match on the same keys (gpus_per_node derived from gpus / nodes)
    pc = PublishedCell(nodes=1, gpus=1, precision="amp", batch_size=256, value="790.033", tolerance_pct=3)
    assert measure.protocol_for(pc) == measure.protocol_for(Cell(1, 1, "amp", 256))
    assert measure.protocol == {"skip": {"from_iteration": 25}, "window": 100, "aggregate": "mean"}, "not mutated"


def test_protocol_overrides_from_a_manifest(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text((GOOD / "minimal.yaml").read_text(encoding="utf-8").replace(
        "  protocol: {skip: {records: 5}, aggregate: mean}\n",
        "  protocol: {skip: {records: 5}, aggregate: mean}\n"
        "  overrides:\n"
        "    - {when: {gpus: 8}, protocol: {window: 100}}\n"
        "    - {when: {gpus: 8, precision: amp}, protocol: {skip: {from_iteration: 20}}}\n"))
    m = load_manifest(f)
    assert m.measure.protocol_for(Cell(1, 1, "amp", 256)) == {"skip": {"records": 5}, "aggregate": "mean"}
    assert m.measure.protocol_for(Cell(1, 8, "fp32", 256)) == {"skip": {"records": 5}, "aggregate": "mean",
                                                                "window": 100}
    assert m.measure.protocol_for(Cell(1, 8, "amp", 256)) == {"skip": {"from_iteration": 20}, "aggregate": "mean",
                                                               "window": 100}


def test_cells_the_publication_ran_on_other_machines_are_held_against_those() -> None:
    """Perf's 1/8-GPU cells ran on CentOS 7.5 with driver 525.60.11, its 32-GPU cells on CentOS 6.3 with
    450.80.02 (the report's hardware section): a run of the 4-node cells is held against the second."""
    from repro.nodes.facts import Gpu
    from repro.nodes.preflight import NodeReport, Probe, compare

    m = find_target("paddle-rn50-v100")
    one = [c for c in m.cells() if c.nodes == 1]
    four = [c for c in m.cells() if c.nodes == 4]
    assert (m.expect_for(one)["os"], m.expect_for(one)["driver"]) == ("CentOS 7.5", "525.60.11")
    assert (m.expect_for(four)["os"], m.expect_for(four)["driver"]) == ("CentOS 6.3", "450.80.02")
    assert m.expect_for(one + four) == dict(m.expect) == m.expect_for([])  # a run over both: expect itself
    node = NodeReport("gpu1", "10.0.0.1", Probe(0.3), docker=Probe("24.0.5"),
                      gpus=Probe((Gpu("Tesla V100-SXM2-32GB", 32510, "450.80.02"),) * 8), gpu_processes=Probe(()),
                      infiniband=Probe((), detail="no /dev/infiniband"), disk=Probe(2**40), clock=Probe(0.001))
    drivers = [str(d) for d in compare([node], m.expect_for(one), 4) if "driver" in str(d)]
    assert len(drivers) == 1 and "525.60.11" in drivers[0], drivers
    assert [d for d in compare([node], m.expect_for(four), 4) if "driver" in str(d)] == []
