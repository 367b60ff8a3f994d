"""The build's first-stage check of the base image (repro/images/base_check.py, ``repro-base-check.py`` in
every build context): real processes of this interpreter and its pip, and the pure comparison."""

from __future__ import annotations

import functools
import json
import platform
import subprocess
import sys
from pathlib import Path

from repro.images.base_check import differences

SCRIPT = Path(__file__).resolve().parents[1] / "repro" / "images" / "base_check.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          check=False)


@functools.cache
def pip_version() -> str:
    out = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return next(d["version"] for d in json.loads(out) if d["name"] == "pip")


def test_a_base_as_declared_passes_and_says_what_it_found() -> None:
    minor = ".".join(platform.python_version_tuple()[:2])
    proc = run(minor, f"pip=={pip_version()}")
    assert (proc.returncode, proc.stderr) == (0, "")
    found = f"python {platform.python_version()}, pip=={pip_version()}"
    assert proc.stdout == f"repro: base as declared: {found}\n"


def test_every_difference_is_named_on_one_line() -> None:
    proc = run("2.7", "tensorflow-gpu==2.3.0", f"PIP=={pip_version()}.post9")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == ("repro: the base image is not the one image.build.base declares: "
                           f"python {platform.python_version()}, declared 2.7; tensorflow-gpu not installed, "
                           f"declared 2.3.0; PIP {pip_version()}, declared {pip_version()}.post9\n")


def test_comparison() -> None:
    found = {"tensorflow-gpu": "2.3.0", "torch": "1.5.0a0+8f84ded"}
    assert differences("3.6", ["tensorflow_gpu==2.3.0", "torch==1.5.0a0+8f84ded"], "3.6.9", found) == []
    assert differences("3.6.9", [], "3.6.10", {}) == ["python 3.6.10, declared 3.6.9"]
    assert differences("3", [], "3.6.10", {}) == []
    assert differences("", ["torch==1.5.0"], "3.6.9", found) == ["torch 1.5.0a0+8f84ded, declared 1.5.0"]
