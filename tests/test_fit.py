"""``repro list``, ``show`` and ``plan`` fit 120 columns by default (``--wide`` on request), and a plan's
commands wrapped to fit are still the same commands: bash reads back the same words."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from click.testing import CliRunner

from repro.cli import cli
from repro.fit import fit_line
from repro.spec.manifest import load_catalog, manifest_files

TARGETS = sorted(load_catalog(manifest_files()))


def run(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args), terminal_width=400)
    assert res.exit_code == 0, res.output
    return res.output


def widest(text: str) -> int:
    return max(map(len, text.splitlines()))


def test_list_fits_120_columns_and_the_wide_form_is_one_line_a_target() -> None:
    assert widest(run("list")) <= 120
    wide = run("list", "--wide")
    assert widest(wide) > 120 and all(f"\n{t} " in wide for t in TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_show_and_plan_fit_120_columns(target: str) -> None:
    shown = run("show", target)
    assert widest(shown) <= 120 and "{'" not in shown and "': " not in shown  # YAML terms, not Python reprs
    assert widest(run("plan", target)) <= 120


def _bash_words(command: str) -> list[str]:
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + command], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\0")[:-1]


@pytest.mark.parametrize("target", ["dlperf-tf2-rn50-v100", "mpi-rn50-cpu", "ngc-pytorch-rn50-v100"])
def test_wrapped_plan_commands_are_the_same_commands(target: str) -> None:
    wide = [ln.strip() for ln in run("plan", target, "--wide").splitlines()
            if ln.strip().startswith(("$ ", "docker run ")) and len(ln) > 120]
    assert wide
    for line in wide:
        body = line.removeprefix("$ ")
        wrapped = fit_line("    " + line)
        assert widest(wrapped) <= 120
        assert _bash_words(wrapped.strip().removeprefix("$ ")) == shlex.split(body)
