"""The checks of command-line values: each raises one line naming the option.

The options' own ``check`` methods (``autotune.plan._options``) and the plan (``autotune.plan.plan``,
for values judged against what it loads) call these; no other module checks an option. Every check
runs before the first trial, so that a value that would make every trial fail (a zero timeout, no
measured step, a memory share too small for any config) costs neither a run nor the study's seed
trials. Each function is pure: it takes the values and raises :class:`~autotune.errors.AutotuneError`
with the option's name and how to fix it.
"""

from __future__ import annotations

from autotune.errors import AutotuneError
from autotune.units import format_bytes

# The highest TCP port number (RFC 793: ports are 16-bit); 0 asks the system for any free port.
MAX_PORT = 65535
# Optimizer steps a trial may be asked to warm up or measure, at most (--warmup-steps, --max-measure-steps).
# A trial takes global batch x (steps + 1) rows (runner/_sft.py, runner/_loader.py): an unbounded count is
# an allocation the argument caused, which a trial would record as an out-of-memory of its config (issue 38:
# --warmup-steps 99999999999 asked for 6.4 TB). Ten thousand steps outlast any trial's steady state by far.
MAX_STEPS = 10_000


def positive_int(option: str, value: int | None) -> None:
    """``value`` (when given) is a whole number above zero."""
    if value is not None and value <= 0:
        raise AutotuneError(f"{option} {value}: give a whole number above 0")


def positive_seconds(option: str, value: float | None) -> None:
    """``value`` (when given) is a number of seconds above zero."""
    if value is not None and not value > 0:  # `not >` also refuses NaN
        raise AutotuneError(f"{option} {value}: give a number of seconds above 0")


def step_count(option: str, value: int) -> None:
    """``value`` is a number of optimizer steps a trial can take: at most :data:`MAX_STEPS`."""
    if value > MAX_STEPS:
        raise AutotuneError(
            f"{option} {value}: at most {MAX_STEPS:,} steps (a trial measures its steady state in tens of steps)"
        )


def non_negative_int(option: str, value: int) -> None:
    """``value`` is zero or more."""
    if value < 0:
        raise AutotuneError(f"{option} {value}: give 0 or more")


def fraction_below_one(option: str, value: float, zero_words: str) -> None:
    """``value`` is a fraction from 0 up to, not including, 1 (``zero_words``: what 0 means)."""
    if not 0 <= value < 1:
        raise AutotuneError(f"{option} {value}: give a fraction from {zero_words} up to, not including, 1")


def fraction_up_to_one(option: str, value: float) -> None:
    """``value`` is a fraction above 0, up to and including 1."""
    if not 0 < value <= 1:  # `not` also refuses NaN
        raise AutotuneError(f"{option} {value}: give a fraction above 0, up to and including 1")


def one_of(*options: tuple[str, object]) -> None:
    """At most one of the (option, value) pairs is given (a value other than ``None``)."""
    given = [option for option, value in options if value is not None]
    if len(given) > 1:
        raise AutotuneError(f"give {' or '.join(given)}, not both")


def port(value: int) -> None:
    """``--port`` is a TCP port number, or 0 for any free port."""
    if not 0 <= value <= MAX_PORT:
        raise AutotuneError(f"--port {value}: give a port from 1 to {MAX_PORT}, or 0 for any free port")


def dataset_options(dataset: str | None, text_column: str | None, packing: bool) -> None:
    """``--text-column`` and ``--packing`` shape the ``--dataset``: without one they would be ignored."""
    given = [name for name, used in (("--text-column", text_column is not None), ("--packing", packing)) if used]
    if dataset is None and given:
        raise AutotuneError(
            f"{' and '.join(given)}: only used with --dataset, which is not given: add --dataset or leave it out"
        )


def trainer_options(trainer: str | None, loss_on: str | None) -> None:
    """``--trainer`` and ``--loss-on`` name known values; ``--loss-on`` is SFTTrainer's (``autotune.spec.sft``)."""
    from autotune.spec.sft import LOSS_ON, TRAINERS

    if trainer is not None and trainer not in TRAINERS:
        raise AutotuneError(f"--trainer {trainer}: choose one of {', '.join(TRAINERS)}")
    if loss_on is not None and loss_on not in LOSS_ON:
        raise AutotuneError(f"--loss-on {loss_on}: choose one of {', '.join(LOSS_ON)}")
    if loss_on is not None and trainer == "trainer":
        raise AutotuneError("--loss-on chooses SFTTrainer's loss: use it with --trainer sft (or leave --trainer out)")


def seq_len_fits(seq_len: int, model_name: str, max_positions: int) -> None:
    """``--seq-len`` is positive and within the model's position table (``max_positions``; 0: unbounded)."""
    positive_int("--seq-len", seq_len)
    if max_positions and seq_len > max_positions:
        raise AutotuneError(f"--seq-len {seq_len} is longer than {model_name} allows ({max_positions} positions)")


def worker_share(workers: int, child_budget_bytes: int, smallest_peak_bytes: int) -> None:
    """Each of ``workers`` CPU trials gets an address-space budget; the smallest config must fit in it.

    With too many workers the budget (the available memory split ``workers`` ways, see
    ``devices.child_address_space_budget``) is below what any config needs: every trial would fail
    with an out-of-memory that belongs to the split, not to the config, and the study would learn it
    as a property of the config (screening larger ones out).

    Args:
        workers: ``--workers``.
        child_budget_bytes: The address-space budget each child gets.
        smallest_peak_bytes: The memory estimate of the space's smallest config (the prior estimator).
    """
    if workers > 1 and child_budget_bytes < smallest_peak_bytes:
        raise AutotuneError(
            f"--workers {workers}: each trial would get {format_bytes(child_budget_bytes)} of memory, less than the "
            f"{format_bytes(smallest_peak_bytes)} the smallest config is estimated to need; use fewer workers"
        )
