"""What a search will do, decided before any trial: the ``search`` command's options and their defaults
(``_options``: :class:`SearchOptions`, light enough for the CLI to declare its options from it) and the
checks of command-line values (``_checks``: each names its option), ``--base-args`` read and checked once
(``_base_args``).
"""

from __future__ import annotations

from autotune.plan._base_args import arguments_class, load_base_args
from autotune.plan._checks import (
    port,
    positive_int,
    positive_seconds,
    seq_len_fits,
    worker_share,
)
from autotune.plan._options import (
    SearchOptions,
)

__all__ = [
    "SearchOptions",
    "arguments_class",
    "load_base_args",
    "port",
    "positive_int",
    "positive_seconds",
    "seq_len_fits",
    "worker_share",
]
