"""--base-args: TrainingArguments the user fixes are checked, fix the knobs they touch, reach every
trial's real Trainer, and are kept in the export."""

from __future__ import annotations

import json

import pytest

from autotune.errors import AutotuneError
from autotune.levers import TrialConfig, training_arguments_kwargs
from autotune.plan._base_args import load_base_args
from autotune.space import load_space

NAN = float("nan")
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


def test_base_args_given_inline_read_as_a_files_and_are_checked_alike(tmp_path, monkeypatch):
    """``--base-args '{"learning_rate": 1e-4}'`` is JSON, not a path: read as a file's JSON would be, with the same
    one-line checks; a file of that very name still wins."""
    assert load_base_args('{"learning_rate": 1e-4, "max_steps": 50}') == {"learning_rate": 1e-4, "max_steps": 50}
    with pytest.raises(AutotuneError) as misspelled:
        load_base_args('{"learrning_rate": 1e-4}')
    assert "learrning_rate is not a TrainingArguments field (did you mean learning_rate?)" in str(misspelled.value)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "{odd}").write_text('{"max_steps": 7}')
    assert load_base_args("{odd}") == {"max_steps": 7}


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
        # Numbers JSON as Python reads it turns into NaN or infinity (issue 31): nothing trains on them.
        ('{"learning_rate": NaN}', "learning_rate nan: not a finite number"),
        ('{"learning_rate": Infinity}', "learning_rate inf: not a finite number"),
        ('{"learning_rate": 1e400}', "learning_rate inf: not a finite number"),
        ('{"max_grad_norm": -Infinity}', "max_grad_norm -inf: not a finite number"),
        ('{"lr_scheduler_kwargs": {"min_lr": NaN}}', "lr_scheduler_kwargs.min_lr nan: not a finite number"),
        ('{"weight_decay": ' + "9" * 400 + "}", "weight_decay 999"),  # an integer no float holds
        # Credentials are never stored (issue 30): the line names the variable to use instead.
        (
            {"hub_token": "hf_abc"},
            "remove hub_token: a credential is never stored in the study or the export; set the HF_TOKEN environment variable",
        ),
        # A backend neither accelerate nor torch.compile knows fails in the Trainer of every trial.
        (
            {"torch_compile_backend": "os.system"},
            "torch_compile_backend 'os.system' is not a torch.compile backend here: give one of aot_eager, ",
        ),
        (
            {"torch_compile": True, "torch_compile_backend": "nvprims_nvfuser"},
            "torch_compile_backend 'nvprims_nvfuser'",
        ),  # accelerate's, not torch's
        ({"deepspeed": "/nonexistent/ds.json"}, "--base-args deepspeed /nonexistent/ds.json: cannot read it"),
        ({"deepspeed": ["stage", 3]}, "deepspeed ['stage', 3]: Input should be a valid"),
    ],
)
def test_bad_base_args_get_one_line_naming_the_problem(tmp_path, content, message):
    with pytest.raises(AutotuneError) as error:
        load_base_args(write_json(tmp_path, content))
    assert message in str(error.value)
    assert str(error.value).startswith("--base-args ")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("deepspeed", "message"),
    [
        ("[1, 2]", "--base-args deepspeed: expected a DeepSpeed config (a JSON object or a file's path)"),
        ("{not json", "not valid JSON"),
        (
            {"zero_optimization": {"stage": NAN}, "train_batch_size": "auto"},
            "deepspeed.zero_optimization.stage nan: not a finite number",
        ),
        # issue 31's probe: "fixes zero at 3", and each trial ended in DeepSpeed's AssertionError (measured here: 298 s)
        (
            {"zero_optimization": {"stage": 3}},
            "deepspeed gives neither train_micro_batch_size_per_gpu nor train_batch_size",
        ),
        (
            {"zero_optimization": {"stage": 7}, "train_batch_size": "auto"},
            "DeepSpeed rejects the deepspeed config: stage: Input should be 0, 1, 2, 3",
        ),
        (
            {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": "lots"}, "train_batch_size": "auto"},
            "stage3_max_live_parameters: Input should be a valid integer",
        ),
        (
            {"zero_optimization": {"stage": 3}, "train_batch_size": 7},
            "deepspeed train_batch_size is 7, but autotune searches the batch",
        ),
        (
            {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "train_batch_size": "auto"},
            "deepspeed bf16.enabled is True, but autotune searches dtype",
        ),
        (
            {"zero_optimization": {"stage": 2}, "gradient_clipping": 0.5, "train_batch_size": "auto"},
            "deepspeed contradicts the arguments (ds gradient_clipping=0.5 vs hf max_grad_norm=1.0)",
        ),
    ],
)
def test_a_deepspeed_config_every_trial_would_fail_on_is_refused_before_the_first(tmp_path, deepspeed, message):
    """Unreadable, not JSON, not DeepSpeed's (its own pydantic models and assertions), or contradicting what
    the search varies (issue 31: such a config was accepted and failed every trial, after 164 s each)."""
    pytest.importorskip("deepspeed")
    config = write_json(tmp_path, deepspeed, "ds.json")
    with pytest.raises(AutotuneError) as error:
        load_base_args(write_json(tmp_path, {"deepspeed": config}))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "base",
    [
        {
            "deepspeed": {
                "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
                "train_batch_size": "auto",
                "gradient_clipping": "auto",
            }
        },
        {
            "deepspeed": {
                "zero_optimization": {"stage": 3},
                "bf16": {"enabled": True},
                "train_micro_batch_size_per_gpu": "auto",
            },
            "bf16": True,
        },
        {
            "deepspeed": {
                "zero_optimization": {"stage": 2},
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 2,
                "train_batch_size": 8,
            },
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,
        },
        {"torch_compile_backend": "aot_eager"},
        {"learning_rate": 1e-300, "max_grad_norm": 1e300},
    ],
)
def test_values_a_trial_can_train_with_pass_the_check(tmp_path, base):
    if "deepspeed" in base:
        pytest.importorskip("deepspeed")
    assert load_base_args(write_json(tmp_path, base)) == base


