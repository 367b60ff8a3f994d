"""The build's first-stage check of the base image (repro/images/base_check.py, ``repro-base-check.py`` in
every build context): the pure comparison. The script itself, run by this interpreter against its pip, is
tests/integration/test_base_check_process.py."""

from __future__ import annotations

from repro.images.base_check import differences


def test_comparison() -> None:
    found = {"tensorflow-gpu": "2.3.0", "torch": "1.5.0a0+8f84ded"}
    assert differences("3.6", ["tensorflow_gpu==2.3.0", "torch==1.5.0a0+8f84ded"], "3.6.9", found) == []
    assert differences("3.6.9", [], "3.6.10", {}) == ["python 3.6.10, declared 3.6.9"]
    assert differences("3", [], "3.6.10", {}) == []
    assert differences("", ["torch==1.5.0"], "3.6.9", found) == ["torch 1.5.0a0+8f84ded, declared 1.5.0"]
