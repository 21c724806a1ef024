"""A trial's knobs, and the one mapping from knobs to ``TrainingArguments`` keyword arguments.

The runner trains with exactly :func:`training_arguments_kwargs` (plus measurement-only arguments
such as ``max_steps``), and ``autotune export`` writes exactly the same dict: what was measured is
what the user gets.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tempfile
from typing import Any

from autotune.errors import AutotuneError

DTYPES = ("fp32", "tf32", "fp16", "bf16")

# Under a global-batch constraint the space holds one of these as a fixed (single-choice) knob, and
# accumulation is not searched but derived from it: ``limit // micro_batch``. Optuna samples knobs
# independently and cannot change a knob's choices between trials, so deriving one of the pair is
# how every trial gets an allowed product (see space.constrain_global_batch, search_spaces/README.md).
BATCH_LIMIT_KNOBS = ("global_batch", "max_global_batch")

# The TrainingArguments fields each knob writes in training_arguments_kwargs. A --base-args file
# that sets one of them fixes that knob (space.apply_base_args).
KNOB_FIELDS: dict[str, tuple[str, ...]] = {
    "micro_batch": ("per_device_train_batch_size",),
    "grad_accum": ("gradient_accumulation_steps",),
    "checkpointing": ("activation_checkpointing", "gradient_checkpointing"),
    "dtype": ("bf16", "fp16", "tf32"),
    "optim": ("optim",),
    "dataloader_workers": ("dataloader_num_workers",),
    "pin_memory": ("dataloader_pin_memory",),
    "compile": ("torch_compile", "torch_compile_backend", "torch_compile_mode"),
    "liger": ("use_liger_kernel",),
    "sampling": ("train_sampling_strategy",),
    "empty_cache_steps": ("torch_empty_cache_steps",),
}

# ``compile`` choices name a backend, or the inductor backend with a mode: ``inductor:max-autotune``.
# A mode is an inductor setting (torch.compile's ``mode`` argument), so one knob carries both: no
# trial is spent on "off" with a mode, or on a mode a backend ignores.
COMPILE_MODE_SEPARATOR = ":"
# How a batch of the user's data (--dataset) is shaped; not a TrainingArguments field but the
# Trainer's ``data_collator`` (see autotune/data.py: training_collator).
PADDINGS = ("max_length", "longest", "padding_free")
# The FlashAttention implementations transformers offers (modeling_utils.py: AttentionInterface).
FLASH_ATTENTIONS = ("flash_attention_2", "flash_attention_3")


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """One candidate training configuration: the values of every knob.

    Attributes:
        micro_batch: ``per_device_train_batch_size``.
        grad_accum: ``gradient_accumulation_steps``.
        checkpointing: Activation (gradient) checkpointing on or off.
        dtype: ``fp32``, ``tf32`` (fp32 storage, TF32 matmuls), ``fp16`` or ``bf16`` (mixed precision).
        optim: A ``transformers`` optimizer name (``adamw_torch_fused``, ``adafactor``, ...).
        dataloader_workers: ``dataloader_num_workers``.
        pin_memory: ``dataloader_pin_memory``.
        compile: ``off``, or the ``torch.compile`` backend to use (``inductor``, ...).
        attn_implementation: ``sdpa``, ``eager``, ``flash_attention_2``; ``None`` keeps the model default.
        liger: ``use_liger_kernel``: Liger's Triton kernels (fused linear cross-entropy, RMSNorm,
            RoPE, SwiGLU) patched into the model by the Trainer.
        padding: How samples of the user's data are batched: ``max_length`` (each padded to
            ``--seq-len``), ``longest`` (to the longest of its batch), ``padding_free`` (the batch
            flattened into one row, ``DataCollatorWithFlattening``). Synthetic tokens have no padding.
        sampling: ``train_sampling_strategy``: ``random``, or ``group_by_length`` (batches of
            similar lengths, so ``longest`` pads less).
        empty_cache_steps: ``torch_empty_cache_steps``: empty the allocator's cache every N
            optimizer steps; 0 never.
    """

    micro_batch: int = 8
    grad_accum: int = 1
    checkpointing: bool = False
    dtype: str = "fp32"
    optim: str = "adamw_torch"
    dataloader_workers: int = 0
    pin_memory: bool = True
    compile: str = "off"
    attn_implementation: str | None = None
    liger: bool = False
    padding: str = "max_length"
    sampling: str = "random"
    empty_cache_steps: int = 0

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step on one device."""
        return self.micro_batch * self.grad_accum

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrialConfig:
        """Build from an Optuna trial's params; knobs the space does not search keep their default.

        Under a ``global_batch`` or ``max_global_batch`` param (:data:`BATCH_LIMIT_KNOBS`), the
        accumulation is derived: the most micro-batches that fit, ``limit // micro_batch``.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in params.items() if k in known}
        for limit in BATCH_LIMIT_KNOBS:
            if limit in params:
                values["grad_accum"] = int(params[limit]) // int(values.get("micro_batch", cls.micro_batch))
        return cls(**values)

    def to_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        """A compact one-line description for tables and logs."""
        parts = [f"mb={self.micro_batch}", f"ga={self.grad_accum}", self.dtype, self.optim]
        if self.checkpointing:
            parts.append("ckpt")
        if self.compile != "off":
            parts.append(f"compile={self.compile}")
        if self.dataloader_workers:
            parts.append(f"workers={self.dataloader_workers}")
        if self.attn_implementation:
            parts.append(f"attn={self.attn_implementation}")
        if self.liger:
            parts.append("liger")
        if self.padding != "max_length":
            parts.append(f"pad={self.padding}")
        if self.sampling != "random":
            parts.append(self.sampling)
        if self.empty_cache_steps:
            parts.append(f"empty_cache={self.empty_cache_steps}")
        return " ".join(parts)

    @property
    def compile_backend_and_mode(self) -> tuple[str | None, str | None]:
        """``compile`` split into (backend, mode): ``(None, None)`` for ``off``."""
        return split_compile(self.compile)


def split_compile(value: str) -> tuple[str | None, str | None]:
    """``"inductor:max-autotune"`` -> ``("inductor", "max-autotune")``; ``"off"`` -> ``(None, None)``."""
    if value == "off":
        return None, None
    backend, _, mode = value.partition(COMPILE_MODE_SEPARATOR)
    return backend, mode or None


def training_arguments_kwargs(
    config: TrialConfig, device_kind: str, base_args: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``TrainingArguments`` keyword arguments a trial config sets: the single mapping.

    Args:
        config: The trial's knobs.
        device_kind: ``cpu`` or ``cuda``: on ``cpu`` the arguments say ``use_cpu=True``.
        base_args: Arguments the user fixed (``--base-args``); knobs win only where the user did not
            fix the same field (conflicts are removed from the search space before this point).

    Returns:
        A dict that ``TrainingArguments(output_dir=..., **kwargs)`` accepts.
    """
    kwargs: dict[str, Any] = dict(base_args or {})
    kwargs.update(
        per_device_train_batch_size=config.micro_batch,
        gradient_accumulation_steps=config.grad_accum,
        optim=config.optim,
        dataloader_num_workers=config.dataloader_workers,
        dataloader_pin_memory=config.pin_memory,
    )
    kwargs[checkpointing_field()] = config.checkpointing
    if config.dtype == "bf16":
        kwargs["bf16"] = True
    elif config.dtype == "fp16":
        kwargs["fp16"] = True
    elif config.dtype == "tf32":
        kwargs["tf32"] = True
    backend, mode = config.compile_backend_and_mode
    if backend is not None:
        kwargs["torch_compile"] = True
        kwargs["torch_compile_backend"] = backend
    if mode is not None:
        kwargs["torch_compile_mode"] = mode
    if config.liger:
        # transformers/trainer.py (Trainer.__init__) calls integrations/liger.py: apply_liger_kernel(model).
        kwargs["use_liger_kernel"] = True
    if config.sampling != "random":
        # transformers/trainer.py: Trainer._get_train_sampler -> trainer_pt_utils.LengthGroupedSampler.
        kwargs["train_sampling_strategy"] = config.sampling
    if config.empty_cache_steps:
        # transformers/trainer.py (training_step) -> accelerate/utils/memory.py: clear_device_cache.
        kwargs["torch_empty_cache_steps"] = config.empty_cache_steps
    if device_kind == "cpu":
        kwargs["use_cpu"] = True
    return kwargs


