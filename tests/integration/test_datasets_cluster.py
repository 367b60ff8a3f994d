"""The dataset check of preflight on the test cluster's nodes (real sshd, the nodes' login shells):
one probe round trip per node checks that the hosts file's directory for the target's format
looks like that format. The trees are made here; the nodes see this machine's file system.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from repro.cli import cli

pytestmark = pytest.mark.ssh


@pytest.fixture
def site(cluster: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # noqa: ANN201
    """Write a hosts file for the cluster's nodes with the given ``data:``."""
    monkeypatch.setenv("REPRO_SSH_CONFIG", cluster["ssh"]["config"])

    def write(data: object) -> Path:
        doc = {"schema_version": 1, "defaults": {"user": "root", "identity": cluster["ssh"]["key"], "gpus": 0},
               "data": data, "nodes": [{"name": n["name"], "address": n["address"]} for n in cluster["nodes"]]}
        path = tmp_path / f"hosts-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path
    return write


def tfrecords(root: Path, names: list[str]) -> Path:
    root.mkdir(parents=True)
    for n in names:
        (root / n).write_bytes(b"\0" * 16)
    return root


def preflight(target: str, hosts: Path) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["preflight", target, "--hosts", str(hosts)])
    return res.exit_code, res.output


def test_every_node_checks_the_dataset_of_the_targets_format(site, cluster: dict, tmp_path: Path) -> None:  # noqa: ANN001
    tf = tfrecords(tmp_path / "tf", [f"train-{i:05d}-of-01024" for i in range(4)] + ["validation-00000-of-00128"])
    hosts = site({"imagenet-tfrecord": str(tf), "imagenet-jpeg": str(tmp_path / "no-jpeg-here")})
    code, out = preflight("ngc-tf1-rn50-v100", hosts)
    names = [n["name"] for n in cluster["nodes"]]
    block = "\n".join([f"dataset imagenet-tfrecord at {tf}:", *(f"  {n}: 4 train shards, 1 validation shards"
                                                               for n in names)])
    assert block in out, out
    assert "problems:" not in out
    assert code == 0, out  # the deviations (no GPU, no InfiniBand) are warnings without --strict


def test_a_wrong_layout_stops_the_run_with_the_fix(site, cluster: dict, tmp_path: Path) -> None:  # noqa: ANN001
    tf = tfrecords(tmp_path / "tf", ["train-00000-of-01024.tfrecord", "train.tfrecord"])  # renamed: no shard matches
    code, out = preflight("ngc-tf1-rn50-v100", site(str(tf)))  # one path for every format
    problems = [f"  {n['name']}: dataset imagenet-tfrecord at {tf}: no train-NNNNN-of-NNNNN files in {tf}; fix: "
                "convert ImageNet with the TensorFlow models' imagenet_to_gcs.py or build_imagenet_data.py, which "
                "write train-NNNNN-of-01024 and validation-NNNNN-of-00128" for n in cluster["nodes"]]
    assert "\nproblems:\n" + "\n".join(problems) + "\n" in out, out
    assert code == 3
    assert out.endswith("error: 2 of 2 node(s) cannot run a target\nhint: see the notes under the table\n")


def test_a_missing_directory_and_a_missing_format(site, cluster: dict, tmp_path: Path) -> None:  # noqa: ANN001
    gone = tmp_path / "gone"
    code, out = preflight("ngc-mxnet-rn50-v100", site({"imagenet-recordio": str(gone)}))
    assert code == 3
    for n in cluster["nodes"]:
        assert (f"  {n['name']}: dataset imagenet-recordio at {gone}: no directory {gone}; fix: copy the dataset "
                "to that path on every node, or name where it is: `data: {imagenet-recordio: /path}` in the hosts "
                "file\n") in out
    code, out = preflight("ngc-mxnet-rn50-v100", site({"imagenet-jpeg": str(tmp_path)}))
    assert code == 0 and "problems:" not in out and "\ndataset " not in out
    assert out.endswith("note: dataset not checked: the hosts file names no directory for imagenet-recordio, which "
                        "`repro up ngc-mxnet-rn50-v100` needs (`data: {imagenet-recordio: /path}`)\n")
