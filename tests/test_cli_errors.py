"""Bad input through the real command line: one clear line on stderr, exit status 2, no traceback.

The cases in ``IN_A_SUBPROCESS`` run ``python -m autotune`` in a subprocess, as a user would (a
fresh interpreter: the entry point, its imports, the exit status the shell sees: marked slow); the
others (``IN_THIS_PROCESS``) run the same entry point in this process (``run_cli_in_process``), which
spares each an interpreter start and the torch import of 10-40 s. They fail before any trial runs; a
module-scoped fixture runs each group once, and each test checks its own case.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.cli import REPO, run_cli, run_cli_in_process

SEARCH = ["search", "--trials", "1", "--confirm-top", "0"]


def _write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(text)
    return str(path)


def _create_study(url: str, name: str, model_name: str, seq_len: int, with_oom_trial: bool = False) -> None:
    """A study made through autotune's own API in a real storage, as an earlier search leaves it."""
    from autotune.result import TrialResult
    from autotune.runner import Workload
    from autotune.space import SearchSpace
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study
    from autotune.study._record import tell

    request = SearchRequest(
        workload=Workload.for_model(model_name, seq_len=seq_len, ceiling_bytes=2 * 1024**3),
        space=SearchSpace(choices={"micro_batch": [8], "pin_memory": [False]}),
    )
    study = open_study(open_storage(url), name, request)
    if with_oom_trial:
        trial = study.ask(request.space.distributions())
        tell(
            study,
            trial,
            TrialResult(
                status="oom", error="DefaultCPUAllocator: can't allocate memory", ceiling_bytes=request.ceiling_bytes
            ),
        )


