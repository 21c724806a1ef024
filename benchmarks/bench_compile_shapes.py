"""Compiled training on batches of varying length: today's static-first compile against dynamic shapes
from the first step (issue 38 §10).

transformers builds accelerate's compile plugin with ``dynamic=None`` (trainer.py ~796-800): dynamo
compiles the first batch's shapes as constants and compiles again, the length now dynamic, at the second
distinct length. A compiled trial whose batches vary (TRL's padding_free or bfd rows, its padding to the
longest, the Trainer's ``padding: longest`` / ``padding_free``) now sets ``ACCELERATE_DYNAMO_USE_DYNAMIC``
(``autotune.levers.compile.compile_environment``), which the plugin reads when ``dynamic`` is None
(accelerate/utils/dataclasses.py ~1107): ``torch.compile(dynamic=True)``. This benchmark trains the same
trial both ways, side by side in one run: llama-tiny on the generated chat corpus, each variant in a
fresh process (dynamo's caches are per process) through the runner's own trainer
(``autotune.runner._trial.build_trainer``) and step timer, for a fixed number of steps (the timer's
``recompile_limit`` lifted so neither variant is stopped: the runner's own rule is reported instead).

    python -m benchmarks.bench_compile_shapes [--backend aot_eager] [--batching padding_free] [--steps 16]
        [--seq-len 128] [--micro-batch 4] [--samples 400] [--length-scale 0.1] [--order today,dynamic]

``--batching``: TRL's ``packing`` under ``--trainer sft``, ``padding_free`` / ``bfd`` / ``off`` (``off``
pads each batch to its longest). Per variant it prints: the
distinct input lengths the collator made, dynamo's unique graphs and frames compiled, the steps after
warm-up that compiled, seconds spent compiling, the median steady step, the real tokens a second over
the measured steps (the Trainer's count: padding not counted), and what the runner would have labelled
the trial (``recompiling`` past ``MeasureSettings.recompile_limit``). docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, load_average

VARIANTS = ("today", "dynamic")
# TRL's packing lever (--trainer sft); ``off`` pads each batch to its longest. The Trainer's
# ``padding: longest`` takes a text column, which llama-tiny has no tokenizer for.
BATCHINGS = ("padding_free", "bfd", "off")
RESULT_MARK = "compile-shapes-result: "


class LengthsSeen:
    """The distinct input lengths of the micro-batches the trainer was handed (``on_step_begin`` cannot
    see them: this wraps the collator)."""

    def __init__(self, collator: Any) -> None:
        self.collator = collator
        self.lengths: list[int] = []

    def __call__(self, features: list[Any]) -> Any:
        batch = self.collator(features)
        self.lengths.append(int(batch["input_ids"].shape[-1]))
        return batch


def one_variant(args: argparse.Namespace) -> dict[str, Any]:
    """Train the trial of ``args.variant`` in this process and return its figures."""
    import torch
    import torch._dynamo.utils

    from autotune.levers import TrialConfig, compile_environment, model_build_kwargs, trial_batching
    from autotune.plan import PlanOptions, plan
    from autotune.runner import TrialJob
    from autotune.runner._step_timer import StepTimer
    from autotune.runner._trial import batches_vary, build_trainer
    from autotune.spec.models import build_model

    root = Path(args.root)
    workload = plan(
        PlanOptions(
            model="llama-tiny",
            device="cpu",
            seq_len=args.seq_len,
            space=str(root / "space.yaml"),
            dataset=str(root / "chat.jsonl"),
            work_dir=str(root / "runs"),
            warmup_steps=1,
            max_measure_steps=args.steps,
            trainer="sft",
        )
    ).workload
    config = TrialConfig(micro_batch=args.micro_batch, compile=args.backend, packing=args.batching)
    job = TrialJob(workload=workload, config=config, work_dir=str(root / f"trial-{args.variant}"))
    batching = trial_batching(config)
    environment = compile_environment(config, batches_vary(job, batching))
    if args.variant == "dynamic":  # what the trial child sets (runner._trial.train_and_measure)
        os.environ.update(environment)
    # Never stopped for recompiling, never converged early: every variant runs args.steps steps.
    settings = dataclasses.replace(
        workload.measure, recompile_limit=args.steps, min_steps=args.steps, max_steps=args.steps, max_seconds=1e9
    )
    timer = StepTimer(settings, synchronize=lambda: None)
    torch.manual_seed(0)
    model = build_model(workload.model.hf_config, workload.model.task, **model_build_kwargs(config))
    trainer = build_trainer(job, model, batching, [timer])
    seen = LengthsSeen(trainer.data_collator)
    trainer.data_collator = seen
    started = time.perf_counter()
    trainer.train()
    wall_s = time.perf_counter() - started
    stats = timer.stats()
    counters = torch._dynamo.utils.counters
    return {
        "variant": args.variant,
        "dynamic": str(trainer.accelerator.state.dynamo_plugin.dynamic),
        "distinct_lengths": len(set(seen.lengths)),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames_compiled": int(counters["frames"]["ok"]),
        "steps_compiling_after_warmup": timer.recompiled_steps,
        "runner_label": "recompiling" if timer.recompiled_steps > workload.measure.recompile_limit else "measured",
        "compile_s": round(stats.compile_s, 1),
        "median_step_s": round(stats.median_s, 4),
        "real_tokens_per_s": round(stats.measured_tokens / stats.measured_s, 1) if stats.measured_s else 0.0,
        "steps_measured": stats.measured_steps,
        "wall_s": round(wall_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="aot_eager", help="the compile lever's value (default aot_eager)")
    parser.add_argument("--batching", choices=BATCHINGS, default="padding_free", help="(default padding_free)")
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per variant (default 16)")
    parser.add_argument("--seq-len", type=int, default=128, help="--seq-len (default 128)")
    parser.add_argument("--micro-batch", type=int, default=4, help="samples per micro-batch (default 4)")
    parser.add_argument("--samples", type=int, default=400, help="conversations in the chat corpus (default 400)")
    parser.add_argument(
        "--length-scale",
        type=float,
        default=0.1,
        help="the corpus's conversation lengths scaled (default 0.1: most shorter than --seq-len, so lengths vary)",
    )
    parser.add_argument(
        "--order",
        default=",".join(VARIANTS),
        help="the variants in the order they run, comma-separated (default today,dynamic): on a shared machine "
        "run both orders, the load moves",
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(RESULT_MARK + json.dumps(one_variant(args)), flush=True)
        return
    print(f"before: {load_average()}")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [sys.executable, "-m", "autotune", "chat-corpus", "--out", "chat.jsonl", "--samples", str(args.samples)]
            + ["--length-scale", str(args.length_scale)],
            cwd=scratch,
            check=True,
        )
        # The trial's own levers: the plan checks the data against the space's batches (off quoted: YAML reads false).
        space = f"micro_batch: [{args.micro_batch}]\ncompile: [{args.backend}]\npacking: ['{args.batching}']\n"
        Path(scratch, "space.yaml").write_text(space)
        for variant in args.order.split(","):
            shared = ["--backend", args.backend, "--batching", args.batching, "--steps", str(args.steps)]
            command = [sys.executable, "-m", "benchmarks.bench_compile_shapes", *shared, "--seq-len", str(args.seq_len)]
            command += ["--micro-batch", str(args.micro_batch), "--variant", variant, "--root", scratch]
            env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_DYNAMO_USE_DYNAMIC"}
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
            lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
            if done.returncode != 0 or not lines:
                sys.exit(f"variant {variant} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(lines[-1].removeprefix(RESULT_MARK)))
            print(json.dumps(results[-1]), flush=True)
    print(f"after: {load_average()}")
    keys = list(results[0])
    print(f"{'':32}" + "".join(f"{r['variant']:>14}" for r in results))
    for key in keys[1:]:
        print(f"{key:32}" + "".join(f"{r[key]!s:>14}" for r in results))


if __name__ == "__main__":
    main()
