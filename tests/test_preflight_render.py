"""Preflight without a cluster: parsers on real command output, the probe script, comparison, rendering."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from repro.errors import EnvironmentUnavailable
from repro.spec.hosts import Node
from repro.nodes.ssh import Session
from repro.nodes.preflight import Deviation, NodeReport, PreflightFailed, Probe, assess, compare, probe_node, probe_script
from repro.nodes.table import render_preflight, to_json
from repro.nodes.facts import Gpu, IbPort, parse_df, parse_docker_info, parse_ib, parse_ibstat, parse_ibv_devinfo, parse_nvidia_smi, parse_sections
from repro.nodes.facts import DockerInfo

DATA = Path(__file__).parent / "data" / "preflight"

V100_32 = "Tesla V100-SXM2-32GB, 32510 MiB, 450.80.02"
SHORT = ("name", "memory.total", "driver_version")  # the query of these captures
V100_32_ROW = "0, Tesla V100-SXM2-32GB, GPU-aa, 00000000:1A:00.0, 32510, 450.80.02, 1530, 877, 1290, Enabled, 88.00.80.00"
DOCKER_INFO = (DATA / "docker-info-20.10.txt").read_text()
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")


# ---------------------------------------------------------------- parsers

def test_ibstat_roce_and_ib() -> None:
    assert parse_ibstat((DATA / "ibstat-roce-and-ib.txt").read_text()) == (
        IbPort("rocep33s0f0", 1, "Down", 10.0, "Ethernet"),
        IbPort("ibp129s0f0", 1, "Active", 100.0, "InfiniBand"),
    )


def test_firmware_of_each_hca() -> None:
    """Not compared by ==; provenance records it."""
    fws = [p.fw for p in parse_ibstat((DATA / "ibstat-roce-and-ib.txt").read_text())]
    assert fws == ["14.31.1014", "20.31.1014"]
    fws = [p.fw for p in parse_ibv_devinfo((DATA / "ibv_devinfo-plain-roce.txt").read_text())]
    assert fws == ["22.38.1900"]  # mlx5_13 of that output lists no port


def test_ibstat_ndr() -> None:
    assert parse_ibstat((DATA / "ibstat-ndr-400.txt").read_text()) == (IbPort("mlx5_5", 1, "Active", 400.0, "InfiniBand"),)


def test_ibstat_tabs_two_ports_and_debug_noise() -> None:
    assert parse_ibstat((DATA / "ibstat-two-ports-debug-noise.txt").read_text()) == (
        IbPort("mlx4_0", 1, "Down", 10.0, "InfiniBand"),
        IbPort("mlx4_0", 2, "Active", 56.0, None),
    )


def test_ibv_devinfo_verbose_rate_is_width_times_speed() -> None:
    ports = parse_ibv_devinfo((DATA / "ibv_devinfo-v-hdr.txt").read_text())
    assert ports == (
        IbPort("mlx5_0", 1, "PORT_ACTIVE", 200.0, "InfiniBand"),
        IbPort("mlx5_1", 1, "PORT_DOWN", None, "InfiniBand"),
    )
    assert [p.active for p in ports] == [True, False]


def test_ibv_devinfo_plain_has_no_rate() -> None:
    assert parse_ibv_devinfo((DATA / "ibv_devinfo-plain-roce.txt").read_text()) == (
        IbPort("mlx5_12", 1, "PORT_DOWN", None, "Ethernet"),)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("ib*.txt")))
def test_parse_ib_tells_the_formats_apart(name: str) -> None:
    text = (DATA / name).read_text()
    direct = parse_ibv_devinfo(text) if name.startswith("ibv_devinfo") else parse_ibstat(text)
    assert parse_ib(text) == direct
    assert direct or name == "ibv_devinfo-no-verbs-kernel.txt"  # captured where the kernel has no RDMA support


def test_nvidia_smi_eight_gpus() -> None:
    assert parse_nvidia_smi("\n".join([V100_32] * 8) + "\n", SHORT) == tuple(Gpu("Tesla V100-SXM2-32GB", 32510, "450.80.02")
                                                                       for _ in range(8))


def test_nvidia_smi_name_with_comma_and_no_devices() -> None:
    assert parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 40536 MiB, 525.60.13", SHORT) == (
        Gpu("NVIDIA A100-SXM4-40GB", 40536, "525.60.13"),)
    assert parse_nvidia_smi("Odd, Name, 1024 MiB, 1.0", SHORT) == (Gpu("Odd, Name", 1024, "1.0"),)
    assert parse_nvidia_smi("No devices were found\n") == ()


def test_nvidia_smi_driver_failure_is_the_reason() -> None:
    with pytest.raises(ValueError, match="couldn't communicate with the NVIDIA driver"):
        parse_nvidia_smi(NO_DRIVER + "\n")


def test_df() -> None:
    text = ("Filesystem     1024-blocks     Used Available Capacity Mounted on\n"
            "/dev/vda         263174212 25165824  82837504      24% /\n")
    assert parse_df(text) == 82837504 * 1024
    with pytest.raises(ValueError, match="No such file"):
        parse_df("df: /nope: No such file or directory\n")


def test_sections() -> None:
    out = "\n@@repro:kernel\n6.1.0-18-amd64\n@@repro-rc:0\n\n@@repro:gpus\nnvidia-smi: not found\n\n@@repro-rc:127\n"
    assert parse_sections(out) == {"kernel": ("6.1.0-18-amd64", 0), "gpus": ("nvidia-smi: not found\n", 127)}


def test_docker_info() -> None:
    info = parse_docker_info(DOCKER_INFO)
    assert info == DockerInfo("20.10.24+dfsg1", "/var/lib/docker", "overlay2",
                              ("io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc"), "runc")
    with pytest.raises(ValueError, match="no server version"):
        parse_docker_info("root=/var/lib/docker\nWARNING: No swap limit support\n")


def test_ib_sysfs_listing() -> None:
    text = "mlx5_0|1|4: ACTIVE|100 Gb/sec (4X EDR)|InfiniBand|16.27.2008\nmlx5_1|1|1: DOWN|40 Gb/sec (4X QDR)|Ethernet|\n"
    assert parse_ib(text) == (IbPort("mlx5_0", 1, "ACTIVE", 100.0, "InfiniBand"), IbPort("mlx5_1", 1, "DOWN", 40.0, "Ethernet"))
    assert parse_ib(text)[0].active and parse_ib(text)[0].fw == "16.27.2008"


# ---------------------------------------------------------------- the probe script

NASTY = "unix:///run/x.sock;touch /tmp/pwned;$(reboot)`id`'\""


def test_docker_host_enters_the_script_quoted() -> None:
    node = Node("n1", "10.0.0.1", docker_host=NASTY)
    script = probe_script(node)
    assert f"H={shlex.quote(NASTY)};" in script
    assert probe_script(Node("n1", "10.0.0.1")).count("H='';") == 1


def test_script_runs_here_and_never_runs_inventory_values(tmp_path: Path) -> None:
    """The script under sh: the hostile docker_host reaches docker as one argument, nothing else runs."""
    marker = tmp_path / "pwned"
    node = Node("n1", "10.0.0.1", docker_host=f"tcp://x;touch {marker}")
    out = subprocess.run(["bash", "-c", probe_script(node)], check=False, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert not marker.exists()
    sec = parse_sections(out.stdout.partition("\n")[2])
    assert set(sec) == {"docker", "df", "gpus", "gpu_apps", "smi", "topo", "ibdev", "ib", "ofed", "mlx5", "netifs",
                        "hostname", "os", "os_release_file", "kernel", "arch", "lscpu", "cpuinfo", "meminfo"}
    assert sec["docker"][1] != 0 and sec["df"] == ("no data root on this machine\n", 1)


class FakeRemote:
    """A remote whose one command prints what a node would."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.commands: list[str] = []

    def run(self, command: str, **kw: Any) -> SimpleNamespace:
        self.commands.append(command)
        kw["out_stream"].write(self.stdout.partition("\n")[0] + "\n")
        return SimpleNamespace(stdout=self.stdout, exited=0)

    def close(self) -> None:
        pass


