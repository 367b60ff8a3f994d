"""Terminal text that fits a width: long lines wrapped, shell commands at their words.

``repro list``, ``show`` and ``plan`` print through :func:`fit_text` unless asked for their wide form.
A command line the plan prints (``docker run ...``, ``$ ...``, a Slurm task's ``task N on NODE: ...``) is
wrapped between its words, each word as written, with a `` \\`` continuation, so what is printed still
pastes into a shell as the same command and reads back as the wide line; a word longer than a line is
written double-quoted and continued at the start of the next lines (inside double quotes a
backslash-newline is removed, so the word stays the same). Any other line wraps at spaces under a hanging
indent; :func:`fit_scheduler_text` leaves the indented lines of a file shown as it is (a batch script, a
``--multi-prog`` file) as they are.
"""

from __future__ import annotations

import re
import shlex
import textwrap

WIDTH = 120
COMMANDS = ("docker run ", "$ ")
#: a Slurm job step's task as ``repro plan`` shows it: ``task 0 on NODE: docker create ...``
TASK = re.compile(r"task \d+ on [^\s:]+: ")
#: the indented lines of a scheduler's text that are the kit's own words, not a file's
SCHEDULER_PROSE = ("CPUs: ", "telemetry (")


def fit_text(text: str, width: int = WIDTH) -> str:
    return "\n".join(fit_line(line, width) for line in text.split("\n"))


def fit_scheduler_text(text: str, width: int = WIDTH) -> str:
    """A scheduler's part of a plan: its commands wrapped and its unindented lines, the indented others (the
    lines of a file shown as it is) exact."""
    def exact(line: str) -> bool:
        body = line.lstrip()
        return line.startswith(" ") and not body.startswith(SCHEDULER_PROSE) and not _is_command(body)
    return "\n".join(line if exact(line) else fit_line(line, width) for line in text.split("\n"))


def _is_command(body: str) -> bool:
    return body.startswith(COMMANDS) or TASK.match(body) is not None


def fit_line(line: str, width: int = WIDTH) -> str:
    if len(line) <= width:
        return line
    indent = line[: len(line) - len(line.lstrip())]
    body = line[len(indent):]
    if _is_command(body):
        wrapped = _command(indent, body, width)
        if wrapped is not None:
            return wrapped
    return "\n".join(textwrap.wrap(body, width, initial_indent=indent, subsequent_indent=indent + "    ",
                                   break_on_hyphens=False, break_long_words=True))


def _command(indent: str, body: str, width: int) -> str | None:
    """A shell command split between its words, each line but the last ending in `` \\``."""
    task = TASK.match(body)
    head = task.group(0) if task else "$ " if body.startswith("$ ") else ""
    words = shell_words(body[len(head):])
    if not words:
        return None  # not one shell command after all: wrapped as text
    lines, current = [], indent + head + words[0]
    for w in words[1:]:
        if len(current) + 1 + len(w) + 2 <= width:
            current += " " + w
            continue
        lines.append(current + " \\")
        current = indent + "    " + w
        if len(current) + 2 > width and "!" not in w:  # one word wider than a line ("!": history expansion)
            *full, current = _long_word(indent + "    ", w, width - 2)  # room for a " \\" after it
            lines += full
    return "\n".join([*lines, current])


def shell_words(text: str) -> list[str]:
    """``text`` split at its unquoted blanks, each word as written (quotes and escapes kept); none where it
    is not whole shell words (an open quote, a trailing backslash, a line break)."""
    words, start, quote, i = [], None, "", 0
    while i < len(text):
        ch = text[i]
        if quote == "'" or (quote == "$'" and ch == "'"):
            quote = "" if ch == "'" else quote
        elif quote == "$'" or (quote == '"' and ch != '"'):
            i += ch == "\\"
        elif quote == '"':
            quote = ""
        elif ch in " \t":
            if start is not None:
                words.append(text[start:i])
            start = None
        else:
            start = i if start is None else start
            if ch == "\\":
                i += 1
            elif ch in "'\"":
                quote = "$'" if ch == "'" and text[i - 1:i] == "$" else ch
        i += 1
    if quote or i > len(text) or "\n" in text:
        return []
    return words + ([text[start:]] if start is not None else [])


def _long_word(lead: str, word: str, width: int) -> list[str]:
    """``word`` (shell-quoted) as the same word double-quoted over several lines, each but the last
    ending in a backslash-newline that the shell removes; the continuations start at column 0."""
    raw = shlex.split(word)[0]
    units = ['"'] + [("\\" + ch) if ch in '\\"$`' else ch for ch in raw] + ['"']
    lines, current = [], lead
    for u in units:
        if len(current) + len(u) + 1 > width:
            lines.append(current + "\\")
            current = ""
        current += u
    return [*lines, current]
