"""The README's install command, run verbatim on a fresh Debian 12 (the test cluster's locally
made debian:bookworm, plus what a stock install has: python3 and sudo) in a clean container.

It needs the Debian mirror and the Python package index (through the host's proxy: its CA
bundle and PIP_CERT are handed in); the container shares the host's network for that.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import docker
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def readme_install_command() -> str:
    """The first line of the README's "Two commands" block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Two commands\n.*?```\n(.*?)```", text, re.S)
    assert block, "README.md has no 'Two commands' block"
    return block.group(1).splitlines()[0].split("  #")[0].strip()


def test_readme_headline_ids_are_listed() -> None:
    from click.testing import CliRunner

    from repro.cli import cli

    listed = CliRunner().invoke(cli, ["list"]).output
    ids = re.findall(r"repro report ([a-z0-9][a-z0-9.-]*)", readme_install_command())
    assert ids and all(re.search(rf"^{re.escape(i)}\s", listed, re.M) for i in ids), (ids, listed)


def test_readme_install_works_verbatim_on_fresh_debian(cluster: dict, tmp_path: Path) -> None:
    command = readme_install_command()
    assert "pip install -e" not in command
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    src = tmp_path / "repro"
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((ROOT / f).read_bytes())
    engine = docker.DockerClient(base_url=cluster["docker_host"])
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    volumes = {str(src): {"bind": "/src", "mode": "ro"}}
    if HOST_CA.is_file():  # a TLS-intercepting proxy between this machine and the package index
        volumes[str(HOST_CA)] = {"bind": "/etc/ssl/certs/host-proxy-ca.crt", "mode": "ro"}
        env["PIP_CERT"] = "/etc/ssl/certs/host-proxy-ca.crt"
    script = ("set -e; apt-get update -qq >/dev/null; apt-get install -y -qq python3 sudo >/dev/null 2>&1; "
              "cp -r /src /home/repro; cd /home/repro; exec bash -c \"$README_COMMAND\"")
    container = engine.containers.run(
        cluster["base_image_local"], ["bash", "-c", script], environment={**env, "README_COMMAND": command},
        volumes=volumes, network_mode="host", detach=True, name=f"repro-test-install-{os.getpid()}",
        labels={"repro.test": "install"})
    try:
        code = container.wait(timeout=900)["StatusCode"]
        out = container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)
        engine.close()
    # installed and ran: the report's gate says 7, as the README says, for its one not-derivable cell
    assert "Verdict: 21 match, 1 not derivable of 22 cells." in out, out[-4000:]
    assert code == 7, out[-4000:]
