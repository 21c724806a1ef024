"""The ``compile`` lever: ``torch.compile`` through the Trainer, its backend and its mode."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import same_names
from autotune.levers._hooks import SpeedTraits
from autotune.levers._lever import Lever

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

# ``compile`` choices name a backend, or the inductor backend with a mode: ``inductor:max-autotune``.
# A mode is an inductor setting (torch.compile's ``mode`` argument), so one knob carries both: no
# trial is spent on "off" with a mode, or on a mode a backend ignores.
COMPILE_MODE_SEPARATOR = ":"
COMPILE_BACKENDS = ("off", "inductor", "aot_eager", "eager", "cudagraphs")
# torch.compile's modes (torch/__init__.py: compile, and torch._inductor.list_mode_options); they are
# inductor settings, written ``inductor:<mode>`` in a space. ``reduce-overhead`` and ``max-autotune``
# capture CUDA graphs; ``max-autotune-no-cudagraphs`` autotunes kernels without them.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")
COMPILE_CHOICES = COMPILE_BACKENDS + tuple(f"inductor{COMPILE_MODE_SEPARATOR}{mode}" for mode in COMPILE_MODES)


def split_compile(value: str) -> tuple[str | None, str | None]:
    """``"inductor:max-autotune"`` -> ``("inductor", "max-autotune")``; ``"off"`` -> ``(None, None)``."""
    if value == "off":
        return None, None
    backend, _, mode = value.partition(COMPILE_MODE_SEPARATOR)
    return backend, mode or None


def _to_training_args(value: str) -> dict[str, Any]:
    backend, mode = split_compile(value)
    kwargs: dict[str, Any] = {}
    if backend is not None:
        kwargs.update(torch_compile=True, torch_compile_backend=backend)
    if mode is not None:
        kwargs["torch_compile_mode"] = mode
    return kwargs


def _from_training_args(args: Mapping[str, Any]) -> str:
    # TrainingArguments turns torch_compile on when a backend or a mode is given.
    compiled = args.get("torch_compile") or args.get("torch_compile_backend") or args.get("torch_compile_mode")
    if not compiled:
        return "off"
    backend = str(args.get("torch_compile_backend") or "inductor")
    mode = args.get("torch_compile_mode")
    return f"{backend}{COMPILE_MODE_SEPARATOR}{mode}" if mode else backend


# ``compile: auto``: no compile, inductor, and inductor's CUDA-graph modes (the device filter drops
# those where there is no CUDA device, and leaves out what is slow there: ``_slow_on``).
AUTO_COMPILE_CHOICES = ("off", "inductor", "inductor:reduce-overhead", "inductor:max-autotune")


def _slow_on(value: str, device: DeviceSpec) -> str:
    """On a CPU, inductor writes and compiles C++ for every new shape, and a trial's micro-batch is a
    new shape: its warm-up took 40 s of a 57 s bert-tiny trial at micro-batch 64 on a 2-core CPU
    (6 s from inductor's cache, which a new micro-batch misses), more than the trial's measurement,
    and compiled trials measured no faster there (docs/benchmarks.md, "Time to the answer")."""
    if device.kind == "cpu" and value != "off":
        return "on a CPU, inductor generates and compiles C++ for every new shape: about a minute of warm-up per trial on a few cores, more than the trial's measurement"
    return ""


def _unavailable_on(value: str, device: DeviceSpec) -> str:
    if value == "cudagraphs" and device.kind != "cuda":
        return "it needs a CUDA device"
    if split_compile(value)[1] in CUDAGRAPH_COMPILE_MODES and device.kind != "cuda":
        # torch/_inductor/cudagraph_utils.py skips CUDA graphs for CPU tensors: such a trial would
        # measure the default mode under another name.
        return "its CUDA graphs need a CUDA device"
    return ""


def _speed(value: str, traits: SpeedTraits) -> SpeedTraits:
    """Inductor fuses the model's elementwise chains into fewer kernels (the aot_eager / eager backends
    run the same ops as eager); its CUDA-graph modes replay the step's launches as one graph."""
    backend, mode = split_compile(value)
    return dataclasses.replace(traits, fuses_elementwise=backend == "inductor", graphs=mode in CUDAGRAPH_COMPILE_MODES)


# Dynamic shapes from the first step, for a compiled trial whose batches vary in length (TRL's padding_free
# or bfd rows, its padding to each batch's longest, the Trainer's ``padding: longest`` / ``padding_free``).
# transformers builds accelerate's compile plugin with ``dynamic=None`` (transformers/trainer.py ~796-800),
# so dynamo compiles the first batch's length as a constant and compiles again, the length dynamic, at the
# next distinct one ("automatic dynamic shapes"): a recompile after warm-up in every such trial, and a
# static graph wasted. With ``dynamic=None`` the plugin reads this variable (accelerate/utils/dataclasses.py
# ~1107, TorchDynamoPlugin.__post_init__): ``torch.compile(dynamic=True)``, every input dimension symbolic
# from the first trace (sizes 0 and 1 still specialised: torch/_dynamo/config.py
# ``specialize_int``/``assume_static_by_default``). TrainingArguments has no field for it, so the user's
# run needs the same variable: the export writes it (autotune.views.export).
DYNAMIC_SHAPES_ENVIRONMENT = {"ACCELERATE_DYNAMO_USE_DYNAMIC": "true"}


def compile_environment(compiled_as: str | None, batches_vary: bool) -> dict[str, str]:
    """The environment a trial compiled as ``compiled_as`` (``None``: not compiled) trains in, so that it
    compiles once: dynamic shapes where its batches vary in length (:data:`DYNAMIC_SHAPES_ENVIRONMENT`)."""
    return dict(DYNAMIC_SHAPES_ENVIRONMENT) if compiled_as is not None and batches_vary else {}


COMPILE = Lever(
    name="compile",
    value_type=str,
    default="off",
    doc="off, a torch.compile backend, or inductor:<mode>; auto: off, inductor and its CUDA-graph modes where they pay",
    choices=COMPILE_CHOICES,
    auto_choices=lambda device: list(AUTO_COMPILE_CHOICES),
    absent_means_auto=False,
    fields=("torch_compile", "torch_compile_backend", "torch_compile_mode"),
    tool_keys={
        tool: same_names("torch_compile", "torch_compile_backend", "torch_compile_mode")
        for tool in ("axolotl", "llama-factory")
    },
    to_training_args=_to_training_args,
    from_training_args=_from_training_args,
    label=lambda value: f"compile={value}" if value != "off" else "",
    unavailable_on=_unavailable_on,
    slow_on=_slow_on,
    speed=_speed,
    # Compilation costs minutes of warm-up per trial: the search decides whether it pays.
    best_practice=lambda device, choices: ["off"],
)
