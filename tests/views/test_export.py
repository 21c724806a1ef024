"""`autotune export --format json|cli|python|accelerate`: each read back by the library that consumes it."""

from __future__ import annotations

import ast
import json
import os
import shlex
from typing import TYPE_CHECKING

import pytest

from autotune.levers import TrialConfig, training_arguments_kwargs
from autotune.views.export import render
from tests.support.cli import run_cli_in_process

if TYPE_CHECKING:
    from transformers import TrainingArguments

# Arguments a user fixes with --base-args, of every value kind the formats must carry.
BASE_ARGS = {
    "learning_rate": 3e-5,
    "report_to": ["none"],
    "label_names": ["labels", "start_positions"],
    "lr_scheduler_kwargs": {"power": 2.0},
    "seed": 7,
}
CONFIGS = [
    (TrialConfig(), "cpu"),
    (
        TrialConfig(
            micro_batch=32,
            grad_accum=4,
            checkpointing=True,
            dtype="bf16",
            optim="adamw_torch_fused",
            dataloader_workers=2,
            pin_memory=False,
        ),
        "cpu",
    ),
    (TrialConfig(micro_batch=16, dtype="bf16", compile="inductor"), "cpu"),
    (TrialConfig(micro_batch=64, dtype="fp16", optim="adafactor", compile="aot_eager"), "cuda"),
    (TrialConfig(micro_batch=8, dtype="tf32", checkpointing=True), "cuda"),
    (TrialConfig(micro_batch=24, dtype="bf16", optim="adamw_bnb_8bit"), "cuda"),
]
IDS = [f"{config.short()}-{kind}" for config, kind in CONFIGS]


def constructible_here(kwargs: dict) -> bool:
    """TrainingArguments checks the hardware: tf32 needs an Ampere GPU, bf16 without use_cpu a bf16 GPU."""
    return not kwargs.get("tf32") and (kwargs.get("use_cpu") or not kwargs.get("bf16"))


def assert_parsed_as(parsed: object, kwargs: dict) -> None:
    """The parser's namespace holds every argument (before TrainingArguments normalises them)."""
    for name, value in kwargs.items():
        got = getattr(parsed, name)
        if isinstance(value, dict) and isinstance(got, str):
            got = json.loads(got)  # TrainingArguments takes its dict fields as JSON on a command line
        if isinstance(value, list) and isinstance(got, str):
            got = [got]  # a one-value field: report_to is str | list[str], and the parser takes a str
        assert got == value, (name, got, value)


def assert_same_training_arguments(args: TrainingArguments, kwargs: dict, output_dir: str) -> None:
    from transformers import TrainingArguments

    assert isinstance(args, TrainingArguments)
    assert args.to_dict() == TrainingArguments(output_dir=output_dir, **kwargs).to_dict()


@pytest.mark.parametrize(("config", "device_kind"), CONFIGS, ids=IDS)
def test_cli_flags_parse_back_to_the_same_arguments(config, device_kind, tmp_path):
    from transformers import HfArgumentParser, TrainingArguments

    kwargs = training_arguments_kwargs(config, device_kind, BASE_ARGS)
    tokens = shlex.split(render(kwargs, "cli"))
    parser = HfArgumentParser(TrainingArguments)
    assert_parsed_as(parser.parse_args(tokens), kwargs)  # what HF example scripts' parsers read
    if constructible_here(kwargs):
        (args,) = parser.parse_args_into_dataclasses(args=[*tokens, "--output_dir", str(tmp_path)])
        assert_same_training_arguments(args, kwargs, str(tmp_path))


def test_cli_flags_refuse_several_values_for_a_one_value_field():
    from autotune.errors import AutotuneError

    with pytest.raises(AutotuneError, match="report_to"):
        render({"report_to": ["wandb", "tensorboard"]}, "cli")


