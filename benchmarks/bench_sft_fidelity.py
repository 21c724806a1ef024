"""Fidelity under ``--trainer sft``: does the exported SFTConfig train as fast, in as much memory, as the study recorded?

1. Runs a real SFT search through the CLI on the generated chat corpus (``autotune chat-corpus``,
   ``autotune search --trainer sft``) and exports the winner's SFTConfig JSON (``autotune export``).
2. Trains that JSON with a plain ``trl.SFTTrainer`` in a fresh Python process that imports nothing
   from autotune (checked: it reports any ``autotune`` module it finds loaded):
   ``SFTTrainer(model=<directory>, args=SFTConfig(output_dir=..., **json.load(f)), train_dataset=...,
   processing_class=<tokenizer>)``. The model is the catalog's, saved with ``save_pretrained``, so
   SFTTrainer loads it by name and applies the export's ``model_init_kwargs`` (dtype, attention), as
   a user's run does. The rows are the study's prepared rows (the Arrow copy the trials read,
   longest kept first: ``autotune.spec.dataset.prepare_sft_rows``), repeated in order to as many
   rows as the trial had, and the trial's ``seed`` (0): the same samples in the same order, so the
   tokens of a step match (docs/benchmarks.md, "Fidelity").
3. Measures the winner again, alternating the plain run with autotune's own runner (``--rounds``
   each), and compares real (non-padding) tokens/s and peak memory with each other and with the
   study's record of the winner.

Goals (docs/benchmarks.md): tokens/s within 5 %, peak memory within 10 %.

    python -m benchmarks.bench_sft_fidelity --seq-len 128 --trials 3 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# What the plain run adds to the exported arguments: its own output and length, nothing a trial exports
# (the trial's are autotune.runner._trial.harness_arguments). seed is the trial's, for the same row order.
PLAIN_HARNESS = {
    "report_to": "none",
    "save_strategy": "no",
    "logging_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
}
# The space of the benchmark (and of its test): the levers that change how SFT rows are batched.
SPACE = """\
micro_batch: [4, 8]
checkpointing: [true, false]
dtype: [bf16]
weight_dtype: [fp32, bf16]
optim: [adamw_torch_fused]
packing: ["off", padding_free, bfd]
attn_implementation: [sdpa, eager]
"""


def keep_start(rows: Any, seq_len: int) -> Any:
    """What the export's note says to do where ``max_length`` is ``None`` (padding-free batches without
    packing): TRL's own truncation of the tokenized rows (trl/trainer/sft_trainer.py:1436-1463,
    ``truncation_mode="keep_start"``), a row left without a label dropped."""

    def cut(row: dict[str, Any]) -> dict[str, Any]:
        return {"input_ids": row["input_ids"][:seq_len], "labels": row["labels"][:seq_len]}

    return rows.map(cut).filter(lambda row: any(label != -100 for label in row["labels"]))


def plain_sft_trainer(
    args_file: str, model_dir: str, rows_dir: str, rows: int, seq_len: int, max_steps: int, callbacks: list
) -> Any:
    """The plain ``SFTTrainer`` of the exported JSON, built as a user builds it: only transformers, TRL
    and datasets. ``rows``: how many rows it trains on, the prepared rows repeated in order."""
    import datasets
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    exported = json.loads(Path(args_file).read_text())
    arguments = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="plain-sft-"), max_steps=max_steps, **PLAIN_HARNESS, **exported
    )
    trainer = SFTTrainer(
        model=model_dir,  # by name: SFTTrainer applies model_init_kwargs (trl/trainer/sft_trainer.py:544-547)
        args=arguments,
        train_dataset=datasets.load_from_disk(rows_dir),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=callbacks,
    )
    prepared = trainer.train_dataset
    if arguments.max_length is None:
        prepared = keep_start(prepared, seq_len)
    if len(prepared) < rows:
        prepared = prepared.select([index % len(prepared) for index in range(rows)])
    trainer.train_dataset = prepared
    return trainer


def plain_sft_run(
    args_file: str, model_dir: str, rows_dir: str, rows: int, seq_len: int, warmup_steps: int, steps: int
) -> dict:
    """Train the exported SFTConfig in a plain SFTTrainer; return its real tokens/s and peak RSS."""
    return plain_run(
        lambda callbacks: plain_sft_trainer(
            args_file, model_dir, rows_dir, rows, seq_len, warmup_steps + steps, callbacks
        ),
        warmup_steps,
    )


def plain_run(trainer_of: Callable[[list], Any], warmup_steps: int) -> dict:
    """Train the plain trainer ``trainer_of(callbacks)`` builds (its ``max_steps``: the warm-up and the timed
    steps); return its real tokens/s over the steps after ``warmup_steps``, its peak RSS, and what it loaded."""
    import resource

    from benchmarks._common import AnonPeak, StepEnds

    anon = AnonPeak()
    anon.start()
    clock = StepEnds()
    trainer = trainer_of([clock])
    tokens_per_step = []
    fetch = trainer.get_batch_samples

    def counted(*args: Any, **kwargs: Any) -> Any:  # the real tokens of each optimizer step, as it is fetched
        batches, items = fetch(*args, **kwargs)
        tokens_per_step.append(sum(real_tokens(batch) for batch in batches))
        return batches, items

    trainer.get_batch_samples = counted
    trainer.train()
    peak_anon = anon.stop()
    measured = clock.times[warmup_steps - 1 :]  # from the end of the last warm-up step
    tokens = sum(tokens_per_step[warmup_steps : warmup_steps + len(measured) - 1])
    model = trainer.model
    return {
        "real_tokens_per_s": tokens / (measured[-1] - measured[0]),
        "steps": len(measured) - 1,
        "steps_per_s": (len(measured) - 1) / (measured[-1] - measured[0]),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_anon_rss_bytes": peak_anon,
        "attn_implementation": model.config._attn_implementation,
        "weight_dtype": str(next(model.parameters()).dtype),
        "autotune_modules": sorted(name for name in sys.modules if name.split(".")[0] == "autotune"),
    }


def real_tokens(batch: dict[str, Any]) -> int:
    """A micro-batch's non-padding tokens: its attention mask's ones, else every token (TRL's padding-free
    and packed rows carry position ids and no padding)."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


