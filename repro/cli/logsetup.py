"""The kit's logging, configured once, by the command line: the package's loggers write to stderr through one
handler, at the level ``-v`` (info) or ``-vv`` (debug) asks for, else the level ``REPRO_LOG_LEVEL`` names,
else warnings only. What a record says goes through the CLI's one filter (secrets blanked, terminal control
removed), like everything else the CLI prints.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from repro.errors import UsageError
from repro.redact import shown

ENV = "REPRO_LOG_LEVEL"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LOGGER = "repro"


class _Shown(logging.Formatter):
    """``warning: <message>``; with ``-v`` and more, the logger's name too."""

    def __init__(self, named: bool) -> None:
        super().__init__("%(levelname)s: %(name)s: %(message)s" if named else "%(levelname)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        return shown(super().format(record))


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (a test runner may swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stderr)
        super().emit(record)


def level(verbose: int, env: Mapping[str, str]) -> int:
    """The level ``-v`` given ``verbose`` times asks for, else ``REPRO_LOG_LEVEL``'s, else WARNING."""
    if verbose:
        return logging.INFO if verbose == 1 else logging.DEBUG
    name = env.get(ENV, "").strip().lower()
    if not name:
        return logging.WARNING
    if name not in LEVELS:
        raise UsageError(f"{ENV}={env[ENV]!r} is not a log level",
                         hint=f"one of {', '.join(LEVELS)}, or unset")
    return LEVELS[name]


def configure(verbose: int, env: Mapping[str, str]) -> logging.Handler:
    """Set the package logger's level and its one handler (replacing the one an earlier call set)."""
    lvl = level(verbose, env)
    logger = logging.getLogger(LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, _Handler)]:
        logger.removeHandler(old)
    handler = _Handler()
    handler.setFormatter(_Shown(named=lvl < logging.WARNING))
    logger.addHandler(handler)
    logger.setLevel(lvl)
    return handler
