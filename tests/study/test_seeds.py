"""Seeds: every new study starts from the HF default TrainingArguments and a best-practice guess,
and a search ends with its speedup over the default."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from autotune.estimate import estimate_peak
from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.runner import Workload, trial_memory_prior
from autotune.space import SearchSpace
from autotune.space._narrow import filter_for_device
from autotune.space._space_file import SpaceFile
from autotune.spec.devices import DeviceSpec
from autotune.storage.schema import SEED_BEST_PRACTICE as BEST_PRACTICE
from autotune.storage.schema import SEED_HF_DEFAULT as HF_DEFAULT
from autotune.study._seeds import (
    SEED_FILL_FRACTION,
    best_practice_config,
    default_config,
    snap_to_space,
    study_seeds,
)
from autotune.views.ranking import speedup_over_default
from tests.space.test_space import FAKE_CPU_WITH_BF16, FAKE_CPU_WITHOUT_BF16
from tests.support.cli import REPO

GiB = 1024**3

# A description of a GPU this machine does not have (no CUDA here): a V100, which runs fp16 but
# neither bf16 nor tf32. Only the seed logic reads it; nothing runs on it.
FAKE_V100 = DeviceSpec(
    kind="cuda",
    index=0,
    name="Tesla V100-SXM2-16GB (fake: described, never run)",
    total_memory_bytes=16 * GiB,
    supported_dtypes=("fp32", "fp16"),
    compute_capability=(7, 0),
)


def test_the_hf_default_is_read_from_the_installed_training_arguments():
    from transformers import TrainingArguments

    default = default_config()
    args = TrainingArguments(output_dir="unused")
    assert default.micro_batch == args.per_device_train_batch_size == 8
    assert default.grad_accum == args.gradient_accumulation_steps == 1
    assert default.optim == str(getattr(args.optim, "value", args.optim))  # adamw_torch_fused in transformers 5
    assert (default.dtype, default.checkpointing, default.compile) == ("fp32", False, "off")
    assert (default.dataloader_workers, default.pin_memory) == (0, True)


def test_a_default_outside_the_space_is_snapped_to_the_nearest_choice_with_a_note(cpu):
    space = SearchSpace(
        choices={
            "micro_batch": [4, 16, 32],
            "dtype": ["bf16"],
            "optim": ["adafactor", "adamw_torch"],
            "pin_memory": [False],
        }
    )
    params, notes = snap_to_space(default_config(), space, cpu)
    assert params == {"micro_batch": 4, "dtype": "bf16", "optim": "adamw_torch", "pin_memory": False}
    assert len(notes) == 3  # micro_batch, dtype, optim; pin_memory on the CPU was explained by the space filter
    assert any("micro_batch 8 is not in the search space" in n and "4" in n for n in notes)


def test_best_practice_on_a_cpu_with_bf16_is_bf16_fused_adamw_and_the_largest_batch_that_fits(cpu, bert_tiny):
    cpu = FAKE_CPU_WITH_BF16
    space = filter_for_device(
        SpaceFile.model_validate(
            {
                "micro_batch": [8, 16, 32, 64],
                "checkpointing": [False, True],
                "dtype": ["fp32", "bf16"],
                "optim": ["adamw_torch", "adamw_torch_fused"],
                "dataloader_workers": [0, 2],
            }
        ),
        cpu,
    )

    def predicted(micro_batch: int, checkpointing: bool = False) -> int:
        config = TrialConfig(
            micro_batch=micro_batch,
            checkpointing=checkpointing,
            dtype="bf16",
            optim="adamw_torch_fused",
            pin_memory=False,
        )
        return estimate_peak(bert_tiny, config, 128, trial_memory_prior(cpu, {}, 1)).total_bytes  # the seeds' prior

    # A ceiling between the predictions of micro-batch 32 and 64.
    ceiling = int((predicted(32) + predicted(64)) / 2 / SEED_FILL_FRACTION)
    best = best_practice_config(space, Workload.for_model(bert_tiny, device=cpu, seq_len=128, ceiling_bytes=ceiling))
    assert (best.dtype, best.optim, best.checkpointing, best.dataloader_workers) == (
        "bf16",
        "adamw_torch_fused",
        False,
        0,
    )
    assert best.micro_batch == 32
    # A ceiling only checkpointing fits under: checkpointing on.
    ceiling = int(predicted(8, checkpointing=True) / SEED_FILL_FRACTION) + 1
    assert predicted(8) > SEED_FILL_FRACTION * ceiling
    best = best_practice_config(space, Workload.for_model(bert_tiny, device=cpu, seq_len=128, ceiling_bytes=ceiling))
    assert best.checkpointing and best.micro_batch == 8


def test_a_cpu_without_bf16_hardware_gets_an_fp32_seed_even_where_the_space_lists_bf16(bert_tiny):
    space = filter_for_device(
        SpaceFile.model_validate({"micro_batch": [8, 16], "dtype": ["fp32", "bf16"]}), FAKE_CPU_WITHOUT_BF16
    )
    assert space.choices["dtype"] == ["fp32", "bf16"]  # listed: searchable for memory
    workload = Workload.for_model(bert_tiny, device=FAKE_CPU_WITHOUT_BF16, seq_len=128, ceiling_bytes=8 * GiB)
    assert best_practice_config(space, workload).dtype == "fp32"
    best = next(seed for seed in study_seeds(space, workload) if seed.label == BEST_PRACTICE)
    assert best.params["dtype"] == "fp32"
    assert best.notes == (
        "best-practice seed trains in fp32, not bf16: cpu (fake AVX2 EPYC) has no bf16 matmul instructions "
        "(none of amx_bf16, avx512_bf16, bf16): it runs emulated, slower than fp32",
    )
    with_hardware = Workload.for_model(bert_tiny, device=FAKE_CPU_WITH_BF16, seq_len=128, ceiling_bytes=8 * GiB)
    assert best_practice_config(space, with_hardware).dtype == "bf16"


def test_this_machines_cpu_gets_the_seed_its_proc_cpuinfo_flags_call_for(cpu, bert_tiny):
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.split(":")[0].strip() in ("flags", "Features")).split()
    space = filter_for_device(SpaceFile.model_validate({"micro_batch": [8], "dtype": ["fp32", "bf16"]}), cpu)
    best = best_practice_config(space, Workload.for_model(bert_tiny, device=cpu, seq_len=128, ceiling_bytes=8 * GiB))
    assert best.dtype == ("bf16" if {"avx512_bf16", "amx_bf16", "bf16"} & set(flags) else "fp32")


def test_best_practice_on_a_gpu_without_bf16_uses_fp16_workers_and_pinned_memory(bert_tiny):
    space = filter_for_device(
        SpaceFile.model_validate(
            {
                "micro_batch": [8, 64],
                "dtype": ["fp32", "fp16", "bf16"],
                "dataloader_workers": [0, 2, 4],
                "pin_memory": [True, False],
            }
        ),
        FAKE_V100,
    )
    best = best_practice_config(
        space, Workload.for_model(bert_tiny, device=FAKE_V100, seq_len=128, ceiling_bytes=12 * GiB)
    )
    assert (best.dtype, best.dataloader_workers, best.pin_memory, best.micro_batch) == ("fp16", 2, True, 64)


@pytest.fixture
def new_study(sqlite_url, cpu, tiny_workload, tmp_path):
    from autotune.space import load_space
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study

    request = SearchRequest(
        workload=tiny_workload(ceiling_bytes=4 * GiB),
        space=load_space(str(REPO / "search_spaces" / "tiny-test.yaml"), cpu),
        work_root=str(tmp_path / "runs"),
    )

    def open_it():
        return open_study(open_storage(sqlite_url), "seeded", request)

    return open_it


def test_a_new_study_queues_the_two_seeds_once(new_study, cpu):
    study = new_study()
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs["seed"] for t in waiting] == [HF_DEFAULT, BEST_PRACTICE]
    again = new_study()  # resumed: nothing queued twice
    assert len(again.get_trials()) == 2
    # tiny-test.yaml holds every HF default value except pin_memory, which the CPU does not use; it
    # lists bf16, which the best-practice seed leaves for fp32 where this CPU only emulates it.
    notes = again.user_attrs["seed_notes"]
    assert [n for n in notes if "runs emulated" not in n] == []
    assert len(notes) == len(cpu.emulated_dtypes)


def test_a_default_the_space_cannot_hold_is_queued_with_the_values_it_stands_in_for(tiny_workload):
    """The HF-default seed of a space without micro-batch 8 runs the nearest choice: the trial records
    the default's value (``seed_instead_of``), and keeps it when queued again, so the speedup line
    names the config it measured."""
    from optuna.trial import TrialState

    from autotune.storage import schema
    from autotune.study._seeds import enqueue_seeds, requeue_failed_seeds

    space = SearchSpace(choices={"micro_batch": [4, 16], "pin_memory": [False]})
    seeds = study_seeds(space, tiny_workload())
    default = next(seed for seed in seeds if seed.label == HF_DEFAULT)
    # pin_memory False changes nothing on the CPU (the space filter says so): not named.
    assert default.params["micro_batch"] == 4 and default.instead_of == {"micro_batch": 8}
    study = optuna.create_study(direction="maximize")
    enqueue_seeds(study, seeds)
    study.tell(study.ask(), state=TrialState.FAIL)  # the default's first attempt measured nothing
    assert requeue_failed_seeds(study) == [HF_DEFAULT]
    queued = [t for t in study.get_trials() if t.state == TrialState.WAITING and t.user_attrs["seed"] == HF_DEFAULT]
    assert [t.user_attrs[schema.TRIAL_SEED_INSTEAD_OF] for t in queued] == [{"micro_batch": 8}]
    best = next(t for t in study.get_trials() if t.user_attrs["seed"] == BEST_PRACTICE)
    assert schema.TRIAL_SEED_INSTEAD_OF not in best.user_attrs


def tell_seed(study: optuna.Study, status: str, samples_per_s: float) -> None:
    from autotune.study._record import tell

    trial = study.ask()
    tell(
        study,
        trial,
        TrialResult(
            status=status,
            samples_per_s=samples_per_s,
            model_tflops=samples_per_s * 1e-3,
            peak_memory_bytes=GiB if status == "ok" else 0,
            ceiling_bytes=4 * GiB,
        ),
    )


def test_speedup_over_the_default_compares_the_best_feasible_trial_with_the_hf_default(new_study):
    study = new_study()
    tell_seed(study, "ok", 50.0)  # the HF default
    tell_seed(study, "ok", 125.0)  # the best-practice guess
    speedup = speedup_over_default(study.get_trials())
    assert (speedup.default_trial, speedup.best_trial) == (0, 1)
    assert speedup.ratio == pytest.approx(2.5)


def test_the_speedup_names_the_confirmed_winner_not_the_fastest_single_measurement(new_study):
    study = new_study()
    tell_seed(study, "ok", 50.0)  # the HF default
    tell_seed(study, "ok", 125.0)  # fastest at search time
    tell_seed(study, "ok", 110.0)
    # Confirmation re-measured both leaders: #2 is faster there, and wins.
    confirmations = {1: {"samples_per_s": 100.0}, 2: {"samples_per_s": 120.0}}
    speedup = speedup_over_default(study.get_trials(), confirmations)
    # The default was not re-run: its single search-time figure is set against the winner's, not its re-runs'.
    assert (speedup.best_trial, speedup.best_samples_per_s, speedup.rerun_medians) == (2, 110.0, False)
    assert speedup.ratio == pytest.approx(2.2)
    assert speedup_over_default(study.get_trials()).best_trial == 1  # without them: search-time figures


def test_a_confirmed_default_is_compared_at_its_confirmed_median(new_study):
    study = new_study()
    tell_seed(study, "ok", 50.0)  # the HF default, 50 samples/s at search time
    tell_seed(study, "ok", 125.0)
    # Both re-measured: the ratio compares the two confirmed medians, not a re-run with a search figure.
    confirmations = {0: {"samples_per_s": 40.0}, 1: {"samples_per_s": 100.0}}
    speedup = speedup_over_default(study.get_trials(), confirmations)
    assert speedup.default_samples_per_s == 40.0 and speedup.ratio == pytest.approx(2.5) and speedup.rerun_medians
    assert not speedup.within_noise  # no tie flags


def test_no_ratio_when_the_default_did_not_fit(new_study):
    study = new_study()
    tell_seed(study, "oom", 0.0)
    tell_seed(study, "ok", 80.0)
    speedup = speedup_over_default(study.get_trials())
    assert speedup.ratio is None and speedup.default_status == "oom"


@pytest.mark.slow
def test_a_search_starts_from_the_hf_default_and_prints_its_speedup(searched_study, cpu):
    """The run's searched study: a real `autotune search` of the tiny space (tests/support/searched_study.py)."""
    out = searched_study.search
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    study = optuna.load_study(study_name=searched_study.study_name, storage=searched_study.storage)
    first, second = study.trials[:2]
    assert first.user_attrs["seed"] == HF_DEFAULT and second.user_attrs["seed"] == BEST_PRACTICE
    expected = dataclasses.replace(default_config(), pin_memory=False)  # the CPU space drops pinning
    assert TrialConfig.from_params(first.params) == expected
    assert TrialConfig.from_params(second.params).dtype == ("bf16" if cpu.has_matmul_hardware("bf16") else "fp32")
    line = next(line for line in out.stdout.splitlines() if line.startswith("speedup over HF default"))
    speedup = speedup_over_default(study.trials)
    if speedup.ratio is not None:
        assert f"{speedup.ratio:.2f}x" in line and f"{speedup.default_samples_per_s:.1f} samples/s" in line
    else:
        assert "did not fit" in line


def test_a_default_that_failed_for_good_is_said_in_the_speedup_and_the_loss_lines(new_study):
    """A default too slow for its timeout (TRL's, in bf16 a CPU emulates: 405 s a step under a 420 s timeout)
    has no figure: the summary says it failed and why. It printed no speedup line at all, and said the default
    trial "has not run"."""
    import io

    from rich.console import Console

    from autotune.study._record import tell
    from autotune.views.search_display import print_speedup, print_winner_loss

    study = new_study()
    reason = "no result within the 420 s timeout; killed while its steps still came"
    tell(study, study.ask(), TrialResult(status="timeout", error=reason, ceiling_bytes=4 * GiB))  # the HF default
    tell_seed(study, "ok", 0.26)  # the best-practice guess
    speedup = speedup_over_default(study.get_trials())
    assert (speedup.default_trial, speedup.best_trial, speedup.ratio) == (0, 1, None)
    out = io.StringIO()
    console = Console(file=out, width=400)
    print_speedup(console, study)
    print_winner_loss(console, study)
    text = out.getvalue()
    assert f"n/a: HF default TrainingArguments (#0) failed (timeout: {reason}); winner #1" in text
    assert "#0 is timeout, so it gives no reference loss" in text and "has not run" not in text
