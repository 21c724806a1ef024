"""The user's whole run (issue 40, point 4): how long it is, its projected wall time, and what it costs.

The one home of that arithmetic: the search's summary, ``best``, the report and the export's header
project measured figures through it, ``estimate`` predicted ones.

* Its length (:func:`run_length`): ``max_steps`` from ``--base-args`` (the Trainer runs that many
  optimizer steps whatever the epochs, ``TrainingArguments.max_steps``), else the epochs: ``--epochs``,
  ``num_train_epochs`` from ``--base-args`` (the two must agree), else the arguments class's default
  (3.0, ``TrainingArguments.num_train_epochs``; TRL's ``SFTConfig`` keeps it).
* The samples an epoch trains (:func:`dataset_samples`): every usable row of ``--dataset`` (SFT rows as
  TRL reads them, before TRL's packing: a trial's samples/s counts the samples trained however packing
  puts them in rows, ``runner._trial``), or the blocks ``--packing`` cut the whole data into. Synthetic
  tokens have no size: a run of epochs needs ``--dataset`` or ``max_steps``.
* Its wall time: the samples trained (epochs x samples, or steps x samples per step) at the config's
  samples/s, plus the warm-up's excess over steady steps (the first steps' allocation and compilation,
  measured by the trial). Excluded, and said so: what runs before the first step (the model's load, the
  trainer's set-up and its data preparation), evaluation and checkpoints.
* Its cost: wall hours x the price per device-hour x the devices one run spans.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError

if TYPE_CHECKING:
    from autotune.result._trial_result import TrialResult
    from autotune.spec.dataset import PreparedDataset

# transformers' TrainingArguments.num_train_epochs default (training_args.py), which TRL's SFTConfig keeps.
DEFAULT_EPOCHS = 3.0
# What the views say in place of a projection where the study or the plan cannot make one.
NEEDS_DATASET = (
    "needs the dataset's size: give --dataset (synthetic tokens have no epochs), or search with a run of "
    "max_steps (--base-args '{\"max_steps\": N}')"
)
EXCLUDED = "excluded: the start-up before the first step (model load, trainer and data set-up)"


@dataclasses.dataclass(frozen=True)
class RunLength:
    """How long the user's run is: ``max_steps`` optimizer steps, else ``epochs`` over the data.

    Attributes:
        epochs: Passes over the data (``None`` where ``max_steps`` decides).
        max_steps: Optimizer steps (``None``: the epochs decide).
        source: Where the figure comes from, in words.
    """

    epochs: float | None
    max_steps: int | None
    source: str

    def words(self, samples: int | None) -> str:
        """``3 epochs over 12,345 samples`` or ``500 optimizer steps``."""
        if self.max_steps is not None:
            return f"{self.max_steps:,} optimizer step{'s' if self.max_steps != 1 else ''}"
        epochs = f"{self.epochs:g} epoch{'s' if self.epochs != 1 else ''}"
        return f"{epochs} over {samples:,} sample{'s' if samples != 1 else ''}" if samples is not None else epochs


def run_length(base_args: Mapping[str, Any], epochs: float | None) -> RunLength:
    """The run's length from the user's fixed arguments and ``--epochs``, the one rule of it.

    Raises:
        AutotuneError: ``--epochs`` contradicts ``max_steps`` or ``num_train_epochs`` in ``--base-args``.
    """
    max_steps = base_args.get("max_steps")
    fixed_epochs = base_args.get("num_train_epochs")
    if max_steps is not None and int(max_steps) > 0:  # the Trainer's rule: max_steps > 0 overrides the epochs
        if epochs is not None:
            raise AutotuneError(
                f"--epochs {epochs:g}: --base-args sets max_steps {max_steps}, which the Trainer runs instead of "
                "any number of epochs; leave one of them out"
            )
        return RunLength(None, int(max_steps), "max_steps in --base-args")
    if fixed_epochs is not None:
        if epochs is not None and float(fixed_epochs) != epochs:
            raise AutotuneError(
                f"--epochs {epochs:g} contradicts num_train_epochs {fixed_epochs} in --base-args; give one of them"
            )
        return RunLength(float(fixed_epochs), None, "num_train_epochs in --base-args")
    if epochs is not None:
        return RunLength(epochs, None, "--epochs")
    return RunLength(DEFAULT_EPOCHS, None, "the default num_train_epochs; --epochs sets it")


def passes_over_data(run: RunLength | None, global_batch: int, samples: int | None) -> float:
    """How many times the user's run goes over its data: its epochs, or under ``max_steps`` the samples its
    steps take over the dataset's (1 where neither is known)."""
    if run is None:
        return 1.0
    if run.max_steps is not None:
        return run.max_steps * global_batch / samples if samples else 1.0
    return float(run.epochs or 1.0)


def setup_pass_note(result: TrialResult) -> str | None:
    """What a trial's rates hold beyond its steps: the trainer's pass before training (``TrialResult.setup_pass_s``),
    counted over the user's run (``autotune.spec.measure.over_the_run``); ``None`` where none ran."""
    if not result.setup_pass_samples:
        return None
    return (
        f"rates count its {result.setup_pass_s:.1f} s pass before training over {result.setup_pass_samples} samples, "
        f"over a run of {result.run_passes:g} passes"
    )


