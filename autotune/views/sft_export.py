"""The winner of an SFT study (``--trainer sft``) in the forms people launch it: TRL's ``SFTConfig``
JSON, the ``trl sft`` command line, axolotl and LLaMA-Factory YAML fragments (those two in
:mod:`autotune.views.sft_tool_yaml`).

One dict is the source of all four, :func:`sft_config_arguments`: the ``SFTConfig`` keyword arguments
the winner's trial trained with (``autotune.trainers.sft``: the levers', the user's ``--base-args``, the
loss and ``max_length``), with every field whose ``SFTConfig`` default differs from
``TrainingArguments``' written out, and the model's build (weight dtype, attention kernel) as
``model_init_kwargs``, which SFTTrainer applies when it loads the model by name
(trl/trainer/sft_trainer.py:544-547, trl/trainer/utils.py:1311-1341: without a ``dtype`` it loads fp32).

The other three tools name the same knobs differently (docs/facts.md, "SFT export keys", with the
sources): each fragment maps every field of that dict to the tool's key, or writes one comment line
saying the tool cannot express it. Nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

from autotune.levers import TrialConfig, model_build_kwargs, with_levers_off_explicit
from autotune.levers.memory_savers import checkpointing_field
from autotune.spec.models import catalog_hub_id, catalog_name_of
from autotune.spec.sft import sft_arguments
from autotune.trainers.sft import SFT
from autotune.views.text import comment_lines, shell_line

# The SFT fields written even where the winner left them at TRL's default: what decides how the
# rows are batched (sft_config.py:222-258).
_SFT_BATCHING_FIELDS = ("packing", "padding_free")
# Where the sources of the trl command's keys are (docs/facts.md, "SFT export keys", has the lines).
TRL_SOURCE = (
    "trl 1.16 `trl sft` (trl/scripts/sft.py:131-139: ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig)"
)


def arguments_defaults_differ() -> list[str]:
    """The fields whose declared default differs between ``TrainingArguments`` and ``SFTConfig``
    (trl/trainer/base_config.py:54-75, :107-108; sft_config.py:139-143): learning_rate, logging_steps,
    bf16 and gradient checkpointing in TRL 1.16."""
    from transformers import TrainingArguments
    from trl import SFTConfig

    plain = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    return sorted(f.name for f in dataclasses.fields(SFTConfig) if f.name in plain and plain[f.name] != f.default)


def sft_config_arguments(trained: dict[str, Any], config: TrialConfig, seq_len: int, loss_on: str) -> dict[str, Any]:
    """``SFTConfig(**it)`` trains as the winner's trial did.

    Args:
        trained: The ``TrainingArguments`` keyword arguments of the winner (its levers', the user's
            ``--base-args``, ``use_cpu``), as :func:`autotune.views.export.trained_arguments` gives them.
        config: The winner's lever values (its model build goes to ``model_init_kwargs``).
        seq_len: The study's ``--seq-len`` (``max_length`` unless a lever set it).
        loss_on: The study's ``--loss-on``.
    """
    from trl import SFTConfig

    arguments = sft_arguments(with_levers_off_explicit(trained, SFTConfig), seq_len, loss_on)
    # gradient_checkpointing is transformers 5.23's deprecated alias of the checkpointing field the lever writes.
    checkpointing = checkpointing_field()
    explicit = [f for f in (*arguments_defaults_differ(), *_SFT_BATCHING_FIELDS) if f not in arguments]
    explicit = [f for f in explicit if f not in ("gradient_checkpointing", "activation_checkpointing")]
    if explicit:
        # Resolved as SFTConfig resolves them (bf16 follows fp16: base_config.py:108), from the fields they depend on.
        depends = {k: arguments[k] for k in ("bf16", "fp16", checkpointing) if k in arguments}
        with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resolved = SFTConfig(output_dir=scratch, use_cpu=True, **depends)
        arguments.update({f: getattr(resolved, f) for f in explicit})
    if checkpointing not in arguments:
        arguments[checkpointing] = False
    arguments["model_init_kwargs"] = model_build_kwargs(config)
    return dict(sorted(arguments.items()))


def sft_config_note(arguments: Mapping[str, Any]) -> str:
    """What the exported SFTConfig says that a TrainingArguments reader would miss."""
    differing = ", ".join(f"{f}={arguments[f]!r}" for f in arguments_defaults_differ() if f in arguments)
    return (
        f"SFTConfig's defaults differ from TrainingArguments' ({', '.join(arguments_defaults_differ())}): the export "
        f"writes them as the winner trained ({differing}); the model's dtype and attention are in model_init_kwargs "
        f"({json.dumps(arguments.get('model_init_kwargs') or {}, sort_keys=True)}), which SFTTrainer applies when "
        "it loads the model by name (trl/trainer/utils.py:1311-1341: without a dtype it loads the weights in float32; "
        "a model you build yourself ignores them, sft_trainer.py:697-708: build it so)"
    )


def model_to_load(name: str) -> tuple[str, str | None]:
    """What a tool loads the study's ``--model`` by (``from_pretrained``), and a line where that is not the
    name the study was given: a catalog entry's Hub id (``smollm2-135m`` -> ``HuggingFaceTB/SmolLM2-135M``),
    or why a made-up catalog config has none. A directory or a Hub id is loaded as it was given."""
    catalog_name = catalog_name_of(name)
    if catalog_name is None:
        return name, None
    hub_id = catalog_hub_id(catalog_name)
    if hub_id is None:
        return name, (
            f"model: {name} is a config autotune ships (autotune/catalog/{catalog_name}.json) with no checkpoint on "
            "the Hub, so no tool loads it by that name: save a model built from it (save_pretrained) and give "
            "its directory instead"
        )
    if hub_id == name:
        return name, None
    return hub_id, f"model: {hub_id}, the Hub repository of autotune's catalog entry {name!r}, which the study searched"


@dataclasses.dataclass(frozen=True)
class SftWinner:
    """What the tools' forms need of the winner: its ``SFTConfig`` arguments (:func:`sft_config_arguments`),
    the study's model (as a tool loads it: :func:`model_to_load`, with its line), data, loss and adapters,
    and the environment it trained in beyond its arguments (``ACCELERATE_DYNAMO_USE_DYNAMIC``: the command
    line sets it, the YAML forms' notes say it)."""

    arguments: dict[str, Any]
    model: str
    dataset: str
    loss_on: str
    peft: dict[str, Any] | None = None
    provenance: str = ""
    model_note: str | None = None
    arguments_path: str = SFT.arguments_path
    environment: dict[str, str] = dataclasses.field(default_factory=dict)


def header_lines(winner: SftWinner, source: str) -> list[str]:
    """The comment lines at the top of each tool's form: the provenance, the model it loads where that
    is not the name the study was given, and where its keys come from."""
    model = [winner.model_note] if winner.model_note else []
    return comment_lines([*winner.provenance.splitlines(), *model, f"keys from {source}"])


# ---- trl sft ----------------------------------------------------------------------------------------

_TRL_MODEL_ARGS = {"dtype": "dtype", "attn_implementation": "attn_implementation"}  # ModelConfig fields
# LoraConfig key -> ModelConfig flag (trl/trainer/model_config.py:103-178).
_TRL_LORA = {
    "r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "lora_target_modules",
    "target_parameters": "lora_target_parameters",
    "modules_to_save": "lora_modules_to_save",
    "task_type": "lora_task_type",
    "use_rslora": "use_rslora",
    "use_dora": "use_dora",
}


def _trl_parser_actions() -> dict[str, Any]:
    """``trl sft``'s own parser (trl/scripts/sft.py:131-139), its actions by field name."""
    from trl.scripts.sft import make_parser

    parser = make_parser()
    return {a.dest: a for a in parser._actions if f"--{a.dest}" in a.option_strings}


def _flag(name: str, value: Any, actions: Mapping[str, Any]) -> list[str]:
    """One ``--name value`` as ``HfArgumentParser`` reads it: a bool spelled ``true``/``false`` (the
    ``bool | None`` fields take no bare flag), ``None`` as ``None`` where the field parses it
    (``max_length``), a list as several values where the flag takes several, a dict as JSON."""
    nargs = getattr(actions.get(name), "nargs", None)
    if isinstance(value, bool):
        return [f"--{name}", "true" if value else "false"]
    if value is None:
        return [f"--{name}", "None"]
    if isinstance(value, dict):
        return [f"--{name}", json.dumps(value, sort_keys=True)]
    if isinstance(value, (list, tuple)):
        if nargs in ("+", "*"):
            return [f"--{name}", *(str(item) for item in value)]
        return [f"--{name}", ",".join(str(item) for item in value)]
    return [f"--{name}", str(value)]


def sft_flags(arguments: Mapping[str, Any]) -> list[str]:
    """``arguments`` as the flags of a script that parses ``SFTConfig`` (``HfArgumentParser`` /
    ``TrlParser``), ``model_init_kwargs`` as JSON (a dict field SFTConfig parses, sft_config.py:137)."""
    actions = _trl_parser_actions()
    return [token for name, value in arguments.items() for token in _flag(name, value, actions)]


def trl_command(winner: SftWinner) -> str:
    """The ``trl sft`` command line: every SFTConfig argument a flag, the model's dtype and attention
    ModelConfig's ``--dtype`` / ``--attn_implementation`` (trl/scripts/sft.py:76-84 puts them in
    ``model_init_kwargs``), the adapters its ``--use_peft --lora_*`` flags."""
    actions = _trl_parser_actions()
    unsaid: list[str] = []
    environment = [f"{name}={value}" for name, value in sorted(winner.environment.items())]
    tokens = [
        *environment,
        "trl",
        "sft",
        "--model_name_or_path",
        winner.model,
        "--dataset_name",
        "./data",
        "--output_dir",
        "sft-out",
    ]
    model_init = dict(winner.arguments.get("model_init_kwargs") or {})
    for key, flag in _TRL_MODEL_ARGS.items():
        if key in model_init:
            tokens += _flag(flag, model_init.pop(key), actions)
    for name, value in winner.arguments.items():
        if name == "model_init_kwargs":
            if model_init:
                tokens += _flag(name, model_init, actions)
        elif name in actions:
            tokens += _flag(name, value, actions)
        else:
            unsaid.append(f"{name}={value!r}: `trl sft` has no flag for it")
    if winner.peft is not None:
        tokens += ["--use_peft", "true"]
        for key, value in winner.peft.get("adapter_config", {}).items():
            if key in _TRL_LORA:
                tokens += _flag(_TRL_LORA[key], value, actions)
            else:
                unsaid.append(f"LoRA {key}={value!r}: `trl sft` has no flag for it (ModelConfig)")
        if winner.peft.get("quantize") == "4bit":
            tokens += ["--load_in_4bit", "true", "--bnb_4bit_quant_type", "nf4"]
    lines = header_lines(winner, TRL_SOURCE)
    lines += comment_lines(
        [
            f"data: the study trained on {winner.dataset}; `trl sft --dataset_name` loads a directory "
            "(datasets.load_dataset): put the rows in ./data/train.jsonl",
            *(f"not expressible: {line}" for line in unsaid),
        ]
    )
    return "\n".join(lines) + "\n" + shell_line(tokens)
