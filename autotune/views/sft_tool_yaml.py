"""The winner of a study of a TRL trainer (SFT, DPO) as axolotl and LLaMA-Factory YAML fragments: the keys that
choose the trainer in the tool (its ``tool_export``: axolotl's ``rl: dpo``, LLaMA-Factory's ``stage``), then each
field of its arguments (:func:`autotune.views.sft_export.config_arguments`) mapped to the tool's key, or named in
a ``not expressible`` comment line; nothing is dropped silently (docs/facts.md, "SFT export keys", "DPO export
keys", with the sources). A field's mapper is its lever's (``Lever.tool_keys``), the trainer's for its own fields
(``ToolConfig.fields``), else one below, common to the trainers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from autotune.levers import NOTE, Mapper, lever_tool_keys, same
from autotune.trainers import TrainerKind
from autotune.views.sft_export import ToolWinner, comment_lines, header_lines, tool_export

# Where the sources of each fragment's keys are (docs/facts.md, "SFT export keys", has the lines).
AXOLOTL_SOURCE = (
    "axolotl 0.19.0 schema (axolotl/utils/schemas/config.py, training.py, peft.py; integrations/liger/args.py); "
    "docs: https://docs.axolotl.ai/docs/config-reference.html"
)
LLAMA_FACTORY_SOURCE = (
    "LLaMA-Factory 0.9.5 (src/llamafactory/hparams/model_args.py, data_args.py, finetuning_args.py; its "
    "TrainingArguments subclass transformers' Seq2SeqTrainingArguments, so their keys pass unchanged); "
    "docs: https://llamafactory.readthedocs.io/en/latest/advanced/arguments.html"
)


# ---- YAML fragments ---------------------------------------------------------------------------------

# The keys of the lever fields are the levers' own (``Lever.tool_keys``: each field a mapper, or why the tool
# cannot express it), those of the trainer's own fields the trainer's (SFT's loss, DPO's beta); those below
# are the fields no lever writes of every TRL trainer: TRL's defaults, the model's build
# (``model_init_kwargs``) and the device.


def tool_mappers(kind: TrainerKind, tool: str) -> dict[str, Mapper]:
    """Every field the fragment of ``tool`` maps under ``kind``, by field: the levers', the common ones
    (:data:`AXOLOTL_KEYS`, :data:`LLAMA_FACTORY_KEYS`), the trainer's own."""
    common = {"axolotl": AXOLOTL_KEYS, "llama-factory": LLAMA_FACTORY_KEYS}[tool]
    return {**common, **tool_export(kind).tools[tool].fields}


def _fragment(
    winner: ToolWinner,
    tool: str,
    source: str,
    model_key: str,
    form: str,
    passthrough: bool,
    adapters: Callable[[Mapping[str, Any] | None], tuple[dict[str, Any], list[str]]],
) -> str:
    """The YAML fragment of the export form ``form``: the keys that choose the trainer, the model under
    ``model_key`` (the name the tool loads it by); each argument through its mapper; without one, the same
    key where the tool takes every ``TrainingArguments`` field (``passthrough``: LLaMA-Factory), else a
    comment line; the trainer's notes on the tool."""
    from transformers import TrainingArguments

    plain_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    trainer_tool = tool_export(winner.kind).tools[form]
    mappers = tool_mappers(winner.kind, form)
    keys: dict[str, Any] = {**trainer_tool.keys, model_key: winner.model}
    unsaid: list[str] = []
    notes: list[str] = list(trainer_tool.notes)
    for name, value in winner.arguments.items():
        if name in mappers:
            said, comments = mappers[name](value, winner.arguments)
            unsaid += [f"{name}={value!r}: {line}" for line in comments if not line.startswith(NOTE)]
            notes += [f"{name}={value!r}: {line.removeprefix(NOTE)}" for line in comments if line.startswith(NOTE)]
            keys.update(said)
        elif passthrough and name in plain_fields:
            keys[name] = value
        else:
            unsaid.append(f"{name}={value!r}: {tool} has no key for it")
    adapter_keys, adapter_comments = adapters(winner.peft)
    keys.update(adapter_keys)
    unsaid += adapter_comments
    lines = header_lines(winner, "; ".join(filter(None, (source, trainer_tool.source))))
    lines += comment_lines([f"note: {line}" for line in notes])
    lines += comment_lines([f"not expressible: {line}" for line in unsaid])
    return "\n".join(lines) + "\n" + yaml.safe_dump(keys, sort_keys=False)


