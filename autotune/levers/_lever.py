"""What a lever is: one setting of a training configuration, and everything autotune knows about it.

Every other part of autotune reads a lever through this record and its hooks, and never names a lever
itself: the search-space YAML (``autotune.space``), the mapping to ``TrainingArguments`` and the model
build (``autotune.levers._trial_config``), the trial child's batches and trainer (``autotune.runner``),
the device / model / data filters, the seeds, the labels of tables and the report, the memory
estimate (``autotune.estimate``, through :class:`~autotune.levers._hooks.MemoryTraits`) and the
throughput prior (through those and :class:`~autotune.levers._hooks.SpeedTraits`).
``tests/levers/test_lever_home.py`` fails when a lever is known to one part and not another, and when
a module outside ``autotune/levers/`` reads a lever by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import Mapper
from autotune.levers._hooks import Batching, MemoryTraits, SpaceMemory, SpeedTraits, TrainerParts

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec
    from autotune.spec.models import ModelSpec

# Where a lever acts: the Trainer's arguments, the model build, the batches (the data collator), or
# the trainer itself (its class, its constructor's arguments).
ACTS_ON = ("training_args", "model", "collator", "trainer")
# The parts of autotune.estimate.MemoryEstimate a lever may change.
MEMORY_PARTS = ("weights", "gradients", "optimizer states", "activations", "logits", "allocator", "context")


def _no_arguments(_value: Any) -> dict[str, Any]:
    return {}


def _nothing(_value: Any) -> None:
    return None


def _runs_everywhere(_value: Any, _device: DeviceSpec) -> str:
    return ""


def _under_every_trainer(_value: Any, _trainer: str) -> str:
    return ""


def _no_preference(_device: DeviceSpec, _choices: Sequence[Any]) -> tuple[Any, ...]:
    return ()


@dataclasses.dataclass(frozen=True)
class Lever:
    """One lever: its name, its choices, where it runs, what it maps to, what memory it moves.

    Attributes:
        name: The lever's name: the ``TrialConfig`` field, the search-space YAML key, the Optuna param.
        value_type: ``int``, ``bool`` or ``str``; the YAML's choices must have exactly this type.
        default: The value of a config whose space does not search the lever (the HF default's).
        doc: One line for users (search_spaces/README.md says more).
        choices: The values a space may name; ``None``: any value :attr:`least` allows.
        refused: Values a space may not name, each with the reason it is never searched (a value that
            would train something else than the user's run, such as samples attending across their
            boundary).
        least: For integer levers, the smallest value allowed.
        auto_choices: Where set, a space may write ``auto`` for the lever: the choices for a device
            (those :attr:`slow_on` names are then left out).
        absent_means_auto: With :attr:`auto_choices`: a space that does not name the lever means
            ``auto`` (``True``), or the default alone (``False``).
        in_every_space: ``True``: a space that does not name the lever fixes it at ``default``;
            ``False``: the lever is left out of such a space (the trial keeps the model's or the
            Trainer's own behaviour: attention implementation, Liger, ...).
        acts_on: One of :data:`ACTS_ON`.
        fields: The ``TrainingArguments`` fields :attr:`to_training_args` writes; a ``--base-args``
            file that sets one of them fixes the lever.
        to_training_args: The lever's value -> the ``TrainingArguments`` keyword arguments it sets.
        from_training_args: The inverse: ``--base-args`` -> the value that reproduces them (called
            only when one of :attr:`fields` is present).
        to_model_build: The value -> keyword arguments of the model's ``from_config`` (the trial
            child's ``autotune.spec.models.build_model``): ``attn_implementation``, ``dtype``.
        to_batching: The value -> how the trial's samples become micro-batches
            (:class:`~autotune.levers._hooks.Batching`); ``None``: the lever does not shape them.
        to_trainer: The value -> the trainer and its arguments' classes and the trainer's keyword
            arguments (:class:`~autotune.levers._hooks.TrainerParts`); ``None``: the lever does not
            change them.
        export_note: For a lever that acts outside ``TrainingArguments`` (the model build, the data
            collator, the trainer): what the user's training script must do to get the value the export
            names; ``""`` at the default.
        label: The value's words in tables and logs; ``""`` where it goes without saying.
        unavailable_on: Why a value cannot run on a device here (driver, package); ``""`` if it can.
        unavailable_with_trainer: Why a value cannot run under the study's trainer (``trainer``, the
            transformers ``Trainer``; ``sft``, TRL's ``SFTTrainer``: ``autotune.trainers``); ``""``
            if it can.
        no_effect_on: Why a value would change nothing on a device (a search would measure another
            value under its name); ``""`` if it matters. Removed from a searched space, but kept where
            the user fixed it in ``--base-args``.
        slow_on: Why a value, though it runs on a device, costs there far more than it can win: bf16
            on a CPU without bf16 instructions (emulated, slower than fp32), torch.compile on a CPU
            (minutes of C++ code generation per trial); ``""`` where it does not. Left out of
            ``auto`` with a note; kept, with a note, where a space lists it (it may be what fits in
            memory, or what the user means to measure).
        unavailable_for_model: Why a value cannot run with a model, given the space's other choices
            and the user's ``--base-args``; ``""`` if it can (``None``: every value runs with every model).
        fallback: The value kept where a filter removes every choice (it runs everywhere); ``None``:
            a lever with no choice left is an error the user must fix in the space.
        needs_real_data: Values other than ``default`` only change batches of samples of different
            lengths (``--dataset`` without ``--packing``); elsewhere they are removed.
        memory_parts: The parts of the memory estimate its value changes (:data:`MEMORY_PARTS`);
            ``()`` if none.
        memory_device_kinds: The device kinds on which it changes them.
        memory: The value's share of the estimator's :class:`~autotune.levers._hooks.MemoryTraits`
            (the traits so far -> with this lever's set), applied on :attr:`memory_device_kinds` only;
            required where :attr:`memory_parts` is not empty.
        speed: The value's share of the throughput prior's :class:`~autotune.levers._hooks.SpeedTraits`
            (the traits so far -> with this lever's set), where the value changes a step's time in a way
            its memory traits do not say (accumulation, the optimizer's step, compilation); ``None``:
            none, or all of it said through ``memory``.
        grows_memory: A larger value never needs less memory, all else equal (the micro-batch): a
            config above a value that ran out of memory is screened, and the planner and the
            best-practice seed look for the largest value that fits.
        narrow_auto: Where a space says ``auto`` (or leaves the lever out, which means ``auto``): the
            values the memory prior says are worth searching, and a note (``""``: none), from
            ``(values, the space's choices, what the prior predicts of them or None)``.
        best_practice: The values a performance guide would try first on a device, in order, among
            the space's choices of this lever (the best-practice seed); ``()``: the lever's default.
        last_resort: The best-practice seed turns it away from its default only where no
            micro-batch fits without (activation checkpointing).
        nearest: Where a seed's value is not among a space's choices: the choices closest in effect,
            in order, by value.
        planner_column: Its own column in ``autotune estimate``'s short table, under this header
            (``""``: shown among the other levers).
        tool_keys: For each tool whose keys are not the arguments' fields (``_exports.TOOL_FORMS``:
            axolotl, LLaMA-Factory), each of :attr:`fields` as the tool says it: a mapper to its keys, or
            :class:`~autotune.levers._exports.CannotExpress` with why (the JSON, flag, Python and ``trl sft``
            forms say :attr:`fields` by their own names). Every field of every tool is declared (a test).
    """

    name: str
    value_type: type
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    refused: Mapping[Any, str] = dataclasses.field(default_factory=dict)
    least: int | None = None
    auto_choices: Callable[[DeviceSpec], list[Any]] | None = None
    absent_means_auto: bool = True
    in_every_space: bool = True
    acts_on: str = "training_args"
    fields: tuple[str, ...] = ()
    to_training_args: Callable[[Any], dict[str, Any]] = _no_arguments
    from_training_args: Callable[[Mapping[str, Any]], Any] | None = None
    to_model_build: Callable[[Any], dict[str, Any]] = _no_arguments
    to_batching: Callable[[Any], Batching | None] = _nothing
    to_trainer: Callable[[Any], TrainerParts | None] = _nothing
    export_note: Callable[[Any], str] = lambda value: ""
    label: Callable[[Any], str] = lambda value: ""
    unavailable_on: Callable[[Any, DeviceSpec], str] = _runs_everywhere
    unavailable_with_trainer: Callable[[Any, str], str] = _under_every_trainer
    no_effect_on: Callable[[Any, DeviceSpec], str] = _runs_everywhere
    slow_on: Callable[[Any, DeviceSpec], str] = _runs_everywhere
    unavailable_for_model: Callable[[Any, ModelSpec, Mapping[str, list[Any]], Mapping[str, Any]], str] | None = None
    fallback: Any = None
    needs_real_data: bool = False
    memory_parts: tuple[str, ...] = ()
    memory_device_kinds: tuple[str, ...] = ("cpu", "cuda")
    memory: Callable[[Any, MemoryTraits], MemoryTraits] | None = None
    speed: Callable[[Any, SpeedTraits], SpeedTraits] | None = None
    grows_memory: bool = False
    narrow_auto: Callable[[list[Any], Mapping[str, list[Any]], SpaceMemory | None], tuple[list[Any], str]] | None = None
    best_practice: Callable[[DeviceSpec, Sequence[Any]], Sequence[Any]] = _no_preference
    last_resort: bool = False
    nearest: Mapping[Any, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    planner_column: str = ""
    tool_keys: Mapping[str, Mapping[str, Mapper]] = dataclasses.field(default_factory=dict)

    def check_choices(self, values: list[Any]) -> list[Any]:
        """A space's list of choices for this lever, checked; raises ``ValueError`` saying what is wrong."""
        if not values:
            raise ValueError("needs at least one choice" + self._range_words())
        refused = [v for v in values if v in self.refused]
        if refused:
            raise ValueError(f"{refused[0]} is refused: {self.refused[refused[0]]}")
        if self.choices is not None:
            unknown = [v for v in values if v not in self.choices]
            if unknown:
                raise ValueError(f"unknown choice {unknown[0]!r}; choose from {', '.join(map(str, self.choices))}")
        if self.least is not None and any(v < self.least for v in values):
            raise ValueError("needs at least one choice" + self._range_words())
        return values

    def _range_words(self) -> str:
        if self.least is None:
            return ""
        return ", each a positive integer" if self.least == 1 else f", each >= {self.least}"

    def changes_memory_on(self, device_kind: str) -> bool:
        return bool(self.memory_parts) and device_kind in self.memory_device_kinds
