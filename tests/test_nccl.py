"""NCCL transport detection on real log excerpts (tests/data/nccl/README.md names their sources)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.measure.nccl import IB, SOCKET, check_cell, normalise, scan, transport

DATA = Path(__file__).parent / "data" / "nccl"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


@pytest.mark.parametrize(("name", "expected", "rank"), [
    ("ib-nccl2.4-socket-then-ib.log", IB, 1),
    ("ib-channels-p2p.log", IB, 3),
    ("ib-ring-gdrdma.log", IB, 3),
    ("ib-using-network-plugin.log", IB, 2),
    ("roce-using-network-ib.log", IB, 2),
    ("ib-nccl2.3-internal-network.log", IB, 2),
    ("socket-no-ib-device.log", SOCKET, 2),
    ("socket-channels.log", SOCKET, 3),
    ("socket-nccl2.3-sideband.log", SOCKET, 2),
    ("socket-nccl2.2-no-libibverbs.log", SOCKET, 2),
    ("socket-ibv-open-device-failed.log", SOCKET, 2),
    ("libibverbs-no-userspace-driver.log", None, -1),
    ("single-node-p2p-only.log", None, -1),
])
def test_transport_of_each_sample(name: str, expected: str | None, rank: int) -> None:
    assert transport(lines(name)) == expected
    assert scan(lines(name)).rank == rank


def test_every_sample_is_covered() -> None:
    names = {p.name for p in DATA.glob("*.log")}
    assert len(names) == 13


def test_streams_a_file_object() -> None:
    with (DATA / "socket-channels.log").open() as f:
        s = scan(f)
    assert s.transport == SOCKET
    assert s.evidence == ("worker:101542:101934 [0] NCCL INFO Channel 00 : 0[18000] -> 1[18000] [receive] "
                          "via NET/Socket/1")


def test_socket_line_before_ib_line_is_not_a_fallback() -> None:
    s = scan(lines("ib-nccl2.4-socket-then-ib.log"))
    assert s.evidence == "master_node:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>"


def test_sideband_interface_line_is_not_ib() -> None:
    s = scan(lines("socket-nccl2.3-sideband.log"))
    assert s.evidence == "ml3:32632:32662 [0] NCCL INFO Using network Socket"


def test_connections_outrank_the_announced_choice() -> None:
    announced = "h:1:1 [0] NCCL INFO Using network IB"
    channel = "h:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Socket/0"
    assert transport([announced, channel]) == SOCKET
    assert transport([channel, announced]) == SOCKET


def test_one_socket_connection_among_ib_ones_counts_as_socket() -> None:
    ib = lines("ib-channels-p2p.log")
    sock = "h:1:2 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [send] via NET/Socket/0"
    assert transport([*ib, sock, *ib]) == SOCKET


def test_missing_driver_is_noted() -> None:
    assert scan(lines("libibverbs-no-userspace-driver.log")).missing_driver == "/sys/class/infiniband_verbs/uverbs0"
    assert scan(lines("socket-no-ib-device.log")).missing_driver is None


@pytest.mark.parametrize(("name", "out"), [
    ("IB", IB), ("IBext", IB), ("IBext_v8", IB), ("Socket", SOCKET), ("AWS Libfabric", "AWS Libfabric"),
])
def test_normalise(name: str, out: str) -> None:
    assert normalise(name) == out


def test_plugin_net_names_in_connection_lines() -> None:
    assert transport(["x [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IBext_v8/0/GDRDMA"]) == IB
    assert transport(["x [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA"]) == \
        "AWS Libfabric"


def test_check_cell_ib_everywhere_is_clean() -> None:
    per_node = {"n1": lines("ib-channels-p2p.log"), "n2": lines("roce-using-network-ib.log")}
    assert check_cell(per_node, 2, expect_ib=True) == []


def test_check_cell_flags_socket_fallback() -> None:
    per_node = {"n1": lines("ib-channels-p2p.log"), "n2": lines("socket-no-ib-device.log")}
    assert check_cell(per_node, 2, expect_ib=True) == [
        ("n2: NCCL used Socket, not InfiniBand, between nodes "
         "(log: '05-06-76-200:7839:7911 [0] NCCL INFO Using network Socket')")]


def test_check_cell_flags_the_missing_ofed_trap() -> None:
    per_node = {"node1": lines("libibverbs-no-userspace-driver.log"),
                "node2": lines("libibverbs-no-userspace-driver.log") + lines("socket-no-ib-device.log")}
    driver = ("libibverbs found no userspace driver for /sys/class/infiniband_verbs/uverbs0: the image lacks the "
              "HCA's verbs provider (MLNX OFED user space or rdma-core), see the target's ofed settings")
    assert check_cell(per_node, 2, expect_ib=True) == [
        f"node1: NCCL will have fallen back to sockets; {driver}; set NCCL_DEBUG=INFO to see the transport",
        ("node2: NCCL used Socket, not InfiniBand, between nodes "
         f"(log: '05-06-76-200:7839:7911 [0] NCCL INFO Using network Socket'); {driver}"),
    ]


def test_check_cell_says_when_it_cannot_tell() -> None:
    assert check_cell({"n1": ["Epoch: [0][ 0/53] Time 12.054"]}, 2, expect_ib=True) == [
        "n1: cannot tell which transport NCCL used: no NCCL_DEBUG=INFO lines in the log"]


@pytest.mark.parametrize(("nodes", "expect_ib"), [(1, True), (4, False)])
def test_check_cell_only_multi_node_ib_cells(nodes: int, expect_ib: bool) -> None:
    assert check_cell({"n1": lines("socket-no-ib-device.log")}, nodes, expect_ib) == []