def _axolotl_dtype(dtype: str, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # axolotl derives the weights' dtype from bf16/fp16 (utils/config/__init__.py:198-203): bf16 on loads bf16 weights.
    if dtype == "bfloat16":
        return {"bfloat16": True}, []
    if dtype == "float32" and (args.get("bf16") or args.get("fp16")):
        return {}, [
            "axolotl cannot express float32 weights under bf16/fp16 autocast: it loads the weights in half precision then"
        ]
    return {}, []


def _axolotl_attention(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    attn = value.get("attn_implementation")
    keys, comments = _axolotl_dtype(str(value.get("dtype", "float32")), args)
    if attn is not None:
        keys["attn_implementation"] = attn  # axolotl >= 0.17 (schemas/config.py:790-856)
    return keys, comments


AXOLOTL_KEYS: dict[str, Mapper] = {
    **lever_tool_keys("axolotl"),
    "learning_rate": same("learning_rate"),
    "logging_steps": same("logging_steps"),
    "model_init_kwargs": _axolotl_attention,
    "use_cpu": lambda value, args: (
        {},
        ["axolotl trains on GPUs; the winner was measured on the CPU"] if value else [],
    ),
}


def axolotl_yaml(winner: ToolWinner) -> str:
    """An axolotl config fragment of the winner's trainer (``rl: dpo`` under DPO), model (``base_model``) and
    knobs, to merge into a config that names ``datasets``."""
    return _fragment(
        winner, "axolotl", AXOLOTL_SOURCE, "base_model", "axolotl", passthrough=False, adapters=_axolotl_peft
    )


def _axolotl_peft(peft: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """axolotl's adapter keys (schemas/peft.py:31-80); without adapters it trains the whole model."""
    if peft is None:
        return {}, []
    config = dict(peft.get("adapter_config", {}))
    keys: dict[str, Any] = {"adapter": "qlora" if peft.get("quantize") == "4bit" else "lora"}
    names = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout"}
    keys.update({names[k]: config.pop(k) for k in list(config) if k in names})
    targets = config.pop("target_modules", None)
    comments = []
    if targets == "all-linear":
        keys["lora_target_linear"] = True
    elif targets is not None:
        keys["lora_target_modules"] = [targets] if isinstance(targets, str) else list(targets)
    else:
        comments.append("LoRA target_modules: peft's default for the architecture; name them in lora_target_modules")
    if peft.get("quantize") == "4bit":
        keys["load_in_4bit"] = True
    comments += [f"LoRA {k}={v!r}: axolotl has no key for it" for k, v in config.items()]
    return keys, comments


# LLaMA-Factory's flash_attn (hparams/model_args.py:117-120; extras/constants.py:147-152).
_LF_ATTENTION = {"eager": "disabled", "sdpa": "sdpa", "flash_attention_2": "fa2", "flash_attention_3": "fa3"}


def _lf_model_init(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # LLaMA-Factory loads the checkpoint's dtype and upcasts trainable weights to fp32 unless pure_bf16
    # (model/loader.py:154, model/adapter.py:337-349); it refuses pure_bf16 unless a GPU (or an NPU) has
    # bf16 ("This device does not support `pure_bf16`", hparams/parser.py:380-382), so never on the CPU.
    bf16_weights = value.get("dtype") == "bfloat16"
    keys: dict[str, Any] = {"pure_bf16": bf16_weights and not args.get("use_cpu")}
    comments = []
    if bf16_weights and args.get("use_cpu"):
        comments.append(
            "LLaMA-Factory refuses pure_bf16 (bf16 weights) on the CPU (hparams/parser.py:380-382: a bf16 GPU "
            "only): it trains the trainable weights in float32 there"
        )
    attn = value.get("attn_implementation")
    if attn is not None:
        if attn in _LF_ATTENTION:
            keys["flash_attn"] = _LF_ATTENTION[attn]
        else:
            comments.append(f"LLaMA-Factory has no flash_attn value for attn_implementation={attn!r}")
    return keys, comments


LLAMA_FACTORY_KEYS: dict[str, Mapper] = {
    **lever_tool_keys("llama-factory"),
    "model_init_kwargs": _lf_model_init,
}


def llama_factory_yaml(winner: ToolWinner) -> str:
    """A LLaMA-Factory config fragment of the winner's stage (``stage: sft``, ``stage: dpo``), model
    (``model_name_or_path``) and knobs (``llamafactory-cli train``), to merge into a config that names
    ``dataset`` and ``template``."""
    return _fragment(
        winner,
        "LLaMA-Factory",
        LLAMA_FACTORY_SOURCE,
        "model_name_or_path",
        "llama-factory",
        passthrough=True,
        adapters=_lf_peft,
    )


def _lf_peft(peft: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """LLaMA-Factory's adapter keys (hparams/finetuning_args.py:69-90, model_args.py:279-294);
    ``finetuning_type`` is always written, since it defaults to lora (finetuning_args.py:460-467)."""
    if peft is None:
        return {"finetuning_type": "full"}, []
    config = dict(peft.get("adapter_config", {}))
    keys: dict[str, Any] = {"finetuning_type": "lora"}
    names = {"r": "lora_rank", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout"}
    keys.update({names[k]: config.pop(k) for k in list(config) if k in names})
    targets = config.pop("target_modules", None)
    comments = []
    if targets == "all-linear":
        keys["lora_target"] = "all"
    elif targets is not None:
        keys["lora_target"] = targets if isinstance(targets, str) else ",".join(targets)
    else:
        comments.append("LoRA target_modules: peft's default for the architecture; name them in lora_target")
    if peft.get("quantize") == "4bit":
        keys.update({"quantization_bit": 4, "quantization_method": "bnb", "quantization_type": "nf4"})
    comments += [f"LoRA {k}={v!r}: LLaMA-Factory has no key for it" for k, v in config.items()]
    return keys, comments