def node_output(date: str, **sections: tuple[str, int]) -> str:
    return date + "\n" + "".join(f"\n@@repro:{k}\n{v}\n@@repro-rc:{rc}\n" for k, (v, rc) in sections.items())


def test_probe_node_reads_every_section() -> None:
    ibstat = (DATA / "ibstat-roce-and-ib.txt").read_text()
    stdout = node_output(f"{time.time():.9f}", docker=(DOCKER_INFO, 0),
                         df=("Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda1 100 50 50 50% /", 0),
                         gpus=(V100_32_ROW + "\n" + V100_32_ROW, 0), ibdev=("rdma_cm\numad0\nuverbs0", 0), ib=(ibstat, 0),
                         hostname=("gpu01", 0))
    remote = FakeRemote(stdout)
    r = probe_node(Session(Node("n1", "10.0.0.1"), remote, 0.012))
    assert r.ssh == Probe(0.0, detail="connect 12 ms")
    assert r.docker == Probe("20.10.24+dfsg1", detail="/var/lib/docker")
    assert r.disk == Probe(50 * 1024)
    assert r.gpus.value == (Gpu("Tesla V100-SXM2-32GB", 32510, "450.80.02"),) * 2
    assert r.infiniband == Probe(parse_ibstat(ibstat), detail="/dev/infiniband")
    assert abs(r.clock.value) < 1
    assert remote.commands == [probe_script(Node("n1", "10.0.0.1"))]
    # the same output, read by the same parsers, gives the provenance's host facts
    assert r.host["docker"]["value"] == {"version": "20.10.24+dfsg1", "storage_driver": "overlay2", "default_runtime": "runc",
                                         "runtimes": ["io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc"]}
    assert [g["uuid"] for g in r.host["gpus"]["value"]] == ["GPU-aa", "GPU-aa"]
    assert [p["state"] for p in r.host["hcas"]["value"]] == [p.state.upper() for p in parse_ibstat(ibstat)]


