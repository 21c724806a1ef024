"""``SearchSpace``: the levers a study searches, each with its choices, after the filters."""

from __future__ import annotations

import dataclasses
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from autotune.levers import BATCH_LIMIT_KNOBS, TrialConfig


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The knobs a study searches: name -> choices, after the device filter.

    Attributes:
        choices: Knob name -> its choices, in the order the YAML gave them.
        notes: What the filters removed, and why (printed to the user).
        source: The YAML file the space came from.
    """

    choices: dict[str, list[Any]]
    notes: tuple[str, ...] = ()
    source: str = ""

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions for ``study.ask``. Knobs with a single choice are fixed, not searched."""
        return {name: CategoricalDistribution(values) for name, values in self.choices.items()}

    def fixed(self) -> dict[str, Any]:
        return {name: values[0] for name, values in self.choices.items() if len(values) == 1}

    @property
    def size(self) -> int:
        size = 1
        for values in self.choices.values():
            size *= len(values)
        return size

    @property
    def largest_global_batch(self) -> int:
        """The most samples one optimizer step of any config of the space takes."""
        fixed = {name: values[0] for name, values in self.choices.items() if name in BATCH_LIMIT_KNOBS}
        if fixed:
            return max(
                TrialConfig.from_params({**fixed, "micro_batch": m}).global_batch for m in self.choices["micro_batch"]
            )
        return max(self.choices["micro_batch"]) * max(self.choices["grad_accum"])