def knob_values_from_base_args(base_args: dict[str, Any]) -> dict[str, Any]:
    """The knob values that reproduce what ``base_args`` fix: the inverse of the mapping below.

    For every knob one of whose :data:`KNOB_FIELDS` the user set, the value for which
    :func:`training_arguments_kwargs` writes the same arguments (the user's other fields pass
    through unchanged). Knobs the base arguments do not touch are absent.
    """
    values: dict[str, Any] = {}
    if "per_device_train_batch_size" in base_args:
        values["micro_batch"] = int(base_args["per_device_train_batch_size"])
    if "gradient_accumulation_steps" in base_args:
        values["grad_accum"] = int(base_args["gradient_accumulation_steps"])
    for field in KNOB_FIELDS["checkpointing"]:
        if field in base_args:
            values["checkpointing"] = bool(base_args[field])
    if any(field in base_args for field in KNOB_FIELDS["dtype"]):
        # bf16/fp16 are the mixed-precision modes; tf32 alone means fp32 storage with TF32 matmuls.
        set_true = [field for field in ("bf16", "fp16", "tf32") if base_args.get(field)]
        values["dtype"] = set_true[0] if set_true else "fp32"
    if "optim" in base_args:
        values["optim"] = str(base_args["optim"])
    if "dataloader_num_workers" in base_args:
        values["dataloader_workers"] = int(base_args["dataloader_num_workers"])
    if "dataloader_pin_memory" in base_args:
        values["pin_memory"] = bool(base_args["dataloader_pin_memory"])
    if any(field in base_args for field in KNOB_FIELDS["compile"]):
        # TrainingArguments turns torch_compile on when a backend or a mode is given.
        compiled = base_args.get("torch_compile") or base_args.get("torch_compile_backend") or base_args.get("torch_compile_mode")
        backend = str(base_args.get("torch_compile_backend") or "inductor")
        mode = base_args.get("torch_compile_mode")
        values["compile"] = (f"{backend}{COMPILE_MODE_SEPARATOR}{mode}" if mode else backend) if compiled else "off"
    if "use_liger_kernel" in base_args:
        values["liger"] = bool(base_args["use_liger_kernel"])
    if "train_sampling_strategy" in base_args:
        values["sampling"] = str(base_args["train_sampling_strategy"])
    if "torch_empty_cache_steps" in base_args:
        values["empty_cache_steps"] = int(base_args["torch_empty_cache_steps"] or 0)
    return values


