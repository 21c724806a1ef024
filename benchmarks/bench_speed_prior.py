"""The throughput prior against figures nobody tuned it on (docs/benchmarks.md, "The throughput prior").

Two checks, no training:

* every CPU grid of ``benchmarks/data``: the zero-trial prediction of each config's model TFLOPs against
  the grid's measured figure (Spearman's rank correlation over the configs that fit), then the prior
  calibrated on 3 trials (``fit_speed``: the 3 configs it predicts fastest, as the search's first
  proposals are) and the measured speed of the config it then predicts fastest, against the grid's best;
* published single-GPU figures (torchtune's README, llm-foundry's benchmarking tables), predicted from the
  datasheet alone, side by side with what was published; and every 8-GPU row of llm-foundry's H100 and A100
  tables up to 16k tokens (``benchmarks/data/published_llm_foundry.json``, 75 rows: MPT-125M to 30B, 512 to 16,384 tokens), per GPU.

The single-pass grids record the CPU's model name ("AMD EPYC") but not its flags: each is predicted for the
CPU its own figures point to (``GRID_CPUS``, with the reason) and, beside it, for the other kind. The grids
measured several times over (``REPEATED_GRIDS``) record their CPU's flags and calibration: the prior against
the median of their passes, and the search's own model after its first 3 trials replayed on that median.

    python -m benchmarks.bench_speed_prior
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
from pathlib import Path
from statistics import median
from typing import Any
from unittest import mock

import optuna

from autotune.estimate import SpeedFit, StepWork, fit_speed, predict_speed, speed_prior, step_work
from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.space import load_space
from autotune.spec.ceiling import fits
from autotune.spec.devices import DeviceSpec, cpu_device, matmul_dtype
from autotune.spec.measured_peaks import (
    PEAKS_FILE_ENV,
    load_measured_bandwidth,
    load_measured_inner_rates,
    load_measured_op_rates,
    load_measured_peaks,
)
from autotune.spec.models import resolve_model
from autotune.study import SearchBudget, SearchHooks, _landscape, open_study, search
from autotune.study._proposals import noise_fraction
from benchmarks.bench_search.grid import Grid, replay_device
from benchmarks.bench_search.strategies import GridRunner, bench_request

DATA = Path(__file__).parent / "data"
# The grids' ceilings (docs/benchmarks.md, "Search efficiency"), and the CPU flags their own figures point
# to: bert-mini and gpt2-tiny ran at ~65-150 GFLOP/s with bf16 1.0-1.6x fp32 (native bf16: AVX512-BF16);
# llama-tiny's bf16 grid ran at 3.5 GFLOP/s, the emulated rate of an AVX2 CPU (docs/facts.md).
AVX512_BF16 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})
AVX2 = frozenset({"avx2", "fma"})
GRID_CPUS = {
    "bench_grid_cpu.json": (int(1.25 * 2**30), AVX512_BF16),
    "bench_grid_gpt2_cpu.json": (int(1.6 * 2**30), AVX512_BF16),
    "bench_grid_llama_cpu.json": (980 * 2**20, AVX2),
}
CALIBRATION_TRIALS = 3
# Between-run noise of one config's figure on these VMs: 4-18 % for the runner, 8-10 % for a fixed matmul loop
# (docs/benchmarks.md, "Repeatability"); 3 % is the goal for a quiet machine.
NOISE_CVS = (0.03, 0.05, 0.08)
NOISE_DRAWS = 500


def perfect_predictor_spearman(measured: list[float], cv: float, seed: int = 0) -> float:
    """The median rank correlation of a predictor that knows every config's figure exactly with one
    measurement of the grid at ``cv`` run-to-run noise (the grid's own figures taken as the truth: their
    own noise widens the spread, so this is an upper bound). Where it is under a goal, no predictor meets it."""
    draw = random.Random(seed)
    rhos = sorted(spearman(measured, [m * math.exp(draw.gauss(0.0, cv)) for m in measured]) for _ in range(NOISE_DRAWS))
    return rhos[len(rhos) // 2]


def cpu(flags: frozenset[str]) -> DeviceSpec:
    return DeviceSpec("cpu", None, "AMD EPYC (grid)", 24 * 2**30, ("fp32", "bf16"), cpu_flags=flags)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2
            i = j + 1
        return result

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def grid_check(path: Path, flags: frozenset[str], ceiling: int) -> dict[str, Any]:
    data = json.loads(path.read_text())
    model = resolve_model(data["meta"]["model"])
    seq_len = int(data["meta"]["seq_len"])
    device = cpu(flags)
    prior = speed_prior(device, {}, cpu_cores=2)
    rows: list[tuple[TrialConfig, StepWork, TrialResult]] = []
    for row in data["results"]:
        result = TrialResult.from_dict(row["result"])
        if result.status not in ("ok", "over_ceiling") or not fits(result.peak_memory_bytes, ceiling):
            continue
        config = TrialConfig(**row["params"])
        rows.append((config, step_work(model, config, seq_len, "cpu", matmul_dtype(config.precision)), result))

    def predicted(fit: SpeedFit) -> list[float]:
        return [predict_speed(work, fit).model_tflops for _, work, _ in rows]  # type: ignore[union-attr]

    measured = [result.model_tflops for _, _, result in rows]
    zero = predicted(prior)
    order = sorted(range(len(rows)), key=lambda i: -zero[i])
    trials = [(rows[i][1], rows[i][2].step_time_median_s) for i in order[:CALIBRATION_TRIALS]]
    calibrated_fit = fit_speed(trials, prior)
    calibrated = predicted(calibrated_fit)
    best = max(measured)
    pick = max(range(len(rows)), key=lambda i: calibrated[i])
    errors = [abs(p - m) / m for p, m in zip(calibrated, measured)]
    steady = [i for i, (_, _, result) in enumerate(rows) if result.steady]
    return {
        "grid": path.name,
        "model": model.name,
        "configs": len(rows),
        "spread": best / min(measured),
        "spearman_zero": spearman(zero, measured),
        # Over the configs whose measurement met its CV target (the grid's own ``steady``, set before any
        # prediction): how much of the shortfall is the rows a single pass measured in 2-3 noisy steps.
        "steady_configs": len(steady),
        "spearman_zero_steady": spearman([zero[i] for i in steady], [measured[i] for i in steady]),
        "spearman_3": spearman(calibrated, measured),
        "zero_pick_vs_best": measured[order[0]] / best,
        "pick_vs_best": measured[pick] / best,
        "pick": rows[pick][0].short(),
        "median_error_3": sorted(errors)[len(errors) // 2],
        "perfect_predictor_spearman": {f"{cv:.0%}": perfect_predictor_spearman(measured, cv) for cv in NOISE_CVS},
        "fit": calibrated_fit.describe(),
    }


# The grids' spaces (docs/benchmarks.md, "Search efficiency": the commands that measured them).
GRID_SPACES = {
    "bench_grid_cpu.json": "bench_search_space.yaml",
    "bench_grid_gpt2_cpu.json": "bench_search_space_gpt2.yaml",
    "bench_grid_llama_cpu.json": "bench_search_space_llama.yaml",
}
# The search's first trials are its seed trials and the prior's predicted fastest, not drawn: the same for
# every sampler seed (three checked).
SEARCH_SEEDS = 3


def search_model_check(
    grid: Grid,
    name: str,
    space_path: Path,
    ceiling: int,
    device: DeviceSpec,
    calibration: Path | None = None,
    trials: int = CALIBRATION_TRIALS,
    seeds: int = SEARCH_SEEDS,
) -> dict[str, Any]:
    """The search's own model after its first ``trials`` trials, replayed on the grid: ``autotune.study.search``
    (its seed trials first, then its proposals; the grid's measurements as the trials' results), then the
    landscape it proposes from, at its posterior mean (the throughput prior calibrated on those trials, plus
    the knob effects learned from them), over every config of the grid that fits. Its predicted best's
    measured speed against the grid's best, and its rank correlation with the grid, per sampler seed.
    ``calibration``: the measuring machine's record (peaks.json's format), which the search then plans with,
    as ``autotune search`` does on a calibrated machine; without it, the CPU's nominal rates."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    model = resolve_model(grid.meta["model"])
    space = load_space(str(space_path), device)
    request = bench_request(grid, model, device, space, ceiling, prune_ratio=0.0)
    if calibration is not None:
        workload = dataclasses.replace(request.workload, **machine_rates(calibration, device))
        request = dataclasses.replace(request, workload=workload)
    feasible = [
        (c, r)
        for c, r in grid.results.items()
        if r.status in ("ok", "over_ceiling") and fits(r.peak_memory_bytes, ceiling)
    ]
    best = max(r.model_tflops for _, r in feasible)
    picks, rhos, chosen = [], [], []
    for seed in range(seeds):
        study = open_study(optuna.storages.InMemoryStorage(), f"after-{seed}", request, sampler_seed=seed)
        search(
            study,
            request,
            SearchBudget(trials=trials, confirm_top=0),
            SearchHooks(),
            run_trial=GridRunner(grid, ceiling),
        )
        finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        searched = next(t.distributions for t in finished if t.distributions)
        encoding = _landscape.KnobEncoding(searched)  # type: ignore[arg-type]  # categorical spaces
        observed = _landscape.observations(finished, encoding.names, ceiling)
        log_prior = study.sampler._calibrated_log_prior(finished)  # type: ignore[attr-defined]
        posterior = _landscape.throughput_posterior(encoding, observed, noise_fraction(study), log_prior)
        configs = [{name: c.to_params()[name] for name in encoding.names} for c, _ in feasible]
        predicted = list(_landscape.drawn_log_speed(encoding, posterior.mean, configs, log_prior))
        measured = [r.model_tflops for _, r in feasible]
        pick = max(range(len(feasible)), key=lambda i: predicted[i])
        picks.append(measured[pick] / best)
        chosen.append(feasible[pick][0].short())
        rhos.append(spearman(predicted, measured))
    picks.sort()
    rhos.sort()
    return {
        "grid": name,
        "trials": trials,
        "seeds": seeds,
        "pick_vs_best_median": picks[len(picks) // 2],
        "pick_vs_best_worst": picks[0],
        "seeds_within_5pct": sum(p >= 0.95 for p in picks),
        "spearman_median": rhos[len(rhos) // 2],
        "picks": sorted(set(chosen)),
    }


def median_pass_grid(directory: Path) -> Grid:
    """A repeated grid's passes as one grid to replay: each config's row from the pass whose figure for it is the
    median (the lower middle of an even count of passes): a measured row, not an average of rows. Configs some
    pass lacks are left out."""
    passes = [Grid.load(path) for path in sorted(directory.glob("pass*.json"))]
    results = {}
    for config in passes[0].results:
        rows = sorted((g.results[config] for g in passes if config in g.results), key=lambda r: r.model_tflops)
        if len(rows) == len(passes):
            results[config] = rows[(len(rows) - 1) // 2]
    return Grid(meta=passes[0].meta, results=results)


def repeated_grid_device(meta: dict[str, Any]) -> DeviceSpec:
    """The CPU that measured a repeated grid, as its passes' ``meta`` recorded it (name and flags): the name is
    what its ``calibration.json`` is keyed by."""
    return DeviceSpec("cpu", None, meta["device"], 24 * 2**30, ("fp32", "bf16"), cpu_flags=frozenset(meta["cpu_flags"]))


def machine_rates(calibration: Path, device: DeviceSpec) -> dict[str, Any]:
    """A machine's record (``autotune devices --calibrate``'s file, peaks.json's format) read for ``device``, as
    the planner reads the user's (``autotune/plan/_plan.py``): the ``Workload`` fields of its measured rates."""
    with mock.patch.dict(os.environ, {PEAKS_FILE_ENV: str(calibration)}):
        return {
            "measured_peaks_tflops": load_measured_peaks(device.name),
            "measured_bandwidth_gb_s": load_measured_bandwidth(device.name),
            "measured_inner_tflops": load_measured_inner_rates(device.name),
            "measured_op_rates": load_measured_op_rates(device.name),
        }


def repeated_search_model_check(directory: Path, ceiling: int, workdir: Path) -> dict[str, Any]:
    """:func:`search_model_check` on the median of a repeated grid's passes, planned with the machine's
    calibration; the space is the passes' recorded one (``meta["space"]``) narrowed to the values every pass
    measured (a first pass may have measured more: gpt2-tiny's also micro-batch 32), so the replayed search
    proposes only configs the median grid has."""
    grid = median_pass_grid(directory)
    measured = [config.to_params() for config in grid.results]
    space = {
        knob: [value for value in values if any(params[knob] == value for params in measured)]
        for knob, values in grid.meta["space"].items()
    }
    space_path = workdir / f"{directory.name}-space.yaml"
    space_path.write_text(json.dumps(space))  # JSON is YAML
    device = repeated_grid_device(grid.meta)
    return search_model_check(grid, directory.name, space_path, ceiling, device, directory / "calibration.json")


# Grids measured several times over on one CPU calibrated the same hour (``autotune devices --calibrate``): a
# directory of ``pass<N>.json`` (each ``python -m benchmarks.bench_search ... --grid pass<N>.json --rounds 0``,
# one after the other) and ``calibration.json``, the machine's record in peaks.json's format. The one
# grid check where the prior gets what a user's machine gives it, and where the measurement's own
# reproducibility is measured, not modelled (``perfect_predictor_spearman``): how well one pass ranks the
# configs as the others do.
# Each with the ceiling its passes were measured under (``--ceiling``).
REPEATED_GRIDS = {
    "bench_grid_llama_xeon_amx": 980 * 2**20,
    "bench_grid_bert_xeon_amx": int(1.25 * 2**30),
    "bench_grid_gpt2_epyc_avx2": int(2.5 * 2**30),
    "bench_grid_gpt2_epyc_avx512": int(2.5 * 2**30),
    "bench_grid_smollm2_epyc_avx512": 8 * 2**30,
    "bench_grid_distilbert_epyc_avx512": 8 * 2**30,
}


def repeated_grid_check(directory: Path, ceiling: int) -> dict[str, Any]:
    """The zero-trial prior (with the machine's calibration, and nominal from its CPU flags alone) against the
    median of several passes over one grid, and each pass against the median of the others."""
    passes = [Grid.load(path) for path in sorted(directory.glob("pass*.json"))]
    meta = passes[0].meta
    configs = [
        c
        for c in passes[0].results
        if all(
            c in g.results
            and g.results[c].status in ("ok", "over_ceiling")
            and fits(g.results[c].peak_memory_bytes, ceiling)
            for g in passes
        )
    ]
    by_pass = [[g.results[c].model_tflops for c in configs] for g in passes]
    medians = [median([figures[i] for figures in by_pass]) for i in range(len(configs))]
    step_s = [median([g.results[c].step_time_median_s for g in passes]) for c in configs]
    model = resolve_model(meta["model"])
    device = repeated_grid_device(meta)
    works = [step_work(model, c, int(meta["seq_len"]), "cpu", matmul_dtype(c.precision)) for c in configs]
    rates = machine_rates(directory / "calibration.json", device)
    calibrated = speed_prior(
        device,
        rates["measured_peaks_tflops"],
        rates["measured_bandwidth_gb_s"],
        cpu_cores=2,
        measured_inner_tflops=rates["measured_inner_tflops"],
        measured_op_rates=rates["measured_op_rates"],
    )
    best = max(medians)
    result: dict[str, Any] = {"grid": directory.name, "passes": len(passes), "configs": len(configs)}
    result["spread"] = best / min(medians)
    for label, prior in (("calibrated", calibrated), ("nominal", speed_prior(device, {}, cpu_cores=2))):
        zero = [predict_speed(work, prior).model_tflops for work in works]  # type: ignore[union-attr]
        order = sorted(range(len(configs)), key=lambda i: -zero[i])
        fitted = fit_speed([(works[i], step_s[i]) for i in order[:CALIBRATION_TRIALS]], prior)
        after = [predict_speed(work, fitted).model_tflops for work in works]  # type: ignore[union-attr]
        pick = max(range(len(configs)), key=lambda i: after[i])
        result[label] = {
            "fit": prior.describe(),
            "spearman_zero": spearman(zero, medians),
            "spearman_zero_each_pass": [spearman(zero, figures) for figures in by_pass],
            "zero_pick_vs_best": medians[order[0]] / best,
            "level_predicted_over_measured": median([z / m for z, m in zip(zero, medians)]),
            "spearman_3": spearman(after, medians),
            "pick_vs_best_3": medians[pick] / best,
        }
    pairs = [spearman(a, b) for i, a in enumerate(by_pass) for b in by_pass[i + 1 :]]
    result["pass_vs_pass_spearman"] = {"median": median(pairs), "min": min(pairs), "max": max(pairs)}
    result["pass_vs_median_of_others"] = [
        spearman([median([f[i] for j, f in enumerate(by_pass) if j != k]) for i in range(len(configs))], by_pass[k])
        for k in range(len(by_pass))
    ]
    return result


@dataclasses.dataclass(frozen=True)
class Published:
    """One published single-GPU figure and the config it was measured with."""

    what: str
    source: str
    model: str
    gpu: str
    seq_len: int
    config: TrialConfig
    tokens_per_s: float | None
    mfu: float | None
    peft: str | None = None


TORCHTUNE = "torchtune README, 'Memory and training speed' (batch 2, packed to 2048, torch.compile)"
FOUNDRY = "llm-foundry scripts/train/benchmarking/README.md (8 GPUs, per GPU, bf16 amp, FSDP, flash attention)"
# The MPT architectures of llm-foundry's yamls (scripts/train/yamls/pretrain/mpt-*.yaml): tied embeddings,
# no biases, expansion ratio 4, vocabulary 50,368; ALiBi, so no position limit (the runs set max_seq_len).
MPT = {
    "mpt-125m": {"d_model": 768, "n_heads": 12, "n_layers": 12},
    "mpt-350m": {"d_model": 1024, "n_heads": 16, "n_layers": 24},
    "mpt-760m": {"d_model": 1536, "n_heads": 12, "n_layers": 24},
    "mpt-1b": {"d_model": 2048, "n_heads": 16, "n_layers": 24},
    "mpt-3b": {"d_model": 2560, "n_heads": 20, "n_layers": 32},
    "mpt-7b": {"d_model": 4096, "n_heads": 32, "n_layers": 32},
    "mpt-13b": {"d_model": 5120, "n_heads": 40, "n_layers": 40},
    "mpt-30b": {"d_model": 7168, "n_heads": 56, "n_layers": 48},
}
# torchtune's single-device recipes (recipes/configs/llama3_1/8B_full_single_device.yaml,
# 8B_lora_single_device.yaml, 8B_qlora_single_device.yaml): bf16 weights, activation checkpointing,
# paged 8-bit AdamW for the full fine-tune, fused AdamW for the adapters; compiled (the README's note).
FULL_8B = TrialConfig(
    micro_batch=2, checkpointing=True, dtype="bf16", weight_dtype="bf16", optim="paged_adamw_8bit", compile="inductor"
)
ADAPTERS_8B = dataclasses.replace(FULL_8B, optim="adamw_torch_fused")
# llm-foundry's MPT runs: amp_bf16 (fp32 master weights), no activation checkpointing, flash attention.
MPT_RUN = TrialConfig(dtype="bf16", optim="adamw_torch_fused", attn_implementation="sdpa")
PUBLISHED = (
    Published("Llama-3.1-8B full", TORCHTUNE, "llama-3.1-8b", "NVIDIA RTX A6000", 2048, FULL_8B, 2579.0, None),
    Published(
        "Llama-3.1-8B LoRA", TORCHTUNE, "llama-3.1-8b", "NVIDIA RTX A6000", 2048, ADAPTERS_8B, 4699.0, None, "lora"
    ),
    Published(
        "Llama-3.1-8B QLoRA",
        TORCHTUNE,
        "llama-3.1-8b",
        "NVIDIA GeForce RTX 4090",
        2048,
        ADAPTERS_8B,
        2413.0,
        None,
        "qlora",
    ),
    Published(
        "MPT-1B",
        FOUNDRY,
        "mpt-1b",
        "NVIDIA H100 80GB HBM3",
        2048,
        dataclasses.replace(MPT_RUN, micro_batch=14),
        45455.0,
        0.4182,
    ),
    Published(
        "MPT-7B",
        FOUNDRY,
        "mpt-7b",
        "NVIDIA H100 80GB HBM3",
        2048,
        dataclasses.replace(MPT_RUN, micro_batch=6),
        10643.0,
        0.4644,
    ),
    Published(
        "MPT-7B",
        FOUNDRY,
        "mpt-7b",
        "NVIDIA A100-SXM4-80GB",
        2048,
        dataclasses.replace(MPT_RUN, micro_batch=6, grad_accum=2),
        4641.0,
        0.6423,
    ),
)


# Every 8-GPU row of llm-foundry's benchmarking tables for H100 and A100 up to 16k tokens, read per GPU (the file
# names its source and columns). A wider check than PUBLISHED's three rows, by sequence length and size; none of
# it was used to set a constant.
FOUNDRY_FILE = DATA / "published_llm_foundry.json"


def foundry_rows() -> dict[str, list[list[Any]]]:
    """``FOUNDRY_FILE``'s rows by GPU: model, seq len, micro-batch, accumulation, checkpointing, tokens/s per GPU,
    MFU (%)."""
    return json.loads(FOUNDRY_FILE.read_text())["rows"]


def foundry_sweep(workdir: Path) -> list[dict[str, Any]]:
    """Each of ``FOUNDRY_FILE``'s rows predicted from the datasheet alone: the prior's tokens/s and MFU per GPU."""
    rows = []
    for gpu_name, figures in foundry_rows().items():
        device = gpu(gpu_name)
        for name, seq_len, micro, accumulation, checkpointing, tokens_per_s, mfu in figures:
            config = dataclasses.replace(
                MPT_RUN, micro_batch=micro, grad_accum=accumulation, checkpointing=checkpointing
            )
            model = published_model(name, workdir)
            speed = predict_speed(step_work(model, config, seq_len, "cuda", config.precision), speed_prior(device, {}))
            assert speed is not None and speed.mfu is not None
            rows.append(
                {
                    "gpu": gpu_name,
                    "model": name,
                    "seq_len": seq_len,
                    "config": config.short(),
                    "published_tokens_per_s": tokens_per_s,
                    "predicted_tokens_per_s": round(speed.tokens_per_s),
                    "tokens_error": speed.tokens_per_s / tokens_per_s - 1,
                    "published_mfu": mfu / 100,
                    "predicted_mfu": speed.mfu,
                }
            )
    return rows


def foundry_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per GPU and sequence length band: how many rows within 25 % in tokens/s and 10 points of MFU, the median
    and the worst error."""
    summary = {}
    for gpu_name in {row["gpu"]: None for row in rows}:
        for band, (low, high) in {"<= 2048": (0, 2048), "4096-16384": (2049, 16384)}.items():
            errors = [r["tokens_error"] for r in rows if r["gpu"] == gpu_name and low <= r["seq_len"] <= high]
            points = [
                abs(r["predicted_mfu"] - r["published_mfu"])
                for r in rows
                if r["gpu"] == gpu_name and low <= r["seq_len"] <= high
            ]
            summary[f"{gpu_name}, seq {band}"] = {
                "rows": len(errors),
                "within_25pct": sum(abs(e) <= 0.25 for e in errors),
                "mfu_within_10_points": sum(p <= 0.10 for p in points),
                "median_error": median(errors),
                "worst_error": max(errors, key=abs),
            }
    return summary


# torchtitan's published Llama 2 and Llama 3 rows on A100 and H100, per GPU of FSDP runs (the file names its
# sources and columns). Its two Llama-3 8B A100 rows set ``TRAINING_MATMUL_FRACTION`` (``set_a_constant``); the
# others set nothing.
TORCHTITAN_FILE = DATA / "published_torchtitan.json"
# torchtitan's runs: bf16 compute over fp32 weights (FSDP2's mixed precision), fused AdamW, SDPA.
TITAN_RUN = TrialConfig(dtype="bf16", optim="adamw_torch_fused", attn_implementation="sdpa")


def torchtitan_sweep(workdir: Path) -> list[dict[str, Any]]:
    """Each of ``TORCHTITAN_FILE``'s rows predicted from the datasheet alone. Its selective checkpointing recomputes
    about half of what checkpointing every layer does (every 2nd layer, or every 2nd matmul of each layer): the
    step predicted as the mean of the prior's step without checkpointing and with it, both shown."""
    published = json.loads(TORCHTITAN_FILE.read_text())
    rows = []
    for name, gpu_name, gpus, seq_len, micro, checkpointing, compiled, tokens_per_s, set_constant in published["rows"]:
        shape = published["models"][name]
        if isinstance(shape, str):
            model = resolve_model(shape)
        else:
            directory = workdir / name
            directory.mkdir(parents=True, exist_ok=True)
            written = {k: v for k, v in shape.items() if k not in ("source", "num_params")}
            written |= {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu"}
            (directory / "config.json").write_text(json.dumps(written | {"tie_word_embeddings": False}))
            model = resolve_model(str(directory))
        device = gpu(gpu_name)
        steps = {}
        for recompute in (False, True):
            config = dataclasses.replace(
                TITAN_RUN, micro_batch=micro, checkpointing=recompute, compile="inductor" if compiled else "off"
            )
            speed = predict_speed(step_work(model, config, seq_len, "cuda", config.precision), speed_prior(device, {}))
            assert speed is not None
            steps[recompute] = speed.step_s
        step_s = {"none": steps[False], "full": steps[True], "selective": (steps[False] + steps[True]) / 2}
        predicted = micro * seq_len / step_s[checkpointing]
        rows.append(
            {
                "gpu": gpu_name,
                "gpus": gpus,
                "model": name,
                "seq_len": seq_len,
                "micro_batch": micro,
                "checkpointing": checkpointing,
                "compile": compiled,
                "published_tokens_per_s": tokens_per_s,
                "predicted_tokens_per_s": round(predicted),
                "tokens_error": predicted / tokens_per_s - 1,
                "without_checkpointing": round(micro * seq_len / steps[False]),
                "every_layer_checkpointed": round(micro * seq_len / steps[True]),
                "set_a_constant": set_constant,
            }
        )
    return rows


def published_model(name: str, workdir: Path):
    if name not in MPT:
        return resolve_model(name)
    directory = workdir / name
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["MptForCausalLM"],
        "model_type": "mpt",
        "expansion_ratio": 4,
        "max_seq_len": 65536,
        "vocab_size": 50368,
        "no_bias": True,
        **MPT[name],
    }
    (directory / "config.json").write_text(json.dumps(config))
    return resolve_model(str(directory))


def gpu(name: str) -> DeviceSpec:
    from autotune.spec.devices import KNOWN_GPUS, cuda_dtypes

    known = next((g.device() for g in KNOWN_GPUS if g.nvml_name == name), None)
    return known or DeviceSpec("cuda", 0, name, 48 * 2**30, cuda_dtypes((8, 6)), compute_capability=(8, 6))


def published_check(figure: Published, workdir: Path) -> dict[str, Any]:
    device = gpu(figure.gpu)
    model = published_model(figure.model, workdir)
    if figure.peft is not None:
        from autotune.spec.peft import with_peft

        model = with_peft(model, figure.peft, device, [])
    speed = predict_speed(
        step_work(model, figure.config, figure.seq_len, "cuda", figure.config.precision), speed_prior(device, {})
    )
    assert speed is not None
    row: dict[str, Any] = {
        "what": figure.what,
        "gpu": figure.gpu,
        "published_tokens_per_s": figure.tokens_per_s,
        "predicted_tokens_per_s": speed.tokens_per_s,
        "tokens_error": speed.tokens_per_s / figure.tokens_per_s - 1 if figure.tokens_per_s else None,
        "published_mfu": figure.mfu,
        "predicted_mfu": speed.mfu,
        "source": figure.source,
    }
    if figure.peft is not None:  # what the published figure implies of the frozen base's 4N
        row["published_mfu_implied"] = (
            figure.tokens_per_s * speed.work.model_flops / speed.work.real_tokens / 1e12 / (speed.mfu_peak_tflops or 1)
        )
    return row


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    for name, (ceiling, flags) in GRID_CPUS.items():
        for label, kind in (("as inferred", flags), ("other CPU kind", AVX2 if flags == AVX512_BF16 else AVX512_BF16)):
            result = grid_check(DATA / name, kind, ceiling)
            print(label, json.dumps(result, indent=None, default=str))
    for name, (ceiling, _) in GRID_CPUS.items():
        grid = Grid.load(DATA / name)
        device, _ = replay_device(cpu_device(), grid)
        check = search_model_check(grid, name, DATA / GRID_SPACES[name], ceiling, device)
        print("the search's model", json.dumps(check))
    for name, ceiling in REPEATED_GRIDS.items():
        print("repeated", json.dumps(repeated_grid_check(DATA / name, ceiling)))
    with tempfile.TemporaryDirectory() as workdir:
        for name, ceiling in REPEATED_GRIDS.items():
            check = repeated_search_model_check(DATA / name, ceiling, Path(workdir))
            print("the search's model, repeated", json.dumps(check))
        for figure in PUBLISHED:
            print(json.dumps(published_check(figure, Path(workdir)), default=str))
        foundry = foundry_sweep(Path(workdir))
        for row in foundry:
            print("llm-foundry", json.dumps(row))
        print("llm-foundry summary", json.dumps(foundry_summary(foundry), indent=1))
        titan = torchtitan_sweep(Path(workdir))
        for row in titan:
            print("torchtitan", json.dumps(row))
        independent = [row for row in titan if not row["set_a_constant"]]
        within = sum(abs(row["tokens_error"]) <= 0.25 for row in independent)
        print(f"torchtitan summary: {within} of {len(independent)} rows that set no constant within 25 %")


if __name__ == "__main__":
    main()
