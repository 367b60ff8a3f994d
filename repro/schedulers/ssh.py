"""``ssh``: the inventory's nodes, one container per node started through its Docker engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from repro.hosts import Hosts
from repro.manifest import Cell, Manifest
from repro.schedulers import SCHEDULERS


@SCHEDULERS.register("ssh")
class SshScheduler:
    engines = True  # the nodes' Docker engines run the containers
    def __init__(self, config: Mapping[str, str], manifest: Manifest, cells: Sequence[Cell], hosts: Hosts,
                 progress: Any = None) -> None:
        self.hosts = hosts

    def check(self, need: int, *, preflight: bool = False) -> None:
        pass

    def open(self, need: int, *, preflight: bool = False) -> Hosts:
        return Hosts(self.hosts.take(need), self.hosts.path, self.hosts.data, self.hosts.env,
                     scheduler=self.hosts.scheduler)

    def launch_cell(self, *args: Any, **kw: Any) -> Any:
        from repro.launch import launch_cell

        return launch_cell(*args, **kw)

    def preflight(self, nodes: Sequence[Any], *, accept_new_host_keys: bool = False, dataset: Any = None) -> list[Any]:
        from repro.preflight import run_preflight

        return run_preflight(nodes, accept_new_host_keys=accept_new_host_keys, dataset=dataset)

    def facts(self) -> dict[str, Any] | None:
        return None

    def close(self, interrupted: bool = False) -> None:
        pass
