"""RDMA and NCCL network settings: container options of RDMA cells, the host-side RDMA and interface checks of
preflight, the check ``ibv_devinfo`` makes in a cell's container, and the NCCL transport findings of ``up``.

Command output comes from tests/data/preflight and tests/data/nccl (real captures; their READMEs name the
sources). Expected values are written from those files and from NCCL's documented NCCL_SOCKET_IFNAME syntax.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from repro.spec.hosts import Hosts, Node
from repro.run.launch import NodeResult, rdma_check_problem
from repro.run.launchers.base import rdma_container_options
from repro.spec.manifest import Cell, Rdma, find_target, load_catalog, manifest_files
from repro.run.plan import docker_run_flags, plan_cell
from repro.nodes.preflight import Deviation, NodeReport, Probe, _from_sections, compare_rdma, container_mofed, ifname_matches, image_env, interface_problems, site_checks, version_key
from repro.nodes.facts import parse_ofed_info

DATA = Path(__file__).resolve().parent / "data"
PREFLIGHT = DATA / "preflight"
NCCL_LOGS = DATA / "nccl"

# --- which targets use RDMA, and what their containers get -------------------------------------------------


def test_strategy_is_the_manifests_rdma_field() -> None:
    assert find_target("dlperf-ngc-pytorch-rn50-v100").rdma_strategy == "mlnx-ofed"
    assert find_target("ngc-pytorch-rn50-v100").rdma_strategy == "image"
    assert find_target("torch-rn50-cpu").rdma_strategy is None  # no rdma section
    assert dataclasses.replace(find_target("torch-rn50-cpu"), rdma=Rdma("inbox")).rdma_strategy == "inbox"


def four_hosts() -> Hosts:
    return Hosts(tuple(Node(f"n{i}", f"10.0.0.{i}") for i in range(1, 5)), data="/data")


def test_multi_node_rdma_cells_get_the_hcas_ipc_lock_and_unlimited_memlock() -> None:
    m = find_target("ngc-tf1-rn50-v100")
    four = next(c for c in m.cells() if c.nodes == 4)
    one = next(c for c in m.cells() if c.nodes == 1)
    flags4 = docker_run_flags(plan_cell(m, four, four_hosts())[0].container)
    flags1 = docker_run_flags(plan_cell(m, one, four_hosts())[0].container)
    assert "--device=/dev/infiniband:/dev/infiniband" in flags4 and "--cap-add=IPC_LOCK" in flags4
    assert "--ulimit=memlock=-1" in flags4
    assert not any(f.startswith(("--device", "--cap-add")) for f in flags1)


def test_rdma_memlock_wins_over_a_manifest_limit() -> None:
    m = find_target("ngc-tf1-rn50-v100")
    limited = dataclasses.replace(m, launch=dataclasses.replace(
        m.launch, container={**m.launch.container, "ulimits": {"memlock": 65536}, "cap_add": ["SYS_NICE"]}))
    four = next(c for c in m.cells() if c.nodes == 4)
    opts = plan_cell(limited, four, four_hosts())[0].container
    assert opts["ulimits"] == [{"name": "memlock", "soft": -1, "hard": -1}]
    assert opts["cap_add"] == ["IPC_LOCK", "SYS_NICE"]
    one = next(c for c in m.cells() if c.nodes == 1)
    assert plan_cell(limited, one, four_hosts())[0].container["ulimits"] == [
        {"name": "memlock", "soft": 65536, "hard": 65536}]


def test_no_rdma_options_for_ethernet_targets() -> None:
    m = find_target("torch-rn50-cpu")
    two = next(c for c in m.cells() if c.nodes == 2)
    assert rdma_container_options(m, two) == {}


# --- manifests: NCCL INFO in every multi-node GPU cell, no publisher network names ---------------------------

def all_manifests() -> list:
    return list(load_catalog(manifest_files()).values())


SITE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA")


def test_every_multi_node_gpu_cell_logs_nccl_info_and_no_manifest_names_the_site_network() -> None:
    gpu_targets = [m for m in all_manifests() if "gpu_model" in m.expect]
    # tf-ps targets (tf_cnn_benchmarks' parameter servers) move tensors between nodes over gRPC, not NCCL
    multi = [(m, c) for m in gpu_targets for c in m.cells() if c.nodes > 1 and m.launch.kind != "tf-ps"]
    assert {m.id for m, _ in multi} >= {"paddle-rn50-v100", "paddle-rn50-v100-2.3", "ngc-tf1-rn50-v100",
                                        "ngc-pytorch-rn50-v100", "dlperf-tf2-rn50-v100"}
    for m, c in multi:
        assert m.launch.env_for(c).get("NCCL_DEBUG") == "INFO", (m.id, c.key)
    for m in all_manifests():
        for c in m.cells():
            assert not set(m.launch.env_for(c)) & set(SITE_VARS), (m.id, c.key)


def test_the_publishers_values_stay_in_the_notes() -> None:
    for target in ("ngc-tf1-rn50-v100", "ngc-tf1-rn50-v100-2.3", "ngc-pytorch-rn50-v100", "ngc-pytorch-rn50-v100-2.3"):
        notes = " ".join(find_target(target).notes)
        assert "NCCL_SOCKET_IFNAME=xgbe0" in notes and "NCCL_IB_GID_INDEX=3" in notes, target


def test_site_env_reaches_the_cell() -> None:
    m = find_target("ngc-pytorch-rn50-v100")
    four = next(c for c in m.cells() if c.nodes == 4)
    env = m.launch.env_for(four, {"NCCL_SOCKET_IFNAME": "=ib0", "NCCL_IB_GID_INDEX": "3"})
    assert env["NCCL_SOCKET_IFNAME"] == "=ib0" and env["NCCL_IB_GID_INDEX"] == "3" and env["NCCL_DEBUG"] == "INFO"


# --- preflight: socket interfaces ---------------------------------------------------------------------------

IFACES = ("docker0", "eth0", "eth1", "ib0", "lo")


@pytest.mark.parametrize(("var", "spec", "used"), [
    ("NCCL_SOCKET_IFNAME", "eth", ["eth0", "eth1"]),  # prefixes
    ("NCCL_SOCKET_IFNAME", "=eth0", ["eth0"]),  # an exact name
    ("NCCL_SOCKET_IFNAME", "=eth", []),  # exact: no interface is called "eth"
    ("NCCL_SOCKET_IFNAME", "ib,eth1", ["eth1", "ib0"]),
    ("NCCL_SOCKET_IFNAME", "^docker,lo", ["eth0", "eth1", "ib0"]),  # exclusion by prefix
    ("NCCL_SOCKET_IFNAME", "^=docker0", ["eth0", "eth1", "ib0", "lo"]),
    ("NCCL_SOCKET_IFNAME", "^e,d,i,l", []),  # everything excluded
    ("NCCL_SOCKET_IFNAME", "xgbe0", []),
    ("GLOO_SOCKET_IFNAME", "eth0,eth1", ["eth0", "eth1"]),
    ("GLOO_SOCKET_IFNAME", "eth", []),  # Gloo takes whole names only
])
def test_ifname_syntax(var: str, spec: str, used: list[str]) -> None:
    assert ifname_matches(var, spec, IFACES) == used


def node(name: str, interfaces: tuple[str, ...] | None, **probes: Probe) -> NodeReport:
    probes = {"gpus": Probe(()), "infiniband": Probe(()), "disk": Probe(2**30), "clock": Probe(0.001), **probes}
    return NodeReport(name, "10.0.0.1", Probe(0.1), docker=Probe("24.0"),
                      interfaces=Probe(interfaces) if interfaces is not None else Probe(reason="interfaces: gone"),
                      **probes)


def test_interface_problems_name_node_variable_and_fix() -> None:
    reports = [node("a", ("eth0", "lo")), node("b", ("ens1", "lo")), node("c", None)]
    envs = [{"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0,eth1"}, {"NCCL_SOCKET_IFNAME": "eth"}]
    assert interface_problems(reports, envs) == [
        "a: GLOO_SOCKET_IFNAME=eth0,eth1 names eth1, not there (it has eth0, lo); "
        "set GLOO_SOCKET_IFNAME in the hosts file's env to this cluster's interface",
        "b: GLOO_SOCKET_IFNAME=eth0,eth1 matches no interface there (it has ens1, lo); "
        "set GLOO_SOCKET_IFNAME in the hosts file's env to this cluster's interface",
        "b: NCCL_SOCKET_IFNAME=eth matches no interface there (it has ens1, lo); "
        "set NCCL_SOCKET_IFNAME in the hosts file's env to this cluster's interface",
        "c: cannot check GLOO_SOCKET_IFNAME=eth0,eth1, NCCL_SOCKET_IFNAME=eth: interfaces: gone",
    ]
    assert interface_problems(reports, [{"NCCL_DEBUG": "INFO"}]) == []


def test_site_checks_use_every_cells_env_with_the_site_env() -> None:
    m = find_target("ngc-pytorch-rn50-v100")
    reports = [node("a", ("eth0", "lo"), rdma_driver=Probe({"ofed": "5.0-2.1.8.0", "mlx5_core": "5.0-2.1.8"}))]
    assert site_checks(reports, m, {"NCCL_SOCKET_IFNAME": "^lo"}, m.cells()) == ([], [])
    _, blocking = site_checks(reports, m, {"NCCL_SOCKET_IFNAME": "xgbe0"}, m.cells())
    assert blocking == ["a: NCCL_SOCKET_IFNAME=xgbe0 matches no interface there (it has eth0, lo); "
                        "set NCCL_SOCKET_IFNAME in the hosts file's env to this cluster's interface"]
    assert site_checks(reports, None, {"NCCL_SOCKET_IFNAME": "eth"}) == ([], [])


# --- preflight: the host side of RDMA ------------------------------------------------------------------------

def test_ofed_info_and_versions() -> None:
    assert parse_ofed_info((PREFLIGHT / "ofed_info-s-internal.txt").read_text()) == "25.01-0.6.0"
    with pytest.raises(ValueError, match="ofed_info -s printed no version"):
        parse_ofed_info("ofed_info: command not found\n")
    assert version_key("5.0-2.1.8.0") == (5, 0, 2, 1, 8, 0)
    assert version_key("4.6-1.0.1") < version_key("4.9-0.1.7.0") < version_key("5.0-2.1.8.0")
    assert version_key("5.4-rdmacore36.0") == (5, 4)


def sections(ofed: tuple[str, int], mlx5: tuple[str, int]) -> dict[str, tuple[str, int]]:
    return {"docker": ("24.0 /var/lib/docker", 0), "ofed": ofed, "mlx5": mlx5, "netifs": ("eth0\nib0\nlo\n", 0)}


def test_probe_sections_give_driver_and_interfaces() -> None:
    out = _from_sections(sections(((PREFLIGHT / "ofed_info-s-internal.txt").read_text(), 0), ("25.01-0.6.0\n", 0)))
    assert out["rdma_driver"] == Probe({"ofed": "25.01-0.6.0", "mlx5_core": "25.01-0.6.0"})
    assert out["interfaces"] == Probe(("eth0", "ib0", "lo"))
    inbox = _from_sections(sections(("ofed_info: not found\n", 127), ("inbox\n", 0)))
    assert inbox["rdma_driver"] == Probe({"ofed": None, "mlx5_core": "inbox"})
    none = _from_sections(sections(("ofed_info: not found\n", 127), ("mlx5_core: not loaded\n", 1)))
    assert none["rdma_driver"] == Probe({"ofed": None, "mlx5_core": None}, detail="mlx5_core not loaded")


def ngc_env() -> dict[str, str]:
    lines = (PREFLIGHT / "ngc-pytorch-20.06-env.txt").read_text().splitlines()
    return image_env({"Config": {"Env": [ln.removeprefix("export ") for ln in lines]}})


def test_the_containers_mofed_per_strategy() -> None:
    assert container_mofed(find_target("paddle-rn50-v100")) == "5.0-2.1.8.0"  # the pinned bundle
    image = find_target("ngc-pytorch-rn50-v100")
    assert container_mofed(image, ngc_env()) == "4.6-1.0.1"  # what the image declares
    assert container_mofed(image, {}) is None
    assert container_mofed(find_target("torch-rn50-cpu"), ngc_env()) is None  # no RDMA at all


def test_host_mofed_older_than_the_containers_is_a_deviation() -> None:
    m = find_target("paddle-rn50-v100")  # mlnx-ofed 5.0-2.1.8.0
    reports = [node("old", (), rdma_driver=Probe({"ofed": "4.9-0.1.7.0", "mlx5_core": "4.9-0.1.7"})),
               node("new", (), rdma_driver=Probe({"ofed": "25.01-0.6.0", "mlx5_core": "25.01-0.6.0"})),
               node("inbox", (), rdma_driver=Probe({"ofed": None, "mlx5_core": "inbox"})),
               node("none", (), rdma_driver=Probe({"ofed": None, "mlx5_core": None})),
               node("failed", (), rdma_driver=Probe(reason="rdma_driver: no output from the probe"))]
    assert [str(d) for d in compare_rdma(reports, m, multi_node=True)] == [
        "old: mofed: expected >= 5.0-2.1.8.0 (the containers' MOFED user space, mlnx-ofed), found 4.9-0.1.7.0 on the host",
        "inbox: mofed: expected >= 5.0-2.1.8.0 (the containers' MOFED user space, mlnx-ofed), found the kernel's "
        "inbox mlx5 driver, no MLNX_OFED",
        "none: rdma_driver: expected mlx5_core loaded, found mlx5_core not loaded",
        "failed: rdma_driver: expected mlx5_core, found unknown (rdma_driver: no output from the probe)",
    ]
    assert compare_rdma(reports, m, multi_node=False) == []
    # strategy image: the image's MOFED_VERSION (NGC 20.06: 4.6-1.0.1) against the host's
    ngc = find_target("ngc-pytorch-rn50-v100")  # strategy image
    assert compare_rdma(reports[:3], ngc, multi_node=True) == []  # before the image is known: nothing to compare
    assert compare_rdma(reports[:3], ngc, multi_node=True, image_env=ngc_env()) == []  # 4.9 and 25.01 >= 4.6
    newer = {**ngc_env(), "MOFED_VERSION": "5.0-2.1.8.0"}
    assert compare_rdma(reports[:3], ngc, multi_node=True, image_env=newer) == [
        Deviation("old", "mofed", ">= 5.0-2.1.8.0 (the containers' MOFED user space, image)", "4.9-0.1.7.0 on the host")]


# --- up: ibv_devinfo in the first container of a multi-node RDMA cell -----------------------------------------

def test_rdma_check_reads_ibv_devinfo() -> None:
    assert rdma_check_problem(0, (PREFLIGHT / "ibv_devinfo-v-hdr.txt").read_text()) is None  # an active port
    assert rdma_check_problem(0, (PREFLIGHT / "ibv_devinfo-plain-roce.txt").read_text()) == \
        "ibv_devinfo sees no active port: mlx5_12:1 PORT_DOWN"
    assert rdma_check_problem(255, (PREFLIGHT / "ibv_devinfo-no-verbs-kernel.txt").read_text()) == \
        "ibv_devinfo sees no RDMA device (Failed to get IB devices list: Function not implemented)"
    assert rdma_check_problem(127, "") == "ibv_devinfo is not in the image (exit status 127)"


# --- up: the NCCL transport of a finished cell ----------------------------------------------------------------

def results(tmp_path: Path, logs: dict[str, str], role: str = "worker") -> list[NodeResult]:
    out = []
    for rank, (name, src) in enumerate(logs.items()):
        path = tmp_path / f"{rank}-{name}.log"
        shutil.copyfile(NCCL_LOGS / src, path)
        out.append(NodeResult(name, f"10.0.0.{rank + 1}", rank, role if rank else "worker", (), str(path)))
    return out


def test_transport_findings_per_node(tmp_path: Path) -> None:
    from repro.measure.transport import transport_findings

    m = find_target("ngc-pytorch-rn50-v100")  # expect: interconnect infiniband
    four = next(c for c in m.cells() if c.nodes == 4)
    nodes = results(tmp_path, {"n1": "ib-channels-p2p.log", "n2": "socket-no-ib-device.log",
                               "n3": "ib-nccl2.4-socket-then-ib.log", "n4": "libibverbs-no-userspace-driver.log"})
    found = transport_findings(m, four, nodes)
    assert found[0] == ("n2: NCCL used Socket, not InfiniBand, between nodes "
                        "(log: '05-06-76-200:7839:7911 [0] NCCL INFO Using network Socket')")
    assert [f.split(":")[0] for f in found] == ["n2", "n4"]
    assert "libibverbs found no userspace driver for /sys/class/infiniband_verbs/uverbs0" in found[1]
    one = next(c for c in m.cells() if c.nodes == 1)
    assert transport_findings(m, one, nodes[:1]) == []  # one node: NVLink/PCIe, never flagged
    cpu = find_target("torch-rn50-cpu")  # expect: ethernet
    assert transport_findings(cpu, Cell(2, 1, "fp32", 8), nodes[1:3]) == []


def test_mpi_sshd_logs_are_not_read(tmp_path: Path) -> None:
    from repro.measure.transport import transport_findings

    m = find_target("ngc-tf1-rn50-v100")
    four = next(c for c in m.cells() if c.nodes == 4)
    nodes = results(tmp_path, {"n1": "ib-ring-gdrdma.log", "n2": "socket-channels.log", "n3": "socket-channels.log",
                               "n4": "socket-channels.log"}, role="mpi-sshd")
    assert transport_findings(m, four, nodes) == []  # the head's log holds every rank's lines
    (tmp_path / "0-n1.log").unlink()
    assert transport_findings(m, four, nodes) == ["n1: no log to read the NCCL transport from"]


def run_repeat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: dict[str, str], *, strict: bool):
    """One repeat of the 4-node cell through up's repeat step, the cell's logs being the captured NCCL lines
    (no GPU cluster here: the launch writes them where the containers' output would go)."""
    from repro.up import UpResult
    from repro.up.matrix import Repeats
    from repro.record import provenance
    from repro.events import ignore
    from repro.run.rundir import RunDir

    m = find_target("ngc-pytorch-rn50-v100")
    four = next(c for c in m.cells() if c.nodes == 4)
    hosts = four_hosts()
    run = RunDir.create(tmp_path / "runs", m, hosts, env={})

    def launch(job):  # noqa: ANN001, ANN202
        log_dir = job.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        out = []
        for rank, (name, src) in enumerate(logs.items()):
            path = log_dir / f"{rank}-{name}.log"
            shutil.copyfile(NCCL_LOGS / src, path)
            out.append(NodeResult(name, f"10.0.0.{rank + 1}", rank, "worker", ("python",), str(path),
                                  exit_code=0, started="2026-01-01T00:00:00.000+00:00", ended="2026-01-01T00:01:00.000+00:00"))
        return out

    result = UpResult(run, m, provenance.new_record(run, m, hosts))
    ok = Repeats(result, hosts, "img", launch, ignore, strict=strict).run(four, 1)
    provenance.check_record(result.record)
    return ok, run.read_state()["cells"][four.key]["repeats"]["1"], result


SOCKET_LINE = "(log: '05-06-76-200:7839:7911 [0] NCCL INFO Using network Socket')"


def test_sockets_where_ib_was_expected_is_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.up import findings_section

    logs = {"n1": "ib-channels-p2p.log", "n2": "socket-no-ib-device.log", "n3": "ib-channels-p2p.log",
            "n4": "ib-channels-p2p.log"}
    ok, state, result = run_repeat(tmp_path, monkeypatch, logs, strict=False)
    assert ok and state["status"] == "done"
    text = f"n2: NCCL used Socket, not InfiniBand, between nodes {SOCKET_LINE}"
    assert result.record["findings"] == [{"cell": "4n8g-fp32-bs256", "repeat": 1, "kind": "nccl-transport",
                                          "text": text}]
    assert findings_section(result.record) == f"\nFindings:\n\n- 4n8g-fp32-bs256 repeat 1: nccl-transport: {text}\n"


def test_sockets_fail_the_repeat_under_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = {"n1": "ib-channels-p2p.log", "n2": "socket-no-ib-device.log", "n3": "ib-channels-p2p.log",
            "n4": "ib-channels-p2p.log"}
    ok, state, result = run_repeat(tmp_path, monkeypatch, logs, strict=True)
    assert not ok and state["status"] == "failed"
    assert state["why"] == ("NCCL did not use InfiniBand between nodes (--strict): "
                            f"n2: NCCL used Socket, not InfiniBand, between nodes {SOCKET_LINE}")
    assert len(result.record["findings"]) == 1


def test_ib_on_every_node_is_no_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.up import findings_section

    logs = {"n1": "ib-channels-p2p.log", "n2": "ib-using-network-plugin.log", "n3": "roce-using-network-ib.log",
            "n4": "ib-nccl2.3-internal-network.log"}
    ok, state, result = run_repeat(tmp_path, monkeypatch, logs, strict=True)
    assert ok and state["status"] == "done" and result.record["findings"] == []
    assert findings_section(result.record) == ""


def test_missing_interfaces_stop_preflight_whatever_the_flags() -> None:
    from repro.errors import EnvironmentUnavailable
    from repro.nodes.preflight import assess
    from repro.nodes.table import render_preflight

    reports = [node("a", ("ens1", "lo")), node("b", ("eth0", "lo"))]
    blocking = interface_problems(reports, [{"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0"}])
    assert [b.split(":")[0] for b in blocking] == ["a", "a"]
    with pytest.raises(EnvironmentUnavailable, match=r"^1 of 2 node\(s\) cannot run a target$"):
        assess(reports, [], strict=False, blocking=blocking)
    assess(reports, [], strict=False)  # the same nodes with no interface named: nothing stops them
    text = render_preflight(reports, [], blocking)
    assert text.endswith("\nproblems:\n" + "".join(f"  {b}\n" for b in blocking))
