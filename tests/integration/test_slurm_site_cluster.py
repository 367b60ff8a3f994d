"""The site options of a Slurm allocation (hosts file ``scheduler:``) against the test cluster's real Slurm:
the batch script the kit renders with them is accepted by ``sbatch --test-only`` where the nodes have no
GPUs (``gpus: 0``: no GPU request), and a GPU request the cluster cannot meet is Slurm's refusal, named by
the setting, before anything is submitted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.run.schedulers import make_scheduler
from repro.run.plan import select_cells
from repro.spec.hosts import load_hosts
from repro.spec.manifest import find_target

pytestmark = [pytest.mark.slurm]

SITE = """\
schema_version: 1
defaults: {{gpus: {gpus}}}
scheduler:
  kind: slurm
  partition: debug
  time: 20
  gpu_request: {request}
  sbatch_extra: [--signal=B:USR1@120, --comment=siteopts, --mail-type=NONE]
"""


@pytest.fixture
def slurm_env(cluster: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", cluster["slurm_conf"])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def jobs() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True, timeout=30)
    return set(out.stdout.split())


def scheduler(tmp_path: Path, gpus: int, request: str):
    inv = tmp_path / "site.yaml"
    inv.write_text(SITE.format(gpus=gpus, request=request))
    m = find_target("torch-rn50-cpu")
    return make_scheduler(load_hosts(inv), m, [c for c in select_cells(m) if c.nodes == 2], None)


def test_site_options_are_accepted_by_sbatch_test_only_on_gpu_less_nodes(slurm_env, tmp_path):
    before = jobs()
    sched = scheduler(tmp_path, 0, "gres")
    sched.check(2)  # sbatch --test-only of the script: Slurm accepts it
    script = sched.allocation.script
    assert script.splitlines()[6:12] == ["#SBATCH --partition=debug", "#SBATCH --time=20", "#SBATCH --mem=0",
                                         "#SBATCH --signal=B:USR1@120", "#SBATCH --comment=siteopts",
                                         "#SBATCH --mail-type=NONE"]
    assert "gres" not in script and "gpus" not in script
    assert jobs() == before  # --test-only: nothing submitted


@pytest.mark.parametrize("request_kind,line", [("gres", "--gres=gpu:2"), ("gpus-per-node", "--gpus-per-node=2")])
def test_a_gpu_request_the_cluster_cannot_meet_is_slurms_refusal_named_by_the_setting(slurm_env, tmp_path,
                                                                                         request_kind, line):
    before = jobs()
    sched = scheduler(tmp_path, 2, request_kind)
    with pytest.raises(UsageError) as e:
        sched.check(2)
    assert f"#SBATCH {line}" in sched.allocation.script.splitlines()  # what Slurm was shown
    assert str(e.value) == (f"{tmp_path / 'site.yaml'}: scheduler.gpu_request: Slurm refuses the job: "
                            "Invalid generic resource (gres) specification")
    assert jobs() == before
