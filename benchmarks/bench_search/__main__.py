"""``python -m benchmarks.bench_search ...``: the command line of the search benchmark (see the package doc)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna

from autotune.space import load_space
from autotune.spec.ceiling import parse_ceiling
from autotune.spec.devices import cpu_device
from autotune.spec.models import resolve_model
from benchmarks._common import load_average
from benchmarks.bench_search.grid import Grid, measure_grid, modelled_grid, replay_device
from benchmarks.bench_search.report import (
    NEW,
    NEW_NO_SEEDS,
    OLD,
    OLD_NO_SEEDS,
    RANDOM,
    landscapes_table,
    markdown,
    patience_table,
    summarize,
)
from benchmarks.bench_search.side_by_side import side_by_side
from benchmarks.bench_search.strategies import (
    RANDOM_ORDERS,
    TARGET_FRACTION,
    bench_request,
    run_autotune,
    run_plain_tpe,
    run_random,
)

DATA = Path(__file__).resolve().parent.parent / "data"
DEFAULT_SPACE = DATA / "bench_search_space.yaml"
DEFAULT_GRID = DATA / "bench_grid_cpu.json"


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=sys.modules["benchmarks.bench_search"].__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-mini")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--space", default=str(DEFAULT_SPACE))
    parser.add_argument("--ceiling", default="1.25GiB", help="memory ceiling (peak RSS of the trial's process tree)")
    parser.add_argument("--grid", default=str(DEFAULT_GRID), help="the cached grid (measured if missing or incomplete)")
    parser.add_argument(
        "--modelled",
        type=int,
        default=None,
        metavar="SEED",
        help="replay on a computed landscape (modelled_grid, this seed) instead of a measured grid; no side by side",
    )
    parser.add_argument(
        "--seeds", type=int, default=20, help="search seeds per strategy (a median over 10 still moves by a few runs)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="side-by-side rounds (0: skip the side-by-side)")
    parser.add_argument("--prune-ratio", type=float, default=0.5)
    parser.add_argument(
        "--first-step-cvs",
        type=float,
        default=0.0,
        help="early stop's replay: each config's first measured step is its median slowed by this many step-time CVs",
    )
    parser.add_argument("--max-asks", type=int, default=0, help="proposals per search at most (default 3 x grid size)")
    parser.add_argument("--markdown", default=None, help="also write the result tables to this file")
    parser.add_argument(
        "--landscapes",
        type=int,
        default=0,
        metavar="N",
        help="only compare new and old search with random order on N reshuffled landscapes of the grid's space",
    )
    parser.add_argument("--effect-sigma", type=float, default=0.05, help="knob effects of the reshuffled landscapes")
    parser.add_argument(
        "--budget", type=int, default=20, help="--trials of the patience table (autotune search's default: 20)"
    )
    parser.add_argument(
        "--remeasure-above-load",
        type=float,
        default=None,
        help="measure again the grid configs measured at a 1-minute load average above this (their own trial adds ~2)",
    )
    options = parser.parse_args()
    command = "python -m benchmarks.bench_search " + " ".join(sys.argv[1:])

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
    grid.first_step_cvs = options.first_step_cvs
    replay, how = replay_device(device, grid)
    print(
        f"replay device: {replay.label} ({replay.name}), bf16 {'has' if replay.has_matmul_hardware('bf16') else 'lacks'} hardware: {how}"
    )
    best_config, best_samples_per_s = grid.best(ceiling)
    target = TARGET_FRACTION * best_samples_per_s
    max_asks = options.max_asks or 3 * len(grid.results)
    load = load_average()
    print(
        f"oracle best: {best_config.short()} at {best_samples_per_s:.1f} samples/s; target {target:.1f}; {load}",
        flush=True,
    )

    request = bench_request(grid, model, replay, space, ceiling, options.prune_ratio)
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
        NEW_NO_SEEDS: summarize(
            [run_autotune(grid, request, seed, target, max_asks, with_seeds=False)[0] for seed in seeds]
        ),
        OLD_NO_SEEDS: summarize(
            [
                run_autotune(grid, request, seed, target, max_asks, with_seeds=False, old_sampler=True)[0]
                for seed in seeds
            ]
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
        sbs = side_by_side(
            model, device, options.seq_len, ceiling, winner, max(space.choices["micro_batch"]), options.rounds
        )
    text = markdown(
        grid, ceiling, (best_config, best_samples_per_s), summaries, options.seeds, sbs, winner, command, load
    )
    text += "\n" + patience_text
    print(text)
    if options.markdown:
        Path(options.markdown).write_text(text)


if __name__ == "__main__":
    main()
