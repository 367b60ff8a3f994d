"""``mpi``: Horovod / mpirun into containers.

Every node but the first runs only an sshd (the image's mpi layer installs it) with a
per-run configuration, port and keys; the rank-0 container runs ``mpirun`` with a
generated hostfile, and OpenMPI starts the remote ranks through that sshd. The keys and
the configuration live in a per-run directory the kit copies to ``MPI_DIR``, and the
host key is pinned in ``known_hosts``.

A session that sshd opens starts from a bare environment, not from the container's: the
image's ``ENV`` (NGC: ``PATH`` and ``LD_LIBRARY_PATH`` with ``/usr/local/mpi``,
``OPAL_PREFIX``) would not reach ``orted`` or the ranks, and ``-x`` forwards variables
to the ranks only once ``orted`` already runs. So the kit writes the sshd container's
whole environment, as the engine composed it (image ``ENV`` plus the run's), into
``~/.ssh/environment`` and the sshd configuration sets ``PermitUserEnvironment``: every
session on that node, ``orted`` included, starts with exactly the environment the
container has. This works with every OpenSSH release (``SetEnv`` in sshd_config needs
8.7, newer than the sshd of NGC's Ubuntu 18.04/20.04 bases), needs no list of names
known in advance, and leaves ``mpirun``'s own ``--prefix`` (in ``launch.mpi.args``)
usable on top.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from repro.spec.hosts import Node
from repro.run.launchers import LAUNCHERS
from repro.run.launchers.base import Launcher, NodeCommand, fill
from repro.spec.manifest import Cell, Launch

MPI_DIR = "/run/repro-mpi"
DEFAULT_SSH_PORT = 12345
#: Where sshd reads a session's environment from (root's, as the ranks run as root).
SESSION_ENV = "/root/.ssh/environment"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def hostfile(cell: Cell, nodes: Sequence[Node], slots: str) -> str:
    n = cell.gpus_per_node if slots == "gpus_per_node" else 1
    return "".join(f"{node.rendezvous} slots={n}\n" for node in nodes)


def ssh_command(port: int) -> str:
    return (f"ssh -p {port} -i {MPI_DIR}/id_ed25519 -o IdentitiesOnly=yes "
            f"-o UserKnownHostsFile={MPI_DIR}/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes")


def sshd_config(port: int, address: str) -> str:
    """The per-run sshd configuration of a worker node (read instead of the image's own); it listens on the
    node's rendezvous address, where the hostfile sends mpirun."""
    return "".join(f"{k} {v}\n" for k, v in (
        ("Port", port), ("ListenAddress", address), ("HostKey", f"{MPI_DIR}/host_ed25519"),
        ("AuthorizedKeysFile", f"{MPI_DIR}/authorized_keys"), ("PasswordAuthentication", "no"),
        ("PermitRootLogin", "prohibit-password"), ("StrictModes", "no"), ("UsePAM", "no"),
        ("PermitUserEnvironment", "yes")))


def session_environment(env: Sequence[str]) -> str:
    """``~/.ssh/environment`` for a container's ``NAME=value`` list (its Config.Env).

    sshd reads one assignment per line, so a value with a line break cannot be carried
    and is left out.
    """
    out = []
    for entry in env:
        name, sep, value = entry.partition("=")
        if sep and _NAME.fullmatch(name) and "\n" not in value and "\r" not in value:
            out.append(f"{name}={value}\n")
    return "".join(out)


@LAUNCHERS.register("mpi")
class MpiLauncher(Launcher):
    def render(self, launch: Launch, cell: Cell, nodes: Sequence[Node],
               env: Mapping[str, str]) -> list[NodeCommand]:
        port = int(launch.mpi.get("ssh_port", DEFAULT_SSH_PORT))
        slots = launch.mpi.get("slots", "gpus_per_node")
        np_ = cell.gpus if slots == "gpus_per_node" else cell.nodes
        env = dict(env)
        forwarded = [tok for name in ("PATH", "LD_LIBRARY_PATH", *sorted(env)) for tok in ("-x", name)]
        head = (
            "mpirun", "--allow-run-as-root", "-np", str(np_), "--hostfile", f"{MPI_DIR}/hostfile",
            "--bind-to", "none", "--map-by", "slot", "-mca", "plm_rsh_agent", ssh_command(port),
            *forwarded, *launch.mpi.get("args", ()), *fill(launch.command, launch, cell, nodes, 0),
        )
        out = [NodeCommand(nodes[0], 0, "mpi-head", head, env,
                           {f"{MPI_DIR}/hostfile": hostfile(cell, nodes, slots)})]
        sshd = ("/usr/sbin/sshd", "-D", "-e", "-f", f"{MPI_DIR}/sshd_config")
        for rank, node in enumerate(nodes[1:], start=1):
            out.append(NodeCommand(node, rank, "mpi-sshd", sshd, env,
                                   {f"{MPI_DIR}/sshd_config": sshd_config(port, node.rendezvous)}))
        return out
