"""The reference model of preference tuning (``--trainer dpo``): its log-probabilities computed in every
step, or once, before training (``DPOConfig.precompute_ref_log_probs``).

DPO compares the policy with a frozen reference. By default each step runs the reference's forward on the
pair's rows beside the policy's, and the run holds the reference's weights (a second copy, or under
``--peft`` the base with the adapters disabled: ``autotune.trainers.dpo``). With
``precompute_ref_log_probs`` TRL runs that forward once over the whole train set in ``DPOTrainer.__init__``
(trl/trainer/dpo_trainer.py:1013-1019, 1168-1241), keeps two numbers per pair, and frees the steps of the
reference: no forward of it and no copy of its weights (:908-914). The pass is paid once per run: the trial
times it and counts its share over the user's run (``autotune.result.over_the_run``), so the lever wins
only where the run goes over the data often enough, or memory makes the copy the difference.
"""

from __future__ import annotations

import dataclasses

from autotune.levers._exports import same
from autotune.levers._lever import Lever
from autotune.trainers import get as trainer_named


def _unavailable_with_trainer(value: bool, trainer: str) -> str:
    if value and not trainer_named(trainer).holds_reference:
        return "it is DPOConfig's (a reference model's log-probabilities): train with --trainer dpo"
    return ""


PRECOMPUTE_REF_LOG_PROBS = Lever(
    name="precompute_ref_log_probs",
    value_type=bool,
    default=False,
    doc="--trainer dpo: the reference's log-probabilities computed once before training, not in every step",
    in_every_space=False,
    fields=("precompute_ref_log_probs",),
    tool_keys={
        # axolotl passes it to DPOConfig (docs/facts.md, "DPO": axolotl's DPO keys).
        "axolotl": {"precompute_ref_log_probs": same("precompute_ref_log_probs")},
        "llama-factory": {
            "precompute_ref_log_probs": lambda value, args: (
                ({}, ["LLaMA-Factory's CustomDPOTrainer forces precompute_ref_log_probs = False (no key for it)"])
                if value
                else ({}, [])
            )
        },
    },
    to_training_args=lambda value: {"precompute_ref_log_probs": True} if value else {},
    from_training_args=lambda args: bool(args["precompute_ref_log_probs"]),
    label=lambda value: "precompute-ref" if value else "",
    unavailable_with_trainer=_unavailable_with_trainer,
    fallback=False,
    # No reference weights in the steps (autotune.estimate: ModelSpec.holds_reference).
    memory_parts=("weights",),
    memory=lambda value, traits: dataclasses.replace(traits, reference_precomputed=value),
)
