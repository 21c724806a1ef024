"""Fidelity: does the exported winner train as fast, in as much memory, as the study recorded?

1. Runs a real search through the CLI (``autotune search``, confirmation included) and exports the
   winner (``autotune export``).
2. Trains the exported JSON in a plain ``transformers.Trainer`` loop in a fresh Python process that
   imports nothing from autotune: the model from the same config via ``AutoConfig``, random token
   data of the same shape, ``TrainingArguments(output_dir=..., **json.load(f))``. Throughput there
   is the wall time of the steps after the warm-up (what a user's run would see); peak memory is
   the kernel's high-water mark of that process (``ru_maxrss``) and, sampled, its anonymous part.
3. Measures the winner again, alternating the plain loop with autotune's own runner (``--rounds``
   each), so a drifting machine load cancels out of the side-by-side ratio, and compares all of it
   with the study's record of the winner (its confirmed median and search-time figure; its peak
   memory, the figure the ceiling was compared with).

Goals (docs/benchmarks.md): samples/s within 5 %, peak memory within 10 %.

    python -m benchmarks.bench_fidelity --model bert-mini --seq-len 128 --trials 6

The LoRA case (``--peft lora`` or an adapter config file): the search trains adapters in every
trial, the export writes ``best.adapter_config.json`` beside ``best.json``, and the plain loop wraps
its model with ``peft.get_peft_model(model, LoraConfig(**json.load(...)))`` as the export's note says.

    python -m benchmarks.bench_fidelity --model gpt2-tiny --seq-len 64 --peft lora --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def plain_trainer_run(
    args_file: str, model: str, seq_len: int, warmup_steps: int, steps: int, weight_dtype: str = "fp32"
) -> dict:
    """Train the exported arguments with transformers alone; return throughput and peak RSS."""
    import resource

    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        Trainer,
        TrainingArguments,
    )

    values = json.loads((REPO / "autotune" / "catalog" / f"{model}.json").read_text())
    config = AutoConfig.for_model(**{k: v for k, v in values.items() if not k.startswith("_autotune")})
    causal = any(a.endswith(("LMHeadModel", "ForCausalLM")) for a in (config.architectures or []))
    # In the winner's weight dtype, as the export's note says (from_config alone follows the config's dtype).
    from autotune.levers.precision import WEIGHT_TORCH_DTYPES

    dtype = getattr(torch, WEIGHT_TORCH_DTYPES[weight_dtype])
    if causal:
        model_instance = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        config.num_labels = 2
        model_instance = AutoModelForSequenceClassification.from_config(config, dtype=dtype)
    adapter_file = Path(os.path.splitext(args_file)[0] + ".adapter_config.json")
    if adapter_file.exists():  # a --peft study: what the export's note says to do
        from peft import LoraConfig, get_peft_model

        model_instance = get_peft_model(model_instance, LoraConfig(**json.loads(adapter_file.read_text())))

    exported = json.loads(Path(args_file).read_text())
    # Under torchrun every rank runs this; the Trainer's global batch is per device x accumulation x ranks.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    global_batch = exported["per_device_train_batch_size"] * exported.get("gradient_accumulation_steps", 1) * world_size
    ids = torch.randint(0, config.vocab_size, (64, seq_len), generator=torch.Generator().manual_seed(0))

    class RandomTokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return global_batch * (warmup_steps + steps + 1)

        def __getitem__(self, index: int) -> dict:
            row = ids[index % len(ids)]
            label = row if causal else torch.tensor(index % 2)
            return {"input_ids": row, "attention_mask": torch.ones_like(row), "labels": label}

    from benchmarks._common import AnonPeak, StepEnds

    anon = AnonPeak()
    anon.start()
    clock = StepEnds()
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="plain-"),
        max_steps=warmup_steps + steps,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **exported,
    )
    Trainer(model=model_instance, args=arguments, train_dataset=RandomTokens(), callbacks=[clock]).train()
    peak_anon = anon.stop()
    cuda = {}
    if torch.cuda.is_initialized():
        # As autotune's CUDA probe counts it: the allocator's peak plus what lives outside it, here from
        # cudaMemGetInfo (the plain run reads no NVML before its context: an upper bound on a shared GPU).
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        outside = max(total - free - torch.cuda.memory_reserved(), 0)
        cuda = {
            "cuda_max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
            "cuda_max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
            "cuda_peak_device_bytes": torch.cuda.max_memory_reserved() + outside,
            "cuda_device": torch.cuda.get_device_name(),
        }
    measured = clock.times[warmup_steps - 1 :]  # from the end of the last warm-up step
    step_times = [b - a for a, b in zip(measured, measured[1:])]
    step_times.sort()
    peaks = {
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_anon_rss_bytes": peak_anon,
    }
    rank_peaks = [peaks]
    if world_size > 1:  # every rank's peaks to rank 0 (the Trainer's process group is still up)
        rank_peaks = [{}] * world_size
        torch.distributed.all_gather_object(rank_peaks, peaks)
    return {
        "samples_per_s": global_batch * len(step_times) / (measured[-1] - measured[0]),
        "samples_per_s_median_step": global_batch / step_times[len(step_times) // 2],
        "steps": len(step_times),
        # The largest rank's, as autotune records a multi-rank trial's peak.
        "peak_rss_bytes": max(p["peak_rss_bytes"] for p in rank_peaks),
        "peak_anon_rss_bytes": max(p["peak_anon_rss_bytes"] for p in rank_peaks),
        "rank_peak_rss_bytes": [p["peak_rss_bytes"] for p in rank_peaks],
        "ranks": world_size,
        **cuda,
    }


def run(command: list[str], cwd: Path) -> str:
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def remeasure_with_autotune(storage: str, number: int, work_dir: Path, peft: str | None = None) -> dict:
    """The winner measured again by autotune's runner, exactly as a confirmation re-run is."""
    import optuna

    from autotune.runner import TrialJob, Workload, run_isolated
    from autotune.spec.measure import MeasureSettings
    from autotune.spec.models import resolve_model
    from autotune.views.ranking import to_ranked

    study = optuna.load_study(study_name=None, storage=storage)
    identity = study.user_attrs["identity"]
    trial = to_ranked(study.trials[number])
    model = resolve_model(identity["model"], identity["task"])
    if peft is not None:
        from autotune.spec.devices import cpu_device
        from autotune.spec.peft import with_peft

        model = with_peft(model, peft, cpu_device(), [])
    job = TrialJob(
        workload=Workload.for_model(
            model,
            seq_len=identity["seq_len"],
            ceiling_bytes=study.user_attrs["ceiling_bytes"],
            measure=MeasureSettings(),
            base_args=study.user_attrs.get("base_args") or {},
            devices_per_trial=identity.get("devices_per_trial", 1),
        ),
        config=trial.config,
        work_dir=str(work_dir),
    )
    result = run_isolated(job, timeout_s=900)
    if result.status != "ok":
        raise SystemExit(f"autotune re-measurement failed: {result.status} {result.error}")
    return {
        "samples_per_s": result.samples_per_s,
        "peak_rss_bytes": result.peak_memory_bytes,
        "peak_anon_rss_bytes": result.memory_peaks.get("peak_anon_rss_tree_sampled_bytes", 0),
    }


