"""The ``zero`` lever: DeepSpeed ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054) through the Trainer.

Each value is one DeepSpeed config dict (:func:`deepspeed_config`, the one place it is written),
handed to the Trainer's own integration as ``TrainingArguments(deepspeed=<dict>)``
(transformers/integrations/deepspeed.py: ``HfTrainerDeepSpeedConfig.trainer_config_process`` fills
the batch, accumulation, clipping, optimizer and bf16/fp16 entries written ``"auto"`` from the
arguments; ``trainer_config_finalize`` the hidden-size-based bucket sizes). The child and the
export both call it, so what is measured is what is exported.

Stage 1 partitions the optimizer states (with DeepSpeed's fp32 master copy) over the trial's ranks,
stage 2 the gradients too, stage 3 the parameters too; ``+offload`` keeps the optimizer states
(and, at stage 3, the parameters) in host memory.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError
from autotune.levers._exports import same_names
from autotune.levers._hooks import MemoryTraits, SpaceMemory
from autotune.levers._lever import Lever
from autotune.spec.files import read_user_file

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

ZERO_CHOICES = ("off", "1", "2", "2+offload", "3", "3+offload")
OFFLOAD_SUFFIX = "+offload"
# The optimizer DeepSpeed builds with offload: its own AdamW, which under ``offload_optimizer``
# becomes DeepSpeedCPUAdam (deepspeed/runtime/engine.py ``_configure_basic_optimizer``). A torch
# optimizer from the Trainer is refused there ("ZeRO-Offload with a client provided optimizer",
# ``zero_force_ds_cpu_optimizer``), so an offload config names ``optim`` adamw_torch only.
OFFLOAD_OPTIM = "adamw_torch"


def zero_stage(value: str) -> int:
    """The ZeRO stage of a value: 0 for ``off``."""
    return 0 if value == "off" else int(value.removesuffix(OFFLOAD_SUFFIX))


def zero_offloads(value: str) -> bool:
    """Whether the value keeps optimizer states (and at stage 3 the parameters) in host memory."""
    return value.endswith(OFFLOAD_SUFFIX)


def deepspeed_config(value: str) -> dict[str, Any] | None:
    """The DeepSpeed config of a ``zero`` value (``None`` for ``off``): the one home of its keys.

    ``"auto"`` where the Trainer fills the value (transformers/integrations/deepspeed.py,
    ``trainer_config_process`` / ``trainer_config_finalize``): the bucket sizes become ``h^2``,
    ``0.9 h^2`` and ``10 h`` for the model's hidden size ``h``, which the estimator reads back
    (``autotune.estimate``: ``deepspeed_buffer_bytes``). Without offload there is no ``optimizer``
    block: the Trainer's own ``optim`` is built and DeepSpeed wraps it
    (``deepspeed_optim_sched`` sets ``zero_allow_untested_optimizer``).
    """
    if value == "off":
        return None
    stage = zero_stage(value)
    zero: dict[str, Any] = {"stage": stage, "reduce_bucket_size": "auto"}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto")
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }
    if zero_offloads(value):
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return config


def read_deepspeed_config(value: Any) -> dict[str, Any]:
    """The DeepSpeed config a ``--base-args`` ``deepspeed`` entry names: a dict, or a JSON file's path.

    Raises:
        AutotuneError: The file cannot be read, is not JSON, or does not hold a JSON object.
    """
    config = value
    if isinstance(value, str):
        try:
            config = json.loads(
                read_user_file(
                    value,
                    "--base-args deepspeed",
                    "a JSON DeepSpeed config",
                    1 << 20,
                    "a DeepSpeed config is a few keys",
                )
            )
        except json.JSONDecodeError as exc:
            raise AutotuneError(f"--base-args deepspeed {value}: not valid JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise AutotuneError("--base-args deepspeed: expected a DeepSpeed config (a JSON object or a file's path)")
    return config


def zero_from_training_args(args: Mapping[str, Any]) -> str:
    """The ``zero`` value a ``--base-args`` ``deepspeed`` entry asks for (a dict or a JSON file's path)."""
    if not args.get("deepspeed"):
        return "off"
    config = read_deepspeed_config(args["deepspeed"])
    zero = config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    if stage == 0:
        return "off"
    offload = (zero.get("offload_optimizer") or {}).get("device", "none") not in (None, "none")
    value = f"{stage}{OFFLOAD_SUFFIX}" if offload and stage in (2, 3) else str(stage)
    if value not in ZERO_CHOICES:
        raise AutotuneError(
            f"--base-args deepspeed: ZeRO stage {stage} with offload is not one autotune runs; use 2 or 3"
        )
    return value


def deepspeed_missing() -> str:
    """Why DeepSpeed cannot run here ('' if it can): the package, and torch's distributed gloo."""
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install 'autotune[deepspeed]')"
    return ""