@pytest.mark.parametrize(("config", "device_kind"), CONFIGS, ids=IDS)
def test_python_snippet_builds_the_same_training_arguments(config, device_kind):
    kwargs = training_arguments_kwargs(config, device_kind, BASE_ARGS)
    snippet = render(kwargs, "python", "the winner of study 'x': trial #3\nsecond line")
    call = next(node for node in ast.walk(ast.parse(snippet)) if isinstance(node, ast.Call))
    assert {k.arg: ast.literal_eval(k.value) for k in call.keywords} == kwargs
    if constructible_here(kwargs):
        namespace: dict = {}
        exec(compile(snippet, "best_args.py", "exec"), namespace)
        assert_same_training_arguments(namespace["training_args"], kwargs, namespace["training_args"].output_dir)


@pytest.mark.parametrize(("config", "device_kind"), CONFIGS, ids=IDS)
def test_accelerate_config_loads_and_launches_with_the_same_precision_and_compile(config, device_kind, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import (
        _validate_launch_command,
        launch_command_parser,
    )
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    kwargs = training_arguments_kwargs(config, device_kind, BASE_ARGS)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(render(kwargs, "accelerate", "provenance"))
    loaded = load_config_from_file(str(path))
    expected_precision = {"bf16": "bf16", "fp16": "fp16"}.get(config.dtype, "no")
    assert loaded.mixed_precision == expected_precision
    assert loaded.use_cpu == (device_kind == "cpu")
    expected_backend = "NO" if config.compile == "off" else config.compile.upper()
    assert loaded.dynamo_config.get("dynamo_backend", "NO") == expected_backend
    # What `accelerate launch --config_file it train.py` hands the training process.
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    _validate_launch_command(args)
    _, env = prepare_simple_launcher_cmd_env(args)
    assert env["ACCELERATE_MIXED_PRECISION"] == expected_precision
    assert env["ACCELERATE_USE_CPU"] == str(device_kind == "cpu")
    assert env.get("ACCELERATE_DYNAMO_BACKEND", "NO") == expected_backend
    # What accelerate cannot carry is listed for the script, not silently dropped.
    header = path.read_text().split("compute_environment")[0]
    assert f"per_device_train_batch_size = {config.micro_batch}" in header and "optim = " in header


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "cli", "python", "accelerate"])
def test_export_command_writes_each_format_of_the_real_winner(fmt, searched_study, tmp_path):
    from transformers import HfArgumentParser, TrainingArguments

    from autotune.storage import load_study
    from autotune.views.export import DEFAULT_OUT, exported_as, winner_arguments

    out = tmp_path / DEFAULT_OUT[fmt]
    shown = run_cli_in_process(
        "export", "--format", fmt, "--storage", searched_study.storage, "--out", str(out), cwd=searched_study.workdir
    )
    assert shown.returncode == 0, shown.stderr
    assert f"wrote {out} ({fmt}: {exported_as(load_study(searched_study.storage, None), fmt)}): trial #" in shown.stdout
    kwargs = winner_arguments(load_study(searched_study.storage, None))
    text = out.read_text()
    if fmt == "json":
        assert (
            TrainingArguments(output_dir=str(tmp_path / "run"), **json.loads(text)).per_device_train_batch_size
            == kwargs["per_device_train_batch_size"]
        )
        assert json.loads(text) == kwargs
    elif fmt == "cli":
        (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
            args=[*shlex.split(text), "--output_dir", str(tmp_path / "run")]
        )
        assert_same_training_arguments(args, kwargs, str(tmp_path / "run"))
    elif fmt == "python":
        namespace: dict = {}
        exec(compile(text, str(out), "exec"), namespace)
        assert_same_training_arguments(namespace["training_args"], kwargs, namespace["training_args"].output_dir)
        assert f"study '{searched_study.study_name}'" in text
    else:
        from accelerate.commands.config.config_args import load_config_from_file

        loaded = load_config_from_file(str(out))  # accelerate_config.yaml: it picks its parser by the extension
        assert loaded.use_cpu is True
        assert loaded.mixed_precision == ("bf16" if kwargs.get("bf16") else "no")


