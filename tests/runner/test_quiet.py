"""Library chatter kept off autotune's lines (autotune.runner._quiet): what a library prints, warns or logs, at import
or at run time, goes to the debug log; the command line's answers stay its own lines.

Real packages on ``sys.path`` that chatter (tests/support/chatty.py): a new one imported in this process
under ``library_output_to_debug_log``, and shadows of the optional libraries the command line imports
(bitsandbytes, peft, trl, deepspeed: each chatters, then becomes the installed library) under the real
``python -m autotune``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import itertools
import logging
import os
import subprocess
import sys
import threading
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autotune.runner._quiet import DEBUG_ENV, DEBUG_LOG_ENV, debug_log_path, library_output_to_debug_log
from tests.support.chatty import chatter_lines, write_chatty_library, write_chatty_shadows
from tests.support.cli import REPO, run_cli

_names = (f"chatty_library_{n}" for n in itertools.count())


@pytest.fixture
def chatty(tmp_path, monkeypatch):
    """A new chatty library's name, importable from ``tmp_path``; the debug log in ``tmp_path``."""
    name = next(_names)
    write_chatty_library(tmp_path / "libraries", name)
    monkeypatch.syspath_prepend(str(tmp_path / "libraries"))
    monkeypatch.setenv(DEBUG_LOG_ENV, str(tmp_path / "debug.log"))
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    yield name
    sys.modules.pop(name, None)


@contextlib.contextmanager
def terminal() -> types.SimpleNamespace:
    """stdout and stderr as the command line's process has them (its entry point in this process: run_cli_in_process)."""
    seen = types.SimpleNamespace(out=io.StringIO(), err=io.StringIO())
    with contextlib.redirect_stdout(seen.out), contextlib.redirect_stderr(seen.err):
        yield seen


def test_what_a_library_says_at_import_and_at_run_time_goes_to_the_debug_log_only(chatty, tmp_path):
    with terminal() as seen, library_output_to_debug_log():
        library = importlib.import_module(chatty)
        library.speak()
    assert seen.out.getvalue() == "" and seen.err.getvalue() == ""
    logged = (tmp_path / "debug.log").read_text()
    for line in chatter_lines(chatty) + chatter_lines(chatty, at_run_time=True):
        assert line in logged
    with terminal() as seen:
        library.speak()  # after the block: its own handler, made at import, still writes to the debug log
    assert "logs through its own handler at run time" not in seen.err.getvalue()
    assert (tmp_path / "debug.log").read_text().count("logs through its own handler at run time") == 2


def test_another_threads_lines_reach_the_terminal_while_a_library_is_imported(chatty, tmp_path, monkeypatch):
    """The search's own lines (its live view, another worker's trial line) are not taken for the library's."""
    importing, written = threading.Event(), threading.Event()
    sync = types.ModuleType("chatty_sync")
    sync.importing, sync.written = importing, written
    monkeypatch.setitem(sys.modules, "chatty_sync", sync)
    init = tmp_path / "libraries" / chatty / "__init__.py"
    init.write_text(
        "import chatty_sync\nchatty_sync.importing.set()\nchatty_sync.written.wait(30)\n" + init.read_text()
    )

    def autotunes_own_line() -> None:
        importing.wait(30)
        print("trial #3 ok", file=sys.stdout)
        written.set()

    with terminal() as seen, library_output_to_debug_log():
        thread = threading.Thread(target=autotunes_own_line)
        thread.start()
        importlib.import_module(chatty)
        thread.join()
    assert seen.out.getvalue() == "trial #3 ok\n" and seen.err.getvalue() == ""
    assert "trial #3 ok" not in (tmp_path / "debug.log").read_text()


