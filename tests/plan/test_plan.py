"""One plan (autotune.plan._plan): ``autotune search`` and ``autotune estimate`` build their workload, its
memory prior and their space through the same call, so they predict the same peak for the same options."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from autotune.errors import AutotuneError
from autotune.estimate import estimate_peak
from autotune.estimate._plan_table import memory_distinct_configs
from autotune.levers import TrialConfig
from autotune.plan import EstimateOptions, PlanOptions, SearchOptions, plan
from autotune.plan._plan import device_groups, rank_device_numbers
from autotune.space import SearchSpace
from autotune.spec.devices import known_gpu
from autotune.study import SearchRequest, prepare_request
from tests.support.cli import REPO, run_cli_in_process

GiB = 1024**3
TINY_SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")
# The options both commands are given: gpt2-tiny at 64 tokens on this CPU, the tiny space.
COMMON = {"model": "gpt2-tiny", "device": "cpu", "seq_len": 64, "space": TINY_SPACE}


def some_fit_ceiling() -> str:
    """A ceiling between the space's smallest and largest predicted peak (the prior's process baseline
    is this installation's), so that some configs fit and some do not."""
    roomy = plan(EstimateOptions(**COMMON, memory_ceiling="1.0"), 64 * GiB)
    peaks = [
        estimate_peak(roomy.workload.model, config, 64, roomy.prior).total_bytes
        for config in memory_distinct_configs(roomy.space.choices, "cpu")
    ]
    return f"{(min(peaks) + max(peaks)) // 2 // 1024**2}MiB"


def test_search_and_estimate_predict_the_same_peak_through_the_one_plan(tmp_path):
    ceiling = some_fit_ceiling()
    prepared = prepare_request(
        SearchOptions(**COMMON, memory_ceiling=ceiling, work_dir=str(tmp_path / "runs")), 64 * GiB
    )
    request = prepared.request
    out = run_cli_in_process(
        "estimate",
        "--model",
        COMMON["model"],
        "--device",
        COMMON["device"],
        "--seq-len",
        str(COMMON["seq_len"]),
        "--space",
        COMMON["space"],
        "--memory-ceiling",
        ceiling,
        "--json",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    assert planned["estimator"] == request.workload.memory_prior.describe()
    assert planned["ceiling_bytes"] == request.ceiling_bytes
    # The same space (the same memory-distinct configs, in the table's order: by predicted speed among
    # those that fit), each predicted at the same peak and the same speed as the search's own prior.
    search_rows = memory_distinct_configs(request.space.choices, "cpu")
    listed = [TrialConfig(**row["config"]) for row in planned["rows"]]
    assert sorted(map(repr, listed)) == sorted(map(repr, search_rows)) and len(listed) == len(search_rows)
    speed = request.workload.speed_model()
    for row in planned["rows"]:
        predicted = speed.estimate(request.workload.model, TrialConfig(**row["config"]), 64)
        assert predicted is not None and row["predicted_speed"]["samples_per_s"] == predicted.samples_per_s
    assert any(row["fits"] for row in planned["rows"]) and not all(row["fits"] for row in planned["rows"])
    for row in planned["rows"]:
        config = TrialConfig(**row["config"])
        assert (
            row["total_bytes"]
            == estimate_peak(request.workload.model, config, 64, request.workload.memory_prior).total_bytes
        )


def test_both_commands_options_make_the_same_plan(tmp_path):
    searched = plan(SearchOptions(**COMMON, work_dir=str(tmp_path)), 64 * GiB)
    estimated = plan(EstimateOptions(**COMMON), 64 * GiB)
    assert searched.workload.ceiling_bytes == estimated.workload.ceiling_bytes
    assert searched.prior == estimated.prior == searched.workload.memory_prior
    assert searched.space == estimated.space
    assert searched.workload.model == estimated.workload.model
    assert searched.notes == estimated.notes


def test_a_plan_builds_the_memory_prior_once(tmp_path, monkeypatch):
    import autotune.runner

    built = []
    real = autotune.runner.trial_memory_prior

    def counted(*args):
        built.append(args)
        return real(*args)

    monkeypatch.setattr(autotune.runner, "trial_memory_prior", counted)
    planned = plan(SearchOptions(**COMMON, work_dir=str(tmp_path), workers=2), 64 * GiB)
    assert len(built) == 1
    assert planned.prior is planned.workload.memory_prior  # the space was narrowed with it, the workload holds it


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (PlanOptions(model="m", seq_len=0), "--seq-len 0: give a whole number above 0"),
        (PlanOptions(model="m", workers=0), "--workers 0: give a whole number above 0"),
        (PlanOptions(model="m", global_batch=0), "--global-batch 0: give a whole number above 0"),
        (
            PlanOptions(model="m", global_batch=8, max_global_batch=8),
            "give --global-batch or --max-global-batch, not both",
        ),
        (PlanOptions(model="m", packing=True), "--packing: only used with --dataset"),
        (SearchOptions(model="m", trials=0), "--trials 0: give a whole number above 0"),
        (SearchOptions(model="m", prune_ratio=1.0), "--prune-ratio 1.0: give a fraction from 0 (never prune)"),
        (SearchOptions(model="m", confirm_repeats=1), "--confirm-repeats 1: give a whole number from 2"),
        (SearchOptions(model="m", confirm_budget=0.0), "--confirm-budget 0.0: give a fraction above 0, up to and"),
        (SearchOptions(model="m", confirm_top=0, confirm_budget=1.5), "--confirm-budget 1.5: give a fraction above 0"),
        (EstimateOptions(model="m", all_rows=True, as_json=True), "give --all or --json, not both"),
        (EstimateOptions(model="m", gpu_type="l4", gpu=0), "--gpu-type plans for a GPU you do not have"),
        (EstimateOptions(model="m", devices_per_trial=0), "--devices-per-trial 0: give a whole number above 0"),
        (
            EstimateOptions(model="m", study_name="s1"),
            "--study-name names the study to calibrate on: give its --storage",
        ),
    ],
)
def test_each_option_is_checked_by_its_options_class_naming_it(options, message):
    with pytest.raises(AutotuneError, match=re.escape(message)):
        options.check()
    with pytest.raises(AutotuneError, match=re.escape(message)):
        plan(options)  # the plan checks its options first: nothing is loaded for a wrong one


