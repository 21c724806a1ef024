"""The user's whole run, projected by a CPU search, against a real run of the exported config (issue 40, 4).

1. Runs a real SFT search through the CLI on the generated chat corpus (``autotune chat-corpus``,
   ``autotune search --trainer sft --base-args '{"max_steps": N}'``: the run's length is the user's
   ``max_steps``) and exports the winner's SFTConfig JSON (``autotune export``, which keeps ``max_steps``).
2. Prints the projection ``autotune best`` prints, and the same figure in seconds
   (``autotune.views.run_time.study_paces``, ``autotune.result.projected_seconds``).
3. Trains the exported JSON for its ``max_steps`` with a plain ``trl.SFTTrainer`` in a fresh Python process
   that imports nothing from autotune, on the search's dataset (the whole chat.jsonl), and times
   ``trainer.train()`` (what the projection covers: from the first step; the model's load and the
   trainer's set-up before it are excluded, as the projection says).

Goal (docs/benchmarks.md): the projected wall time within 15 % of the real run's.

    python -m benchmarks.bench_run_time --max-steps 300 --trials 3
    python -m benchmarks.bench_run_time --epochs 1 --samples 800 --space packed.yaml  # a run of epochs, packed
    python -m benchmarks.bench_run_time --trainer dpo --epochs 2 --samples 200 --seq-len 256 --length-scale 0.125

``--epochs`` makes the run's length ``num_train_epochs`` instead of ``max_steps`` (the export keeps it and the
plain run trains every row that many times); ``--space`` searches another space (e.g. TRL's packing alone);
``--trainer dpo`` runs all of it on generated preference pairs under DPOTrainer, the real run's reference pass
(``precompute_ref_log_probs``, which the projection counts) timed wherever TRL runs it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import PLAIN_RESULT_MARK, load_average
from benchmarks.bench_dpo_fidelity import SPACE as DPO_SPACE
from benchmarks.bench_dpo_fidelity import timed_reference_pass
from benchmarks.bench_sft_fidelity import PLAIN_HARNESS, SPACE, keep_start, plain_child


def plain_run(args_file: str, model_dir: str, data_file: str, seq_len: int) -> dict[str, Any]:
    """The exported SFTConfig (its ``max_steps`` included) trained by a plain SFTTrainer on ``data_file``:
    only transformers, TRL and datasets, as a user runs it; the wall time of ``trainer.train()``."""
    import datasets
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    exported = json.loads(Path(args_file).read_text())
    arguments = SFTConfig(output_dir=tempfile.mkdtemp(prefix="plain-run-"), **PLAIN_HARNESS, **exported)
    trainer = SFTTrainer(
        model=model_dir,
        args=arguments,
        train_dataset=datasets.load_dataset("json", data_files=data_file, split="train"),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    if arguments.max_length is None:  # the export's note: TRL's truncation where it trains untruncated
        trainer.train_dataset = keep_start(trainer.train_dataset, seq_len)
    started = time.perf_counter()
    output = trainer.train()
    return {
        "wall_s": time.perf_counter() - started,
        "steps": output.global_step,
        "train_runtime_s": output.metrics["train_runtime"],
        "autotune_modules": sorted(name for name in sys.modules if name.split(".")[0] == "autotune"),
    }


def plain_dpo_run(args_file: str, model_dir: str, data_file: str) -> dict[str, Any]:
    """The exported DPOConfig (its run length included) trained by a plain DPOTrainer on ``data_file``, as ``trl
    dpo`` builds it (the model by name, its reference loaded beside it unless it precomputes). The wall time of
    ``trainer.train()`` and, apart, TRL's reference pass before training under ``precompute_ref_log_probs``
    (which TRL runs in the trainer's set-up or at the start of training, depending on its version: timed
    wherever it runs, ``timed_reference_pass``), which the projection counts."""
    import datasets
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    exported = json.loads(Path(args_file).read_text())
    arguments = DPOConfig(output_dir=tempfile.mkdtemp(prefix="plain-dpo-run-"), **PLAIN_HARNESS, **exported)
    trainer = timed_reference_pass(DPOTrainer)(
        model=model_dir,
        args=arguments,
        train_dataset=datasets.load_dataset("json", data_files=data_file, split="train"),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    in_set_up, _ = trainer.reference_pass  # run before train() began: added to the run's span
    started = time.perf_counter()
    output = trainer.train()
    wall_s = time.perf_counter() - started
    reference_s, pairs = trainer.reference_pass
    return {
        "wall_s": wall_s + in_set_up,
        "steps": output.global_step,
        "train_runtime_s": output.metrics["train_runtime"],
        "reference_pass_s": reference_s,
        "reference_pass_pairs": pairs,
        "autotune_modules": sorted(name for name in sys.modules if name.split(".")[0] == "autotune"),
    }


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--samples", type=int, default=400, help="Conversations of the chat corpus.")
    parser.add_argument("--length-scale", type=float, default=0.2, help="chat-corpus --length-scale.")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=300, help="The user's run: max_steps in --base-args.")
    parser.add_argument(
        "--epochs", type=float, help="The user's run in epochs instead: num_train_epochs in --base-args."
    )
    parser.add_argument("--space", metavar="YAML", help="The search space (default: the trainer's fidelity space).")
    parser.add_argument(
        "--trainer",
        choices=("sft", "dpo"),
        default="sft",
        help="sft: chat rows under SFTTrainer; dpo: generated preference pairs under DPOTrainer.",
    )
    parser.add_argument("--reuse", metavar="DIR", help="A finished run's directory: its study and export again.")
    parser.add_argument("--plain", metavar="ARGS_JSON", help=argparse.SUPPRESS)  # the child mode, with:
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    options = parser.parse_args()
    data = "prefs.jsonl" if options.trainer == "dpo" else "chat.jsonl"
    if options.plain:
        measured = (
            plain_dpo_run(options.plain, options.model_dir, options.data)
            if options.trainer == "dpo"
            else plain_run(options.plain, options.model_dir, options.data, options.seq_len)
        )
        print(PLAIN_RESULT_MARK + json.dumps(measured), flush=True)
        return

    print(load_average(), flush=True)
    root = Path(options.reuse) if options.reuse else Path(tempfile.mkdtemp(prefix="bench-run-time-"))
    storage = f"sqlite:///{root / 'study.db'}"
    autotune = [sys.executable, "-m", "autotune"]
    if not options.reuse:
        corpus = ["--format", "preference"] if options.trainer == "dpo" else []
        run([*autotune, "chat-corpus", "--out", data, "--samples", str(options.samples), *corpus]
            + ["--length-scale", str(options.length_scale)], root)  # fmt: skip
        default_space = DPO_SPACE if options.trainer == "dpo" else SPACE
        (root / "space.yaml").write_text(Path(options.space).read_text() if options.space else default_space)
        length = {"num_train_epochs": options.epochs} if options.epochs else {"max_steps": options.max_steps}
        (root / "base.json").write_text(json.dumps(length))
        started = time.monotonic()
        run(
            [
                *(*autotune, "search", "--model", options.model, "--device", "cpu", "--dataset", data),
                *("--trainer", options.trainer, "--seq-len", str(options.seq_len), "--space", "space.yaml"),
                *("--storage", storage, "--trials", str(options.trials), "--work-dir", "runs"),
                *("--base-args", "base.json", "--confirm-top", "0"),
            ],
            root,
        )
        print(f"search: {time.monotonic() - started:.0f} s; {load_average()}", flush=True)
        run([*autotune, "export", "--storage", storage, "--out", "best.json"], root)
    best = run([*autotune, "best", "--storage", storage, "--top", "3"], root)
    print(next(line for line in best.splitlines() if line.startswith("projected wall time")), flush=True)

    import optuna

    from autotune.result import projected_seconds, run_length
    from autotune.storage import schema
    from autotune.views.run_time import study_paces
    from benchmarks.bench_sft_fidelity import save_model, study_workload

    study = optuna.load_study(study_name=None, storage=storage)
    paces = study_paces(study)
    assert paces is not None, "no trial ran and fit"
    (label, pace), _ = paces
    length = run_length(study.user_attrs[schema.STUDY_BASE_ARGS], None)
    projected = projected_seconds(length, study.user_attrs[schema.STUDY_DATASET_SAMPLES], pace)
    assert projected is not None
    if not (root / "model").is_dir():
        shape = argparse.Namespace(model=options.model, seq_len=options.seq_len, warmup_steps=3, max_measure_steps=40)
        save_model(study_workload(root, shape, data), root / "model")
    command = [
        *(sys.executable, "-m", "benchmarks.bench_run_time", "--plain", str(root / "best.json")),
        *("--model-dir", str(root / "model"), "--data", str(root / data), "--seq-len", str(options.seq_len)),
        *("--trainer", options.trainer),
    ]
    real = plain_child(command, root)
    error = projected / real["wall_s"] - 1
    print(
        f"{label} ({pace.samples_per_s:.2f} samples/s, {pace.samples_per_step:.1f} samples a step, warm-up excess "
        f"{pace.warmup_excess_s:.1f} s{pass_words(pace.setup_s_per_sample)}): projected "
        f"{projected:.1f} s for {length.words(None)}; real plain {options.trainer.upper()}Trainer "
        f"run: {real['wall_s']:.1f} s ({real['steps']} steps; train_runtime {real['train_runtime_s']:.1f} s"
        f"{reference_words(real)}); "
        f"projected vs real {error:+.1%} (goal: within 15 %); {load_average()}; {root}"
    )


def pass_words(seconds_per_pair: float) -> str:
    """The trial's reference pass as the projection counts it, in words (nothing where it ran none)."""
    return f"; reference pass {seconds_per_pair * 1e3:.1f} ms a pair, once a run" if seconds_per_pair else ""


def reference_words(real: dict[str, Any]) -> str:
    """The plain DPO run's reference pass, in words (nothing where it ran none)."""
    if not real.get("reference_pass_pairs"):
        return ""
    return f"; its reference pass {real['reference_pass_s']:.1f} s over {real['reference_pass_pairs']} pairs, counted"


if __name__ == "__main__":
    main()