@pytest.mark.filterwarnings("ignore:chatty_library:FutureWarning")
def test_autotune_debug_leaves_a_librarys_output_where_it_sends_it(chatty, tmp_path, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    with terminal() as seen, library_output_to_debug_log():
        importlib.import_module(chatty)
    assert chatter_lines(chatty)[0] in seen.out.getvalue()
    assert chatter_lines(chatty)[1] in seen.err.getvalue()
    assert not (tmp_path / "debug.log").exists()


def test_a_library_imported_quietly_is_imported_as_usual_and_nothing_stays_changed(chatty):
    hooks, handlers, showwarning = list(sys.meta_path), list(logging.getLogger().handlers), warnings.showwarning
    with terminal() as seen, library_output_to_debug_log():
        library = importlib.import_module(chatty)
        stdout_inside = sys.stdout
    assert stdout_inside is seen.out  # autotune's own lines go where they went
    assert isinstance(library.__loader__, importlib.machinery.SourceFileLoader)
    assert "def speak" in inspect.getsource(library)
    assert sys.meta_path == hooks and logging.getLogger().handlers == handlers
    assert warnings.showwarning is showwarning


def test_the_debug_log_is_in_autotunes_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(DEBUG_LOG_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert debug_log_path() == tmp_path / "autotune" / "logs" / "autotune.log"


# --- the real command line, with chatty shadows of the libraries it imports --------------------------------

SHADOWED = ["bitsandbytes", "peft", "trl", "deepspeed"]


def _bad_inputs(root: Path) -> dict[str, tuple[list[str], str]]:
    """Bad input that the parent answers after importing optional libraries: case -> (arguments, phrase)."""
    from autotune.spec.chat_corpus import write_jsonl
    from tests.support.bad_input import TINY_SPACE

    (root / "unknown.json").write_text('{"no_such_field": 1}')
    (root / "deepspeed.json").write_text(
        '{"deepspeed": {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", '
        '"train_batch_size": "auto", "zero_optimization": {"stage": 7}}}'
    )
    (root / "learning_rate.json").write_text('{"learning_rate": 0.0001}')
    write_jsonl(str(root / "chat.jsonl"), 16, 0, "messages", 1.0)
    (root / "user_callbacks.py").write_text("import bitsandbytes  # a user's module imports a library\n")
    search = ["search", "--model", "bert-tiny", "--space", TINY_SPACE, "--seq-len", "32", "--trials", "1"]
    return {
        "--base-args unknown field (TrainingArguments, peft, bitsandbytes)": (
            [*search, "--base-args", str(root / "unknown.json")],
            "no_such_field",
        ),
        "--base-args deepspeed stage 7 (DeepSpeed)": (
            [*search, "--base-args", str(root / "deepspeed.json")],
            "DeepSpeed rejects the deepspeed config",
        ),
        "--trainer sft, good --base-args, too few rows (SFTConfig built: transformers 5.24's FutureWarning)": (
            [
                "search",
                "--model",
                "llama-tiny",
                "--dataset",
                str(root / "chat.jsonl"),
                "--seq-len",
                "32",
                "--trials",
                "1",
                "--base-args",
                str(root / "learning_rate.json"),
            ],
            "less than one global batch",
        ),
        "--callback not found (TrainerCallback, a user's module)": (
            [*search, "--callback", "user_callbacks:NoSuchCallback"],
            "has no TrainerCallback class named NoSuchCallback",
        ),
    }


@pytest.mark.slow
def test_bad_input_is_one_line_whatever_the_libraries_it_imports_say(tmp_path):
    """Each library the parent imports on the way to the answer chatters at import: the answer is still one
    line on stderr, nothing on stdout, and the chatter is in the debug log."""
    write_chatty_shadows(tmp_path / "shadows", SHADOWED)
    cases = _bad_inputs(tmp_path)
    env = {"PYTHONPATH": f"{tmp_path / 'shadows'}:{tmp_path}:{REPO}", DEBUG_LOG_ENV: str(tmp_path / "debug.log")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {
            case: pool.submit(run_cli, *args, cwd=tmp_path, timeout=600, env=env) for case, (args, _) in cases.items()
        }
        done = {case: run.result() for case, run in runs.items()}
    for case, completed in done.items():
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        assert completed.returncode == 2, (case, completed.stderr[-3000:])
        assert len(lines) == 1 and lines[0].startswith("autotune: error: "), (case, completed.stderr[-3000:])
        assert cases[case][1] in lines[0], (case, lines[0])
        assert "prints on stdout" not in completed.stdout, (case, completed.stdout[-3000:])
    logged = (tmp_path / "debug.log").read_text()
    for name in SHADOWED:
        for line in chatter_lines(name):
            assert line in logged, (name, line)
    if _deprecates_gradient_checkpointing():  # SFTConfig sets it: every SFTConfig built warns
        assert "`gradient_checkpointing` is deprecated" in logged


def _deprecates_gradient_checkpointing() -> bool:
    """transformers 5.24 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` and warns of the old name."""
    import dataclasses

    from transformers import TrainingArguments

    return "activation_checkpointing" in {field.name for field in dataclasses.fields(TrainingArguments)}


@pytest.mark.slow
def test_the_forkservers_output_goes_to_the_debug_log(tmp_path):
    """What the libraries the forkserver preloads say would land in the middle of the search's table."""
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from autotune.runner._quiet import process_output_to_debug_log; process_output_to_debug_log(); "
            "print('preloaded'); print('preloaded too', file=sys.stderr)",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, DEBUG_LOG_ENV: str(tmp_path / "debug.log")},
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "" and completed.stderr == ""
    assert "preloaded\npreloaded too\n" in (tmp_path / "debug.log").read_text()
