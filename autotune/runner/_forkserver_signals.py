"""Imported first by the forkserver: it ignores Ctrl-C from the moment it starts.

CPython's forkserver ignores SIGINT ("protect the process from ^C", ``multiprocessing/forkserver.py``,
``main``) only after importing its preload modules; torch and transformers take seconds to import,
and a Ctrl-C in those seconds printed a KeyboardInterrupt traceback of 40-60 lines from the forkserver
before autotune's own line. The orchestrator handles Ctrl-C; the forkserver exits once it is gone.
Trial children lead their own session (``runner/_child.child_main``) and restore the default handler.
Importing it imports the runner's face, which imports no torch (``tests/runner/test_forkserver_signals.py``).
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
