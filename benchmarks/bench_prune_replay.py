"""Early stop and the budget, replayed on the three measured grids: one source tree's search against another's.

``python -m benchmarks.bench_prune_replay --tree DIR`` runs the search of the autotune source tree at
DIR (this one by default: give a second worktree at another commit to compare) on each grid of
docs/benchmarks.md, "Search efficiency", over 20 seeds, with the grid lookup as its trial runner
(``benchmarks/bench_search``: nothing trains), and prints per grid:

* to the target: runs and wall time until the best reaches 98 % of the oracle (with and without
  the seed trials), as the search benchmark's table counts them;
* a whole ``--trials 20`` search: its wall time (the grid's wall time of every run, cut where
  early stop stopped it, plus the search's own time), the pruned trials and what they cost, and the
  winner it ends with (how many seeds end on each config, and the worst seed's best against the
  oracle).

Both trees read the same grid files. The branch's early stop judges from the first measured step;
its replay needs step times the grids do not keep (medians and CVs only): ``--first-step-cvs K``
models each config's first measured step as its median slowed by K step-time CVs.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import statistics
import sys
from pathlib import Path

GRIDS = (  # (grid, model, space, ceiling): the commands of docs/benchmarks.md
    ("benchmarks/data/bench_grid_cpu.json", "bert-mini", "benchmarks/data/bench_search_space.yaml", "1.25GiB"),
    ("benchmarks/data/bench_grid_gpt2_cpu.json", "gpt2-tiny", "benchmarks/data/bench_search_space_gpt2.yaml", "1.6GiB"),
    (
        "benchmarks/data/bench_grid_llama_cpu.json",
        "llama-tiny",
        "benchmarks/data/bench_search_space_llama.yaml",
        "980MiB",
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument(
        "--grids", default=str(Path(__file__).resolve().parent.parent), help="where benchmarks/data/ is read"
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=20)
    parser.add_argument("--first-step-cvs", type=float, default=0.0)
    options = parser.parse_args()
    tree = Path(options.tree).resolve()
    sys.path[:0] = [str(tree)]
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from autotune.space import load_space
    from autotune.spec.ceiling import parse_ceiling
    from autotune.spec.devices import cpu_device
    from autotune.spec.models import resolve_model

    grid_module = importlib.import_module("benchmarks.bench_search.grid")
    strategies = importlib.import_module("benchmarks.bench_search.strategies")
    print(f"tree {tree} (autotune from {sys.modules['autotune'].__file__})")
    root = Path(options.grids).resolve()
    for grid_file, model_name, space_file, ceiling_text in GRIDS:
        device = cpu_device()
        model = resolve_model(model_name)
        space = load_space(str(root / space_file), device)
        ceiling = parse_ceiling(ceiling_text, device.total_memory_bytes)
        grid = grid_module.Grid.load(root / grid_file)
        if hasattr(grid_module, "replay_device"):  # the trees that plan by the grid machine's bf16 hardware
            grid.first_step_cvs = options.first_step_cvs
            device, how = grid_module.replay_device(device, grid)
            print(f"  replay device: {how}")
        best_config, best = grid.best(ceiling)
        target = strategies.TARGET_FRACTION * best
        request = strategies.bench_request(grid, model, device, space, ceiling, 0.5)
        max_asks = 3 * len(grid.results)
        print(f"{grid_file}: oracle {best_config.short()} at {best:.2f} samples/s")
        for with_seeds in (True, False):
            to_target = [
                strategies.run_autotune(grid, request, s, target, max_asks, with_seeds=with_seeds)[0]
                for s in range(options.seeds)
            ]
            whole = [
                strategies.run_autotune(
                    grid, request, s, target, max_asks, with_seeds=with_seeds, budget=options.budget
                )
                for s in range(options.seeds)
            ]
            runs = [t.runs for t in to_target]
            winners = collections.Counter(w.short() if w else "none" for _, w in whole)
            found = [grid.results[w].samples_per_s / best if w else 0.0 for _, w in whole]
            print(
                f"  {'with' if with_seeds else 'without'} seed trials: to target {sum(t.reached for t in to_target)}/"
                f"{len(to_target)} reached, runs median {statistics.median(runs):g} (mean {statistics.fmean(runs):.1f}, "
                f"max {max(runs)}), wall median {statistics.median(t.wall_s for t in to_target) / 60:.2f} min; "
                f"--trials {options.budget}: wall median {statistics.median(s.wall_s for s, _ in whole) / 60:.2f} min "
                f"(sum over seeds {sum(s.wall_s for s, _ in whole) / 60:.1f} min), runs median "
                f"{statistics.median(s.runs for s, _ in whole):g}, pruned mean {statistics.fmean(s.pruned for s, _ in whole):.1f}, "
                f"best found: median {statistics.median(found):.1%}, worst {min(found):.1%} of the oracle; winners {dict(winners.most_common(3))}",
                flush=True,
            )


if __name__ == "__main__":
    main()
