"""DeepSpeed ZeRO through the real Trainer on the CPU, in real trial children (the ``zero`` lever).

On the CPU every DeepSpeed run JIT-builds its ``deepspeed_shm_comm`` op on first use; the offload
test also builds ``cpu_adam`` (about two minutes once, then cached in ~/.cache/torch_extensions): it
is the only test here that needs it. The estimator's split of device and host memory is checked
against where DeepSpeed says it put each state: on the CPU both are host RAM, so the check is on
DeepSpeed's own flags (``offload_optimizer``/``offload_param``, its CPU Adam) and partition sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.estimate._zero import MASTER_BYTES, zero_state_bytes
from autotune.levers import TrialConfig, memory_traits
from autotune.runner import TrialJob, run_isolated
from tests.support.cli import FAST_SEARCH_ARGS, run_cli

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("deepspeed") is None, reason="deepspeed is the [deepspeed] extra"
    ),
]


def run_zero_trial(tiny_workload, gpt2_tiny, tmp_path, zero: str) -> dict:
    from tests.support.zero_placement import placement_file

    job = TrialJob(
        workload=tiny_workload(gpt2_tiny, callbacks=("tests.support.zero_placement:RecordZeroPlacement",)),
        config=TrialConfig(micro_batch=4, dtype="bf16", pin_memory=False, zero=zero),
        work_dir=str(tmp_path / "trial"),
    )
    result = run_isolated(job, timeout_s=540)
    assert result.status == "ok", (result.error, Path(job.log_path).read_text()[-3000:])
    assert result.samples_per_s > 0 and result.peak_memory_bytes > 0
    return json.loads(placement_file(job.work_dir).read_text())


def test_a_zero_2_trial_trains_through_the_trainers_deepspeed_integration(tiny_workload, gpt2_tiny, tmp_path):
    placed = run_zero_trial(tiny_workload, gpt2_tiny, tmp_path, "2")
    # The Trainer's own optimizer (optim adamw_torch) under DeepSpeed's stage-1/2 optimizer, nothing offloaded.
    assert placed["zero_optimizer"] == "DeepSpeedZeroOptimizer" and placed["basic_optimizer"] == "AdamW"
    assert placed["world_size"] == 1 and placed["offload_optimizer"] is False
    # One rank holds the whole fp32 master partition: every parameter (DeepSpeed pads it to an alignment).
    assert gpt2_tiny.num_params <= placed["master_numel"] <= gpt2_tiny.num_params * 1.01
    predicted = zero_state_bytes(gpt2_tiny, memory_traits(TrialConfig(dtype="bf16", zero="2"), "cuda"), 1, "cuda")
    measured_optimizer = placed["master_bytes"] + placed["state_bytes"]
    assert predicted.host_bytes == 0
    assert abs(predicted.optimizer_bytes - measured_optimizer) <= 0.02 * measured_optimizer


def test_zero_3_offload_places_optimizer_states_and_parameters_where_the_estimator_says(
    tiny_workload, gpt2_tiny, tmp_path
):
    from tests.support.zero_placement import offloaded_bytes

    placed = run_zero_trial(tiny_workload, gpt2_tiny, tmp_path, "3+offload")
    # DeepSpeed's own CPU Adam steps the offloaded fp32 partitions; parameters are offloaded too.
    assert (
        placed["zero_optimizer"] == "DeepSpeedZeroOptimizer_Stage3" and placed["basic_optimizer"] == "DeepSpeedCPUAdam"
    )
    assert placed["offload_optimizer"] is True and placed["offload_param"] is True
    config = TrialConfig(dtype="bf16", zero="3+offload")
    on_gpu = zero_state_bytes(gpt2_tiny, memory_traits(config, "cuda"), 1, "cuda")
    on_cpu = zero_state_bytes(gpt2_tiny, memory_traits(config, "cpu"), 1, "cpu")
    # On a GPU the estimator moves the optimizer states and parameter partitions off the device ...
    assert on_gpu.optimizer_bytes == 0 and on_gpu.host_bytes == on_cpu.host_bytes
    # ... and the bytes it puts in host memory are the partitions DeepSpeed offloaded: the fp32 master
    # copy and Adam's two states, the bf16 parameters, and the fp32 gradient partition.
    offloaded = offloaded_bytes(placed)
    assert abs(on_gpu.host_bytes - offloaded) <= 0.02 * offloaded
    assert placed["master_bytes"] >= MASTER_BYTES * gpt2_tiny.num_params


def test_an_op_that_cannot_be_built_is_a_classified_trial_failure_in_one_line(tmp_path):
    """No C++ compiler (CXX names none) and an empty extensions cache: the trial fails at once with
    one line naming the op and the build's own cause, and the search goes on to report it."""
    import optuna

    space = tmp_path / "space.yaml"
    space.write_text('micro_batch: [4]\ndtype: [bf16]\npin_memory: [false]\nzero: ["2"]\n')
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    env = {"CXX": str(tmp_path / "no-such-compiler"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    searched = run_cli(
        "search",
        "--model",
        "gpt2-tiny",
        "--device",
        "cpu",
        "--space",
        str(space),
        "--storage",
        storage,
        "--trials",
        "1",
        *FAST_SEARCH_ARGS,
        cwd=tmp_path,
        env=env,
        timeout=540,
    )
    assert "Traceback" not in searched.stderr, searched.stderr
    (trial,) = optuna.load_study(study_name="gpt2-tiny-cpu-s32", storage=storage).trials
    result = trial.user_attrs["result"]
    assert result["status"] == "error", result
    assert result["error"].startswith("could not build the C++ op deepspeed_shm_comm"), result["error"]
    assert "no-such-compiler: not found" in result["error"] and "\n" not in result["error"]


def test_the_accelerate_export_of_a_zero_winner_trains_a_users_loop_under_deepspeed(tmp_path):
    """`accelerate launch` with the export, as its header says, of a loop whose Accelerator() is told
    nothing: it trains through DeepSpeed's engine at the winner's stage and precision (the config's
    ``distributed_type: 'NO'`` trained it without DeepSpeed, silently)."""
    import os
    import signal
    import subprocess
    import sys

    from autotune.spec.files import Destination
    from autotune.views.export import export_winner
    from tests.support.zero_export import ACCELERATE_LOOP, zero_winner_study

    out = tmp_path / "accelerate_config.yaml"
    export_winner(zero_winner_study("2", dtype="bf16"), "accelerate", Destination(str(out)))
    launch = next(line for line in out.read_text().splitlines() if line.startswith("# accelerate launch "))
    args = launch.removeprefix("# accelerate launch ").replace("<this file>", str(out)).split()
    command = [sys.executable, "-m", "accelerate.commands.launch", *args[:-1], str(ACCELERATE_LOOP)]
    assert args[-1] == "train.py"
    # DS_ACCELERATOR: the CPU winner's device, named as the trial children name it (runner/_cpu_deepspeed.py).
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    # Its own session: a launch that overruns is ended with the rank torchrun started under it.
    launched = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = launched.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(launched.pid, signal.SIGKILL)
        stdout, stderr = launched.communicate()
    assert launched.returncode == 0, stderr[-3000:]
    result = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])
    assert result == {"distributed_type": "DEEPSPEED", "engine": "DeepSpeedEngine", "zero_stage": 2, "bf16": True}
