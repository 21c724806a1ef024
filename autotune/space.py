"""Search spaces: YAML -> validated knobs -> Optuna distributions, filtered to what the device runs."""

from __future__ import annotations

import dataclasses
import importlib.util
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from autotune.config import DTYPES
from autotune.devices import DeviceSpec
from autotune.errors import AutotuneError

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


def default_space_path() -> str:
    return str(resources.files("autotune.spaces").joinpath("default.yaml"))


def load_space(path: str | None, device: DeviceSpec) -> SearchSpace:
    """Read, validate and device-filter a search space.

    Raises:
        AutotuneError: Unreadable or invalid YAML, or nothing left that the device can run.
    """
    path = path or default_space_path()
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise AutotuneError(f"--space {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise AutotuneError(f"--space {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise AutotuneError(f"--space {path}: expected a mapping of knob -> list of choices")
    try:
        parsed = SpaceFile.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        knob = ".".join(str(p) for p in error["loc"])
        message = "unknown knob (see search_spaces/README.md)" if error["type"] == "extra_forbidden" else error["msg"]
        raise AutotuneError(f"--space {path}: {knob}: {message.removeprefix('Value error, ')}") from None
    return filter_for_device(parsed, device, source=path)


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
    for name, values in parsed.model_dump().items():
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
    if knob == "attn_implementation" and value == "flash_attention_2":
        if device.kind != "cuda" or importlib.util.find_spec("flash_attn") is None:
            notes.append("attn_implementation flash_attention_2 removed: it needs a CUDA device and the flash-attn package")
            return False
    return True
