"""A fixed or capped global batch: which (micro-batch, accumulation) pairs are searched, and how."""

from __future__ import annotations

import random

import pytest

from autotune.config import TrialConfig, training_arguments_kwargs
from autotune.errors import AutotuneError
from autotune.space import load_space


def write(tmp_path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


SPACE = "micro_batch: [4, 8, 16, 24, 32, 64, 128]\ngrad_accum: [1, 2]\ndtype: [fp32, bf16]\n"


def pairs(space) -> list[tuple[int, int]]:
    """The (micro-batch, accumulation) pairs the space's trials can have."""
    fixed = {name: values[0] for name, values in space.choices.items() if len(values) == 1}
    configs = [
        TrialConfig.from_params({**fixed, "micro_batch": m, "grad_accum": a})
        for m in space.choices["micro_batch"]
        for a in space.choices.get("grad_accum", [1])
    ]
    return [(c.micro_batch, c.grad_accum) for c in configs]


def test_global_batch_searches_divisors_and_derives_accumulation(tmp_path, cpu):
    space = load_space(write(tmp_path, SPACE), cpu, global_batch=64)
    assert space.choices["micro_batch"] == [4, 8, 16, 32, 64]
    assert space.choices["global_batch"] == [64]  # fixed: recorded with every trial, not searched
    assert "grad_accum" not in space.choices
    assert pairs(space) == [(4, 16), (8, 8), (16, 4), (32, 2), (64, 1)]  # accumulation beyond the space's [1, 2]
    assert (
        "global batch 64: grad_accum = 64 / micro_batch, not searched; micro_batch 24, 128 removed (they do not divide 64)"
        in space.notes
    )
    assert space.largest_global_batch == 64
    assert space.size == 5 * 2


def test_a_global_batch_no_micro_batch_divides_is_refused(tmp_path, cpu):
    with pytest.raises(AutotuneError) as error:
        load_space(write(tmp_path, "micro_batch: [8, 16]\n"), cpu, global_batch=12)
    assert str(error.value) == (
        "global batch 12: no micro_batch 8, 16 divides it into whole accumulation steps; "
        "use micro-batches among its divisors 1, 2, 3, 4, 6, 12"
    )


def test_max_global_batch_accumulates_the_most_that_fits(tmp_path, cpu):
    space = load_space(write(tmp_path, "micro_batch: [8, 24, 32, 64]\ngrad_accum: [1, 2, 4]\n"), cpu, max_global_batch=48)
    assert space.choices["micro_batch"] == [8, 24, 32] and space.choices["max_global_batch"] == [48]
    assert pairs(space) == [(8, 6), (24, 2), (32, 1)]
    assert space.largest_global_batch == 48
    assert (
        "max global batch 48: grad_accum = 48 // micro_batch (the most that fits), not searched; micro_batch 64 removed"
        in space.notes
    )
    # The derived accumulation ignores the space's choices: 16 fits a cap of 16 once, not twice.
    assert pairs(load_space(write(tmp_path, "micro_batch: [8, 16]\ngrad_accum: [2, 4]\n"), cpu, max_global_batch=16)) == [
        (8, 2), (16, 1)
    ]
    with pytest.raises(AutotuneError, match="max global batch 4: even micro_batch 8 x grad_accum 1 is over it"):
        load_space(write(tmp_path, "micro_batch: [8, 16]\n"), cpu, max_global_batch=4)


def test_a_cap_without_searched_accumulation_only_removes_micro_batches(tmp_path, cpu):
    space = load_space(write(tmp_path, "micro_batch: [8, 16, 32]\ngrad_accum: [2]\n"), cpu, max_global_batch=32)
    assert space.choices["micro_batch"] == [8, 16] and space.choices["grad_accum"] == [2]
    assert "max_global_batch" not in space.choices
    assert pairs(space) == [(8, 2), (16, 2)]


def test_the_yaml_can_fix_the_global_batch_and_the_command_line_overrides_it(tmp_path, cpu):
    path = write(tmp_path, "global_batch: 32\nmicro_batch: [8, 16, 32]\ngrad_accum: [1, 2]\n")
    assert pairs(load_space(path, cpu)) == [(8, 4), (16, 2), (32, 1)]
    assert pairs(load_space(path, cpu, global_batch=16)) == [(8, 2), (16, 1)]
    assert pairs(load_space(path, cpu, max_global_batch=24)) == [(8, 3), (16, 1)]
    with pytest.raises(AutotuneError, match="give --global-batch or --max-global-batch, not both"):
        load_space(path, cpu, global_batch=16, max_global_batch=16)
    with pytest.raises(AutotuneError, match="must be positive integers"):
        load_space(path, cpu, global_batch=0)


def test_a_micro_batch_fixed_by_base_args_leaves_one_pair(tmp_path, cpu):
    path = write(tmp_path, "micro_batch: [8, 16, 32]\n")
    space = load_space(path, cpu, global_batch=64, base_args={"per_device_train_batch_size": 16})
    assert pairs(space) == [(16, 4)]
    # A fixed accumulation derives the micro-batch, even one the space does not list.
    space = load_space(path, cpu, global_batch=64, base_args={"gradient_accumulation_steps": 16})
    assert pairs(space) == [(4, 16)]
    with pytest.raises(AutotuneError, match=r"global batch 64: no micro_batch \(fixed by --base-args\) 24 divides it"):
        load_space(path, cpu, global_batch=64, base_args={"per_device_train_batch_size": 24})


def test_a_cap_with_base_args_keeps_what_the_user_fixed(tmp_path, cpu):
    path = write(tmp_path, "micro_batch: [8, 16, 32, 64]\ngrad_accum: [1, 2, 4]\n")
    assert pairs(load_space(path, cpu, max_global_batch=64, base_args={"per_device_train_batch_size": 16})) == [(16, 4)]
    fixed_accum = load_space(path, cpu, max_global_batch=64, base_args={"gradient_accumulation_steps": 2})
    assert pairs(fixed_accum) == [(8, 2), (16, 2), (32, 2)]


def test_the_mapping_writes_the_derived_pair(cpu):
    config = TrialConfig.from_params({"micro_batch": 16, "global_batch": 64, "dtype": "bf16"})
    assert (config.micro_batch, config.grad_accum, config.global_batch) == (16, 4, 64)
    kwargs = training_arguments_kwargs(config, "cpu")
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 64


def request_for(space, model, device):
    from autotune.runner import Workload
    from autotune.study import SearchRequest

    return SearchRequest(
        workload=Workload(model=model, device=device, seq_len=32, ceiling_bytes=2**30),
        space=space,
    )


def test_every_trial_the_sampler_proposes_has_the_global_batch(tmp_path, cpu, bert_tiny, sqlite_url):
    """The real TPE sampler, past its random start-up, over a real storage: only products of 48."""
    import optuna

    from autotune.storage import open_storage
    from autotune.study import open_study

    space = load_space(write(tmp_path, SPACE + "checkpointing: [false, true]\n"), cpu, global_batch=48)
    study = open_study(open_storage(sqlite_url), "gb", request_for(space, bert_tiny, cpu))
    rng = random.Random(0)
    products = set()
    for _ in range(20):
        trial = study.ask(space.distributions())
        config = TrialConfig.from_params(trial.params)
        products.add(config.global_batch)
        study.tell(trial, rng.random())  # a throughput-like value: the sampler's input, not a measurement
    assert products == {48}
    assert len({t.params["micro_batch"] for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}) > 1


def test_a_study_resumed_with_another_global_batch_is_refused(tmp_path, cpu, bert_tiny, sqlite_url):
    from autotune.storage import open_storage
    from autotune.study import open_study

    path = write(tmp_path, SPACE)
    open_study(open_storage(sqlite_url), "gb", request_for(load_space(path, cpu, global_batch=64), bert_tiny, cpu))
    same = open_study(open_storage(sqlite_url), "gb", request_for(load_space(path, cpu, global_batch=64), bert_tiny, cpu))
    assert same.study_name == "gb"
    with pytest.raises(AutotuneError, match="was searched over another space"):
        open_study(open_storage(sqlite_url), "gb", request_for(load_space(path, cpu, global_batch=32), bert_tiny, cpu))
