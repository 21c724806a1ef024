"""The ``offload`` step of scripts/gpu_acceptance.sh: ZeRO offload makes a config fit that does not fit
without it, on a real GPU (issue 22; on the CPU the device is the host, so only a GPU can show it).

``ceiling MODEL SEQ_LEN``: prints a per-device ceiling halfway between the predicted peaks of
``zero: 2`` and ``zero: 2+offload`` (micro-batch 1, bf16; the estimator's CUDA prior for GPU 0), for
``autotune search --memory-ceiling``.

``check --storage URL --study-name NAME --out DIR``: reads the searched study and writes
``DIR/offload.md``: each trial's zero value, status, measured device peak and predicted host RAM.
Exits 1 unless the winner is ``2+offload`` and trained, and ``zero: 2`` did not fit.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autotune.levers import TrialConfig
from autotune.units import GiB, MiB

SPACE = 'micro_batch: [1]\ndtype: [bf16]\nzero: ["2", "2+offload"]\n'


def offload_ceiling_bytes(model_name: str, seq_len: int, fit) -> int:
    """Halfway between the predicted peaks of ZeRO-2 and ZeRO-2 with offload, on ``fit``'s device."""
    from autotune.estimate import estimate_peak
    from autotune.spec.models import resolve_model

    model = resolve_model(model_name)
    without, offload = (
        estimate_peak(model, TrialConfig(micro_batch=1, dtype="bf16", zero=zero), seq_len, fit).total_bytes
        for zero in ("2", "2+offload")
    )
    if offload >= without:
        raise SystemExit(
            f"offload: predicted {offload / GiB:.2f} GiB with offload, {without / GiB:.2f} GiB without: nothing to show"
        )
    return (without + offload) // 2


def check(storage: str, study_name: str, out: Path) -> bool:
    from autotune.result import TrialResult
    from autotune.storage import load_study, schema
    from autotune.views.ranking import study_ranking

    study = load_study(storage, study_name)
    lines = ["| trial | zero | status | measured device peak | predicted host RAM |", "|---|---|---|---|---|"]
    statuses = {}
    for trial in study.get_trials(deepcopy=False):
        result = TrialResult.from_trial(trial)
        if result is None:
            continue
        zero = trial.params.get("zero", "")
        statuses[zero] = result.status
        host = result.memory_peaks.get(schema.TRIAL_PREDICTED_HOST_BYTES, 0)
        lines.append(
            f"| {trial.number} | {zero} | {result.status} | {result.peak_memory_bytes / GiB:.2f} GiB | {host / GiB:.2f} GiB |"
        )
    ranking = study_ranking(study)
    # zero 2 measured over the ceiling or out of memory (run for real: the search ran with --no-screen).
    shown = bool(ranking) and ranking[0].config.zero == "2+offload" and statuses.get("2") in ("over_ceiling", "oom")
    verdict = "offload made it fit" if shown else "offload did NOT make it fit"
    (out / "offload.md").write_text(text := "\n".join([f"# ZeRO offload on one GPU: {verdict}", "", *lines, ""]))
    print(text)
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ceiling = commands.add_parser("ceiling")
    ceiling.add_argument("model")
    ceiling.add_argument("seq_len", type=int)
    space = commands.add_parser("space")
    space.add_argument("path")
    checked = commands.add_parser("check")
    checked.add_argument("--storage", required=True)
    checked.add_argument("--study-name", required=True)
    checked.add_argument("--out", required=True)
    options = parser.parse_args()
    if options.command == "ceiling":
        from autotune.estimate import memory_prior
        from autotune.spec.devices import cuda_device

        print(
            f"{offload_ceiling_bytes(options.model, options.seq_len, memory_prior(cuda_device(0), os.environ)) // MiB}MiB"
        )
    elif options.command == "space":
        Path(options.path).write_text(SPACE)
    elif not check(options.storage, options.study_name, Path(options.out)):
        sys.exit(1)


if __name__ == "__main__":
    main()
