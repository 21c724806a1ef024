"""The fast loop's guard: a test not marked ``slow`` starts no process.

``pytest -m "not slow"`` is the loop a developer runs after each change; it stays fast only if the
tests it selects run in the test's own process. Starting a process (the real CLI, a search's
forkserver, a trial child, a server) costs an interpreter start and usually the torch import, seconds
each. So while a test that is not marked ``slow`` sets up and runs, a process start is refused
(:class:`ProcessInFastTest`: the loop stays fast even with a test marked wrong) and recorded, and the
test fails with the process named and the fix: mark it ``slow``.

Process starts are seen through Python's audit events (``subprocess.Popen``, ``os.fork``,
``os.posix_spawn``, ``os.system``, ``os.exec``: https://docs.python.org/3/library/audit_events.html)
and ``multiprocessing``'s ``BaseProcess.start``: a child of an already running forkserver raises no
audit event in this process (the forkserver forks it), nor does a spawned one in Python 3.11
(``multiprocessing.util.spawnv_passfds`` calls ``_posixsubprocess.fork_exec`` directly).
"""

from __future__ import annotations

import multiprocessing.process
import sys
from collections.abc import Callable
from typing import Any

PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec"})

_watching = False
_started: list[str] = []


class ProcessInFastTest(RuntimeError):
    """Raised where a test not marked slow starts a process (the test fails on it)."""


def _refuse(what: str) -> None:
    _started.append(what)
    raise ProcessInFastTest(f"a test not marked slow started a process: {what}")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _watching and event in PROCESS_EVENTS:
        _refuse(f"{event} {_describe(args)}")


def _describe(args: tuple[Any, ...]) -> str:
    """The program and its arguments, on one line."""
    shown = " ".join(" ".join(map(str, a)) if isinstance(a, (list, tuple)) else str(a) for a in args[:2])
    return " ".join(shown.split())[:200]


def _wrap_process_start(start: Callable[[multiprocessing.process.BaseProcess], None]) -> Callable[..., None]:
    def guarded_start(process: multiprocessing.process.BaseProcess) -> None:
        if _watching:
            _refuse(f"multiprocessing {type(process).__name__} {getattr(process, '_target', None)!r}"[:200])
        start(process)

    return guarded_start


def install() -> None:
    """Once per test process: the audit hook (it cannot be removed) and the guarded ``start``."""
    sys.addaudithook(_audit)
    base = multiprocessing.process.BaseProcess
    base.start = _wrap_process_start(base.start)  # type: ignore[method-assign]  # the real start, unless refused


def watch() -> None:
    """From here until :func:`processes_started`: refuse and record every process start."""
    global _watching
    _started.clear()
    _watching = True


def processes_started() -> list[str]:
    """Stop recording; the process starts seen since :func:`watch`."""
    global _watching
    _watching = False
    return list(_started)


def failure_message(nodeid: str, started: list[str]) -> str:
    return (
        f"{nodeid} is not marked slow but started {len(started)} process(es), first: {started[0]}. "
        "Mark it @pytest.mark.slow (a test that starts a process or trains a model is slow; "
        "pyproject.toml, \"deselect with -m 'not slow'\"), or test it in this process."
    )
