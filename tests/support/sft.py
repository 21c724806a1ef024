"""Workloads under ``--trainer sft`` for the tests: the generated chat corpus, prepared as a search
prepares it (``autotune.spec.dataset.prepare_sft_rows``), llama-tiny from the catalog with the synthetic
tokenizer, short sequences and a short measurement (tests check behaviour, not speed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.spec.chat_corpus import write_jsonl

SEQ_LEN = 64
# Turns a tenth of public chat data's length: most conversations fit 64 tokens, some do not (truncated).
LENGTH_SCALE = 0.1


def chat_file(root: Path, fmt: str = "messages", samples: int = 120) -> Path:
    path = root / f"chat-{fmt}.jsonl"
    if not path.is_file():
        write_jsonl(str(path), samples, seed=0, fmt=fmt, length_scale=LENGTH_SCALE)
    return path


def sft_workload(root: Path, fmt: str = "messages", loss_on: str = "all", **fields: Any) -> Any:
    """A workload of llama-tiny on the chat corpus under SFTTrainer, as ``autotune search`` makes it."""
    from autotune.runner import Workload
    from autotune.spec.dataset import prepare_sft_rows
    from autotune.spec.measure import MeasureSettings
    from autotune.spec.models import resolve_model
    from autotune.trainers import get, with_model

    model = with_model(resolve_model("llama-tiny"), get("sft"))
    measure = MeasureSettings(warmup_steps=1, min_steps=3, max_steps=3, max_seconds=60.0, cv_target=1.0)
    dataset = prepare_sft_rows(
        str(chat_file(root, fmt)),
        model,
        fmt,
        loss_on,
        8,
        measure.total_steps_cap,
        str(root / "datasets"),
        [],
        fields.get("seq_len", SEQ_LEN),
        get("sft"),
    )
    settings = {"seq_len": SEQ_LEN, "ceiling_bytes": 8 * 1024**3, "measure": measure, "dataset": dataset}
    return Workload.for_model(model, trainer="sft", loss_on=loss_on, **{**settings, **fields})
