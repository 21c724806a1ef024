"""Search efficiency: trials until 98 % of the best config, for autotune, plain Optuna TPE and random.

1. **Grid (the oracle).** Every config of the space is measured once, for real, through autotune's
   runner (a fresh child per config, short measurement settings), and cached to a JSON file. An
   interrupted grid resumes where it stopped. The oracle's best is the fastest config whose
   measured peak fits under the benchmark ceiling.
2. **Samplers on the grid.** Each strategy then searches the same space, with a lookup in the grid
   instead of training, over several seeds:

   * ``autotune``: the real search loop (``autotune.study.run_one_trial``: seeds, the Thompson
     sampling proposals of ``autotune.study._proposals``, screening by the calibrated estimator and by measured
     OOMs, early stop) with the grid lookup as its trial runner. Early stop is replayed as the
     runner does it: a config measured below ``prune ratio x best`` stops after
     ``prune_after_steps`` measured steps; its cost is cut to what had run. ``autotune before``
     is the same loop with the sampler it had before (Optuna's TPE, repeats of measured configs
     answered from the record); both are also run without their seed trials.
   * ``plain TPE``: ``optuna.samplers.TPESampler(seed=...)`` with default settings, value = samples/s
     (0 when the config does not fit), every proposal run (a duplicate costs a run again).
   * ``random``: configs drawn without replacement (the stronger random baseline), over
     :data:`RANDOM_ORDERS` orders: its median is the yardstick, so it is measured precisely.

   Reported per strategy: runs (configs actually trained) and wall time until the best feasible
   samples/s found is >= 98 % of the oracle's best; wall time = the grid's measured wall time of
   each run + the strategy's own measured time (sampler, estimator, storage).
3. **Side by side, for real, in one run** (interleaved rounds, fresh child each): autotune's winner,
   the HF default ``TrainingArguments``, and ``auto_find_batch_size=True`` starting from the space's
   largest micro-batch, all at the same ceiling. The ceiling is an RSS figure on the CPU; for
   ``auto_find_batch_size`` to react to it, its child may grow its address space by only
   ``ceiling - its resident size at start`` (allocations fail there, which it catches and halves on).

A landscape can also be modelled instead of measured (``--modelled SEED``: ``modelled_grid``),
and ``--landscapes N`` compares the searches with random order on N reshuffled landscapes of a
grid's space (``reshuffled_grid``). Each run also prints the patience table (``--trials 20
--patience K``: runs until the search stopped, seeds that missed the target).

Commands (docs/benchmarks.md holds the results)::

    # reduced grid while building (16 configs):
    python scripts/bench_search.py --grid /tmp/grid_small.json --space /tmp/small.yaml --seeds 5 --rounds 1
    # landscape 1, the measured bert-mini grid (about 20-30 minutes with the side by side; the grid is cached):
    python scripts/bench_search.py --grid docs/bench_grid_cpu.json --rounds 3 --markdown /tmp/bench_search.md
    # landscape 2, the measured gpt2-tiny grid (25 minutes to measure on a quiet machine, then cached):
    python scripts/bench_search.py --model gpt2-tiny --space scripts/bench_search_space_gpt2.yaml --grid docs/bench_grid_gpt2_cpu.json --ceiling 1.6GiB --rounds 0
    # reshuffled landscapes of a grid's space and memory:
    python scripts/bench_search.py --model gpt2-tiny --space scripts/bench_search_space_gpt2.yaml --grid docs/bench_grid_gpt2_cpu.json --ceiling 1.6GiB --landscapes 12
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import optuna  # noqa: E402
from _bench_common import load_average  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from autotune.ceiling import fits, parse_ceiling  # noqa: E402
from autotune.config import TrialConfig  # noqa: E402
from autotune.devices import DeviceSpec, cpu_device  # noqa: E402
from autotune.measure import MeasureSettings  # noqa: E402
from autotune.models import ModelSpec, resolve_model  # noqa: E402
from autotune.result import TrialResult  # noqa: E402
from autotune.runner import TrialJob, Workload, child_address_space_budget, run_isolated  # noqa: E402
from autotune.space import SearchSpace, load_space  # noqa: E402
from autotune.result import came_back_counts  # noqa: E402
from autotune.study._proposals import SearchFinished, stop_reason  # noqa: E402
from autotune.study import SearchProgress, SearchRequest, open_study, run_one_trial  # noqa: E402
from autotune.study._seeds import hf_default_config  # noqa: E402
from autotune.units import format_bytes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SPACE = REPO / "scripts" / "bench_search_space.yaml"
DEFAULT_GRID = REPO / "docs" / "bench_grid_cpu.json"
TARGET_FRACTION = 0.98
# Short measurement: the grid is about ranking configs, and is measured once per config.
BENCH_MEASURE = MeasureSettings(warmup_steps=2, min_steps=4, max_steps=8, max_seconds=6.0, cv_target=0.05)
BATCH_FILE = "train_batch_size"
# Row names of the strategies table.
NEW = "autotune (Thompson sampling over the landscape model, autotune.study._proposals)"
OLD = "autotune before (Optuna's TPE, repeats answered from the record)"
NEW_NO_SEEDS = "autotune without its seed trials"
OLD_NO_SEEDS = "autotune before, without its seed trials"
RANDOM = "random (no repeats)"
PATIENCE_VALUES = (None, 4, 6, 8, 10)
# Random orders behind the random row's median (cheap: no search runs).
RANDOM_ORDERS = 200

optuna.logging.set_verbosity(optuna.logging.WARNING)


class TrainBatchSizeRecorder(TrainerCallback):
    """Writes the Trainer's actual per-device batch size (``auto_find_batch_size`` shrinks it) to the
    trial's output dir. Trial children import it as ``bench_search:TrainBatchSizeRecorder``."""

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's signature
        Path(args.output_dir, BATCH_FILE).write_text(str(state.train_batch_size))


