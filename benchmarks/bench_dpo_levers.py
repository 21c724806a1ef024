"""DPO on the CPU (issue 39 point 4): TRL's default DPOConfig against each lever alone and a combined
candidate, in real tokens/s (chosen + rejected rows' tokens, prompt included, never padding), interleaved.

llama-tiny from the catalog (TinyLlama's config scaled down: 32k vocabulary, untied head, GQA; the SFT
benchmark's model) at ``--layers`` layers (default its 8), random weights, the synthetic tokenizer, on generated preference pairs (``autotune chat-corpus --format
preference``) at ``--length-scale`` (default 1/8, as in the SFT benchmark: prompt + answer rows of some 65 tokens at the
median, an eighth of public chat data's lengths, since this is a shared 2-core CPU). Every variant trains in this one process through
``autotune.trainers.dpo.DPO.build`` (TRL's ``DPOTrainer`` as a trial builds it: ``dpo_trainer`` here,
the rows and the synthetic tokenizer saved as a search saves them, ``max_length`` DPOConfig's 1024), on the same
rows (one epoch: ``global batch x steps`` pairs, so a precomputed reference pass covers exactly what is
trained), ``--rounds`` times, the variants alternating within each round. A step's real tokens are the
Trainer's count (``include_num_input_tokens_seen="non_padding"``: the attention mask's ones).

"TRL's default DPOConfig" is ``DPOConfig()`` as a CPU run must set it: ``use_cpu=True`` (without it
transformers refuses DPOConfig's default ``bf16=True`` on a machine without a bf16 GPU:
training_args.py ``_validate_args``), so bf16 autocast, activation checkpointing, micro-batch 8, a
reference copy, ``max_length`` 1024. ``padding_free`` is not measured: DPOTrainer 1.16 warns and turns
it off (trl/trainer/dpo_trainer.py:732-739). Liger and activation offloading need CUDA.

Printed per variant: the median over the rounds of its steady real tokens/s (steps after the first) and
of its real tokens per CPU-second of this process (what a step costs, whatever share of the 2 cores the
other sessions leave it: on a loaded machine the steadier of the two), each with its ratio to TRL's
default, and, for ``precompute_ref_log_probs``, the one-epoch figure with the reference pass before
training counted in (what a one-epoch run gets), with the load average.

    python -m benchmarks.bench_dpo_levers --rounds 2 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from autotune.spec.model_catalog import catalog_entry
from autotune.spec.models import build_model
from autotune.trainers._preference_corpus import preference_rows
from autotune.trainers.dpo import TOKENS_COUNTED
from benchmarks._common import load_average

MODEL = "llama-tiny"
GLOBAL_BATCH = 8  # DPOConfig's per_device_train_batch_size, accumulation 1
MAX_LENGTH = 1024  # DPOConfig's max_length (--seq-len of a trial)

# Each lever alone on TRL's default, then the candidate the levers suggest together.
VARIANTS: dict[str, dict[str, Any]] = {
    "TRL default DPOConfig (bf16 autocast, checkpointing, mb 8, reference copy)": {},
    "checkpointing off": {"gradient_checkpointing": False},
    "precompute_ref_log_probs (no reference copy)": {"precompute_ref_log_probs": True},
    "dtype fp32 (bf16 off)": {"bf16": False},
    "micro-batch 4 x accumulation 2": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
    "micro-batch 2 x accumulation 4": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
    "micro-batch 1 x accumulation 8 (no padding)": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8},
    "combined: fp32, checkpointing off, precompute_ref_log_probs": {
        "bf16": False,
        "gradient_checkpointing": False,
        "precompute_ref_log_probs": True,
    },
}


def saved_dpo_rows(rows: list[dict[str, Any]], scratch: str, vocab_size: int) -> tuple[str, str]:
    """Preference ``rows`` saved under ``scratch`` as a search saves its prepared copy for DPOTrainer
    (``datasets.Dataset.save_to_disk``), and the synthetic tokenizer beside them
    (``autotune.spec.synthetic_tokenizer.tokenizer_dir``): the rows' and the tokenizer's directories."""
    import datasets

    from autotune.spec.synthetic_tokenizer import tokenizer_dir

    prepared = os.path.join(scratch, "prepared")
    datasets.Dataset.from_list(rows).save_to_disk(prepared)
    return prepared, tokenizer_dir(os.path.join(scratch, "tokenizers"), vocab_size)


def dpo_trainer(
    model: Any,
    saved: tuple[str, str],
    arguments: dict[str, Any],
    seq_len: int,
    callbacks: list[Any] | None = None,
    peft_config: Any = None,
) -> Any:
    """TRL's ``DPOTrainer`` as a ``--trainer dpo`` trial builds it (``autotune.trainers.dpo.DPO.build``), on
    the rows and tokenizer :func:`saved_dpo_rows` saved, each pair's rows truncated to ``seq_len``
    (``max_length``), every row once (no cycling: the steps read one epoch).

    Args:
        model: The model autotune built (``build_model``), not wrapped in adapters.
        arguments: ``DPOConfig`` keyword arguments (the levers' and the harness's).
        peft_config: A ``peft.PeftConfig``, which ``DPOTrainer`` applies itself (``--peft``).
    """
    from autotune.spec.models import keeps_reference_copy
    from autotune.trainers import TrialInputs, class_named
    from autotune.trainers.dpo import DPO

    prepared_dir, tokenizer_dir = saved
    inputs = TrialInputs(
        trainer_class=class_named(DPO.trainer_class),
        arguments_class=class_named(DPO.arguments_path),
        trainer_kwargs={},
        arguments=arguments,
        model=model,
        callbacks=callbacks or [],
        seq_len=seq_len,
        loss_on="all",
        rows_wanted=0,
        dataset=lambda: None,  # DPOTrainer prepares the rows itself (DPO.prepares_rows)
        collator=lambda: None,
        prepared_dir=prepared_dir,
        tokenizer_dir=tokenizer_dir,
        peft_config=peft_config,
        # As a trial decides it (runner._trial.build_trainer), the lever read here off the arguments.
        reference_copy=keeps_reference_copy(
            DPO.holds_reference, peft_config is not None, bool(arguments.get("precompute_ref_log_probs", False))
        ),
    )
    return DPO.build(inputs)


class StepClock(TrainerCallback):
    """Each optimizer step's seconds, on the wall clock and of this process's CPU time (all its threads:
    what the step cost, whatever share of the cores the other sessions left it), and the real tokens the
    Trainer counted in it."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self.tokens: list[int] = []
        self._started = (0.0, 0.0)
        self._seen = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = (time.perf_counter(), time.process_time())

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._started[0])
        self.cpu_seconds.append(time.process_time() - self._started[1])
        self.tokens.append(state.num_input_tokens_seen - self._seen)
        self._seen = state.num_input_tokens_seen


