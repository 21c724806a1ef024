"""What a search or an estimate will do, decided before anything runs: one plan.

``_options``: the commands' options and their defaults (:class:`PlanOptions`, shared; :class:`SearchOptions`,
:class:`EstimateOptions`), each class checking its own options; ``_checks``: the checks themselves, each
naming its option; ``_base_args``: ``--base-args`` read and checked once; ``_plan``: :func:`plan`, the one
call that turns options into a :class:`Plan` (the workload with its memory prior, and the space), which
``autotune search``, ``autotune estimate`` and the benchmarks make. Light: the command line declares its
options from here without importing the layers a plan calls. ``cli_options``: each option's Typer declaration
(its type and help text), imported by name (``from autotune.plan import cli_options``), not through this
face, so only the command line imports Typer.
"""

from __future__ import annotations

from autotune.plan._base_args import load_base_args
from autotune.plan._checks import ACCEPTED, calibration_targets, matrix_fits_memory, port, run_options, within
from autotune.plan._options import EstimateOptions, PlanOptions, SearchOptions, VerifyOptions
from autotune.plan._plan import Plan, plan

__all__ = [
    "ACCEPTED",
    "EstimateOptions",
    "Plan",
    "PlanOptions",
    "SearchOptions",
    "VerifyOptions",
    "calibration_targets",
    "load_base_args",
    "matrix_fits_memory",
    "plan",
    "port",
    "run_options",
    "within",
]