def _unavailable_on(value: str, device: DeviceSpec) -> str:
    if value == "off":
        return ""
    return deepspeed_missing()


def _auto_choices(device: DeviceSpec) -> list[str]:
    """Every value that runs here; the space keeps ZeRO only where nothing fits without it
    (:func:`keep_zero_where_needed`)."""
    return [value for value in ZERO_CHOICES if not _unavailable_on(value, device)]


def _label(value: str) -> str:
    return "" if value == "off" else f"zero={value}"


def keep_zero_where_needed(
    values: list[str], choices: Mapping[str, list[Any]], memory: SpaceMemory | None
) -> tuple[list[str], str]:
    """``zero: auto``: ZeRO is searched only where no config of the space is predicted to fit without it.

    With the memory prior (before any trial): where some config with ``zero: off`` fits the ceiling,
    ``zero`` is ``off``; where none does, ``zero`` keeps its values with which some config fits
    (over the prior's ranks: with one rank, partitioning saves nothing and only offload is left), or
    all of them, ``off`` among them, where none does (the search then stops with what would fit, which must see
    the levers ZeRO does not run with: 16-bit weights, 8-bit optimizers). Without what the prior
    predicts (no model, sequence length, ceiling or prior) nothing is known to need it: ``off``.
    Applied before the combination rules, which then narrow the levers ZeRO does not run with.
    """
    if values == ["off"]:
        return values, ""
    if memory is None or memory.some_config_fits({**choices, "zero": ["off"]}):
        return ["off"], ""
    needed = [v for v in values if v != "off" and memory.some_config_fits({**choices, "zero": [v]})]
    if not needed:  # nothing fits with it either: ZeRO is not what is missing, and off keeps the levers it excludes
        return values, ""
    return (
        needed,
        f"zero {', '.join(needed)} searched: no config of the space is predicted to fit without DeepSpeed ZeRO",
    )


def _zero_memory(value: str, traits: MemoryTraits) -> MemoryTraits:
    return dataclasses.replace(traits, zero_stage=zero_stage(value), zero_offload=zero_offloads(value))


ZERO = Lever(
    name="zero",
    value_type=str,
    default="off",
    doc="DeepSpeed ZeRO stage (1: optimizer states, 2: + gradients, 3: + parameters partitioned over ranks; +offload: to host memory)",
    choices=ZERO_CHOICES,
    auto_choices=_auto_choices,
    fields=("deepspeed",),
    tool_keys={tool: same_names("deepspeed") for tool in ("axolotl", "llama-factory")},
    to_training_args=lambda value: {} if value == "off" else {"deepspeed": deepspeed_config(value)},
    from_training_args=zero_from_training_args,
    label=_label,
    unavailable_on=_unavailable_on,
    fallback="off",
    # context: on the CPU, DeepSpeed's modules and ops in the process (estimate._zero.DEEPSPEED_CPU_PROCESS_BYTES).
    memory_parts=("weights", "gradients", "optimizer states", "activations", "context"),
    memory=_zero_memory,
    narrow_auto=keep_zero_where_needed,
)


