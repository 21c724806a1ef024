"""The last step of scripts/gpu_acceptance.sh: train the exported JSON in a plain Trainer in a fresh
process, and write one results file comparing it with the study's record.

Writes OUT/results.json and OUT/results.md:

* the plain run's samples/s and peak CUDA memory against the winner's record in the study (its
  confirmed median where the search confirmed it, and its ``peak_device_bytes``);
* each trial's predicted peak (the estimate the study recorded before running it) against the
  peak it measured, with the source of the memory outside the allocator and the precision it ran.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.result import TrialResult
from autotune.storage import (
    load_study,
    schema,
)
from autotune.views.ranking import study_ranking
from benchmarks._common import load_average, run_plain_trainer

GiB = 1024**3


def trial_rows(study) -> list[dict]:
    """Each trial's predicted and measured peak, status, and how it ran."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        result = TrialResult.from_trial(trial)
        if result is None:
            continue
        # Both written when the config was proposed (autotune/study/_screening.py, record_predicted_peak).
        predicted = trial.user_attrs.get(schema.TRIAL_PREDICTED_PEAK_BYTES)
        prior = trial.user_attrs.get(schema.TRIAL_PRIOR_PEAK_BYTES)
        measured = result.peak_memory_bytes or None
        rows.append(
            {
                "trial": trial.number,
                "params": trial.params,
                "status": result.status,
                "samples_per_s": result.samples_per_s,
                "prior_peak_bytes": prior,
                "predicted_peak_bytes": predicted,
                "measured_peak_bytes": measured,
                "prior_relative_error": (prior - measured) / measured if prior and measured else None,
                "relative_error": (predicted - measured) / measured if predicted and measured else None,
                "peak_dtype": result.peak_dtype,
                "mfu": result.mfu,
                "defects": result.defects,
                "runtime": result.runtime,
                "memory_peaks": result.memory_peaks,
            }
        )
    return rows


def markdown(summary: dict, rows: list[dict]) -> str:
    """The results as a page to paste into docs/benchmarks.md."""
    plain, record = summary["plain"], summary["winner"]

    def gib(value: float | None) -> str:
        return f"{value / GiB:.2f} GiB" if value else "-"

    lines = [
        f"# GPU acceptance: {summary['model']} at seq len {summary['seq_len']} on {summary['device']}",
        "",
        f"Winner #{record['trial']} ({record['config']}); plain Trainer run of the exported JSON in a fresh process.",
        "",
        "| figure | study's record | plain Trainer run | plain / record |",
        "|---|---|---|---|",
        f"| samples/s | {record['samples_per_s']:.2f} | {plain['samples_per_s_median_step']:.2f} (median step) | "
        f"{plain['samples_per_s_median_step'] / record['samples_per_s']:.3f} |",
        f"| peak device memory (max reserved + outside the allocator) | {gib(record['peak_memory_bytes'])} | "
        f"{gib(plain.get('cuda_peak_device_bytes'))} | "
        + (
            f"{plain['cuda_peak_device_bytes'] / record['peak_memory_bytes']:.3f} |"
            if plain.get("cuda_peak_device_bytes") and record["peak_memory_bytes"]
            else "- |"
        ),
        "",
        "| trial | status | prior peak | calibrated peak | measured peak | prior error | calibrated error | ran in | "
        "outside-allocator source | CUDA total |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def error(value: float | None) -> str:
        return f"{value:+.1%}" if value is not None else "-"

    for row in rows:
        cuda_total = row["runtime"].get("cuda_total_bytes")
        lines.append(
            f"| {row['trial']} | {row['status']} | {gib(row['prior_peak_bytes'])} | {gib(row['predicted_peak_bytes'])} | "
            f"{gib(row['measured_peak_bytes'])} | {error(row['prior_relative_error'])} | {error(row['relative_error'])} | "
            f"{row['peak_dtype'] or '-'} | {row['runtime'].get('outside_allocator_source', '-')} | "
            f"{gib(int(cuda_total)) if cuda_total else '-'} |"
        )
    lines += ["", f"Machine load when written: {summary['load']}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study-name", required=True)
    parser.add_argument("--args", required=True, help="The exported TrainingArguments JSON.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()

    study = load_study(options.storage, options.study_name)
    ranking = study_ranking(study)
    if not ranking:
        raise SystemExit("gpu_acceptance: the study has no feasible trial to compare with")
    best = ranking[0]
    plain = run_plain_trainer(Path(options.args), options.model, options.seq_len, weight_dtype=best.config.weight_dtype)
    summary = {
        "model": options.model,
        "seq_len": options.seq_len,
        "device": (best.result.versions.get("device") if best.result else None) or "unknown device",
        "winner": {
            "trial": best.number,
            "config": best.config.short(),
            "samples_per_s": best.samples_per_s,
            "peak_memory_bytes": best.result.peak_memory_bytes if best.result else None,
            "runtime": best.result.runtime if best.result else {},
        },
        "plain": plain,
        "load": load_average(),
    }
    rows = trial_rows(study)
    out = Path(options.out)
    (out / "results.json").write_text(json.dumps({**summary, "trials": rows}, indent=2))
    (out / "results.md").write_text(markdown(summary, rows))
    print(markdown(summary, rows))


if __name__ == "__main__":
    main()