# ---- the parent: search, export, the plain run and the runner alternately ----------------------------


def study_workload(root: Path, options: argparse.Namespace, dataset: str = "chat.jsonl") -> Any:
    """The search's workload, rebuilt from its options (the prepared rows and tokenizer are reused);
    ``dataset``: the rows the search read, in ``root``."""
    from autotune.plan import PlanOptions, plan

    return plan(
        PlanOptions(
            model=options.model,
            device="cpu",
            seq_len=options.seq_len,
            space=str(root / "space.yaml"),
            dataset=str(root / dataset),
            work_dir=str(root / "runs"),
            warmup_steps=options.warmup_steps,
            max_measure_steps=options.max_measure_steps,
        )
    ).workload


def save_model(workload: Any, model_dir: Path) -> None:
    """The catalog model in fp32 and the study's tokenizer, saved where SFTTrainer loads them by name."""
    import torch
    from transformers import AutoTokenizer

    from autotune.spec.models import build_model

    torch.manual_seed(0)
    build_model(workload.model.hf_config, workload.model.task).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(workload.dataset.tokenizer_dir).save_pretrained(model_dir)


def trial_rows(workload: Any, config: Any) -> int:
    """How many rows the winner's trial trained on (``autotune.trainers.sft``, ``dpo``: cycled to what its
    steps take)."""
    return config.global_batch * (workload.measure.total_steps_cap + 1)


def search_and_export(options: argparse.Namespace, root: Path, storage: str) -> None:
    from benchmarks.bench_fidelity import run

    autotune = [sys.executable, "-m", "autotune"]
    run([*autotune, "chat-corpus", "--out", "chat.jsonl", "--samples", str(options.samples)], root)
    (root / "space.yaml").write_text(SPACE)
    run(
        [
            *autotune,
            *("search", "--model", options.model, "--device", "cpu", "--dataset", "chat.jsonl"),
            *("--trainer", "sft", "--seq-len", str(options.seq_len), "--space", "space.yaml"),
            *("--storage", storage, "--trials", str(options.trials), "--work-dir", "runs"),
            *("--warmup-steps", str(options.warmup_steps), "--max-measure-steps", str(options.max_measure_steps)),
            *("--confirm-top", str(options.confirm_top)),
        ],
        root,
    )
    print(run([*autotune, "export", "--storage", storage, "--out", "best.json"], root).strip())


