"""Search spaces: YAML -> validated knobs -> Optuna distributions, filtered to what the device runs."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from importlib import resources
from typing import Any

import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

from autotune.config import (
    BATCH_LIMIT_KNOBS,
    DTYPES,
    FLASH_ATTENTIONS,
    KNOB_FIELDS,
    PADDINGS,
    TrialConfig,
    knob_values_from_base_args,
    split_compile,
)
from autotune.devices import DeviceSpec
from autotune.errors import AutotuneError
from autotune.models import ModelSpec

OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "adafactor", "adamw_bnb_8bit", "paged_adamw_8bit",
    "adamw_8bit", "lion_8bit", "sgd", "adagrad", "rmsprop",
)
COMPILE_BACKENDS = ("off", "inductor", "aot_eager", "eager", "cudagraphs")
# torch.compile's modes (torch/__init__.py: compile, and torch._inductor.list_mode_options); they are
# inductor settings, written ``inductor:<mode>`` in a space. ``reduce-overhead`` and ``max-autotune``
# capture CUDA graphs; ``max-autotune-no-cudagraphs`` autotunes kernels without them.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")
COMPILE_CHOICES = COMPILE_BACKENDS + tuple(f"inductor:{mode}" for mode in COMPILE_MODES)
# What transformers 5 offers for training (transformers/modeling_utils.py: AttentionInterface
# ._global_mapping, plus "eager"; "paged|eager" serves generation only). The installed version is
# checked against this list in tests/test_levers.py.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# The package each flash implementation imports (transformers/utils/import_utils.py:
# is_flash_attn_2_available / is_flash_attn_3_available).
_FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
SAMPLINGS = ("random", "group_by_length")
_BNB_OPTIMIZERS = ("adamw_bnb_8bit", "paged_adamw_8bit", "adamw_8bit", "lion_8bit")


# What a space file may hold. Every trial stores each knob's full list of choices with its params
# (Optuna's CategoricalDistribution, serialised per trial param in the storage), and the sampler walks
# them on every ask: a space of 700k micro-batch choices (a 5 MB file) took 22 s to validate, minutes
# per trial in the parent and a 22 MB database. The default space is far below both bounds.
MAX_SPACE_FILE_BYTES = 64 * 1024
MAX_CHOICES_PER_KNOB = 256


class SpaceFile(BaseModel):
    """The YAML schema: each knob maps to its list of choices (``micro_batch`` also takes ``auto``).

    Choices are strict: YAML's ``true`` is not a batch size of 1, nor ``1`` a boolean.
    """

    model_config = ConfigDict(extra="forbid")

    micro_batch: list[StrictInt] | StrictStr = "auto"
    grad_accum: list[StrictInt] = [1]
    checkpointing: list[StrictBool] = [False]
    dtype: list[StrictStr] = ["fp32"]
    optim: list[StrictStr] = ["adamw_torch"]
    dataloader_workers: list[StrictInt] = [0]
    pin_memory: list[StrictBool] = [True]
    compile: list[StrictStr] = ["off"]
    attn_implementation: list[StrictStr] | None = None
    # The levers below are left out of a space that does not name them (None), like attention.
    liger: list[StrictBool] | None = None
    padding: list[StrictStr] | None = None
    sampling: list[StrictStr] | None = None
    empty_cache_steps: list[StrictInt] | None = None
    # Constraints on micro_batch x grad_accum (not knobs): --global-batch / --max-global-batch override.
    global_batch: StrictInt | None = None
    max_global_batch: StrictInt | None = None

    @field_validator("*")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > MAX_CHOICES_PER_KNOB:
            raise ValueError(f"{len(value)} choices; give at most {MAX_CHOICES_PER_KNOB}")
        return value

    @field_validator("global_batch", "max_global_batch")
    @classmethod
    def _batch_limit(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("must be a positive integer")
        return value

    @field_validator("micro_batch")
    @classmethod
    def _micro_batch(cls, value: list[int] | str) -> list[int] | str:
        if isinstance(value, str):
            if value != "auto":
                raise ValueError("must be a list of batch sizes or 'auto'")
            return value
        return _positive(value)

    @field_validator("grad_accum")
    @classmethod
    def _grad_accum(cls, value: list[int]) -> list[int]:
        return _positive(value)

    @field_validator("dataloader_workers")
    @classmethod
    def _workers(cls, value: list[int]) -> list[int]:
        if not value or any(v < 0 for v in value):
            raise ValueError("needs at least one choice, each >= 0")
        return value

    @field_validator("checkpointing", "pin_memory", "liger")
    @classmethod
    def _non_empty(cls, value: list[bool] | None) -> list[bool] | None:
        if value is not None and not value:
            raise ValueError("needs at least one choice")
        return value

    @field_validator("padding")
    @classmethod
    def _padding(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _among(value, PADDINGS)

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _among(value, SAMPLINGS)

    @field_validator("empty_cache_steps")
    @classmethod
    def _empty_cache_steps(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(v < 0 for v in value)):
            raise ValueError("needs at least one choice, each >= 0 (0: never)")
        return value

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: list[str]) -> list[str]:
        return _among(value, DTYPES)

    @field_validator("optim")
    @classmethod
    def _optim(cls, value: list[str]) -> list[str]:
        return _among(value, OPTIMIZERS)

    @field_validator("compile")
    @classmethod
    def _compile(cls, value: list[str]) -> list[str]:
        return _among(value, COMPILE_CHOICES)

    @field_validator("attn_implementation")
    @classmethod
    def _attn(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _among(value, ATTN_IMPLEMENTATIONS)


def _positive(value: list[int]) -> list[int]:
    if not value or any(v <= 0 for v in value):
        raise ValueError("needs at least one choice, each a positive integer")
    return value


def _among(value: list[str], allowed: tuple[str, ...]) -> list[str]:
    if not value:
        raise ValueError("needs at least one choice")
    unknown = [v for v in value if v not in allowed]
    if unknown:
        raise ValueError(f"unknown choice {unknown[0]!r}; choose from {', '.join(allowed)}")
    return value


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The knobs a study searches: name -> choices, after the device filter.

    Attributes:
        choices: Knob name -> its choices, in the order the YAML gave them.
        notes: What the device filter removed, and why (printed to the user).
        source: The YAML file the space came from.
    """

    choices: dict[str, list[Any]]
    notes: tuple[str, ...] = ()
    source: str = ""

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions for ``study.ask``. Knobs with a single choice are fixed, not searched."""
        return {name: CategoricalDistribution(values) for name, values in self.choices.items()}

    def fixed(self) -> dict[str, Any]:
        return {name: values[0] for name, values in self.choices.items() if len(values) == 1}

    @property
    def size(self) -> int:
        size = 1
        for values in self.choices.values():
            size *= len(values)
        return size

    @property
    def largest_global_batch(self) -> int:
        """The most samples one optimizer step of any config of the space takes."""
        fixed = {name: values[0] for name, values in self.choices.items() if name in BATCH_LIMIT_KNOBS}
        if fixed:
            return max(TrialConfig.from_params({**fixed, "micro_batch": m}).global_batch for m in self.choices["micro_batch"])
        return max(self.choices["micro_batch"]) * max(self.choices["grad_accum"])


def default_space_path() -> str:
    """The default search space's YAML: the repository's ``search_spaces/`` when autotune runs from a
    source tree (``PYTHONPATH=repo``, or an editable install), else the installed package's copy,
    ``autotune.spaces``, which exists only through pyproject's ``package-dir`` mapping."""
    source_tree = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "search_spaces", "default.yaml")
    if os.path.isfile(source_tree):
        return source_tree
    return str(resources.files("autotune.spaces").joinpath("default.yaml"))


