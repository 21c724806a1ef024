"""The export of an SFT study (``--trainer sft``): SFTConfig JSON read back by the real ``SFTConfig``, the
``trl sft`` line parsed by TRL's own parser, the axolotl and LLaMA-Factory fragments parsed as YAML."""

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
from autotune.spec.sft import sft_arguments
from autotune.views import sft_tool_yaml
from autotune.views.export import export_notes, exported_as, render, winner_arguments

pytest.importorskip("trl")

SEQ_LEN = 64
# The arguments classes need an output_dir; nothing is written there, and it goes when the tests do.
OUTPUT_DIR = tempfile.mkdtemp(prefix="sft-export-")
atexit.register(shutil.rmtree, OUTPUT_DIR, True)
LORA = {"adapter_config": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}}
CONFIGS = {
    "fp32": TrialConfig(micro_batch=4),
    "bf16-ckpt-bfd-sdpa": TrialConfig(
        micro_batch=2, grad_accum=2, dtype="bf16", checkpointing=True, packing="bfd", attn_implementation="sdpa"
    ),
    "bf16-weights-padding-free-eager": TrialConfig(
        micro_batch=8, dtype="bf16", weight_dtype="bf16", packing="padding_free", attn_implementation="eager"
    ),
}


def sft_study(
    config: TrialConfig,
    loss_on: str = "all",
    base_args: dict | None = None,
    peft: dict | None = None,
    model: str = "llama-tiny",
    device_kind: str = "cpu",
    runtime: dict | None = None,
    trainer: str = "sft",
):
    """An in-memory study of one feasible trial of ``config`` under ``trainer`` (SFT; DPO for
    tests/views/test_dpo_export.py), as the search records it (``runtime``: what its child read back,
    ``TrialResult.runtime``)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    from autotune.result import Status, TrialResult
    from autotune.storage import schema

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(schema.STUDY_DEVICE_KIND, device_kind)
    study.set_user_attr(schema.STUDY_BASE_ARGS, base_args or {})
    identity = {
        "model": model,
        "task": "causal-lm",
        "seq_len": SEQ_LEN,
        "dataset": "chat.jsonl ('messages' 200 rows)",
        "base_args": base_args or {},
        "peft": peft,
        "trainer": trainer,
        "loss_on": loss_on,
    }
    study.set_user_attr(schema.STUDY_IDENTITY, identity)
    params = {name: value for name, value in config.to_params().items() if value is not None}
    result = TrialResult(
        status=Status.OK, samples_per_s=10.0, model_tflops=1.0, peak_memory_bytes=2**30, runtime=runtime or {}
    )
    study.add_trial(
        optuna.trial.create_trial(
            params=params,
            distributions={name: CategoricalDistribution([value]) for name, value in params.items()},
            value=1.0,
            user_attrs={schema.TRIAL_RESULT: result.to_dict()},
            system_attrs={"constraints": [-1.0]},
        )
    )
    return study


def trial_sft_config_kwargs(config: TrialConfig, loss_on: str, base_args: dict | None = None) -> dict:
    """The SFTConfig keyword arguments the trial child builds (runner._trial.build_trainer, less the harness's)."""
    from trl import SFTConfig

    kwargs = with_levers_off_explicit(training_arguments_kwargs(config, "cpu", base_args or {}), SFTConfig)
    return sft_arguments(kwargs, SEQ_LEN, loss_on)


def sft_config(**kwargs):
    import warnings

    from trl import SFTConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SFTConfig(**{"output_dir": OUTPUT_DIR, **kwargs})


@pytest.mark.parametrize("name", CONFIGS)
def test_the_sftconfig_json_loads_as_the_winners_sftconfig_with_its_differing_defaults_written(name):
    config = CONFIGS[name]
    study = sft_study(config, base_args={"warmup_steps": 3})
    exported = json.loads(render(winner_arguments(study), "json"))
    model_init = exported.pop("model_init_kwargs")
    trial = trial_sft_config_kwargs(config, "all", {"warmup_steps": 3})
    assert sft_config(**exported).to_dict() == sft_config(**trial).to_dict()
    # Every field SFTConfig resolves otherwise than TrainingArguments is written, at the winner's value.
    assert exported["bf16"] is (config.dtype == "bf16") and exported["activation_checkpointing"] is config.checkpointing
    assert exported["learning_rate"] == 2e-05 and exported["logging_steps"] == 10 and exported["warmup_steps"] == 3
    assert exported["packing"] is (config.packing == "bfd") and exported["padding_free"] is (
        config.packing == "padding_free"
    )
    assert exported["max_length"] == (None if config.packing == "padding_free" else SEQ_LEN)
    assert exported["completion_only_loss"] is False and exported["assistant_only_loss"] is False
    # The model's build, which SFTTrainer applies when it loads the model by name.
    assert model_init["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[config.weight_dtype]
    assert model_init.get("attn_implementation") == config.attn_implementation


def test_the_note_names_the_differing_defaults_and_model_init_kwargs():
    from autotune.views.ranking import study_ranking

    study = sft_study(CONFIGS["bf16-weights-padding-free-eager"])
    notes = " ".join(export_notes(study_ranking(study)[0], study))
    assert "SFTConfig's defaults differ from TrainingArguments' (bf16, gradient_checkpointing, learning_rate" in notes
    assert '"dtype": "bfloat16"' in notes and "model_init_kwargs" in notes and "float32" in notes
    assert "max_length=None" in notes  # the padding-free lever's own note: pre-truncated samples
    assert "pass dtype=torch.bfloat16 to from_pretrained" not in notes  # said once, as model_init_kwargs


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("peft", [None, LORA], ids=["full", "lora"])
def test_the_trl_sft_command_parses_with_trls_own_parser_into_the_same_sftconfig(name, peft):
    from trl.scripts.sft import make_parser

    config = CONFIGS[name]
    study = sft_study(config, loss_on="assistant", peft=peft)
    exported = winner_arguments(study)
    text = render(exported, "trl", tool=sft_export_winner(study, exported))
    command = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(command) == 1
    tokens = shlex.split(command[0])
    assert tokens[:2] == ["trl", "sft"]
    script, parsed, model, _ = make_parser().parse_args_and_config(args=tokens[2:])
    expected = {k: v for k, v in exported.items() if k != "model_init_kwargs"}
    assert parsed.to_dict() == sft_config(**expected, output_dir=parsed.output_dir).to_dict()
    assert parsed.assistant_only_loss is True
    # trl sft puts ModelConfig's dtype and attention into model_init_kwargs (trl/scripts/sft.py:76-84).
    assert model.dtype == exported["model_init_kwargs"]["dtype"]
    assert model.attn_implementation == exported["model_init_kwargs"].get("attn_implementation")
    assert model.model_name_or_path == "llama-tiny" and script.dataset_name == "./data"
    assert model.use_peft is (peft is not None)
    if peft is not None:
        assert (model.lora_r, model.lora_alpha, model.lora_dropout) == (8, 16, 0.1)
        assert model.lora_target_modules == ["q_proj", "v_proj"]


def sft_export_winner(study, arguments):
    from autotune.views.export import tool_winner

    return tool_winner(study, arguments)


def fragment(study, fmt: str) -> tuple[dict, list[str]]:
    arguments = winner_arguments(study)
    text = render(arguments, fmt, "provenance line", tool=sft_export_winner(study, arguments))
    comments = [line for line in text.splitlines() if line.startswith("#")]
    return yaml.safe_load(text), comments


def test_the_axolotl_fragment_holds_the_knobs_under_axolotls_keys_and_says_what_it_cannot():
    keys, comments = fragment(sft_study(CONFIGS["bf16-ckpt-bfd-sdpa"], loss_on="assistant", peft=LORA), "axolotl")
    assert comments[0] == "# provenance line" and "axolotl 0.19.0 schema" in comments[2]
    assert keys["micro_batch_size"] == 2 and keys["gradient_accumulation_steps"] == 2
    assert keys["sequence_len"] == SEQ_LEN and keys["sample_packing"] is True
    assert keys["gradient_checkpointing"] is True and keys["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert keys["bf16"] is True and keys["attn_implementation"] == "sdpa" and keys["optimizer"] == "adamw_torch"
    assert keys["train_on_inputs"] is False and keys["learning_rate"] == 2e-05
    assert (keys["adapter"], keys["lora_r"], keys["lora_alpha"], keys["lora_target_modules"]) == (
        "lora",
        8,
        16,
        ["q_proj", "v_proj"],
    )
    # axolotl loads bf16 weights whenever bf16 is on: the winner's fp32 weights under bf16 autocast are said, not dropped.
    assert any("cannot express float32 weights under bf16/fp16 autocast" in line for line in comments)
    assert any("use_cpu" in line for line in comments)


def test_the_llama_factory_fragment_holds_the_knobs_under_its_keys_and_says_what_it_cannot():
    keys, comments = fragment(
        sft_study(CONFIGS["bf16-weights-padding-free-eager"], device_kind="cuda"), "llama-factory"
    )
    assert "LLaMA-Factory 0.9.5" in comments[2]
    assert keys["per_device_train_batch_size"] == 8 and keys["bf16"] is True and keys["pure_bf16"] is True
    assert keys["flash_attn"] == "disabled" and keys["finetuning_type"] == "full"  # its default is lora
    assert keys["disable_gradient_checkpointing"] is True and keys["train_on_prompt"] is True
    assert "cutoff_len" not in keys and "max_length" not in keys and "padding_free" not in keys
    assert any("padding_free=True" in line and "no padding-free batches" in line for line in comments)
    assert any("max_length=None" in line for line in comments)
    packed, _ = fragment(sft_study(CONFIGS["bf16-ckpt-bfd-sdpa"], peft=LORA), "llama-factory")
    assert packed["packing"] is True and packed["neat_packing"] is True
    assert packed["flash_attn"] == "sdpa" and packed["pure_bf16"] is False and packed["use_reentrant_gc"] is False
    assert (packed["finetuning_type"], packed["lora_rank"], packed["lora_target"]) == ("lora", 8, "q_proj,v_proj")


def unsaid_fields(study, fmt: str, comments: list[str], keys: dict) -> list[str]:
    """The winner's arguments that the fragment in ``fmt`` neither maps (a mapper of the study's trainer, or
    LLaMA-Factory's key of the same name) nor names in a "not expressible" line: none, or one was dropped."""
    from autotune.views.ranking import study_trainer

    mappers = sft_tool_yaml.tool_mappers(study_trainer(study), fmt)
    return [
        name
        for name in winner_arguments(study)
        if not (name in mappers or (fmt == "llama-factory" and name in keys))
        and not any(f"not expressible: {name}=" in line for line in comments)
    ]


@pytest.mark.parametrize("fmt", ["axolotl", "llama-factory"])
@pytest.mark.parametrize("name", CONFIGS)
def test_every_exported_field_is_carried_or_named_in_a_comment(fmt, name):
    """Nothing dropped silently: each SFTConfig field reaches a key (its mapper) or a "not expressible" line."""
    study = sft_study(CONFIGS[name], base_args={"weight_decay": 0.1, "eval_packing": False})
    keys, comments = fragment(study, fmt)
    assert unsaid_fields(study, fmt, comments, keys) == []
    assert any("eval_packing=False" in line for line in comments)  # an SFT field neither tool has


def test_the_sft_tools_formats_refuse_a_study_of_the_trainer():
    with pytest.raises(AutotuneError, match="--format trl writes a run of TRL.s SFTTrainer or TRL.s DPOTrainer"):
        render(training_arguments_kwargs(TrialConfig(), "cpu"), "trl")


def test_the_python_snippet_of_an_sft_study_builds_sftconfig():
    study = sft_study(CONFIGS["fp32"])
    arguments = winner_arguments(study)
    text = render(arguments, "python", tool=sft_export_winner(study, arguments))
    assert "from trl import SFTConfig" in text and "training_args = SFTConfig(" in text
    namespace: dict = {}
    exec(
        compile(text.replace("SFTConfig(", f"SFTConfig(output_dir={OUTPUT_DIR!r},", 1), "s", "exec"),
        namespace,
    )
    assert namespace["training_args"].bf16 is False and namespace["training_args"].max_length == SEQ_LEN


def test_the_cli_flags_of_an_sft_study_parse_into_the_same_sftconfig():
    from trl import SFTConfig, TrlParser

    study = sft_study(CONFIGS["bf16-weights-padding-free-eager"])
    arguments = winner_arguments(study)
    tokens = shlex.split(render(arguments, "cli", tool=sft_export_winner(study, arguments)))
    (parsed,) = TrlParser((SFTConfig,)).parse_args_into_dataclasses(args=[*tokens, "--output_dir", "x"])
    assert parsed.model_init_kwargs == arguments["model_init_kwargs"]
    assert parsed.max_length is None and parsed.padding_free is True and parsed.bf16 is True


@pytest.mark.parametrize("model", ["smollm2-135m", "HuggingFaceTB/smollm2-135M"])
def test_every_form_that_names_a_catalog_model_names_its_hub_id(model):
    """``trl sft --model_name_or_path smollm2-135m`` cannot load: every form names the Hub repository."""
    from trl.scripts.sft import make_parser

    study = sft_study(CONFIGS["fp32"], model=model)
    arguments = winner_arguments(study)
    winner = sft_export_winner(study, arguments)
    texts = {
        fmt: render(arguments, fmt, "provenance line", tool=winner)
        for fmt in ("trl", "axolotl", "llama-factory", "python")
    }
    command = next(line for line in texts["trl"].splitlines() if not line.startswith("#"))
    _, _, parsed_model, _ = make_parser().parse_args_and_config(args=shlex.split(command)[2:])
    assert parsed_model.model_name_or_path == "HuggingFaceTB/SmolLM2-135M"
    assert yaml.safe_load(texts["axolotl"])["base_model"] == "HuggingFaceTB/SmolLM2-135M"
    assert yaml.safe_load(texts["llama-factory"])["model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M"
    namespace: dict = {}
    exec(compile(texts["python"].replace("SFTConfig(", "dict(", 1), "best_args.py", "exec"), namespace)
    assert namespace["model_name"] == "HuggingFaceTB/SmolLM2-135M"
    for text in texts.values():  # each says where the name comes from
        assert "# model: HuggingFaceTB/SmolLM2-135M, the Hub repository of autotune's catalog entry" in text


def test_a_made_up_catalog_model_is_said_to_have_no_checkpoint():
    study = sft_study(CONFIGS["fp32"], model="llama-tiny")
    arguments = winner_arguments(study)
    text = render(arguments, "trl", "provenance line", tool=sft_export_winner(study, arguments))
    assert (
        "# model: llama-tiny is a config autotune ships (autotune/catalog/llama-tiny.json) with no checkpoint" in text
    )


def test_a_cpu_studys_llama_factory_fragment_never_asks_pure_bf16():
    """LLaMA-Factory refuses pure_bf16 without a bf16 GPU (hparams/parser.py:380-382): a CPU study's bf16
    weights are said, not written beside use_cpu."""
    keys, comments = fragment(sft_study(CONFIGS["bf16-weights-padding-free-eager"]), "llama-factory")
    assert keys["use_cpu"] is True and keys["pure_bf16"] is False and keys["bf16"] is True
    assert any("refuses pure_bf16" in line and "hparams/parser.py:380-382" in line for line in comments)
    on_gpu, _ = fragment(sft_study(CONFIGS["bf16-weights-padding-free-eager"], device_kind="cuda"), "llama-factory")
    assert on_gpu["pure_bf16"] is True and "use_cpu" not in on_gpu


def test_the_llama_factory_cutoff_len_under_packing_keeps_the_winners_length():
    """LLaMA-Factory takes one token off cutoff_len under packing (hparams/data_args.py:188-189): the
    fragment writes one more, and says why; without packing cutoff_len is the length itself."""
    packed, comments = fragment(sft_study(CONFIGS["bf16-ckpt-bfd-sdpa"]), "llama-factory")
    assert packed["packing"] is True and packed["cutoff_len"] == SEQ_LEN + 1
    assert any(
        line.startswith(f"# note: max_length={SEQ_LEN}: cutoff_len is {SEQ_LEN} + 1")
        and "subtracts one token" in line
        and "data_args.py:188-189" in line
        for line in comments
    )
    unpacked, comments = fragment(sft_study(CONFIGS["fp32"]), "llama-factory")
    assert unpacked["packing"] is False and unpacked["cutoff_len"] == SEQ_LEN
    assert not any("cutoff_len" in line for line in comments)


@pytest.mark.parametrize(
    ("attention", "flattened"),
    [("flash_attention_2", True), ("flex_attention", True), ("sdpa", False), ("eager", False)],
)
def test_axolotl_padding_free_batches_are_its_batch_flattening_where_the_attention_allows(attention, flattened):
    """axolotl 0.19's batch_flattening (schemas/config.py:748-753) needs a varlen attention kernel and no
    sample_packing (schemas/validation.py:1076-1089)."""
    config = TrialConfig(micro_batch=4, dtype="bf16", packing="padding_free", attn_implementation=attention)
    keys, comments = fragment(sft_study(config, device_kind="cuda"), "axolotl")
    assert keys["sample_packing"] is False and keys["attn_implementation"] == attention
    if flattened:
        assert keys["batch_flattening"] is True
        assert not any("padding_free" in line for line in comments)
    else:
        assert "batch_flattening" not in keys
        assert any(
            "padding_free=True: axolotl's padding-free batches (batch_flattening) need a varlen attention kernel"
            in line
            and f"the winner's attention is {attention}" in line
            for line in comments
        )
    packed, _ = fragment(sft_study(CONFIGS["bf16-ckpt-bfd-sdpa"], device_kind="cuda"), "axolotl")
    assert "batch_flattening" not in packed  # axolotl refuses it beside sample_packing


def test_the_export_says_an_sft_studys_arguments_are_sftconfigs_which_trainingarguments_refuses():
    """`wrote best_args.json (json: ...)` names the class: TrainingArguments(**json) refuses an SFT study's."""
    from transformers import TrainingArguments

    study = sft_study(CONFIGS["fp32"], loss_on="assistant")
    exported = json.loads(render(winner_arguments(study), "json"))
    assert exported_as(study, "json") == "SFTConfig(**json) keyword arguments"
    assert exported_as(study, "python") == "an SFTConfig(...) snippet"
    assert sft_config(**exported).assistant_only_loss is True
    with pytest.raises(TypeError, match="assistant_only_loss"):
        TrainingArguments(output_dir=OUTPUT_DIR, **exported)
    trainer_study = sft_study(CONFIGS["fp32"])
    trainer_study.set_user_attr("identity", {})  # a study of the Trainer: no trainer in its identity
    assert exported_as(trainer_study, "json") == "TrainingArguments(**json) keyword arguments"


@pytest.mark.parametrize("dynamic", ["True", "None"])
def test_a_winner_compiled_with_dynamic_shapes_is_exported_with_the_environment_that_makes_them(tmp_path, dynamic):
    """A compiled trial on batches of varying length trains with ``ACCELERATE_DYNAMO_USE_DYNAMIC`` set
    (its child reads accelerate's plugin back: ``runtime["compile_dynamic"]``); TrainingArguments has no
    field for it, so the ``trl sft`` line sets it in its environment and every form's notes say it. A
    trial that compiled with transformers' default (``None``: a study from before) exports none."""
    from autotune.spec.files import Destination
    from autotune.views.export import export_winner, winner

    config = TrialConfig(micro_batch=4, packing="padding_free", compile="aot_eager")
    study = sft_study(config, runtime={"compile_dynamic": dynamic})
    out = tmp_path / "run.sh"
    export_winner(study, "trl", Destination(str(out)))
    command = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    notes = " ".join(export_notes(winner(study), study))
    if dynamic == "True":
        assert shlex.split(command[0])[:3] == ["ACCELERATE_DYNAMO_USE_DYNAMIC=true", "trl", "sft"]
        assert "set ACCELERATE_DYNAMO_USE_DYNAMIC=true in the training's environment" in notes
        for fmt in ("axolotl", "llama-factory"):  # no key of theirs sets it: their notes say it, as comments
            export_winner(study, fmt, Destination(str(tmp_path / f"{fmt}.yaml")))
            text = (tmp_path / f"{fmt}.yaml").read_text()
            assert "# note: the winner compiled with dynamic shapes" in text and "USE_DYNAMIC=true" in text
    else:
        assert shlex.split(command[0])[:2] == ["trl", "sft"] and "ACCELERATE_DYNAMO" not in notes


@pytest.mark.parametrize("trainer", ["sft", "dpo"])
def test_the_report_shows_the_export_that_export_writes_and_names_its_class(trainer):
    """The report's two export blocks are `autotune export`'s own JSON and flags, named as that export names them
    (an SFT study's arguments are SFTConfig's, a DPO study's DPOConfig's, refused by TrainingArguments)."""
    import html

    from autotune.views.export import exported_as
    from autotune.views.report import report_html

    study = sft_study(
        CONFIGS["bf16-weights-padding-free-eager"] if trainer == "sft" else TrialConfig(), trainer=trainer
    )
    page = html.unescape(report_html(study))
    for fmt, command in (("json", "autotune export"), ("cli", "autotune export --format cli")):
        arguments = winner_arguments(study, fmt)
        text = render(arguments, fmt, tool=sft_export_winner(study, arguments))
        assert f"<code>{command}</code> ({exported_as(study, fmt)}):</p>\n<pre>{text}</pre>" in page
    assert ("SFTConfig" if trainer == "sft" else "DPOConfig") in exported_as(study, "json")
    assert "TrainingArguments keyword arguments" not in page
    assert "the winner beside the TRL default" in page and "beside the HF default" not in page  # as the search says it
