"""One exception root for the kit.

Library code raises these and never prints or exits; ``repro.cli`` turns them into
``error: ...`` / ``hint: ...`` on stderr and picks the exit code from the class.
"""

from __future__ import annotations

from dataclasses import dataclass


class ReproError(Exception):
    """Root of every error the kit reports to a user."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        parts = [self.message]
        cause = self.__cause__
        while cause is not None:
            parts.append(str(cause))
            cause = cause.__cause__
        return ": ".join(parts)


class UsageError(ReproError):
    """Bad input from the user: arguments, files, names."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file, located as precisely as we can."""

    file: str
    line: int | None
    field: str
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class InputError(UsageError):
    """A manifest or hosts file is invalid; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        hints = [p.hint for p in problems if p.hint]
        super().__init__("\n".join(str(p) for p in problems), hint=hints[0] if len(set(hints)) == 1 else None)

    def __str__(self) -> str:
        return self.message


class UnknownPlugin(UsageError):
    """A parser or launcher name that is not registered."""


class PluginUnavailable(ReproError):
    """A registered plugin that cannot run on this machine."""

    exit_code = 3


class EnvironmentUnavailable(ReproError):
    """Docker engine, sshd, a node or a tool the kit needs is not reachable."""

    exit_code = 3


class BuildError(ReproError):
    """An image could not be pulled, built, pushed or verified."""

    exit_code = 4


class RunFailed(ReproError):
    """A benchmark cell failed on at least one node."""

    exit_code = 5


class ParseError(UsageError):
    """A log file cannot be read as a training log at all (empty, binary, unknown format)."""


class ProvenanceError(ReproError):
    """A provenance record or run archive is invalid, tampered with or drifted."""

    exit_code = 6


class NotSealed(ReproError):
    """A run that never sealed itself (``repro audit``): nothing in it can be verified, which is no sign of
    tampering (that is :class:`ProvenanceError`, exit 6, which outranks this)."""

    exit_code = 10


class NotSigned(ReproError):
    """A run that must be signed (``repro audit --require-signature``) carries no signature."""

    exit_code = 9
