"""DPO's terms for the memory prior (not wired yet: the trainer seam will pass them to ``estimate_peak``).

Two things set a DPO step's memory apart from an SFT step's at the same micro-batch (docs/facts.md, "DPO"):

* the reference model: a second copy of the weights, in the policy's dtype, without gradients or optimizer
  states (TRL loads it with the policy's dtype: trl/trainer/dpo_trainer.py:924), none under PEFT (the adapters
  disabled) or ``precompute_ref_log_probs`` (``autotune.spec.dpo.keeps_reference_copy``);
* two rows per pair: prompt + chosen and prompt + rejected in one forward, so the activation and LM-head
  terms see ``ROWS_PER_PAIR x micro-batch`` rows, each the prompt's tokens plus one answer's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.spec.dpo import ROWS_PER_PAIR, keeps_reference_copy
from autotune.spec.models import ModelSpec


@dataclasses.dataclass(frozen=True)
class DpoMemoryTerms:
    """What DPO adds to a configuration's memory.

    Attributes:
        reference_weights_bytes: The reference copy's weights (0 where there is none).
        rows: Rows of one micro-batch as the activation and LM-head terms count them.
    """

    reference_weights_bytes: int
    rows: int


def dpo_memory_terms(
    model: ModelSpec, micro_batch: int, weight_bytes: float, arguments: dict[str, Any]
) -> DpoMemoryTerms:
    """DPO's memory terms for ``micro_batch`` pairs, weights of ``weight_bytes`` bytes a parameter (the
    policy's dtype), under the ``DPOConfig`` ``arguments`` (``precompute_ref_log_probs``) and ``model.peft``."""
    copy = keeps_reference_copy(arguments, peft=model.peft is not None)
    reference = int(model.num_params * weight_bytes) if copy else 0
    return DpoMemoryTerms(reference_weights_bytes=reference, rows=ROWS_PER_PAIR * micro_batch)
