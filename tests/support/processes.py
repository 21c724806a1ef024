"""Waiting on real processes from a test."""

from __future__ import annotations

import signal
import time

import psutil


def wait_until_gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def sigint_as_from_a_terminal() -> None:
    """A ``preexec_fn`` for a search a test interrupts with SIGINT or SIGHUP: their default actions, as
    under a terminal.

    A test run started in the background by a non-interactive shell inherits SIGINT ignored (POSIX,
    "Shell Command Language", 2.11: asynchronous lists ignore SIGINT), an ignored signal stays ignored
    across exec, and Python installs no KeyboardInterrupt handler for it: the search would never see
    the test's Ctrl-C. Under ``nohup`` SIGHUP is ignored the same way, and the search rightly keeps it
    ignored (``study._liveness``): the closed-terminal test saw the search run to its end (exit 0) when
    the suite itself ran under nohup.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
