"""The attached run's matrix: each selected cell (fewest nodes first) and each repeat not done yet, launched
through the scheduler, retried up to the manifest's limit, its status in the run directory's state file on
every path out, each rank's command and the NCCL transport's findings in the provenance record."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from repro.errors import RunFailed
from repro.events import Event, Progress, ignore
from repro.measure.parsers import PARSERS
from repro.measure.transport import transport_findings
from repro.run.cell import CellFailed, CellJob, NodeResult
from repro.run.rundir import DONE, FAILED, PENDING, RUNNING, RunDir
from repro.spec.hosts import Hosts
from repro.spec.manifest import Cell
from repro.up.start import UpResult


class Throughput:
    """The latest throughput figure a node printed, read with the target's own parser."""

    def __init__(self, parser: str) -> None:
        self.parser = PARSERS.get(parser)()
        self.hints = getattr(self.parser, "record_hints", ())

    def __call__(self, line: str) -> float | None:
        if self.hints and not any(h in line for h in self.hints):
            return None
        for series in self.parser.parse([line]).series:
            if series.records:
                return series.records[-1].value
        return None


@dataclass
class Repeats:
    """How this invocation runs a repeat: on ``hosts`` (``clients``: their engines, where the kit starts the
    containers), of ``image``, through the scheduler's ``launch`` (its ``launch_cell``), into ``result``;
    ``strict``: NCCL over sockets where InfiniBand was expected fails the repeat."""

    result: UpResult
    hosts: Hosts
    image: str
    launch: Callable[[CellJob], list[NodeResult]]
    progress: Progress = ignore
    clients: Mapping[str, Any] = field(default_factory=dict)
    strict: bool = False

    def __post_init__(self) -> None:
        self.throughput = Throughput(self.result.manifest.measure.parser)

    def run(self, cell: Cell, repeat: int) -> bool:
        """One repeat, retried up to the manifest's limit; its status is in the state file on every path."""
        run, attempts = self.result.run, self.result.manifest.retries + 1
        for attempt in range(1, attempts + 1):
            run.set_status(cell, repeat, RUNNING)
            log_dir = run.log_dir(cell, repeat)
            for stale in log_dir.glob("*.log") if log_dir.is_dir() else []:
                stale.rename(stale.with_suffix(f".attempt{attempt - 1}"))
            t0 = time.monotonic()
            job = CellJob(self.result.manifest, cell, self.hosts, log_dir, run.run_id, clients=self.clients,
                          image=self.image, on_event=self._on_event,
                          log_writer=lambda rank, node: run.open_log(cell, repeat, rank, node))
            try:
                nodes_ran = self.launch(job)
                self._commands(cell, repeat, nodes_ran)
            except CellFailed as e:
                self._commands(cell, repeat, e.results)
                last = attempt == attempts
                run.set_status(cell, repeat, FAILED if last else PENDING, e.reason)
                self.progress(Event("warn", f"{cell.key} repeat {repeat} attempt {attempt}/{attempts} "
                                    f"failed: {e.reason}" + ("" if last else "; retrying")))
                if last:
                    return False
                continue
            except BaseException as e:  # Ctrl-C, or the environment failing under the run: resumable
                run.set_status(cell, repeat, PENDING,
                               "interrupted" if isinstance(e, KeyboardInterrupt) else f"stopped: {e}")
                raise
            finally:
                self.result.cell_seconds += time.monotonic() - t0
            return self._transport(cell, repeat, nodes_ran)
        return False

    def _on_event(self, ev: tuple[str, str, str]) -> None:
        kind, node, text = ev
        if kind == "line":
            value = self.throughput(text)
            if value is not None:
                self.progress(Event("throughput", f"{value:.2f}", node=node, data={"value": value}))
        elif kind in ("exited", "error"):
            self.progress(Event("node", f"{kind} {text}", node=node))

    def _transport(self, cell: Cell, repeat: int, nodes_ran: Sequence[NodeResult]) -> bool:
        """A repeat that ran: done, unless NCCL used sockets where InfiniBand was expected under --strict."""
        from repro.record import provenance

        run = self.result.run
        found = transport_findings(self.result.manifest, cell, nodes_ran)
        for text in found:
            provenance.add_finding(self.result.record, cell, repeat, "nccl-transport", text)
            self.progress(Event("warn", f"{cell.key} repeat {repeat}: {text}"))
        if found and self.strict:
            run.set_status(cell, repeat, FAILED,
                           f"NCCL did not use InfiniBand between nodes (--strict): {found[0]}")
            return False
        run.set_status(cell, repeat, DONE)
        self.progress(Event("done", f"{cell.key} repeat {repeat} done",
                            data={"cell": cell.key, "repeat": repeat}))
        return True

    def _commands(self, cell: Cell, repeat: int, nodes: Sequence[NodeResult]) -> None:
        from repro.record import provenance

        result = self.result
        env = result.manifest.launch.env_for(cell, self.hosts.env)
        for r in nodes:
            if r.started:
                provenance.add_command(result.record, result.run, cell, repeat, rank=r.rank, node=r.node,
                                       role=r.role, argv=r.command, env=env, image=self.image,
                                       started=r.started, ended=r.ended, exit_code=r.exit_code,
                                       workdir=result.manifest.launch.workdir, log=r.log)


def todo(run: RunDir, cells: Sequence[Cell], repeats: int | None) -> list[tuple[Cell, int]]:
    """The repeats of ``cells`` not done yet (at most ``repeats`` a cell), fewest nodes first."""
    pending = set(run.pending())
    wanted = {c.key for c in cells}
    out = [(c, k) for c in cells for k in range(1, (repeats or 10**6) + 1)
           if (c.key, k) in pending and c.key in wanted]
    return sorted(out, key=lambda ck: (ck[0].nodes, cells.index(ck[0]), ck[1]))


def run_matrix(repeats: Repeats, cells: Sequence[Cell], count: int | None, fail_fast: bool) -> None:
    """Every repeat ``todo`` finds (``count``: --repeats), in order; ``fail_fast``: stop at the first that
    failed."""
    result, progress = repeats.result, repeats.progress
    left = todo(result.run, cells, count)
    total = len(left)
    progress(Event("step", f"{total} repeat(s) to run", data={"total": total}))
    for i, (cell, repeat) in enumerate(left, start=1):
        progress(Event("cell", f"{cell.key} repeat {repeat}",
                       data={"cell": cell.key, "repeat": repeat, "index": i, "total": total}))
        if repeats.run(cell, repeat):
            result.done += 1
            continue
        result.failed.append(f"{cell.key} r{repeat}")
        if fail_fast:
            raise RunFailed(f"{cell.key} repeat {repeat} failed; stopping (--fail-fast)",
                            hint=f"repro up --resume {result.run.path} reruns what is not done")
