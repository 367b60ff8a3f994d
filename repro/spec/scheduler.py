"""Every scheduler setting, checked by one table before anything is rendered or submitted.

The inventory's ``scheduler:`` section (``repro.hosts``) and ``--scheduler KIND:KEY=VALUE``
(``repro.schedulers``) both go through ``problems``, so ``validate``, ``plan``, ``preflight`` and
``up`` accept and refuse the same values. A value that passes cannot add a line to a batch script,
an option to sbatch or an entry to a list: Slurm names are single words, lists are comma-separated
words, and nothing may hold whitespace, a newline or a shell metacharacter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_NAME = r"[A-Za-z0-9_.-]+"
WORD = re.compile(rf"^{_NAME}$")
WORDS = re.compile(rf"^{_NAME}(,{_NAME})*$")
HOSTLIST = re.compile(rf"^{_NAME}(\[[0-9,-]+\])?(,{_NAME}(\[[0-9,-]+\])?)*$")
TIME = re.compile(r"^(?:(\d{1,5})-(\d{1,5})(?::(\d{1,5}))?(?::(\d{1,5}))?"
                  r"|(\d{1,7})(?::(\d{1,5}))?(?::(\d{1,5}))?)$")
_FEATURE = re.compile(rf"{_NAME}(\*[0-9]{{1,5}})?")


def seconds(text: str) -> int | None:
    """A Slurm time (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in seconds; None for no
    limit (``UNLIMITED``, ``INFINITE``); ValueError for anything else."""
    t = text.strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = TIME.match(t)
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time")
    d, dh, dm, ds, a, b, c = (int(g) if g else 0 for g in m.groups())
    if m.group(1) is not None:                      # D-H[:M[:S]]
        return ((d * 24 + dh) * 60 + dm) * 60 + ds
    if m.group(7) is not None:                      # H:M:S
        return (a * 60 + b) * 60 + c
    return a * 60 + b                               # M or M:S


def _time(value: str) -> str | None:
    try:
        limit = seconds(value)
    except ValueError:
        return "is not a Slurm time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED)"
    return "is not a positive time limit" if limit is not None and limit <= 0 else None


def _constraint(value: str) -> str | None:
    """Slurm's constraint grammar: features (``NAME`` or ``NAME*COUNT``) joined by ``&`` (and) or ``|`` (or),
    grouped by ``( )``, matching OR and multiple counts in ``[ ]``."""
    depth: list[str] = []
    expect_term = True
    i = 0
    while i < len(value):
        ch = value[i]
        if expect_term and ch in "([":
            depth.append(")" if ch == "(" else "]")
            i += 1
            continue
        if expect_term:
            m = _FEATURE.match(value, i)
            if not m:
                return f"has {value[i]!r} at position {i + 1} where a feature name belongs"
            i, expect_term = m.end(), False
            continue
        if ch in ")]":
            if not depth or depth.pop() != ch:
                return f"has an unmatched {ch!r} at position {i + 1}"
            i += 1
        elif ch in "&|":
            i, expect_term = i + 1, True
        else:
            return f"has {ch!r} at position {i + 1} where &, | or a closing bracket belongs"
    if expect_term or depth:
        return "ends where a feature name or a closing bracket belongs"
    return None


def _pattern(rx: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    return lambda value: None if rx.match(value) else f"is not {what}"


def _choice(*options: str) -> Callable[[str], str | None]:
    return lambda value: None if value in options else f"is not one of {', '.join(options)}"


@dataclass(frozen=True)
class Setting:
    check: Callable[[str], str | None]  # None when the value is fine, else what is wrong with it
    example: str
    sbatch: str | None = None           # the sbatch option it becomes in the allocation's script


_ONE = "one word of letters, digits, '_', '.' or '-'"
#: Every key a ``scheduler:`` section or ``--scheduler`` may set, in the order the batch script lists them.
SETTINGS: dict[str, Setting] = {
    "kind": Setting(_choice("ssh", "slurm"), "slurm"),
    "partition": Setting(_pattern(WORDS, f"{_ONE} (or a comma-separated list of them)"), "gpu",
                         "--partition"),
    "account": Setting(_pattern(WORD, _ONE), "bench", "--account"),
    "qos": Setting(_pattern(WORD, _ONE), "normal", "--qos"),
    "reservation": Setting(_pattern(WORD, _ONE), "maint", "--reservation"),
    "time": Setting(_time, "2:00:00", "--time"),
    "constraint": Setting(_constraint, "v100&ib", "--constraint"),
    "exclude": Setting(_pattern(HOSTLIST, "a Slurm host list (e.g. node[3-4],node7)"), "node[3-4]",
                       "--exclude"),
    "container": Setting(_choice("docker", "pyxis"), "docker"),
}


def problems(cfg: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """(key, what is wrong, how to fix it) for every setting of ``cfg`` the table refuses or does not know."""
    out = []
    for key, value in cfg.items():
        if key.startswith("_"):
            continue
        setting = SETTINGS.get(key)
        if setting is None:
            out.append((key, "is not a scheduler setting", f"use one of {', '.join(SETTINGS)}"))
            continue
        why = setting.check(str(value))
        if why:
            shown = str(value) if len(str(value)) <= 80 else str(value)[:77] + "..."
            out.append((key, f"{shown!r} {why}", f"e.g. {key}: {setting.example}"))
    return out
