"""Running the real ``autotune`` command line from a test, as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

# No end-of-search confirmation (3 x 3 re-runs by default): a test that wants it passes
# --confirm-top after these (the last occurrence of an option wins).
FAST_SEARCH_ARGS = ["--warmup-steps", "1", "--max-measure-steps", "4", "--seq-len", "32", "--confirm-top", "0"]


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the real ``autotune`` command line in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def run_cli_in_process(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real command line's entry point (``autotune.__main__.main``) in this process.

    For the readers of a study (``best``, ``export``, ``report``), ``estimate``, ``devices``, the
    inputs a search refuses up front, and searches whose test is about what they record. A fresh
    interpreter per call spends 5-30 s importing torch and transformers before the work the test is
    about, and a search's own forkserver imports them again; here they are imported once per test
    process, and a search's trials start from this process's forkserver (started once, reused).
    Everything after the import is what a user's process does: the same ``main``, its exit status,
    its stdout and stderr, printed by consoles made for this call as the process makes them at its
    start (so ``COLUMNS`` and ``env`` apply); the signal handlers a search installs are put back.

    ``run_cli`` (a real subprocess) stays the way to run a command whose behaviour is about processes
    (signals, a crash, a server, several workers), a search whose trials must see ``env`` (a forkserver
    already running keeps the environment it started with), and the real ``python -m autotune`` a user
    runs from a fresh interpreter: tests/e2e/test_search_e2e.py's search and tests/test_cli_errors.py's
    fresh-interpreter cases. The other end-to-end searches (LoRA, bring-your-own, small micro-batches, the
    SFT and DPO studies) run their whole path here, entry point to trials: a search as a process costs
    about 20 s of CPU before its first trial (its own imports, then its forkserver's torch, transformers,
    peft and DeepSpeed: 12-13 s), which on CI's two cores was a tenth of the suite's time for nothing
    those tests are about (docs/benchmarks.md, "The test suite").

    An exception escaping ``main`` is returned as exit 1 with its traceback on stderr, as a process
    would end, so a test of "no traceback" fails on it.
    """
    import contextlib
    import io
    import traceback
    from unittest import mock

    from autotune import cli
    from autotune.__main__ import main

    stdout, stderr = io.StringIO(), io.StringIO()
    returncode = 0
    previous_dir = os.getcwd()
    previous_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with (
        mock.patch.dict(os.environ, {"COLUMNS": "200", **(env or {})}),
        mock.patch.object(sys, "argv", ["autotune", *args]),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        with (
            mock.patch.object(cli, "console", cli._console()),
            mock.patch.object(cli, "err_console", cli._console(stderr=True)),
        ):
            os.chdir(cwd)
            try:
                main()
            except SystemExit as exit_:
                returncode = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            except BaseException:  # noqa: BLE001 - reported as a crashed process would be
                traceback.print_exc(file=stderr)
                returncode = 1
            finally:
                os.chdir(previous_dir)
                for sig, handler in previous_handlers.items():
                    signal.signal(sig, handler)
    return subprocess.CompletedProcess(["autotune", *args], returncode, stdout.getvalue(), stderr.getvalue())


def search_a_model_directory(
    tmp_path: Path, model: Path, space: str, trials: int, study: str
) -> tuple[subprocess.CompletedProcess, str]:
    """``autotune search`` of a local model directory on the CPU in this process: ``space`` (YAML text), at
    FAST_SEARCH_ARGS (--seq-len 32, 1 warm-up step, at most 4 measured, no confirmation), a 4 GiB ceiling, a
    SQLite study ``study`` in ``tmp_path``; returns the run and its storage URL."""
    space_file = tmp_path / "space.yaml"
    space_file.write_text(space)
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    where = ["--space", str(space_file), "--storage", storage, "--study-name", study, "--memory-ceiling", "4GiB"]
    args = ["--model", str(model), "--device", "cpu", *FAST_SEARCH_ARGS, *where, "--trials", str(trials)]
    return run_cli_in_process("search", *args, cwd=tmp_path), storage


def run_cli_in_terminal(
    *args: str, cwd: Path, answer: bytes = b"y\n", timeout: float = 300, env: dict | None = None
) -> tuple[int, str]:
    """Run the real ``autotune`` command under a pseudo-terminal that answers ``answer`` to any prompt.

    A library that asks only when stdin is a terminal (transformers' "Do you wish to run the custom
    code? [y/N]") asks here, as it would a user at a shell: every time the output stops on an
    unfinished line (a prompt waiting for its answer) the terminal types ``answer``.

    Returns:
        The exit status and everything the command wrote (stdout and stderr share the terminal),
        with terminal escape sequences removed.
    """
    import pty
    import re
    import select
    import termios
    import time

    command = [sys.executable, "-m", "autotune", *args]
    environment = {**os.environ, "COLUMNS": "400", "TERM": "dumb", **(env or {})}
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the terminal is its stdin, stdout and stderr
        # No echo: what the terminal types never lands inside the output the test reads.
        attributes = termios.tcgetattr(0)
        attributes[3] &= ~termios.ECHO
        termios.tcsetattr(0, termios.TCSANOW, attributes)
        os.chdir(cwd)
        os.execvpe(command[0], command, environment)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([terminal], [], [], 1.0)
            if not ready:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    break
                continue
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: the child closed the terminal (it exited)
                break
            if not chunk:
                break
            output += chunk
            if not output.endswith((b"\n", b"\r")):  # a prompt waits on its line
                os.write(terminal, answer)
        else:
            os.kill(pid, 9)
    finally:
        os.close(terminal)
    _, status = os.waitpid(pid, 0)
    text = (
        re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace")).replace("\r\n", "\n").replace("\r", "\n")
    )
    return os.waitstatus_to_exitcode(status), text
