"""``container: pyxis``: the run's image, imported once per node and held for the run (``enroot``).

``RunImage`` starts the image step (``enroot.image_argv``) the first time a cell needs the image, waits
until every node says it is ready, holds the nodes' enroot output in the run directory
(``image/RANK-NODE.log``) and checks that what each node imported (or kept from an earlier run) is the
digest the run locks. ``release`` stops the step, whose script then removes the file on every node; a job
Slurm ends (time limit, scancel) stops it the same way.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from repro.errors import RunFailed
from repro.layout import PROVENANCE
from repro.run.rundir import read_head
from repro.events import Event
from repro.run.cell import FileSink
from repro.run.schedulers.slurm.allocation import Allocation
from repro.run.schedulers.slurm.commands import cli, stamp
from repro.run.schedulers.slurm.enroot import (IMPORT_TIMEOUT_S, NOT_READY, image_argv, image_file,
                                              image_problems, keep, node_said)
from repro.run.schedulers.slurm.steps import STOP_WAIT_S, Demux, JobStep


class ImageStep(JobStep):
    """The step holding the run's squashfs on every node; ``nodes`` gathers what each node said."""

    def __init__(self, alloc: Allocation, names: list[str], image: str, path: str, digest: str,
                 log_dir: Path, earlier: list[str] | None = None) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.names, self.path, self.digest = names, path, digest
        self.sinks = [FileSink(log_dir / f"{i}-{n}.log") for i, n in enumerate(names)]
        self.nodes: list[dict[str, Any]] = [{"node": n} for n in names]
        demux = Demux(self.sinks, control=self.control)
        argv = image_argv(str(alloc.job), names, image, path, digest, keep(alloc.cfg), earlier or [],
                          alloc.export())
        super().__init__(alloc, argv, demux)

    def control(self, rank: int, word: str, rest: str) -> None:
        node_said(self.nodes[rank], word, rest, stamp())

    def wait_ready(self, timeout_s: float) -> None:
        """Until every node is ready; RunFailed naming each node that is not (and why)."""
        deadline = time.monotonic() + timeout_s
        while not all("ready" in n or "error" in n for n in self.nodes):
            if self.demux.done.is_set() or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        bad = image_problems(self.nodes, self.path, self.digest)
        if bad:
            tail = " | ".join(self.demux.other[-3:])
            raise RunFailed(f"{NOT_READY}:\n  " + "\n  ".join(bad)
                            + (f"\n  srun: {tail}" if tail else ""),
                            hint=f"each node's enroot output is in {self.sinks[0].path.parent}; a kept "
                                 f"image that differs from the lock: remove {self.path} on the nodes, or "
                                 "set keep_image: no")

    def interrupt(self) -> None:
        """SIGTERM to the step's tasks: their script removes the file (unless kept) and exits."""
        if self.demux.step_id:
            cli(["scancel", "--signal=TERM", "--", self.demux.step_id])
        else:
            super().interrupt()

    def kill(self) -> None:
        cli(["scancel", "--", self.demux.step_id or str(self.alloc.job)])

    def release(self) -> None:
        if self.proc is None:
            return
        try:
            self.stop()
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        finally:
            if self.reader is not None:
                self.reader.join(10)
            for s in self.sinks:
                s.close()


def earlier_jobs(run_dir: Path) -> list[str]:
    """The Slurm jobs a resumed run ran in before (its provenance's allocations)."""
    try:
        record = json.loads(read_head(run_dir / PROVENANCE, 64 << 20))
    except (OSError, ValueError, RecursionError):
        return []
    allocations = record.get("scheduler") if isinstance(record, dict) else None
    if not isinstance(allocations, list):
        return []
    return [str(a["job_id"]) for a in allocations
            if isinstance(a, dict) and str(a.get("job_id", "")).isdigit()]


class RunImage:
    """The run's image on the allocated nodes: imported once (the first cell that needs it), the same file
    for every later cell and repeat, released with the allocation."""

    def __init__(self, alloc: Allocation) -> None:
        self.alloc = alloc
        self.step: ImageStep | None = None
        self.facts: dict[str, Any] = {}

    @property
    def env(self) -> dict[str, str]:
        """The image's own PATH for every task (pyxis gave the test cluster's tasks the default PATH, not
        the image's: the kit sets it)."""
        found = self.step.nodes[0].get("path") if self.step is not None else None
        return {"PATH": found} if isinstance(found, str) and found else {}

    def path(self, image: str, nodes: list[str], run_id: str, target: str, run_dir: Path) -> str:
        """The squashfs every node holds of ``image`` (a pinned reference), imported now if not yet."""
        if self.step is not None:
            return self.step.path
        digest = image.rpartition("@")[2]
        if not digest.startswith("sha256:"):
            raise RunFailed(f"pyxis runs images by digest; {image} has none",
                            hint="give --push REGISTRY for a built image, or pin the registry image")
        path = image_file(self.alloc.cfg, run_id, target)
        self.alloc.progress(Event("step", f"the image on {len(nodes)} node(s): {image} into {path} "
                                          "(enroot import, once for the run)"))
        t0 = time.monotonic()
        self.step = ImageStep(self.alloc, nodes, image, path, digest, run_dir / "image",
                              earlier_jobs(run_dir))
        self.step.start()
        self.facts = {"image": image, "file": path, "kept": keep(self.alloc.cfg), "nodes": self.step.nodes}
        try:
            self.step.wait_ready(IMPORT_TIMEOUT_S)
        except BaseException:
            self.release()
            raise
        self.facts["ready_s"] = round(time.monotonic() - t0, 3)
        self.alloc.progress(Event("info", "image ready: " + "; ".join(
            f"{n['node']} {n['action']} ({n.get('enroot', '?')})" for n in self.step.nodes)))
        return path

    @property
    def step_id(self) -> str | None:
        """The image step's own ``JOB.STEP`` once it said it."""
        return self.step.demux.step_id if self.step is not None else None

    def release(self) -> None:
        if self.step is not None:
            self.step.release()
            self.step = None
