"""The checks of command-line values: each raises one line naming the option.

The options' own ``check`` methods (``autotune.plan._options``) and the plan (``autotune.plan.plan``,
for values judged against what it loads) call these; no other module checks an option. Every check
runs before the first trial, so that a value that would make every trial fail (a zero timeout, no
measured step, a memory share too small for any config) costs neither a run nor the study's seed
trials. Each function is pure: it takes the values and raises :class:`~autotune.errors.AutotuneError`
with the option's name and how to fix it.

What every numeric option of every command accepts is written once, in :data:`ACCEPTED`, and checked
by one function, :func:`within`: a finite number (no NaN, no infinity: ``--trial-timeout inf`` would turn
hang protection off), from its lowest meaningful value up to its highest (or what bounds it instead).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from autotune.errors import AutotuneError
from autotune.spec.chat_corpus import LENGTH_SCALES, MAX_SAMPLES
from autotune.units import format_bytes

if TYPE_CHECKING:  # the devices module reads torch and NVML: imported where they are listed
    from autotune.spec.devices import DeviceSpec
    from autotune.spec.models import ModelSpec

# The highest TCP port number (RFC 793: ports are 16-bit); 0 asks the system for any free port.
MAX_PORT = 65535
# Optimizer steps a trial may be asked to warm up or measure, at most (--warmup-steps, --max-measure-steps).
# A trial takes global batch x (steps + 1) rows (trainers/sft.py, runner/_loader.py): an unbounded count is
# an allocation the argument caused, which a trial would record as an out-of-memory of its config (issue 38:
# --warmup-steps 99999999999 asked for 6.4 TB). Ten thousand steps outlast any trial's steady state by far:
# measuring stops after MeasureSettings.max_seconds (10 s) of measured steps, and past 10,000 steps each
# would take under a millisecond, which no training step does.
MAX_STEPS = 10_000
# Optimizer steps a trial may be asked to warm up or measure, at most (--warmup-steps, --max-measure-steps).
# A trial takes global batch x (steps + 1) rows (trainers/sft.py, runner/_loader.py): an unbounded count is
# an allocation the argument caused, which a trial would record as an out-of-memory of its config (issue 38:
# --warmup-steps 99999999999 asked for 6.4 TB). Ten thousand steps outlast any trial's steady state by far.
MAX_STEPS = 10_000


def one_of(*options: tuple[str, object]) -> None:
    """At most one of the (option, value) pairs is given (a value other than ``None``)."""
    given = [option for option, value in options if value is not None]
    if len(given) > 1:
        raise AutotuneError(f"give {' or '.join(given)}, not both")


def port(value: int) -> None:
    """``--port`` is a TCP port number, or 0 for any free port."""
    within("--port", value)


def dataset_options(dataset: str | None, text_column: str | None, packing: bool) -> None:
    """``--text-column`` and ``--packing`` shape the ``--dataset``: without one they would be ignored."""
    given = [name for name, used in (("--text-column", text_column is not None), ("--packing", packing)) if used]
    if dataset is None and given:
        raise AutotuneError(
            f"{' and '.join(given)}: only used with --dataset, which is not given: add --dataset or leave it out"
        )


def trainer_options(trainer: str | None, loss_on: str | None) -> None:
    """``--trainer`` and ``--loss-on`` name known values (``autotune.trainers``); ``--loss-on`` is
    SFTTrainer's (``autotune.spec.sft``)."""
    from autotune.spec.sft import LOSS_ON
    from autotune.trainers import get as trainer_named

    kind = trainer_named(trainer) if trainer is not None else None
    if loss_on is not None and loss_on not in LOSS_ON:
        raise AutotuneError(f"--loss-on {loss_on}: choose one of {', '.join(LOSS_ON)}")
    if loss_on is not None and kind is not None and not kind.chooses_loss:
        raise AutotuneError(
            f"--loss-on chooses SFTTrainer's loss; --trainer {trainer} trains with {kind.words}: drop --loss-on, "
            "or use --trainer sft"
        )


def seq_len_fits(seq_len: int, model_name: str, model: ModelSpec) -> None:
    """``--seq-len`` is accepted and within the model's position table (:func:`autotune.spec.positions.longest_sequence`)."""
    from autotune.spec.positions import longest_sequence  # after the checks made before the heavy imports

    within("--seq-len", seq_len)
    longest = longest_sequence(model)
    if longest and seq_len > longest:
        table = f"{longest} positions"
        if longest < model.max_positions:  # RoBERTa-like: the table's first rows come before the first token
            table += f": its table of {model.max_positions} starts after the padding index, {model.max_positions - longest - 1}"
        raise AutotuneError(f"--seq-len {seq_len} is longer than {model_name} allows ({table})")


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


