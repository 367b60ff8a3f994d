"""``scripts/test-cluster selftest`` on the running test cluster: every check passes (each node reached over
SSH in its own namespace, its engine pulling the base by digest, Slurm running a task on every node, pyxis
running the base by digest from each node's own enroot data), and its output is the one the pyxis page shows."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from docs_examples import assert_cluster_example

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slurm, pytest.mark.pyxis]
ROOT = Path(__file__).resolve().parents[2]


def test_every_check_of_the_selftest_passes(cluster):
    proc = subprocess.run([str(ROOT / "scripts" / "test-cluster"), "selftest"], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_cluster_example("selftest", proc.stdout, proc.stderr)