def search_and_export(options: argparse.Namespace, root: Path, storage: str) -> None:
    """Step 1: the search through the CLI, then the export of its winner (``root/best.json``)."""
    autotune = [sys.executable, "-m", "autotune"]
    run(
        [
            *autotune,
            "search",
            "--model",
            options.model,
            "--device",
            "cpu",
            "--seq-len",
            str(options.seq_len),
            "--space",
            str(Path(options.space).resolve()),
            "--storage",
            storage,
            "--trials",
            str(options.trials),
            "--work-dir",
            "runs",
            "--devices-per-trial",
            str(options.devices_per_trial),
            *(["--memory-ceiling", options.memory_ceiling] if options.memory_ceiling else []),
            *(["--confirm-top", str(options.confirm_top)] if options.confirm_top is not None else []),
            *(
                ["--peft", str(Path(options.peft).resolve()) if Path(options.peft).exists() else options.peft]
                if options.peft
                else []
            ),
        ],
        root,
    )
    print(run([*autotune, "export", "--storage", storage, "--out", "best.json"], root).strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-mini")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--space", default=str(REPO / "search_spaces" / "tiny-test.yaml"))
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument(
        "--rounds", type=int, default=3, help="Alternating plain / autotune measurements of the winner."
    )
    parser.add_argument("--plain-steps", type=int, default=30, help="Timed steps of the plain run, after 3 warm-up.")
    parser.add_argument("--peft", help="LoRA study: lora, qlora or an adapter config file (autotune search --peft).")
    parser.add_argument(
        "--devices-per-trial",
        type=int,
        default=1,
        help="Ranks per trial (autotune search --devices-per-trial); the plain run is torchrun --nproc-per-node N.",
    )
    parser.add_argument("--memory-ceiling", help="autotune search --memory-ceiling (per rank).")
    parser.add_argument("--confirm-top", type=int, help="autotune search --confirm-top.")
    parser.add_argument(
        "--reuse",
        metavar="DIR",
        help="A finished run's directory (study.db, best.json): measure its winner again, no search.",
    )
    parser.add_argument("--plain", metavar="ARGS_JSON", help=argparse.SUPPRESS)  # the child mode
    parser.add_argument("--weight-dtype", default="fp32", help=argparse.SUPPRESS)  # the child mode: the winner's
    options = parser.parse_args()

    if options.plain:
        measured = plain_trainer_run(
            options.plain, options.model, options.seq_len, 3, options.plain_steps, options.weight_dtype
        )
        if os.environ.get("RANK", "0") == "0":
            from benchmarks._common import PLAIN_RESULT_MARK

            print(PLAIN_RESULT_MARK + json.dumps(measured), flush=True)
        return

    import statistics

    from benchmarks._common import load_average, run_plain_trainer, searched_winner

    print(load_average())
    root, storage, winner = searched_winner(
        options.reuse, "bench-fidelity-", lambda root, storage: search_and_export(options, root, storage)
    )
    print(f"winner #{winner.number}: {winner.config.short()}; exported {root / 'best.json'}; {load_average()}")

    # The machine's load drifts (other jobs): the plain loop and autotune's runner measure the
    # winner alternately, so the side-by-side ratio is free of that drift.
    plain_runs, autotune_runs = [], []
    for index in range(options.rounds):
        plain_runs.append(
            run_plain_trainer(
                root / "best.json",
                options.model,
                options.seq_len,
                options.plain_steps,
                options.devices_per_trial,
                winner.config.weight_dtype,
            )
        )
        autotune_runs.append(remeasure_with_autotune(storage, winner.number, root / f"remeasure-{index}", options.peft))
        print(
            f"round {index + 1}: plain {plain_runs[-1]['samples_per_s']:.2f} samples/s, "
            f"autotune {autotune_runs[-1]['samples_per_s']:.2f} samples/s; {load_average()}",
            flush=True,
        )

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    def ratio(a: float, b: float) -> str:
        return f"{(a / b - 1):+.1%}"

    plain_speed = median(plain_runs, "samples_per_s")
    print(f"\n{'samples/s (medians over ' + str(options.rounds) + ' rounds)':<50}{'samples/s':>10} {'plain vs it':>12}")
    print(f"{'plain Trainer loop (wall time of ' + str(options.plain_steps) + ' steps)':<50}{plain_speed:10.2f}")
    print(f"{'plain Trainer loop (median step)':<50}{median(plain_runs, 'samples_per_s_median_step'):10.2f}")
    rows = [
        ("autotune runner, alternating with the plain loop", median(autotune_runs, "samples_per_s")),
        ("study record: search-time median", winner.result.samples_per_s),
    ]
    if winner.confirmed_samples_per_s is not None:
        rows.append(("study record: confirmed median (the ranking's)", winner.confirmed_samples_per_s))
    for label, value in rows:
        print(f"{label:<50}{value:10.2f} {ratio(plain_speed, value):>12}")

    recorded_peak = max(winner.result.peak_memory_bytes, winner.peak_memory_bytes)
    recorded_anon = winner.result.memory_peaks.get("peak_anon_rss_tree_sampled_bytes", 0)
    plain_rss, plain_anon = median(plain_runs, "peak_rss_bytes"), median(plain_runs, "peak_anon_rss_bytes")
    print(
        f"\npeak memory, plain process vs the study's record (goal: within 10 %):\n"
        f"  RSS (the ceiling's figure): plain ru_maxrss {plain_rss / 1024**2:.0f} MiB, study "
        f"{recorded_peak / 1024**2:.0f} MiB ({winner.result.memory_source}): {ratio(plain_rss, recorded_peak)}"
    )
    if recorded_anon:
        print(
            f"  anonymous RSS (RSS minus file-backed pages): plain {plain_anon / 1024**2:.0f} MiB, "
            f"study {recorded_anon / 1024**2:.0f} MiB: {ratio(plain_anon, recorded_anon)}"
        )
    print(load_average())


if __name__ == "__main__":
    main()