def load_space(
    path: str | None,
    device: DeviceSpec,
    *,
    model: ModelSpec | None = None,
    base_args: dict[str, Any] | None = None,
    global_batch: int | None = None,
    max_global_batch: int | None = None,
    real_data: bool = False,
    packing: bool = False,
) -> SearchSpace:
    """Read, validate and filter a search space: device, model, data, batch constraint, base arguments.

    Args:
        path: The YAML file; ``None`` for the default space.
        device: Choices it cannot run are removed, with a note.
        model: If given, attention implementations its architecture lacks are removed.
        base_args: TrainingArguments the user fixed: the knobs they set are fixed to match.
        global_batch: ``--global-batch``: only micro-batch x accumulation = this (overrides the YAML).
        max_global_batch: ``--max-global-batch``: micro-batch x accumulation at most this.
        real_data: ``--dataset`` was given: samples have different lengths.
        packing: ``--packing``: every sample is a full block.

    Raises:
        AutotuneError: Unreadable or invalid YAML, or nothing left that can run.
    """
    path = path or default_space_path()
    raw = yaml_mapping(path)
    try:
        parsed = SpaceFile.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        # loc is (knob, [union branch such as "list[int]"], [index of the choice]): name the knob
        # and the offending choice, not pydantic's path through the type.
        knob = str(error["loc"][0]) if error["loc"] else "(top level)"
        message = "unknown knob (see search_spaces/README.md)" if error["type"] == "extra_forbidden" else error["msg"]
        if isinstance(error["loc"][-1], int):
            message = f"choice {error['input']!r}: {message}"
        raise AutotuneError(f"--space {path}: {knob}: {message.removeprefix('Value error, ')}") from None
    space = filter_for_device(parsed, device, source=path)
    if model is not None:
        space = filter_for_model(space, model)
    space = filter_for_data(space, real_data, packing)
    if global_batch is not None or max_global_batch is not None:
        if global_batch is not None and max_global_batch is not None:
            raise AutotuneError("give --global-batch or --max-global-batch, not both")
        if (global_batch or max_global_batch or 0) <= 0:
            raise AutotuneError("--global-batch and --max-global-batch must be positive integers")
    else:
        global_batch, max_global_batch = parsed.global_batch, parsed.max_global_batch
        if global_batch is not None and max_global_batch is not None:
            raise AutotuneError(f"--space {path}: give global_batch or max_global_batch, not both")
    space = constrain_global_batch(space, global_batch, max_global_batch, base_args)
    space = apply_base_args(space, base_args or {}, device)
    # Last: a dtype fixed by --base-args decides which attention kernels can run.
    notes = list(space.notes)
    choices = filter_combinations(space.choices, notes, source=path)
    return dataclasses.replace(space, choices=choices, notes=tuple(notes))


