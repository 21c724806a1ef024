"""Numerics: how far healthy configs' training losses spread around the HF default's, and where a
diverging run lands. Chooses (and re-checks) ``autotune.result._loss.LOSS_GROWTH_TOLERANCE``.

Each config trains in a real trial child (autotune.runner.run_isolated, the search's default
measurement settings) on the same synthetic tokens with the same seed; its loss over the measured
steps it shares with the HF default trial is compared the way the search compares it
(``autotune.result._loss.compare_losses``). Healthy configs vary the dtype, optimizer, batch shape,
checkpointing and compilation; the diverging ones raise the learning rate.

    python -m benchmarks.bench_loss_spread --model bert-tiny --seq-len 32 [--compile] [--out spread.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from autotune.levers import TrialConfig
from autotune.result._loss import LOSS_GROWTH_TOLERANCE, compare_losses
from autotune.runner import TrialJob, Workload, run_isolated
from autotune.study._seeds import default_config
from benchmarks._common import load_average

# (label, knobs changed from the HF default, base args, expected healthy; None: depends on the model)
CASES: list[tuple[str, dict, dict, bool | None]] = [
    ("HF default again", {}, {}, True),
    ("adamw_torch", {"optim": "adamw_torch"}, {}, True),
    ("bf16", {"dtype": "bf16"}, {}, True),
    ("bf16 + fused AdamW, mb 32", {"dtype": "bf16", "micro_batch": 32}, {}, True),
    ("adafactor", {"optim": "adafactor"}, {}, True),
    ("sgd", {"optim": "sgd"}, {}, True),
    ("8-bit AdamW (bitsandbytes)", {"optim": "adamw_bnb_8bit"}, {}, True),
    ("bf16 + adafactor", {"dtype": "bf16", "optim": "adafactor"}, {}, True),
    ("mb 4 x accum 2", {"micro_batch": 4, "grad_accum": 2}, {}, True),
    ("mb 64", {"micro_batch": 64}, {}, True),
    ("checkpointing", {"checkpointing": True}, {}, True),
    ("learning_rate 1e-3", {}, {"learning_rate": 1e-3}, True),
    ("learning_rate 1e-2", {}, {"learning_rate": 1e-2}, None),
    ("learning_rate 10", {}, {"learning_rate": 10.0}, False),
    ("bf16, learning_rate 10", {"dtype": "bf16"}, {"learning_rate": 10.0}, False),
]
COMPILE_CASE = ("compile (inductor)", {"compile": "inductor"}, {}, True)


def run(model_name: str, seq_len: int, config: TrialConfig, base_args: dict, work: str) -> object:
    job = TrialJob(
        workload=Workload.for_model(model_name, seq_len=seq_len, ceiling_bytes=16 * 1024**3, base_args=base_args),
        config=config,
        work_dir=work,
    )
    return run_isolated(job, timeout_s=900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-tiny")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument(
        "--compile", action="store_true", help="Add a torch.compile (inductor) case (minutes of compile)."
    )
    parser.add_argument("--out", help="Write every curve as JSON here.")
    options = parser.parse_args()
    print(load_average())
    baseline = TrialConfig(**{**vars(default_config()), "pin_memory": False})
    root = tempfile.mkdtemp(prefix="loss-spread-")
    default = run(options.model, options.seq_len, baseline, {}, f"{root}/default")
    assert default.status == "ok", default.error
    print(
        f"HF default ({baseline.short()}): {default.measured_steps} measured steps from step "
        f"{default.loss_measured_from}, loss first {default.loss_first} last {default.loss_last}"
    )
    cases = CASES + ([COMPILE_CASE] if options.compile else [])
    rows = []
    print(
        f"{'config':32} {'status':9} {'shared steps':>12} {'step 1':>7} {'end loss':>9} {'default':>9} {'excess':>8}  verdict (tolerance {LOSS_GROWTH_TOLERANCE:.0%})"
    )
    for index, (label, knobs, base_args, healthy) in enumerate(cases):
        config = TrialConfig(**{**vars(baseline), **knobs})
        result = run(options.model, options.seq_len, config, base_args, f"{root}/case-{index}")
        comparison = compare_losses(result.loss_curve, default.loss_curve)
        excess = f"{comparison.relative_excess:+.1%}" if comparison else "-"
        flagged = result.status == "diverged" or (comparison is not None and not comparison.agree)
        expectation = "" if healthy is None else "  (as expected)" if flagged != healthy else "  (UNEXPECTED)"
        verdict = ("diverged" if flagged else "agrees") + expectation
        print(
            f"{label:32} {result.status:9} {len(comparison.steps) if comparison else 0:>12} "
            f"{comparison.trial_start if comparison else float('nan'):>7.4f} "
            f"{comparison.trial_end if comparison else float('nan'):>9.4f} {comparison.default_end if comparison else float('nan'):>9.4f} "
            f"{excess:>8}  {verdict}{'; ' + result.error.splitlines()[0][:110] if result.error else ''}"
        )
        rows.append(
            {
                "label": label,
                "knobs": knobs,
                "base_args": base_args,
                "expected_healthy": healthy,
                "status": result.status,
                "error": result.error,
                "curve": result.loss_curve,
                "measured_from": result.loss_measured_from,
                "relative_excess": comparison.relative_excess if comparison else None,
            }
        )
    print(load_average())
    if options.out:
        Path(options.out).write_text(json.dumps({"default": default.loss_curve, "cases": rows}, indent=1))


if __name__ == "__main__":
    main()
