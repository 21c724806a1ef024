"""The grid: every config of a space with its measured result (the oracle the searches replay).

Measured once per config, for real, through autotune's runner (a fresh child per config, short
measurement settings) and cached to a JSON file; an interrupted grid resumes where it stopped. Or
computed (:func:`modelled_grid`), or reshuffled from a measured one (:func:`reshuffled_grid`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.runner import TrialJob, Workload, child_address_space_budget, run_isolated
from autotune.space import SearchSpace
from autotune.spec.ceiling import fits
from autotune.spec.devices import CPU_HALF_MATMUL_FLAGS, DeviceSpec
from autotune.spec.measure import MeasureSettings
from autotune.spec.models import ModelSpec
from autotune.units import format_bytes
from benchmarks._common import load_average

# Short measurement: the grid is about ranking configs, and is measured once per config.
BENCH_MEASURE = MeasureSettings(warmup_steps=2, min_steps=4, max_steps=8, max_seconds=6.0, cv_target=0.05)


def fits_under(result: TrialResult, ceiling_bytes: int) -> bool:
    """Whether a grid config ran, with a measured peak, that fits ``ceiling_bytes`` (the one fit rule,
    :func:`autotune.spec.ceiling.fits`). The grid was measured at a generous limit, so a config over the
    benchmark's ceiling still ran (``ok``) or is ``over_ceiling`` of that limit."""
    return (
        result.status in ("ok", "over_ceiling")
        and result.peak_memory_bytes > 0
        and fits(result.peak_memory_bytes, ceiling_bytes)
    )


