"""The build's first-stage check of the base image (repro/images/base_check.py, ``repro-base-check.py`` in
every build context) as a real process of this interpreter, reading its pip (integration lane: each case
runs the script and ``pip list``); the pure comparison is tests/test_base_check.py."""

from __future__ import annotations

import functools
import json
import platform
import subprocess
import sys
from pathlib import Path


SCRIPT = Path(__file__).resolve().parents[2] / "repro" / "images" / "base_check.py"


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
