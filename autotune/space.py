"""Search spaces: YAML -> validated knobs -> Optuna distributions, filtered to what the device runs."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from autotune.config import BATCH_LIMIT_KNOBS, DTYPES, KNOB_FIELDS, TrialConfig, knob_values_from_base_args
from autotune.devices import DeviceSpec
from autotune.errors import AutotuneError
from autotune.models import ModelSpec

OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "adafactor", "adamw_bnb_8bit", "paged_adamw_8bit",
    "adamw_8bit", "lion_8bit", "sgd", "adagrad", "rmsprop",
)
COMPILE_BACKENDS = ("off", "inductor", "aot_eager", "eager", "cudagraphs")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
_BNB_OPTIMIZERS = ("adamw_bnb_8bit", "paged_adamw_8bit", "adamw_8bit", "lion_8bit")


class SpaceFile(BaseModel):
    """The YAML schema: each knob maps to its list of choices (``micro_batch`` also takes ``auto``)."""

    model_config = ConfigDict(extra="forbid")

    micro_batch: list[int] | str = "auto"
    grad_accum: list[int] = [1]
    checkpointing: list[bool] = [False]
    dtype: list[str] = ["fp32"]
    optim: list[str] = ["adamw_torch"]
    dataloader_workers: list[int] = [0]
    pin_memory: list[bool] = [True]
    compile: list[str] = ["off"]
    attn_implementation: list[str] | None = None
    # Constraints on micro_batch x grad_accum (not knobs): --global-batch / --max-global-batch override.
    global_batch: int | None = None
    max_global_batch: int | None = None

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

    @field_validator("checkpointing", "pin_memory")
    @classmethod
    def _non_empty(cls, value: list[bool]) -> list[bool]:
        if not value:
            raise ValueError("needs at least one choice")
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
        return _among(value, COMPILE_BACKENDS)

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
    return str(resources.files("autotune.spaces").joinpath("default.yaml"))


def load_space(
    path: str | None,
    device: DeviceSpec,
    *,
    model: ModelSpec | None = None,
    base_args: dict[str, Any] | None = None,
    global_batch: int | None = None,
    max_global_batch: int | None = None,
) -> SearchSpace:
    """Read, validate and filter a search space: device, model, batch constraint, base arguments.

    Args:
        path: The YAML file; ``None`` for the default space.
        device: Choices it cannot run are removed, with a note.
        model: If given, attention implementations its architecture lacks are removed.
        base_args: TrainingArguments the user fixed: the knobs they set are fixed to match.
        global_batch: ``--global-batch``: only micro-batch x accumulation = this (overrides the YAML).
        max_global_batch: ``--max-global-batch``: micro-batch x accumulation at most this.

    Raises:
        AutotuneError: Unreadable or invalid YAML, or nothing left that can run.
    """
    path = path or default_space_path()
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise AutotuneError(f"--space {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise AutotuneError(f"--space {path}: not valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(raw, dict):
        raise AutotuneError(f"--space {path}: expected a mapping of knob -> list of choices")
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
    return apply_base_args(space, base_args or {}, device)


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
    choices = drop_flash_attention_with_fp32(choices, notes)
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
    if knob == "attn_implementation" and value == "flash_attention_2":
        reason = flash_attention_2_unavailable(device)
        if reason:
            notes.append(f"attn_implementation flash_attention_2 removed: {reason}")
            return False
    return True


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


def drop_flash_attention_with_fp32(choices: dict[str, list[Any]], notes: list[str]) -> dict[str, list[Any]]:
    """Remove ``flash_attention_2`` from a space that also searches fp32 or tf32.

    flash-attn's kernels take fp16/bf16 inputs only ("Flash Attention 2 only supports torch.float16
    and torch.bfloat16 dtypes", transformers/modeling_utils.py, ``_flash_attn_can_dispatch``; fp32
    inputs make the kernel raise), and Optuna samples each knob on its own, so a space with both
    would draw fp32 + flash_attention_2 trials that can only fail. Kept where every dtype choice
    is fp16/bf16.
    """
    attention = choices.get("attn_implementation") or []
    full_precision = [d for d in choices.get("dtype", ["fp32"]) if d in ("fp32", "tf32")]
    if "flash_attention_2" not in attention or not full_precision:
        return choices
    kept = [a for a in attention if a != "flash_attention_2"]
    if not kept:
        raise AutotuneError(
            f"attn_implementation [flash_attention_2] runs only in fp16/bf16, but dtype also has {', '.join(full_precision)}: "
            "drop those dtypes or add sdpa"
        )
    notes.append(
        f"attn_implementation flash_attention_2 removed: it runs in fp16/bf16 only and the space also has dtype "
        f"{', '.join(full_precision)} (search it with dtype [fp16, bf16])"
    )
    return {**choices, "attn_implementation": kept}


def filter_for_model(space: SearchSpace, model: ModelSpec) -> SearchSpace:
    """Remove attention implementations the model's architecture does not have, with a note each.

    Asks transformers itself: the model is built on the meta device (no memory) with each
    implementation, which runs the same check as ``from_pretrained(attn_implementation=...)``.
    """
    if "attn_implementation" not in space.choices:
        return space
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
    return dataclasses.replace(space, choices={**space.choices, "attn_implementation": kept}, notes=tuple(notes))


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
