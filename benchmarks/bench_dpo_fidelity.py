"""Fidelity under ``--trainer dpo``: does the exported DPOConfig train as fast, in as much memory, as the study recorded?

1. Runs a real DPO search through the CLI on generated preference pairs (``autotune chat-corpus --format
   preference``, ``autotune search``: the rows choose DPOTrainer) and exports the winner's DPOConfig JSON
   (``autotune export``).
2. Trains that JSON with a plain ``trl.DPOTrainer`` in a fresh Python process that imports nothing from
   autotune (checked: it reports any ``autotune`` module it finds loaded), as ``trl dpo`` builds it
   (trl/scripts/dpo.py:101-108): ``DPOTrainer(model=<directory>, args=DPOConfig(output_dir=...,
   **json.load(f)), train_dataset=..., processing_class=<tokenizer>)``. The model is the catalog's, saved
   with ``save_pretrained``, so DPOTrainer loads it by name with the export's ``model_init_kwargs`` (dtype,
   attention) and loads its reference model beside it from the same directory, with the same
   ``model_init_kwargs`` (trl/trainer/dpo_trainer.py:560-574, 915-927), or none under
   ``precompute_ref_log_probs`` (:908-914): what the user's run holds. (The trial hands DPOTrainer a copy of
   the model it built, which has no path to load from: ``autotune.trainers.dpo``.) The rows are the study's
   prepared rows (the Arrow copy the trials read), copied afresh for each run so that TRL's cache of a
   precomputed reference pass beside them (dpo_trainer.py:1168-1185) is not found, as on a user's first run;
   repeated in order to as many rows as the trial had, with the trial's ``seed`` (0): the same pairs in the
   same order.
3. Measures the winner again, alternating the plain run with autotune's own runner (``--rounds`` each), and
   compares real (non-padding) tokens/s of the steps and peak memory with each other and with the study's
   record of the winner. Under ``precompute_ref_log_probs`` the study counts the reference pass over the
   user's run (``autotune.result.over_the_run``): the plain run's pass is timed too and counted the same
   way, and both rates are shown.

Goals (docs/benchmarks.md): tokens/s within 5 %, peak memory within 10 %.

    python -m benchmarks.bench_dpo_fidelity --seq-len 128 --trials 3 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_sft_fidelity import (
    PLAIN_HARNESS,
    fidelity_parser,
    median,
    plain_child,
    plain_run,
    ratio,
    remeasure,
    report,
    save_model,
    study_workload,
    trial_rows,
)

ROWS = "prefs.jsonl"
# The space of the benchmark: the levers of DPO's lever benchmark (docs/benchmarks.md, "DPO"), the reference
# pass among them.
SPACE = """\
micro_batch: [4, 8]
checkpointing: [true, false]
dtype: [bf16]
weight_dtype: [fp32, bf16]
optim: [adamw_torch_fused]
precompute_ref_log_probs: [false, true]
attn_implementation: [sdpa, eager]
"""


def timed_reference_pass(trainer_class: type) -> type:
    """``trainer_class`` whose reference pass before training (``_precompute_ref_logps``, run in ``__init__``
    under ``precompute_ref_log_probs``: dpo_trainer.py:1013-1019) leaves its seconds and pairs in
    ``reference_pass``; the pass itself unchanged. (The plain run imports nothing of autotune, whose trial
    times the pass the same way: ``autotune.trainers.dpo.timed_setup_pass``.)"""

    class Timed(trainer_class):
        reference_pass = (0.0, 0)

        def _precompute_ref_logps(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            done = super()._precompute_ref_logps(dataset, *args, **kwargs)
            seconds, pairs = self.reference_pass
            self.reference_pass = (seconds + time.perf_counter() - started, pairs + len(dataset))
            return done

    return Timed


def plain_dpo_trainer(args_file: str, model_dir: str, rows_dir: str, rows: int, max_steps: int, callbacks: list) -> Any:
    """The plain ``DPOTrainer`` of the exported JSON, built as ``trl dpo`` builds it: only transformers, TRL
    and datasets. ``rows``: how many pairs it trains on, the prepared pairs repeated in order (after TRL's
    preparation and its reference pass, which stays one pass over the pairs, as in the trial)."""
    import datasets
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    exported = json.loads(Path(args_file).read_text())
    arguments = DPOConfig(
        output_dir=tempfile.mkdtemp(prefix="plain-dpo-"), max_steps=max_steps, **PLAIN_HARNESS, **exported
    )
    fresh = Path(tempfile.mkdtemp(prefix="plain-dpo-rows-")) / "rows"  # no cache of an earlier reference pass
    shutil.copytree(rows_dir, fresh, ignore=shutil.ignore_patterns("cache-*.arrow"))
    trainer = timed_reference_pass(
        DPOTrainer
    )(
        model=model_dir,  # by name: model_init_kwargs, and the reference loaded beside it (dpo_trainer.py:560-574, 915-927)
        args=arguments,
        train_dataset=datasets.load_from_disk(str(fresh)),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=callbacks,
    )
    prepared = trainer.train_dataset
    if len(prepared) < rows:
        trainer.train_dataset = prepared.select([index % len(prepared) for index in range(rows)])
    return trainer


def plain_dpo_run(args_file: str, model_dir: str, rows_dir: str, rows: int, warmup_steps: int, steps: int) -> dict:
    """Train the exported DPOConfig in a plain DPOTrainer; its real tokens/s over the steps, its peak RSS and
    its reference pass before training (seconds, pairs; none without ``precompute_ref_log_probs``)."""
    built: list[Any] = []

    def trainer_of(callbacks: list) -> Any:
        built.append(plain_dpo_trainer(args_file, model_dir, rows_dir, rows, warmup_steps + steps, callbacks))
        return built[0]

    measured = plain_run(trainer_of, warmup_steps)
    seconds, pairs = built[0].reference_pass
    return {
        **measured,
        "setup_pass_s": seconds,
        "setup_pass_samples": pairs,
        "reference": built[0].ref_model is not None,
    }


# ---- the parent: search, export, the plain run and the runner alternately ----------------------------


def search_and_export(options: argparse.Namespace, root: Path, storage: str) -> None:
    from benchmarks.bench_fidelity import run

    autotune = [sys.executable, "-m", "autotune"]
    corpus = ("chat-corpus", "--format", "preference", "--samples", str(options.samples))
    run([*autotune, *corpus, "--length-scale", str(options.length_scale), "--out", ROWS], root)
    # --precomputed: the reference pass in every config, so the winner is one that precomputes (its fidelity:
    # the plain run's pass timed and counted over the user's run as the study counts the trial's).
    space = SPACE.replace("[false, true]", "[true]") if options.precomputed else SPACE
    (root / "space.yaml").write_text(space)
    run(
        [
            *autotune,
            *("search", "--model", options.model, "--device", "cpu", "--dataset", ROWS),
            *("--seq-len", str(options.seq_len), "--space", "space.yaml"),
            *("--storage", storage, "--trials", str(options.trials), "--work-dir", "runs"),
            *("--warmup-steps", str(options.warmup_steps), "--max-measure-steps", str(options.max_measure_steps)),
            *("--confirm-top", str(options.confirm_top)),
        ],
        root,
    )
    print(run([*autotune, "export", "--storage", storage, "--out", "best.json"], root).strip())


def run_plain(root: Path, workload: Any, rows: int, steps: int) -> dict:
    """The plain DPOTrainer in a fresh process (``--plain``), from the export's directory."""
    command = [
        *(sys.executable, "-m", "benchmarks.bench_dpo_fidelity", "--plain", str(root / "best.json")),
        *("--model-dir", str(root / "model"), "--rows-dir", workload.dataset.prepared_dir, "--rows", str(rows)),
        *("--warmup-steps", "3", "--plain-steps", str(steps)),
    ]
    return plain_child(command, root)