# Fields autotune decides itself; a --base-args file may not set them.
REFUSED_BASE_FIELDS = {
    "output_dir": "the export leaves it to you: TrainingArguments(output_dir=..., **args)",
    "use_cpu": "autotune sets it from --device / --gpu",
    "auto_find_batch_size": "it shrinks the batch on OOM inside the Trainer; autotune measures batch sizes instead",
}


def load_base_args(path: str) -> dict[str, Any]:
    """Read and check a ``--base-args`` JSON file of TrainingArguments the user fixes.

    Every key must be a ``TrainingArguments`` field, and ``TrainingArguments`` must accept the
    values (checked here, in the parent, so that no trial fails on them).

    Raises:
        AutotuneError: Unreadable or not a JSON object, an unknown or refused field, or a value
            ``TrainingArguments`` rejects; one line naming the field.
    """
    from transformers import TrainingArguments

    try:
        with open(path) as f:
            base_args = json.load(f)
    except OSError as exc:
        raise AutotuneError(f"--base-args {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise AutotuneError(f"--base-args {path}: not a text file (UTF-8 JSON expected)") from None
    except json.JSONDecodeError as exc:
        raise AutotuneError(f"--base-args {path}: not valid JSON ({exc})") from None
    if not isinstance(base_args, dict):
        raise AutotuneError(f"--base-args {path}: expected a JSON object of TrainingArguments fields")
    fields = [f.name for f in dataclasses.fields(TrainingArguments) if f.init]
    for key in base_args:
        if key in REFUSED_BASE_FIELDS:
            raise AutotuneError(f"--base-args {path}: remove {key}: {REFUSED_BASE_FIELDS[key]}")
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            if key == "attn_implementation":
                hint = " (it is a model argument: search it with attn_implementation in the --space YAML)"
            raise AutotuneError(f"--base-args {path}: {key} is not a TrainingArguments field{hint}")
    check_base_arg_types(path, base_args)
    check_base_arg_knobs(path, base_args)
    # The dtype fields are knobs the device filter checks; TrainingArguments would judge them
    # against this (CPU) process rather than the device the trials run on.
    checked = {k: v for k, v in base_args.items() if k not in KNOB_FIELDS["dtype"]}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            TrainingArguments(output_dir=scratch, use_cpu=True, **checked)
        except (ValueError, TypeError, ImportError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise AutotuneError(f"--base-args {path}: TrainingArguments rejects them: {reason[:300]}") from None
    return base_args


def check_base_arg_types(path: str, base_args: dict[str, Any]) -> None:
    """Each value has the type ``TrainingArguments`` declares for its field (``learning_rate: float``, ...).

    ``TrainingArguments`` is a dataclass and does not check types itself: ``"fast"`` as a learning
    rate passes its ``__init__`` and fails every trial inside the optimizer. Its own annotations,
    validated strictly by pydantic, are the source of truth (no list kept here).

    Raises:
        AutotuneError: The first value of the wrong type, with the type expected.
    """
    import typing

    from pydantic import TypeAdapter, ValidationError
    from transformers import TrainingArguments

    hints = typing.get_type_hints(TrainingArguments)
    for key, value in base_args.items():
        try:
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as exc:
            expected = getattr(hints[key], "__name__", None) or str(hints[key]).replace("typing.", "")
            reason = exc.errors()[0]["msg"]
            raise AutotuneError(f"--base-args {path}: {key} {value!r}: {reason} ({expected})") from None


def check_base_arg_knobs(path: str, base_args: dict[str, Any]) -> None:
    """Values that ``TrainingArguments`` accepts but with which no trial can train.

    A zero batch or accumulation passes ``TrainingArguments`` and fails in the Trainer; ``bf16`` and
    ``fp16`` together are refused by ``TrainingArguments.__post_init__`` (transformers
    ``training_args.py``: "At most one of fp16 and bf16 can be True"), whose dtype checks
    :func:`load_base_args` skips because they judge the parent's device, not the trials'.

    Raises:
        AutotuneError: The first such value, naming the field.
    """
    for field, least in (("per_device_train_batch_size", 1), ("gradient_accumulation_steps", 1), ("dataloader_num_workers", 0)):
        if field in base_args and base_args[field] < least:
            raise AutotuneError(f"--base-args {path}: {field} {base_args[field]}: give {least} or more")
    if base_args.get("bf16") and base_args.get("fp16"):
        raise AutotuneError(f"--base-args {path}: bf16 and fp16 are both true: keep one (or leave both out to search dtype)")


def checkpointing_field() -> str:
    """``activation_checkpointing`` in transformers 5 (``gradient_checkpointing`` is its deprecated alias)."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
