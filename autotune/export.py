"""Export the winner's TrainingArguments: exactly the arguments its trial trained with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from autotune.config import training_arguments_kwargs
from autotune.errors import AutotuneError
from autotune.ranking import RankedTrial, feasible_ranking


def winner(study: optuna.Study) -> RankedTrial:
    ranking = feasible_ranking(study.get_trials(deepcopy=False))
    if not ranking:
        raise AutotuneError(
            f"study {study.study_name!r} has no feasible trial to export (every trial failed, ran out of memory "
            "or went over the ceiling): run more trials, or raise --memory-ceiling"
        )
    return ranking[0]


def winner_arguments(study: optuna.Study) -> dict[str, Any]:
    """The TrainingArguments keyword arguments of the study's best feasible trial."""
    best = winner(study)
    device_kind = study.user_attrs.get("device_kind", "cpu")
    return training_arguments_kwargs(best.config, device_kind, study.user_attrs.get("base_args") or {})


def write_json(arguments: dict[str, Any], out: str) -> None:
    """JSON that both ``TrainingArguments(output_dir=..., **json.load(f))`` and
    ``HfArgumentParser(TrainingArguments).parse_json_file(f)`` accept (the parser needs an output_dir
    only when none is given, so one is not written: the user chooses where to save)."""
    Path(out).write_text(json.dumps(arguments, indent=2, sort_keys=True) + "\n")
