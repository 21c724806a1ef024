"""The first two trials of every new study: the baseline the user would run, and a best-practice guess.

* ``hf-default``: the defaults of the trainer's arguments class as installed: ``TrainingArguments``
  (read from the dataclass, not remembered: transformers 5 defaults to ``adamw_torch_fused``), or
  under ``--trainer sft`` TRL's ``SFTConfig`` (bf16, activation checkpointing, micro-batch 8, fused
  AdamW, no packing), snapped to the search space's choices. Measuring it is what makes "speedup
  over the default" a measured figure, and its loss is what every trial's is judged against.
* ``best-practice``: what a performance guide would try first on this device (bf16 where the device
  has matmul hardware for it, else fp16 on CUDA, else fp32: a CPU without bf16 instructions emulates
  bf16 slower than fp32; fused AdamW; no checkpointing; the largest micro-batch the estimator fits
  well under the ceiling).

Both are queued with ``study.enqueue_trial`` when the study is created, marked with the user attr
``seed`` (:mod:`autotune.storage.schema`), so the sampler starts from them and the end of a search can compare against the default.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.estimate import estimate_peak
from autotune.levers import LEVERS, Lever, TrialConfig, config_conflict, lever_values_from_base_args
from autotune.runner import Workload
from autotune.space import SearchSpace
from autotune.spec.ceiling import fits
from autotune.spec.devices import DeviceSpec
from autotune.storage import schema

# The best-practice micro-batch must be predicted to fit in this fraction of the ceiling: the
# estimator is not calibrated yet when seeds are chosen.
SEED_FILL_FRACTION = 0.8


@dataclasses.dataclass(frozen=True)
class Seed:
    """A configuration queued when a study is created.

    Attributes:
        label: ``hf-default`` or ``best-practice`` (the trial's ``seed`` user attr).
        params: Optuna params: every lever of the space, each one of its choices.
        notes: What had to change to fit the space, one line each.
        instead_of: The levers the space could not hold at the config's value, with that value (the
            trial's ``seed_instead_of`` user attr: the speedup line names the nearest config so).
    """

    label: str
    params: dict[str, Any]
    notes: tuple[str, ...] = ()
    instead_of: dict[str, Any] = dataclasses.field(default_factory=dict)


def default_config(trainer: str = "trainer") -> TrialConfig:
    """The lever values that reproduce the trainer's arguments class at its defaults in the installed
    version: ``TrainingArguments()``, or TRL's ``SFTConfig()`` under ``--trainer sft`` (bf16 on, activation
    checkpointing on, no packing: trl/trainer/base_config.py:62-75, :107-108; sft_config.py).

    Read from the class, not remembered: each field's declared default, and where a class declares
    ``None`` for a lever's field and decides in ``__post_init__`` (``SFTConfig``'s ``bf16``, which becomes
    ``not fp16``), the value it resolves to when built (on the CPU, which judges no device). The inverse
    of the mapping (:func:`autotune.levers.lever_values_from_base_args`) turns them into lever values;
    levers that act outside the arguments keep their own default (the model's attention, ...).
    """
    from autotune.spec.derived_cache import cached

    # Kept on disk per trainer and installed versions (autotune.spec.derived_cache): reading them imports
    # the arguments class, seconds at every search start.
    defaults = cached("trainer-defaults", {"trainer": trainer}, __file__, lambda: _lever_field_defaults(trainer))
    return TrialConfig(**lever_values_from_base_args(defaults))


def _lever_field_defaults(trainer: str) -> dict[str, Any]:
    """The trainer's arguments class at its defaults, for the fields levers map (JSON values: an enum's value)."""
    import enum
    import tempfile
    import warnings

    from autotune.trainers import arguments_class

    cls = arguments_class(trainer)
    lever_fields = {field for lever in LEVERS.values() for field in lever.fields}
    defaults = {
        field.name: field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[operator]  # a factory where no default
        for field in dataclasses.fields(cls)
        if field.name in lever_fields
        and (field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING)
    }
    if any(value is None for value in defaults.values()):
        with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers 5.24: gradient_checkpointing is deprecated (TRL sets it)
            resolved = cls(output_dir=scratch, use_cpu=True)
        defaults.update({f: getattr(resolved, f) for f, value in defaults.items() if value is None})
    return {f: value.value if isinstance(value, enum.Enum) else value for f, value in defaults.items()}


def snap_to_space(config: TrialConfig, space: SearchSpace, device: DeviceSpec) -> tuple[dict[str, Any], list[str]]:
    """Params for ``config`` within the space: each lever's value if it is a choice, else the nearest.

    Returns:
        (params, notes): a note for every lever that had to change (a value that changes nothing on
        the device, such as pin_memory on the CPU, was removed by the space filter with its own note,
        which is not repeated).
    """
    wanted = config.to_params()
    params: dict[str, Any] = {}
    for name, choices in space.choices.items():
        if name not in wanted:  # a batch limit (global_batch, ...): one choice, accumulation follows from it
            params[name] = choices[0]
            continue
        value = wanted[name]
        params[name] = value if value in choices else nearest_choice(LEVERS[name], value, choices)
    params = runnable_pair(params, space)
    notes = [
        f"{name} {value} is not in the search space: seeded with the nearest choice, {params[name]}"
        for name, value in moved_from(config, params, device).items()
    ]
    return params, notes


def runnable_pair(params: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """``params``, or where two of its values cannot train together (a pair rule: fp32 autocast with bf16
    weights, where the space holds both) the first change of one lever, in the space's order, that
    trains: a nearest choice can land on such a pair, which the sampler itself never proposes."""
    if not config_conflict(params):
        return params
    for name, choices in space.choices.items():
        for value in choices:
            if not config_conflict(candidate := {**params, name: value}):
                return candidate
    return params  # two pairs broken at once: no space the filters leave holds such a seed


def moved_from(config: TrialConfig, params: Mapping[str, Any], device: DeviceSpec) -> dict[str, Any]:
    """The levers ``params`` (``config`` snapped to a space) hold at another value than ``config``, each
    with ``config``'s value; not those whose value changes nothing on the device, nor those ``config``
    leaves to the library (``None``: TRL's ``SFTConfig`` names no ``attn_implementation``, and the model's
    own default, SDPA, is what the space's ``sdpa`` runs; seen calling TRL's default "the nearest config")."""
    wanted = config.to_params()
    return {
        name: wanted[name]
        for name, value in params.items()
        if name in wanted
        and wanted[name] is not None
        and value != wanted[name]
        and not LEVERS[name].no_effect_on(wanted[name], device)
    }


def nearest_choice(lever: Lever, value: Any, choices: Sequence[Any]) -> Any:
    """The choice closest to ``value``: numerically for numbers, by the lever's stated preference
    (``Lever.nearest``) for names."""
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and all(isinstance(c, (int, float)) for c in choices)
    ):
        return min(choices, key=lambda c: (abs(c - value), c))
    for preferred in lever.nearest.get(value, ()):
        if preferred in choices:
            return preferred
    return choices[0]


def best_practice_config(space: SearchSpace, workload: Workload) -> TrialConfig:
    """What a performance guide tries first on this device, within the space's choices: each lever's
    first preferred value (``Lever.best_practice``), then the largest micro-batch (the levers whose
    memory grows with their value) the workload's memory prior puts under the fill fraction of the
    ceiling; a last-resort lever (checkpointing) turned on only where none fits without it.

    A lever the space does not search, or without a preference, keeps its :class:`TrialConfig` default.
    """
    choices = space.choices
    base: dict[str, Any] = {}
    for lever in LEVERS.values():
        preferred = lever.best_practice(workload.device, choices[lever.name]) if lever.name in choices else ()
        if preferred:
            base[lever.name] = next((v for v in preferred if v in choices[lever.name]), choices[lever.name][0])
    settings = [base]  # then each last resort's other values, one at a time
    for lever in LEVERS.values():
        current = base.get(lever.name, lever.default)
        if lever.last_resort and lever.name in choices:
            settings += [{**base, lever.name: value} for value in choices[lever.name] if value != current]
    growing = [lever for lever in LEVERS.values() if lever.grows_memory and lever.name in choices]
    sizes = sorted(itertools.product(*(choices[lever.name] for lever in growing)), reverse=True)
    for setting in settings:
        for size in sizes:
            candidate = TrialConfig(**{**setting, **{lever.name: v for lever, v in zip(growing, size)}})
            predicted = estimate_peak(workload.model, candidate, workload.seq_len, workload.memory_prior).total_bytes
            if fits(predicted, SEED_FILL_FRACTION * workload.ceiling_bytes):
                return candidate
    return TrialConfig(**base)


def study_seeds(space: SearchSpace, workload: Workload) -> list[Seed]:
    """The HF default and the best-practice guess, as params of the space (one seed if they coincide)."""
    default = default_config(workload.trainer)
    default_params, default_notes = snap_to_space(default, space, workload.device)
    best = best_practice_config(space, workload)
    best_params, _ = snap_to_space(best, space, workload.device)
    instead_of = moved_from(default, default_params, workload.device)
    seeds = [Seed(schema.SEED_HF_DEFAULT, default_params, tuple(default_notes), instead_of)]
    if best_params != default_params:
        seeds.append(
            Seed(
                schema.SEED_BEST_PRACTICE,
                best_params,
                slow_value_notes(space, workload.device, {**dataclasses.asdict(best), **best_params}),
            )
        )
    return seeds


def slow_value_notes(space: SearchSpace, device: DeviceSpec, seed: Mapping[str, Any]) -> tuple[str, ...]:
    """A note for each value the space lists that is slow on the device (``Lever.slow_on``: bf16 on a
    CPU without bf16 instructions, torch.compile on a CPU) and the best-practice seed (``seed``: its lever values as queued,
    fitted to the space) therefore does not train with."""
    notes = []
    for lever in LEVERS.values():
        chosen = seed[lever.name]
        for value in space.choices.get(lever.name, []):
            reason = lever.slow_on(value, device)
            if reason and value != chosen:
                label = lever.label(chosen) or f"{lever.name} {chosen}"
                notes.append(f"best-practice seed trains in {label}, not {value}: {reason}")
    return tuple(notes)


def enqueue_seeds(study: optuna.Study, seeds: Sequence[Seed]) -> None:
    """Queue the seeds as the study's first trials, each marked with its label (and what the space could not hold)."""
    for seed in seeds:
        instead_of = {schema.TRIAL_SEED_INSTEAD_OF: seed.instead_of} if seed.instead_of else {}
        study.enqueue_trial(seed.params, user_attrs={schema.TRIAL_SEED: seed.label, **instead_of})


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
            instead_of = trials[-1].user_attrs.get(schema.TRIAL_SEED_INSTEAD_OF)
            moved = {schema.TRIAL_SEED_INSTEAD_OF: instead_of} if instead_of else {}
            study.enqueue_trial(trials[-1].params, user_attrs={schema.TRIAL_SEED: label, **moved})
            queued.append(label)
    return queued
