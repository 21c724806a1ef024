"""The winner of a study of a TRL trainer (``--trainer sft``, ``--trainer dpo``) in the forms people launch
it: TRL's arguments class as JSON (``SFTConfig``, ``DPOConfig``), the ``trl sft`` / ``trl dpo`` command line,
axolotl and LLaMA-Factory YAML fragments (those two in :mod:`autotune.views.sft_tool_yaml`).

One dict is the source of all four, :func:`config_arguments`: the keyword arguments of the trainer's
arguments class the winner's trial trained with (the trainer's ``trial_arguments``: the levers', the user's
``--base-args``, SFT's loss, ``max_length``), with every field whose default in that class differs from
``TrainingArguments``' written out, and the model's build (weight dtype, attention kernel) as
``model_init_kwargs``, which TRL's trainers apply when they load the model by name
(trl/trainer/utils.py:1311-1341: without a ``dtype`` it loads fp32).

What differs between the trainers is the trainer's to say (``autotune.trainers``: ``arguments_path``,
``tool_export``: the ``trl`` subcommand, the fields written even at their default, each tool's keys that
choose the trainer and name its own fields). The other tools name the same knobs differently
(docs/facts.md, "SFT export keys", "DPO export keys", with the sources): each fragment maps every field of
that dict to the tool's key, or writes one comment line saying the tool cannot express it. Nothing is
dropped silently.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

from autotune.levers import TrialConfig, model_build_kwargs, with_levers_off_explicit
from autotune.levers.memory_savers import checkpointing_field
from autotune.spec.model_catalog import catalog_hub_id, catalog_name_of
from autotune.trainers import ToolExport, TrainerKind, class_named
from autotune.views.text import comment_lines, shell_line


def arguments_defaults_differ(arguments_class: type) -> list[str]:
    """The fields whose declared default differs between ``TrainingArguments`` and ``arguments_class``
    (trl/trainer/base_config.py:54-75, :107-108; sft_config.py:139-143; dpo_config.py:156-161): learning_rate,
    logging_steps, bf16 and gradient checkpointing in TRL 1.16's SFTConfig and DPOConfig."""
    from transformers import TrainingArguments

    plain = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    return sorted(f.name for f in dataclasses.fields(arguments_class) if f.name in plain and plain[f.name] != f.default)


def tool_export(kind: TrainerKind) -> ToolExport:
    """What the tools' forms say of ``kind``, a trainer that has them (:attr:`TrainerKind.tool_export`)."""
    assert kind.tool_export is not None, f"{kind.words} has no tools' export forms"
    return kind.tool_export


def config_arguments(
    kind: TrainerKind, trained: dict[str, Any], config: TrialConfig, seq_len: int, loss_on: str
) -> dict[str, Any]:
    """``<the trainer's arguments class>(**it)`` trains as the winner's trial did.

    Args:
        kind: The study's trainer (an arguments class whose defaults differ: ``arguments_subclass``).
        trained: The ``TrainingArguments`` keyword arguments of the winner (its levers', the user's
            ``--base-args``, ``use_cpu``), as :func:`autotune.views.export.trained_arguments` gives them.
        config: The winner's lever values (its model build goes to ``model_init_kwargs``).
        seq_len: The study's ``--seq-len`` (``max_length`` unless a lever set it).
        loss_on: The study's ``--loss-on``.
    """
    arguments_class = class_named(kind.arguments_path)
    arguments = kind.trial_arguments(with_levers_off_explicit(trained, arguments_class), seq_len, loss_on)
    # gradient_checkpointing is transformers 5.23's deprecated alias of the checkpointing field the lever writes.
    checkpointing = checkpointing_field()
    written = (*arguments_defaults_differ(arguments_class), *tool_export(kind).written_fields)
    explicit = [f for f in written if f not in arguments]
    explicit = [f for f in explicit if f not in ("gradient_checkpointing", "activation_checkpointing")]
    if explicit:
        # Resolved as the class resolves them (bf16 follows fp16: base_config.py:108), from the fields they depend on.
        depends = {k: arguments[k] for k in ("bf16", "fp16", checkpointing) if k in arguments}
        with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resolved = arguments_class(output_dir=scratch, use_cpu=True, **depends)
        arguments.update({f: getattr(resolved, f) for f in explicit})
    if checkpointing not in arguments:
        arguments[checkpointing] = False
    arguments["model_init_kwargs"] = model_build_kwargs(config)
    return dict(sorted(arguments.items()))


