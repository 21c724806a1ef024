"""A storage call finishes before a Ctrl-C lands: the stop signal is held, then raised once the call returns.

Why: a KeyboardInterrupt raised inside an Optuna storage call can leave a SQLite statement stepping. Optuna's
session returns the connection to SQLAlchemy's pool, whose reset rolls it back, but since Python 3.11 a
rollback no longer resets the statements of the connection's cursors (CPython gh-88258, bpo-44092), and a
statement still stepping holds SQLite's SHARED lock (https://www.sqlite.org/lockingv3.html) for as long as
its cursor lives: through the interrupted frames' reference cycles, until a garbage collection. The search
then writes what the Ctrl-C stopped (the interrupted trials, its time-share line), another pooled
connection's write waited out the whole busy timeout (``_open.SQLITE_BUSY_TIMEOUT_S``, 120 s) and failed
with "database is locked": CI's ``tests/test_bad_state_search.py`` Ctrl-C during the confirmation, whose
SIGINT came while the confirmation read its candidates (stop 53); a signal raised right after a SELECT is
executed does it every time (``tests/storage/test_ctrl_c.py``).

So while the main thread (the only one Python runs signal handlers in) is inside a storage call, each stop
signal whose handler is Python's (the search's: ``autotune.study.stop_as_on_ctrl_c``; Python's own
KeyboardInterrupt) is held; when the outermost call returns or raises, the handlers are back and the first
signal held is raised again, to them. A second stop signal during the same call is not held: its handler
runs at once, so a call that waits long (a PostgreSQL server restarting: ``_open.POSTGRES_RECONNECT_WAIT_S``)
still ends at a second Ctrl-C. A SIG_DFL or ignored signal is left as it is: it raises nothing in the call.
"""

from __future__ import annotations

import functools
import inspect
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from optuna.storages import RDBStorage

# The signals that stop a search as Ctrl-C does: `kill`, `docker stop` and batch schedulers send SIGTERM; a
# closed terminal or a dropped SSH session, SIGHUP (POSIX "General Terminal Interface": the controlling
# process, then the foreground group). Held here, handled by autotune.study.stop_as_on_ctrl_c.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Call = TypeVar("Call", bound=Callable[..., Any])


class _Held:
    """The main thread's state: how deep in storage calls, the handlers replaced, the signals held."""

    depth = 0
    handlers: dict[int, Callable[[int, FrameType | None], Any]] = {}
    signals: list[int] = []


def _hold(signum: int, frame: FrameType | None) -> None:
    if not _Held.signals:
        _Held.signals.append(signum)
        return
    _restore_handlers()  # a second one: not held; its handler runs at the next bytecode, inside the call
    _Held.signals.clear()
    signal.raise_signal(signum)


def _restore_handlers() -> None:
    for signum, handler in _Held.handlers.items():
        signal.signal(signum, handler)
    _Held.handlers = {}


def holding_stop_signals(call: Call) -> Call:
    """``call``, with the stop signals held while the main thread is in it (module docstring)."""

    @functools.wraps(call)
    def held(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return call(*args, **kwargs)  # signal handlers run in the main thread only
        if _Held.depth == 0:
            for signum in STOP_SIGNALS:
                handler = signal.getsignal(signum)
                if callable(handler):  # Python's; SIG_DFL, SIG_IGN and None (not set from Python) raise nothing
                    _Held.handlers[signum] = handler
                    signal.signal(signum, _hold)
        _Held.depth += 1
        try:
            return call(*args, **kwargs)
        finally:
            _Held.depth -= 1
            if _Held.depth == 0:
                _restore_handlers()
                held_signals, _Held.signals = _Held.signals, []
                if held_signals:
                    signal.raise_signal(held_signals[0])  # to the handler restored above: raised here, the call done

    return held  # type: ignore[return-value]


class RDBStorageHoldingCtrlC(RDBStorage):
    """Optuna's RDB storage whose every call finishes before a stop signal is handled (module docstring)."""


def _storage_calls() -> list[str]:
    """The methods of :class:`RDBStorage` and its bases, public and private (a private one, Optuna's
    ``_get_stale_trial_ids``, is called from outside the class); not dunders, static or class methods."""
    names: list[str] = []
    for klass in RDBStorage.__mro__[:-1]:  # not object
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and not name.startswith("__") and name not in names:
                names.append(name)
    return names


for _name in _storage_calls():
    setattr(RDBStorageHoldingCtrlC, _name, holding_stop_signals(getattr(RDBStorage, _name)))
