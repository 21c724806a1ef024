"""Hostile text in a study (its name, the model and dataset paths, ``--base-args`` values, a trial's error)
never runs as code and never reaches a terminal raw: every exported form writes it through its one quoting
or commenting function (views/text.py), every printer through ``printable`` (issue 38 §3).

The exports are run as their tools would run them: the ``trl sft`` script by bash under a ``PATH`` whose
``trl`` is a harmless stand-in that records its arguments, the flags after a stand-in program, the Python
snippet by ``exec``, the YAML forms by ``yaml.safe_load``; a payload that ran would create a file.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from autotune.views.text import comment_lines, printable
from tests.support.cli import run_cli_in_process

pytest.importorskip("trl")

# Each breaks out of a comment or a quote in its own way: a newline ends a `#` comment, `$( )` and
# backticks run inside double quotes, a quote ends a quoted value; each payload would create PWNED.
PAYLOADS = ("\ntouch PWNED\n", "$(touch PWNED)", "`touch PWNED`", "'; touch PWNED; '", '"; touch PWNED; "')
HOSTILE = "".join(PAYLOADS)
# A study name with the escape sequences that retitle the terminal (OSC 0), clear it, and colour it.
ESCAPES = "study\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202e"


def hostile_sft_study(storage: str, name: str = "x" + HOSTILE):
    """An SFT study of one feasible trial whose name, model path, dataset and --base-args values are hostile."""
    import optuna

    from autotune.result import Status, TrialResult
    from autotune.storage import schema
    from tests.support.recorded_study import add_recorded_trial

    base_args = {"run_name": HOSTILE, "eos_token": HOSTILE}
    study = optuna.create_study(storage=storage, direction="maximize", study_name=name)
    study.set_user_attr(schema.STUDY_DEVICE_KIND, "cpu")
    study.set_user_attr(schema.STUDY_BASE_ARGS, base_args)
    identity = {
        "model": "./models/m" + HOSTILE,
        "task": "causal-lm",
        "seq_len": 64,
        "dataset": "./data/d" + HOSTILE + ".jsonl",
        "base_args": base_args,
        "peft": None,
        "trainer": "sft",
        "loss_on": "all",
    }
    study.set_user_attr(schema.STUDY_IDENTITY, identity)
    result = TrialResult(status=Status.OK, samples_per_s=10.0, model_tflops=1.0, peak_memory_bytes=2**30, error=ESCAPES)
    add_recorded_trial(study, {"micro_batch": 4}, result)
    return study


def recording_program(directory: Path, name: str) -> Path:
    """A harmless ``name`` on PATH that writes its arguments, NUL-separated, to ``<name>.argv``."""
    directory.mkdir(exist_ok=True)
    program = directory / name
    program.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {name}.argv\n")
    program.chmod(0o755)
    return directory


def run_bash(script: Path, cwd: Path, path_dir: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)  # it parses
    subprocess.run(
        ["bash", str(script)], cwd=cwd, check=True, env={**os.environ, "PATH": f"{path_dir}:{os.environ['PATH']}"}
    )


def argv(cwd: Path, name: str) -> list[str]:
    return (cwd / f"{name}.argv").read_text().split("\0")[:-1]


@pytest.mark.slow  # runs bash
def test_every_exported_form_keeps_hostile_values_as_data(tmp_path):
    from autotune.storage import load_study
    from autotune.views.export import winner_arguments

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    hostile_sft_study(storage)
    run = tmp_path / "run"
    run.mkdir()
    fakes = recording_program(tmp_path / "bin", "trl")
    recording_program(fakes, "train")
    outs = {}
    for fmt in ("trl", "cli", "python", "accelerate", "axolotl", "llama-factory", "json"):
        outs[fmt] = tmp_path / f"export.{fmt}"
        shown = run_cli_in_process("export", "--format", fmt, "--storage", storage, "--out", str(outs[fmt]), cwd=run)
        assert shown.returncode == 0, shown.stderr

    run_bash(outs["trl"], run, fakes)  # the `trl sft` script, as a user runs it
    trl_argv = argv(run, "trl")
    assert trl_argv[trl_argv.index("--model_name_or_path") + 1] == "./models/m" + HOSTILE
    assert trl_argv[trl_argv.index("--run_name") + 1] == HOSTILE
    assert trl_argv[trl_argv.index("--eos_token") + 1] == HOSTILE

    flags_script = tmp_path / "flags.sh"
    flags_script.write_text("train " + outs["cli"].read_text())  # the flags after a training script
    run_bash(flags_script, run, fakes)
    flags = argv(run, "train")
    assert flags[flags.index("--run_name") + 1] == HOSTILE

    namespace: dict = {}
    exec(compile(outs["python"].read_text(), str(outs["python"]), "exec"), namespace)
    assert namespace["training_args"].run_name == HOSTILE

    expected = winner_arguments(load_study(storage, None))
    for fmt in ("accelerate", "axolotl", "llama-factory"):
        # The comment header, then YAML exactly as yaml.safe_dump writes it: no comment line spilled into it.
        lines = outs[fmt].read_text().splitlines(keepends=True)
        header = [line for line in lines if line.startswith("#")]
        body = "".join(lines[len(header) :])
        assert lines[: len(header)] == header and "PWNED" in "".join(header)
        assert body == yaml.safe_dump(yaml.safe_load(body), sort_keys=False)
    assert yaml.safe_load(outs["llama-factory"].read_text())["run_name"] == HOSTILE
    assert json.loads(outs["json"].read_text()) == expected
    assert not (run / "PWNED").exists() and not (tmp_path / "PWNED").exists()


def test_the_report_escapes_a_hostile_study_name(tmp_path):
    pytest.importorskip("plotly")
    from autotune.views.report import report_html

    study = hostile_sft_study(f"sqlite:///{tmp_path / 'study.db'}", name="</script><script>alert(1)</script>")
    page = report_html(study)
    assert "<script>alert(1)" not in page


def test_best_and_errors_show_escape_sequences_escaped(tmp_path):
    """A shared study's name and a trial's error reach another user's terminal as text: `best`, `best --all`,
    `report`'s line, and an error line that lists the studies."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    hostile_sft_study(storage, name=ESCAPES)
    shown = {
        "best": run_cli_in_process("best", "--storage", storage, cwd=tmp_path),
        "best --all": run_cli_in_process("best", "--all", "--storage", storage, cwd=tmp_path),
        "report": run_cli_in_process("report", "--storage", storage, "--out", "r.html", cwd=tmp_path),
        "error": run_cli_in_process("best", "--storage", storage, "--study-name", "absent", cwd=tmp_path),
    }
    for command, completed in shown.items():
        text = completed.stdout + completed.stderr
        assert "\x1b" not in text and "\u202e" not in text, command
        assert "\\x1b]0;owned\\x07" in text, (command, text[-2000:])
    assert shown["error"].returncode == 2


def test_comment_lines_split_at_every_line_break_and_escape_controls():
    lines = comment_lines(["a\nb\rc\x0bd\x85e\u2028f\u2029g", "\x1b[2J"])
    assert lines == ["# a", "# b", "# c", "# d", "# e", "# f", "# g", "# \\x1b[2J"]
    assert printable("plain text, ünïcode") == "plain text, ünïcode"