def config_note(kind: TrainerKind, arguments: Mapping[str, Any]) -> str:
    """What the exported arguments (``SFTConfig``, ``DPOConfig``) say that a TrainingArguments reader would miss."""
    cls = kind.arguments_path.partition(":")[2]
    differing_fields = arguments_defaults_differ(class_named(kind.arguments_path))
    differing = ", ".join(f"{f}={arguments[f]!r}" for f in differing_fields if f in arguments)
    return (
        f"{cls}'s defaults differ from TrainingArguments' ({', '.join(differing_fields)}): the export "
        f"writes them as the winner trained ({differing}); the model's dtype and attention are in model_init_kwargs "
        f"({json.dumps(arguments.get('model_init_kwargs') or {}, sort_keys=True)}), which {tool_export(kind).model_init}"
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
class ToolWinner:
    """What the tools' forms need of the winner: its trainer, its arguments (:func:`config_arguments`),
    the study's model (as a tool loads it: :func:`model_to_load`, with its line), data, loss and adapters,
    and the environment it trained in beyond its arguments (``ACCELERATE_DYNAMO_USE_DYNAMIC``: the command
    line sets it, the YAML forms' notes say it)."""

    kind: TrainerKind
    arguments: dict[str, Any]
    model: str
    dataset: str
    loss_on: str
    peft: dict[str, Any] | None = None
    provenance: str = ""
    model_note: str | None = None
    environment: dict[str, str] = dataclasses.field(default_factory=dict)


def header_lines(winner: ToolWinner, source: str) -> list[str]:
    """The comment lines at the top of each tool's form: the provenance, the model it loads where that
    is not the name the study was given, and where its keys come from."""
    model = [winner.model_note] if winner.model_note else []
    return comment_lines([*winner.provenance.splitlines(), *model, f"keys from {source}"])


# ---- trl sft / trl dpo ------------------------------------------------------------------------------

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


def trl_source(kind: TrainerKind) -> str:
    """Where the ``trl`` command's keys of ``kind`` come from (docs/facts.md has the lines)."""
    command, cls = tool_export(kind).trl_command, kind.arguments_path.partition(":")[2]
    return (
        f"trl 1.16 `trl {command}` (trl/scripts/{command}.py, make_parser: ScriptArguments, {cls}, ModelConfig, "
        "DatasetMixtureConfig)"
    )


def _trl_parser_actions(kind: TrainerKind) -> dict[str, Any]:
    """``trl sft``'s or ``trl dpo``'s own parser (trl/scripts/sft.py:131-139, dpo.py:137-145), its actions by
    field name."""
    parser = importlib.import_module(f"trl.scripts.{tool_export(kind).trl_command}").make_parser()
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


def config_flags(kind: TrainerKind, arguments: Mapping[str, Any]) -> list[str]:
    """``arguments`` as the flags of a script that parses ``kind``'s arguments class (``HfArgumentParser`` /
    ``TrlParser``), ``model_init_kwargs`` as JSON (a dict field SFTConfig and DPOConfig parse)."""
    actions = _trl_parser_actions(kind)
    return [token for name, value in arguments.items() for token in _flag(name, value, actions)]


def trl_command(winner: ToolWinner) -> str:
    """The ``trl sft`` / ``trl dpo`` command line: every argument a flag, the model's dtype and attention
    ModelConfig's ``--dtype`` / ``--attn_implementation`` (trl/scripts/sft.py:76-84, dpo.py:74-82 put them in
    ``model_init_kwargs``), the adapters its ``--use_peft --lora_*`` flags."""
    command = tool_export(winner.kind).trl_command
    actions = _trl_parser_actions(winner.kind)
    unsaid: list[str] = []
    environment = [f"{name}={value}" for name, value in sorted(winner.environment.items())]
    tokens = [
        *environment,
        "trl",
        command,
        "--model_name_or_path",
        winner.model,
        "--dataset_name",
        "./data",
        "--output_dir",
        f"{command}-out",
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
            unsaid.append(f"{name}={value!r}: `trl {command}` has no flag for it")
    if winner.peft is not None:
        tokens += ["--use_peft", "true"]
        for key, value in winner.peft.get("adapter_config", {}).items():
            if key in _TRL_LORA:
                tokens += _flag(_TRL_LORA[key], value, actions)
            else:
                unsaid.append(f"LoRA {key}={value!r}: `trl {command}` has no flag for it (ModelConfig)")
        if winner.peft.get("quantize") == "4bit":
            tokens += ["--load_in_4bit", "true", "--bnb_4bit_quant_type", "nf4"]
    lines = header_lines(winner, trl_source(winner.kind))
    lines += comment_lines(
        [
            f"data: the study trained on {winner.dataset}; `trl {command} --dataset_name` loads a directory "
            "(datasets.load_dataset): put the rows in ./data/train.jsonl",
            *(f"not expressible: {line}" for line in unsaid),
        ]
    )
    return "\n".join(lines) + "\n" + shell_line(tokens)
