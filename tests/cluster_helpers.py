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