# --- every numeric option: what it accepts, written once, checked by one function (issue 38, section 7) -----


@dataclasses.dataclass(frozen=True)
class Accepted:
    """The values a numeric option accepts: a finite number from ``low`` up to ``high``.

    Attributes:
        kind: What a value is, in words: ``a whole number``, ``a number of seconds``, ``a fraction``.
        low: The lowest value; ``low_open``: not ``low`` itself, only above it.
        high: The highest value; ``high_open``: not ``high`` itself, only below it. ``None``: no end of its
            own, and ``bounded_by`` says what bounds the value instead.
        low_words: What ``low`` means, said after it (``0 (never prune)``).
        bounded_by: Where ``high`` is ``None``: the later check that bounds the value, or why nothing need.
        words: The accepted values in words, where the ends alone do not say them (a port).
    """

    kind: str
    low: float
    high: float | None
    low_open: bool = False
    high_open: bool = False
    low_words: str = ""
    bounded_by: str = ""
    words: str = ""

    def holds(self, value: float) -> bool:
        """Whether ``value`` is accepted: finite (not NaN, not infinite) and within the ends."""
        if not math.isfinite(value) or (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """The accepted values in words: ``a whole number above 0, up to and including 1,000,000``."""
        if self.words:
            return self.words
        low = f"{_number(self.low)}{f' ({self.low_words})' if self.low_words else ''}"
        if self.high is None:
            return f"{self.kind} above {low}" if self.low_open else f"{self.kind}, {low} or more"
        start = f"above {low}" if self.low_open else f"from {low}"
        end = (
            f" up to, not including, {_number(self.high)}"
            if self.high_open
            else f", up to and including {_number(self.high)}"
        )
        return f"{self.kind} {start}{end}"


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


# A count of trials, runs or rows: a million trials of seconds each is weeks of device time; more is a typo.
MAX_COUNT = 1_000_000
# A trial's own time limits: a trial that runs past a day is hung, not slow.
DAY_SECONDS = 86_400.0
# Samples per optimizer step on one device: the largest batches trained (GPT-3: 1,536 sequences a step;
# Llama 3: 16M tokens, 2,048 sequences of 8,192) are far below it, and each trial step trains them all.
MAX_GLOBAL_BATCH = 65_536
_COUNT = Accepted("a whole number", 0, MAX_COUNT, low_open=True)
_TRIAL_SECONDS = Accepted("a number of seconds", 0, DAY_SECONDS, low_open=True)

# Every numeric option of every command, by the name the command line gives it
# (tests/plan/test_numeric_options.py checks that each command's numeric options are all here).
ACCEPTED: dict[str, Accepted] = {
    "--gpu": Accepted("a CUDA device number", 0, None, bounded_by="the GPUs here (autotune.spec.devices)"),
    # The longest context of a released model (Llama 4 Scout: 10M tokens) is below 2**24; the model's
    # own position table bounds it further (seq_len_fits).
    "--seq-len": Accepted("a whole number", 0, 2**24, low_open=True),
    "--workers": Accepted(
        "a whole number", 0, None, low_open=True, bounded_by="each worker's share of memory (worker_share)"
    ),
    "--devices-per-trial": Accepted(
        "a whole number", 0, None, low_open=True, bounded_by="the GPUs given, or the CPU's cores (cpu_ranks_fit)"
    ),
    "--global-batch": Accepted("a whole number", 0, MAX_GLOBAL_BATCH, low_open=True),
    "--max-global-batch": Accepted("a whole number", 0, MAX_GLOBAL_BATCH, low_open=True),
    "--warmup-steps": Accepted("a whole number", 0, MAX_STEPS),
    "--max-measure-steps": Accepted("a whole number", 0, MAX_STEPS, low_open=True),
    "--compile-timeout": _TRIAL_SECONDS,
    "--trial-timeout": _TRIAL_SECONDS,
    # The search's wall time: leave --timeout out for none; a month is the longest it means.
    "--timeout": Accepted("a number of seconds", 0, 30 * DAY_SECONDS, low_open=True),
    "--trials": _COUNT,
    "--max-total-trials": _COUNT,
    "--patience": _COUNT,
    "--prune-ratio": Accepted("a fraction", 0, 1, high_open=True, low_words="never prune"),
    "--confirm-top": Accepted("a whole number", 0, MAX_COUNT, low_words="skip"),
    # A confirmation compares re-runs: one re-run has no spread to compare (autotune.study._confirm).
    "--confirm-repeats": Accepted("a whole number", 2, MAX_COUNT),
    "--confirm-budget": Accepted("a fraction", 0, 1, low_open=True),
    "--top": _COUNT,
    # The user's whole run (autotune.result.run_length): Llama 2 and 3 pretrained for about one epoch and
    # fine-tunes run a few; ten thousand passes is a typo. A device-hour costs dollars (an H100 a few):
    # a million a device-hour is a typo too.
    "--epochs": Accepted("a number of epochs", 0, 10_000, low_open=True),
    "--price-per-hour": Accepted("a price per device-hour", 0, 1_000_000, low_open=True),
    # autotune verify: re-runs of the winner and of the default each; the slowdown allowed (1: any).
    "--repeats": _COUNT,
    "--tolerance": Accepted("a fraction", 0, 1, high_open=True, low_words="no regression allowed"),
    "--port": Accepted("a port", 0, MAX_PORT, words=f"a port from 1 to {MAX_PORT}, or 0 for any free port"),
    # Timed matmuls per dtype: the best of one second already shows the peak; an hour is the longest it means.
    "--seconds": Accepted("a number of seconds", 0, 3600, low_open=True),
    "--matrix-size": Accepted(
        "a whole number", 0, None, low_open=True, bounded_by="the device's memory (matrix_fits_memory)"
    ),
    # A generated corpus: about five times UltraChat 200k; the disk's free space is checked before writing.
    "--samples": Accepted("a whole number", 0, MAX_SAMPLES, low_open=True),
    # numpy.random.SeedSequence takes any whole number of 0 or more (numpy/random/bit_generator.pyx).
    "--seed": Accepted("a whole number", 0, None, bounded_by="nothing: numpy takes any size"),
    # Past either end every turn's median is at a bound of its own (chat_corpus.LENGTH_SCALES).
    "--length-scale": Accepted("a number", *LENGTH_SCALES),
}


def within(option: str, value: float | None) -> None:
    """``value`` (when given) is what ``option`` accepts (:data:`ACCEPTED`): finite and within its range.

    Raises:
        AutotuneError: One line naming the option, the value and the accepted range.
    """
    if value is not None and not ACCEPTED[option].holds(value):
        raise AutotuneError(f"{option} {value}: give {ACCEPTED[option].describe()}")


def run_options(epochs: float | None, price_per_hour: float | None) -> None:
    """``--epochs`` and ``--price-per-hour``, the whole run's options of ``best``, ``export`` and ``report``
    (``search`` and ``estimate`` check them with the plan's, :class:`autotune.plan.PlanOptions`)."""
    within("--epochs", epochs)
    within("--price-per-hour", price_per_hour)


def matrix_fits_memory(matrix_size: int, device_label: str, memory_bytes: int) -> None:
    """``--matrix-size`` n: the calibration's three n x n fp32 matrices (two operands, the product) fit
    the device's memory (``autotune.runner.calibrate_device``)."""
    needed = 3 * matrix_size**2 * 4
    if needed > memory_bytes:
        largest = math.isqrt(memory_bytes // 12)
        raise AutotuneError(
            f"--matrix-size {matrix_size}: three {matrix_size} x {matrix_size} fp32 matrices take {format_bytes(needed)}, "
            f"more than {device_label}'s {format_bytes(memory_bytes)}; give at most {largest:,} (or leave it out)"
        )


def calibration_targets(
    calibrate: bool, known: bool, device: str | None, seconds: float, matrix_size: int | None
) -> list[DeviceSpec]:
    """Every option of ``autotune devices`` checked before anything is measured; the devices ``--calibrate``
    measures (``--device``'s, else every one found), none without it.

    Raises:
        AutotuneError: One line naming the option and what it takes.
    """
    from autotune.spec.devices import list_devices, resolve_device

    if known and calibrate:
        raise AutotuneError(
            "--known lists GPUs from the datasheet table; --calibrate measures this machine's: give one"
        )
    within("--seconds", seconds)
    within("--matrix-size", matrix_size)
    if not calibrate:
        return []
    targets = [resolve_device(device, None)] if device is not None else list_devices()
    for spec in targets:
        if matrix_size is not None:
            matrix_fits_memory(matrix_size, spec.label, spec.total_memory_bytes)
    return targets


def cpu_ranks_fit(devices_per_trial: int, cores: int) -> None:
    """``--devices-per-trial`` on the CPU: one core at least for each rank (each gets ``cores // ranks``
    threads, ``runner._limits.ranks_environment``); more ranks than cores measure their contention."""
    if devices_per_trial > cores:
        raise AutotuneError(
            f"--devices-per-trial {devices_per_trial}: a CPU trial's ranks share this machine's {cores} cores; "
            f"give at most {cores}"
        )
