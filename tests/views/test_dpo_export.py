"""The export of a DPO study (``--trainer dpo``): DPOConfig JSON read back by the real ``DPOConfig``, the
``trl dpo`` line parsed by TRL's own parser, the axolotl and LLaMA-Factory fragments parsed as YAML, each
field carried or said (docs/facts.md, "DPO export keys")."""

from __future__ import annotations

import atexit
import json
import shlex
import shutil
import tempfile

import pytest
import yaml

from autotune.errors import AutotuneError
from autotune.levers import TrialConfig, training_arguments_kwargs, with_levers_off_explicit
from autotune.trainers.dpo import DPO
from autotune.views.export import export_notes, exported_as, render, tool_winner, winner_arguments
from tests.views.test_sft_export import LORA, SEQ_LEN, sft_study, unsaid_fields

pytest.importorskip("trl")

# The arguments classes need an output_dir; nothing is written there, and it goes when the tests do.
OUTPUT_DIR = tempfile.mkdtemp(prefix="dpo-export-")
atexit.register(shutil.rmtree, OUTPUT_DIR, True)
CONFIGS = {
    "fp32": TrialConfig(micro_batch=4),
    "bf16-ckpt-precompute-sdpa": TrialConfig(
        micro_batch=2,
        grad_accum=2,
        dtype="bf16",
        checkpointing=True,
        precompute_ref_log_probs=True,
        attn_implementation="sdpa",
    ),
    "bf16-weights-eager": TrialConfig(micro_batch=8, dtype="bf16", weight_dtype="bf16", attn_implementation="eager"),
}
# The user's own DPO loss (--base-args): what the tools must carry, or say they cannot.
MIXED_LOSS = {"beta": 0.25, "loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5], "label_smoothing": 0.1}


def dpo_study(config: TrialConfig, base_args: dict | None = None, peft: dict | None = None, device_kind: str = "cpu"):
    return sft_study(config, base_args=base_args, peft=peft, device_kind=device_kind, trainer="dpo")


def dpo_config(**kwargs):
    import warnings

    from trl import DPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DPOConfig(**{"output_dir": OUTPUT_DIR, **kwargs})


def trial_dpo_config_kwargs(config: TrialConfig, base_args: dict | None = None) -> dict:
    """The DPOConfig keyword arguments the trial child builds (runner._trial.build_trainer, less the harness's)."""
    from trl import DPOConfig

    kwargs = with_levers_off_explicit(training_arguments_kwargs(config, "cpu", base_args or {}), DPOConfig)
    return DPO.trial_arguments(kwargs, SEQ_LEN, "all")


def rendered(study, fmt: str) -> str:
    arguments = winner_arguments(study)
    return render(arguments, fmt, "provenance line", tool=tool_winner(study, arguments))


def fragment(study, fmt: str) -> tuple[dict, list[str]]:
    text = rendered(study, fmt)
    return yaml.safe_load(text), [line for line in text.splitlines() if line.startswith("#")]


@pytest.mark.parametrize("base_args", [None, MIXED_LOSS], ids=["defaults", "mixed-loss"])
@pytest.mark.parametrize("name", CONFIGS)
def test_the_dpoconfig_json_loads_as_the_winners_dpoconfig_with_its_differing_defaults_written(name, base_args):
    config = CONFIGS[name]
    study = dpo_study(config, base_args=base_args)
    exported = json.loads(render(winner_arguments(study), "json"))
    model_init = exported.pop("model_init_kwargs")
    assert dpo_config(**exported).to_dict() == dpo_config(**trial_dpo_config_kwargs(config, base_args)).to_dict()
    # Every field DPOConfig resolves otherwise than TrainingArguments is written, at the winner's value.
    assert exported["bf16"] is (config.dtype == "bf16") and exported["activation_checkpointing"] is config.checkpointing
    assert exported["learning_rate"] == 1e-06 and exported["logging_steps"] == 10
    assert exported["max_length"] == SEQ_LEN and exported["per_device_train_batch_size"] == config.micro_batch
    assert exported.get("precompute_ref_log_probs", False) is config.precompute_ref_log_probs
    # The loss, written even at TRL's defaults (the tools have their own); the user's as they gave it.
    loss = base_args or {"beta": 0.1, "loss_type": ["sigmoid"]}
    assert {k: exported[k] for k in loss} == loss
    # The model's build, which DPOTrainer applies when it loads the model (and its reference) by name.
    assert model_init["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[config.weight_dtype]
    assert model_init.get("attn_implementation") == config.attn_implementation


def test_the_export_says_a_dpo_studys_arguments_are_dpoconfigs_which_trainingarguments_refuses():
    from transformers import TrainingArguments

    study = dpo_study(CONFIGS["fp32"])
    exported = json.loads(render(winner_arguments(study), "json"))
    assert exported_as(study, "json") == "DPOConfig(**json) keyword arguments"
    assert exported_as(study, "trl") == "a `trl dpo` command line"
    with pytest.raises(TypeError, match="beta"):
        TrainingArguments(output_dir=OUTPUT_DIR, **exported)


def test_the_note_names_dpoconfigs_differing_defaults_and_the_reference_model_init():
    from autotune.views.ranking import study_ranking

    study = dpo_study(CONFIGS["bf16-weights-eager"])
    notes = " ".join(export_notes(study_ranking(study)[0], study))
    assert "DPOConfig's defaults differ from TrainingArguments' (bf16, gradient_checkpointing, learning_rate" in notes
    assert "learning_rate=1e-06" in notes and '"dtype": "bfloat16"' in notes
    assert "DPOTrainer applies when it loads the model by name, and to the reference model" in notes
    assert "SFTConfig" not in notes and "SFTTrainer" not in notes


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("peft", [None, LORA], ids=["full", "lora"])
def test_the_trl_dpo_command_parses_with_trls_own_parser_into_the_same_dpoconfig(name, peft):
    from trl.scripts.dpo import make_parser

    study = dpo_study(CONFIGS[name], base_args=MIXED_LOSS, peft=peft)
    exported = winner_arguments(study)
    text = rendered(study, "trl")
    command = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(command) == 1
    tokens = shlex.split(command[0])
    assert tokens[:2] == ["trl", "dpo"]
    assert "# keys from trl 1.16 `trl dpo` (trl/scripts/dpo.py" in text and "not expressible" not in text
    script, parsed, model, _ = make_parser().parse_args_and_config(args=tokens[2:])
    expected = {k: v for k, v in exported.items() if k != "model_init_kwargs"}
    assert parsed.to_dict() == dpo_config(**expected, output_dir=parsed.output_dir).to_dict()
    assert parsed.loss_type == ["sigmoid", "sft"] and parsed.beta == 0.25
    # trl dpo puts ModelConfig's dtype and attention into model_init_kwargs (trl/scripts/dpo.py:74-82).
    assert model.dtype == exported["model_init_kwargs"]["dtype"]
    assert model.attn_implementation == exported["model_init_kwargs"].get("attn_implementation")
    assert model.model_name_or_path == "llama-tiny" and script.dataset_name == "./data"
    assert parsed.output_dir == "dpo-out"
    assert model.use_peft is (peft is not None)
    if peft is not None:
        assert (model.lora_r, model.lora_alpha, model.lora_dropout) == (8, 16, 0.1)
        assert model.lora_target_modules == ["q_proj", "v_proj"]


def test_the_cli_flags_and_the_python_snippet_of_a_dpo_study_build_the_same_dpoconfig():
    from trl import DPOConfig, TrlParser

    study = dpo_study(CONFIGS["bf16-ckpt-precompute-sdpa"], base_args=MIXED_LOSS)
    arguments = winner_arguments(study)
    tokens = shlex.split(rendered(study, "cli"))
    (parsed,) = TrlParser((DPOConfig,)).parse_args_into_dataclasses(args=[*tokens, "--output_dir", OUTPUT_DIR])
    assert parsed.to_dict() == dpo_config(**arguments).to_dict()
    text = rendered(study, "python")
    assert "from trl import DPOConfig" in text and "# DPOTrainer(model=model_name, args=training_args" in text
    namespace: dict = {}
    exec(compile(text.replace("DPOConfig(", f"DPOConfig(output_dir={OUTPUT_DIR!r},", 1), "s", "exec"), namespace)
    assert namespace["training_args"].to_dict() == parsed.to_dict()


def test_the_axolotl_fragment_is_an_rl_dpo_run_with_axolotls_dpo_keys():
    keys, comments = fragment(
        dpo_study(CONFIGS["bf16-ckpt-precompute-sdpa"], base_args=MIXED_LOSS, peft=LORA), "axolotl"
    )
    assert comments[0] == "# provenance line"
    assert any("DPO: axolotl/utils/schemas/config.py:264-269 (rl)" in line for line in comments)
    assert keys["rl"] == "dpo" and keys["base_model"] == "llama-tiny"
    assert (keys["rl_beta"], keys["dpo_loss_type"], keys["dpo_loss_weights"]) == (0.25, ["sigmoid", "sft"], [1.0, 0.5])
    assert keys["dpo_label_smoothing"] == 0.1 and keys["precompute_ref_log_probs"] is True
    assert (
        keys["sequence_len"] == SEQ_LEN and keys["micro_batch_size"] == 2 and keys["gradient_accumulation_steps"] == 2
    )
    assert keys["learning_rate"] == 1e-06 and keys["bf16"] is True and keys["gradient_checkpointing"] is True
    assert (keys["adapter"], keys["lora_r"]) == ("lora", 8)
    assert "sample_packing" not in keys and "train_on_inputs" not in keys  # SFT's keys, not a DPO run's


def test_the_llama_factory_fragment_is_a_dpo_stage_with_its_pref_keys_and_says_what_it_cannot():
    keys, comments = fragment(dpo_study(CONFIGS["bf16-ckpt-precompute-sdpa"]), "llama-factory")
    assert keys["stage"] == "dpo" and keys["finetuning_type"] == "full"
    assert (keys["pref_beta"], keys["pref_loss"], keys["cutoff_len"]) == (0.1, "sigmoid", SEQ_LEN)
    assert keys["learning_rate"] == 1e-06 and keys["per_device_train_batch_size"] == 2
    assert "precompute_ref_log_probs" not in keys and "train_on_prompt" not in keys
    # LLaMA-Factory's CustomDPOTrainer forces no precomputed reference; its truncation and padding differ.
    assert any(
        "precompute_ref_log_probs=True" in line and "forces precompute_ref_log_probs = False" in line
        for line in comments
    )
    assert any("cutoff_len caps the prompt plus the longer answer" in line for line in comments)
    assert any("pads each batch to a multiple of 8" in line for line in comments)
    mixed, comments = fragment(dpo_study(CONFIGS["fp32"], base_args=MIXED_LOSS), "llama-factory")
    assert "pref_loss" not in mixed and mixed["pref_beta"] == 0.25 and "dpo_label_smoothing" not in mixed
    assert any(line.startswith("# not expressible: loss_type=['sigmoid', 'sft']") for line in comments)
    assert any(line.startswith("# not expressible: label_smoothing=0.1: LLaMA-Factory takes") for line in comments)
    smoothed, _ = fragment(dpo_study(CONFIGS["fp32"], base_args={"label_smoothing": 0.1}), "llama-factory")
    assert (smoothed["pref_loss"], smoothed["dpo_label_smoothing"]) == ("sigmoid", 0.1)
    assert any(line.startswith("# not expressible: loss_weights=[1.0, 0.5]") for line in comments)


@pytest.mark.parametrize("fmt", ["axolotl", "llama-factory"])
@pytest.mark.parametrize("name", CONFIGS)
def test_every_exported_dpo_field_is_carried_or_named_in_a_comment(fmt, name):
    """Nothing dropped silently: each DPOConfig field reaches a key (its mapper) or a "not expressible" line."""
    study = dpo_study(CONFIGS[name], base_args={**MIXED_LOSS, "truncation_mode": "keep_start", "weight_decay": 0.1})
    keys, comments = fragment(study, fmt)
    assert unsaid_fields(study, fmt, comments, keys) == []
    assert any("not expressible: truncation_mode='keep_start'" in line for line in comments)  # neither tool has it


def test_the_tools_formats_refuse_a_study_of_the_trainer_naming_both_trl_trainers():
    with pytest.raises(AutotuneError, match="TRL's SFTTrainer or TRL's DPOTrainer.*--trainer sft or dpo"):
        render(training_arguments_kwargs(TrialConfig(), "cpu"), "axolotl")
