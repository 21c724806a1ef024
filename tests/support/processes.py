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
    """A ``preexec_fn`` for a search a test interrupts with SIGINT: its default action, as under a terminal.

    A test run started in the background by a non-interactive shell inherits SIGINT ignored (POSIX,
    "Shell Command Language", 2.11: asynchronous lists ignore SIGINT), an ignored signal stays ignored
    across exec, and Python installs no KeyboardInterrupt handler for it: the search would never see
    the test's Ctrl-C.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
