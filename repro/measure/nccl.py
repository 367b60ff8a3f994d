"""Which network transport NCCL used, read from its NCCL_DEBUG=INFO lines.

A multi-node cell that was published over InfiniBand but ran over TCP sockets is not a
reproduction: NCCL falls back to sockets silently when it finds no usable IB device -
for instance when the image lacks the HCA's userspace verbs driver (MLNX OFED or the
rdma-core providers), which libibverbs reports as "no userspace device-specific driver
found". This is the trap DLPerf documented for NGC containers.

NCCL has said which transport it picked in several ways over its releases; each kind of
line is evidence of a certain strength, and the strongest seen wins:

3. connections: ``Channel 00 : 0[0] -> 8[0] [send] via NET/IB/0`` (``Ring 00 : ...`` in
   older releases) - the transport actually used between nodes;
2. the choice: ``Using network IB`` / ``Using network Socket`` (``Using internal Network
   Socket`` in 2.2/2.3, ``Initialized NET plugin IB`` / ``Assigned NET plugin IB`` later);
1. initialisation: ``NET/IB : Using [0]mlx5_0:1/IB`` (IB devices found) or ``NET/IB : No
   device found`` (IB unavailable, sockets follow);
0. ``NET/Socket : Using [0]eth0:...`` alone - printed even when IB is then chosen.

RoCE goes through NCCL's IB transport (``mlx5_0:1/RoCE``) and counts as "IB" here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

IB = "IB"
SOCKET = "Socket"

_PATTERNS: tuple[tuple[int, re.Pattern[str], str | None], ...] = (
    (3, re.compile(r"\bvia NET/([^/\s]+(?: [^/\s]+)*)/\d"), None),
    (2, re.compile(r"\bUsing (?:internal )?[Nn]etwork (\S.*?)\s*$"), None),
    (2, re.compile(r"\b(?:Initialized|Assigned) NET plugin (\S+)"), None),
    (1, re.compile(r"\bNET/IB ?: ?Using \[\d+\]|\bNET/IB: \[\d+\] \S+/(?:IB|RoCE)\b"), IB),
    (1, re.compile(r"\bNET/IB ?: ?No device found|\bNet/IB: call to devices\(\) returned 0 devices"
                   r"|\bFailed to open libibverbs"), SOCKET),
    (0, re.compile(r"\bNET/Socket ?: ?Using \["), SOCKET),
)
_NO_DRIVER = re.compile(r"libibverbs: Warning: no userspace device-specific driver found for (\S+)")


@dataclass
class Scan:
    """What one node's log says about the network: transport, the line that decided it, missing driver."""

    transport: str | None = None
    rank: int = -1
    evidence: str | None = None
    missing_driver: str | None = None  # the uverbs device libibverbs had no driver for

    def feed(self, line: str) -> None:
        if "verbs" in line and self.missing_driver is None and (m := _NO_DRIVER.search(line)):
            self.missing_driver = m[1]
        if "NET" not in line and "etwork" not in line and "libibverbs" not in line:
            return
        for rank, pattern, fixed in _PATTERNS:
            if rank < self.rank:
                break
            m = pattern.search(line)
            if not m:
                continue
            name = fixed or normalise(m[1])
            # at equal strength a socket sighting wins: one socket connection is enough to slow a cell
            if rank > self.rank or (name == SOCKET and self.transport != SOCKET):
                self.transport, self.rank, self.evidence = name, rank, line.strip()
            break


def normalise(name: str) -> str:
    """NCCL's net names as this module reports them: IB (plugins included), Socket, else as printed."""
    if name.upper().startswith("IB"):
        return IB
    return SOCKET if name.lower() == "socket" else name


def scan(lines: Iterable[str]) -> Scan:
    """One pass over a log's lines (any iterable: a file streams)."""
    s = Scan()
    for line in lines:
        s.feed(line)
    return s


def transport(lines: Iterable[str]) -> str | None:
    """"IB", "Socket" (or another NCCL net's name), or None when the lines do not say."""
    return scan(lines).transport


def check_cell(per_node_lines: Mapping[str, Iterable[str]], nodes: int, expect_ib: bool) -> list[str]:
    """Problems with a cell's inter-node transport; empty when it used IB, or when IB was not expected.

    ``per_node_lines`` maps a node name to its log lines; ``nodes`` is the cell's node count
    (a single-node cell talks over NVLink/PCIe and is never flagged).
    """
    if nodes < 2 or not expect_ib:
        return []
    out = []
    for node, lines in per_node_lines.items():
        s = scan(lines)
        driver = (f"; libibverbs found no userspace driver for {s.missing_driver}: the image lacks the HCA's "
                  "verbs provider (MLNX OFED user space or rdma-core), see the target's ofed settings"
                  if s.missing_driver else "")
        if s.transport == IB:
            continue
        if s.transport is not None:
            out.append(f"{node}: NCCL used {s.transport}, not InfiniBand, between nodes "
                       f"(log: {s.evidence!r}){driver}")
        elif s.missing_driver:
            out.append(f"{node}: NCCL will have fallen back to sockets{driver}; "
                       "set NCCL_DEBUG=INFO to see the transport")
        else:
            out.append(f"{node}: cannot tell which transport NCCL used: no NCCL_DEBUG=INFO lines in the log")
    if out:
        log.warning("cell expected InfiniBand: %s", "; ".join(out))
    return out