@pytest.mark.slow
def test_export_to_standard_output_and_an_unknown_format(searched_study):
    shown = run_cli_in_process(
        "export", "--format", "cli", "--out", "-", "--storage", searched_study.storage, cwd=searched_study.workdir
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("--") and shown.stdout.count("\n") == 1  # nothing but the flags
    wrong = run_cli_in_process(
        "export", "--format", "yaml", "--storage", searched_study.storage, cwd=searched_study.workdir
    )
    assert wrong.returncode == 2
    assert wrong.stderr.count("\n") == 1 and "choose one of json, cli, python, accelerate" in wrong.stderr


def one_trial_study(storage: str | None, params: dict, identity: dict | None = None):
    """A study of one feasible trial of ``params`` (CPU), in ``storage`` (``None``: in memory)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    from autotune.result import Status, TrialResult
    from autotune.storage import schema

    study = optuna.create_study(storage=storage, direction="maximize", study_name="one-trial")
    study.set_user_attr(schema.STUDY_DEVICE_KIND, "cpu")
    if identity is not None:
        study.set_user_attr(schema.STUDY_IDENTITY, identity)
    result = TrialResult(
        status=Status.OK,
        samples_per_s=10.0,
        model_tflops=1.0,
        peak_memory_bytes=2**30,
        memory_peaks={schema.TRIAL_PREDICTED_HOST_BYTES: 3 * 2**30},
    )
    study.add_trial(
        optuna.trial.create_trial(
            params=params,
            distributions={name: CategoricalDistribution(["off", value]) for name, value in params.items()},
            value=1.0,
            user_attrs={schema.TRIAL_RESULT: result.to_dict()},
            system_attrs={"constraints": [-1.0]},
        )
    )
    return study


PEFT_IDENTITY = {"task": "causal-lm", "peft": {"adapter_config": {"r": 8, "lora_alpha": 16}, "quantize": None}}


@pytest.mark.parametrize("command", ["export", "report"])
def test_a_command_never_writes_over_the_study_it_reads(command, tmp_path):
    """`export --out autotune.db` / `report --out autotune.db` (even with --force, or through a link) is one
    line, and the study reads as before; an existing file of the user's is replaced only with --force."""
    from tests.support.bad_input import assert_one_error_line

    one_trial_study(f"sqlite:///{tmp_path / 'autotune.db'}", {"micro_batch": 16})
    before = (tmp_path / "autotune.db").read_bytes()
    (tmp_path / "link.db").symlink_to(tmp_path / "autotune.db")
    for out in ("autotune.db", "link.db", "autotune.db-journal"):
        for force in ([], ["--force"]):
            refused = run_cli_in_process(command, "--out", out, *force, cwd=tmp_path)
            assert_one_error_line(refused, f"--out {out}: that is the study's database, which this command reads")
    assert (tmp_path / "autotune.db").read_bytes() == before
    (tmp_path / "mine.txt").write_text("the user's file\n")
    refused = run_cli_in_process(command, "--out", "mine.txt", cwd=tmp_path)
    assert_one_error_line(refused, "--out mine.txt: the file exists and autotune does not write over a file unasked")
    assert (tmp_path / "mine.txt").read_text() == "the user's file\n"
    forced = run_cli_in_process(command, "--out", "mine.txt", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "mine.txt").read_text() != "the user's file\n"


def test_side_files_are_written_only_beside_a_regular_out_file(tmp_path):
    """A --peft and ZeRO winner: beside a file, its adapters and DeepSpeed config are files (never over one
    unasked); to standard output or a device nothing else is written anywhere, and the export and its
    notes carry both themselves."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    one_trial_study(storage, {"zero": "2+offload", "dtype": "bf16"}, PEFT_IDENTITY)
    work = tmp_path / "work"
    work.mkdir()
    shown = run_cli_in_process("export", "--storage", storage, "--out", "-", cwd=work)
    assert shown.returncode == 0, shown.stderr
    assert list(work.iterdir()) == []  # no ./adapter_config.json, no ./deepspeed_config.json
    arguments = json.loads(shown.stdout)
    assert arguments["deepspeed"]["zero_optimization"]["stage"] == 2  # the config itself, not a file's name
    assert "peft.LoraConfig(**{" in shown.stderr and '"lora_alpha": 16' in shown.stderr
    devices_before = sorted(os.listdir("/dev"))
    to_device = run_cli_in_process("export", "--storage", storage, "--out", "/dev/null", cwd=work)
    assert to_device.returncode == 0, to_device.stderr
    assert sorted(os.listdir("/dev")) == devices_before and list(work.iterdir()) == []

    (work / "best_args.adapter_config.json").write_text("the user's adapters\n")
    refused = run_cli_in_process("export", "--storage", storage, cwd=work)
    assert refused.returncode == 2 and "best_args.adapter_config.json: the file exists" in refused.stderr
    assert sorted(p.name for p in work.iterdir()) == ["best_args.adapter_config.json"]  # nothing written
    written = run_cli_in_process("export", "--storage", storage, "--force", cwd=work)
    assert written.returncode == 0, written.stderr
    assert json.loads((work / "best_args.adapter_config.json").read_text())["r"] == 8
    assert json.loads((work / "best_args.json").read_text())["deepspeed"] == "best_args.deepspeed.json"
    assert json.loads((work / "best_args.deepspeed.json").read_text())["zero_optimization"]["stage"] == 2


def test_a_zero_winner_exports_its_deepspeed_config_beside_the_arguments_which_name_it(tmp_path):
    """The DeepSpeed config the trial trained with, as JSON beside the arguments; the note says the
    host RAM offload needs (the prediction recorded with the trial)."""
    from autotune.levers import deepspeed_config
    from autotune.spec.files import Destination
    from autotune.views.export import deepspeed_config_path, export_notes, export_winner
    from autotune.views.ranking import study_ranking

    study = one_trial_study(None, {"zero": "2+offload", "dtype": "bf16"})
    out = str(tmp_path / "best_args.json")
    export_winner(study, "json", Destination(out))
    arguments = json.loads((tmp_path / "best_args.json").read_text())
    assert arguments["deepspeed"] == deepspeed_config_path(out) == str(tmp_path / "best_args.deepspeed.json")
    assert json.loads((tmp_path / "best_args.deepspeed.json").read_text()) == deepspeed_config("2+offload")
    assert arguments["bf16"] is True and arguments["use_cpu"] is True
    note = " ".join(export_notes(study_ranking(study)[0], study, out))
    assert "ZeRO stage 2 with offload" in note and "3.00 GiB" in note and "host RAM" in note


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_zero_winners_note_gives_the_launch_that_works(ranks):
    """A plain `python train.py` of DeepSpeed arguments fails in DeepSpeed's mpi_discovery (no launcher
    environment, deepspeed/comm/comm.py): the note names torch's launcher, on one rank too."""
    from autotune.storage import schema
    from autotune.views.export import export_notes
    from autotune.views.ranking import study_ranking
    from tests.support.zero_export import zero_winner_study

    study = zero_winner_study("2")
    study.set_user_attr(schema.STUDY_IDENTITY, {"devices_per_trial": ranks})
    note = " ".join(export_notes(study_ranking(study)[0], study))
    assert f"launch `torchrun --nproc-per-node {ranks} your_script.py`" in note
    assert "a plain `python your_script.py` fails in DeepSpeed's mpi_discovery" in note
    assert ("global batch" in note) is (ranks > 1)