def passes_of(workload: Any, config: Any) -> float:
    """How often the user's run goes over its pairs, as the trial counts it (``autotune.runner``)."""
    from autotune.result import passes_over_data

    return passes_over_data(workload.run_length, config.global_batch, workload.dataset.num_samples)


def steps_only(measured: dict, passes: float) -> float:
    """Real tokens/s of the steps alone: a runner's rate has the reference pass's share taken out again
    (``over_the_run``, inverted: its samples/s is the global batch's over a step), a plain run's is already."""
    seconds, samples = measured["setup_pass_s"], measured["setup_pass_samples"]
    over = measured.get("samples_per_s")
    if not samples or over is None:
        return float(measured["real_tokens_per_s"])
    steady = 1.0 / (1.0 / over - seconds / samples / passes)
    return float(measured["real_tokens_per_s"]) * steady / over


def over_the_run_tokens(measured: dict, global_batch: int, passes: float) -> float:
    """A plain run's real tokens/s over the user's run: its steps' rate with its reference pass's share, as
    the study counts a trial's (``autotune.result.over_the_run``, on the pairs a second of its steps train)."""
    from autotune.result import over_the_run

    seconds, samples = measured["setup_pass_s"], measured["setup_pass_samples"]
    if not samples:
        return float(measured["real_tokens_per_s"])
    pairs_per_s = measured["steps_per_s"] * global_batch
    return float(measured["real_tokens_per_s"]) * over_the_run(pairs_per_s, seconds / samples, passes) / pairs_per_s


