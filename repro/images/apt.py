"""apt in the kit's own layers (the RDMA user space, the mpi launcher's sshd): distribution packages from the
distribution's own apt sources alone.

Images built FROM ``nvidia/cuda`` (TensorFlow's ``-gpu`` images, NGC containers and the images built on them)
carry NVIDIA's CUDA apt sources (``/etc/apt/sources.list.d/cuda.list``, ``nvidia-ml.list``); after NVIDIA
rotated the key those sources are signed with (April 2022), ``apt-get update`` in an image made before it
stops with ``NO_PUBKEY A4B469963BF863CC``. The kit's layers need no package from NVIDIA, so their apt reads
only the distribution's sources: ``/etc/apt/sources.list`` and ``sources.list.d/debian.sources`` or
``ubuntu.sources``, copied for the one RUN and handed to apt as ``-o`` options. The image's own apt
configuration is left as the base has it. Rendering is pure and exact-text tested; ``repro check`` recognizes
these RUNs by ``APT_WORK``.
"""

from __future__ import annotations

from collections.abc import Sequence

#: where one RUN keeps its copy of the distribution's sources (removed at its end)
APT_WORK = "/tmp/repro-apt"
#: the files that hold a Debian or Ubuntu image's own sources (one-line format up to Debian 11 / Ubuntu 22.04,
#: deb822 from Debian 12 / Ubuntu 24.04)
DIST_LIST = "/etc/apt/sources.list"
DIST_PARTS = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list.d/ubuntu.sources")
APT_GET = (f"apt-get -o Dir::Etc::SourceList={APT_WORK}/sources.list "
           f"-o Dir::Etc::SourceParts={APT_WORK}/sources.list.d")
NO_SOURCE = ("repro: the image has no distribution apt source (/etc/apt/sources.list, "
             "sources.list.d/debian.sources or ubuntu.sources)")


def dist_apt_install(packages: Sequence[str]) -> tuple[str, ...]:
    """The commands (to be ``&&``-chained in one RUN) that install ``packages`` from the distribution's
    sources only, and leave no package lists behind."""
    parts, names = " ".join(DIST_PARTS), " ".join(packages)
    copy_list = (f"if [ -f {DIST_LIST} ]; then cp {DIST_LIST} {APT_WORK}/sources.list; "
                 f"else : > {APT_WORK}/sources.list; fi")
    refuse_none = ("if ! grep -qsE '^[[:space:]]*(deb|Types:)' "
                   f"{APT_WORK}/sources.list {APT_WORK}/sources.list.d/*; "
                   f"then echo '{NO_SOURCE}' >&2; exit 1; fi")
    return (f"mkdir -p {APT_WORK}/sources.list.d",
            copy_list,
            f'for f in {parts}; do if [ -f "$f" ]; then cp "$f" {APT_WORK}/sources.list.d/; fi; done',
            refuse_none,
            f"{APT_GET} update",
            f"DEBIAN_FRONTEND=noninteractive {APT_GET} install -y --no-install-recommends {names}",
            f"rm -rf /var/lib/apt/lists/* {APT_WORK}")
