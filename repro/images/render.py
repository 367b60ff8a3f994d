"""What a build will run, as text: the Dockerfile with its build arguments filled in.

Pure functions, exact-text tested; ``repro images --dry-run`` prints ``render_build``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

from repro.images import rdma as rdma_layer
from repro.images.build import BuildOptions, build_args, dockerfile_dir, env_lines
from repro.images.refs import Ref
from repro.images.sshd import render_sshd_layer
from repro.spec.manifest import Manifest

log = logging.getLogger(__name__)

_ARG = re.compile(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$")
_FROM = re.compile(r"^FROM\s", re.I)
#: Placeholder for the image the main Dockerfile produced, in the rendered RDMA layer.
BUILT = "<the image built above>"


def _substitute(line: str, values: Mapping[str, str]) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values[name] if name in values else m.group(0)

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", value, line)


def render_dockerfile(text: str, args: Mapping[str, str]) -> str:
    """``text`` with each declared ARG resolved (build argument, else its default) where it is used.

    Scoping follows Docker: ARGs before the first FROM are visible in FROM lines only;
    each stage sees the ARGs it declares itself.
    """
    global_scope: dict[str, str] = {}
    scope: dict[str, str] | None = None  # None until the first FROM
    out = []
    for line in text.splitlines():
        m = _ARG.match(line.strip())
        if m:
            name, default = m.group(1), m.group(2)
            current = global_scope if scope is None else scope
            known = args.get(name, default if default is not None else global_scope.get(name))
            if known is not None:
                current[name] = known
                line = f"ARG {name}={known}"
        elif _FROM.match(line.strip()):
            line = _substitute(line, global_scope)
            scope = {}
        elif scope is not None:
            line = _substitute(line, scope)
        out.append(line)
    return "\n".join(out) + "\n"


def render_build(manifest: Manifest, base: Ref, dockerfiles: Path | None = None,
                 bundle_sha256: str = "", sshd: bool = True) -> str:
    """Every Dockerfile the build of ``manifest`` runs, in order, rendered (the dry run).

    ``bundle_sha256`` is the checksum `repro lock` recorded for an MLNX_OFED bundle the
    manifest does not pin itself.
    """
    directory = dockerfile_dir(manifest, BuildOptions(dockerfiles=dockerfiles))
    text = (directory / "Dockerfile").read_text(encoding="utf-8")
    args = build_args(manifest, base if base.digest else base.with_digest("sha256:" + "0" * 64))
    if not base.digest:
        args["BASE"] = f"{base.tagged}@<not pinned>"
    parts = [f"# dockerfiles/{directory.name}/Dockerfile for {manifest.id}",
             render_dockerfile(text, args).rstrip("\n")]
    if env_lines(manifest):
        parts += ["# image.build.env: the upstream Dockerfile's ENV", env_lines(manifest).rstrip("\n")]
    rdma = manifest.rdma
    if rdma is not None and rdma.strategy == "image":
        parts += ["", "# RDMA: strategy image: the base image's own MOFED user space is used; "
                      "nothing is installed"]
    elif rdma is not None:
        parts += ["", f"# then the RDMA layer ({rdma_layer.describe(manifest)})",
                  rdma_layer.render_rdma_layer(manifest, BUILT).rstrip("\n")]
        if rdma.strategy == "mlnx-ofed":
            sha = rdma.sha256 or bundle_sha256
            parts.append(f"# {rdma_layer.bundle_name(manifest)}.tgz must have sha256 "
                         + (f"{sha} ({'rdma.sha256' if rdma.sha256 else 'recorded by repro lock'})" if sha
                            else "<not recorded: run repro lock; the build refuses an unverified bundle>"))
    if manifest.launch.kind == "mpi" and sshd:
        parts += ["", "# then the mpi layer", render_sshd_layer(BUILT).rstrip("\n")]
    elif manifest.launch.kind == "mpi":
        parts += ["", "# no mpi layer: the ranks start through Slurm's PMI (pyxis), not mpirun over ssh"]
    return "\n".join(parts) + "\n"
