"""``--peft``: the adapters every trial of a study trains (LoRA, or QLoRA over a 4-bit base).

PEFT is part of the workload, not a lever: the user chooses the adapter (its rank, alpha, dropout,
target modules) for what it learns, so a study fixes it and measures every config with it, like
``--base-args``; it is never searched. This module is its one home: reading the user's adapter
config, counting what it trains (for the estimator and the FLOPs, through
:attr:`autotune.spec.models.ModelSpec.peft`), the CPU filter of 4-bit loading, wrapping the model in the
trial child with the real ``peft.get_peft_model``, and what the export writes.

``--peft`` takes:

* ``lora``: :data:`DEFAULT_LORA`;
* ``qlora``: the same adapters over a base loaded 4-bit (NF4) through bitsandbytes (CUDA only);
* a file: a LoRA ``adapter_config.json`` (as ``peft`` saves it) or YAML with the ``LoraConfig``
  keys (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``, ...), plus ``quantize: 4bit``
  for QLoRA.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError, first_line
from autotune.spec.block_layout import transformer_blocks
from autotune.spec.files import read_user_file
from autotune.spec.models import ModelSpec, PeftSpec, build_model

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

# ``--peft lora``: LoRA on every linear layer of the blocks (peft's ``"all-linear"``, which leaves the
# output head out), as QLoRA does (Dettmers et al. 2023, "QLoRA", section 4: adapters on all linear
# layers are needed to match full fine-tuning); rank 16, alpha 2r, dropout 0.05.
DEFAULT_LORA: dict[str, Any] = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}
QUANTIZE_CHOICES = ("4bit",)
# Keys ``peft`` writes into a saved adapter_config.json that are bookkeeping, not training choices
# (peft/config.py ``save_pretrained``: ``auto_mapping``; ``inference_mode`` is True in a config
# loaded for inference, which would freeze the adapters too).
_BOOKKEEPING_KEYS = ("auto_mapping", "peft_version", "inference_mode", "base_model_name_or_path", "revision")
# peft's task type for each autotune task (peft/utils/peft_types.py TaskType); the head of a
# classification model is trained beside the adapters (SEQ_CLS adds it to modules_to_save).
_TASK_TYPES = {"causal-lm": "CAUSAL_LM", "sequence-classification": "SEQ_CLS", "masked-lm": None}
_MAX_BYTES = 64 * 1024


def read_peft_option(value: str) -> tuple[dict[str, Any], str | None]:
    """``--peft`` as typed: (``LoraConfig`` keyword arguments, quantize), checked.

    Raises:
        AutotuneError: Unreadable file, not a mapping, an unknown key, a bad value; one line.
    """
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise AutotuneError("--peft needs the peft package: pip install 'autotune[peft]' (or pip install peft)")
    if value in ("lora", "qlora"):
        return dict(DEFAULT_LORA), ("4bit" if value == "qlora" else None)
    option = f"--peft {value}"
    import yaml

    if not os.path.lexists(value):  # a word that is no file: most likely a misspelled kind
        raise AutotuneError(
            f"{option}: give lora, qlora, or the path of an adapter config (JSON or YAML): no such file"
        )
    text = read_user_file(value, "--peft", "UTF-8 JSON or YAML", _MAX_BYTES, "a LoRA adapter config is a few lines")
    try:
        raw = yaml.safe_load(text)  # YAML reads JSON too
    except yaml.YAMLError as exc:
        raise AutotuneError(f"{option}: not valid JSON or YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise AutotuneError(
            f"{option}: expected a mapping of LoraConfig keys (r, lora_alpha, lora_dropout, target_modules)"
        )
    config = {k: v for k, v in raw.items() if k not in _BOOKKEEPING_KEYS}
    quantize = config.pop("quantize", None)
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise AutotuneError(f"{option}: quantize {quantize!r}: the only choice is 4bit (QLoRA), or leave it out")
    peft_type = config.pop("peft_type", "LORA")
    if peft_type != "LORA":
        raise AutotuneError(f"{option}: peft_type {peft_type!r}: autotune tunes LoRA adapters only")
    _check_lora_keys(option, config)
    return config, quantize


def _check_lora_keys(option: str, config: dict[str, Any]) -> None:
    from peft import LoraConfig

    fields = [f.name for f in dataclasses.fields(LoraConfig) if f.init]
    for key in config:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            raise AutotuneError(
                f"{option}: {key} is not a LoraConfig key" + (f" (did you mean {close[0]}?)" if close else "")
            )
    r, alpha, dropout = config.get("r", 8), config.get("lora_alpha", 8), config.get("lora_dropout", 0.0)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise AutotuneError(f"{option}: r must be a positive integer (the adapters' rank), not {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise AutotuneError(f"{option}: lora_alpha must be a positive number, not {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise AutotuneError(f"{option}: lora_dropout must be a number from 0 up to, not including, 1, not {dropout!r}")
    targets = config.get("target_modules")
    if (
        targets is not None
        and not isinstance(targets, str)
        and not (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))
    ):
        raise AutotuneError(
            f"{option}: target_modules must be a module name pattern or a list of names, not {targets!r}"
        )
    try:
        LoraConfig(**config)
    except (TypeError, ValueError) as exc:
        raise AutotuneError(f"{option}: LoraConfig refuses it ({first_line(exc)})") from None


def with_peft(model: ModelSpec, value: str, device: DeviceSpec, notes: list[str]) -> ModelSpec:
    """``model`` with the adapters of ``--peft value`` (counted on the meta device by ``peft`` itself).

    On a device without CUDA, 4-bit loading is removed with a note (bitsandbytes' 4-bit training
    kernels are CUDA's): the study trains the same adapters over the unquantized base.

    Raises:
        AutotuneError: A bad ``--peft``, or adapters the model has no modules for.
    """
    import torch

    config, quantize = read_peft_option(value)
    if model.experts is not None and value in ("lora", "qlora") and config["lora_dropout"]:
        # peft (0.17+) puts "all-linear"'s adapters on a mixture of experts' 3-D expert weights too (its
        # ParamWrapper), which cannot apply dropout to their input: "does not work with lora_dropout != 0"
        # (peft/tuners/lora/layer.py, ParamWrapper.__init__).
        notes.append(
            f"--peft {value}: lora_dropout {config['lora_dropout']} -> 0: peft's LoRA on routed experts' weights takes no dropout"
        )
        config["lora_dropout"] = 0.0
    if quantize is not None and device.kind != "cuda":
        notes.append(
            f"--peft: quantize {quantize} removed: bitsandbytes' 4-bit base needs a CUDA device; LoRA over the unquantized base"
        )
        quantize = None
    with torch.device("meta"):
        base = build_model(model.hf_config, model.task)
        output_head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        quantized = (
            sum(m.weight.numel() for m in base.modules() if _is_quantized_linear(m, output_head)) if quantize else 0
        )
        try:
            wrapped = wrap_with_adapters(base, config, model.task)
        except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
            reason = first_line(exc)
            fix = "; set lora_dropout to 0, or target_modules without the experts" if "lora_dropout" in reason else ""
            raise AutotuneError(f"--peft {value}: {reason}{fix}") from None
        trainable, _ = wrapped.get_nb_trainable_parameters()
        on_experts = sum(
            p.numel() for name, p in wrapped.named_parameters() if p.requires_grad and "experts" in name.split(".")
        )
        fold = sum(_fold_flops(m) for name, m in wrapped.named_modules() if "experts" in name.split("."))
        blocks = transformer_blocks(wrapped)
        adapted = [(name, m) for name, m in blocks[0].named_modules() if hasattr(m, "lora_A")] if blocks else []
        adapted_width = sum(m.in_features for name, m in adapted if "experts" not in name.split("."))
    spec = PeftSpec(
        adapter_config=config,
        quantize=quantize,
        adapter_params=int(trainable),
        quantized_params=int(quantized),
        adapted_input_width=int(adapted_width),
        expert_adapter_params=int(on_experts),
        expert_fold_flops=float(fold),
    )
    return dataclasses.replace(model, peft=spec)


def _fold_flops(module: Any) -> float:
    """One fold of the LoRA factors peft keeps on a 3-D expert weight (``ParamWrapper``: its ``lora_A`` holds ``r``
    rows per expert) into that weight: ``2 r`` FLOPs per element (one ``baddbmm``); 0 for any other module."""
    lora_a, get_param = getattr(module, "lora_A", None), getattr(module, "get_param", None)
    if not lora_a or get_param is None or getattr(module, "num_experts", 1) <= 1:
        return 0.0
    rank = sum(a.weight.shape[0] for a in lora_a.values()) / module.num_experts
    return 2.0 * rank * get_param().numel()


def _is_quantized_linear(module: Any, output_head: Any) -> bool:
    """The layers transformers' bitsandbytes integration loads 4-bit: every ``nn.Linear`` but the
    output head (transformers/integrations/bitsandbytes.py ``replace_with_bnb_linear``, with the
    modules ``get_keys_to_not_convert`` keeps: the output embedding)."""
    import torch

    return isinstance(module, torch.nn.Linear) and module is not output_head


def lora_config(adapter_config: dict[str, Any], task: str) -> Any:
    """The ``peft.LoraConfig`` of a study's adapters, its task type from the model's head unless given."""
    from peft import LoraConfig

    kwargs = dict(adapter_config)
    if "task_type" not in kwargs and _TASK_TYPES.get(task):
        kwargs["task_type"] = _TASK_TYPES[task]
    return LoraConfig(**kwargs)


def wrap_with_adapters(model: Any, adapter_config: dict[str, Any], task: str) -> Any:
    """``peft.get_peft_model``: the base frozen, the adapters trainable (fp32 whatever the base:
    ``autocast_adapter_dtype=True``, peft/tuners/tuners_utils.py ``_cast_adapter_dtype``)."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(adapter_config, task))


def quantize_4bit(model: Any, bnb: Any, compute_dtype: Any, device: str) -> Any:
    """Replace the base's linear layers (but the output head) with bitsandbytes 4-bit NF4 layers on ``device``.

    What ``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=...))`` loads, for a model built from its config
    (random weights, nothing to load): bitsandbytes' documented path, ``bnb.nn.Linear4bit`` with its
    weight a ``bnb.nn.Params4bit``, quantized when moved to the CUDA device (bitsandbytes docs,
    "Linear4bit"; ``Params4bit.to``). ``bnb`` is the ``bitsandbytes`` module (a parameter so that a fake
    can stand in where there is no CUDA).
    """
    import torch

    output_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not _is_quantized_linear(child, output_head):
                continue
            layer = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=compute_dtype,
                quant_type="nf4",
            )
            layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4")
            if child.bias is not None:
                layer.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, layer)
    return model.to(device)


