"""The ``optim`` lever: the optimizer, by its ``transformers`` name, and the state it keeps."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import same, same_names
from autotune.levers._hooks import SpeedTraits
from autotune.levers._lever import Lever

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

OPTIMIZERS = (
    "adamw_torch",
    "adamw_torch_fused",
    "adafactor",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "adamw_8bit",
    "lion_8bit",
    "sgd",
    "adagrad",
    "rmsprop",
)
# The optimizers bitsandbytes implements (transformers/trainer_optimizer.py imports bnb for them).
BNB_OPTIMIZERS = ("adamw_bnb_8bit", "paged_adamw_8bit", "adamw_8bit", "lion_8bit")
# Optimizer state bytes per parameter, for parameters in a matrix of >= 4096 elements (docs/facts.md;
# transformers' trainer_optimizer.py for which states each HF optimizer name creates). Adafactor's
# factored state is counted by shape (autotune.estimate: adafactor_state_elements).
STATE_BYTES_PER_PARAM = {
    "adamw_torch": 8.0,  # exp_avg + exp_avg_sq, fp32
    "adamw_torch_fused": 8.0,
    "adamw_bnb_8bit": 2.0,  # two 8-bit states (block-wise quantisation adds ~1 %)
    "adamw_8bit": 2.0,
    "paged_adamw_8bit": 2.0,
    "lion_8bit": 1.0,  # one 8-bit momentum
    "sgd": 0.0,  # HF's "sgd" is torch.optim.SGD with momentum 0 unless --optim_args sets it
    "adagrad": 4.0,  # state_sum
    "rmsprop": 4.0,  # square_avg
}

# Optimizers whose states are made like the parameter (``torch.zeros_like(p)`` in torch/optim/adamw.py,
# adagrad.py, rmsprop.py, sgd.py's momentum buffer): in bf16 for bf16 weights, half the bytes above.
# Adafactor (transformers/optimization.py: ``grad = grad.float()``, states ``.to(grad)``) and the
# bitsandbytes optimizers (8-bit states; 32-bit ones in fp32) keep theirs whatever the weights are.
STATES_IN_PARAM_DTYPE = ("adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop")

# Optimizers whose update is the same when every gradient is k times larger, up to their epsilon: they
# divide by a running root mean square of the gradient (AdamW: torch/optim/adamw.py; bitsandbytes'
# 8-bit AdamW; Adafactor: transformers/optimization.py, ``Adafactor.step``, ``grad / sqrt(EMA(grad**2))``;
# Adagrad and RMSprop: torch/optim/adagrad.py, rmsprop.py) or take its sign (Lion), and decay the
# weights apart from it. SGD's update is the gradient times the learning rate.
SCALE_INVARIANT_OPTIMIZERS = tuple(name for name in OPTIMIZERS if name != "sgd")
# Optimizers that add the weight decay to the gradient (torch/optim/adagrad.py, rmsprop.py, sgd.py:
# ``grad.add(param, alpha=weight_decay)``): a k-times gradient then weighs the decay 1/k as much.
COUPLED_WEIGHT_DECAY_OPTIMIZERS = ("adagrad", "rmsprop", "sgd")


# Bytes an optimizer's step reads and writes per fp32 parameter: memory-bound work, which the
# throughput prior divides by the memory bandwidth. Counted from the installed implementations, one
# pass over a parameter-sized fp32 tensor = 4 bytes:
# * adamw_torch: torch/optim/adam.py ``_multi_tensor_adam`` (foreach): mul_ (weight decay) 2, lerp_ 3,
#   mul_ 2, addcmul_ 3, sqrt 2, div_ 2, add_ 2, addcdiv_ 4: 20 passes;
# * adamw_torch_fused: one kernel (``_fused_adamw_``) reads param, grad, exp_avg, exp_avg_sq and writes
#   three of them back: 7 passes;
# * adafactor: transformers/optimization.py ``Adafactor.step``, per matrix: rms(p) 1, grad**2 2, + eps 2,
#   row and column means 2, the factored outer product 1, mul_(grad) 3, rms(update) 1, div_ 2, mul_(lr) 2,
#   -update 2, add_ 3: 21 passes;
# * the bitsandbytes 8-bit optimizers: one kernel reading param and grad (fp32) and two 8-bit states
#   and writing param and states: 16 bytes (lion: one state, 14);
# * sgd (momentum 0, foreach add_): 3 passes; adagrad: addcmul_ 3, sqrt 2, add_ 2, addcdiv_ 4 = 11;
#   rmsprop: mul_ 2 more, 13.
STEP_BYTES_PER_PARAM = {
    "adamw_torch": 80.0,
    "adamw_torch_fused": 28.0,
    "adafactor": 84.0,
    "adamw_bnb_8bit": 16.0,
    "paged_adamw_8bit": 16.0,
    "adamw_8bit": 16.0,
    "lion_8bit": 14.0,
    "sgd": 12.0,
    "adagrad": 44.0,
    "rmsprop": 52.0,
}
# Kernels (on the CPU, ops) an optimizer runs per parameter tensor: Adafactor loops over the parameters
# in Python, about 22 ops each (the step above); the foreach and fused optimizers run each op once over
# every tensor, a launch cost that does not grow with the tensors (0 here).
KERNELS_PER_TENSOR = {"adafactor": 22}


def _speed(value: str, traits: SpeedTraits) -> SpeedTraits:
    return dataclasses.replace(
        traits,
        optimizer_step_bytes=STEP_BYTES_PER_PARAM.get(value, STEP_BYTES_PER_PARAM["adamw_torch"]),
        optimizer_kernels_per_tensor=KERNELS_PER_TENSOR.get(value, 0),
        optimizer_states_in_param_dtype=value in STATES_IN_PARAM_DTYPE,
    )


def update_ignores_gradient_scale(optim: str, weight_decay: float) -> bool:
    """Whether ``optim`` makes the same update from k-times gradients (up to its epsilon), at this weight decay."""
    return optim in SCALE_INVARIANT_OPTIMIZERS and not (weight_decay and optim in COUPLED_WEIGHT_DECAY_OPTIMIZERS)


def optimizer_in(arguments: Mapping[str, Any], training_default: Callable[[str], Any]) -> str:
    """The optimizer TrainingArguments keyword arguments train with (``training_default(field)``, the
    TrainingArguments default, where they name none)."""
    return _from_training_args({"optim": arguments.get("optim", training_default("optim"))})


def _unavailable_on(value: str, device: DeviceSpec) -> str:
    if value in BNB_OPTIMIZERS and importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed (pip install 'autotune[bnb]')"
    return ""  # adamw_torch_fused: torch >= 2.4 has a fused CPU AdamW too


def _from_training_args(args: Mapping[str, Any]) -> str:
    # TrainingArguments keeps its default as an OptimizerNames member (a str enum): its value is the name.
    optim = args["optim"]
    return str(getattr(optim, "value", optim))


OPTIM = Lever(
    name="optim",
    value_type=str,
    default="adamw_torch",
    doc="a transformers optimizer name (TrainingArguments.optim)",
    choices=OPTIMIZERS,
    fields=("optim",),
    tool_keys={"axolotl": {"optim": same("optimizer")}, "llama-factory": same_names("optim")},
    to_training_args=lambda value: {"optim": value},
    from_training_args=_from_training_args,
    label=lambda value: value,
    unavailable_on=_unavailable_on,
    memory_parts=("optimizer states",),
    memory=lambda value, traits: dataclasses.replace(traits, optimizer=value),
    speed=_speed,
    best_practice=lambda device, choices: ["adamw_torch_fused", "adamw_torch"],
    nearest={"adamw_torch_fused": ("adamw_torch",), "adamw_torch": ("adamw_torch_fused",)},
    planner_column="optimizer",
)
