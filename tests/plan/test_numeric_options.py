"""Every numeric option of every command takes only values that mean something (issue 38, section 7).

One table says what each accepts (``autotune.plan._checks.ACCEPTED``) and one function checks it
(``within``): a non-finite float, a negative, zero where it means nothing and an absurd maximum are each
one line naming the option and the accepted range, from the real command line (in this process: every
value is refused before anything runs). The table is read off the commands themselves, so a numeric
option added to a command without a range fails here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import typer

from autotune import cli
from autotune.plan import ACCEPTED, within
from tests.support.bad_input import assert_one_error_line
from tests.support.cli import run_cli_in_process

# Each command with what it needs to get as far as its checks (a value its check misses then fails on
# something else, fast: a model that does not exist, a device that does not exist).
COMMANDS = {
    "search": ["search", "--model", "no-such-model"],
    "estimate": ["estimate", "--model", "no-such-model"],
    "best": ["best", "--storage", "sqlite:///missing.db"],
    "export": ["export", "--storage", "sqlite:///missing.db"],
    "report": ["report", "--storage", "sqlite:///missing.db"],
    "dashboard": ["dashboard", "--storage", "sqlite:///missing.db", "--host", "256.0.0.1"],
    "devices": ["devices", "--calibrate", "--device", "no-such-device"],
    "chat-corpus": ["chat-corpus", "--out", "chat.jsonl", "--samples", "1"],
    "verify": ["verify", "--storage", "sqlite:///missing.db"],
}


def _numeric_options() -> list[tuple[str, str, bool]]:
    """(command, option, takes a float) for every int or float option of every command, as Typer
    declares them (the annotation of each parameter, ``None`` taken off)."""
    group = typer.main.get_command(cli.app)
    found = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]  # a group's commands
        for param in command.params:
            if param.type_descriptor.annotation in (int, float):
                found.append((name, param.opts[0], param.type_descriptor.annotation is float))
    return found


NUMERIC = _numeric_options()


def test_every_numeric_option_of_every_command_has_its_range():
    assert {command for command, _, _ in NUMERIC} == set(COMMANDS)
    missing = [option for _, option, _ in NUMERIC if option not in ACCEPTED]
    assert missing == []
    assert not set(ACCEPTED) - {option for _, option, _ in NUMERIC}  # no range for an option that is gone
    for option, accepted in ACCEPTED.items():
        assert accepted.high is not None or accepted.bounded_by, f"{option}: no maximum, and nothing says why"


def _refused_values(option: str, floats: bool) -> list[str]:
    """Below the lowest, above the highest, and (for a float) NaN and both infinities."""
    accepted = ACCEPTED[option]
    low, high = accepted.low, accepted.high
    values: list[float] = [math.nan, -math.inf, math.inf] if floats else []
    if accepted.low_open:
        values.append(low)
    else:
        values.append(low / 2 if floats and low > 0 else low - 1)
    if high is not None:
        values.append(high if accepted.high_open else (high * 2 if floats else high + 1))
    return [str(value if floats else int(value)) for value in values]


CASES = [(command, option, value) for command, option, floats in NUMERIC for value in _refused_values(option, floats)]


@pytest.mark.parametrize(("command", "option", "value"), CASES, ids=[" ".join(case) for case in CASES])
def test_a_value_that_means_nothing_is_one_line_naming_the_option_and_its_range(tmp_path, command, option, value):
    completed = run_cli_in_process(*COMMANDS[command], option, value, cwd=tmp_path)
    assert_one_error_line(completed, f"autotune: error: {option} ")
    assert ACCEPTED[option].describe() in completed.stderr
    assert not (tmp_path / "chat.jsonl").exists()


@pytest.mark.parametrize("option", sorted(ACCEPTED))
def test_the_ends_of_each_range_are_accepted(option):
    accepted = ACCEPTED[option]
    inside = [accepted.low + (0.5 if accepted.low_open else 0)]
    if accepted.high is not None:
        inside.append(accepted.high - (0.5 if accepted.high_open else 0))
    for value in inside:
        within(option, value)


def test_the_issues_values_are_each_refused_in_one_line(tmp_path):
    """issue 38, section 7: each of these was accepted (or a traceback)."""
    for args, phrase in [
        (
            ["search", "--model", "llama-tiny", "--trial-timeout", "inf"],
            "--trial-timeout inf: give a number of seconds",
        ),
        (["devices", "--calibrate", "--seconds", "inf"], "--seconds inf: give a number of seconds above 0"),
        (["chat-corpus", "--out", "c.jsonl", "--samples", "2", "--length-scale", "inf"], "--length-scale inf"),
        (["chat-corpus", "--out", "c.jsonl", "--samples", "2", "--length-scale", "1e300"], "--length-scale 1e+300"),
        (
            ["chat-corpus", "--out", "c.jsonl", "--samples", "2", "--seed", "-1"],
            "--seed -1: give a whole number, 0 or more",
        ),
        (["search", "--model", "llama-tiny", "--max-measure-steps", "-1"], "--max-measure-steps -1"),
        (["search", "--model", "llama-tiny", "--confirm-top", "-1"], "--confirm-top -1"),
        (["search", "--model", "llama-tiny", "--confirm-repeats", "0", "--confirm-top", "2"], "--confirm-repeats 0"),
    ]:
        assert_one_error_line(run_cli_in_process(*args, cwd=tmp_path), phrase)
    assert not (tmp_path / "c.jsonl").exists()


def test_a_matrix_larger_than_the_device_is_one_line_before_anything_is_measured(tmp_path):
    completed = run_cli_in_process(
        "devices", "--calibrate", "--device", "cpu", "--matrix-size", "1000000", cwd=tmp_path
    )
    assert_one_error_line(completed, "--matrix-size 1000000: three 1000000 x 1000000 fp32 matrices take")
    assert "calibrating" not in completed.stdout


@pytest.mark.parametrize("work_dir", ["/dev/null", "/proc/1", "a-file/runs"])
def test_a_work_dir_autotune_cannot_write_in_is_one_line_before_any_trial(tmp_path, work_dir):
    (tmp_path / "a-file").write_text("not a directory")
    completed = run_cli_in_process(
        "search", "--model", "llama-tiny", "--work-dir", work_dir, "--storage", "sqlite:///w.db", cwd=tmp_path
    )
    expected = {
        "/dev/null": "--work-dir /dev/null: it is a character device, not a directory",
        "/proc/1": "--work-dir /proc/1: cannot write in /proc/1",
        "a-file/runs": f"--work-dir {Path(tmp_path, 'a-file')}: it is a file, not a directory",
    }
    assert_one_error_line(completed, expected[work_dir])
    assert not (tmp_path / "w.db").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]  # nothing made, nothing left behind


def test_more_cpu_ranks_than_cores_is_one_line_before_any_trial(tmp_path):
    from autotune.spec.devices import usable_cores

    ranks = str(usable_cores() + 1)
    completed = run_cli_in_process("estimate", "--model", "llama-tiny", "--devices-per-trial", ranks, cwd=tmp_path)
    assert_one_error_line(completed, f"--devices-per-trial {ranks}: a CPU trial's ranks share this machine's")
