"""Processes already on a node's GPUs (``nvidia-smi --query-compute-apps``), and the one probe per node that
preflight and the provenance share."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from repro.spec.hosts import Node
from repro.nodes.ssh import Session
from repro.nodes.preflight import NodeReport, PreflightFailed, Probe, _from_sections, assess, compare, probe_node, probe_script
from repro.nodes.table import render_preflight
from repro.nodes.facts import Gpu, GpuProcess, parse_compute_apps, parse_sections
from repro.nodes.facts import host_facts

DATA = Path(__file__).parent / "data" / "preflight"
H200 = (DATA / "nvidia-smi-compute-apps-h200.txt").read_text()


def test_compute_apps_of_a_busy_h200_node() -> None:
    procs = parse_compute_apps(H200)
    assert len(procs) == 8
    assert procs[0] == GpuProcess("GPU-a44622e3-2296-6285-0a86-84d0f6c67900", 1328667, "/usr/local/bin/python3.10",
                                  130004)
    assert procs[2] == GpuProcess("GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90", 1425258, "python3", 105842)
    assert procs[7] == GpuProcess("GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72", 1758887, "[Not Found]", 58060)


def test_idle_gpus_print_no_row() -> None:
    assert parse_compute_apps("") == ()
    assert parse_compute_apps("\n") == ()


def test_driver_failure_is_the_reason() -> None:
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n")
    with pytest.raises(ValueError, match="couldn't communicate"):
        parse_compute_apps(text)
    assert _from_sections({"gpu_apps": (text, 9)})["gpu_processes"].reason == "gpu_processes: " + text.strip()


def test_sections_give_the_processes() -> None:
    assert _from_sections({"gpu_apps": (H200, 0)})["gpu_processes"] == Probe(parse_compute_apps(H200))
    assert _from_sections({"gpu_apps": ("nvidia-smi: not found\n", 127)})["gpu_processes"] == \
        Probe((), detail="no nvidia-smi")


def node(name: str, procs: str) -> NodeReport:
    return NodeReport(name, "10.0.0.1", Probe(0.3, detail="connect 10 ms"), docker=Probe("24.0.5"),
                      gpus=Probe((Gpu("NVIDIA H200", 143771, "550.54.15"),) * 8),
                      gpu_processes=Probe(parse_compute_apps(procs)), infiniband=Probe((), detail="no /dev/infiniband"),
                      disk=Probe(2**40), clock=Probe(0.001))


BUSY = ("gpu1: gpus_in_use: expected no other process on the GPUs, found 2 process(es): "
        "pid 1425258 python3 (105842 MiB) on GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90; "
        "pid 1758887 [Not Found] (58060 MiB) on GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72")


def test_busy_gpus_are_a_deviation_an_error_under_strict() -> None:
    two = "".join(H200.splitlines(keepends=True)[i] for i in (2, 7))
    rs = [node("gpu1", two), node("gpu2", "")]
    devs = compare(rs, {}, 2)
    assert [str(d) for d in devs] == [BUSY]
    assert f"deviations from the target's expected hardware:\n  {BUSY}\n" in render_preflight(rs, devs)
    assess(rs, devs, strict=False)
    with pytest.raises(PreflightFailed, match="1 deviation"):
        assess(rs, devs, strict=True)
    assert compare([node("gpu2", "")], {}, 1) == []


class FakeRemote:
    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def run(self, command: str, **kw: Any) -> SimpleNamespace:
        kw["out_stream"].write(self.stdout.partition("\n")[0] + "\n")
        return SimpleNamespace(stdout=self.stdout, exited=0)

    def close(self) -> None:
        pass


def test_one_command_gives_preflight_and_the_provenance_host_facts() -> None:
    """The node's one script: preflight's sections and the host facts, read from the same output."""
    stdout = (f"{time.time():.9f}\n\n@@repro:gpu_apps\n{H200}\n@@repro-rc:0\n"
              "\n@@repro:hostname\ngpu01\n@@repro-rc:0\n"
              "\n@@repro:kernel\n6.1.0-18-amd64\n@@repro-rc:0\n")
    r = probe_node(Session(Node("n1", "10.0.0.1"), FakeRemote(stdout), 0.01))
    assert r.gpu_processes.value == parse_compute_apps(H200)
    assert r.host["hostname"] == {"value": "gpu01", "reason": None}
    assert r.host["kernel"]["value"] == {"release": "6.1.0-18-amd64", "machine": None}
    assert r.host["memory"]["value"] is None


def test_each_tool_runs_once_in_the_one_script() -> None:
    """nvidia-smi once per query, ibstat (or ibv_devinfo), ofed_info, the mlx5 check and docker info once each."""
    script = probe_script(Node("n1", "10.0.0.1"))
    runs = {"nvidia-smi --query-gpu=": 1, "nvidia-smi --query-compute-apps=": 1, "nvidia-smi topo -m": 1,
            "then nvidia-smi 2>&1": 1, "ibstat 2>&1": 1, "ibv_devinfo -v 2>&1": 1, "ofed_info -s": 1,
            "cat /sys/module/mlx5_core/version": 1, "D info ": 1, "docker version": 0, "/sys/class/infiniband/*/ports/*": 2}
    assert {k: script.count(k) for k in runs} == runs


def test_the_one_script_runs_here(tmp_path: Path) -> None:
    out = subprocess.run(["bash", "-c", probe_script(Node("n1", "10.0.0.1"))], check=False, capture_output=True,
                         text=True, timeout=120)
    sections = parse_sections(out.stdout.partition("\n")[2])
    assert {"docker", "gpus", "gpu_apps", "netifs", "hostname"} <= set(sections)
    facts = host_facts(sections)
    assert facts["hostname"]["value"] == socket.gethostname()
    assert facts["memory"]["value"]["total_bytes"] > 0
