"""``ssh``: the inventory's nodes, one container per node started through its Docker engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from repro.nodes.preflight import run_preflight
from repro.run.cell import CellJob, NodeResult
from repro.run.launch import launch_cell as launch_over_ssh
from repro.run.schedulers import SCHEDULERS
from repro.run.schedulers.base import Scheduler
from repro.spec.hosts import Hosts, Node


@SCHEDULERS.register("ssh")
class SshScheduler(Scheduler):
    def check(self, need: int, *, preflight: bool = False) -> None:
        """Nothing to ask anyone: the inventory's nodes are checked when they are taken."""

    def open(self, need: int, *, preflight: bool = False) -> Hosts:
        hosts = self.inventory
        return Hosts(hosts.take(need), hosts.path, hosts.data, hosts.env, scheduler=hosts.scheduler)

    def launch_cell(self, job: CellJob) -> list[NodeResult]:
        return launch_over_ssh(job)

    def preflight(self, nodes: Sequence[Node], *, accept_new_host_keys: bool = False,
                  dataset: Any = None) -> list[Any]:
        return run_preflight(nodes, accept_new_host_keys=accept_new_host_keys, dataset=dataset)