def yaml_mapping(path: str) -> dict[str, Any]:
    """The space file's YAML mapping, read within :data:`MAX_SPACE_FILE_BYTES`.

    Raises:
        AutotuneError: Unreadable, too large, not UTF-8 text, not valid YAML, or not a mapping.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPACE_FILE_BYTES + 1)
    except OSError as exc:
        raise AutotuneError(f"--space {path}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_SPACE_FILE_BYTES:
        raise AutotuneError(f"--space {path}: larger than {MAX_SPACE_FILE_BYTES // 1024} KiB; a space lists a few choices per knob")
    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise AutotuneError(f"--space {path}: not a text file (UTF-8 YAML expected)") from None
    except yaml.YAMLError as exc:
        raise AutotuneError(f"--space {path}: not valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(raw, dict):
        raise AutotuneError(f"--space {path}: expected a mapping of knob -> list of choices")
    return raw


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What the YAML parser found wrong, and where (line and column, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def auto_micro_batches(device: DeviceSpec) -> list[int]:
    """Multiples of 8 (tensor cores want 8-aligned dims for fp16/bf16, per NVIDIA's deep learning
    performance guide); from 64 up, multiples of 64 on Ampere and newer, whose guide prefers 128-byte
    (64-element) alignment.
    """
    small = [8, 16, 24, 32, 48]
    if device.kind == "cuda" and (device.compute_capability or (0, 0)) >= (8, 0):
        return small + [64, 128, 192, 256, 384, 512]
    return small + [64, 96, 128, 192, 256]


def filter_for_device(parsed: SpaceFile, device: DeviceSpec, source: str = "") -> SearchSpace:
    """Remove choices the device cannot run, with a note for each; fail if a knob is left empty."""
    notes: list[str] = []
    choices: dict[str, list[Any]] = {}
    for name, values in parsed.model_dump(exclude={"global_batch", "max_global_batch"}).items():
        if values is None:
            continue
        if name == "micro_batch" and values == "auto":
            values = auto_micro_batches(device)
        if name == "pin_memory" and device.kind == "cpu" and True in values:
            notes.append("pin_memory true dropped: pinning only speeds up copies to a GPU")
            values = [False]
        kept = [v for v in values if _runs_on(name, v, device, notes)]
        if not kept:
            raise AutotuneError(
                f"search space {source}: no choice of {name} runs on {device.label} ({'; '.join(notes)}); add one that does"
            )
        choices[name] = kept
    for value in choices["micro_batch"]:
        if value % 8:
            notes.append(f"micro_batch {value} is not a multiple of 8: tensor cores may run it slower")
            break
    return SearchSpace(choices=choices, notes=tuple(notes), source=source)


def _runs_on(knob: str, value: Any, device: DeviceSpec, notes: list[str]) -> bool:
    if knob == "dtype" and value not in device.supported_dtypes:
        notes.append(f"dtype {value} removed: {device.label} ({device.name}) does not support it")
        return False
    if knob == "optim" and value in _BNB_OPTIMIZERS and importlib.util.find_spec("bitsandbytes") is None:
        notes.append(f"optim {value} removed: bitsandbytes is not installed (pip install 'autotune[bnb]')")
        return False
    if knob == "optim" and value == "adamw_torch_fused" and device.kind == "cpu":
        return True  # torch >= 2.4 has a fused CPU AdamW
    if knob == "compile" and value == "cudagraphs" and device.kind != "cuda":
        notes.append("compile cudagraphs removed: it needs a CUDA device")
        return False
    if knob == "compile" and split_compile(value)[1] in CUDAGRAPH_COMPILE_MODES and device.kind != "cuda":
        # torch/_inductor/cudagraph_utils.py skips CUDA graphs for CPU tensors: such a trial would
        # measure the default mode under another name.
        notes.append(f"compile {value} removed: its CUDA graphs need a CUDA device")
        return False
    if knob == "attn_implementation":
        return _attention_runs_on(value, device, notes)
    if knob == "liger" and value:
        return _liger_runs_on(device, notes)
    if knob == "empty_cache_steps" and value and device.kind == "cpu":
        # transformers/trainer.py calls accelerate/utils/memory.py: clear_device_cache, which empties
        # accelerator caches only: on the CPU the trial would measure 0 under another name.
        notes.append(f"empty_cache_steps {value} removed: emptying the cache frees accelerator memory only")
        return False
    return True


def _attention_runs_on(value: str, device: DeviceSpec, notes: list[str]) -> bool:
    """Flash kernels need CUDA and their package (FlashAttention 3: Hopper); flex attention a GPU."""
    if value == "flash_attention_2":
        reason = flash_attention_2_unavailable(device)
        if reason:
            notes.append(f"attn_implementation flash_attention_2 removed: {reason}")
            return False
    elif value in FLASH_ATTENTIONS:
        package = _FLASH_PACKAGES[value]
        if device.kind != "cuda" or importlib.util.find_spec(package) is None:
            notes.append(f"attn_implementation {value} removed: it needs a CUDA device and the {package} package")
            return False
        if value == "flash_attention_3" and (device.compute_capability or (0, 0)) < (9, 0):
            notes.append(f"attn_implementation {value} removed: FlashAttention 3 runs on Hopper (compute capability 9.0) and newer")
            return False
    if value == "flex_attention" and device.kind != "cuda":
        # transformers/integrations/flex_attention.py compiles flex_attention; its fused kernels are
        # generated for GPUs, and on the CPU the training backward is not fused.
        notes.append("attn_implementation flex_attention removed: its compiled kernels need a CUDA device")
        return False
    return True


def _liger_runs_on(device: DeviceSpec, notes: list[str]) -> bool:
    """Liger's kernels are Triton kernels: a CUDA device and the liger-kernel package."""
    if device.kind != "cuda":
        notes.append("liger true removed: Liger's Triton kernels need a CUDA device")
        return False
    if importlib.util.find_spec("liger_kernel") is None:
        notes.append("liger true removed: the liger-kernel package is not installed (pip install liger-kernel)")
        return False
    return True


