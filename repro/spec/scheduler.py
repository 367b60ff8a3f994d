"""Every scheduler setting, checked by one table before anything is rendered or submitted.

The inventory's ``scheduler:`` section (``repro.spec.hosts``) and ``--scheduler KIND:KEY=VALUE``
(``repro.run.schedulers``) both go through ``problems``, so ``validate``, ``plan``, ``preflight`` and
``up`` accept and refuse the same values. A value that passes cannot add a line to a batch script,
an option to sbatch or an entry to a list: Slurm names are single words, lists are comma-separated
words, and nothing may hold whitespace, a newline or a shell metacharacter. ``sbatch_extra`` (the only
list: the site's own ``#SBATCH`` lines) holds long options alone, never one the kit writes itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # a letter or digit first: never an option, never "-"
# every pattern is used with fullmatch: ``$`` would also match before a final newline
WORD = re.compile(_NAME)
WORDS = re.compile(rf"{_NAME}(,{_NAME})*")
HOSTLIST = re.compile(rf"{_NAME}(\[[0-9,-]+\])?(,{_NAME}(\[[0-9,-]+\])?)*")
TIME = re.compile(r"(?:(\d{1,5})-(\d{1,5})(?::(\d{1,5}))?(?::(\d{1,5}))?"
                  r"|(\d{1,7})(?::(\d{1,5}))?(?::(\d{1,5}))?)")
PATH = re.compile(r"/[A-Za-z0-9_./-]*")
SIF_PATH = re.compile(r"/[A-Za-z0-9_.+@/-]*")
_FEATURE = re.compile(rf"{_NAME}(\*[0-9]{{1,5}})?")
MEMORY = re.compile(r"[0-9]{1,9}[KMGT]?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: one ``#SBATCH`` option: a long option, ``=`` and a value without whitespace, quotes or shell metacharacters
SBATCH_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:@%+/=\[\]-]+)?")
#: options every batch script of the kit already holds (``render.render_sbatch``), or a setting renders
KIT_OPTIONS = ("--job-name", "--nodes", "--ntasks-per-node", "--exclusive", "--no-requeue", "--output",
               # what reaches a rank, its limits and its CPUs: the kit's steps set them (``slurm.siteenv``)
               "--export", "--propagate", "--cpu-bind", "--cpus-per-task")
#: options an item may set only where the setting that renders their kind is ``none``
TAKEN_BY = {"--mem": "mem", "--mem-per-cpu": "mem", "--mem-per-gpu": "mem", "--gpus-per-node": "gpu_request",
            "--gres": "gpu_request", "--gpus": "gpu_request"}


def seconds(text: str) -> int | None:
    """A Slurm time (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in seconds; None for no
    limit (``UNLIMITED``, ``INFINITE``); ValueError for anything else."""
    t = text.strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = TIME.fullmatch(t)
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
        if value != value.strip():
            raise ValueError(value)
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


def _extra(value: object, cfg: Mapping[str, object] | None = None) -> str | None:
    found = _extra_item(value, cfg)
    return found[1] if found else None


def _extra_item(value: object, cfg: Mapping[str, object] | None = None) -> tuple[int, str] | None:
    """``sbatch_extra``: a list of long options (one string from ``--scheduler``), each checked alone; one
    that the kit writes, or that a setting of ``cfg`` (``mem``, ``gpu_request``, unless ``none``) renders,
    is refused. The first bad item's index and what is wrong with it."""
    items = value if isinstance(value, list) else [value]
    for i, item in enumerate(items):
        text = str(item)
        shown = text if len(text) <= 60 else text[:57] + "..."
        if not SBATCH_OPTION.fullmatch(text):
            bad = next((c for c in text if c.isspace() or c in "'\"$`;&|<>()*?!{}~#\\"), None)
            what = f"holds {bad!r}" if bad else "is not --OPTION or --OPTION=VALUE"
            return i, f"{shown!r} {what}: each item is one long option of sbatch"
        option = text.partition("=")[0]
        owner = next((k for k, s in SETTINGS.items() if s.sbatch == option), None)
        if owner or option in KIT_OPTIONS:
            return i, (f"{shown!r} sets {option}, which the kit writes itself"
                       + (f" from the setting {owner}" if owner else ""))
        taken = TAKEN_BY.get(option)
        if taken and str((cfg or {}).get(taken, "")) != "none":
            return i, f"{shown!r} sets {option}, which the kit writes unless {taken}: none"
    return None


def _export_item(value: object) -> tuple[int, str] | None:
    """``export``: environment names (a list, or one comma-separated string from ``--scheduler``); the first
    that is not one, and why."""
    items = value if isinstance(value, list) else str(value).split(",")
    for i, item in enumerate(items):
        if not ENV_NAME.fullmatch(str(item)) or str(item).startswith("PYXIS_"):
            return i, (f"{str(item)[:60]!r} is not an environment variable's name (letters, digits and '_', "
                       "not a digit first; not PYXIS_*, which the kit gives pyxis itself)")
    return None


def lines_of(value: object) -> list[str]:
    """``sbatch_extra`` as a list (``--scheduler`` gives one option as a string)."""
    if value in (None, ""):
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _pattern(rx: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    return lambda value: None if rx.fullmatch(value) else f"is not {what}"


def _choice(*options: str) -> Callable[[str], str | None]:
    return lambda value: None if value in options else f"is not one of {', '.join(options)}"


@dataclass(frozen=True)
class Setting:
    check: Callable[[Any], str | None]  # None when the value is fine, else what is wrong with it
    example: str
    sbatch: str | None = None           # the sbatch option it becomes in the allocation's script
    many: bool = False                  # a list in the inventory (its items are checked one by one)


_ONE = "one word of letters, digits, '_', '.' or '-' that starts with a letter or digit"
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
    "gpu_request": Setting(_choice("gpus-per-node", "gres", "none"), "gres"),
    "mem": Setting(lambda v: None if v == "none" or MEMORY.fullmatch(v) else
                   "is not a Slurm memory size (0 for all of a node's memory, e.g. 200G) or none", "0"),
    "sbatch_extra": Setting(_extra, "['--signal=B:USR1@120']", many=True),
    # names the site passes from the environment the kit's steps start in to every rank (pyxis, apptainer)
    "export": Setting(lambda v: (_export_item(v) or (0, None))[1], "[NCCL_IB_HCA, UCX_NET_DEVICES]",
                      many=True),
    "container": Setting(_choice("docker", "pyxis", "apptainer"), "docker"),
    "sif_dir": Setting(lambda v: None if SIF_PATH.fullmatch(v) else
                       "is not an absolute path of letters, digits and _ . + @ / -", "/shared/sif"),
    # pyxis: Slurm's PMI for MPI targets, the node-local folder of the run's squashfs, and whether to keep it
    "mpi": Setting(_choice("pmix", "pmi2"), "pmix"),
    "image_dir": Setting(_pattern(PATH, "an absolute path of letters, digits, '_', '.', '-' and '/'"),
                         "/tmp"),
    "keep_image": Setting(_choice("yes", "no", "true", "false", "True", "False"), "no"),
}
#: the GPU request of each ``gpu_request`` (``--gpus-per-node=N`` unless the site says otherwise)
GPU_REQUEST = {"gpus-per-node": "--gpus-per-node={}", "gres": "--gres=gpu:{}", "none": ""}


class SettingProblem(NamedTuple):
    key: str
    why: str  # what is wrong
    fix: str
    item: int | None = None  # which item of a list setting (from 0)


def problems(cfg: Mapping[str, object]) -> list[SettingProblem]:
    """(key, what is wrong, how to fix it, the item) for every setting of ``cfg`` the table refuses or does
    not know."""
    out = []
    for key, value in cfg.items():
        if key.startswith("_"):
            continue
        setting = SETTINGS.get(key)
        if setting is None:
            out.append(SettingProblem(key, "is not a scheduler setting", f"use one of {', '.join(SETTINGS)}"))
            continue
        if setting.many:
            bad = _extra_item(value, cfg) if key == "sbatch_extra" else _export_item(value)
            if bad:
                out.append(SettingProblem(key, bad[1], f"e.g. {key}: {setting.example}",
                                          bad[0] if isinstance(value, list) else None))
            continue
        why = setting.check(str(value))
        if why:
            shown = str(value) if len(str(value)) <= 80 else str(value)[:77] + "..."
            out.append(SettingProblem(key, f"{shown!r} {why}", f"e.g. {key}: {setting.example}"))
    return out
