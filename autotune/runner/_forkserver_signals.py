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

from autotune.runner._quiet import in_forkserver_preload, process_output_to_debug_log  # noqa: E402 - Ctrl-C ignored first

# Only in the forkserver itself: a process that imports this module for another reason (the memory
# baseline's measuring interpreter, a test's probe) keeps its own output.
if in_forkserver_preload():
    process_output_to_debug_log()
