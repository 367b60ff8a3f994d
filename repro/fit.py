"""Terminal text that fits a width: long lines wrapped, shell commands at their words.

``repro list``, ``show`` and ``plan`` print through :func:`fit_text` unless asked for their wide form.
A command line the plan prints (``docker run ...``, ``$ ...``) is wrapped between its words with a
`` \\`` continuation, so what is printed still pastes into a shell as the same command; a word longer than
a line is written double-quoted and continued at the start of the next lines (inside double quotes a
backslash-newline is removed, so the word stays the same). Any other line wraps at spaces under a hanging
indent.
"""

from __future__ import annotations

import shlex
import textwrap

WIDTH = 120
COMMANDS = ("docker run ", "$ ")


def fit_text(text: str, width: int = WIDTH) -> str:
    return "\n".join(fit_line(line, width) for line in text.split("\n"))


def fit_line(line: str, width: int = WIDTH) -> str:
    if len(line) <= width:
        return line
    indent = line[: len(line) - len(line.lstrip())]
    body = line[len(indent):]
    if body.startswith(COMMANDS):
        wrapped = _command(indent, body, width)
        if wrapped is not None:
            return wrapped
    return "\n".join(textwrap.wrap(body, width, initial_indent=indent, subsequent_indent=indent + "    ",
                                   break_on_hyphens=False, break_long_words=True))


def _command(indent: str, body: str, width: int) -> str | None:
    """A shell command split between its words, each line but the last ending in `` \\``."""
    head = "$ " if body.startswith("$ ") else ""
    try:
        words = [shlex.quote(w) for w in shlex.split(body[len(head):])]
    except ValueError:
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
