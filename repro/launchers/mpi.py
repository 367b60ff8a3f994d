"""``mpi``: Horovod / mpirun into containers.

Every node but the first runs only an sshd on a per-run port with per-run keys; the
rank-0 container runs ``mpirun`` with a generated hostfile, and OpenMPI starts the remote
ranks through that sshd. The keys live in a per-run directory the kit mounts at
``MPI_DIR`` (read-only), and the host key is pinned in ``known_hosts``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from repro.hosts import Node
from repro.launchers import LAUNCHERS
from repro.launchers.base import Launcher, NodeCommand, fill
from repro.manifest import Cell, Launch

MPI_DIR = "/run/repro-mpi"
DEFAULT_SSH_PORT = 12345


def hostfile(cell: Cell, nodes: Sequence[Node], slots: str) -> str:
    n = cell.gpus_per_node if slots == "gpus_per_node" else 1
    return "".join(f"{node.address} slots={n}\n" for node in nodes)


def ssh_command(port: int) -> str:
    return (f"ssh -p {port} -i {MPI_DIR}/id_ed25519 -o IdentitiesOnly=yes "
            f"-o UserKnownHostsFile={MPI_DIR}/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes")


@LAUNCHERS.register("mpi")
class MpiLauncher(Launcher):
    def render(self, launch: Launch, cell: Cell, nodes: Sequence[Node], env: Mapping[str, str]) -> list[NodeCommand]:
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
        out = [NodeCommand(nodes[0], 0, "mpi-head", head, env, {f"{MPI_DIR}/hostfile": hostfile(cell, nodes, slots)})]
        for rank, node in enumerate(nodes[1:], start=1):
            sshd = ("/usr/sbin/sshd", "-D", "-e", "-p", str(port), "-o", f"ListenAddress={node.address}",
                    "-o", f"HostKey={MPI_DIR}/host_ed25519", "-o", f"AuthorizedKeysFile={MPI_DIR}/authorized_keys",
                    "-o", "PasswordAuthentication=no", "-o", "PermitRootLogin=prohibit-password",
                    "-o", "StrictModes=no", "-o", "UsePAM=no")
            out.append(NodeCommand(node, rank, "mpi-sshd", sshd, env))
        return out
