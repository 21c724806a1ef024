"""A study's trial as the search records it, made in memory: its config's values, its result, feasible."""

from __future__ import annotations

from typing import Any

import optuna


def add_recorded_trial(study: optuna.Study, params: dict[str, Any], result: Any, value: float = 1.0) -> None:
    """Add a finished, feasible trial of ``params`` (each value the one choice of its distribution, unless the
    value is a pair ``(value, choices)``) whose record is ``result`` (a :class:`autotune.result.TrialResult`)."""
    from optuna.distributions import CategoricalDistribution

    from autotune.storage import schema

    values = {name: v[0] if isinstance(v, tuple) else v for name, v in params.items()}
    choices = {name: list(v[1]) if isinstance(v, tuple) else [v] for name, v in params.items()}
    study.add_trial(
        optuna.trial.create_trial(
            params=values,
            distributions={name: CategoricalDistribution(choices[name]) for name in params},
            value=value,
            user_attrs={schema.TRIAL_RESULT: result.to_dict()},
            system_attrs={"constraints": [-1.0]},
        )
    )
