"""What the trial child reads of its training numerics: each step's loss, skipped steps, the weights.

Judged by the parent's rules in :mod:`autotune.numerics`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback


class LossRecorder(TrainerCallback):
    """Records each optimizer step's training loss and whether the step updated the weights.

    The loss is read from the Trainer's own running loss, ``Trainer._tr_loss`` (transformers 5.x
    ``trainer.py``, ``_inner_training_loop`` and ``_run_epoch``): every micro-batch adds the loss
    ``training_step`` returns (already divided by the accumulation steps, or normalised over the
    step's tokens), and with ``logging_strategy="no"`` (the harness's) nothing ever drains it, so
    the difference between two optimizer steps is that step's mean loss. Reading it is one scalar
    copy after the step timer has synchronised the device. Logging every step instead would add
    ``_maybe_log_save_evaluate``'s gathers, grad-norm reads and ``on_log`` calls to every measured
    step; a hook on ``compute_loss`` or ``training_step`` would change the code the user runs.

    What the running loss cannot show: with ``logging_nan_inf_filter`` on (the Trainer's default,
    kept because the user runs with it), a non-finite micro-batch loss is replaced there by the
    running mean; it still poisons the weights, which :func:`weights_are_finite` checks after
    training. With the filter off, a non-finite loss makes the running loss non-finite from that
    step on, and it is recorded at that step.

    A skipped step is read from accelerate's ``AcceleratedOptimizer.step_was_skipped`` (the
    ``optimizer`` the Trainer hands its callbacks): True when its grad scaler found inf/NaN
    gradients and did not call the optimizer (accelerate ``optimizer.py``, ``step``). Without a
    scaler (fp32, bf16, every CPU run) it is always False.
    """

    def __init__(self) -> None:
        self._trainer: Any = None
        self._previous_total = 0.0
        self.losses: list[float] = []  # one per optimizer step, from global step 1
        self.skipped_steps: list[int] = []  # global step numbers the grad scaler skipped

    def attach(self, trainer: Any) -> None:
        """The Trainer whose running loss to read (it is built after its callbacks)."""
        self._trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's signature
        optimizer = kwargs.get("optimizer")
        if getattr(optimizer, "step_was_skipped", False):
            self.skipped_steps.append(state.global_step)
        running = getattr(self._trainer, "_tr_loss", None)
        if running is not None:
            total = float(running)
            self.losses.append(total - self._previous_total)
            self._previous_total = total
        return control


def weights_are_finite(model: Any) -> bool:
    """True when no parameter holds inf or NaN; one device sync.

    Each parameter is summed in fp32 (a NaN or inf anywhere makes its sum non-finite) without a
    full-size temporary, so the check cannot run out of memory where training just fitted.
    """
    sums = [p.detach().sum(dtype=torch.float32) for p in model.parameters()]
    return not sums or bool(torch.isfinite(torch.stack(sums).sum()).item())