def _cases(root: Path) -> dict[str, tuple[list[str], str]]:
    """Case id -> (command-line arguments, a phrase the error line must contain)."""
    db = f"sqlite:///{root / 'errors.db'}"
    _create_study(db, "gpt2-study", "gpt2-tiny", 32)
    nofit_db = f"sqlite:///{root / 'nofit.db'}"
    _create_study(nofit_db, "nofit", "bert-tiny", 32, with_oom_trial=True)
    tiny = [*SEARCH, "--model", "bert-tiny", "--seq-len", "32", "--storage", db]

    def space(name: str, text: str) -> list[str]:
        return [*tiny, "--space", _write(root, name, text)]

    return {
        "unknown model": (
            [*SEARCH, "--model", "no-such-model-anywhere", "--storage", db],
            "unknown model 'no-such-model-anywhere'",
        ),
        "malformed yaml": (space("malformed.yaml", "micro_batch: [8, 16\n"), "not valid YAML (line 2"),
        "unknown lever": (space("unknown.yaml", "micro_batch: [8]\nwarp_speed: [true]\n"), "warp_speed: unknown lever"),
        "empty choices": (space("empty.yaml", "micro_batch: [8]\noptim: []\n"), "optim: needs at least one choice"),
        "wrong type": (space("type.yaml", "micro_batch: [eight]\n"), "micro_batch: choice 'eight'"),
        "non-positive batch": (space("zero.yaml", "micro_batch: [8, 0]\n"), "each a positive integer"),
        "nothing runs on the device": (
            space("gpu-only.yaml", "micro_batch: [8]\ndtype: [fp16]\n"),
            "no choice of dtype runs on cpu",
        ),
        "ceiling zero": ([*tiny, "--memory-ceiling", "0"], "must be above zero"),
        "fraction above one": ([*tiny, "--memory-ceiling", "1.5"], "a fraction must be at most 1"),
        "unparsable ceiling": ([*tiny, "--memory-ceiling", "lots"], "is not understood"),
        "unparsable storage": ([*SEARCH, "--model", "bert-tiny", "--storage", "autotune.db"], "is not a database URL"),
        "unreachable storage": (
            [*SEARCH, "--model", "bert-tiny", "--storage", "postgresql://autotune:hunter2@127.0.0.1:9/none"],
            "postgresql://autotune:***@127.0.0.1:9/none: cannot open it",
        ),
        "db not writable": (
            [*SEARCH, "--model", "bert-tiny", "--storage", "sqlite:////proc/autotune-test.db"],
            "--storage: cannot",
        ),
        "study of another model": ([*tiny, "--study-name", "gpt2-study"], "pass a new --study-name"),
        "study of another seq len": (
            [*SEARCH, "--model", "gpt2-tiny", "--seq-len", "64", "--storage", db, "--study-name", "gpt2-study"],
            "seq_len 32 there, 64 here",
        ),
        "export without feasible trial": (
            ["export", "--storage", nofit_db, "--study-name", "nofit", "--out", str(root / "best.json")],
            "no feasible trial",
        ),
        "callback not found": (
            [*tiny, "--callback", "tests.support.faults:NoSuchFault"],
            "has no TrainerCallback class named NoSuchFault",
        ),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> tuple[dict[str, tuple[list[str], str]], Path]:
    root = tmp_path_factory.mktemp("cli-errors")
    return _cases(root), root


# A fresh interpreter each: a model that resolves nowhere, a storage that cannot be reached, and a
# --callback imported from the user's PYTHONPATH.
IN_A_SUBPROCESS = ("unknown model", "unreachable storage", "callback not found")
IN_THIS_PROCESS = (
    "malformed yaml",
    "unknown lever",
    "empty choices",
    "wrong type",
    "non-positive batch",
    "nothing runs on the device",
    "ceiling zero",
    "fraction above one",
    "unparsable ceiling",
    "unparsable storage",
    "db not writable",
    "study of another model",
    "study of another seq len",
    "export without feasible trial",
)


@pytest.fixture(scope="module")
def in_process_results(cases):
    """The cases run through the entry point in this process, each once for the module."""
    arguments, root = cases
    return {case: run_cli_in_process(*arguments[case][0], cwd=root) for case in IN_THIS_PROCESS}


@pytest.fixture(scope="module")
def subprocess_results(cases):
    """The cases run as ``python -m autotune``, side by side."""
    arguments, root = cases
    env = {"PYTHONPATH": str(REPO)}  # tests.support.faults importable for the --callback cases
    with ThreadPoolExecutor(max_workers=len(IN_A_SUBPROCESS)) as pool:
        futures = {
            case: pool.submit(run_cli, *arguments[case][0], cwd=root, timeout=300, env=env) for case in IN_A_SUBPROCESS
        }
        return {case: future.result() for case, future in futures.items()}


def assert_one_line_and_exit_2(completed: subprocess.CompletedProcess, phrase: str, root: Path) -> None:
    error_lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == 2, completed.stderr
    assert "Traceback" not in completed.stderr + completed.stdout
    assert len(error_lines) == 1, completed.stderr
    assert error_lines[0].startswith("autotune: error: ")
    assert phrase in error_lines[0]
    assert "hunter2" not in completed.stderr  # a password never reaches the terminal
    assert not (root / "best.json").exists()  # nothing exported


@pytest.mark.parametrize("case", IN_THIS_PROCESS)
def test_bad_input_is_one_line_and_exit_2(in_process_results, cases, case):
    arguments, root = cases
    assert_one_line_and_exit_2(in_process_results[case], arguments[case][1], root)


@pytest.mark.slow
@pytest.mark.parametrize("case", IN_A_SUBPROCESS)
def test_bad_input_is_one_line_and_exit_2_from_a_fresh_interpreter(subprocess_results, cases, case):
    arguments, root = cases
    assert_one_line_and_exit_2(subprocess_results[case], arguments[case][1], root)


def test_every_case_is_checked(cases):
    arguments, _ = cases
    assert set(IN_A_SUBPROCESS) | set(IN_THIS_PROCESS) == set(arguments)
    assert not set(IN_A_SUBPROCESS) & set(IN_THIS_PROCESS)


@pytest.mark.slow
def test_not_writable_database_for_a_normal_user(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere mode bits forbid; covered by the /proc case")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    completed = run_cli(*SEARCH, "--model", "bert-tiny", "--storage", f"sqlite:///{locked / 'study.db'}")
    assert completed.returncode == 2
    assert [line for line in completed.stderr.splitlines() if line.strip()] == [
        f"autotune: error: --storage: cannot create {locked / 'study.db'} (is {locked} an existing, writable directory?)"
    ]


# --- the command line itself: Click's parse errors, every option of every command -------------------------


def _commands() -> dict[str, object]:
    """Each command of the real ``autotune`` app as Click runs it (Typer's public ``get_command``)."""
    import typer.main

    from autotune.cli import app

    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _typed_options() -> list[tuple[str, str, type]]:
    """(command, option, declared type) for every option declared ``int`` or ``float``, read from each
    command function's own annotations."""
    import typing

    from autotune.cli import app

    found = []
    for info in app.registered_commands:
        command = info.name or info.callback.__name__.replace("_", "-")
        hints = typing.get_type_hints(info.callback)
        for param in _commands()[command].params:
            declared = {t for t in typing.get_args(hints[param.name]) or (hints[param.name],)} - {type(None)}
            if declared in ({int}, {float}):
                found.append((command, max(param.opts, key=len), declared.pop()))
    return found


def _required_arguments(command: str) -> list[str]:
    """The command's required options, each with a value of its type (parsing stops at the bad one first)."""
    return [arg for param in _commands()[command].params if param.required for arg in (param.opts[0], "1")]


TYPED_OPTIONS = _typed_options()


def test_the_typed_options_are_found():
    found = {(command, option) for command, option, _ in TYPED_OPTIONS}
    assert {
        ("search", "--global-batch"),
        ("search", "--prune-ratio"),
        ("best", "--top"),
        ("dashboard", "--port"),
    } <= found


@pytest.mark.parametrize(
    ("command", "option", "declared"), TYPED_OPTIONS, ids=[f"{c} {o}" for c, o, _ in TYPED_OPTIONS]
)
def test_a_value_not_of_its_options_type_is_one_line(tmp_path, command, option, declared):
    """``--global-batch 2.5``: one line naming the option, the value and what it must be, not Click's usage box."""
    value, words = ("2.5", "a whole number") if declared is int else ("fast", "a number")
    for given in ([option, value], [f"{option}={value}"]):
        completed = run_cli_in_process(command, *_required_arguments(command), *given, cwd=tmp_path)
        assert completed.returncode == 2, completed.stderr
        assert completed.stderr.splitlines() == [f"autotune: error: {option}: '{value}' is not {words}"]
        assert completed.stdout == ""


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["search", "--model", "x", "--no-such"], "No such option: --no-such"),
        (["search"], "Missing option '--model'"),
        (["best", "--top"], "Option '--top' requires an argument"),
        (["search", "--model", "x", "--screen", "maybe"], "Got unexpected extra argument(s) (maybe)"),
        (["serch"], "No such command 'serch'"),
    ],
    ids=["unknown option", "missing option", "missing value", "extra argument", "unknown command"],
)
def test_every_other_command_line_error_is_one_line(tmp_path, args, line):
    completed = run_cli_in_process(*args, cwd=tmp_path)
    command = f"autotune {args[0]}" if args[0] != "serch" else "autotune"
    assert completed.returncode == 2, completed.stderr
    [error] = completed.stderr.splitlines()
    assert error.startswith(f"autotune: error: {line}") and error.endswith(f"; `{command} --help` lists the options")


@pytest.mark.parametrize("args", [["--help"], ["search", "--help"], ["chat-corpus", "--help"]])
def test_help_still_prints_and_exits_0(tmp_path, args):
    completed = run_cli_in_process(*args, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "Usage:" in completed.stdout and completed.stderr == ""


def test_no_command_prints_the_help_and_exits_2(tmp_path):
    completed = run_cli_in_process(cwd=tmp_path)
    assert completed.returncode == 2
    assert "Usage:" in completed.stdout and "Commands" in completed.stdout


def test_a_library_exception_is_quoted_by_its_first_line_and_a_bare_key_by_its_type():
    from autotune.errors import first_line

    assert first_line(ValueError("hidden size 65 is not a multiple of 4\n  more detail")) == (
        "hidden size 65 is not a multiple of 4"
    )
    # transformers 5.24 building cohere_compass's default config: KeyError('full_attention')
    assert first_line(KeyError("full_attention")) == "KeyError: 'full_attention'"
    assert first_line(RuntimeError()) == "RuntimeError"
