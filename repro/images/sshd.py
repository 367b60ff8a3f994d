"""The layer the ``mpi`` launcher needs in every image it runs: an sshd and an ssh client.

mpirun in the rank-0 container starts the other nodes' ranks through an sshd the kit runs
in their containers. NGC containers (and most framework images) carry OpenMPI and an ssh
client but no sshd, so every image of an mpi target gets this layer on top, last: it
installs openssh-server (and the client) with apt when ``/usr/sbin/sshd`` or ``ssh`` is
missing (from the distribution's apt sources only: ``repro.images.apt``),
drops the host keys the package generates (each run brings its own), and checks
that both are there. The sshd configuration is written per run (``repro.run.launchers.mpi``).
Rendering is a pure function.
"""

from __future__ import annotations

from repro.images.apt import dist_apt_install

PACKAGES = ("openssh-server", "openssh-client")


def render_sshd_layer(base: str) -> str:
    """The Dockerfile that adds the mpi launcher's sshd on top of ``base`` (an image ID or ref)."""
    install = " \\\n        && ".join((*dist_apt_install(PACKAGES), "rm -f /etc/ssh/ssh_host_*"))
    return "\n".join([
        "# repro mpi layer: the sshd (and ssh client) mpirun reaches the other nodes' ranks through",
        f"FROM {base}",
        "RUN if [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null; then \\",
        "      command -v apt-get >/dev/null \\",
        "        || { echo 'repro: the image has no sshd and no apt-get to install openssh-server' >&2; "
        "exit 1; }; \\",
        f"      {install}; \\",
        "    fi \\",
        " && mkdir -p /run/sshd \\",
        " && test -x /usr/sbin/sshd && ssh -V",
    ]) + "\n"
