"""A ZeRO winner's study, in memory as the search records it, and a user's own loop to launch its
export with (``accelerate launch --config_file <the export> accelerate_loop.py``): tests/views/test_export.py
and tests/e2e/test_zero_e2e.py."""

from __future__ import annotations

from pathlib import Path

import optuna

# A user's own training loop: Accelerator() told nothing, so what it trains with is the launch's alone.
ACCELERATE_LOOP = Path(__file__).with_name("accelerate_loop.py")


def zero_winner_study(zero: str = "2+offload", dtype: str = "bf16", host_bytes: int | None = None) -> optuna.Study:
    """A CPU study whose one feasible trial trained with DeepSpeed ZeRO ``zero`` in ``dtype``; ``host_bytes``:
    the host memory its offload was predicted to take (recorded with the trial)."""
    from autotune.result import Status, TrialResult
    from autotune.storage import schema
    from tests.support.recorded_study import add_recorded_trial

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(schema.STUDY_DEVICE_KIND, "cpu")
    result = TrialResult(
        status=Status.OK,
        samples_per_s=10.0,
        model_tflops=1.0,
        peak_memory_bytes=2**30,
        memory_peaks={schema.TRIAL_PREDICTED_HOST_BYTES: host_bytes} if host_bytes else {},
    )
    add_recorded_trial(study, {"zero": (zero, ["off", zero]), "dtype": dtype}, result)
    return study
