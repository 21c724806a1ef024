"""Search efficiency: trials until 98 % of the best config, for autotune, plain Optuna TPE and random.

1. **Grid (the oracle).** Every config of the space is measured once, for real, through autotune's
   runner (a fresh child per config, short measurement settings), and cached to a JSON file. An
   interrupted grid resumes where it stopped. The oracle's best is the fastest config whose
   measured peak fits under the benchmark ceiling.
2. **Samplers on the grid.** Each strategy then searches the same space, with a lookup in the grid
   instead of training, over several seeds:

   * ``autotune``: the shipped search (``autotune.study.search``, the call ``autotune search``
     makes: its seed trials, Thompson sampling proposals, screening by the calibrated estimator and
     by measured OOMs, early stop, budget and patience) with the grid lookup as its trial runner.
     Early stop is replayed as the runner does it: a config measured below ``prune ratio x best``
     stops after ``prune_after_steps`` measured steps; its cost is cut to what had run.
     ``autotune before`` is the same search with the sampler it had before (Optuna's TPE, repeats
     of measured configs answered from the record); both are also run without their seed trials.
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

Modules: ``grid`` (measure, model or reshuffle a grid; the fit rule is ``autotune.spec.ceiling.fits``),
``strategies`` (the searches replayed on it), ``side_by_side`` (its trial children's callback:
``batch_recorder``), ``report`` (the tables), ``__main__``
(the options): ``python -m benchmarks.bench_search`` runs it, from the repository root. Only public names of ``autotune`` are
imported (``tests/test_bench_search.py`` checks it), so the benchmark measures the search that ships.

Commands (docs/benchmarks.md holds the results)::

    # reduced grid while building (16 configs):
    python -m benchmarks.bench_search --grid /tmp/grid_small.json --space /tmp/small.yaml --seeds 5 --rounds 1
    # landscape 1, the measured bert-mini grid (about 20-30 minutes with the side by side; the grid is cached):
    python -m benchmarks.bench_search --grid benchmarks/data/bench_grid_cpu.json --rounds 3 --markdown /tmp/bench_search.md
    # landscape 2, the measured gpt2-tiny grid (25 minutes to measure on a quiet machine, then cached):
    python -m benchmarks.bench_search --model gpt2-tiny --space benchmarks/data/bench_search_space_gpt2.yaml --grid benchmarks/data/bench_grid_gpt2_cpu.json --ceiling 1.6GiB --rounds 0
    # reshuffled landscapes of a grid's space and memory:
    python -m benchmarks.bench_search --model gpt2-tiny --space benchmarks/data/bench_search_space_gpt2.yaml --grid benchmarks/data/bench_grid_gpt2_cpu.json --ceiling 1.6GiB --landscapes 12
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
