"""Preloaded by the forkserver in tests/runner/test_forkserver_signals.py, after the module that sets the
forkserver's exit: it registers an exit handler of its own and keeps an object that the interpreter's
teardown (clearing the modules) deletes, each writing a line to ``$AUTOTUNE_TEARDOWN_PROBE``."""

from __future__ import annotations

import atexit
import os


class TornDown:
    def __init__(self, path: str) -> None:
        # Kept on the object: the teardown clears the modules' names, builtins included, before it deletes it.
        self.path, self.open = path, open

    def __del__(self) -> None:
        with self.open(self.path, "a") as out:
            out.write("torn down\n")


def note(line: str) -> None:
    with open(os.environ["AUTOTUNE_TEARDOWN_PROBE"], "a") as out:
        out.write(line + "\n")


atexit.register(note, "its exit handler ran")
kept = TornDown(os.environ["AUTOTUNE_TEARDOWN_PROBE"])
print("said by the forkserver before its exit", flush=False)  # buffered: the exit flushes it
