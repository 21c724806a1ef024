"""The benchmark's tables: strategies side by side, patience, reshuffled landscapes (Markdown)."""

from __future__ import annotations

import os
import statistics

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.study import SearchRequest
from autotune.units import format_bytes
from benchmarks.bench_search.grid import Grid, fits_under, reshuffled_grid
from benchmarks.bench_search.strategies import RANDOM_ORDERS, TARGET_FRACTION, RunStats, run_autotune, run_random

# Row names of the strategies table.
NEW = "autotune (Thompson sampling over the landscape model, autotune.study._proposals)"
OLD = "autotune before (Optuna's TPE, repeats answered from the record)"
NEW_NO_SEEDS = "autotune without its seed trials"
OLD_NO_SEEDS = "autotune before, without its seed trials"
RANDOM = "random (no repeats)"
PATIENCE_VALUES = (None, 4, 6, 8, 10)


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
        f"stopped (patience, budget or the end of the space); missed = seeds whose best was below the target then; "
        f"worst = the lowest of the seeds' best configs then, % of the grid's best (issue 40: no lower than before).",
        "",
        "| --patience | with seed trials: runs, median (max) | missed | worst | without seed trials: runs, median (max) | missed | worst |",
        "|---|---|---|---|---|---|---|",
    ]
    grid_best = grid.best(request.ceiling_bytes)[1]
    for patience in PATIENCE_VALUES:
        row = [str(patience) if patience else "off (today)"]
        for with_seeds in (True, False):
            outcomes = [
                run_autotune(
                    grid, request, seed, target, max_asks, with_seeds=with_seeds, patience=patience, budget=budget
                )
                for seed in range(seeds)
            ]
            stats = [outcome[0] for outcome in outcomes]
            bests = [grid.results[winner].samples_per_s if winner else 0.0 for _, winner in outcomes]
            runs = [s.runs for s in stats]
            row += [
                f"{statistics.median(runs):g} ({max(runs)})",
                f"{sum(not s.reached for s in stats)}/{seeds}",
                f"{min(bests) / grid_best:.1%}",
            ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def markdown(
    grid: Grid,
    ceiling: int,
    best: tuple[TrialConfig, float],
    summaries: dict[str, dict[str, float]],
    seeds: int,
    sbs: dict[str, list[TrialResult]] | None,
    winner: TrialConfig,
    command: str,
    load: str,
) -> str:
    size = len(grid.results)
    feasible = sum(fits_under(r, ceiling) for r in grid.results.values())
    grid_wall = sum(r.wall_s for r in grid.results.values())
    loads = [grid.loads[c] for c in grid.results if c in grid.loads]
    load_text = (
        f"1-minute load average at the end of each config, its own trial included: median {statistics.median(loads):.1f}, "
        f"max {max(loads):.1f}, on {os.cpu_count()} cores"
        if loads
        else "load not recorded"
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
        + f"{sum(fits_under(r, ceiling) and r.samples_per_s >= TARGET_FRACTION * best[1] for r in grid.results.values())} "
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


def landscapes_table(
    base: Grid, request: SearchRequest, count: int, effect_sigma: float, seeds: int, max_asks: int
) -> str:
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
            return statistics.median(s.runs if s.reached else len(grid.results) for s in stats)  # noqa: B023 - called in this iteration

        new = median_runs([run_autotune(grid, request, s, target, max_asks, with_seeds=False)[0] for s in range(seeds)])
        old = median_runs(
            [
                run_autotune(grid, request, s, target, max_asks, with_seeds=False, old_sampler=True)[0]
                for s in range(seeds)
            ]
        )
        rand = median_runs([run_random(grid, ceiling, s, target) for s in range(RANDOM_ORDERS)])
        reaching = sum(fits_under(r, ceiling) and r.samples_per_s >= target for r in grid.results.values())
        lines.append(f"| {index} | {reaching} | {new:g} | {old:g} | {rand:g} | {rand / max(new, 1):.1f}x fewer |")
    return "\n".join(lines) + "\n"