def dataset_samples(dataset: PreparedDataset | None) -> int | None:
    """The samples one epoch of the user's run trains, ``None`` where unknown: synthetic tokens, or
    ``--packing`` over data longer than the trials read (``spec.dataset`` packs only what they take)."""
    if dataset is None or (dataset.packing and dataset.num_samples >= dataset.length):
        return None
    return dataset.num_samples


@dataclasses.dataclass(frozen=True)
class Pace:
    """How fast one config trains, measured by a trial or predicted by the throughput prior.

    Attributes:
        samples_per_s: Samples trained per second in steady steps.
        samples_per_step: Samples one optimizer step trains (the global batch; under TRL's packing, the
            samples its packed rows held, measured).
        warmup_excess_s: What the warm-up steps took beyond as many steady steps (0: not known).
        setup_s_per_sample: The trainer's pass over the data before the first step (DPO's precomputed
            reference), seconds a sample of the dataset, paid once per run (0: none).
    """

    samples_per_s: float
    samples_per_step: float
    warmup_excess_s: float = 0.0
    setup_s_per_sample: float = 0.0

    @classmethod
    def measured(cls, result: Any, samples_per_s: float, global_batch: int, packed_samples: bool) -> Pace:
        """A trial's pace (``result``, a :class:`TrialResult`) at ``samples_per_s`` (its recorded figure, a
        confirmation's median where there is one); ``packed_samples``: samples per step are the trial's
        measured mean (TRL's rows), else the global batch."""
        per_step = global_batch
        if packed_samples and result.measured_steps and result.measured_s > 0:
            per_step = result.samples_per_s * result.measured_s / result.measured_steps
        setup = result.setup_pass_s / result.setup_pass_samples if result.setup_pass_samples else 0.0
        if setup:  # the steps' own rate: the recorded one counts the pass over the run it was measured for
            samples_per_s = 1.0 / (1.0 / samples_per_s - setup / result.run_passes)
        steady = per_step / samples_per_s * result.warmup_steps
        return cls(samples_per_s, per_step, max(result.warmup_s - steady, 0.0), setup)


def projected_seconds(length: RunLength, samples: int | None, pace: Pace) -> float | None:
    """The run's wall time at ``pace`` from its first step, ``None`` where its samples are unknown."""
    if length.max_steps is not None:
        trained = length.max_steps * pace.samples_per_step
    elif samples is None or length.epochs is None:
        return None
    else:
        trained = samples * length.epochs
    setup = pace.setup_s_per_sample * (samples if samples is not None else trained)  # once, over the data
    return trained / pace.samples_per_s + pace.warmup_excess_s + setup


def duration(seconds: float) -> str:
    """``2 h 10 min``, ``3 min 20 s``, ``45 s``, ``3 d 4 h``: a wall time for people."""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.3g} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours // 24} d {hours % 24} h"


def cost(seconds: float, price_per_hour: float, devices: int) -> float:
    """What ``seconds`` of the run cost at ``price_per_hour`` per device, on ``devices`` devices."""
    return seconds / 3600 * price_per_hour * devices


def money(dollars: float) -> str:
    """``$1,234.50``; below a dollar three significant figures (``$0.0142``, ``$0.284``), so that two small costs side
    by side keep their ratio (``$0.01`` beside ``$0.0083`` hid a 42 % saving)."""
    return f"${dollars:,.2f}" if dollars >= 1 or dollars == 0 else f"${dollars:.3g}"


def run_time_line(
    length: RunLength,
    samples: int | None,
    winner: tuple[str, Pace],
    default: tuple[str, Pace] | None,
    price_per_hour: float | None,
    devices: int,
    predicted: bool = False,
) -> str:
    """The one line every view prints: the winner's projected wall time, the default's and the time saved,
    and with a price their costs. ``winner`` and ``default`` are (their words, their pace)."""
    head = f"{'predicted' if predicted else 'projected'} wall time of {length.words(samples)} ({length.source})"
    winner_s = projected_seconds(length, samples, winner[1])
    if winner_s is None:
        return f"{head}: {NEEDS_DATASET}"
    rate = "predicted" if predicted else "measured"
    text = f"{head}: {duration(winner_s)} ({winner[0]}, {rate} {winner[1].samples_per_s:.3g} samples/s)"
    default_s = projected_seconds(length, samples, default[1]) if default is not None else None
    if default is not None and default_s is not None:
        text += f" vs {duration(default_s)} ({default[0]}, {default[1].samples_per_s:.3g} samples/s)"
        if length.max_steps is not None and not math.isclose(winner[1].samples_per_step, default[1].samples_per_step):
            # max_steps of two global batches train on different amounts of data: no time is saved or lost by it.
            text += (
                f": not the same run, {length.max_steps:,} steps train {length.max_steps * winner[1].samples_per_step:,.0f}"
                f" samples in the first and {length.max_steps * default[1].samples_per_step:,.0f} in the second (fix"
                " the global batch, --global-batch, to compare like for like)"
            )
        else:
            saved = default_s - winner_s
            text += f": {duration(abs(saved))} {'saved' if saved >= 0 else 'longer'}"
    if price_per_hour is not None:
        plural = "s" if devices != 1 else ""
        text += f"; cost {money(cost(winner_s, price_per_hour, devices))}"
        if default_s is not None:
            text += f" vs {money(cost(default_s, price_per_hour, devices))}"
        text += f" at ${price_per_hour:g}/h per device x {devices} device{plural}"
    return f"{text}; {EXCLUDED}"