def test_probe_node_fails_soft_per_probe() -> None:
    down = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    stdout = node_output("not-a-date", docker=(down, 1),
                         df=("no data root on this machine", 1), gpus=(NO_DRIVER, 9),
                         ibdev=("ls: cannot access '/dev/infiniband': No such file or directory", 2),
                         ib=("neither ibstat nor ibv_devinfo is installed", 127))
    r = probe_node(Session(Node("n1", "10.0.0.1", local=True), FakeRemote(stdout), None))
    assert r.ssh == Probe(detail="local")
    assert r.docker.reason == "docker: " + down
    assert r.disk == Probe(reason="disk: no data root on this machine")
    assert r.gpus == Probe(reason="gpus: " + NO_DRIVER)
    assert r.infiniband == Probe((), detail="no /dev/infiniband")
    assert r.clock == Probe(reason="clock: date printed 'not-a-date'")


# ---------------------------------------------------------------- comparison and output

V100_16_EXPECT = {"gpu_model": "Tesla V100-SXM2-16GB", "gpu_memory_gb": 16, "gpus_per_node": 8, "nodes": 4,
                  "driver": "440.33.01", "interconnect": "infiniband", "ib_rate_gbps": 100, "cuda": "10.2"}


def reports() -> list[NodeReport]:
    v100 = tuple(Gpu("Tesla V100-SXM2-32GB", 32510, "450.80.02") for _ in range(8))
    return [
        NodeReport("gpu1", "10.0.0.1", Probe(0.4, detail="connect 12 ms"), docker=Probe("20.10.7", detail="/var/lib/docker"),
                   gpus=Probe(v100), infiniband=Probe((IbPort("mlx5_0", 1, "Active", 100.0, "InfiniBand"),
                                                       IbPort("mlx5_1", 1, "Down", 10.0, "Ethernet"))),
                   disk=Probe(512 * 2**30), clock=Probe(0.0012)),
        NodeReport("gpu2", "10.0.0.2", Probe(0.6, detail="connect 15 ms"), docker=Probe("20.10.7"),
                   gpus=Probe(reason="gpus: " + NO_DRIVER), infiniband=Probe((), detail="no /dev/infiniband"),
                   disk=Probe(reason="disk: no data root on this machine"), clock=Probe(-1.5)),
        NodeReport("gpu3", "10.0.0.3", Probe(reason="node gpu3 (10.0.0.3) did not answer in time")),
    ]


def test_compare() -> None:
    assert [str(d) for d in compare(reports(), V100_16_EXPECT, 3)] == [
        "inventory: nodes: expected 4, found 3 in the inventory",
        "gpu1: gpu_model: expected Tesla V100-SXM2-16GB, found Tesla V100-SXM2-32GB",
        "gpu1: gpu_memory_gb: expected 16, found 32510 MiB",
        "gpu1: driver: expected 440.33.01, found 450.80.02",
        "gpu2: gpu_model: expected Tesla V100-SXM2-16GB, found unknown (the GPU probe failed)",
        "gpu2: interconnect: expected infiniband, found no /dev/infiniband",
    ]