def filter_combinations(choices: dict[str, list[Any]], notes: list[str], source: str = "") -> dict[str, list[Any]]:
    """Remove a choice that cannot run with some choice of another knob, with a note.

    Optuna samples knobs independently, so a pair that cannot run would become a failed trial; the
    choice is removed instead, and the note says which space would search it. FlashAttention
    computes in fp16/bf16 only: transformers/integrations/flash_attention.py (get_target_dtype)
    casts fp32 queries to the autocast dtype, and without autocast (fp32, tf32) to the weights'
    fp32, which the flash kernels reject. It stays only where every dtype choice is 16-bit.
    """
    attention = choices.get("attn_implementation")
    full_precision = [d for d in choices.get("dtype", []) if d in ("fp32", "tf32")]
    if attention and full_precision:
        flash = [a for a in attention if a in FLASH_ATTENTIONS]
        for value in flash:
            notes.append(
                f"attn_implementation {value} removed: it computes in fp16/bf16 only, and dtype offers "
                f"{', '.join(full_precision)}; search it in a space whose dtypes are fp16/bf16"
            )
        kept = [a for a in attention if a not in flash]
        if not kept:
            raise AutotuneError(
                f"search space {source}: attn_implementation {', '.join(flash)} cannot run with dtype "
                f"{', '.join(full_precision)}; add sdpa, or remove fp32/tf32"
            )
        choices = {**choices, "attn_implementation": kept}
    return choices


