"""The forkserver's first import: it ignores Ctrl-C from the moment it starts, and it is light."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autotune.runner._quiet import DEBUG_LOG_ENV
from tests.support.cli import REPO
from tests.support.processes import sigint_as_from_a_terminal

PROBE = """
import os, signal, sys, time
import autotune.runner._forkserver_signals
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.2)
print("alive", "torch" in sys.modules, "transformers" in sys.modules)
"""


@pytest.mark.slow
def test_a_process_that_imported_it_survives_ctrl_c_without_importing_torch():
    """Ctrl-C in the seconds the forkserver imports torch printed a 40-60 line traceback before
    autotune's own line; the module ignores SIGINT first. Importing it (and so the runner's face) must
    not import torch: that would put those seconds back before the signal is ignored."""
    # SIGINT as a terminal's search has it, whatever started this test run (a background job ignores it).
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        preexec_fn=sigint_as_from_a_terminal,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["alive", "False", "False"]


FORKSERVER = """
import multiprocessing, os, sys
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(["autotune.runner._forkserver_signals", "tests.support.teardown_probe"])
process = context.Process(target=os.getpid)
process.start()
process.join()
print("trial exit code", process.exitcode)
multiprocessing.forkserver._forkserver._stop()  # closes its client's end and waits for it to exit
"""


@pytest.mark.slow
def test_the_forkserver_exits_after_every_exit_handler_without_the_interpreters_teardown(tmp_path):
    """Clearing torch's and transformers' modules at the forkserver's exit cost about 1.7 s of CPU at the
    end of every search; skipped, the handlers the preloaded libraries registered still run, and what the
    forkserver printed still reaches the debug log."""
    probe, log = tmp_path / "probe.txt", tmp_path / "debug.log"
    env = {**os.environ, "AUTOTUNE_TEARDOWN_PROBE": str(probe), DEBUG_LOG_ENV: str(log), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", FORKSERVER], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["trial", "exit", "code", "0"]
    assert probe.read_text().splitlines() == ["its exit handler ran"]
    assert "said by the forkserver before its exit" in log.read_text()


@pytest.mark.slow
def test_a_process_forked_from_the_forkserver_keeps_its_own_exit_status():
    """The handler is inherited by a fork; there it must not turn the process's exit into the forkserver's."""
    forked = (
        "import sys\n"
        "import autotune.runner._forkserver_signals as forkserver\n"
        "forkserver._FORKSERVER_PID = -1  # as in a process forked from it\n"
        "forkserver._exit_without_teardown()\n"
        "print('went on')\n"
        "sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", forked], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert (done.returncode, done.stdout) == (3, "went on\n"), done.stderr


CTRL_C_WHILE_IT_STARTS = """
import multiprocessing, os, signal, threading, time
from multiprocessing import forkserver
from autotune.runner import _pool


def blocked_signals(queue):
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    queue.put(int(status["SigBlk"], 16))


def start_then_ctrl_c(start=forkserver.ensure_running):  # the forkserver runs, its starter has not returned
    start()
    os.kill(os.getpid(), signal.SIGINT)  # to the process, as a terminal's Ctrl-C: any thread not blocking it
    if os.environ.get("OTHER_THREAD"):
        time.sleep(1.0)  # the other thread takes it while the forkserver's starter still runs


if __name__ == "__main__":  # the forkserver's children import this script as their main module
    if os.environ.get("OTHER_THREAD"):  # as OpenBLAS's own threads, or a Python thread, in a search
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["autotune.runner._forkserver_signals"])
    forkserver.ensure_running = start_then_ctrl_c
    try:
        _pool._start_forkserver_deaf_to_ctrl_c()
        print("the Ctrl-C was lost")
    except KeyboardInterrupt:
        print("the Ctrl-C reached the search")
    queue = context.SimpleQueue()
    process = context.Process(target=blocked_signals, args=(queue,))
    process.start()
    process.join()
    print("SIGINT blocked in a forked process:", bool(queue.get() & (1 << (signal.SIGINT - 1))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("other_thread", [False, True], ids=["one thread", "another thread takes it"])
def test_a_ctrl_c_while_the_forkserver_starts_reaches_the_search_and_the_trials_can_receive_it(tmp_path, other_thread):
    """The search ignored SIGINT while it started the forkserver, so the child inherits it ignored; a Ctrl-C
    in that moment (a busy machine made it one in a hundred searches of the suite) was dropped and the
    search ran to its end. Blocked, it waits for the search's own handler, and the forkserver, which
    inherits the mask, unblocks it once it ignores it, so a trial it forks can still be interrupted. A mask
    is a thread's: the Ctrl-C then goes to another thread of the search (OpenBLAS starts its own), which
    dropped it while it was ignored; the search keeps it now."""
    script = tmp_path / "ctrl_c_while_it_starts.py"
    script.write_text(CTRL_C_WHILE_IT_STARTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), **({"OTHER_THREAD": "1"} if other_thread else {})}
    # SIGINT as a terminal's search has it: a test run started as a background job inherits it ignored, and the
    # script's Ctrl-C was then lost whatever the code (two fresh clones' runs here, 2026-11-30).
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        preexec_fn=sigint_as_from_a_terminal,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "the Ctrl-C reached the search",
        "SIGINT blocked in a forked process: False",
    ]
