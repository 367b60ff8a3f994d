"""``repro list``, ``show`` and ``plan`` fit 120 columns by default (``--wide`` on request), and a plan's
commands wrapped to fit are still the same commands: bash reads back the same words."""

from __future__ import annotations

import re
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


SLURM_HOSTS = "tests/data/detach/hosts-cpu.yaml"  # a Slurm inventory: docker containers in job steps
SLURM_TARGETS = ["mpi-rn50-cpu", "paddle-rn50-cpu", "torch-rn50-cpu"]


def _joined(text: str) -> list[str]:
    """The lines of ``text`` with each `` \\``-continued command read back onto one line, as bash reads it."""
    out: list[str] = []
    pending, inside = "", False
    for ln in text.splitlines():
        line = pending + (ln if inside or not pending else ln.lstrip())
        if line.endswith("\\"):  # " \\" between words; a bare "\\" inside a long double-quoted word
            inside = not line.endswith(" \\")
            pending = line[:-1]
            continue
        out.append(line)
        pending, inside = "", False
    return out


@pytest.mark.parametrize("target", SLURM_TARGETS)
def test_a_slurm_plan_fits_120_columns_and_its_commands_read_back_as_the_wide_ones(target: str) -> None:
    """Every line of the plan of a Slurm inventory, the srun job steps and each task's docker create
    included, fits 120 columns; read back, each wrapped command is its --wide line, word for word."""
    fitted = run("plan", target, "--hosts", SLURM_HOSTS)
    wide = run("plan", target, "--hosts", SLURM_HOSTS, "--wide")
    assert widest(wide) > 120 and widest(fitted) <= 120
    steps = [ln for ln in wide.splitlines() if ln.strip().startswith(("$ srun ", "task "))]
    assert steps and all(len(ln) > 120 for ln in steps)
    commands = [ln for ln in wide.splitlines() if ln.strip().startswith(("$ ", "task ", "docker run "))]
    back = [ln for ln in _joined(fitted) if ln.strip().startswith(("$ ", "task ", "docker run "))]
    assert len(back) == len(commands)
    for got, want in zip(back, commands):
        if max(map(len, shlex.split(want))) < 110:  # each word as written
            assert got == want
        else:  # a word wider than a line is double-quoted over lines: bash reads the same words
            assert _same_words(got, want)
    for line in steps:
        assert _same_words(line, line)


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
@pytest.mark.parametrize("target", ["torch-rn50-cpu", "ngc-tf1-rn50-v100"])  # the longest CPU binding note
def test_pyxis_and_apptainer_job_steps_fit_120_columns(runtime: str, target: str) -> None:
    """The srun lines of a pyxis or Apptainer cell wrap too; what a --multi-prog file holds is shown as the
    file is, one line a rank (srun reads it so), and a single-quoted script (one word: no continuation can
    split it) stands alone on its line."""
    fitted = run("plan", target, "--scheduler", f"slurm:container={runtime}")
    wide = run("plan", target, "--scheduler", f"slurm:container={runtime}", "--wide")
    conf = [ln for ln in wide.splitlines() if ln.startswith("    ") and ln.strip()[:1].isdigit()]
    over = [ln for ln in fitted.splitlines() if len(ln) > 120 and not _one_word(ln)]
    assert over == [ln for ln in conf if len(ln) > 120]
    srun = [ln for ln in wide.splitlines() if ln.strip().startswith("$ srun ")]
    assert srun and max(map(len, srun)) > 120
    back = [b for b in _joined(fitted) if b.strip().startswith("$ srun ")]
    assert len(back) == len(srun)
    for got, want in zip(back, srun):
        assert _same_words(got, want)


def _one_word(line: str) -> bool:
    """A fitted line that holds one single-quoted shell word and its continuation, nothing else."""
    body = line.strip().removesuffix(" \\")
    return body.startswith("'") and body.endswith("'") and len(shlex.split(body)) == 1


def _same_words(fitted: str, wide: str) -> bool:
    """bash reads the command of a fitted plan line as the words of its wide line (a placeholder for what goes
    on stdin, ``<repro/...> < SPEC``, read as one word)."""
    def command(line: str) -> str:
        body = line.strip().removeprefix("$ ")
        body = body.partition(": ")[2] if body.startswith("task ") else body
        return re.sub(r"<repro/[^>]+>( < SPEC)?", "STDIN", body)
    return _bash_words(command(fitted)) == shlex.split(command(wide))
