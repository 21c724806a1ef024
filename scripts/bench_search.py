"""Search efficiency: trials until 98 % of the best config, for autotune, plain Optuna TPE and random.

The benchmark is the package ``scripts/bench_search/`` (its docstring says what it measures and
how); this file keeps ``python scripts/bench_search.py ...`` its command.
"""

from bench_search.__main__ import main

if __name__ == "__main__":
    main()