def zero_with_other_levers(choices: dict[str, list[Any]], notes: list[str], source: str) -> dict[str, list[Any]]:
    """The combinations of ZeRO that cannot run or would measure something else, each with its reason.

    * offload with an optimizer other than AdamW: the DeepSpeed config names its own AdamW
      (DeepSpeedCPUAdam under offload, :func:`deepspeed_config`), which replaces the Trainer's
      ``optim``: another optimizer would be measured under AdamW's name.
    * bitsandbytes optimizers: DeepSpeed hands the optimizer its flat fp32 partitions
      (deepspeed/runtime/zero/stage_1_and_2.py ``single_partition_of_fp32_groups``), so the Trainer's
      per-parameter overrides (embeddings kept 32-bit) and paged states no longer apply.
    * ``weight_dtype`` bf16: DeepSpeed builds its own bf16 compute weights over an fp32 master copy
      (``bf16.enabled`` from ``bf16=True``): bf16 weights would measure ZeRO's mixed precision under
      another name.
    * ``compile``: the Trainer does not compile a DeepSpeed engine's module the way it compiles a
      plain model (accelerate wraps the model in ``DeepSpeedEngine`` first); not measured here.
    """
    from autotune.levers.optimizer import BNB_OPTIMIZERS, OPTIMIZERS

    every = tuple(v for v in ZERO_CHOICES if v != "off")
    offloading = tuple(v for v in every if zero_offloads(v))
    compiled = tuple(v for v in choices.get("compile", []) if v != "off")
    clashes = (
        ZeroClash(
            offloading,
            "optim",
            tuple(o for o in OPTIMIZERS if o != OFFLOAD_OPTIM),
            "ZeRO offload trains with DeepSpeed's own AdamW (DeepSpeedCPUAdam)",
        ),
        ZeroClash(
            every,
            "optim",
            BNB_OPTIMIZERS,
            "DeepSpeed hands the optimizer flat fp32 partitions: bitsandbytes' per-parameter 32-bit overrides do not apply",
        ),
        ZeroClash(every, "weight_dtype", ("bf16",), "DeepSpeed keeps fp32 master weights and makes its own bf16 copy"),
        ZeroClash(every, "compile", compiled, "a DeepSpeed engine is not compiled by the Trainer as a plain model is"),
    )
    return apply_zero_clashes(choices, notes, clashes)


@dataclasses.dataclass(frozen=True)
class ZeroClash:
    """One rule between ``zero`` and another lever: ``zero_values`` do not run with ``bad`` values of ``other``."""

    zero_values: tuple[str, ...]
    other: str
    bad: tuple[Any, ...]
    reason: str


def apply_zero_clashes(
    choices: dict[str, list[Any]], notes: list[str], clashes: Sequence[ZeroClash]
) -> dict[str, list[Any]]:
    """The rules between ``zero`` and other levers, applied so that every note holds of the space that results.

    First, where every ``zero`` value of the space breaks a rule, the other lever loses its bad values (a note
    each: ZeRO is what the space searches). Then each ``zero`` value that still breaks a rule goes, one note for
    the values that broke the same rules, naming each reason and every value of every lever whose absence lets it
    be searched (rules taken one at a time named some: zero 2+offload's note sent the user to a space without
    8-bit optimizers, which the next rule then made, and offload stayed removed there).
    """
    for clash in clashes:
        zero = choices.get("zero", [])
        others = choices.get(clash.other, [])
        clashing = [v for v in others if v in clash.bad]
        kept = [v for v in others if v not in clash.bad]
        if zero and clashing and kept and set(zero) <= set(clash.zero_values):
            notes.append(f"{clash.other} {', '.join(map(str, clashing))} removed: {clash.reason}")
            choices = {**choices, clash.other: kept}
    broken: dict[str, list[ZeroClash]] = {}
    for clash in clashes:
        if any(v in clash.bad for v in choices.get(clash.other, [])):
            for value in choices.get("zero", []):
                if value in clash.zero_values:
                    broken.setdefault(value, []).append(clash)
    groups: dict[tuple[ZeroClash, ...], list[str]] = {}
    for value, broke in broken.items():
        groups.setdefault(tuple(broke), []).append(value)
    for rules, values in groups.items():
        bad: dict[str, list[Any]] = {}
        for clash in rules:
            for v in choices[clash.other]:
                if v in clash.bad and v not in bad.setdefault(clash.other, []):
                    bad[clash.other].append(v)
        whose = " and ".join(f"{other} is not {', '.join(map(str, vs))}" for other, vs in bad.items())
        reasons = "; ".join(clash.reason for clash in rules)
        notes.append(f"zero {', '.join(values)} removed: {reasons}; search it in a space whose {whose}")
    if not broken:
        return choices
    return {**choices, "zero": [v for v in choices["zero"] if v not in broken] or ["off"]}
