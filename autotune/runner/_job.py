from __future__ import annotations

import dataclasses
from typing import Any

from autotune.config import TrialConfig
from autotune.devices import DeviceSpec
from autotune.measure import MeasureSettings
from autotune.models import ModelSpec


@dataclasses.dataclass(frozen=True)
class TrialJob:
    """Everything a child process needs to train and measure one configuration.

    Attributes:
        model: The model to build (from its config, random weights).
        device: Where to train.
        config: The knobs under test.
        seq_len: Tokens per sample.
        ceiling_bytes: The memory ceiling (recorded with the result; compared by the orchestrator).
        measure: When the steady-state measurement stops.
        work_dir: A directory of this trial's own (Trainer output_dir, the child's log).
        base_args: TrainingArguments the user fixed, applied to every trial.
        address_space_bytes: CPU only: the child's RLIMIT_AS budget above its start-up size, so a
            runaway batch fails inside the child instead of swapping or OOM-killing the host.
        prune_below_samples_per_s: Stop early (status ``pruned``) once the measured throughput is
            clearly below this; ``None`` never prunes.
        measured_peak_tflops: Achievable peak from ``autotune devices --calibrate`` for this dtype.
        dataset: How the child builds training data (``None``: synthetic tokens).
        callbacks: ``module:attr`` names of extra ``TrainerCallback`` classes to add.
    """

    model: ModelSpec
    device: DeviceSpec
    config: TrialConfig
    seq_len: int
    ceiling_bytes: int
    measure: MeasureSettings
    work_dir: str
    base_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    address_space_bytes: int | None = None
    prune_below_samples_per_s: float | None = None
    measured_peak_tflops: float | None = None
    dataset: dict[str, Any] | None = None
    callbacks: tuple[str, ...] = ()

    @property
    def log_path(self) -> str:
        return f"{self.work_dir}/child.log"
