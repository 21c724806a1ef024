"""DPO's rules that the trial and the memory prior both read (TRL 1.16's DPOTrainer: docs/facts.md, "DPO").

Standalone for now: the trainer seam plugs them in (the trial: ``autotune.runner._dpo``; the prior:
``autotune.estimate._dpo``).
"""

from __future__ import annotations

from typing import Any

# Rows a preference pair puts in a micro-batch: prompt + chosen and prompt + rejected, one forward for both
# (trl/trainer/dpo_trainer.py, DataCollatorForPreference, :146-210; ``_compute_loss`` splits them, :1316).
ROWS_PER_PAIR = 2


def keeps_reference_copy(arguments: dict[str, Any], peft: bool) -> bool:
    """Whether a DPO run holds a second copy of the model as its reference (trl/trainer/dpo_trainer.py:908-929):
    not under PEFT (the base model with the adapters disabled is the reference) nor under
    ``precompute_ref_log_probs`` (the policy computes the reference log-probabilities before training; FSDP,
    under which TRL still loads a copy for that pass, is CUDA only and not a DPO lever here)."""
    return not peft and not arguments.get("precompute_ref_log_probs", False)