# --- the grid ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Grid:
    """Every config of the space with its measured result, and how it was measured."""

    meta: dict[str, Any]
    results: dict[TrialConfig, TrialResult]
    # The 1-minute load average when each config's measurement ended (its own trial included).
    loads: dict[TrialConfig, float] = dataclasses.field(default_factory=dict)

    def fits(self, result: TrialResult, ceiling_bytes: int) -> bool:
        return result.status in ("ok", "over_ceiling") and 0 < result.peak_memory_bytes <= ceiling_bytes

    def best(self, ceiling_bytes: int) -> tuple[TrialConfig, float]:
        feasible = [(r.samples_per_s, c) for c, r in self.results.items() if self.fits(r, ceiling_bytes)]
        samples_per_s, config = max(feasible, key=lambda pair: pair[0])
        return config, samples_per_s

    def save(self, path: Path) -> None:
        rows = [
            {"params": c.to_params(), "load_1min": self.loads.get(c), "result": r.to_dict()} for c, r in self.results.items()
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


def space_configs(space: SearchSpace) -> list[TrialConfig]:
    """Every config of the space, in a fixed order."""
    import itertools

    names = list(space.choices)
    return [TrialConfig.from_params(dict(zip(names, values))) for values in itertools.product(*space.choices.values())]


def measure_grid(
    path: Path, model: ModelSpec, device: DeviceSpec, space: SearchSpace, seq_len: int, ceiling: int,
    remeasure_above_load: float | None = None,
) -> Grid:
    """Measure every config not in the cached grid yet; save after each one (resumable).

    With ``remeasure_above_load``, configs measured while the 1-minute load average was above it
    (or with no load recorded) are measured again: another job on the machine skews a ranking.
    """
    import psutil

    grid = Grid.load(path) if path.exists() else Grid(meta={}, results={})
    grid.meta.update(
        model=model.name, seq_len=seq_len, device=device.name, space=space.choices, ceiling_bytes=ceiling,
        measure=dataclasses.asdict(BENCH_MEASURE),
    )
    todo = [
        c for c in space_configs(space)
        if c not in grid.results
        or (remeasure_above_load is not None and grid.loads.get(c, float("inf")) > remeasure_above_load)
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-search-grid-"))
    # Measured at a generous limit so configs over the benchmark ceiling still get a real peak.
    generous = 4 * ceiling
    print(f"grid: {len(grid.results)} cached, {len(todo)} to measure; {load_average()}", flush=True)
    grid.meta.setdefault("load_before", load_average())
    started = time.perf_counter()
    for index, config in enumerate(todo):
        job = TrialJob(
            workload=Workload(
                model=model,
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
    from autotune.estimate import estimate_peak

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
        peak = int(estimate_peak(model, config, seq_len, device.kind).total_bytes * 1.1 * rng.lognormvariate(0.0, 0.05))
        step_s = config.global_batch / samples_per_s
        results[config] = TrialResult(
            status="ok", samples_per_s=samples_per_s, model_tflops=samples_per_s / 1000, peak_memory_bytes=peak,
            step_time_median_s=step_s, step_time_cv=0.04, measured_steps=BENCH_MEASURE.max_steps,
            wall_s=3.0 + (BENCH_MEASURE.warmup_steps + BENCH_MEASURE.max_steps) * step_s,
        )
    meta = {"model": model.name, "seq_len": seq_len, "device": f"modelled ({device.name} estimator)", "space": space.choices,
            "modelled_seed": seed}
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


def landscapes_table(base: Grid, request: SearchRequest, count: int, effect_sigma: float, seeds: int, max_asks: int) -> str:
    """New and old search (no seed trials) against random order on ``count`` reshuffled landscapes."""
    lines = [
        f"{count} reshuffled landscapes (reshuffled_grid, knob effects sigma {effect_sigma}), memory of {base.meta['model']}; "
        f"median runs to the target over {seeds} search seeds (random order: {RANDOM_ORDERS} orders); a search that never "
        f"reached it counts as the grid's size.",
        "",
        "| landscape | configs reaching the target | new, no seed trials | before, no seed trials | random | new vs random |",
        "|---|---|---|---|---|---|",
    ]
    ceiling = request.ceiling_bytes
    for index in range(count):
        grid = reshuffled_grid(base, index, effect_sigma)
        target = TARGET_FRACTION * grid.best(ceiling)[1]

        def median_runs(stats: list[RunStats]) -> float:
            return statistics.median(s.runs if s.reached else len(grid.results) for s in stats)

        new = median_runs([run_autotune(grid, request, s, target, max_asks, with_seeds=False)[0] for s in range(seeds)])
        old = median_runs(
            [run_autotune(grid, request, s, target, max_asks, with_seeds=False, old_sampler=True)[0] for s in range(seeds)]
        )
        rand = median_runs([run_random(grid, ceiling, s, target) for s in range(RANDOM_ORDERS)])
        reaching = sum(grid.fits(r, ceiling) and r.samples_per_s >= target for r in grid.results.values())
        lines.append(f"| {index} | {reaching} | {new:g} | {old:g} | {rand:g} | {rand / max(new, 1):.1f}x fewer |")
    return "\n".join(lines) + "\n"


# --- strategies on the grid ----------------------------------------------------------------------


@dataclasses.dataclass
class RunStats:
    """One strategy, one seed: what it cost to reach the target."""

    reached: bool
    runs: int  # configs actually trained until the target (or until giving up)
    asks: int  # proposals, reused and screened ones included
    wall_s: float  # grid wall time of the runs + the strategy's own time
    screened: int = 0
    reused: int = 0
    pruned: int = 0
    came_back: int = 0  # proposals of a measured config: answered from the record, or turned to an untaken one


class GridRunner:
    """``run_isolated``'s signature, answered from the grid; replays the runner's early stop."""

    def __init__(self, grid: Grid, ceiling_bytes: int) -> None:
        self.grid = grid
        self.ceiling_bytes = ceiling_bytes
        self.runs = 0
        self.cost_s = 0.0
        self.pruned = 0

    def __call__(self, job: TrialJob, timeout_s: float, on_tick: Callable[[], None] | None = None) -> TrialResult:
        measured = self.grid.results[job.config]
        result = TrialResult.from_dict(measured.to_dict())
        result.ceiling_bytes = self.ceiling_bytes
        if result.status in ("ok", "over_ceiling"):
            result.status = "ok" if fits(result.peak_memory_bytes, self.ceiling_bytes) else "over_ceiling"
        cost = measured.wall_s
        threshold = job.prune_below_samples_per_s
        settings = job.workload.measure
        # The child's pruner judges after prune_after_steps measured steps (the median so far,
        # replayed here by the config's measured median) and stops the trial there.
        judged_after = min(settings.prune_after_steps, settings.min_steps)
        if (
            threshold is not None
            and result.status == "ok"
            and result.samples_per_s < threshold
            and measured.measured_steps > judged_after
        ):
            cost -= (measured.measured_steps - judged_after) * measured.step_time_median_s
            result.measured_steps = judged_after
            result.status = "pruned"
            self.pruned += 1
        self.runs += 1
        self.cost_s += cost
        return result


def bench_request(grid: Grid, model: ModelSpec, device: DeviceSpec, space: SearchSpace, ceiling: int, prune_ratio: float) -> SearchRequest:
    return SearchRequest(
        workload=Workload(
            model=model,
            device=device,
            seq_len=int(grid.meta["seq_len"]),
            ceiling_bytes=ceiling,
            measure=BENCH_MEASURE,
        ),
        space=space,
        work_root=tempfile.mkdtemp(prefix="bench-search-autotune-"),
        prune_ratio=prune_ratio,
    )


def run_autotune(
    grid: Grid,
    request: SearchRequest,
    seed: int,
    target: float,
    max_asks: int,
    with_seeds: bool = True,
    old_sampler: bool = False,
    patience: int | None = None,
    budget: int | None = None,
) -> tuple[RunStats, TrialConfig | None]:
    """The real autotune loop on the grid; returns its cost to the target and its winner then.

    ``with_seeds=False`` is the ablation: the study's seed trials (HF default, best-practice guess)
    are taken off the queue unrun, so the sampler, screening, reuse and early stop work alone.
    ``old_sampler`` replays the search before autotune.study._proposals: Optuna's TPE as autotune
    configured it (repeats of measured configs are answered from the record, as they were).
    With ``patience`` and ``budget`` the search runs like ``autotune search --trials budget
    --patience K``: until the budget, the patience or the end of the space, not until the target.
    """
    runner = GridRunner(grid, request.ceiling_bytes)
    study = open_study(optuna.storages.InMemoryStorage(), f"autotune-{seed}", request, sampler_seed=seed)
    if old_sampler:
        study.sampler = optuna.samplers.TPESampler(multivariate=True, group=False, n_startup_trials=6, seed=seed)
    if not with_seeds:
        for _ in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            popped = study.ask()
            popped.set_user_attr("bench_popped", True)
            study.tell(popped, state=TrialState.FAIL)  # pops a queued seed; FAIL informs no sampler
    best = 0.0
    winner: TrialConfig | None = None
    trials_run = 0
    started = time.perf_counter()
    while len(study.get_trials(deepcopy=False)) < max_asks:
        if budget is None and best >= target:
            break
        if budget is not None and (trials_run >= budget or stop_reason(study, request.space.size, patience)):
            break
        try:
            result = run_one_trial(study, request, SearchProgress(), run_trial=runner)
        except SearchFinished:
            if stop_reason(study, request.space.size, None):
                break  # the whole space is measured
            continue  # the old sampler's repeats: the loop asked 50 times; ask on, up to max_asks
        trials_run += 1
        trial = study.get_trials(deepcopy=False)[-1]
        if result.status == "ok" and result.samples_per_s > best:
            best, winner = result.samples_per_s, TrialConfig.from_params(trial.params)
    own_s = time.perf_counter() - started  # the lookups cost nothing: this is the search's own time
    trials = [t for t in study.get_trials(deepcopy=False) if "bench_popped" not in t.user_attrs]
    reused = sum("reused_from" in t.user_attrs for t in trials)
    screened = sum(t.user_attrs.get("status") == "screened" and "reused_from" not in t.user_attrs for t in trials)
    came_back = sum(came_back_counts(trials).values())
    stats = RunStats(best >= target, runner.runs, len(trials), runner.cost_s + own_s, screened, reused, runner.pruned, came_back)
    return stats, winner


def run_plain_tpe(grid: Grid, space: SearchSpace, ceiling: int, seed: int, target: float, max_asks: int) -> RunStats:
    """Optuna's TPE with its defaults; samples/s as the value, 0 when the config does not fit."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    distributions = space.distributions()
    own_s = cost_s = 0.0
    best = 0.0
    asks = 0
    while asks < max_asks and best < target:
        started = time.perf_counter()
        trial = study.ask(distributions)
        result = grid.results[TrialConfig.from_params(trial.params)]
        value = result.samples_per_s if grid.fits(result, ceiling) else 0.0
        study.tell(trial, value)
        own_s += time.perf_counter() - started
        cost_s += result.wall_s
        asks += 1
        best = max(best, value)
    return RunStats(best >= target, asks, asks, cost_s + own_s)


def run_random(grid: Grid, ceiling: int, seed: int, target: float) -> RunStats:
    """Configs in a random order, each once."""
    order = list(grid.results)
    random.Random(seed).shuffle(order)
    cost_s = 0.0
    for runs, config in enumerate(order, start=1):
        result = grid.results[config]
        cost_s += result.wall_s
        if grid.fits(result, ceiling) and result.samples_per_s >= target:
            return RunStats(True, runs, runs, cost_s)
    return RunStats(False, len(order), len(order), cost_s)


# --- side by side, for real ----------------------------------------------------------------------


def side_by_side(
    model: ModelSpec, device: DeviceSpec, seq_len: int, ceiling: int, winner: TrialConfig, auto_find_start: int, rounds: int
) -> dict[str, list[TrialResult]]:
    """Interleaved rounds: autotune's winner, HF default TrainingArguments, auto_find_batch_size=True."""
    import psutil

    work = Path(tempfile.mkdtemp(prefix="bench-search-sbs-"))
    default = hf_default_config()
    contenders: dict[str, tuple[TrialConfig, dict[str, Any]]] = {
        "autotune winner": (winner, {}),
        "HF default TrainingArguments": (default, {}),
        f"HF auto_find_batch_size=True (from {auto_find_start})": (
            dataclasses.replace(default, micro_batch=auto_find_start), {"auto_find_batch_size": True}
        ),
    }
    results: dict[str, list[TrialResult]] = {name: [] for name in contenders}
    for round_index in range(rounds):
        for name, (config, base_args) in contenders.items():
            work_dir = work / f"r{round_index}-{len(results[name])}-{name.split()[0]}-{config.micro_batch}"
            if base_args:
                # allocations fail once the resident set could pass the ceiling: the OOM it retries on
                budget = ceiling - _child_start_rss_bytes()
            else:
                budget = child_address_space_budget(ceiling, psutil.virtual_memory().available)
            job = TrialJob(
                workload=Workload(
                    model=model,
                    device=device,
                    seq_len=seq_len,
                    ceiling_bytes=ceiling,
                    measure=BENCH_MEASURE,
                    base_args=base_args,
                    address_space_bytes=budget,
                    callbacks=("bench_search:TrainBatchSizeRecorder",),
                ),
                config=config,
                work_dir=str(work_dir),
            )
            result = run_isolated(job, timeout_s=900)
            batch_file = Path(work_dir, BATCH_FILE)
            if result.samples_per_s and batch_file.exists():
                # samples/s was computed from the batch asked for; auto_find may have trained a smaller one
                actual = int(batch_file.read_text())
                result.samples_per_s *= actual * config.grad_accum / config.global_batch
                result.memory_peaks["train_batch_size"] = actual
            results[name].append(result)
            print(
                f"  round {round_index + 1}/{rounds} {name:45s} {result.status:12s} {result.samples_per_s:7.1f} samples/s "
                f"batch {result.memory_peaks.get('train_batch_size', config.micro_batch)} peak {format_bytes(result.peak_memory_bytes)}",
                flush=True,
            )
    return results


def _child_start_rss_bytes() -> int:
    """Resident size of a trial child before it builds anything: what it may not grow its address
    space by. Not the whole CPU context prior: the library pages that adds are mapped in the child
    already and cost it no address space."""
    from autotune.estimate import CPU_CHILD_START_RSS_BYTES

    return CPU_CHILD_START_RSS_BYTES


# --- report --------------------------------------------------------------------------------------


def summarize(stats: list[RunStats]) -> dict[str, float]:
    runs = [s.runs for s in stats]
    walls = [s.wall_s for s in stats]
    return {
        "count": len(stats),
        "reached": sum(s.reached for s in stats),
        "runs_median": statistics.median(runs),
        "runs_mean": statistics.fmean(runs),
        "runs_max": max(runs),
        "wall_median_s": statistics.median(walls),
        "asks_median": statistics.median(s.asks for s in stats),
        "screened_mean": statistics.fmean(s.screened for s in stats),
        "reused_mean": statistics.fmean(s.reused for s in stats),
        "pruned_mean": statistics.fmean(s.pruned for s in stats),
        "came_back_mean": statistics.fmean(s.came_back for s in stats),
    }


def patience_table(grid: Grid, request: SearchRequest, target: float, seeds: int, budget: int, max_asks: int) -> str:
    """``autotune search --trials budget --patience K`` for several K, with and without the seed trials:
    the runs each made and whether its best reached the target when it stopped."""
    lines = [
        f"Patience: `--trials {budget} --patience K` on this grid, {seeds} seeds; runs = configs trained until the search "
        f"stopped (patience, budget or the end of the space); missed = seeds whose best was below the target then.",
        "",
        "| --patience | with seed trials: runs, median (max) | missed | without seed trials: runs, median (max) | missed |",
        "|---|---|---|---|---|",
    ]
    for patience in PATIENCE_VALUES:
        row = [str(patience) if patience else "off (today)"]
        for with_seeds in (True, False):
            stats = [
                run_autotune(grid, request, seed, target, max_asks, with_seeds=with_seeds, patience=patience, budget=budget)[0]
                for seed in range(seeds)
            ]
            runs = [s.runs for s in stats]
            row += [f"{statistics.median(runs):g} ({max(runs)})", f"{sum(not s.reached for s in stats)}/{seeds}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def markdown(
    grid: Grid, ceiling: int, best: tuple[TrialConfig, float], summaries: dict[str, dict[str, float]], seeds: int,
    sbs: dict[str, list[TrialResult]] | None, winner: TrialConfig, command: str, load: str,
) -> str:
    size = len(grid.results)
    feasible = sum(grid.fits(r, ceiling) for r in grid.results.values())
    grid_wall = sum(r.wall_s for r in grid.results.values())
    loads = [grid.loads[c] for c in grid.results if c in grid.loads]
    load_text = (
        f"1-minute load average at the end of each config, its own trial included: median {statistics.median(loads):.1f}, "
        f"max {max(loads):.1f}, on {os.cpu_count()} cores" if loads else "load not recorded"
    )
    lines = [
        f"Command: `{command}`",
        "",
        f"Grid: {grid.meta['model']}, seq len {grid.meta['seq_len']}, {size} configs ({feasible} fit under the "
        f"{format_bytes(ceiling)} ceiling of peak RSS), "
        + (
            f"modelled (modelled_grid, seed {grid.meta['modelled_seed']}: computed, not measured). "
            if "modelled_seed" in grid.meta
            else f"measured once each in {grid_wall / 60:.1f} min of trial wall time ({load_text}). "
        )
        + f"{sum(grid.fits(r, ceiling) and r.samples_per_s >= TARGET_FRACTION * best[1] for r in grid.results.values())} "
        f"config(s) reach the target. Oracle best: "
        f"{best[0].short()} at {best[1]:.1f} samples/s; target {TARGET_FRACTION:.0%} of it = {TARGET_FRACTION * best[1]:.1f}.",
        f"Strategies on the cached grid, {seeds} seeds each (random order: {RANDOM_ORDERS} orders); {load} during this run.",
        "",
        "| strategy | reached target | runs to target, median (mean, max) | % of grid | vs random (median runs) | wall to target, median | proposals (median) | screened / reused / pruned / came back per search (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rand = summaries[RANDOM]
    for name, s in summaries.items():
        lines.append(
            f"| {name} | {int(s['reached'])}/{int(s['count'])} | {s['runs_median']:g} ({s['runs_mean']:.1f}, {s['runs_max']:g}) | "
            f"{s['runs_median'] / size:.0%} | {rand['runs_median'] / max(s['runs_median'], 1):.1f}x fewer | "
            f"{s['wall_median_s'] / 60:.1f} min | {s['asks_median']:g} | "
            f"{s['screened_mean']:.1f} / {s['reused_mean']:.1f} / {s['pruned_mean']:.1f} / {s['came_back_mean']:.1f} |"
        )
    for name in (NEW, NEW_NO_SEEDS):
        auto = summaries[name]
        lines.append(
            f"\n{name}: {auto['runs_median'] / size:.0%} of the grid's runs (goal <= 15 %), "
            f"{rand['runs_median'] / max(auto['runs_median'], 1):.1f}x fewer than random (goal >= 2x), medians over seeds."
        )
    if sbs:
        lines += [
            "",
            f"Side by side, measured for real in one run, interleaved ({len(next(iter(sbs.values())))} rounds, fresh child "
            f"each, same ceiling {format_bytes(ceiling)}): autotune's winner is {winner.short()}.",
            "",
            "| contender | status | samples/s (median of rounds) | batch trained | peak RSS (max) | autotune's speedup over it |",
            "|---|---|---|---|---|---|",
        ]
        ours = statistics.median(r.samples_per_s for r in sbs["autotune winner"])
        for name, results in sbs.items():
            figure = statistics.median(r.samples_per_s for r in results)
            statuses = ",".join(sorted({r.status for r in results}))
            batches = ",".join(sorted({str(r.memory_peaks.get("train_batch_size", "?")) for r in results}))
            peak = max(r.peak_memory_bytes for r in results)
            speedup = f"{ours / figure:.2f}x" if figure > 0 and name != "autotune winner" else "-"
            lines.append(f"| {name} | {statuses} | {figure:.1f} | {batches} | {format_bytes(peak)} | {speedup} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-mini")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--space", default=str(DEFAULT_SPACE))
    parser.add_argument("--ceiling", default="1.25GiB", help="memory ceiling (peak RSS of the trial's process tree)")
    parser.add_argument("--grid", default=str(DEFAULT_GRID), help="the cached grid (measured if missing or incomplete)")
    parser.add_argument(
        "--modelled", type=int, default=None, metavar="SEED",
        help="replay on a computed landscape (modelled_grid, this seed) instead of a measured grid; no side by side",
    )
    parser.add_argument(
        "--seeds", type=int, default=20, help="search seeds per strategy (a median over 10 still moves by a few runs)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="side-by-side rounds (0: skip the side-by-side)")
    parser.add_argument("--prune-ratio", type=float, default=0.5)
    parser.add_argument("--max-asks", type=int, default=0, help="proposals per search at most (default 3 x grid size)")
    parser.add_argument("--markdown", default=None, help="also write the result tables to this file")
    parser.add_argument(
        "--landscapes", type=int, default=0, metavar="N",
        help="only compare new and old search with random order on N reshuffled landscapes of the grid's space",
    )
    parser.add_argument("--effect-sigma", type=float, default=0.05, help="knob effects of the reshuffled landscapes")
    parser.add_argument("--budget", type=int, default=20, help="--trials of the patience table (autotune search's default: 20)")
    parser.add_argument(
        "--remeasure-above-load", type=float, default=None,
        help="measure again the grid configs measured at a 1-minute load average above this (their own trial adds ~2)",
    )
    options = parser.parse_args()
    command = "python scripts/bench_search.py " + " ".join(sys.argv[1:])

    device = cpu_device()
    model = resolve_model(options.model)
    space = load_space(options.space, device)
    ceiling = parse_ceiling(options.ceiling, device.total_memory_bytes)
    grid_path = Path(options.grid)
    if options.modelled is not None:
        grid = modelled_grid(model, device, space, options.seq_len, options.modelled)
        options.rounds = 0
    else:
        if grid_path.exists():
            cached = Grid.load(grid_path)
            if cached.meta.get("model") != model.name or cached.meta.get("seq_len") != options.seq_len:
                raise SystemExit(f"{grid_path} holds a grid of another model or length; give another --grid")
        grid = measure_grid(grid_path, model, device, space, options.seq_len, ceiling, options.remeasure_above_load)
    best_config, best_samples_per_s = grid.best(ceiling)
    target = TARGET_FRACTION * best_samples_per_s
    max_asks = options.max_asks or 3 * len(grid.results)
    load = load_average()
    print(f"oracle best: {best_config.short()} at {best_samples_per_s:.1f} samples/s; target {target:.1f}; {load}", flush=True)

    request = bench_request(grid, model, device, space, ceiling, options.prune_ratio)
    if options.landscapes:
        text = landscapes_table(grid, request, options.landscapes, options.effect_sigma, options.seeds, max_asks)
        print(f"Command: `{command}`\n\n{text}")
        if options.markdown:
            Path(options.markdown).write_text(f"Command: `{command}`\n\n{text}")
        return
    autotune_stats, winners = [], []
    for seed in range(options.seeds):
        stats, winner = run_autotune(grid, request, seed, target, max_asks)
        autotune_stats.append(stats)
        winners.append(winner)
        print(f"  autotune seed {seed}: {stats}", flush=True)
    seeds = range(options.seeds)
    summaries = {
        NEW: summarize(autotune_stats),
        OLD: summarize([run_autotune(grid, request, seed, target, max_asks, old_sampler=True)[0] for seed in seeds]),
        NEW_NO_SEEDS: summarize([run_autotune(grid, request, seed, target, max_asks, with_seeds=False)[0] for seed in seeds]),
        OLD_NO_SEEDS: summarize(
            [run_autotune(grid, request, seed, target, max_asks, with_seeds=False, old_sampler=True)[0] for seed in seeds]
        ),
        "plain Optuna TPE": summarize([run_plain_tpe(grid, space, ceiling, seed, target, max_asks) for seed in seeds]),
        RANDOM: summarize([run_random(grid, ceiling, seed, target) for seed in range(RANDOM_ORDERS)]),
    }
    for name, summary in summaries.items():
        print(f"{name}: {summary}", flush=True)
    patience_text = patience_table(grid, request, target, options.seeds, options.budget, max_asks)
    print(patience_text, flush=True)

    # autotune's winner: what seed 0 had found when it stopped (the target reached, or its budget spent).
    winner = winners[0] or best_config
    sbs = None
    if options.rounds > 0:
        sbs = side_by_side(model, device, options.seq_len, ceiling, winner, max(space.choices["micro_batch"]), options.rounds)
    text = markdown(grid, ceiling, (best_config, best_samples_per_s), summaries, options.seeds, sbs, winner, command, load)
    text += "\n" + patience_text
    print(text)
    if options.markdown:
        Path(options.markdown).write_text(text)


if __name__ == "__main__":
    main()