def flash_attention_2_unavailable(device: DeviceSpec) -> str | None:
    """Why ``flash_attention_2`` cannot run on ``device`` here; ``None`` where it can.

    flash-attn 2 runs on Ampere and newer GPUs only (its README: "Ampere, Ada, or Hopper GPUs"), and
    its CUDA extension is compiled against one torch: a wheel built for another raises ImportError
    ("undefined symbol") on import, which transformers' ``is_flash_attn_2_available`` (a package
    look-up, transformers/utils/import_utils.py) does not catch. So the package is imported here.
    """
    if device.kind != "cuda":
        return "it needs a CUDA device"
    if device.compute_capability is not None and device.compute_capability < (8, 0):
        return f"flash-attn 2 needs an Ampere or newer GPU; {device.name} is compute capability {device.compute_capability[0]}.{device.compute_capability[1]}"
    return _flash_attn_import_error()


@functools.lru_cache(maxsize=1)
def _flash_attn_import_error() -> str | None:
    if importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed"
    try:
        importlib.import_module("flash_attn")
    except Exception as exc:  # noqa: BLE001 - ImportError/OSError of an extension built for another torch
        return f"flash_attn does not import against the installed torch ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def filter_for_model(space: SearchSpace, model: ModelSpec) -> SearchSpace:
    """Remove attention implementations the model's architecture does not have, with a note each
    (then the levers the model cannot use: :func:`filter_levers_for_model`).

    Asks transformers itself: the model is built on the meta device (no memory) with each
    implementation, which runs the same check as ``from_pretrained(attn_implementation=...)``.
    """
    if "attn_implementation" not in space.choices:
        return filter_levers_for_model(space, model)
    notes = list(space.notes)
    kept = []
    for implementation in space.choices["attn_implementation"]:
        reason = _attention_unsupported(model, implementation)
        if reason:
            notes.append(f"attn_implementation {implementation} removed: {reason}")
        else:
            kept.append(implementation)
    if not kept:
        raise AutotuneError(
            f"search space {space.source}: {model.name} supports none of attn_implementation "
            f"{space.choices['attn_implementation']} ({'; '.join(notes)}); add eager"
        )
    space = dataclasses.replace(space, choices={**space.choices, "attn_implementation": kept}, notes=tuple(notes))
    return filter_levers_for_model(space, model)


def filter_levers_for_model(space: SearchSpace, model: ModelSpec) -> SearchSpace:
    """Remove padding-free batches and Liger where the model cannot use them, with a note each."""
    notes = list(space.notes)
    choices = dict(space.choices)
    if "padding_free" in choices.get("padding", []):
        reason = padding_free_unsupported(model, choices.get("attn_implementation") or [None])
        if reason:
            notes.append(f"padding padding_free removed: {reason}")
            choices["padding"] = [p for p in choices["padding"] if p != "padding_free"] or ["max_length"]
    if True in choices.get("liger", []):
        reason = liger_unsupported(model)
        if reason:
            notes.append(f"liger true removed: {reason}")
            choices["liger"] = [v for v in choices["liger"] if not v] or [False]
    return dataclasses.replace(space, choices=choices, notes=tuple(notes))


