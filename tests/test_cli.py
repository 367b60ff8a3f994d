"""The command line: help, version, show, and the stdout/stderr/exit-code contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_cli
from click.testing import CliRunner

from repro import __version__
from repro.cli import cli

REPO = Path(__file__).resolve().parents[1]
DLPERF = "dlperf-ngc-pytorch-rn50-v100"
DLPERF_FILE = REPO / "manifests" / f"{DLPERF}.yaml"


def repro(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=REPO)


def python_m_repro(*args: str) -> subprocess.CompletedProcess[str]:
    """The entry point itself, in a process of its own: what the in-process runs cannot show."""
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


# --- help and version --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(cli.commands))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help(command: str, flag: str) -> None:
    result = CliRunner().invoke(cli, [command, flag], prog_name="repro")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: repro {command} ")
    summary = (cli.commands[command].help or "").strip().splitlines()
    assert summary and " ".join(summary[0].split()) in " ".join(result.output.split()), "says what it does"


def test_group_help_lists_every_command() -> None:
    proc = python_m_repro("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("Usage: ")
    for name in ("list", "show", "validate", "plan"):
        assert name in cli.commands
    for name in cli.commands:
        assert f"  {name} " in proc.stdout


def test_version() -> None:
    proc = python_m_repro("--version")
    assert proc.returncode == 0
    assert proc.stdout == f"repro, version {__version__}\n"
    assert proc.stderr == ""


def test_unknown_command_is_a_usage_error() -> None:
    proc = python_m_repro("frobnicate")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "No such command 'frobnicate'" in proc.stderr


def test_the_installed_repro_script_is_the_same_command() -> None:
    """The console script pip writes (``repro = repro.cli:main``): output and exit status, in a process."""
    script = Path(sysconfig.get_path("scripts")) / "repro"
    if not script.is_file():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"the kit is not installed here: no {script}")
    version = subprocess.run([str(script), "--version"], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    assert (version.returncode, version.stdout, version.stderr) == (0, f"repro, version {__version__}\n", "")
    bad = subprocess.run([str(script), "show", "no-such-target"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "error: unknown target 'no-such-target'\nhint: `repro list` shows the targets\n"


# --- show --------------------------------------------------------------------------------------------------


def test_show_dlperf_text() -> None:
    proc = repro("show", DLPERF, "--wide")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == ("dlperf-ngc-pytorch-rn50-v100: DLPerf NGC PyTorch 20.03 ResNet-50 v1.5 training throughput, "
                        "1-32 V100-SXM2-16GB, FP32 bs128 and AMP bs256")
    assert lines[1] == f"  file: {DLPERF_FILE}"
    assert lines[2].startswith("  sha256: ") and len(lines[2].removeprefix("  sha256: ")) == 64
    expected = [
        "  framework: pytorch, model: resnet50v1.5",
        "  image: built from dockerfiles/requirements as repro/dlperf-ngc-pytorch-rn50:20.03-5cc03ca, "
        "FROM nvcr.io/nvidia/pytorch:20.03-py3 (base not pinned)",
        "    base OS ubuntu18.04, tag published 2020-03 (NGC monthly release 20.03; the push date was not read from "
        "the registry here)",
        "  source: https://github.com/NVIDIA/DeepLearningExamples @ 5cc03caa153faab7a2c3b1b5b5d63663f06ce1b4 "
        "-> /workspace/rn50",
        "    patch PyTorch/Classification/ConvNets/main.py: DLPerf README requires this edit for multi-node runs",
        '      "        torch.cuda.set_device(args.gpu)\\n" -> "        torch.cuda.set_device(args.gpu)\\n'
        '        args.gpu = torch.cuda.device_count()\\n"',
        "    patch PyTorch/Classification/ConvNets/requirements.txt: GitHub no longer serves the git:// protocol; "
        "the same commit of dllogger over https",
        "      git+git://github.com/NVIDIA/dllogger.git@26a0f8f1958de2c0c460925ff6102a4d2486d6cc#egg=dllogger -> "
        "git+https://github.com/NVIDIA/dllogger.git@26a0f8f1958de2c0c460925ff6102a4d2486d6cc#egg=dllogger",
        "  rdma: mlnx-ofed 4.9-0.1.7.0 for ubuntu18.04, user space only, mlnxofedinstall --user-space-only "
        "--without-fw-update --all --force --without-neohost-backend; sha256 recorded by repro lock",
        "    {precision_args} for fp32: (none)",
        "    {precision_args} for amp: --amp --dynamic-loss-scale",
        "    env: NCCL_DEBUG=INFO",
        "  matrix: 10 cells x 5 repeats: 1n1g-fp32-bs128, 1n1g-amp-bs256, 1n4g-fp32-bs128, 1n4g-amp-bs256, "
        "1n8g-fp32-bs128, 1n8g-amp-bs256, 2n8g-fp32-bs128, 2n8g-amp-bs256, 4n8g-fp32-bs128, 4n8g-amp-bs256",
        "  published dlperf-ngc-pytorch-v1: DLPerf: NVIDIA-DeepLearningExamples PyTorch ResNet50 v1.5 test report",
        "    https://github.com/Oneflow-Inc/DLPerf @ c89430bac64f64caabb0445ff7eb80175641454c "
        "NVIDIADeepLearningExamples/PyTorch/resnet50v1.5/README.md (tolerance 3%)",
        "    1n 1 GPU fp32 bs128: 367.29 images/s, speedup 1.00",
        "    1n 4 GPU fp32 bs128: 1449.48 images/s, speedup 3.95",
        "    1n 8 GPU fp32 bs128: 2887.65 images/s, speedup 7.86",
        "    2n 16 GPU fp32 bs128: 5716.79 images/s, speedup 15.56",
        "    4n 32 GPU fp32 bs128: 10917.09 images/s, speedup 29.72",
        "    1n 1 GPU amp bs256: 802.9 images/s, speedup 1.00",
        "    1n 4 GPU amp bs256: 3137.44 images/s, speedup 3.91",
        "    1n 8 GPU amp bs256: 6154.66 images/s, speedup 7.67",
        "    2n 16 GPU amp bs256: 11991.94 images/s, speedup 14.94",
        "    4n 32 GPU amp bs256: 22551.16 images/s, speedup 28.09",
    ]
    for line in expected:
        assert line in lines, line
    launch = next(ln for ln in lines if ln.startswith("  launch (torch): "))
    assert launch.startswith("  launch (torch): python ./multiproc.py --nnodes '{nnodes}' --node_rank '{node_rank}'")
    measure = next(ln for ln in lines if ln.startswith("  measure: "))
    assert measure.startswith("  measure: parser ngc-pytorch, protocol ")
    assert "{skip: {from_iteration: 26}, window: 100," in measure  # YAML terms, as the manifest writes them
    assert "  expect: gpu_model=Tesla V100-SXM2-16GB, gpu_memory_gb=16, gpus_per_node=8, nodes=4" in proc.stdout
    notes = yaml.safe_load(DLPERF_FILE.read_text(encoding="utf-8"))["notes"]
    assert [ln.removeprefix("  note: ") for ln in lines if ln.startswith("  note: ")] == notes


def test_show_lists_cell_args() -> None:
    proc = repro("show", DLPERF)
    assert "--lr 2.048" in proc.stdout and "--lr 0.128" in proc.stdout and "8.192" not in proc.stdout


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_show_machine_formats_round_trip(fmt: str) -> None:
    proc = repro("show", DLPERF, "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout) if fmt == "json" else yaml.safe_load(proc.stdout)
    assert data == yaml.safe_load(DLPERF_FILE.read_text(encoding="utf-8"))


def test_show_by_path() -> None:
    by_path = repro("show", "manifests/dlperf-ngc-pytorch-rn50-v100.yaml", "--wide")
    by_id = repro("show", DLPERF, "--wide")
    assert by_path.returncode == 0, by_path.stderr
    # the same target; only the file line may differ in how the path is spelled
    assert by_path.stdout.splitlines()[0] == by_id.stdout.splitlines()[0]
    assert by_path.stdout.splitlines()[2:] == by_id.stdout.splitlines()[2:]


# --- errors: stderr and exit codes -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["show", "plan"])
def test_unknown_target(command: str) -> None:
    proc = repro(command, "no-such-target")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == "error: unknown target 'no-such-target'\nhint: `repro list` shows the targets\n"


def test_unknown_target_suggests_a_close_one() -> None:
    proc = repro("show", "dlperf-ngc-pytorch")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown target 'dlperf-ngc-pytorch'\n")
    assert "hint: `repro list` shows the targets; did you mean dlperf-ngc-pytorch-" in proc.stderr
    assert " dlperf-ngc-pytorch-rn50-v100," in proc.stderr


def test_validate_results_go_to_stdout() -> None:
    proc = repro("validate")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"ok {DLPERF_FILE} ({DLPERF})" in proc.stdout.splitlines()


def test_validate_errors_go_to_stderr() -> None:
    proc = repro("validate", "tests/data/bad/unknown-parser.yaml")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: tests/data/bad/unknown-parser.yaml:30: measure.parser: unknown parser")


def test_plan_results_go_to_stdout_only() -> None:
    proc = repro("plan", DLPERF, "--hosts", "tests/data/good/hosts-4.yaml", "--cells", "gpus=1,precision=fp32")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith(f"target {DLPERF}: ")
    assert "cell 1n1g-fp32-bs128: 1 node(s) x 1 GPU(s) = 1 GPU(s), fp32, batch 128/GPU" in proc.stdout


def test_missing_hosts_file() -> None:
    proc = repro("plan", DLPERF, "--hosts", "tests/data/good/no-such-hosts.yaml")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == "error: tests/data/good/no-such-hosts.yaml: no such file\n"


def test_up_takes_the_build_sources_images_takes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A build `up` starts reads git mirrors and the OFED cache as `repro images` does."""
    import repro.up

    seen = []

    def capture(target, opts, progress):
        seen.append(opts.images.build)
        raise repro.up.Interrupted(tmp_path)

    monkeypatch.setattr(repro.up, "up", capture)
    res = run_cli("up", "torch-rn50-cpu", "--git-mirror", "https://github.com/=/srv/git/", "--ofed-cache",
                  str(tmp_path), "--no-record")
    assert res.returncode == 130 and len(seen) == 1, res.stderr
    assert seen[0].git_mirrors == (("https://github.com/", "/srv/git/"),) and seen[0].ofed_cache == tmp_path
