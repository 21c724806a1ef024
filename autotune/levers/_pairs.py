"""Pairs of two levers' values that cannot run in one config, and what that leaves of a space.

A pair rule is judged config by config: a space may search bf16 weights beside fp32 autocast, and
flash attention beside fp32, and the search leaves out only the configs that pair them
(:func:`conflict`, asked by the sampler before it proposes a config, by ``SearchSpace.size`` and by
the estimate's table). Before, such a pair removed one of its values from the whole space, so a
space could not search fp32 and bf16 weights at once (issue 39: the LLM space fixed ``dtype: [bf16]``,
and the fastest DPO config on a CPU trains in fp32). A value that runs with no choice of the levers
it pairs with is still removed from the space, with a note (:func:`narrow_pairs`), and a space left
with no config that runs is refused with the rule's fix.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.errors import AutotuneError


@dataclasses.dataclass(frozen=True)
class PairRule:
    """Values of two levers that cannot train together.

    Attributes:
        levers: The two levers' names.
        conflict: ``(first value, second value) -> why they cannot run together`` ("" where they can).
        fix: What to change in a space none of whose configs runs, as one imperative clause.
    """

    levers: tuple[str, str]
    conflict: Callable[[Any, Any], str]
    fix: str


def conflict(params: Mapping[str, Any], rules: Sequence[PairRule]) -> str:
    """Why this one config cannot run (the first rule it breaks), or "" where it can; a lever the
    params do not name is not judged (its default runs with everything)."""
    for rule in rules:
        first, second = rule.levers
        if first in params and second in params and (why := rule.conflict(params[first], params[second])):
            return why
    return ""


def _paired_names(choices: Mapping[str, list[Any]], rules: Sequence[PairRule]) -> list[str]:
    return [name for name in choices if any(name in rule.levers for rule in rules)]


def _combinations(choices: Mapping[str, list[Any]], names: list[str]) -> list[dict[str, Any]]:
    return [dict(zip(names, values)) for values in itertools.product(*(choices[name] for name in names))]


def count_runnable(choices: Mapping[str, list[Any]], rules: Sequence[PairRule]) -> int:
    """How many configs of the space run: the product of the choices, less the pairs the rules leave out
    (enumerated over the paired levers only: a few dozen combinations)."""
    names = _paired_names(choices, rules)
    others = math.prod(len(values) for name, values in choices.items() if name not in names)
    return others * sum(1 for c in _combinations(choices, names) if not conflict(c, rules))


def narrow_pairs(
    choices: dict[str, list[Any]], notes: list[str], source: str, rules: Sequence[PairRule]
) -> dict[str, list[Any]]:
    """Remove each value that runs with no choice of the levers it pairs with, with a note; say which
    pairs the search leaves out config by config.

    Raises:
        AutotuneError: No config of the space runs (every combination breaks a rule).
    """
    names = _paired_names(choices, rules)
    combinations = _combinations(choices, names)
    runnable = [c for c in combinations if not conflict(c, rules)]
    if not runnable:
        broken = next(rule for rule in rules if any(_breaks(rule, c) for c in combinations))
        first, second = broken.levers
        why = next(w for c in combinations if (w := _breaks(broken, c)))
        raise AutotuneError(
            f"search space {source}: {first} {', '.join(map(str, choices[first]))} cannot run with {second} "
            f"{', '.join(map(str, choices[second]))} ({why}); {broken.fix}"
        )
    kept = {name: [v for v in choices[name] if any(c[name] == v for c in runnable)] for name in names}
    for name in names:
        for value in choices[name]:
            if value not in kept[name]:
                why = next(conflict(c, rules) for c in combinations if c[name] == value)
                notes.append(f"{name} {value} removed: {why}, and the space offers nothing it runs with")
    narrowed = {**choices, **kept}
    for rule in rules:
        first, second = rule.levers
        if first not in narrowed or second not in narrowed:
            continue
        left_out = [(a, b) for a in narrowed[first] for b in narrowed[second] if rule.conflict(a, b)]
        if left_out:
            pairs = ", ".join(f"{first} {a} with {second} {b}" for a, b in left_out)
            notes.append(f"not searched together: {pairs}: {rule.conflict(*left_out[0])}")
    return narrowed


def _breaks(rule: PairRule, combination: Mapping[str, Any]) -> str:
    return conflict(combination, (rule,))