def padding_free_unsupported(model: ModelSpec, attention: list[str | None]) -> str:
    """Why the model cannot train on flattened batches with every one of these attention choices; '' if it can.

    ``DataCollatorWithFlattening`` (transformers/data/data_collator.py) puts a batch's samples in one
    row with ``position_ids`` restarting at each sample, and no attention mask. Two things keep the
    samples apart: the flash kernels (varlen, from the position ids), or the causal mask, which
    transformers/masking_utils.py builds block-diagonal from the position ids
    (``_preprocess_mask_arguments`` -> ``find_packed_sequence_indices``) for every implementation.
    The bidirectional mask of encoders (``create_bidirectional_mask``) ignores them: a BERT would
    attend across samples. Classification heads take one label per sample, which the flattened
    row no longer has.
    """
    if model.task == "sequence-classification":
        return "a classification head needs one row per sample"
    if model.task == "causal-lm":
        return ""
    others = sorted({a or "the model's default" for a in attention if a not in FLASH_ATTENTIONS})
    if others:
        return (
            f"{model.name} is an encoder: under {', '.join(others)} attention its samples would attend to each "
            "other in a flattened row (only flash attention keeps them apart)"
        )
    return ""


def liger_unsupported(model: ModelSpec) -> str:
    """Why Liger's kernels would not patch this model; '' if they would.

    liger_kernel/transformers/monkey_patch.py (``_apply_liger_kernel_to_instance``) patches the model
    types of its ``MODEL_TYPE_TO_APPLY_LIGER_FN`` table and only logs for any other: the trial would
    measure the plain model under another name. Read from the installed package.
    """
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        return "the liger-kernel package is not installed (pip install liger-kernel)"
    model_type = str(model.config.get("model_type", ""))
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return f"Liger has no kernels for model type {model_type!r}"
    return ""


def filter_for_data(space: SearchSpace, real_data: bool, packing: bool) -> SearchSpace:
    """Remove the padding levers where every sample is full (synthetic tokens, ``--packing``), with a note.

    Padding and length grouping only change batches of samples of different lengths: without
    ``--dataset`` or with ``--packing`` every sample is ``--seq-len`` tokens, and such a trial would
    measure ``max_length`` / ``random`` under another name.
    """
    why = "--packing fills every sample" if packing else "synthetic tokens have no padding (use --dataset)"
    if real_data and not packing:
        return space
    notes = list(space.notes)
    choices = dict(space.choices)
    for knob, plain in (("padding", "max_length"), ("sampling", "random")):
        dropped = [v for v in choices.get(knob, []) if v != plain]
        notes.extend(f"{knob} {value} removed: {why}" for value in dropped)
        if dropped:
            choices[knob] = [plain]
    return dataclasses.replace(space, choices=choices, notes=tuple(notes))


def _attention_unsupported(model: ModelSpec, implementation: str) -> str:
    """Why ``model`` cannot be built with ``implementation`` (first line of transformers' error); '' if it can."""
    import torch

    from autotune.models import build_model

    try:
        with torch.device("meta"):
            build_model(model.config, model.task, implementation)
    except (ValueError, ImportError) as exc:
        return str(exc).strip().splitlines()[0][:200]
    return ""


