"""Imported first by the forkserver: it ignores Ctrl-C from the moment it starts.

CPython's forkserver ignores SIGINT ("protect the process from ^C", ``multiprocessing/forkserver.py``,
``main``) only after importing its preload modules; torch and transformers take seconds to import,
and a Ctrl-C in those seconds printed a KeyboardInterrupt traceback of 40-60 lines from the forkserver
before autotune's own line. The orchestrator handles Ctrl-C; the forkserver exits once it is gone.
Trial children lead their own session (``runner/_child.child_main``) and restore the default handler.
A top-level module: importing anything under ``autotune.runner`` imports torch first.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
