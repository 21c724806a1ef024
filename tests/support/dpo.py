"""Workloads under ``--trainer dpo`` for the tests: generated preference pairs, prepared as a search prepares
them (``autotune.spec.dataset.prepare_sft_rows`` with DPO as their reader), llama-tiny from the catalog with
the synthetic tokenizer, short sequences and a short measurement (tests check behaviour, not speed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SEQ_LEN = 64
# A twentieth of public chat data's length: prompt + answer rows of some 20 tokens, a few past 64.
LENGTH_SCALE = 0.05


def preference_file(root: Path, samples: int = 48) -> Path:
    from autotune.trainers import write_corpus

    path = root / "prefs.jsonl"
    if not path.is_file():
        write_corpus(str(path), samples, fmt="preference", length_scale=LENGTH_SCALE)
    return path


def dpo_workload(root: Path, peft: str | None = None, **fields: Any) -> Any:
    """A workload of llama-tiny (its adapters under ``--peft peft``) on preference pairs under DPOTrainer,
    as ``autotune search`` makes it."""
    from autotune.runner import Workload
    from autotune.spec.dataset import prepare_sft_rows
    from autotune.spec.devices import cpu_device
    from autotune.spec.measure import MeasureSettings
    from autotune.spec.models import resolve_model
    from autotune.spec.peft import with_peft
    from autotune.trainers import get, with_model

    model = resolve_model("llama-tiny")
    model = with_model(with_peft(model, peft, cpu_device(), []) if peft else model, get("dpo"))
    measure = MeasureSettings(warmup_steps=1, min_steps=2, max_steps=2, max_seconds=60.0, cv_target=1.0)
    cache = str(root / "datasets")
    data = str(preference_file(root))
    dataset = prepare_sft_rows(
        data, model, "preference", "all", 8, measure.total_steps_cap, cache, [], SEQ_LEN, get("dpo")
    )
    settings = {"seq_len": SEQ_LEN, "ceiling_bytes": 8 * 1024**3, "measure": measure, "dataset": dataset}
    return Workload.for_model(model, trainer="dpo", **{**settings, **fields})