def constrain_global_batch(
    space: SearchSpace,
    global_batch: int | None = None,
    max_global_batch: int | None = None,
    base_args: dict[str, Any] | None = None,
) -> SearchSpace:
    """Search only micro-batches whose accumulation a global-batch constraint can derive.

    Optuna samples knobs independently and cannot change a knob's choices between trials, so under
    a constraint accumulation is not searched: ``grad_accum`` leaves the space and the constraint
    enters it as a fixed knob, from which :meth:`TrialConfig.from_params` derives the accumulation,
    ``limit // micro_batch``. The constraint is then recorded with every trial and in the stored
    space (a study resumed with another one is refused), and no trial is spent on a forbidden pair.

    * ``global_batch`` N: the micro_batch choices that divide N; accumulation N / micro-batch.
    * ``max_global_batch`` M: the micro_batch choices up to M; accumulation the most that stays
      within M, ``M // micro_batch``, whatever the grad_accum choices were (more accumulation
      amortises the optimizer step over more samples and leaves activation memory alone, so the
      other pairs under the cap are not worth a trial). Where accumulation is not searched (one
      grad_accum choice) it stays, and the cap only removes micro-batches it would push over M.

    A micro-batch or accumulation fixed in ``base_args`` is the only one considered.

    Raises:
        AutotuneError: No micro-batch meets the constraint (the message says what would).
    """
    if global_batch is None and max_global_batch is None:
        return space
    fixed = knob_values_from_base_args(base_args or {})
    micro = [fixed["micro_batch"]] if "micro_batch" in fixed else space.choices["micro_batch"]
    by_base = " (fixed by --base-args)" if {"micro_batch", "grad_accum"} & fixed.keys() else ""
    choices = {k: v for k, v in space.choices.items() if k != "grad_accum"}
    notes = list(space.notes)
    if global_batch is not None:
        if "grad_accum" in fixed:
            micro = [global_batch // fixed["grad_accum"]] if global_batch % fixed["grad_accum"] == 0 else []
            micro = [m for m in micro if "micro_batch" not in fixed or m == fixed["micro_batch"]]
        kept = [m for m in micro if global_batch % m == 0]
        if not kept:
            divisors = [d for d in range(1, global_batch + 1) if global_batch % d == 0][:16]
            raise AutotuneError(
                f"global batch {global_batch}: no micro_batch{by_base} {_list(micro)} divides it into whole "
                f"accumulation steps; use micro-batches among its divisors {_list(divisors)}"
            )
        note = f"global batch {global_batch}: grad_accum = {global_batch} / micro_batch, not searched"
        dropped = [m for m in micro if m not in kept]
        if dropped:
            note += f"; micro_batch {_list(dropped)} removed (they do not divide {global_batch})"
        notes.append(note + by_base)
        choices.update(micro_batch=kept, global_batch=[global_batch])
    else:
        assert max_global_batch is not None
        accum = [fixed["grad_accum"]] if "grad_accum" in fixed else space.choices["grad_accum"]
        # A searched accumulation is derived (at least 1); a fixed one stays, so it counts.
        least_accum = accum[0] if len(accum) == 1 else 1
        kept = [m for m in micro if m * least_accum <= max_global_batch]
        if not kept:
            raise AutotuneError(
                f"max global batch {max_global_batch}: even micro_batch {min(micro)} x grad_accum {least_accum}{by_base} "
                "is over it; add smaller micro_batch choices or raise the cap"
            )
        dropped = [m for m in micro if m not in kept]
        removed = f"; micro_batch {_list(dropped)} removed" if dropped else ""
        if len(accum) == 1:
            notes.append(f"max global batch {max_global_batch}: grad_accum stays {accum[0]}{by_base}{removed}")
            choices.update(micro_batch=kept, grad_accum=accum)
        else:
            notes.append(
                f"max global batch {max_global_batch}: grad_accum = {max_global_batch} // micro_batch (the most "
                f"that fits), not searched{by_base}{removed}"
            )
            choices.update(micro_batch=kept, max_global_batch=[max_global_batch])
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


def apply_base_args(space: SearchSpace, base_args: dict[str, Any], device: DeviceSpec) -> SearchSpace:
    """Fix every knob a ``--base-args`` field sets, to the value that reproduces that field.

    The user's TrainingArguments win over the search: such a knob keeps one choice (a note says so)
    for which ``training_arguments_kwargs`` writes exactly the user's value, so the trials measure it
    and the export keeps it. Under a global-batch constraint, :func:`constrain_global_batch` has
    already fixed micro-batch and accumulation.

    Raises:
        AutotuneError: The device cannot run a fixed value (bf16 on a GPU without it, ...).
    """
    notes = list(space.notes)
    choices = dict(space.choices)
    constrained = any(limit in choices for limit in BATCH_LIMIT_KNOBS)
    for knob, value in knob_values_from_base_args(base_args).items():
        if knob in ("micro_batch", "grad_accum") and constrained:
            continue
        fields = ", ".join(f for f in KNOB_FIELDS[knob] if f in base_args)
        reasons: list[str] = []
        if not _runs_on(knob, value, device, reasons):
            raise AutotuneError(f"--base-args {fields} asks for {knob} {value!r}, which {device.label} cannot run: {reasons[0]}")
        if choices.get(knob) != [value]:
            searched = len(choices.get(knob, [])) > 1
            notes.append(f"{knob} fixed at {value!r} by --base-args {fields}" + ("; no longer searched" if searched else ""))
        choices[knob] = [value]
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values))
