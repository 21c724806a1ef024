"""autotune's benchmarks: what the figures in docs/benchmarks.md were measured with.

Not part of the installed package. Each runs from the repository root as a module, which puts the
root on ``sys.path`` (for this process, its trial children and their ranks) without any script
touching it::

    python -m benchmarks.bench_search --help

Measured data they read or write back (the search landscapes' grids, their spaces) is in
``benchmarks/data/``. They import autotune as a user would: ``bench_search`` only its public names
(tests/test_bench_search.py checks it); the others also reach the runner's internals they measure.
"""
