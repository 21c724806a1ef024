"""What no trial does, whatever the user's arguments ask (docs/side-effects.md): the overrides every trial
trains with, the one note, and a trial's DeepSpeed config reporting nowhere."""

from __future__ import annotations

import json

# The families of TrainingArguments fields whose effect can reach outside a trial: the Hub, reporting,
# logging, checkpoints, the best-model reload, evaluation, resuming, where things are written.
SIDE_EFFECT_FAMILIES = (
    "push_to_hub",
    "hub_",
    "report_to",
    "run_name",
    "project",
    "trackio_",
    "logging_",
    "save_",
    "enable_jit_checkpoint",
    "load_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
    "eval_",
    "do_",
    "resume_from_checkpoint",
    "ignore_data_skip",
    "restore_callback_states_from_checkpoint",
    "output_dir",
)


def write_json(tmp_path, value, name: str) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(value))
    return str(path)


def test_every_field_with_an_effect_outside_a_trial_has_its_row():
    """docs/side-effects.md against the installed TrainingArguments: every field of those families has a
    row, every row names a real field (or the environment), and each field a trial overrides says how."""
    import dataclasses
    import re

    from transformers import TrainingArguments

    from autotune.runner._side_effects import TRIAL_OVERRIDES
    from tests.support.cli import REPO

    fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    rows = {}
    for line in (REPO / "docs" / "side-effects.md").read_text().splitlines():
        found = re.match(r"\| `([A-Za-z_]+)`[^|]*\| [^|]+ \| ([^|]+) \|", line)
        if found:
            rows[found.group(1)] = found.group(2)
    family = {name for name in fields if name.startswith(SIDE_EFFECT_FAMILIES)}
    assert family - rows.keys() == set()  # a field of a side-effect family without its row
    assert {
        name for name in rows if not name.isupper()
    } - fields == set()  # a row for a field transformers no longer has
    for name, override in TRIAL_OVERRIDES.items():
        assert json.dumps(override.value).replace("null", "None").replace("false", "False") in rows[name], name


def test_the_note_names_each_field_a_trial_sets_aside_and_only_those():
    from autotune.runner._side_effects import trial_overrides_note

    assert (
        trial_overrides_note({"learning_rate": 1e-4, "report_to": "none", "push_to_hub": False}) is None
    )  # what trials do anyway
    note = trial_overrides_note(
        {"push_to_hub": True, "report_to": ["wandb"], "deepspeed": {"wandb": {"enabled": True}}}
    )
    assert note == (
        "--base-args push_to_hub, report_to, deepspeed wandb: not applied inside trials, which never upload, report to a service, "
        "save checkpoints, resume or evaluate (docs/side-effects.md); kept in the export for your run"
    )


def test_a_trials_deepspeed_config_reports_nowhere(tmp_path):
    """The user's DeepSpeed file keeps its monitors for their run; a trial gets a copy with each one off."""
    from autotune.runner._side_effects import trial_overrides

    config = {"train_batch_size": "auto", "wandb": {"enabled": True, "project": "p"}, "csv_monitor": {"enabled": False}}
    overrides = trial_overrides({"deepspeed": write_json(tmp_path, config, "ds.json")})
    assert overrides["deepspeed"] == {**config, "wandb": {"enabled": False, "project": "p"}}
    assert overrides["push_to_hub"] is False and overrides["report_to"] == "none"
    assert "deepspeed" not in trial_overrides({"deepspeed": {"train_batch_size": "auto"}})  # nothing to switch off