def main() -> None:
    parser = fidelity_parser(__doc__, (200, "Preference pairs of the generated corpus."), 10, 10)
    parser.add_argument("--length-scale", type=float, default=0.125, help="chat-corpus --length-scale.")
    parser.add_argument(
        "--precomputed",
        action="store_true",
        help="search only configs with precompute_ref_log_probs (its winner's fidelity)",
    )
    options = parser.parse_args()

    if options.plain:
        from benchmarks._common import PLAIN_RESULT_MARK

        measured = plain_dpo_run(
            options.plain,
            options.model_dir,
            options.rows_dir,
            options.rows,
            options.warmup_steps,
            options.plain_steps,
        )
        print(PLAIN_RESULT_MARK + json.dumps(measured), flush=True)
        return

    from benchmarks._common import load_average, searched_winner

    print(load_average())
    root, storage, winner = searched_winner(
        options.reuse, "bench-dpo-fidelity-", lambda root, storage: search_and_export(options, root, storage)
    )
    workload = study_workload(root, options, ROWS)
    if not (root / "model").is_dir():
        save_model(workload, root / "model")
    rows = trial_rows(workload, winner.config)
    passes = passes_of(workload, winner.config)
    print(f"winner #{winner.number}: {winner.config.short()}; exported {root / 'best.json'}; {load_average()}")

    plain_runs, autotune_runs = [], []
    for index in range(options.rounds):
        plain = run_plain(root, workload, rows, options.plain_steps)
        runner = remeasure(workload, winner.config, root / f"remeasure-{index}")
        # Steps alone, then over the user's run (the reference pass's share, where it ran one), side by side.
        plain_runs.append({**plain, "over_the_run": over_the_run_tokens(plain, winner.config.global_batch, passes)})
        autotune_runs.append(
            {**runner, "real_tokens_per_s": steps_only(runner, passes), "over_the_run": runner["real_tokens_per_s"]}
        )
        print(
            f"round {index + 1}: steps' real tokens/s plain {plain_runs[-1]['real_tokens_per_s']:.0f} "
            f"({plain['attn_implementation']}, {plain['weight_dtype']}, reference model held: {plain['reference']}), "
            f"autotune {autotune_runs[-1]['real_tokens_per_s']:.0f}; reference pass plain "
            f"{plain['setup_pass_s']:.2f} s over {plain['setup_pass_samples']} pairs, autotune "
            f"{runner['setup_pass_s']:.2f} s over {runner['setup_pass_samples']}; peak RSS plain "
            f"{plain['peak_rss_bytes'] / 1024**2:.0f} MiB, autotune {runner['peak_rss_bytes'] / 1024**2:.0f} MiB; "
            f"{load_average()}",
            flush=True,
        )

    report(plain_runs, autotune_runs, winner, options, "DPOTrainer (steps alone)")
    if any(run["setup_pass_samples"] for run in plain_runs):
        plain_over, runner_over = median(plain_runs, "over_the_run"), median(autotune_runs, "over_the_run")
        print(
            f"over the user's run ({passes:g} passes over the pairs, the reference pass's share counted): plain "
            f"{plain_over:.0f} real tokens/s, runner {runner_over:.0f}: {ratio(plain_over, runner_over)}"
        )
    print(load_average())


if __name__ == "__main__":
    main()