def test_the_accelerate_export_of_a_zero_winner_launches_deepspeed_with_its_file(tmp_path):
    """`accelerate launch --config_file <export>` hands the script's Accelerator() the DeepSpeed file: the
    config is DEEPSPEED (``NO`` trains without DeepSpeed, silently), and leaves the precision, which
    accelerate refuses beside a DeepSpeed file, to the launch line the header gives."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    from autotune.spec.files import Destination
    from autotune.views.export import export_winner
    from tests.support.zero_export import zero_winner_study

    out = tmp_path / "accelerate_config.yaml"
    export_winner(zero_winner_study("2"), "accelerate", Destination(str(out)))
    text = out.read_text()
    loaded = load_config_from_file(str(out))
    deepspeed_file = str(tmp_path / "accelerate_config.deepspeed.json")
    assert loaded.distributed_type.value == "DEEPSPEED" and loaded.mixed_precision is None
    assert loaded.deepspeed_config == {"deepspeed_config_file": deepspeed_file}
    launch = next(line for line in text.splitlines() if line.startswith("# accelerate launch"))
    assert launch == "# accelerate launch --config_file <this file> --mixed_precision bf16 train.py"
    assert "deepspeed = " not in text  # carried by the config, not left to the script
    tokens = launch.removeprefix("# accelerate launch ").replace("<this file>", str(out)).split()
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(tokens))
    assert args.use_deepspeed and not args.cpu  # accelerate's launch_command: the DeepSpeed launcher
    args.deepspeed_fields_from_accelerate_config = ",".join(loaded.deepspeed_config)  # as launch_command sets it
    _, env = prepare_deepspeed_cmd_env(args)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == deepspeed_file
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["ACCELERATE_CONFIG_DS_FIELDS"] == "deepspeed_config_file"


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_a_winner_measured_on_several_ranks_exports_their_launch(device_kind, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    from autotune.views.export import launch_note

    kwargs = training_arguments_kwargs(TrialConfig(micro_batch=8, grad_accum=2), device_kind, BASE_ARGS)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(render(kwargs, "accelerate", "provenance", ranks=4))
    loaded = load_config_from_file(str(path))
    assert loaded.num_processes == 4
    assert loaded.distributed_type.value == ("MULTI_CPU" if device_kind == "cpu" else "MULTI_GPU")
    assert "`torchrun --nproc-per-node 4 your_script.py`" in launch_note(4)
    assert launch_note(1) is None  # one process: nothing to launch


# --- a winner whose Trainer adds up its accumulated micro-batches' losses ----------------------------


def _bert_tiny_losses(micro_batch: int, grad_accum: int, **arguments) -> list[float]:
    """bert-tiny's loss per sample at each of 6 real Trainer steps on the same 8 samples per step
    (dropout off, so both accumulations compute the same per-sample gradient)."""
    import torch
    from transformers import Trainer, TrainingArguments

    from autotune.runner._loader import SyntheticTokens
    from autotune.spec.models import build_model, resolve_model

    spec = resolve_model("bert-tiny")
    torch.manual_seed(0)
    model = build_model(
        {**spec.hf_config, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
        spec.task,
        attn_implementation="eager",
    )
    args = TrainingArguments(
        output_dir="unused",
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=grad_accum,
        max_steps=6,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        **arguments,
    )
    trainer = Trainer(model=model, args=args, train_dataset=SyntheticTokens(spec.vocab_size, 16, spec.task, 64))
    trainer.train()
    # The Trainer logs the sum of the micro-batches' mean losses for this model: per sample, over the steps.
    return [entry["loss"] / grad_accum for entry in trainer.state.log_history if "grad_norm" in entry]


@pytest.mark.slow
def test_the_exported_clipping_makes_adamw_at_accumulation_2_train_as_at_accumulation_1():
    """BertForSequenceClassification ignores num_items_in_batch: at accumulation 2 the Trainer's gradient
    is twice the per-sample one. AdamW's update ignores a constant scale; clipping at the default
    max_grad_norm 1.0 does not (the per-sample norms are 0.64-1.43 over these steps, so it clips
    2 of the 6 steps at accumulation 1 and all of them at 2). The exported max_grad_norm 2.0 trains as
    accumulation 1 does; the arguments as the trial had them do not."""
    from autotune.result import TrialResult
    from autotune.views.export import for_the_trainer

    trained = {"optim": "adamw_torch", "learning_rate": 1e-3, "max_grad_norm": 1.0}
    exported = for_the_trainer(trained, TrialResult(status="ok", gradient_scale=2))
    assert exported == {**trained, "max_grad_norm": 2.0}
    reference = _bert_tiny_losses(8, 1, **trained)
    assert _bert_tiny_losses(4, 2, **exported) == pytest.approx(reference, rel=1e-4)
    assert _bert_tiny_losses(4, 2, **trained) != pytest.approx(reference, rel=1e-3)


def test_the_accumulation_note_says_what_was_changed_and_what_no_argument_undoes():
    from autotune.result import TrialResult
    from autotune.views.export import accumulation_export_note, for_the_trainer

    doubled = TrialResult(status="ok", gradient_scale=2)
    adamw = {"optim": "adamw_torch", "gradient_accumulation_steps": 2}
    assert for_the_trainer(adamw, TrialResult(status="ok")) == adamw  # a Trainer that divided: nothing to undo
    assert for_the_trainer({**adamw, "max_grad_norm": 0.0}, doubled)["max_grad_norm"] == 0.0  # no clipping stays off
    note = accumulation_export_note(adamw, doubled, "json")
    assert "its gradients are 2x the per-sample ones; exported max_grad_norm 2 (was 1)" in note
    assert note.endswith("adamw_torch trains as at accumulation 1 with the same global batch (up to its epsilon)")
    sgd = {"optim": "sgd", "learning_rate": 0.1}
    assert for_the_trainer(sgd, doubled) == {**sgd, "max_grad_norm": 2.0, "learning_rate": 0.05}
    assert "no argument that undoes it exactly" in accumulation_export_note(
        {**sgd, "weight_decay": 0.01}, doubled, "json"
    )
    assert "Accelerator.backward divides by the accumulation steps" in accumulation_export_note(
        adamw, doubled, "accelerate"
    )
    assert accumulation_export_note(adamw, TrialResult(status="ok"), "json") is None


def test_export_of_a_study_no_trial_finished_says_to_resume_it_not_to_raise_the_ceiling():
    """A search stopped during its first trial left it interrupted and queued again: nothing failed, so the advice is
    to resume; a study whose finished trials all ran out of memory is told to raise the ceiling."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    from autotune.errors import AutotuneError
    from autotune.result import Status, TrialResult
    from autotune.storage import schema
    from autotune.views.export import winner

    def study_of(status: Status, queued: bool) -> optuna.Study:
        study = optuna.create_study(direction="maximize", study_name=f"stopped-{status}")
        study.set_user_attr(schema.STUDY_DEVICE_KIND, "cpu")
        study.add_trial(
            optuna.trial.create_trial(
                params={"micro_batch": 8},
                distributions={"micro_batch": CategoricalDistribution([8, 16])},
                state=optuna.trial.TrialState.FAIL,
                user_attrs={schema.TRIAL_RESULT: TrialResult(status=status).to_dict()},
            )
        )
        if queued:
            study.enqueue_trial({"micro_batch": 8})
        return study

    with pytest.raises(AutotuneError) as stopped:
        winner(study_of(Status.INTERRUPTED, queued=True))
    assert "none of its 2 trial(s) ran to the end (1 queued to run): rerun the same search command" in str(
        stopped.value
    )
    assert "memory-ceiling" not in str(stopped.value)
    with pytest.raises(AutotuneError) as out_of_memory:
        winner(study_of(Status.OOM, queued=False))
    assert "every trial failed, ran out of memory or went over the ceiling" in str(out_of_memory.value)
