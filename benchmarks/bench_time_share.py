"""The share of a search's wall time spent in measured steps of trials that were not pruned, read from its study.

``python -m benchmarks.bench_time_share STORAGE_URL WALL_S`` (``benchmarks/bench_time_to_answer.sh`` passes each
run's study and wall time). Works on studies of any autotune version: a trial's measured seconds are its
``measured_s`` where recorded, else its measured steps times its median step (older results record no sum).
Screened trials, pruned trials and repeats answered from the record measured nothing that ranks.
"""

from __future__ import annotations

import sys

import optuna


def main() -> None:
    storage, wall_s = sys.argv[1], float(sys.argv[2])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=None, storage=storage)
    measured = 0.0
    trials = pruned = screened = 0
    for trial in study.get_trials(deepcopy=False):
        result = trial.user_attrs.get("result") or {}
        if not result or "reused_from" in trial.user_attrs:
            continue
        status = result.get("status")
        if status == "pruned":
            pruned += 1
        elif status == "screened":
            screened += 1
        else:
            trials += 1
            measured += result.get("measured_s") or result.get("measured_steps", 0) * result.get(
                "step_time_median_s", 0.0
            )
    confirmation = study.user_attrs.get("confirmation") or {}
    print(
        f"{measured / wall_s:.0%} of {wall_s:.0f} s in measured steps of {trials} trials not pruned "
        f"({pruned} pruned, {screened} screened; confirmation re-ran {len(confirmation.get('trials') or {})} configs)"
    )


if __name__ == "__main__":
    main()
