"""``SearchSpace``: the levers a study searches, each with its choices, after the filters."""

from __future__ import annotations

import dataclasses
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from autotune.levers import largest_global_batch, runnable_count


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The levers a study searches: name -> choices, after the filters.

    Attributes:
        choices: Lever name (or a batch limit: ``global_batch``, ``max_global_batch``) -> its choices,
            in the order the YAML gave them.
        notes: What the filters removed, and why (printed to the user).
        source: The YAML file the space came from.
    """

    choices: dict[str, list[Any]]
    notes: tuple[str, ...] = ()
    source: str = ""

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions for ``study.ask``. Levers with a single choice are fixed, not searched."""
        return {name: CategoricalDistribution(values) for name, values in self.choices.items()}

    def fixed(self) -> dict[str, Any]:
        return {name: values[0] for name, values in self.choices.items() if len(values) == 1}

    @property
    def size(self) -> int:
        """How many configs the search can run: the product of the choices, less the pairs of values
        that cannot train together (:data:`autotune.levers.config_conflict`)."""
        return runnable_count(self.choices)

    @property
    def largest_global_batch(self) -> int:
        """The most samples one optimizer step of any config of the space takes."""
        return largest_global_batch(self.choices)
