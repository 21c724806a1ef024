"""Waiting on real processes from a test."""

from __future__ import annotations

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
