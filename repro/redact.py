"""Secrets are never shown: one place that decides what is secret and blanks it out.

Three kinds of secret are recognised wherever the kit prints or records something:

- the value of a variable or key whose name looks secret (TOKEN, SECRET, PASSWORD, KEY,
  AUTH, CREDENTIAL): ``WANDB_API_KEY=...``;
- the password of a URL: ``postgres://user:<redacted>@db/x``;
- the value of a command-line option whose name ends in key, token, password, passwd,
  secret or credential(s): ``--wandb-key=<redacted>``, and ``--wandb-key <redacted>``.

``Redactor`` additionally scrubs values already known to be secret out of free text (logs
the containers write), where no name stands next to them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW(OR)?D|KEY|AUTH|CREDENTIAL", re.IGNORECASE)
#: Shorter values are not scrubbed from free text (they would blank out ordinary words).
MIN_SECRET_CHARS = 6

_OPTION = re.compile(r"^(--?[A-Za-z0-9_.-]*(?:key|token|passw(?:or)?d|secret|credentials?))(=)(.+)$", re.IGNORECASE)
_OPTION_ALONE = re.compile(r"^--?[A-Za-z0-9_.-]*(?:key|token|passw(?:or)?d|secret|credentials?)$", re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<secret>[^\s@/]+)(?=@)")
_TEXT_OPTION = re.compile(r"(?P<head>(?<![\w-])--?[A-Za-z0-9_.-]*(?:key|token|passw(?:or)?d|secret|credentials?)[= ])"
                          r"(?P<secret>[^\s'\"]+)", re.IGNORECASE)
#: NAME=value in text and argv: environment-style (upper-case) names only; ``HostKey=/path`` is an sshd option
_TEXT_ASSIGN = re.compile(r"(?P<head>\b[A-Z_][A-Z0-9_]*(?:TOKEN|SECRET|PASSW(?:OR)?D|KEY|AUTH|CREDENTIALS?)"
                          r"[A-Z0-9_]*=)(?P<secret>[^\s'\"]+)")


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redact_value(value: str) -> str:
    """A value whose name is not secret, with any URL password in it blanked."""
    return _URL_CREDENTIALS.sub(lambda m: m["head"] + REDACTED, value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with secret-named values replaced by ``<redacted>`` and URL passwords blanked."""
    return {k: REDACTED if is_secret_name(k) else redact_value(v) if isinstance(v, str) else v for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Command tokens with secret options' values (``--x-key=V``, ``--x-token V``) and URL passwords blanked."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next and not tok.startswith("-"):
            out.append(REDACTED)
        elif (m := _OPTION.match(tok)) and "{" not in m[3]:
            out.append(m[1] + m[2] + REDACTED)
        else:
            out.append(redact_value(_redact_assignment(tok)))
        hide_next = bool(_OPTION_ALONE.match(tok))
    return out


_ASSIGNMENT = re.compile(r"^(?P<head>(?:-e=|--env=)?(?P<name>[A-Z_][A-Z0-9_]*)=)(?P<value>.+)$")


def _redact_assignment(tok: str) -> str:
    """``NAME=value``, ``-e=NAME=value``, ``--env=NAME=value`` with a secret NAME -> value blanked."""
    m = _ASSIGNMENT.match(tok)
    if m is None and (tok.startswith("-e=") or tok.startswith("--env=")):  # docker -e: the name is the user's
        m = re.match(r"^(?P<head>--?e(?:nv)?=(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)(?P<value>.+)$", tok)
    return m["head"] + REDACTED if m and is_secret_name(m["name"]) and "{" not in m["value"] else tok


def redact_text(text: str) -> str:
    """Free text (a progress line, a log line) with NAME=secret, --x-key=secret and URL passwords blanked."""
    text = _URL_CREDENTIALS.sub(lambda m: m["head"] + REDACTED, text)
    text = _TEXT_OPTION.sub(lambda m: m["head"] + REDACTED, text)
    return _TEXT_ASSIGN.sub(lambda m: m["head"] + REDACTED, text)


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
                new = [redact_text(t) for t in redact_argv(node)]
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


class Redactor:
    """Scrubs known secret values out of text, bytes and JSON-like data."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        self._raw = [v.encode() for v in self.values]

    @classmethod
    def from_envs(cls, *envs: Mapping[str, str] | None) -> Redactor:
        return cls(v for env in envs if env for k, v in env.items() if is_secret_name(k) and isinstance(v, str))

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