def test_every_credential_field_of_the_installed_training_arguments_is_refused(tmp_path):
    """Read from the installed TrainingArguments: a field that holds a credential (by its name, as
    transformers hides it, or by its help text) is refused, naming the environment variable instead."""
    import dataclasses
    import re

    from transformers import TrainingArguments

    credential = re.compile(r"\btoken to use\b|password|secret|credential|api[ _]key", re.IGNORECASE)
    found = [
        f.name
        for f in dataclasses.fields(TrainingArguments)
        if f.init and (f.name.endswith("_token") or credential.search(str(f.metadata.get("help", ""))))
    ]
    assert "hub_token" in found
    for field in found:
        with pytest.raises(
            AutotuneError,
            match=f"remove {field}: a credential is never stored .* set the HF_TOKEN environment variable",
        ):
            load_base_args(write_json(tmp_path, {field: "hf_planted"}, f"{field}.json"))


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


@pytest.mark.slow
def test_no_trial_reaches_the_network_whatever_the_base_args_ask(tmp_path):
    """push_to_hub, report_to=wandb, checkpoints, evaluation, best-model reload: asked for in --base-args,
    neutralised in every trial (one note), kept in the export. A guard in every interpreter the search
    starts (tests/support/network_guard.py) records any connection that would leave the machine; the Hub
    is a non-loopback address, and offline mode is off, so a trial that pushed would try to reach it."""
    import os

    import optuna

    from autotune.spec.model_catalog import catalog_entry
    from tests.support.bad_input import TINY_SPACE
    from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli, run_cli_in_process
    from tests.support.network_guard import LOG_VARIABLE, attempts, sitecustomize_dir

    asked = {
        "push_to_hub": True,
        "hub_model_id": "someone/autotune-trial",
        "hub_strategy": "every_save",
        "report_to": "wandb",
        "run_name": "trial",
        "save_strategy": "steps",
        "save_steps": 2,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "load_best_model_at_end": True,
        "eval_on_start": True,
        "do_eval": True,
        "enable_jit_checkpoint": True,
        "resume_from_checkpoint": str(tmp_path / "checkpoint-9"),
    }
    log = tmp_path / "connections.log"
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    # A local model directory: resolving a name online looks in the Hub's cache first, and the Hub client
    # then asks the Hub for its agent registry (huggingface_hub/utils/_detect_agent.py), in the search's own
    # process. What this test is about is the trials.
    model = tmp_path / "bert-tiny"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({k: v for k, v in catalog_entry("bert-tiny").items() if not k.startswith("_autotune")})
    )
    environment = {
        "PYTHONPATH": os.pathsep.join([str(sitecustomize_dir(tmp_path)), str(REPO)]),
        LOG_VARIABLE: str(log),
        "HF_HUB_OFFLINE": "0",
        "HF_ENDPOINT": "http://192.0.2.1",  # TEST-NET-1 (RFC 5737): the Hub, as far as any client here knows
        "WANDB_MODE": "online",
    }
    completed = run_cli(
        "search",
        "--model",
        str(model),
        "--device",
        "cpu",
        "--space",
        TINY_SPACE,
        *FAST_SEARCH_ARGS,
        "--trials",
        "1",
        "--storage",
        storage,
        "--work-dir",
        str(tmp_path / "runs"),
        "--base-args",
        write_json(tmp_path, asked),
        cwd=tmp_path,
        env=environment,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert attempts(log) == []  # nothing tried to leave the machine: not the search, not a trial
    assert (
        "--base-args push_to_hub, report_to, save_strategy, enable_jit_checkpoint, load_best_model_at_end, eval_strategy, "
        "eval_on_start, do_eval, resume_from_checkpoint: not applied inside trials"
        in " ".join(completed.stdout.split())
    )
    [trial] = [t for t in optuna.load_study(study_name=None, storage=storage).trials if t.state.is_finished()]
    assert trial.user_attrs["status"] == "ok", trial.user_attrs  # and it trained: a feasible trial
    assert not list((tmp_path / "runs").glob("*/checkpoint-*"))  # no checkpoint written either
    exported = json.loads(run_cli_in_process("export", "--storage", storage, "--out", "-", cwd=tmp_path).stdout)
    assert {k: exported[k] for k in asked} == asked  # the user's run gets what it asked for


# --- under --trainer sft: the arguments are TRL's SFTConfig


def test_under_sft_base_args_are_sftconfig_fields_checked_by_sftconfig(tmp_path):
    pytest.importorskip("trl")
    fields = {"loss_type": "dft", "completion_only_loss": True, "learning_rate": 1e-4}
    assert load_base_args(write_json(tmp_path, fields), "sft") == fields
    with pytest.raises(
        AutotuneError,
        match="loss_type is not a TrainingArguments field \\(it is an SFTConfig field: train with --trainer sft\\)",
    ):
        load_base_args(write_json(tmp_path, {"loss_type": "dft"}))
    # SFTConfig builds with it; SFTTrainer would refuse it in every trial (sft_trainer.py:1042).
    with pytest.raises(AutotuneError, match="loss_type 'mse': give one of nll, dft, chunked_nll"):
        load_base_args(write_json(tmp_path, {"loss_type": "mse"}), "sft")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_length": 512}, "remove max_length: autotune sets it from --seq-len"),
        ({"model_init_kwargs": {"dtype": "bfloat16"}}, "remove model_init_kwargs: autotune builds the model itself"),
        (
            {"packing": True, "packing_strategy": "wrapped"},
            "packing wrapped is refused: TRL's wrapped packing cuts samples mid-way",
        ),
    ],
)
def test_under_sft_what_autotune_sets_or_refuses_is_one_line(tmp_path, fields, message):
    pytest.importorskip("trl")
    with pytest.raises(AutotuneError, match=message):
        load_base_args(write_json(tmp_path, fields), "sft")


def test_a_token_s_text_is_no_credential_under_sft(tmp_path):
    """SFTConfig's eos_token and pad_token hold a token's text (trl/trainer/sft_config.py): kept, while the
    credential field SFTConfig inherits (hub_token) is still refused; a credential is known by its field."""
    pytest.importorskip("trl")
    text = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert load_base_args(write_json(tmp_path, text), trainer="sft") == text
    with pytest.raises(AutotuneError, match="remove hub_token: a credential is never stored"):
        load_base_args(write_json(tmp_path, {**text, "hub_token": "hf_planted"}, "hub.json"), trainer="sft")
