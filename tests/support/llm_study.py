"""What the end-to-end studies of the LLM path share (tests/support/sft_study.py, dpo_study.py): the search a
user runs on their rows, on the CPU, short, and each trial of the study with its result."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

from tests.support.cli import run_cli_in_process


@dataclasses.dataclass(frozen=True)
class RowsStudy:
    """Where a study lives (``root`` holds the rows, space.yaml, runs/) and how its search went."""

    root: Path
    storage: str
    search: subprocess.CompletedProcess


def search_rows(
    root: Path,
    dataset: str,
    storage: str,
    trials: int,
    seq_len: int,
    warmup_steps: int,
    max_measure_steps: int,
    model: str = "llama-tiny",
) -> subprocess.CompletedProcess:
    """``autotune search --model MODEL --dataset DATASET --device cpu`` in ``root`` over its ``space.yaml``
    (the entry point, in this process), with no confirmation re-runs and no pruning; it must succeed."""
    search = run_cli_in_process(
        *("search", "--model", model, "--dataset", dataset, "--device", "cpu", "--trials", str(trials)),
        *("--seq-len", str(seq_len), "--space", "space.yaml", "--storage", storage, "--work-dir", "runs"),
        *("--warmup-steps", str(warmup_steps), "--max-measure-steps", str(max_measure_steps)),
        *("--confirm-top", "0", "--prune-ratio", "0"),
        cwd=root,
    )
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    return search


def trials_with_results(storage: str, study_name: str) -> list[tuple[Any, dict[str, Any]]]:
    """Each trial of the study (Optuna's ``FrozenTrial``) with its result as the storage keeps it."""
    import json

    import optuna

    from autotune.storage import schema

    study = optuna.load_study(study_name=study_name, storage=storage)
    found = []
    for trial in study.get_trials():
        result = trial.user_attrs[schema.TRIAL_RESULT]
        found.append((trial, json.loads(result) if isinstance(result, str) else result))
    return found