@dataclasses.dataclass
class Grid:
    """Every config of the space with its measured result, and how it was measured."""

    meta: dict[str, Any]
    results: dict[TrialConfig, TrialResult]
    # The 1-minute load average when each config's measurement ended (its own trial included).
    loads: dict[TrialConfig, float] = dataclasses.field(default_factory=dict)
    # How the replay models a config's first measured step, which early stop may judge alone: the
    # grid keeps each config's median step and CV, not its steps; the first is this many CVs slower.
    first_step_cvs: float = 0.0

    def best(self, ceiling_bytes: int) -> tuple[TrialConfig, float]:
        feasible = [(r.samples_per_s, c) for c, r in self.results.items() if fits_under(r, ceiling_bytes)]
        samples_per_s, config = max(feasible, key=lambda pair: pair[0])
        return config, samples_per_s

    def save(self, path: Path) -> None:
        rows = [
            {"params": c.to_params(), "load_1min": self.loads.get(c), "result": r.to_dict()}
            for c, r in self.results.items()
        ]
        path.write_text(json.dumps({"meta": self.meta, "results": rows}, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Grid:
        data = json.loads(path.read_text())
        results, loads = {}, {}
        for row in data["results"]:
            config = TrialConfig(**row["params"])
            results[config] = TrialResult.from_dict(row["result"])
            if row.get("load_1min") is not None:
                loads[config] = float(row["load_1min"])
        return cls(meta=data["meta"], results=results, loads=loads)


def replay_device(device: DeviceSpec, grid: Grid) -> tuple[DeviceSpec, str]:
    """The device the replayed search plans for: this machine's, with the CPU flags of the machine
    that measured the grid, so that its seeds pick the dtype that machine ran fast.

    Grids measured before the flags were recorded: bf16 counts as hardware there where the grid's
    fastest bf16 config ran faster than its fastest fp32 one (emulated bf16 never does: docs/facts.md).

    Returns:
        The device, and how its flags were decided (one line for the output).
    """
    if "cpu_flags" in grid.meta:
        return dataclasses.replace(device, cpu_flags=frozenset(grid.meta["cpu_flags"])), "the grid's recorded CPU flags"
    fastest: dict[str, float] = {}
    for config, result in grid.results.items():
        if result.status in ("ok", "over_ceiling"):
            fastest[config.dtype] = max(fastest.get(config.dtype, 0.0), result.samples_per_s)
    if "fp32" not in fastest or "bf16" not in fastest:
        return device, "this machine's CPU flags (the grid has no fp32 and bf16 configs to tell from)"
    native = fastest["bf16"] > fastest["fp32"]
    others = device.cpu_flags - CPU_HALF_MATMUL_FLAGS["bf16"]
    flags = others | {"avx512_bf16"} if native else others
    words = "faster" if native else "slower"
    return dataclasses.replace(device, cpu_flags=flags), (
        f"bf16 {'in hardware' if native else 'emulated'}, inferred: the grid's fastest bf16 config ran {words} "
        f"({fastest['bf16']:.1f} samples/s) than its fastest fp32 one ({fastest['fp32']:.1f})"
    )


def space_configs(space: SearchSpace) -> list[TrialConfig]:
    """Every config of the space, in a fixed order."""
    import itertools

    names = list(space.choices)
    return [TrialConfig.from_params(dict(zip(names, values))) for values in itertools.product(*space.choices.values())]


def measure_grid(
    path: Path,
    model: ModelSpec,
    device: DeviceSpec,
    space: SearchSpace,
    seq_len: int,
    ceiling: int,
    remeasure_above_load: float | None = None,
) -> Grid:
    """Measure every config not in the cached grid yet; save after each one (resumable).

    With ``remeasure_above_load``, configs measured while the 1-minute load average was above it
    (or with no load recorded) are measured again: another job on the machine skews a ranking.
    """
    import psutil

    grid = Grid.load(path) if path.exists() else Grid(meta={}, results={})
    grid.meta.update(
        model=model.name,
        seq_len=seq_len,
        device=device.name,
        space=space.choices,
        ceiling_bytes=ceiling,
        measure=dataclasses.asdict(BENCH_MEASURE),
    )
    todo = [
        c
        for c in space_configs(space)
        if c not in grid.results
        or (remeasure_above_load is not None and grid.loads.get(c, float("inf")) > remeasure_above_load)
    ]
    # In an order of the file's own (its name seeds it; a resumed run keeps it): passes of one grid measured one
    # after the other then meet the host's drift in different configs, which their median can set aside; in one
    # fixed order, a drift over a pass would rank the same configs low in every pass.
    random.Random(path.name).shuffle(todo)
    if todo:  # what the replay's device is told of bf16 hardware (replay_device)
        grid.meta["cpu_flags"] = sorted(device.cpu_flags)
    work = Path(tempfile.mkdtemp(prefix="bench-search-grid-"))
    # Measured at a generous limit so configs over the benchmark ceiling still get a real peak.
    generous = 4 * ceiling
    print(f"grid: {len(grid.results)} cached, {len(todo)} to measure; {load_average()}", flush=True)
    grid.meta.setdefault("load_before", load_average())
    started = time.perf_counter()
    for index, config in enumerate(todo):
        job = TrialJob(
            workload=Workload.for_model(
                model,
                device=device,
                seq_len=seq_len,
                ceiling_bytes=generous,
                measure=BENCH_MEASURE,
                address_space_bytes=child_address_space_budget(generous, psutil.virtual_memory().available),
            ),
            config=config,
            work_dir=str(work / f"grid-{index}"),
        )
        result = run_isolated(job, timeout_s=600)
        grid.results[config] = result
        grid.loads[config] = os.getloadavg()[0]
        grid.save(path)
        print(
            f"  [{index + 1}/{len(todo)}] {config.short():40s} {result.status:8s} {result.samples_per_s:7.1f} samples/s "
            f"peak {format_bytes(result.peak_memory_bytes):>10s} wall {result.wall_s:5.1f}s load {grid.loads[config]:.1f}",
            flush=True,
        )
    if not todo:
        return grid  # nothing measured: the cached grid's record of when and how it was measured stands
    grid.meta["load_after"] = load_average()
    grid.meta["measured_at"] = datetime.datetime.now().isoformat(timespec="seconds")
    grid.meta.setdefault("measure_wall_s", 0.0)
    grid.meta["measure_wall_s"] += time.perf_counter() - started
    grid.save(path)
    return grid


def modelled_grid(model: ModelSpec, device: DeviceSpec, space: SearchSpace, seq_len: int, seed: int) -> Grid:
    """A landscape computed, not measured, for when the machine is too loaded to measure one.

    Throughput: multiplicative knob effects of the shape the CPU grid measured (bf16 faster, and
    more so at larger micro-batches; fused AdamW and SGD faster than AdamW; checkpointing about
    25 % slower; the micro-batch's gain saturating, so the top is flat), times a per-config
    lognormal noise of 4 % (one draw per config, as a measured grid has). Peak memory: autotune's
    prior estimate (``autotune.estimate``) x 1.1 x a 5 % lognormal draw, so the estimate that
    screens configs is close to, not equal to, the "measured" peak. Seeded: the same seed gives
    the same grid.
    """
    from autotune.estimate import estimate_peak, memory_prior

    prior = memory_prior(device, {})
    rng = random.Random(seed)
    results: dict[TrialConfig, TrialResult] = {}
    for config in space_configs(space):
        batch = config.micro_batch
        samples_per_s = 40.0 * batch / (batch + 6)
        if config.dtype in ("bf16", "fp16"):
            samples_per_s *= 1 + 0.35 * batch / (batch + 8)
        samples_per_s *= {"adamw_torch_fused": 1.08, "sgd": 1.1, "adafactor": 0.95}.get(config.optim, 1.0)
        samples_per_s *= 0.75 if config.checkpointing else 1.0
        samples_per_s *= 1.03 if config.grad_accum > 1 else 1.0  # the optimizer step amortised
        samples_per_s *= rng.lognormvariate(0.0, 0.04)
        peak = int(estimate_peak(model, config, seq_len, prior).total_bytes * 1.1 * rng.lognormvariate(0.0, 0.05))
        step_s = config.global_batch / samples_per_s
        results[config] = TrialResult(
            status="ok",
            samples_per_s=samples_per_s,
            model_tflops=samples_per_s / 1000,
            peak_memory_bytes=peak,
            step_time_median_s=step_s,
            step_time_cv=0.04,
            measured_steps=BENCH_MEASURE.max_steps,
            wall_s=3.0 + (BENCH_MEASURE.warmup_steps + BENCH_MEASURE.max_steps) * step_s,
        )
    meta = {
        "model": model.name,
        "seq_len": seq_len,
        "device": f"modelled ({device.name} estimator)",
        "space": space.choices,
        "modelled_seed": seed,
    }
    return Grid(meta=meta, results=results)


def reshuffled_grid(base: Grid, seed: int, effect_sigma: float) -> Grid:
    """``base`` with its throughputs replaced by a random landscape of the same space and memory.

    Each knob value gets a random factor (lognormal, ``effect_sigma``), the pairs (dtype,
    micro-batch) and (optimizer, checkpointing) another (``effect_sigma`` / 2), and each config a
    4 % draw of noise. A small ``effect_sigma`` gives a flat, noisy landscape with little structure
    for a model to learn; a landscape no one tuned autotune on.
    """
    rng = random.Random(seed)
    factors: dict[tuple[str, ...], float] = {}

    def factor(*key: str, sigma: float) -> float:
        if key not in factors:
            factors[key] = rng.lognormvariate(0.0, sigma)
        return factors[key]

    results = {}
    for config, measured in base.results.items():
        params = {name: str(value) for name, value in config.to_params().items()}
        speed = 40.0
        for name, value in sorted(params.items()):
            speed *= factor(name, value, sigma=effect_sigma)
        speed *= factor("dtype", params["dtype"], "micro_batch", params["micro_batch"], sigma=effect_sigma / 2)
        speed *= factor("optim", params["optim"], "checkpointing", params["checkpointing"], sigma=effect_sigma / 2)
        speed *= rng.lognormvariate(0.0, 0.04)
        results[config] = dataclasses.replace(measured, samples_per_s=speed, model_tflops=speed / 1000)
    return Grid(meta={**base.meta, "reshuffled_seed": seed, "effect_sigma": effect_sigma}, results=results)