def apply_peft(model: Any, spec: PeftSpec, task: str, device: DeviceSpec, wrap: bool = True) -> Any:
    """In the trial child, after the build: the 4-bit base where asked, then the real ``get_peft_model``
    (``wrap=False``: not, for a trainer that applies the adapters itself from ``peft_config``)."""
    if spec.quantize is not None:
        import bitsandbytes
        import torch

        compute_dtype = torch.bfloat16 if "bf16" in device.supported_dtypes else torch.float16
        model = quantize_4bit(model, bitsandbytes, compute_dtype, f"cuda:{device.index or 0}")
    return wrap_with_adapters(model, spec.adapter_config, task) if wrap else model


def adapter_config_path(out: str) -> str:
    """Where the export writes the adapters beside ``out`` (a regular file: never beside standard output or
    a device, :func:`autotune.spec.files.writes_beside`): ``best_args.json`` -> ``best_args.adapter_config.json``."""
    return f"{os.path.splitext(out)[0]}.adapter_config.json"


def adapter_config_json(peft_identity: dict[str, Any], task: str) -> str:
    """The adapter config the export writes (from a study's identity, :meth:`PeftSpec.identity`): the
    study's ``LoraConfig`` keys, with the task type the trials trained with."""
    config = dict(peft_identity["adapter_config"])
    if "task_type" not in config and _TASK_TYPES.get(task):
        config["task_type"] = _TASK_TYPES[task]
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def export_note(peft_identity: dict[str, Any], adapter_path: str | None, adapter_json: str = "") -> str:
    """How a training script applies the study's adapters (said beside the exported arguments): from the
    file written at ``adapter_path``, or, where none was written beside the export (standard output, a
    device), from the config itself (``adapter_json``, :func:`adapter_config_json`)."""
    load = ""
    if peft_identity.get("quantize"):
        load = (
            "load the base 4-bit: from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
            "bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.bfloat16)); then "
        )
    if adapter_path is None:
        config = json.dumps(json.loads(adapter_json), sort_keys=True) if adapter_json else "{...}"
        return (
            f"the winner trained LoRA adapters (not written to a file beside this export; export to a file for "
            f"one): {load}model = peft.get_peft_model(model, peft.LoraConfig(**{config})) before Trainer(model=model, ...)"
        )
    return (
        f"the winner trained LoRA adapters ({adapter_path}): {load}"
        f"model = peft.get_peft_model(model, peft.LoraConfig(**json.load(open({adapter_path!r})))) before Trainer(model=model, ...)"
    )
