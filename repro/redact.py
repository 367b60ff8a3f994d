"""Secrets are never shown: one place that decides what is secret and blanks it out, and what of
a text may reach a terminal.

A secret is recognised by its name or by its shape, wherever the kit prints or records something
(plan, show, report, check, progress, the run directory, the archive, provenance):

- the value of a variable or key whose name contains PASS, SECRET, TOKEN, KEY, WEBHOOK,
  CREDENTIAL, AUTH or COOKIE: ``WANDB_API_KEY=<redacted>``, ``DB_PASS=<redacted>``;
- the value of a command-line option with such a word in its name, in either form:
  ``--wandb-key=<redacted>``, ``--password <redacted>``, ``--auth=<redacted>``; a short option
  only for the programs known to take a secret with it (``sshpass -p``, ``curl -u``): elsewhere
  ``-p 1`` is a print frequency;
- the credentials of any URL: ``https://user:<redacted>@host/``, ``https://<redacted>@host/`` (a
  bare token; an ssh user name is kept), also when the password holds ``/``;
- the value of an HTTP ``Authorization``, ``Proxy-Authorization``, ``Cookie`` or ``Set-Cookie``
  header, and of ``X-…-Token``/``-Key``/``-Auth`` headers.

Values that hold a ``{placeholder}`` are templates, not secrets, and are kept. Where in doubt
the kit blanks (``--monkey 1`` loses its 1). ``Redactor`` additionally scrubs values already known
to be secret out of free text (logs the containers write), where no name stands next to them.

``shown`` is what every printer applies: secrets blanked and terminal control removed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"PASS|SECRET|TOKEN|KEY|WEBHOOK|CREDENTIAL|AUTH|COOKIE", re.IGNORECASE)
#: Shorter values are not scrubbed from free text (they would blank out ordinary words).
MIN_SECRET_CHARS = 6

_WORD = (r"(?:key|token|pass|passwd|password|passphrase|pwd|secrets?|credentials?|auth|authorization|webhook"
         r"|cookie)")
#: an option name: a dash-separated part of it ends in a secret word (``--api-key-file``, not ``--tokenizer``)
_OPTION_NAME = rf"--?(?:[A-Za-z0-9]+[-_.])*[A-Za-z0-9]*{_WORD}(?:[-_.][A-Za-z0-9]+)*"
_OPTION = re.compile(rf"^({_OPTION_NAME})=(.*)$", re.IGNORECASE)
_OPTION_ALONE = re.compile(rf"^{_OPTION_NAME}$", re.IGNORECASE)
#: short (and other) options that carry a secret only for the program named
_PROGRAM_OPTIONS = {"sshpass": ("-p",), "curl": ("-u", "--user"), "redis-cli": ("-a",)}
#: a URL's user information: ``user:password@`` (the password may hold ``/``; ``host:8080/`` is a port)
#: or ``token@``
_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b(?P<name>[A-Za-z][A-Za-z0-9+.-]*)://)(?P<user>[^\s:/@'\"<>]*)"
                              r"(?::(?P<secret>(?!\d+(?:/|$))[^\s@'\"]+))?@")
_SSH_SCHEMES = {"ssh", "git+ssh", "ssh+git", "sftp", "scp", "rsync"}
_HEADER = re.compile(r"(?P<head>\b(?:proxy-authorization|authorization|set-cookie|cookie"
                     r"|x-[a-z0-9-]*(?:token|key|auth|secret)[a-z0-9-]*)[ \t]*:[ \t]*)"
                     r"(?P<secret>[^\s'\"][^\r\n'\"]*)", re.IGNORECASE)
_VALUE = r"(?P<secret>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+)"
#: a secret option's value is the next word unless that is a long option (``--token -V``: -V is the value)
_TEXT_OPTION = re.compile(rf"(?P<head>(?<![\w/-]){_OPTION_NAME}(?:=| +(?!--[A-Za-z]))){_VALUE}",
                          re.IGNORECASE)
_LONG_OPTION = re.compile(r"^--[A-Za-z]")
#: NAME=value in text and argv: environment-style (upper-case) names only; ``HostKey=/path`` is an sshd option
_TEXT_ASSIGN = re.compile(r"(?P<head>\b[A-Z_][A-Z0-9_]*(?:PASS|SECRET|TOKEN|KEY|WEBHOOK|CREDENTIAL|AUTH"
                          rf"|COOKIE)[A-Z0-9_]*=){_VALUE}")


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def _url(m: re.Match[str]) -> str:
    if m["secret"] is not None:
        return f"{m['scheme']}{m['user']}:{REDACTED}@"
    if not m["user"] or m["name"].lower() in _SSH_SCHEMES:
        return m[0]
    return f"{m['scheme']}{REDACTED}@"


def _blank(m: re.Match[str]) -> str:
    secret = m["secret"]
    if "{" in secret:  # a template, filled in at run time
        return m[0]
    quote = secret[0] if secret[0] in "'\"" else ""
    return m["head"] + quote + REDACTED + quote


def redact_text(text: str) -> str:
    """Free text (a progress line, a log line, a printed command), every secret of a known shape blanked."""
    text = _URL_CREDENTIALS.sub(_url, text)
    text = _HEADER.sub(lambda m: m["head"] + REDACTED, text)
    text = _TEXT_OPTION.sub(lambda m: _blank(m) if m["secret"] else m[0], text)
    return _TEXT_ASSIGN.sub(_blank, text)


def redact_value(value: str) -> str:
    """A value whose name is not secret, with any secret of a known shape in it blanked."""
    return redact_text(value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with secret-named values replaced by ``<redacted>`` and secrets in the other values blanked."""
    return {k: REDACTED if is_secret_name(k) else redact_text(v) if isinstance(v, str) else v
            for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Command tokens with secret options' values (``--x-key=V``, ``--x-token V``), secret assignments,
    URL credentials and headers blanked."""
    program = argv[0].rsplit("/", 1)[-1] if argv else ""
    by_program = _PROGRAM_OPTIONS.get(program, ())
    out: list[str] = []
    hide_next = env_next = False
    for i, tok in enumerate(argv):
        if by_program and i and not hide_next and not tok.startswith("-"):
            by_program = ()  # its first operand: what follows is another program's (sshpass -p X ssh -p 22)
        if hide_next and not _LONG_OPTION.match(tok) and "{" not in tok:
            out.append(REDACTED)
            hide_next = env_next = False
            continue
        elif (m := _OPTION.match(tok) or _short_attached(tok, by_program)) and m[2] and "{" not in m[2]:
            out.append(f"{m[1]}={REDACTED}" if tok.startswith(f"{m[1]}=") else m[1] + REDACTED)
        else:
            out.append(redact_text(_redact_assignment(tok, loose=env_next)))
        hide_next = bool(_OPTION_ALONE.match(tok)) or tok in by_program
        env_next = tok in ("-e", "--env")
    return out


def _short_attached(tok: str, options: Sequence[str]) -> re.Match[str] | None:
    """``-pSECRET`` or ``--user=SECRET`` for a program whose ``-p`` or ``--user`` takes a secret."""
    for o in options:
        if m := re.match(rf"^({re.escape(o)})({'' if len(o) == 2 else '='}.+)$", tok):
            return m
    return None


_ASSIGNMENT = re.compile(r"^(?P<head>(?:-e=|--env=)?(?P<name>[A-Z_][A-Z0-9_]*)=)(?P<value>.+)$")
_ANY_ASSIGNMENT = re.compile(r"^(?P<head>(?:-e=|--env=)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)(?P<value>.+)$")


def _redact_assignment(tok: str, loose: bool = False) -> str:
    """``NAME=value``, ``-e=NAME=value``, ``--env=NAME=value`` with a secret NAME -> value blanked (after
    ``-e`` or with ``-e=``, and for docker, the name is the user's and may be lower-case)."""
    m = _ASSIGNMENT.match(tok)
    if m is None and (loose or tok.startswith("-e=") or tok.startswith("--env=")):
        m = _ANY_ASSIGNMENT.match(tok)
    return m["head"] + REDACTED if m and is_secret_name(m["name"]) and "{" not in m["value"] else tok


def redact_document(doc: Any, path: str = "") -> tuple[Any, list[str]]:
    """A manifest or hosts document (plain data) with every secret blanked, and the dotted paths
    of what was changed: secret-named string values, URL passwords, secret command options."""
    done: list[str] = []

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, Mapping):
            out = {}
            for k, v in node.items():
                at = f"{where}.{k}" if where else str(k)
                if isinstance(v, str) and is_secret_name(str(k)) and k not in _NOT_SECRET_KEYS:
                    out[k] = REDACTED
                    done.append(at)
                else:
                    out[k] = walk(v, at)
            return out
        if isinstance(node, list):
            if all(isinstance(t, str) for t in node):
                new = redact_argv(node)
                done.extend(f"{where}[{i}]" for i, (a, b) in enumerate(zip(node, new)) if a != b)
                return new
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, str):
            new = redact_text(node)
            if new != node:
                done.append(where)
            return new
        return node

    return walk(doc, path), done


