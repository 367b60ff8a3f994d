"""Logging is configured once, by the command line: ``repro -v`` / ``-vv`` or ``REPRO_LOG_LEVEL`` set the level of
the package's loggers, one handler writes them to stderr through the CLI's output filter, and a bad level is a
usage error, not a traceback."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from cli_helpers import run_cli

from repro.cli.logsetup import ENV, LOGGER, configure
from repro.errors import UsageError


@pytest.fixture(autouse=True)
def kept_logger() -> Iterator[logging.Logger]:
    """The package logger as it was before the test (these tests configure it)."""
    logger = logging.getLogger(LOGGER)
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


def test_warnings_only_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    configure(0, {})
    log = logging.getLogger("repro.images.registry")
    log.info("pulled %s", "img")
    log.warning("could not remove tag %s", "x:1")
    assert capsys.readouterr().err == "warning: could not remove tag x:1\n"


@pytest.mark.parametrize("verbose, env, shows_info, shows_debug", [
    (1, {}, True, False), (2, {}, True, True), (0, {ENV: "DEBUG"}, True, True), (0, {ENV: "info"}, True, False),
    (0, {ENV: "error"}, False, False), (1, {ENV: "error"}, True, False),
])
def test_verbose_or_the_environment_sets_the_level(verbose: int, env: dict[str, str], shows_info: bool,
                                                   shows_debug: bool, capsys: pytest.CaptureFixture[str]) -> None:
    configure(verbose, env)
    log = logging.getLogger("repro.run.sampling")
    log.debug("a step")
    log.info("a fact")
    err = capsys.readouterr().err
    assert ("info: repro.run.sampling: a fact\n" in err) is shows_info
    assert ("debug: repro.run.sampling: a step\n" in err) is shows_debug


def test_configured_twice_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    configure(0, {})
    configure(0, {})
    logging.getLogger("repro.nodes.ssh").warning("once")
    assert capsys.readouterr().err == "warning: once\n"


def test_a_record_is_filtered_like_all_output(capsys: pytest.CaptureFixture[str]) -> None:
    configure(0, {})
    logging.getLogger("repro.throwaway").warning("node said \x1b]0;title\x07\x1b[2Jdone")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and err.endswith("done\n")


def test_a_bad_level_names_the_variable() -> None:
    with pytest.raises(UsageError, match="REPRO_LOG_LEVEL='loud' is not a log level") as e:
        configure(0, {ENV: "loud"})
    assert e.value.hint is not None and "debug" in e.value.hint


def test_the_command_line_sets_it(kept_logger: logging.Logger) -> None:
    r = run_cli("-vv", "list")
    assert r.returncode == 0, r.stderr
    assert kept_logger.level == logging.DEBUG
    r = run_cli("list", env={**os.environ, ENV: "error"})
    assert r.returncode == 0, r.stderr
    assert kept_logger.level == logging.ERROR


def test_the_command_line_refuses_a_bad_level() -> None:
    r = run_cli("list", env={**os.environ, ENV: "loud"})
    assert r.returncode == 2
    assert r.stderr.startswith("error: REPRO_LOG_LEVEL='loud' is not a log level") and "Traceback" not in r.stderr