def test_compare_matching_node_has_no_deviation() -> None:
    expect = {"gpu_model": "V100-SXM2-32GB", "gpu_memory_gb": 32, "gpus_per_node": 8, "driver": "450",
              "interconnect": "infiniband", "ib_rate_gbps": 100, "nodes": 1}
    assert compare(reports()[:1], expect, 1) == []
    assert [str(d) for d in compare(reports()[:1], {**expect, "ib_rate_gbps": 200, "gpus_per_node": 16}, 1)] == [
        "gpu1: gpus_per_node: expected 16, found 8", "gpu1: ib_rate_gbps: expected 200, found 100"]


def test_compare_roce_needs_an_ethernet_link_layer() -> None:
    assert [str(d) for d in compare(reports()[:1], {"interconnect": "roce"}, 1)] == [
        "gpu1: interconnect: expected roce, found no active RoCE port"]
    assert compare(reports()[:1], {"interconnect": "none"}, 1) == []


EXPECTED_TEXT = """\
node    ssh rtt    docker    gpus                      driver     infiniband                                                   disk free    clock offset
------  ---------  --------  ------------------------  ---------  -----------------------------------------------------------  -----------  --------------
gpu1    0.4 ms     20.10.7   8 x Tesla V100-SXM2-32GB  450.80.02  mlx5_0:1 Active 100G InfiniBand, mlx5_1:1 Down 10G Ethernet  512.0 GiB    +1.2 ms
gpu2    0.6 ms     20.10.7   ?                         ?          none                                                         ?            -1.500 s
gpu3    failed     -         -                         -          -                                                            -            -

problems:
  gpu3: node gpu3 (10.0.0.3) did not answer in time

probes that failed:
  gpu2: gpus: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.
  gpu2: disk: no data root on this machine

deviations from the target's expected hardware:
  inventory: nodes: expected 4, found 3 in the inventory
  gpu1: gpu_model: expected Tesla V100-SXM2-16GB, found Tesla V100-SXM2-32GB
  gpu1: gpu_memory_gb: expected 16, found 32510 MiB
  gpu1: driver: expected 440.33.01, found 450.80.02
  gpu2: gpu_model: expected Tesla V100-SXM2-16GB, found unknown (the GPU probe failed)
  gpu2: interconnect: expected infiniband, found no /dev/infiniband
"""


def test_render_exact() -> None:
    rs = reports()
    assert render_preflight(rs, compare(rs, V100_16_EXPECT, 3)) == EXPECTED_TEXT


def test_render_clean_cluster() -> None:
    rs = [NodeReport("vm", "127.0.0.1", Probe(detail="local"), docker=Probe("24.0.5"), gpus=Probe((), detail="no nvidia-smi"),
                     infiniband=Probe((), detail="no /dev/infiniband"), disk=Probe(3 * 2**30 // 2),
                     clock=Probe(0.0))]
    assert render_preflight(rs, []) == """\
node    ssh rtt    docker    gpus    driver    infiniband    disk free    clock offset
------  ---------  --------  ------  --------  ------------  -----------  --------------
vm      local      24.0.5    none    -         none          1.5 GiB      +0.0 ms
"""


def test_json() -> None:
    rs = reports()
    doc = json.loads(to_json(rs, [Deviation(None, "nodes", "4", "3 in the inventory")]))
    assert doc["problems"] == ["gpu3: node gpu3 (10.0.0.3) did not answer in time"]
    assert doc["deviations"] == [{"node": None, "what": "nodes", "expected": "4", "found": "3 in the inventory"}]
    assert doc["nodes"][0]["gpus"]["value"][0] == {
        "name": "Tesla V100-SXM2-32GB", "memory_mib": 32510, "driver": "450.80.02", "index": None, "uuid": None,
        "pci_bus_id": None, "clocks_max_sm_mhz": None, "clocks_max_mem_mhz": None, "clocks_app_mhz": None, "ecc": None,
        "vbios": None}
    assert doc["nodes"][0]["infiniband"]["value"][0] == {"device": "mlx5_0", "port": 1, "state": "Active",
                                                         "rate_gbps": 100.0, "link_layer": "InfiniBand", "fw": None}


def test_assess_exit_codes() -> None:
    ok = reports()[:1]
    devs = compare(ok, V100_16_EXPECT, 1)
    assess(ok, devs, strict=False)
    with pytest.raises(PreflightFailed) as e:
        assess(ok, devs, strict=True)
    assert e.value.exit_code == 3 and isinstance(e.value, EnvironmentUnavailable)
    assert str(e.value) == "4 deviation(s) from the target's expected hardware (--strict)"
    with pytest.raises(PreflightFailed, match="1 of 3 node"):
        assess(reports(), [], strict=False)
