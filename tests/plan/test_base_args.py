"""--base-args: TrainingArguments the user fixes are checked, fix the knobs they touch, reach every
trial's real Trainer, and are kept in the export."""

from __future__ import annotations

import json

import pytest

from autotune.errors import AutotuneError
from autotune.levers import TrialConfig, training_arguments_kwargs
from autotune.plan._base_args import load_base_args
from autotune.space import load_space

BASE = {"learning_rate": 3e-4, "warmup_steps": 7, "weight_decay": 0.01, "lr_scheduler_type": "cosine"}


def write_json(tmp_path, value, name: str = "base.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)
    return str(path)


def write_space(tmp_path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


def test_valid_base_args_are_returned_as_given(tmp_path):
    assert load_base_args(write_json(tmp_path, BASE)) == BASE


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"learning_rte": 1e-4}, "learning_rte is not a TrainingArguments field (did you mean learning_rate?)"),
        ({"frobnicate": 1}, "frobnicate is not a TrainingArguments field"),
        (
            {"attn_implementation": "sdpa"},
            "attn_implementation is not a TrainingArguments field (it is a model argument",
        ),
        ([1, 2], "expected a JSON object of TrainingArguments fields"),
        ("{not json", "not valid JSON"),
        ({"output_dir": "out"}, "remove output_dir: the export leaves it to you"),
        ({"use_cpu": True}, "remove use_cpu: autotune sets it from --device / --gpu"),
        ({"auto_find_batch_size": True}, "remove auto_find_batch_size"),
        ({"lr_scheduler_type": "sideways"}, "TrainingArguments rejects them: sideways is not a valid SchedulerType"),
    ],
)
def test_bad_base_args_get_one_line_naming_the_problem(tmp_path, content, message):
    with pytest.raises(AutotuneError) as error:
        load_base_args(write_json(tmp_path, content))
    assert message in str(error.value)
    assert str(error.value).startswith("--base-args ")
    assert "\n" not in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(AutotuneError, match="cannot read it"):
        load_base_args(str(tmp_path / "absent.json"))


def test_a_base_arg_that_sets_a_knob_fixes_it_with_a_note(tmp_path, cpu):
    path = write_space(tmp_path, "micro_batch: [8, 16]\ndtype: [fp32, bf16]\noptim: [adamw_torch, adafactor]\n")
    base = {**BASE, "bf16": True, "per_device_train_batch_size": 32, "optim": "sgd"}
    space = load_space(path, cpu, base_args=base)
    assert space.choices["dtype"] == ["bf16"]
    assert space.choices["micro_batch"] == [32]  # the user's value, even one the space does not list
    assert space.choices["optim"] == ["sgd"]
    assert "dtype fixed at 'bf16' by --base-args bf16; no longer searched" in space.notes
    assert "micro_batch fixed at 32 by --base-args per_device_train_batch_size; no longer searched" in space.notes
    assert space.size == 1


def test_what_the_user_fixed_wins_over_the_device_preference(tmp_path, cpu):
    space = load_space(
        write_space(tmp_path, "pin_memory: [true, false]\n"), cpu, base_args={"dataloader_pin_memory": True}
    )
    assert space.choices["pin_memory"] == [True]


def test_a_fixed_value_the_device_cannot_run_stops_the_search(tmp_path, cpu):
    with pytest.raises(AutotuneError, match="--base-args fp16 asks for dtype 'fp16', which cpu cannot run"):
        load_space(write_space(tmp_path, "dtype: [fp32]\n"), cpu, base_args={"fp16": True})


@pytest.mark.parametrize(
    "base",
    [
        {"bf16": True, "tf32": True},
        {"bf16": False},
        {"torch_compile_mode": "max-autotune-no-cudagraphs"},  # a CUDA-graph mode is refused on the CPU
        {"torch_compile": True, "torch_compile_backend": "aot_eager"},
        {"torch_compile": False},
        {"gradient_checkpointing": True},
        {"activation_checkpointing": False},
        {"dataloader_num_workers": 3, "dataloader_pin_memory": False},
        {"gradient_accumulation_steps": 4, "per_device_train_batch_size": 2, "optim": "adafactor"},
    ],
)
def test_every_config_of_the_fixed_space_writes_the_users_values(tmp_path, cpu, base):
    """The mapping stays the one mapping: for the knob value the base args fix, it writes them back."""
    space = load_space(
        write_space(tmp_path, "checkpointing: [false, true]\ncompile: ['off', inductor]\n"), cpu, base_args=base
    )
    config = TrialConfig.from_params(space.fixed())
    kwargs = training_arguments_kwargs(config, "cpu", base)
    assert {k: kwargs[k] for k in base} == base


@pytest.mark.slow
def test_base_args_reach_the_real_trainer_and_the_export(tmp_path, cpu, tiny_workload, sqlite_url):
    from autotune.storage import open_storage
    from autotune.study import SearchBudget, SearchRequest, open_study
    from autotune.study._loop import run_search
    from autotune.views.export import winner_arguments
    from tests.support.probes import TRAINING_ARGUMENTS_FILE

    base = {**BASE, "per_device_train_batch_size": 8}
    space = load_space(
        write_space(tmp_path, "micro_batch: [8, 16]\ngrad_accum: [1, 2]\n"), cpu, base_args=base, global_batch=16
    )
    request = SearchRequest(
        workload=tiny_workload(
            ceiling_bytes=cpu.total_memory_bytes // 2,
            base_args=base,
            callbacks=("tests.support.probes:RecordTrainingArguments",),
        ),
        space=space,
        work_root=str(tmp_path / "runs"),
    )
    study = open_study(open_storage(sqlite_url), "base", request)
    run_search(study, request, SearchBudget(trials=1))

    [recorded_file] = (tmp_path / "runs").glob(f"*/{TRAINING_ARGUMENTS_FILE}")
    recorded = json.loads(recorded_file.read_text())
    assert recorded == {**BASE, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}
    exported = winner_arguments(study)
    assert {k: exported[k] for k in base} == base
    assert exported["per_device_train_batch_size"] * exported["gradient_accumulation_steps"] == 16
