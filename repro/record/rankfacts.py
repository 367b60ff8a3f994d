"""What each rank said of itself inside its container before the target's command (Slurm steps:
``repro.run.schedulers.slurm.siteenv.RANK_FACTS``), read back from its log for the provenance: its
locked-memory limit, its CPUs (count and list, from ``/proc/self/status`` ``Cpus_allowed_list``) and its
environment, whose secret values are blanked by name and by shape (``repro.redact``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from repro.redact import redact_env
from repro.run.rundir import read_head

MARK = "#repro-site "
#: a line as the log holds it: srun's ``--label`` (``3: ``) may come first
_LINE = re.compile(r"^(?:\s*\d+: )?#repro-site (rank|env) (\S+) (.*)$")
_RANK = re.compile(r"^memlock (\S+) cpus ?(.*)$")
MAX_LOG = 64 << 20  # a log read for facts: at most its first 64 MiB (the facts come first)


def cpu_count(listing: str) -> int | None:
    """The CPUs a ``Cpus_allowed_list`` names (``0-3,8`` is 5); None where it is not one."""
    n = 0
    for part in listing.split(","):
        a, _, b = part.partition("-")
        if not a.isdigit() or (b and not b.isdigit()):
            return None
        n += int(b or a) - int(a) + 1
    return n


def rank_facts(text: str) -> list[dict[str, Any]]:
    """Each rank's facts in ``text`` (a node's log), in the order the ranks said them: ``rank`` (Slurm's
    ``SLURM_PROCID``, None outside a Slurm task), ``memlock_kib`` (a number, or ``unlimited``), ``cpus``
    (``count``, ``list``), ``env`` (redacted)."""
    ranks: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        word, rank, rest = m.groups()
        if word == "rank" and (f := _RANK.match(rest)):
            memlock, listing = f.groups()
            ranks[rank] = {"rank": int(rank) if rank.isdigit() else None,
                           "memlock_kib": int(memlock) if memlock.isdigit() else memlock,
                           "cpus": {"count": cpu_count(listing.strip()), "list": listing.strip()}, "env": {}}
        elif word == "env" and rank in ranks and "=" in rest:
            name, _, value = rest.partition("=")
            ranks[rank]["env"][name] = value
    return [{**r, "env": redact_env(r["env"])} for r in ranks.values()]


def log_facts(path: Path) -> list[dict[str, Any]]:
    """``rank_facts`` of a log file (its first ``MAX_LOG`` bytes); none where it is not there."""
    return rank_facts(read_head(path, MAX_LOG)) if path.is_file() else []
