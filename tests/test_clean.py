"""``repro clean`` without a cluster: what it selects, its per-node report, and its errors.
(The kill -9 test on real nodes is tests/integration/test_clean_cluster.py.)"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from repro.labels import label_filters, probe_labels
from repro.run.clean import NodeCleaned, summary
from repro.cli import cli


def test_label_filters() -> None:
    assert label_filters("20261122T111500Z-x-0a1b2c") == [{"label": "repro.run=20261122T111500Z-x-0a1b2c"}]
    assert label_filters(None) == [{"label": "repro.run"}, {"label": "repro.probe"}]


def test_probe_containers_carry_the_run_id_within_a_run() -> None:
    assert probe_labels("container", "20261122T111500Z-x-0a1b2c") == {
        "repro.probe": "container", "repro.run": "20261122T111500Z-x-0a1b2c"}
    assert probe_labels("ca", None) == {"repro.probe": "ca"}  # repro build alone: clean --all finds it


def test_summary_one_line_per_node() -> None:
    assert summary([NodeCleaned("a", ["repro-r-1n1g-fp32-bs8-rank0"]), NodeCleaned("b"),
                    NodeCleaned("c", error="cannot reach node c")]) == (
        "a: removed 1 container(s): repro-r-1n1g-fp32-bs8-rank0\nb: nothing to remove\nc: FAILED: cannot reach node c\n")


def test_arguments() -> None:
    r = CliRunner().invoke(cli, ["clean"])
    assert r.exit_code == 2 and "give a run directory (or run id), or --all" in r.output
    r = CliRunner().invoke(cli, ["clean", "x", "--all"])
    assert r.exit_code == 2
    r = CliRunner().invoke(cli, ["clean", "/etc"])
    assert r.exit_code == 2 and "/etc is not a run directory" in r.output
    r = CliRunner().invoke(cli, ["clean", "no-such-run"])
    assert r.exit_code == 2 and "neither a run directory nor a run id" in r.output


def test_an_unreachable_node_is_reported_and_the_others_still_cleaned(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("schema_version: 1\nnodes:\n"
                     f"  - {{name: gone, address: 10.0.0.1, docker_host: 'unix://{tmp_path}/no.sock'}}\n")
    r = CliRunner().invoke(cli, ["clean", "20261122T111500Z-x-0a1b2c", "--hosts", str(hosts)])
    assert r.exit_code == 3, r.output
    assert r.output.startswith("gone: FAILED: the Docker engine of node gone") and "could not clean 1 of 1" in r.output