def model_config(layers: int) -> dict[str, Any]:
    config = {key: value for key, value in catalog_entry(MODEL).items() if not key.startswith("_")}
    return {**config, "num_hidden_layers": layers}


# The exported DPOConfig fields a run of this benchmark sets itself (the trial's harness), and the model's build.
HARNESS_FIELDS = ("output_dir", "use_cpu", "max_length", "max_steps", "num_train_epochs", "model_init_kwargs")


def winner_variant(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A search's winner as ``autotune export --format json`` wrote it (``DPOConfig(**json)``): its DPOConfig
    fields on top of TRL's default, and its model build (``model_init_kwargs``: dtype, attention kernel)."""
    exported = json.loads(Path(path).read_text())
    build = dict(exported.get("model_init_kwargs") or {})  # dtype by its torch name, as build_model takes it
    return {k: v for k, v in exported.items() if k not in HARNESS_FIELDS}, build


def measure(
    config: dict[str, Any],
    rows: list[dict],
    levers: dict[str, Any],
    steps: int,
    build: dict[str, Any] | None = None,
    epochs: float = 1.0,
) -> dict[str, float]:
    """One run of a variant: steady real tokens/s (steps after the first) and the set-up seconds; ``build``:
    the model's ``from_config`` keywords (a winner's dtype and attention kernel)."""
    torch.manual_seed(0)
    model = build_model(config, "causal-lm", **(build or {}))
    clock = StepClock()
    with tempfile.TemporaryDirectory() as scratch:
        arguments = {
            "output_dir": scratch,
            "use_cpu": True,
            "max_steps": steps,
            "report_to": "none",
            "logging_strategy": "no",
            "save_strategy": "no",
            "disable_tqdm": True,
            "include_num_input_tokens_seen": TOKENS_COUNTED,
            **levers,
        }
        saved = saved_dpo_rows(rows, scratch, config["vocab_size"])  # before the clock: a search saves them once
        built, built_cpu = time.perf_counter(), time.process_time()
        trainer = dpo_trainer(model, saved, arguments, MAX_LENGTH, [clock])
        setup_s, setup_cpu_s = time.perf_counter() - built, time.process_time() - built_cpu
        trainer.train()
    steady_s, steady_cpu_s, steady_tokens = sum(clock.seconds[1:]), sum(clock.cpu_seconds[1:]), sum(clock.tokens[1:])
    # ``epochs`` over these rows with the reference pass (in set-up under precompute) counted once, as the
    # ranking counts it over the user's run (autotune.result.over_the_run): its share of the steps measured.
    share = (steps - 1) / steps / epochs
    precomputes = bool(levers.get("precompute_ref_log_probs"))
    return {
        "steady": steady_tokens / steady_s,
        "steady_cpu": steady_tokens / steady_cpu_s,
        "epoch": steady_tokens / (steady_s + share * setup_s) if precomputes else steady_tokens / steady_s,
        "epoch_cpu": steady_tokens / (steady_cpu_s + share * setup_cpu_s) if precomputes else 0.0,
        "setup_s": setup_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run, the first one warm-up")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--length-scale", type=float, default=0.125)
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (prefixes)")
    parser.add_argument(
        "--winner", metavar="JSON", help="a search's exported DPOConfig JSON (autotune export), run as one more variant"
    )
    parser.add_argument(
        "--epochs", type=float, default=1.0, help="passes of the user's run the reference pass is counted over"
    )
    options = parser.parse_args()
    config = model_config(options.layers)
    variants = {
        name: levers
        for name, levers in VARIANTS.items()
        if options.only is None or any(name.startswith(prefix) for prefix in options.only)
    }
    builds: dict[str, dict[str, Any]] = {}
    if options.winner:
        levers, build = winner_variant(options.winner)
        variants["the search's winner (its exported DPOConfig)"] = levers
        builds["the search's winner (its exported DPOConfig)"] = build
    # Every variant trains the same pairs, from the first: as many as its global batch takes in the steps.
    batch = max(
        int(v.get("per_device_train_batch_size", GLOBAL_BATCH)) * int(v.get("gradient_accumulation_steps", 1))
        for v in variants.values()
    )
    rows = preference_rows(batch * options.steps, seed=0, length_scale=options.length_scale)
    print(f"torch {torch.__version__}, {MODEL} config at {options.layers} layers, {len(rows)} pairs, {load_average()}")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for round_number in range(options.rounds):
        for name, levers in variants.items():
            # One epoch of its own global batch: a precomputed pass covers exactly the pairs its steps train.
            own = int(levers.get("per_device_train_batch_size", GLOBAL_BATCH)) * int(
                levers.get("gradient_accumulation_steps", 1)
            )
            result = measure(
                config, rows[: own * options.steps], levers, options.steps, builds.get(name), options.epochs
            )
            results[name].append(result)
            print(
                f"round {round_number}: {name}: {result['steady']:.0f} real tokens/s steady "
                f"({result['steady_cpu']:.1f} per CPU-second), set-up {result['setup_s']:.1f} s, {load_average()}",
                flush=True,
            )
    first = next(iter(results.values()))
    baseline = statistics.median(r["steady"] for r in first)
    baseline_cpu = statistics.median(r["steady_cpu"] for r in first)
    rounds = " | ".join(f"round {n}" for n in range(options.rounds))
    print(f"\n| variant | real tokens/s: {rounds} | median | vs default | per CPU-second: median | vs default |")
    for name, runs in results.items():
        median = statistics.median(r["steady"] for r in runs)
        median_cpu = statistics.median(r["steady_cpu"] for r in runs)
        cells = " | ".join(f"{r['steady']:.0f}" for r in runs)
        epoch = statistics.median(r["epoch_cpu"] for r in runs)
        over_run = statistics.median(r["epoch"] for r in runs)
        note = (
            f" (over {options.epochs:g} epoch(s), reference pass counted: {over_run:.0f} real tokens/s, "
            f"{over_run / baseline:.2f}x; per CPU-second {epoch:.1f}, {epoch / baseline_cpu:.2f}x)"
            if epoch
            else ""
        )
        print(
            f"| {name} | {cells} | {median:.0f} | {median / baseline:.2f}x | {median_cpu:.1f} | "
            f"{median_cpu / baseline_cpu:.2f}x{note} |"
        )
    print(load_average())


if __name__ == "__main__":
    main()
