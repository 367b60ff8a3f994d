"""repro up stops on SIGTERM and SIGHUP as on Ctrl-C, unless the caller ignores them (nohup)."""

from __future__ import annotations

import os
import signal

import pytest

from repro.cli.common import stop_as_interrupt


@pytest.fixture
def restored():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_kill_or_a_closed_terminal_interrupts_and_is_remembered(restored, sig) -> None:
    stopped_by = stop_as_interrupt()
    assert stopped_by == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), sig)
    assert stopped_by == [sig]


def test_nohup_keeps_the_hangup_ignored(restored) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    stop_as_interrupt()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing raised
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
