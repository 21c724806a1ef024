"""What no trial does, whatever the user's arguments ask: upload, report to a service, save checkpoints,
resume or evaluate (docs/side-effects.md). The child trains with :func:`trial_overrides` on top of the user's
arguments and the levers'; the export keeps the user's values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.levers import read_deepspeed_config


@dataclasses.dataclass(frozen=True)
class TrialOverride:
    """A ``TrainingArguments`` field whose effect reaches outside a trial's process and work dir.

    Attributes:
        value: What every trial trains with instead of the user's value (the export keeps theirs).
        effect: What the user's value would do in every trial.
    """

    value: Any
    effect: str


# The fields that act outside a trial's process and work dir (read from transformers 5.24's
# trainer.py: ``__init__`` creates the Hub repository under ``push_to_hub`` (``init_hf_repo``) and
# adds the reporting callbacks of ``report_to`` and the SIGTERM checkpointer of
# ``enable_jit_checkpoint``; ``train`` evaluates under ``eval_on_start`` and ``eval_strategy``; the
# integrations read ``do_eval`` and ``resume_from_checkpoint``). Every other Hub, reporting, saving
# and evaluation field acts only through one of these (docs/side-effects.md lists them all).
# Every trial trains with these values (runner._trial.harness_arguments); the export keeps the user's.
TRIAL_OVERRIDES: dict[str, TrialOverride] = {
    "push_to_hub": TrialOverride(False, "creates a Hub repository and uploads the model"),
    "report_to": TrialOverride("none", "reports to a tracking service (wandb, mlflow, trackio, ...)"),
    "save_strategy": TrialOverride("no", "writes checkpoints"),
    "enable_jit_checkpoint": TrialOverride(False, "writes a checkpoint on SIGTERM, which ends a timed-out trial"),
    "load_best_model_at_end": TrialOverride(False, "reloads the best checkpoint"),
    "eval_strategy": TrialOverride("no", "evaluates (a trial has no evaluation data)"),
    "eval_on_start": TrialOverride(False, "evaluates before training"),
    "do_eval": TrialOverride(False, "tells the reporting integrations to evaluate"),
    "resume_from_checkpoint": TrialOverride(None, "resumes from a checkpoint"),
}
# The one integration that reports without being named in ``report_to``: inside a Kubeflow TrainJob
# TrainingArguments adds "kubeflow" to any ``report_to``, "none" included, and every trial would
# report its progress to the job's controller as the user's run's (transformers/training_args.py,
# ``__post_init__``; integrations/integration_utils.py, ``is_kubeflow_available``). Set in every
# trial child's environment (runner._limits.child_environment).
# TRL's trainers send a usage ping to the Hub when built (trl/trainer/base_trainer.py,
# ``_send_telemetry``) unless huggingface_hub's telemetry is off, which it reads from
# ``HF_HUB_DISABLE_TELEMETRY`` once, when it is imported (huggingface_hub/constants.py:244): so it is
# also in the forkserver's environment before its preload imports transformers (runner._pool).
TRIAL_ENVIRONMENT = {"DISABLE_KUBEFLOW_INTEGRATION": "TRUE", "HF_HUB_DISABLE_TELEMETRY": "1"}
# The DeepSpeed config's own reporting (deepspeed/monitor/config.py: each writes files or reports to
# a service from every rank that trains): switched off in a trial's copy of the config.
DEEPSPEED_MONITORS = ("tensorboard", "wandb", "csv_monitor", "comet")


def _enabled_monitors(deepspeed: Any) -> list[str]:
    config = read_deepspeed_config(deepspeed)
    return [name for name in DEEPSPEED_MONITORS if isinstance(config.get(name), dict) and config[name].get("enabled")]


def trial_overrides(arguments: dict[str, Any]) -> dict[str, Any]:
    """What every trial trains with instead of ``arguments`` (the user's and the knobs'), so that it
    has no effect outside its process and work dir: :data:`TRIAL_OVERRIDES`, and a DeepSpeed config
    with its monitors off."""
    overrides = {field: override.value for field, override in TRIAL_OVERRIDES.items()}
    if arguments.get("deepspeed") and (monitors := _enabled_monitors(arguments["deepspeed"])):
        config = read_deepspeed_config(arguments["deepspeed"])
        overrides["deepspeed"] = {**config, **{name: {**config[name], "enabled": False} for name in monitors}}
    return overrides


def trial_overrides_note(base_args: dict[str, Any]) -> str | None:
    """The one note that says which of the user's fields no trial applies (``None``: none)."""
    overridden = [
        field
        for field, override in TRIAL_OVERRIDES.items()
        if field in base_args and base_args[field] != override.value
    ]
    if base_args.get("deepspeed"):
        overridden += [f"deepspeed {name}" for name in _enabled_monitors(base_args["deepspeed"])]
    if not overridden:
        return None
    return (
        f"--base-args {', '.join(overridden)}: not applied inside trials, which never upload, report to a service, save "
        f"checkpoints, resume or evaluate (docs/side-effects.md); kept in the export for your run"
    )
