"""Cases earlier rounds of hostile input left open: a secret that looks like an option, manifests and
inventories `validate` passed though they cannot run as written, and exit codes as documented."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_hostile_input import BASE_HOSTS, BASE_MANIFEST, check, dump, put, run_cli

from repro.redact import REDACTED, redact_argv, redact_text

SECRET = "-Vs3cr3t-t0ken"


@pytest.mark.parametrize("value", [SECRET, "-V", "-", "-1234"])
def test_a_secret_options_value_that_looks_like_an_option_is_blanked(value: str) -> None:
    assert redact_argv(["python", "train.py", "--token", value, "--epochs", "1"]) == \
        ["python", "train.py", "--token", REDACTED, "--epochs", "1"]
    assert redact_text(f"python train.py --api-key {value} --epochs 1") == \
        f"python train.py --api-key {REDACTED} --epochs 1"


def test_a_flag_before_a_long_option_keeps_the_option() -> None:
    assert redact_argv(["x", "--use-auth-token", "--verbose"]) == ["x", "--use-auth-token", "--verbose"]


def test_plan_prints_no_secret_that_looks_like_an_option(tmp_path: Path) -> None:
    doc = put(["launch", "command"], [*BASE_MANIFEST["launch"]["command"], "--token", SECRET])(BASE_MANIFEST)
    path = tmp_path / "m.yaml"
    path.write_text(dump(doc))
    for verb in (["plan", str(path)], ["show", str(path)]):
        code, out, _ = run_cli(verb)
        assert code == 0, out
        assert "--token" in out and SECRET not in out and "s3cr3t" not in out, out


# ------------------------------------------------------------------ manifests validate passed
def edit(fn: Callable[[Any], None]) -> Callable[[Any], Any]:
    def change(doc: Any) -> Any:
        doc = copy.deepcopy(doc)
        fn(doc)
        return doc
    return change


def _twice(doc: Any) -> None:
    doc["published"][0]["cells"].append(copy.deepcopy(doc["published"][0]["cells"][1]))


# (case, change to the base manifest, field the message names, words it must hold)
MANIFESTS: list[tuple[str, Callable[[Any], Any], str, str]] = [
    ("exclude-every-cell", put(["matrix", "exclude"], [{"nodes": 1}]), "matrix.exclude",
     "excludes every cell of the matrix"),
    ("published-cell-excluded", put(["matrix", "exclude"], [{"gpus": 8, "precision": "amp"}]),
     "published[0].cells[3]", "is a cell matrix.exclude removes"),
    ("published-cell-twice", edit(_twice), "published[0].cells[4]", "the same cell as published[0].cells[1]"),
    ("published-table-id-twice", edit(lambda d: d["published"].append(copy.deepcopy(d["published"][0]))),
     "published[1].id", "is the id of published[0] too"),
    ("tolerance-nan", put(["published", 0, "tolerance_pct"], float("nan")), "published[0].tolerance_pct",
     "nan is not a finite number"),
    ("tolerance-inf", put(["published", 0, "tolerance_pct"], float("inf")), "published[0].tolerance_pct",
     "greater than the maximum of 100"),
    ("cell-tolerance-nan", put(["published", 0, "cells", 0, "tolerance_pct"], float("nan")),
     "published[0].cells[0].tolerance_pct", "nan is not a finite number"),
    ("published-value-zero", put(["published", 0, "cells", 0, "value"], "0.00"), "published[0].cells[0].value",
     "does not match"),
    ("mount-source-comma", put(["launch", "container"], {"mounts": [{"source": "/d,/etc", "target": "/x"}]}),
     "launch.container.mounts[0].source", "contains ','"),
    ("mount-target-comma", put(["launch", "container"], {"mounts": [{"source": "/d", "target": "/x,/y"}]}),
     "launch.container.mounts[0].target", "contains ','"),
]


@pytest.mark.parametrize("case,change,field,words", MANIFESTS, ids=[c[0] for c in MANIFESTS])
def test_an_invalid_manifest_is_refused_with_file_and_field(tmp_path: Path, case: str,
                                                             change: Callable[[Any], Any], field: str,
                                                             words: str) -> None:
    path = tmp_path / f"{case}.yaml"
    path.write_text(dump(change(BASE_MANIFEST)))
    check(["validate", str(path)], 2, f"{path}:", f": {field}: ", words)


# ------------------------------------------------------------------ inventories validate passed
HOSTS: list[tuple[str, Callable[[Any], Any], str, str]] = [
    ("data-comma", put(["data"], "/datasets,/etc"), "data", "does not match"),
    ("data-format-comma", put(["data"], {"imagenet-jpeg": "/a,/b"}), "data.imagenet-jpeg", "does not match"),
    ("partition-dash", put(["scheduler"], {"kind": "slurm", "partition": "-"}), "scheduler.partition",
     "is not"),
    ("partition-option", put(["scheduler"], {"kind": "slurm", "partition": "-x"}), "scheduler.partition",
     "is not"),
    ("partition-list-dash", put(["scheduler"], {"kind": "slurm", "partition": "gpu,-"}), "scheduler.partition",
     "is not"),
    ("account-dash", put(["scheduler"], {"kind": "slurm", "account": "--"}), "scheduler.account", "is not"),
]


@pytest.mark.parametrize("case,change,field,words", HOSTS, ids=[c[0] for c in HOSTS])
def test_an_invalid_inventory_is_refused_with_file_and_field(tmp_path: Path, case: str,
                                                             change: Callable[[Any], Any], field: str,
                                                             words: str) -> None:
    path = tmp_path / f"{case}.yaml"
    path.write_text(dump(change(BASE_HOSTS)))
    check(["validate", str(path)], 2, str(path), f": {field}: ", words)


# ------------------------------------------------------------------ preflight's exit code, as documented
FAKE_SLURM = """#!/bin/sh
# Slurm's client commands as a cluster answers them whose sbatch refuses to queue the job
case "$(basename "$0") $*" in
  "scontrol ping") echo "Slurmctld(primary) at ctl is UP" ;;
  "scontrol show partition"*) echo "PartitionName=debug TotalNodes=4 State=UP" ;;
  "sinfo "*) echo "debug*" ;;
  "srun --help") echo "--container-image" ;;
  "sbatch --test-only") echo "sbatch: Job 7 to start at now using 1 processors on nodes n1 in partition debug" >&2 ;;
  "sbatch --parsable") echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2; exit 1 ;;
  *) echo "unexpected: $0 $*" >&2; exit 1 ;;
esac
"""


def test_preflight_that_cannot_get_its_nodes_exits_3_as_documented(tmp_path: Path) -> None:
    import os
    import re
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sinfo", "srun", "sbatch"):
        (bin_dir / name).write_text(FAKE_SLURM)
        (bin_dir / name).chmod(0o755)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("schema_version: 1\ndefaults: {user: root, gpus: 8}\nnodes:\n  - {name: g1, address: 10.0.0.1}\n"
                     "scheduler: {kind: slurm, partition: debug, time: 15, container: pyxis}\n")
    readme = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "commands.md").read_text(encoding="utf-8")
    assert re.search(r"3 environment unavailable\s+\(Docker, SSH, a node, preflight\)", readme)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    proc = subprocess.run([sys.executable, "-m", "repro", "preflight", "--hosts", str(hosts)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "QOSMaxSubmitJobPerUserLimit" in proc.stderr and "Traceback" not in proc.stderr
