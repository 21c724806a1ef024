"""The ``search`` command's options and their defaults: the one place they are written.

``autotune search``'s Typer declarations take their defaults from :class:`SearchOptions`, and
``autotune.study`` builds its request, budget and confirmation from it, so a default (the trial
timeout, the work directory, the prune ratio, screening, ...) cannot differ between the command
line and the search. A foundation: it imports nothing heavy, so ``autotune --help`` stays quick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.errors import AutotuneError
from autotune.plan._checks import dataset_options, non_negative_int, positive_int, positive_seconds, trainer_options


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """The ``search`` command's options, as the user typed them (see ``autotune search --help``)."""

    model: str
    gpu: int | None = None
    device: str | None = None
    gpus: str | None = None
    workers: int = 1
    # Ranks (processes, one device each on CUDA) that one trial spans, launched by torch's launcher.
    devices_per_trial: int = 1
    seq_len: int = 128
    memory_ceiling: str = "0.9"
    # Host RAM a trial may use (ZeRO offload moves optimizer states there): a fraction of the RAM
    # available when the search starts, or a size; None: all of it.
    host_memory_ceiling: str | None = None
    space: str | None = None
    task: str | None = None
    trial_timeout: float = 900.0
    # torch.compile trials: seconds to compile (until the first optimizer step ends), then trial_timeout.
    compile_timeout: float = 1800.0
    warmup_steps: int = 3
    max_measure_steps: int = 40
    work_dir: str = "autotune_runs"
    callbacks: tuple[str, ...] = ()
    dataset: str | None = None
    text_column: str | None = None
    packing: bool = False
    # --trainer: trainer or sft (TRL's SFTTrainer); None: sft for chat / prompt-completion rows (autotune.spec.sft).
    trainer: str | None = None
    loss_on: str | None = None  # --trainer sft: all, completion or assistant; None: TRL's default for the rows
    base_args: str | None = None
    peft: str | None = None  # lora, qlora, or an adapter config file (autotune.spec.peft)
    global_batch: int | None = None
    max_global_batch: int | None = None
    prune_ratio: float = 0.5
    screen: bool = True
    # When the search stops starting trials, and how the leaders are confirmed at the end.
    trials: int = 20
    timeout: float | None = None
    max_total_trials: int | None = None
    patience: int | None = None
    confirm_top: int = 3
    confirm_repeats: int = 3

    def check(self) -> None:
        """The checks of single values that need nothing loaded, so a wrong option is answered at once
        (:func:`autotune.study.prepare_request` checks the rest: the model, the space, the data).

        Raises:
            AutotuneError: One line naming the option.
        """
        for option, value in (
            ("--seq-len", self.seq_len),
            ("--trials", self.trials),
            ("--max-total-trials", self.max_total_trials),
            ("--max-measure-steps", self.max_measure_steps),
            ("--patience", self.patience),
            ("--devices-per-trial", self.devices_per_trial),
        ):
            positive_int(option, value)
        non_negative_int("--warmup-steps", self.warmup_steps)
        positive_seconds("--trial-timeout", self.trial_timeout)
        positive_seconds("--compile-timeout", self.compile_timeout)
        positive_seconds("--timeout", self.timeout)
        dataset_options(self.dataset, self.text_column, self.packing)
        trainer_options(self.trainer, self.loss_on)
        if self.confirm_top < 0 or (self.confirm_top > 0 and self.confirm_repeats < 2):
            raise AutotuneError("--confirm-top must be 0 (skip) or more, and --confirm-repeats at least 2")

    @classmethod
    def from_command(cls, values: Mapping[str, Any]) -> SearchOptions:
        """The options out of the command's parameters by name (``locals()`` of ``cli.search``).

        Parameters that are not search options (``--storage``, ``--study-name``) are left out;
        the repeatable ``--callback`` arrives as a list (or ``None``) and is kept as a tuple.
        """
        fields = {field.name: values[field.name] for field in dataclasses.fields(cls)}
        return cls(**{**fields, "callbacks": tuple(fields["callbacks"] or ())})
