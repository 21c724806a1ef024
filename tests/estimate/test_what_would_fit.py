"""When nothing in the space fits: the smallest predicted peak and which lever would bring a config
under the ceiling (estimate.what_would_fit), the same answer from ``autotune estimate`` and from a
search that stops before its first trial."""

from __future__ import annotations

import json

from autotune.estimate import estimate_peak, what_would_fit
from autotune.levers import LEVERS, TrialConfig
from autotune.runner import trial_memory_prior
from autotune.units import format_bytes
from tests.support.cli import run_cli_in_process

GiB = 1024**3
MiB = 1024**2
# gpt2-tiny at seq len 256, fp32 AdamW, micro-batch 8: the CPU prior predicts 1.85 GiB; micro-batch 1 0.76 GiB
# (with a 0.47 GiB process baseline: the prior's is this installation's, estimate.cpu_process_baseline_bytes).
SPACE = "micro_batch: [8, 16]\ncheckpointing: [false]\ndtype: [fp32]\noptim: [adamw_torch]\npin_memory: [false]\n"


def ceiling_fitting_micro_batch_2_not_4(cpu, gpt2_tiny) -> int:
    """A whole number of MiB half-way between the prior's micro-batch 2 and micro-batch 4 of SPACE."""
    prior = trial_memory_prior(cpu, {}, 1)
    two, four = (
        estimate_peak(gpt2_tiny, TrialConfig(micro_batch=mb, pin_memory=False), 256, prior).total_bytes for mb in (2, 4)
    )
    return (two + four) // 2 // MiB * MiB


def choices_of(yaml_text: str, tmp_path, cpu, model):
    from autotune.space import load_space

    path = tmp_path / "space.yaml"
    path.write_text(yaml_text)
    return load_space(str(path), cpu, model=model).choices


def test_nothing_to_say_where_a_config_fits(tmp_path, cpu, gpt2_tiny):
    choices = choices_of(SPACE, tmp_path, cpu, gpt2_tiny)
    assert what_would_fit(gpt2_tiny, choices, 256, trial_memory_prior(cpu, {}, 1), 8 * GiB, cpu) is None


def test_each_memory_lever_tries_its_other_values_on_the_smallest_config(tmp_path, cpu, gpt2_tiny):
    prior = trial_memory_prior(cpu, {}, 1)
    choices = choices_of(SPACE, tmp_path, cpu, gpt2_tiny)
    ceiling = ceiling_fitting_micro_batch_2_not_4(cpu, gpt2_tiny)
    advice = what_would_fit(gpt2_tiny, choices, 256, prior, ceiling, cpu)
    assert advice is not None
    smallest = TrialConfig(micro_batch=8, pin_memory=False)
    assert advice.smallest.config == smallest
    assert advice.smallest.estimate.total_bytes == estimate_peak(gpt2_tiny, smallest, 256, prior).total_bytes > ceiling
    for change in advice.changes:
        # Only levers whose memory parts move on this device, each change predicted by the one estimator.
        assert LEVERS[change.lever].changes_memory_on("cpu")
        config = TrialConfig.from_params({**smallest.to_params(), change.lever: change.value})
        assert change.estimate.total_bytes == estimate_peak(gpt2_tiny, config, 256, prior).total_bytes
        assert change.estimate.total_bytes < advice.smallest.estimate.total_bytes
        assert change.fits == (change.estimate.total_bytes <= ceiling)
    fixes = {(c.lever, c.value) for c in advice.changes if c.fits}
    assert ("micro_batch", 1) in fixes and ("micro_batch", 2) in fixes and ("micro_batch", 4) not in fixes
    assert ("optim", "sgd") in {(c.lever, c.value) for c in advice.changes}  # no optimizer state: lower, if not enough
    sentence = advice.sentence()
    assert sentence.startswith(
        f"nothing in the space is predicted to fit under the ceiling {format_bytes(ceiling)}: the smallest predicted peak is"
    )
    assert "predicted to fit with one change: micro_batch 1 or 2" in sentence


def test_when_no_single_lever_is_enough_it_says_so(tmp_path, cpu, gpt2_tiny):
    choices = choices_of(SPACE, tmp_path, cpu, gpt2_tiny)
    advice = what_would_fit(gpt2_tiny, choices, 256, trial_memory_prior(cpu, {}, 1), int(0.3 * GiB), cpu)
    assert advice is not None and not any(c.fits for c in advice.changes) and not advice.leanest.fits
    assert "even with every lever at its leanest" in advice.sentence()


def test_estimate_prints_the_table_and_the_search_stops_before_any_trial(tmp_path, cpu, gpt2_tiny):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    ceiling = f"{ceiling_fitting_micro_batch_2_not_4(cpu, gpt2_tiny) // MiB}MiB"
    common = ["--model", "gpt2-tiny", "--seq-len", "256", "--space", str(space), "--memory-ceiling", ceiling]
    planned = run_cli_in_process("estimate", *common, cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "Nothing in the space fits" in planned.stdout and "micro_batch" in planned.stdout
    as_json = run_cli_in_process("estimate", *common, "--json", cwd=tmp_path)
    sentence = json.loads(as_json.stdout)["nothing_fits"]
    assert sentence and "micro_batch 1 or 2" in sentence
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    searched = run_cli_in_process("search", *common, "--device", "cpu", "--storage", storage, cwd=tmp_path)
    assert searched.returncode == 2
    assert searched.stderr.count("\n") == 1 and "Traceback" not in searched.stderr
    assert searched.stderr.startswith(f"autotune: error: {sentence}. No trial run")
    assert not (tmp_path / "autotune_runs").exists()  # nothing started


def test_a_search_within_the_priors_margin_still_runs(tmp_path, cpu, gpt2_tiny):
    """Predicted over the ceiling but within the prior's margin: screening would run it, so the search does.

    The ceiling is this machine's: half-way between the prior's prediction for the space's one config and
    that prediction less the margin. The prediction holds this installation's process baseline (a fixed
    1.6 GiB sat just past the margin of a 2.01 GiB prediction on an AVX512-BF16 machine with newer releases).
    """
    from autotune.plan import SearchOptions
    from autotune.study import margin_for, prepare_request

    prior = trial_memory_prior(cpu, {}, 1)
    predicted = estimate_peak(gpt2_tiny, TrialConfig(micro_batch=8, pin_memory=False), 256, prior).total_bytes
    margin = margin_for(prior)
    ceiling = int(predicted * (1 + 1 / margin) / 2) // MiB * MiB
    assert ceiling < predicted <= ceiling * margin  # over the ceiling, within the margin
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.replace("[8, 16]", "[8]"))
    options = SearchOptions(
        model="gpt2-tiny", device="cpu", seq_len=256, memory_ceiling=f"{ceiling // MiB}MiB", space=str(space)
    )
    prepared = prepare_request(options, 16 * GiB)
    assert prepared.request.space.choices["micro_batch"] == [8]