def test_estimate_plans_for_a_gpu_type_without_a_gpu():
    planned = plan(EstimateOptions(model="bert-tiny", gpu_type="h100-sxm", seq_len=32, space=TINY_SPACE))
    assert planned.workload.device == known_gpu("h100-sxm").device()
    assert planned.prior.device_kind == "cuda" and planned.workload.address_space_bytes is None


def test_estimate_plans_a_trial_of_several_gpus_of_a_type_it_lacks():
    """`--gpu-type h100-sxm --devices-per-trial 2`: two planned H100s, one trial, the largest rank's peak (the table
    says so); once refused for want of a --gpus option estimate does not take."""
    from autotune.views.plan_display import estimate_title

    planned = plan(
        EstimateOptions(model="bert-tiny", gpu_type="h100-sxm", seq_len=32, space=TINY_SPACE, devices_per_trial=2)
    )
    assert planned.workload.devices_per_trial == 2 and planned.prior.ranks == 2
    assert planned.workload.speed_model().ranks == 2  # the trial's rates, as it records them
    assert any("model TFLOPs are its 2 ranks' together; MFU is per device" in note for note in planned.notes)
    title = estimate_title("bert-tiny", 32, "h100-sxm", "cuda", 2**30, planned.workload.devices_per_trial)
    assert "device memory as nvidia-smi shows it, the largest of its 2 ranks" in title


def test_a_length_beyond_the_rotary_models_declared_positions_is_said_not_refused():
    """Rotary positions do not stop a longer sequence (a learned table does: refused), so the plan says it once."""
    beyond = plan(EstimateOptions(model="llama-tiny", gpu_type="h100-sxm", seq_len=4096, space=TINY_SPACE))
    declared = beyond.workload.model.text_config["max_position_embeddings"]
    assert declared < 4096
    assert any(f"beyond the {declared:,} positions llama-tiny's config declares" in note for note in beyond.notes)
    within = plan(EstimateOptions(model="llama-tiny", gpu_type="h100-sxm", seq_len=declared, space=TINY_SPACE))
    assert not any("positions llama-tiny's config declares" in note for note in within.notes)


def fake_gpus(count: int) -> list:
    """FakeGpus: eight H100s as discovery would describe them (no CUDA device exists here)."""
    return [dataclasses.replace(known_gpu("h100-sxm").device(), index=i) for i in range(count)]


def test_gpus_split_into_groups_of_devices_per_trial_one_worker_each(tiny_workload):
    groups = device_groups(fake_gpus(8), 4)
    request = SearchRequest(
        workload=tiny_workload(devices_per_trial=4),
        space=SearchSpace(choices={"micro_batch": [8]}),
        worker_devices=tuple(group[0] for group in groups),
        worker_rank_devices=rank_device_numbers(groups),
    )
    workers = request.worker_requests()
    assert [w.workload.device.index for w in workers] == [0, 4]
    assert [w.workload.rank_devices for w in workers] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert request.identity()["devices_per_trial"] == 4
    with pytest.raises(AutotuneError, match=re.escape("--devices-per-trial 4: 6 GPU(s) do not split into trials of 4")):
        device_groups(fake_gpus(6), 4)
    cpu_groups = device_groups(PlanOptions(model="m", device="cpu", workers=2).worker_devices(), 2)
    assert len(cpu_groups) == 2 and rank_device_numbers(cpu_groups) == ()  # CPU ranks share the cores


class TestWorkerDevices:
    def test_cpu_workers_share_the_cpu(self):
        devices = PlanOptions(model="m", device="cpu", workers=3).worker_devices()
        assert [d.kind for d in devices] == ["cpu"] * 3

    @pytest.mark.parametrize(
        ("device", "gpu", "gpus", "workers", "message"),
        [
            (None, None, "0,x", 1, "distinct CUDA device numbers"),
            (None, None, "0,0", 1, "distinct CUDA device numbers"),
            ("cpu", None, "0,1", 1, "leave out --gpu, --device and --workers"),
            (None, None, "0,1", 2, "leave out --gpu, --device and --workers"),
        ],
    )
    def test_contradictions_are_one_line_errors(self, device, gpu, gpus, workers, message):
        options = PlanOptions(model="m", device=device, gpu=gpu, gpus=gpus, workers=workers)
        with pytest.raises(AutotuneError, match=re.escape(message)):
            options.worker_devices()
