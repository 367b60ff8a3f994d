"""The pasted outputs of README.md and docs/: found, run and compared (tests/test_docs.py uses this).

The convention in the Markdown: a fenced block of a command's real output is preceded by a comment that says
how it is checked, and its commands are lines beginning with ``$ `` followed by what they printed::

    <!-- example: offline [SETUP] -->     run here (in-process, `run_cli`), in a scratch folder SETUP prepares
    <!-- example: cluster TEST.py ... --> needs the test cluster; the integration test(s) producing it
    <!-- example: manual WHAT -->         a run on the test cluster by hand (no test produces it): what it was
    <!-- example: network WHY -->         needs a package index or GitHub
    <!-- example: measured SCRIPT -->     a timing on one machine, not a text to compare

In an expected output a line beginning with ``...`` stands for any number of lines the page leaves out, and
a line ending in `` ...`` for a line cut there. Only what legitimately changes between runs is normalised:
the scratch folder's paths are written back as the page's paths (SETUP maps them).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("offline", "cluster", "manual", "network", "measured")
_BLOCK = re.compile(r"^(?:[ ]*<!-- example: (?P<kind>\S+)(?: (?P<arg>[^\n]*?))? -->\n\s*)?"
                    r"^(?P<indent>[ ]*)```[\w-]*\n(?P<body>.*?)^(?P=indent)```$", re.S | re.M)


@dataclass(frozen=True)
class Example:
    """One fenced block: where it is, how it is checked, and its text (indentation removed)."""

    path: Path
    line: int
    kind: str | None
    arg: str
    body: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def steps(self) -> list[tuple[str, list[str]]]:
        """(command, the lines it printed) for each ``$ `` line of the block."""
        out: list[tuple[str, list[str]]] = []
        for ln in self.body.splitlines():
            if ln.startswith("$ "):
                out.append((ln[2:], []))
            elif out:
                out[-1][1].append(ln)
        return out


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md"))


def examples(path: Path, text: str | None = None) -> list[Example]:
    """Every fenced block of a page, marked or not."""
    text = path.read_text() if text is None else text
    found = []
    for m in _BLOCK.finditer(text):
        indent = len(m["indent"])
        body = "\n".join(ln[indent:] for ln in m["body"].splitlines())
        line = text.count("\n", 0, m.start("body"))
        found.append(Example(path, line, m["kind"], m["arg"] or "", body))
    return found


@dataclass
class Shell:
    """What one ``$`` line asks of the shell, in the few forms the pages use."""

    argv: list[str]
    to_null: bool = False
    echo_exit: bool = False
    filters: list[list[str]] = field(default_factory=list)


def parse_command(command: str) -> Shell:
    """``repro ARGS [>/dev/null] [| head -N | grep -E RE]... [; echo "exit $?"]``."""
    echo = command.endswith('; echo "exit $?"')
    command = command.removesuffix('; echo "exit $?"')
    parts = [shlex.split(p) for p in command.split(" | ")]
    argv = parts[0]
    to_null = False
    for redirect in ([">/dev/null"], [">", "/dev/null"]):
        if argv[-len(redirect):] == redirect:
            argv, to_null = argv[:-len(redirect)], True
    assert argv[0] == "repro", f"only repro commands run here, not {argv[0]}"
    return Shell(argv[1:], to_null, echo, parts[1:])


def apply_filter(words: list[str], lines: list[str]) -> list[str]:
    if words[0] == "head" and re.fullmatch(r"-\d+", words[1]):
        return lines[:int(words[1][1:])]
    if words[:2] == ["grep", "-E"]:
        return [ln for ln in lines if re.search(words[2], ln)]
    raise AssertionError(f"no such filter here: {words}")


def matches(expected: list[str], got: list[str]) -> bool:
    """``got`` is ``expected``, where an expected line beginning with ``...`` stands for any lines and one
    ending in `` ...`` for a line cut there."""
    expected = [ln.rstrip() for ln in expected]
    got = [ln.rstrip() for ln in got]

    def at(i: int, j: int) -> bool:
        if i == len(expected):
            return j == len(got)
        want = expected[i]
        if want.startswith("..."):
            return any(at(i + 1, k) for k in range(j, len(got) + 1))
        if j == len(got):
            return False
        if want.endswith(" ...") and len(want) > 4:
            same = got[j].startswith(want[:-4].rstrip())
        else:
            same = got[j] == want
        return same and at(i + 1, j + 1)

    return at(0, 0)


def normalise(text: str, paths: dict[str, str]) -> str:
    """The scratch folder's paths written as the page writes them (longest first)."""
    for real, shown in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(real, shown)
    return text


# ------------------------------------------------------------------ cluster examples, compared by shape
#: what differs between two real runs of the same command on the test cluster, each written as one token:
#: ISO times, clock times, digests, run directory names, container ids, the submitting host's name, paths,
#: numbers (job ids, sizes, seconds, figures)
_VOLATILE = [(re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d)?"), "<when>"),
             (re.compile(r"\b\d{1,2}:\d\d:\d\d\b"), "<time>"),
             (re.compile(r"sha256:[0-9a-f]{12,64}"), "<digest>"),
             (re.compile(r"\d{8}T\d{6}Z-[\w.-]+?-[0-9a-f]{6}\b"), "<run>"),
             (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hex>"),
             (re.compile(r"(?<=\bfrom )[\w.-]+(?=\))"), "<host>"),
             (re.compile(r"(?<![\w.])/[^\s,;:()'\"`|]+"), "<path>"),
             (re.compile(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?"), "<n>")]


def shape(line: str) -> str:
    """A line of output with what changes between runs replaced, and runs of blanks (table padding) as one."""
    for pattern, token in _VOLATILE:
        line = pattern.sub(token, line)
    return re.sub(r"-{3,}", "---", " ".join(line.split()))


def cluster_example(ident: str) -> Example:
    """The page's cluster block marked ``TEST#IDENT``."""
    found = [e for p in pages() for e in examples(p) if e.kind == "cluster"
             and any(t.partition("#")[2] == ident for t in e.arg.split())]
    assert len(found) == 1, f"one cluster example marked #{ident} expected, found {[e.name for e in found]}"
    return found[0]


def shape_mismatch(expected: list[str], *streams: str) -> str | None:
    """None if every line of ``expected`` (its ``$`` lines aside) is, by shape, a line of one of the produced
    ``streams`` (stdout, stderr, a file), each stream's lines found in its own order (the page may leave lines
    out, and interleaves the streams as a terminal shows them); else the first page line not found."""
    got = [[shape(ln) for ln in s.splitlines()] for s in streams]
    at = [0] * len(streams)
    for want in expected:
        if want.startswith("$ ") or not want.strip() or want.startswith("..."):
            continue
        cut = want.endswith(" ...")
        key = shape(want[:-4] if cut else want)
        for i, lines in enumerate(got):
            k = next((k for k in range(at[i], len(lines)) if (lines[k].startswith(key) if cut else lines[k] == key)),
                     None)
            if k is not None:
                at[i] = k + 1
                break
        else:
            return f"not produced (in order) by shape: {want!r}\n  as shape: {key!r}"
    return None


def assert_cluster_example(ident: str, *streams: str) -> None:
    """What an integration test produced (one or more streams) has the shape of the page's block marked
    ``#IDENT``: the same lines in the same order, up to times, digests, paths and figures."""
    example = cluster_example(ident)
    problem = shape_mismatch(example.body.splitlines(), *streams)
    shown = "\n--- next stream:\n".join(streams)
    assert problem is None, f"{example.name} (#{ident}): {problem}\n--- produced:\n{shown}"
