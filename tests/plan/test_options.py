"""The ``search`` command's option defaults are written once (autotune/plan/_options.py): the
command line declares them from there, and the request and budget read them from there too."""

from __future__ import annotations

import dataclasses

import typer

from autotune.cli import app
from autotune.plan import SearchOptions
from autotune.study import SearchBudget, SearchRequest


def search_parameters() -> dict:
    command = typer.main.get_command(app).commands["search"]  # type: ignore[attr-defined]  # Typer's app is a click Group
    return {param.name: param for param in command.params}


def test_the_command_declares_every_search_option_with_its_one_default():
    parameters = search_parameters()
    for field in dataclasses.fields(SearchOptions):
        assert field.name in parameters, f"--{field.name} is not an option of autotune search"
        if field.name == "callbacks":
            assert parameters["callbacks"].opts == ["--callback"] and parameters["callbacks"].default is None
        elif field.name != "model":
            assert parameters[field.name].default == field.default, field.name
    # The only parameters that are not search options: where the study lives.
    assert set(parameters) - {f.name for f in dataclasses.fields(SearchOptions)} == {"storage", "study_name"}


def test_the_command_values_become_the_options_in_one_construction():
    values = {field.name: field.default for field in dataclasses.fields(SearchOptions)}
    values.update(model="bert-tiny", callbacks=["a:B", "c:D"], storage="sqlite:///x.db", study_name=None, trials=7)
    options = SearchOptions.from_command(values)
    assert options == SearchOptions(model="bert-tiny", callbacks=("a:B", "c:D"), trials=7)


def test_the_request_and_the_budget_take_their_defaults_from_the_options():
    request_defaults = {field.name: field.default for field in dataclasses.fields(SearchRequest)}
    assert request_defaults["trial_timeout_s"] == SearchOptions.trial_timeout == 900.0
    assert request_defaults["work_root"] == SearchOptions.work_dir == "autotune_runs"
    assert request_defaults["prune_ratio"] == SearchOptions.prune_ratio == 0.5
    assert request_defaults["screen"] is SearchOptions.screen is True
    budget = SearchBudget()
    assert (
        (budget.confirm_top, budget.confirm_repeats, budget.confirm_budget)
        == (SearchOptions.confirm_top, SearchOptions.confirm_repeats, SearchOptions.confirm_budget)
        == (3, 3, 0.25)
    )


def test_the_space_options_help_names_the_default_space_of_each_task():
    """``search --help`` says which space a search reads without ``--space``: the task's (DEFAULT_SPACES),
    else the fallback; not default.yaml for a causal LM, which gets llm.yaml."""
    import typing

    from autotune.plan import cli_options
    from autotune.space import DEFAULT_SPACES, FALLBACK_SPACE

    help_text = typing.get_args(cli_options.Space)[1].help
    for task, name in DEFAULT_SPACES.items():
        assert f"search_spaces/{name} for a {task} model" in help_text, help_text
    assert f"search_spaces/{FALLBACK_SPACE} for any other task" in help_text, help_text