def run_plain(root: Path, workload: Any, rows: int, steps: int) -> dict:
    """The plain SFTTrainer in a fresh process (``--plain``), from the export's directory."""
    command = [
        *(sys.executable, "-m", "benchmarks.bench_sft_fidelity", "--plain", str(root / "best.json")),
        *("--model-dir", str(root / "model"), "--rows-dir", workload.dataset.prepared_dir, "--rows", str(rows)),
        *("--seq-len", str(workload.seq_len), "--warmup-steps", "3", "--plain-steps", str(steps)),
    ]
    return plain_child(command, root)


def plain_child(command: list[str], cwd: Path) -> dict:
    """Run a benchmark's plain-run child (``command``) from ``cwd`` with the repository on its path; what its
    result line holds, checked to come from a process that imported nothing from autotune."""
    import subprocess

    from benchmarks._common import PLAIN_RESULT_MARK

    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": path})
    if done.returncode != 0:
        raise SystemExit(f"plain run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    (line,) = [line for line in done.stdout.splitlines() if line.startswith(PLAIN_RESULT_MARK)]
    measured = json.loads(line.removeprefix(PLAIN_RESULT_MARK))
    if measured["autotune_modules"]:
        raise SystemExit(f"the plain run imported autotune: {measured['autotune_modules']}")
    return measured


def remeasure(workload: Any, config: Any, work_dir: Path) -> dict:
    """The winner measured again by autotune's runner, as a confirmation re-run is (its real tokens/s, under
    DPO's precomputed reference counted over the user's run, and the seconds and samples of that pass)."""
    from autotune.runner import TrialJob, run_isolated

    result = run_isolated(TrialJob(workload=workload, config=config, work_dir=str(work_dir)), timeout_s=900)
    if result.status != "ok":
        raise SystemExit(f"autotune re-measurement failed: {result.status} {result.error}")
    return {
        "real_tokens_per_s": result.real_tokens_per_s,
        "samples_per_s": result.samples_per_s,
        "peak_rss_bytes": result.peak_memory_bytes,
        "peak_anon_rss_bytes": result.memory_peaks.get("peak_anon_rss_tree_sampled_bytes", 0),
        "setup_pass_s": result.setup_pass_s,
        "setup_pass_samples": result.setup_pass_samples,
    }


def median(runs: list[dict], key: str) -> float:
    import statistics

    return statistics.median(r[key] for r in runs)


def ratio(a: float, b: float) -> str:
    return f"{(a / b - 1):+.1%}"


def report(
    plain_runs: list[dict], autotune_runs: list[dict], winner: Any, options: argparse.Namespace, trainer: str
) -> None:
    """The medians of the alternating rounds side by side (real tokens/s, peak RSS) and against the study's
    record of the winner; ``trainer``: the plain run's class, in words."""
    plain_speed = median(plain_runs, "real_tokens_per_s")
    print(
        f"\n{'real tokens/s (medians over ' + str(options.rounds) + ' rounds)':<50}{'tokens/s':>10} {'plain vs it':>12}"
    )
    print(f"{'plain ' + trainer + ' (' + str(options.plain_steps) + ' steps)':<50}{plain_speed:10.0f}")
    rows_out = [
        ("autotune runner, alternating with the plain run", median(autotune_runs, "real_tokens_per_s")),
        ("study record: search-time", winner.result.real_tokens_per_s),
    ]
    for label, value in rows_out:
        print(f"{label:<50}{value:10.0f} {ratio(plain_speed, value):>12}")
    recorded_peak = max(winner.result.peak_memory_bytes, winner.peak_memory_bytes)
    plain_rss = median(plain_runs, "peak_rss_bytes")
    runner_rss = median(autotune_runs, "peak_rss_bytes")
    print(
        f"\npeak RSS (goal: within 10 %): plain {plain_rss / 1024**2:.0f} MiB, runner alternating "
        f"{runner_rss / 1024**2:.0f} MiB ({ratio(plain_rss, runner_rss)}), study {recorded_peak / 1024**2:.0f} MiB "
        f"({winner.result.memory_source}): {ratio(plain_rss, recorded_peak)}"
    )
    plain_anon, runner_anon = median(plain_runs, "peak_anon_rss_bytes"), median(autotune_runs, "peak_anon_rss_bytes")
    if runner_anon:
        print(
            f"  anonymous RSS: plain {plain_anon / 1024**2:.0f} MiB, runner {runner_anon / 1024**2:.0f} MiB: "
            f"{ratio(plain_anon, runner_anon)}"
        )


def fidelity_parser(
    doc: str, samples: tuple[int, str], max_measure_steps: int, plain_steps: int
) -> argparse.ArgumentParser:
    """The options the fidelity benchmarks of TRL's trainers share (``samples``: the corpus's default size and
    what it counts), and those of their plain-run child."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--samples", type=int, default=samples[0], help=samples[1])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--max-measure-steps", type=int, default=max_measure_steps)
    parser.add_argument("--confirm-top", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="Alternating plain / autotune measurements.")
    parser.add_argument(
        "--plain-steps", type=int, default=plain_steps, help="Timed steps of the plain run, after 3 warm-up."
    )
    parser.add_argument("--reuse", metavar="DIR", help="A finished run's directory: measure its winner again.")
    parser.add_argument("--plain", metavar="ARGS_JSON", help=argparse.SUPPRESS)  # the child mode, with:
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--rows-dir", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = fidelity_parser(__doc__, (400, "Conversations of the chat corpus."), 20, 20)
    parser.add_argument(
        "--remeasure-steps",
        type=int,
        help="Measured steps of each re-measurement by the runner (default: the search's --max-measure-steps).",
    )
    options = parser.parse_args()

    if options.plain:
        from benchmarks._common import PLAIN_RESULT_MARK

        measured = plain_sft_run(
            options.plain,
            options.model_dir,
            options.rows_dir,
            options.rows,
            options.seq_len,
            options.warmup_steps,
            options.plain_steps,
        )
        print(PLAIN_RESULT_MARK + json.dumps(measured), flush=True)
        return

    from benchmarks._common import load_average, searched_winner

    print(load_average())
    root, storage, winner = searched_winner(
        options.reuse, "bench-sft-fidelity-", lambda root, storage: search_and_export(options, root, storage)
    )
    workload = study_workload(root, options)
    if not (root / "model").is_dir():
        save_model(workload, root / "model")
    if options.remeasure_steps is not None:  # after the plan: the prepared rows stay the search's
        import dataclasses

        shorter = dataclasses.replace(
            workload.measure, min_steps=options.remeasure_steps, max_steps=options.remeasure_steps
        )
        workload = dataclasses.replace(workload, measure=shorter)
    rows = trial_rows(workload, winner.config)
    print(f"winner #{winner.number}: {winner.config.short()}; exported {root / 'best.json'}; {load_average()}")

    plain_runs, autotune_runs = [], []
    for index in range(options.rounds):
        plain_runs.append(run_plain(root, workload, rows, options.plain_steps))
        autotune_runs.append(remeasure(workload, winner.config, root / f"remeasure-{index}"))
        print(
            f"round {index + 1}: plain {plain_runs[-1]['real_tokens_per_s']:.0f} tokens/s "
            f"({plain_runs[-1]['attn_implementation']}, {plain_runs[-1]['weight_dtype']}), "
            f"autotune {autotune_runs[-1]['real_tokens_per_s']:.0f} tokens/s; peak RSS plain "
            f"{plain_runs[-1]['peak_rss_bytes'] / 1024**2:.0f} MiB, autotune {autotune_runs[-1]['peak_rss_bytes'] / 1024**2:.0f} MiB; "
            f"{load_average()}",
            flush=True,
        )

    report(plain_runs, autotune_runs, winner, options, "SFTTrainer")
    print(load_average())


if __name__ == "__main__":
    main()
