"""What the trial child reads of its training numerics: each step's loss, skipped steps, the weights.

Judged by the parent's rules in :mod:`autotune.result._loss`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


class LossRecorder(TrainerCallback):
    """Records each optimizer step's training loss and whether the step updated the weights.

    The loss is read from the Trainer's own running loss, ``Trainer._tr_loss`` (transformers 5.x
    ``trainer.py``, ``_inner_training_loop`` and ``_run_epoch``): every micro-batch adds the loss
    ``training_step`` returns (divided by the accumulation steps, or normalised over the step's
    tokens, or neither: see :func:`accumulation_gradient_scale`), and with ``logging_strategy="no"``
    (the harness's) nothing ever drains it, so the difference between two optimizer steps is that
    step's loss; divided by :attr:`gradient_scale` it is the step's mean loss per sample, the figure
    that compares across accumulation steps. Reading it is one scalar
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
    scaler (fp32, bf16, every CPU run) it is always False. With a fused optimizer it is False even
    for a skipped step (accelerate#4242): ``GradScaler.step`` hands the optimizer its ``found_inf``
    and always calls ``step()`` (torch/amp/grad_scaler.py, ``_step_supports_amp_scaling``), whose
    kernel skips inside; so a step is skipped too when the scaler's scale dropped over it
    (:func:`scale_dropped`).
    """

    def __init__(self) -> None:
        self._trainer: Any = None
        self._scale_before: float | None = None
        self._previous_total = 0.0
        self.losses: list[float] = []  # one per optimizer step, from global step 1, per sample
        self.skipped_steps: list[int] = []  # global step numbers the grad scaler skipped
        self.gradient_scale = 1

    def attach(self, trainer: Any) -> None:
        """The Trainer whose running loss to read (it is built after its callbacks), and how many
        times the per-sample loss it adds up (:func:`accumulation_gradient_scale`)."""
        self._trainer = trainer
        self.gradient_scale = accumulation_gradient_scale(trainer)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        optimizer = kwargs.get("optimizer")
        scale = grad_scale(getattr(optimizer, "scaler", None))
        if getattr(optimizer, "step_was_skipped", False) or scale_dropped(self._scale_before, scale):
            self.skipped_steps.append(state.global_step)
        self._scale_before = scale
        running = getattr(self._trainer, "_tr_loss", None)
        if running is not None:
            total = float(running)
            self.losses.append((total - self._previous_total) / self.gradient_scale)
            self._previous_total = total
        return control

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        self._scale_before = grad_scale(getattr(kwargs.get("optimizer"), "scaler", None))
        return control


# Tokens of the one sample :func:`accumulation_gradient_scale` runs: enough for a loss, few enough
# that a model not yet on its device (DeepSpeed and FSDP place it when training starts) runs it at once.
PROBE_TOKENS = 8
# Inputs a probe keeps: the ones every text model takes (a collator's extras, such as flash
# attention's sequence offsets, belong to the whole row and would not match the cut one).
PROBE_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "labels")


def accumulation_gradient_scale(trainer: Any) -> int:
    """How many times the per-sample loss the Trainer's loss, and so its gradients, are: the
    accumulation steps for a model that takes loss kwargs but ignores ``num_items_in_batch``, else 1.

    transformers 5 passes ``num_items_in_batch`` (the labelled items of the whole optimizer step) to
    a model whose ``forward`` takes ``**kwargs`` and then does not divide the loss by the
    accumulation steps (``trainer.py``, ``training_step``: ``loss_is_scaled_for_ga``;
    ``compute_loss``; ``model_accepts_loss_kwargs`` from the forward's signature in ``__init__``).
    Models whose loss goes through ``self.loss_function`` divide by it (causal LMs); others take the
    kwargs and compute a mean loss of their own (``BertForSequenceClassification``'s
    ``CrossEntropyLoss``), so the step's gradient is the sum of the micro-batches' mean gradients,
    ``gradient_accumulation_steps`` times the per-sample one (transformers#37766 describes the class).

    Asked of the model itself, before training: the loss of one sample (its first
    :data:`PROBE_TOKENS` tokens, no gradient, dropout off) with ``num_items_in_batch`` 1 and 2. A
    model that divides by it halves; one that ignores it does not change. Nothing of the training
    run changes: the Trainer and the model are as the user's run has them.
    """
    steps = int(trainer.args.gradient_accumulation_steps)
    if steps == 1 or not trainer.model_accepts_loss_kwargs or trainer.compute_loss_func is not None:
        return 1  # the Trainer divides by the steps itself (training_step), or there is nothing to sum
    batch = trainer.data_collator([trainer.train_dataset[0]])
    if "labels" not in batch:
        return 1  # no labels: the Trainer passes no num_items_in_batch and divides by the steps
    model = trainer.model
    device = next(model.parameters()).device
    length = batch["input_ids"].shape
    inputs = {
        name: (value[:, :PROBE_TOKENS] if value.dim() == 2 and value.shape == length else value).to(device)
        for name, value in batch.items()
        if name in PROBE_INPUTS
    }
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            losses = [float(model(**inputs, num_items_in_batch=torch.tensor(n, device=device)).loss) for n in (1, 2)]
    finally:
        model.train(was_training)
    if not all(math.isfinite(loss) and loss != 0 for loss in losses):
        return 1  # no loss to tell by: the Trainer's own rule stands
    return steps if math.isclose(losses[0], losses[1], rel_tol=1e-3) else 1


def grad_scale(scaler: Any) -> float | None:
    """The loss scale of an enabled ``torch.amp.GradScaler`` (one scalar read), else ``None``."""
    if scaler is None or not scaler.is_enabled():
        return None
    return float(scaler.get_scale())


def scale_dropped(before: float | None, after: float | None) -> bool:
    """Whether the grad scaler skipped the step between two readings of its scale.

    ``GradScaler.update`` multiplies the scale by ``backoff_factor`` (< 1) after a step that found
    inf/NaN gradients and only ever raises it otherwise (torch/amp/grad_scaler.py, ``update``;
    ``_amp_update_scale_``), so a lower scale after a step means that step was skipped.
    """
    return before is not None and after is not None and after < before


def weights_are_finite(model: Any) -> bool:
    """True when no parameter holds inf or NaN; one device sync.

    Each parameter is summed in fp32 (a NaN or inf anywhere makes its sum non-finite) without a
    full-size temporary, so the check cannot run out of memory where training just fitted.
    """
    sums = [p.detach().sum(dtype=torch.float32) for p in model.parameters()]
    return not sums or bool(torch.isfinite(torch.stack(sums).sum()).item())
