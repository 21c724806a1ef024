"""Imported first by the forkserver: it ignores Ctrl-C from the moment it starts, and writes to the debug log.

CPython's forkserver ignores SIGINT ("protect the process from ^C", ``multiprocessing/forkserver.py``,
``main``) only after importing its preload modules; torch and transformers take seconds to import,
and a Ctrl-C in those seconds printed a KeyboardInterrupt traceback of 40-60 lines from the forkserver
before autotune's own line. The orchestrator handles Ctrl-C; the forkserver exits once it is gone.
Trial children lead their own session (``runner/_child.child_main``) and restore the default handler.
Importing it imports the runner's face, which imports no torch (``tests/runner/test_forkserver_signals.py``).

The libraries the forkserver preloads speak as they are imported (bitsandbytes 0.50.2 on an AVX512-BF16
CPU: "Failed to load CPU gemm_4bit_forward ..."), and its stdout and stderr are the search's terminal: that
line landed in the middle of the trial table. The forkserver writes nothing of autotune's, and each trial
it starts writes to its own log (``runner/_child.redirect_output``): its output goes to the debug log
(``autotune.runner._quiet``).
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
# Started with SIGINT blocked (runner._pool: a Ctrl-C meanwhile is the orchestrator's): ignored now, so
# unblocked, as every process it forks would otherwise inherit a SIGINT that never arrives.
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

import atexit  # noqa: E402 - Ctrl-C ignored first
import os  # noqa: E402
import sys  # noqa: E402

from autotune.runner._quiet import in_forkserver_preload, process_output_to_debug_log  # noqa: E402


def _exit_without_teardown() -> None:
    """The forkserver's last step at exit: its output flushed, then gone without the interpreter's
    teardown. Registered before its preload imports anything, so every exit handler they register runs
    first (atexit runs the last registered first); what is skipped is the clearing of torch's,
    transformers' and DeepSpeed's modules, about 1.7 s of CPU at the end of every search on a 2-core
    machine (the preload's process: 9.3 s of CPU from start to exit with the teardown, 7.6 s without) for a process
    that holds nothing to save: each trial it started ran, and exited, in its own process. A process forked
    from it that exits through the interpreter (multiprocessing's own children leave through ``os._exit``)
    inherits the handler and keeps its own exit: its status and its teardown."""
    if os.getpid() != _FORKSERVER_PID:
        return
    if "logging" in sys.modules:  # its own exit handler may be one registered before this one
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing of autotune's is in it
            pass
    os._exit(0)


# Only in the forkserver itself: a process that imports this module for another reason (the memory
# baseline's measuring interpreter, a test's probe) keeps its own output and its own exit.
_FORKSERVER_PID = os.getpid()
if in_forkserver_preload():
    atexit.register(_exit_without_teardown)
    process_output_to_debug_log()
