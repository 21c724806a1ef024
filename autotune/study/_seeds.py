"""The first two trials of every new study: the baseline the user would run, and a best-practice guess.

* ``hf-default``: the defaults of the trainer's arguments class as installed: ``TrainingArguments``
  (read from the dataclass, not remembered: transformers 5 defaults to ``adamw_torch_fused``), or
  under ``--trainer sft`` TRL's ``SFTConfig`` (bf16, activation checkpointing, micro-batch 8, fused
  AdamW, no packing), snapped to the search space's choices. Measuring it is what makes "speedup
  over the default" a measured figure, and its loss is what every trial's is judged against.
* ``best-practice``: what a performance guide would try first on this device (bf16 where the device
  runs it, else fp16 on CUDA; fused AdamW; no checkpointing; the largest micro-batch the estimator
  fits well under the ceiling).

Both are queued with ``study.enqueue_trial`` when the study is created, marked with the user attr
``seed`` (:mod:`autotune.storage.schema`), so the sampler starts from them and the end of a search can compare against the default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.estimate import estimate_peak
from autotune.levers import LEVERS, TrialConfig, knob_values_from_base_args
from autotune.runner import Workload
from autotune.space import SearchSpace
from autotune.spec.ceiling import fits
from autotune.storage import schema

# The best-practice micro-batch must be predicted to fit in this fraction of the ceiling: the
# estimator is not calibrated yet when seeds are chosen.
SEED_FILL_FRACTION = 0.8

# Where a default value is not among the space's choices: the choices closest in effect, in order.
_NEAREST_STRINGS = {
    "dtype": {"fp32": ["tf32", "bf16", "fp16"]},
    "optim": {"adamw_torch_fused": ["adamw_torch"], "adamw_torch": ["adamw_torch_fused"]},
}


@dataclasses.dataclass(frozen=True)
class Seed:
    """A configuration queued when a study is created.

    Attributes:
        label: ``hf-default`` or ``best-practice`` (the trial's ``seed`` user attr).
        params: Optuna params: every knob of the space, each one of its choices.
        notes: What had to change to fit the space, one line each.
    """

    label: str
    params: dict[str, Any]
    notes: tuple[str, ...] = ()


def default_config(trainer: str = "trainer") -> TrialConfig:
    """The levers as the trainer's arguments class sets them by default in the installed version:
    ``TrainingArguments()``, or TRL's ``SFTConfig()`` under ``--trainer sft`` (bf16 on, activation
    checkpointing on, no packing: trl/trainer/base_config.py:62-75, :107-108; sft_config.py).

    Read from the class, not remembered: each lever field's declared default, and where a class
    declares ``None`` and decides in ``__post_init__`` (``SFTConfig``'s ``bf16``, which becomes ``not
    fp16``), the value it resolves to when built (on the CPU, which judges no device). The levers'
    own inverse mapping turns them into values (``knob_values_from_base_args``).
    """
    import tempfile
    import warnings

    from autotune.plan import arguments_class

    cls = arguments_class(trainer)
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers 5.24: gradient_checkpointing is deprecated (TRL sets it)
        resolved = cls(output_dir=scratch, use_cpu=True)
    declared = {f.name: f.default for f in dataclasses.fields(cls)}
    lever_fields = {field for lever in LEVERS.values() for field in lever.fields if field in declared}
    defaults = {}
    for field in sorted(lever_fields):
        value = declared[field] if declared[field] is not None else getattr(resolved, field)
        if value is not None:
            defaults[field] = getattr(value, "value", value)  # OptimizerNames is an enum of str
    return TrialConfig(**knob_values_from_base_args(defaults))


def snap_to_space(config: TrialConfig, space: SearchSpace, device_kind: str) -> tuple[dict[str, Any], list[str]]:
    """Params for ``config`` within the space: each knob's value if it is a choice, else the nearest.

    Returns:
        (params, notes): a note for every knob that had to change (pin_memory on the CPU, which the
        space filter drops for a reason it already printed, is not repeated).
    """
    wanted = config.to_params()
    params: dict[str, Any] = {}
    notes: list[str] = []
    for knob, choices in space.choices.items():
        if knob not in wanted:  # a batch limit (global_batch, ...): one choice, accumulation follows from it
            params[knob] = choices[0]
            continue
        value = wanted[knob]
        if value in choices:
            params[knob] = value
            continue
        params[knob] = nearest_choice(knob, value, choices)
        if not (knob == "pin_memory" and device_kind == "cpu"):
            notes.append(f"{knob} {value} is not in the search space: seeded with the nearest choice, {params[knob]}")
    return params, notes


def nearest_choice(knob: str, value: Any, choices: Sequence[Any]) -> Any:
    """The choice closest to ``value``: numerically for numbers, by a stated preference for names."""
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and all(isinstance(c, (int, float)) for c in choices)
    ):
        return min(choices, key=lambda c: (abs(c - value), c))
    if knob == "attn_implementation" and value is None and "sdpa" in choices:
        return "sdpa"  # transformers' default where the model supports it
    for preferred in _NEAREST_STRINGS.get(knob, {}).get(value, []):
        if preferred in choices:
            return preferred
    return choices[0]


def best_practice_config(space: SearchSpace, workload: Workload) -> TrialConfig:
    """What a performance guide tries first on this device, within the space's choices: the largest
    micro-batch the workload's memory prior puts under the fill fraction of the ceiling.

    A knob the space does not search keeps its :class:`TrialConfig` default.
    """
    device = workload.device
    choices = space.choices
    defaults = TrialConfig()

    def pick(knob: str, preferred: Sequence[Any]) -> Any:
        if knob not in choices:
            return getattr(defaults, knob)
        return next((v for v in preferred if v in choices[knob]), choices[knob][0])

    workers = sorted(choices.get("dataloader_workers", [defaults.dataloader_workers]))
    # On a GPU, workers and pinned memory overlap data loading with compute; on the CPU, workers
    # compete with training for the same cores.
    wanted_workers = [w for w in workers if w > 0] if device.kind == "cuda" else [0]
    base = TrialConfig(
        micro_batch=min(choices.get("micro_batch", [defaults.micro_batch])),
        grad_accum=min(choices.get("grad_accum", [defaults.grad_accum])),
        checkpointing=pick("checkpointing", [False]),
        dtype=pick("dtype", ["bf16", "fp16", "tf32", "fp32"] if device.kind == "cuda" else ["bf16", "fp32"]),
        optim=pick("optim", ["adamw_torch_fused", "adamw_torch"]),
        dataloader_workers=pick("dataloader_workers", wanted_workers),
        pin_memory=pick("pin_memory", [device.kind == "cuda"]),
        # Compilation costs minutes of warm-up per trial: the search decides whether it pays.
        compile=pick("compile", ["off"]),
        attn_implementation=pick("attn_implementation", ["flash_attention_2", "sdpa"]),
    )
    checkpointing_options = [base.checkpointing]
    if not base.checkpointing and True in choices.get("checkpointing", []):
        checkpointing_options.append(True)  # only if nothing fits without
    for checkpointing in checkpointing_options:
        for micro_batch in sorted(choices.get("micro_batch", [base.micro_batch]), reverse=True):
            candidate = dataclasses.replace(base, micro_batch=micro_batch, checkpointing=checkpointing)
            predicted = estimate_peak(workload.model, candidate, workload.seq_len, workload.memory_prior).total_bytes
            if fits(predicted, SEED_FILL_FRACTION * workload.ceiling_bytes):
                return candidate
    return base


def study_seeds(space: SearchSpace, workload: Workload) -> list[Seed]:
    """The HF default and the best-practice guess, as params of the space (one seed if they coincide)."""
    default_params, default_notes = snap_to_space(default_config(workload.trainer), space, workload.device.kind)
    best = best_practice_config(space, workload)
    best_params, _ = snap_to_space(best, space, workload.device.kind)
    seeds = [Seed(schema.SEED_HF_DEFAULT, default_params, tuple(default_notes))]
    if best_params != default_params:
        seeds.append(Seed(schema.SEED_BEST_PRACTICE, best_params))
    return seeds


def enqueue_seeds(study: optuna.Study, seeds: Sequence[Seed]) -> None:
    """Queue the seeds as the study's first trials, each marked with its label."""
    for seed in seeds:
        study.enqueue_trial(seed.params, user_attrs={schema.TRIAL_SEED: seed.label})


def requeue_failed_seeds(study: optuna.Study) -> list[str]:
    """Queue again, once per run, each seed whose every trial failed (a crash, a timeout, an error).

    A failed trial measured nothing: a zero ``--trial-timeout`` or a child that could not start
    says nothing of the config. Without this, the HF-default seed would never be measured again
    once it failed, and the speedup over it would be gone from the study for good. OOMs and
    over-ceiling results are properties of the config (COMPLETE), not failures, and stay as they are.

    Returns:
        The labels queued again.
    """
    trials_by_seed: dict[str, list[FrozenTrial]] = {}
    for trial in study.get_trials(deepcopy=False):
        label = trial.user_attrs.get(schema.TRIAL_SEED)
        if label is not None:
            trials_by_seed.setdefault(label, []).append(trial)
    queued = []
    for label, trials in trials_by_seed.items():
        if all(t.state == TrialState.FAIL for t in trials):
            study.enqueue_trial(trials[-1].params, user_attrs={schema.TRIAL_SEED: label})
            queued.append(label)
    return queued
