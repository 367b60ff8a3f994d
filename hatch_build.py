"""Build hook: compile the native log scanner (``repro/parsers/_scan.c``, PCRE2 with JIT).

The scanner is optional: without a C compiler, Python headers or PCRE2's development files
the build says so on stderr and the kit runs its pure-Python engine (same results, about a
fifth of the speed; ``repro --version`` names the engine). Set ``REPRO_NATIVE=0`` to skip it,
``REPRO_NATIVE=1`` to make a failed compile fail the install.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "repro/parsers/_scan.c"
MODULE = "repro/parsers/_scan"


def _pcre2_flags() -> tuple[list[str], list[str]]:
    config = shutil.which("pcre2-config")
    if config:
        cflags = subprocess.run([config, "--cflags"], capture_output=True, text=True, check=False).stdout
        libs = subprocess.run([config, "--libs8"], capture_output=True, text=True, check=False).stdout
        if libs.strip():
            return shlex.split(cflags), shlex.split(libs)
    return [], ["-lpcre2-8"]


def compile_scanner(root: Path, out: Path) -> str | None:
    """Compile the scanner to ``out``; the reason it could not be built, or None."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not shutil.which(cc[0]):
        return f"no C compiler ({cc[0]})"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"no Python headers ({include}/Python.h)"
    cflags, libs = _pcre2_flags()
    cmd = [*cc, "-O2", "-shared", "-fPIC", f"-I{include}", *cflags, str(root / SOURCE), "-o", str(out), *libs, "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"{shlex.join(cmd)} failed: {tail}"
    return None


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        want = os.environ.get("REPRO_NATIVE", "")
        if want == "0":
            return
        root = Path(self.root)
        name = MODULE + sysconfig.get_config_var("EXT_SUFFIX")
        if version == "editable":  # the checkout is what gets imported
            out = root / name
        else:
            self._tmp = tempfile.mkdtemp(prefix="repro-native-")
            out = Path(self._tmp) / Path(name).name
        why = compile_scanner(root, out)
        if why is not None:
            if want == "1":
                raise RuntimeError(f"native scanner: {why}")
            print(
                f"repro: native log scanner not built ({why}); the pure-Python engine will be used. "
                "Install a C compiler and PCRE2's development files (Debian: gcc libpcre2-dev) "
                "for the faster one.",
                file=sys.stderr,
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][str(out)] = name

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