#: Keys of the kit's own schemas whose names look secret but hold no secret.
_NOT_SECRET_KEYS = frozenset({"sha256", "cell_args"})

# ------------------------------------------------------------------ terminal control
#: escape sequences (CSI, OSC, DCS/SOS/PM/APC strings, two-byte ones) and 8-bit CSI
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
                     r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?|\x1b[ -/]*[0-~]?|\x9b[0-?]*[ -/]*[@-~]")
#: other control characters (C0 but tab and newline, DEL, C1) and the bidirectional overrides
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSHOWN = re.compile(f"{_ESCAPE.pattern}|{_CONTROL.pattern}")
#: the colours the kit itself paints verdicts with (repro.verdict.report.ANSI), kept when colour is on
_OWN_COLOURS = frozenset({"\x1b[0m", "\x1b[31m", "\x1b[32m", "\x1b[33m"})


def strip_control(text: str, *, colour: bool = False) -> str:
    """``text`` without terminal escape sequences and control characters (tab and newline stay); with
    ``colour``, the kit's own verdict colours stay (an injected one can only colour text)."""
    return _UNSHOWN.sub(lambda m: m[0] if colour and m[0] in _OWN_COLOURS else "", text)


def shown(text: str, *, colour: bool = False) -> str:
    """Text as the kit may print it: secrets blanked, terminal control removed."""
    return strip_control(redact_text(text), colour=colour)


class Redactor:
    """Scrubs known secret values out of text, bytes and JSON-like data."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        self._raw = [v.encode() for v in self.values]

    @classmethod
    def from_envs(cls, *envs: Mapping[str, str] | None) -> Redactor:
        return cls(v for env in envs if env
                   for k, v in env.items() if is_secret_name(k) and isinstance(v, str))

    def text(self, s: str) -> str:
        for v in self.values:
            s = s.replace(v, REDACTED)
        return redact_text(s)

    def bytes(self, b: bytes) -> bytes:
        for v in self._raw:
            b = b.replace(v, REDACTED.encode())
        return redact_text(b.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def data(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, Mapping):
            return {self.text(str(k)): self.data(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.data(v) for v in obj]
        return obj

    @property
    def longest(self) -> int:
        return max((len(v) for v in self._raw), default=1)

    def found_in(self, b: bytes) -> bool:
        return any(v in b for v in self._raw)
