"""Run a command with POD_IP set to this node's own address out of a comma-separated list.

Usage: with_node_address.py ADDR[,ADDR...] COMMAND [ARG...]

paddle.distributed.launch --ips=a,b ranks a node by the position of the node's own address
in the list, and it takes that address from the node's hostname (gethostbyname of the fully
qualified hostname). Where the hostname does not resolve, or resolves to another interface
than the one listed, it uses 127.0.0.1 or that other address, finds it nowhere in the list,
and gives the node rank 0 without a word: two nodes both rank 0 wait for each other until
the cell times out. The launcher reads the node's address from POD_IP when it is set. This
sets it to the listed address that the node owns, the one a socket can bind to, and then
replaces itself with COMMAND; the launcher still derives the rank from the address itself.
An address list with none of the node's addresses is an error, not a silent rank 0.
"""

from __future__ import annotations

import os
import socket
import sys


def own_address(addresses: list[str]) -> str | None:
    """The first of ``addresses`` this machine can bind a socket to, i.e. one of its own."""
    for addr in addresses:
        try:
            infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        for family, kind, proto, _, sockaddr in infos:
            with socket.socket(family, kind, proto) as s:
                try:
                    s.bind(sockaddr)
                except OSError:
                    continue
                return addr
    return None


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    addresses = [a for a in argv[0].split(",") if a]
    addr = own_address(addresses)
    if addr is None:
        print(f"with_node_address: none of {', '.join(addresses)} is an address of this node "
              f"({socket.gethostname()})", file=sys.stderr)
        return 2
    print(f"with_node_address: {socket.gethostname()} owns {addr} of {argv[0]}; POD_IP={addr}", flush=True)
    os.environ["POD_IP"] = addr
    os.execvp(argv[1], argv[1:])
    return 127  # not reached: execvp raises on failure


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
