"""bf16 against fp32 on this CPU: what `autotune devices` calls emulated, measured (docs/facts.md).

``python -m benchmarks.bench_dtype_hardware [--rounds 2]``: a 1024^3 matmul for 3 s in fp32, in bf16, and
in fp32 under bf16 autocast; then bert-tiny at seq len 128 through autotune's runner (a fresh child each,
short measurement) at micro-batches 8 and 64 in fp32 and bf16, interleaved, with the load average.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def rate(fn: Callable[[], object], seconds: float = 3.0) -> float:
    fn()
    started, count = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        fn()
        count += 1
    return count / (time.perf_counter() - started)


def main() -> None:
    import torch

    from autotune.levers import TrialConfig
    from autotune.runner import TrialJob, Workload, run_isolated
    from autotune.spec.devices import cpu_device
    from autotune.spec.measure import MeasureSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    device = cpu_device()
    print(
        f"{device.name}: bf16 matmul hardware {device.has_matmul_hardware('bf16')}; torch {torch.__version__}, "
        f"capability {torch.backends.cpu.get_cpu_capability()}"
    )
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    for name, x, y in (("fp32", a, b), ("bf16", a.bfloat16(), b.bfloat16())):
        print(f"matmul {n}^3 {name}: {2 * n**3 * rate(lambda: x @ y) / 1e9:.2f} GFLOP/s")  # noqa: B023 - called in this iteration
    with torch.autocast("cpu", dtype=torch.bfloat16):
        print(f"matmul {n}^3 fp32 inputs under bf16 autocast: {2 * n**3 * rate(lambda: a @ b) / 1e9:.2f} GFLOP/s")
    measure = MeasureSettings(warmup_steps=2, min_steps=4, max_steps=8, max_seconds=20.0, cv_target=0.05)
    workload = Workload.for_model("bert-tiny", seq_len=128, ceiling_bytes=8 * 1024**3, measure=measure)
    for round_index in range(options.rounds):
        for micro_batch in (8, 64):
            for dtype in ("fp32", "bf16"):
                config = TrialConfig(micro_batch=micro_batch, dtype=dtype, pin_memory=False)
                result = run_isolated(TrialJob(workload, config, tempfile.mkdtemp()), timeout_s=600)
                print(
                    f"round {round_index} mb={micro_batch} {dtype}: {result.status} {result.samples_per_s:.1f} samples/s, "
                    f"median step {result.step_time_median_s:.3f} s, CV {result.step_time_cv:.1%}, "
                    f"load {open('/proc/loadavg').read().split()[0]}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
