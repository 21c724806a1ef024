"""The ZeRO benchmark's arithmetic (benchmarks/bench_zero.py), the fidelity benchmark's launch of a
plain run (benchmarks/_common.py): several ranks or a DeepSpeed config go through torchrun, and the
ceiling of scripts/gpu_acceptance.sh's offload step."""

from __future__ import annotations

import json
import sys

from autotune.levers import TrialConfig
from benchmarks.bench_zero import Row, offload_cost, scaling, speed_table, stage_cost, table
from tests.support.scripts import script

MiB = 1024**2


def row(ranks: int, zero: str, samples_per_s: float, status: str = "ok") -> Row:
    return Row(ranks, zero, status, samples_per_s, (900 * MiB, 1000 * MiB), 800 * MiB, 0)


def test_offload_cost_is_each_offload_row_over_the_same_stage_on_as_many_ranks():
    rows = [
        row(1, "2", 4.0),
        row(1, "2+offload", 1.0),
        row(2, "2", 6.0),
        row(2, "2+offload", 3.0),
        row(2, "3+offload", 2.0),
    ]
    # 3+offload has no stage-3 row to compare with: no figure rather than a wrong one.
    assert offload_cost(rows) == {(1, "2+offload"): 0.25, (2, "2+offload"): 0.5}
    assert offload_cost([row(1, "2", 4.0, status="error"), row(1, "2+offload", 1.0)]) == {}


def test_the_table_shows_the_largest_ranks_peak_against_the_prediction():
    lines = table([row(2, "2", 6.0), row(2, "2+offload", 3.0), row(2, "3", 0.0, status="crash")]).splitlines()
    assert lines[2].split(" | ")[3:7] == ["1000", "900 / 1000", "800", "1.25"]
    assert lines[3].endswith("| 0.50x |")
    assert "| crash |" in lines[4]


def test_scaling_sets_each_stage_on_several_ranks_over_the_same_stage_on_one_measured_and_predicted():
    def timed(ranks: int, zero: str, measured: float, predicted: float, status: str = "ok") -> Row:
        return Row(ranks, zero, status, measured, (), 0, 0, (), predicted, 0.1 if ranks > 1 else 0.0)

    rows = [
        timed(1, "off", 4.0, 5.0),
        timed(2, "off", 6.0, 9.0),
        timed(1, "3", 2.0, 4.0),
        timed(2, "3", 3.0, 4.0),
        timed(2, "2", 3.0, 4.0),  # no one-rank row: no ratio
        timed(1, "1", 2.0, 4.0, status="crash"),
        timed(2, "1", 3.0, 4.0),
    ]
    assert scaling(rows) == {(2, "off"): (1.5, 1.8), (2, "3"): (1.5, 1.0)}
    # Each ZeRO row over plain training on as many ranks; none where no plain row trained (the crashed stage 1).
    assert stage_cost(rows) == {
        (1, "3"): (0.5, 0.8),
        (2, "3"): (0.5, 4.0 / 9.0),
        (2, "2"): (0.5, 4.0 / 9.0),
        (2, "1"): (0.5, 4.0 / 9.0),
    }
    lines = speed_table(rows).splitlines()
    assert lines[3] == "| 2 | off | 6.00 | 9.00 | 10% | 0% | 1.50x | 1.80x |  |  |"
    assert lines[6] == "| 2 | 2 | 3.00 | 4.00 | 10% | 0% |  |  | 0.50x | 0.44x |"
    assert not any("| 1 | 1 |" in line for line in lines)  # a crashed trial has no speed to show


def test_a_plain_run_of_several_ranks_or_a_deepspeed_config_is_launched_by_torchrun(tmp_path):
    from benchmarks._common import plain_trainer_command  # imports transformers (its trial callback)

    plain = tmp_path / "best.json"
    plain.write_text(json.dumps({"per_device_train_batch_size": 4}))
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps({"per_device_train_batch_size": 4, "deepspeed": "zero.deepspeed.json"}))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    assert plain_trainer_command(plain, "bert-mini", 32, 5, 1)[:4] == [
        sys.executable,
        "-m",
        "benchmarks.bench_fidelity",
        "--plain",
    ]
    module = ["--module", "benchmarks.bench_fidelity", "--plain"]
    assert plain_trainer_command(plain, "bert-mini", 32, 5, 2)[:9] == [*torchrun, "2", *module]
    assert plain_trainer_command(zero, "bert-mini", 32, 5, 1)[:9] == [*torchrun, "1", *module]


def test_the_gpu_offload_step_sets_its_ceiling_between_zero_2_with_and_without_offload():
    offload_ceiling_bytes = script("gpu_acceptance_offload").offload_ceiling_bytes
    from autotune.estimate import MemoryFit, estimate_peak
    from autotune.spec.models import resolve_model

    cuda = MemoryFit.prior("cuda")
    ceiling = offload_ceiling_bytes("gpt2-large", 512, cuda)
    peaks = [
        estimate_peak(
            resolve_model("gpt2-large"), TrialConfig(micro_batch=1, dtype="bf16", zero=z), 512, cuda
        ).total_bytes
        for z in ("2+offload", "2")
    ]
    assert peaks[0] < ceiling < peaks[1]
