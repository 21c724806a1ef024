"""Every lever is one entry of ``autotune.levers``, and every part of autotune knows the same levers.

A lever known to one part (the space, the mapping, the estimator, the export, the docs) and not
another fails here: adding a lever is one entry plus its tests.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from autotune.estimate import MemoryFit, estimate_peak
from autotune.levers import (
    BATCH_LIMIT_KNOBS,
    LEVERS,
    Lever,
    TrialConfig,
    knob_values_from_base_args,
    training_arguments_kwargs,
)
from autotune.levers._lever import MEMORY_PARTS
from autotune.space._space_file import SpaceFile

REPO = Path(__file__).resolve().parent.parent.parent
# pin_memory is forced off on every CPU config: a label would repeat on every row of a CPU study.
UNLABELLED = {"pin_memory"}


def other_values(lever: Lever) -> list:
    """Values of the lever other than its default, to try."""
    if lever.choices is not None:
        return [v for v in lever.choices if v != lever.default]
    if lever.value_type is bool:
        return [not lever.default]
    return [lever.default + 2, lever.default + 16]


def test_trial_config_and_the_space_file_have_one_field_per_lever():
    assert [f.name for f in dataclasses.fields(TrialConfig)] == list(LEVERS)
    assert {f.name: f.default for f in dataclasses.fields(TrialConfig)} == {
        n: lever.default for n, lever in LEVERS.items()
    }
    assert list(SpaceFile.model_fields) == [*LEVERS, *BATCH_LIMIT_KNOBS]


@pytest.mark.parametrize("name", list(LEVERS))
def test_the_mapping_writes_only_the_levers_fields_and_its_inverse_reads_them_back(name):
    lever = LEVERS[name]
    assert lever.acts_on in ("training_args", "model", "collator")
    for value in [lever.default, *other_values(lever)]:
        written = lever.to_training_args(value)
        assert set(written) <= set(lever.fields), (value, written)
        if lever.acts_on != "training_args":
            assert written == {} and lever.from_training_args is None
            continue
        if written:  # a value that writes nothing is the Trainer's default, which the inverse never sees
            assert knob_values_from_base_args(written) == {name: value}


@pytest.mark.parametrize("name", list(LEVERS))
def test_the_whole_mapping_carries_each_levers_value(name):
    lever = LEVERS[name]
    for value in other_values(lever):
        config = TrialConfig(**{name: value})
        kwargs = training_arguments_kwargs(config, "cuda")
        expected = lever.to_training_args(value)
        assert {k: kwargs[k] for k in expected} == expected


@pytest.mark.parametrize("name", list(LEVERS))
def test_every_value_other_than_the_default_is_named_in_tables_and_the_export(name):
    lever = LEVERS[name]
    for value in other_values(lever):
        config = TrialConfig(**{name: value})
        if name not in UNLABELLED:
            assert config.short() != TrialConfig().short(), value
        if lever.acts_on != "training_args":
            assert lever.export_note(value), f"{name} {value}: the export must say how to apply it"
    assert lever.export_note(lever.default) == ""


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
@pytest.mark.parametrize("name", list(LEVERS))
def test_a_lever_changes_the_estimate_exactly_where_it_says(name, device_kind, gpt2_tiny):
    """A lever with memory parts moves the estimate on its device kinds, only in those parts (the
    CUDA allocator's share follows whatever moves); a lever without moves nothing."""
    lever = LEVERS[name]
    assert set(lever.memory_parts) <= set(MEMORY_PARTS)
    fit = MemoryFit.prior(device_kind)
    lengths = [120, 40, 30, 20]  # real samples, so that padding can matter
    base = TrialConfig(micro_batch=4, pin_memory=False)
    before = estimate_peak(gpt2_tiny, base, 128, fit, lengths=lengths).parts()
    changed: set[str] = set()
    for value in other_values(lever):
        after = estimate_peak(gpt2_tiny, dataclasses.replace(base, **{name: value}), 128, fit, lengths=lengths).parts()
        changed |= {part for part in before if after[part] != before[part]}
    if lever.changes_memory_on(device_kind):
        assert changed, f"{name} declares {lever.memory_parts} but moves nothing on {device_kind}"
        assert changed <= {*lever.memory_parts, "allocator"}, changed
    else:
        assert not changed, f"{name} moves {changed} on {device_kind} but declares no memory part there"


def test_the_space_readme_documents_every_lever():
    readme = (REPO / "search_spaces" / "README.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", readme, flags=re.MULTILINE))
    assert set(LEVERS) <= documented, set(LEVERS) - documented
