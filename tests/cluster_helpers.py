"""What the test cluster's job steps leave on this machine, where the namespace nodes' steps run."""

from __future__ import annotations

from pathlib import Path


def job_processes(job: str, marker: bytes) -> list[str]:
    """The pids of Slurm job ``job``'s processes still running here whose argv holds ``marker`` (the job is
    in their environment)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if marker in (proc / "cmdline").read_bytes() and \
                    f"SLURM_JOB_ID={job}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                out.append(proc.name)
        except OSError:  # gone meanwhile, or not a process
            continue
    return out


def repeat_files(run: Path, cell: str, node: str, head: int, *more: str) -> str:
    """What a page shows of a repeat's folder: its listing (``ls``), the first ``head`` lines of ``node``'s
    telemetry samples, then ``more`` lines (each a command's printed answer), as one text."""
    rep = run / "cells" / cell / "r1"
    listing = "  ".join(sorted(p.name for p in rep.iterdir()))
    samples = (rep / f"telemetry-{node}.txt").read_text().splitlines()[:head]
    return "\n".join([listing, *samples, *more])


def cpu_summary(run: Path, cell: str) -> str:
    """The cell's telemetry summary's ``cpu`` and ``gpu`` parts as one JSON line."""
    import json

    from repro.nodes.telemetry import summary

    s = summary(run, cell)
    return json.dumps({k: s[k] for k in ("cpu", "gpu")})


def plain_lines(json_lines: str) -> str:
    """``--json-logs`` progress as the plain lines a terminal shows (repro.progress.PlainProgress's format):
    ``HH:MM:SS kind  [node] message``, quiet kinds left out; other lines as they are."""
    import json

    from repro.progress import PlainProgress

    out = []
    for line in json_lines.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if not isinstance(ev, dict) or ev.get("kind") in PlainProgress.QUIET:
            continue
        where = f"[{ev['node']}] " if ev.get("node") else ""
        out.append(f"{ev['time'][11:19]} {ev['kind']:<5} {where}{ev['message']}")
    return "\n".join(out)
