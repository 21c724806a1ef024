"""Measured matmul peaks: measuring on the CPU, storing by device name, and MFU against them."""

from __future__ import annotations

import json

import optuna
import pytest

from autotune.errors import AutotuneError
from autotune.spec.measured_peaks import (
    MeasuredMatmulPeak,
    load_calibration,
    load_measured_inner_rates,
    load_measured_peaks,
    peak_note,
    peaks_file,
    save_calibration,
)
from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli_in_process


@pytest.fixture
def peaks_path(tmp_path, monkeypatch):
    path = tmp_path / "peaks.json"
    monkeypatch.setenv("AUTOTUNE_PEAKS_FILE", str(path))
    return path


def test_peaks_are_stored_by_device_name_and_merged(cpu, peaks_path):
    assert load_measured_peaks(cpu.name) == {}
    save_calibration(cpu, [MeasuredMatmulPeak("fp32", 0.5, 0.4, 256, 5)])
    save_calibration(cpu, [MeasuredMatmulPeak("bf16", 1.5, 1.2, 256, 5)])
    assert load_measured_peaks(cpu.name) == {"fp32": 0.5, "bf16": 1.5}
    assert load_calibration(cpu.name)["threads"] >= 1
    assert load_measured_peaks("some other device") == {}
    stored = json.loads(peaks_path.read_text())
    assert set(stored) == {cpu.name}


def test_a_cpus_calibration_times_narrow_inner_sizes_and_the_prior_reads_them_with_the_peak(cpu, peaks_path):
    from autotune.runner import calibrate_device

    measured = calibrate_device(cpu, dtypes=("fp32",), matrix_size=512, seconds=0.05)
    assert [(p.dtype, p.inner_size) for p in measured] == [("fp32", None), ("fp32", 64), ("fp32", 256)]
    assert all(p.matrix_size == 512 and p.tflops > 0 for p in measured)
    save_calibration(cpu, measured)
    assert load_measured_peaks(cpu.name) == {"fp32": measured[0].tflops}  # the square peak alone is the peak
    assert load_measured_inner_rates(cpu.name) == {
        "fp32": {64: measured[1].tflops, 256: measured[2].tflops, 512: measured[0].tflops}
    }
    save_calibration(cpu, [MeasuredMatmulPeak("bf16", 1.5, 1.2, 512, 5)])  # another dtype keeps these
    assert set(load_measured_inner_rates(cpu.name)) == {"fp32"}
    save_calibration(cpu, [MeasuredMatmulPeak("fp32", 0.5, 0.4, 512, 5)])  # its peak again: its narrow rates go
    assert load_measured_inner_rates(cpu.name) == {}


def test_peaks_file_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("AUTOTUNE_PEAKS_FILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert peaks_file() == tmp_path / "cache" / "autotune" / "peaks.json"


def test_a_corrupt_peaks_file_is_a_user_error(cpu, peaks_path):
    peaks_path.write_text("{not json")
    with pytest.raises(AutotuneError, match="delete it"):
        load_measured_peaks(cpu.name)


def test_peak_note_says_what_mfu_is_against(cpu):
    assert "no datasheet peak for a CPU" in peak_note(cpu, {})
    assert "--calibrate" in peak_note(cpu, {})
    assert "measured peaks (fp32 0.5 TFLOPS" in peak_note(cpu, {"fp32": 0.5})


@pytest.mark.slow
def test_cli_calibrates_the_cpu_then_a_search_reports_mfu_against_it(tmp_path, peaks_path):
    calibrated = run_cli_in_process(
        "devices",
        "--calibrate",
        "--device",
        "cpu",
        "--seconds",
        "0.1",
        "--matrix-size",
        "256",
        cwd=tmp_path,
        env={"AUTOTUNE_PEAKS_FILE": str(peaks_path)},
    )
    assert calibrated.returncode == 0, calibrated.stderr
    assert "measured peak cpu fp32:" in calibrated.stdout and "measured peak cpu bf16:" in calibrated.stdout
    stored = json.loads(peaks_path.read_text())
    (record,) = stored.values()
    assert record["peaks_tflops"]["fp32"] > 0 and record["peaks_tflops"]["bf16"] > 0
    assert record["bandwidth_gb_s"] > 0 and "measured memory bandwidth cpu:" in calibrated.stdout
    # The CPU's per-element rates the throughput prior reads: each timed, between 0.1 and 1000 ns an element.
    assert set(record["op_rates"]) == {"dropout_s_per_element", "loss_s_per_logit"}
    assert all(1e-10 < rate < 1e-6 for rate in record["op_rates"].values()), record["op_rates"]
    assert "dropout's mask" in calibrated.stdout and "cross-entropy forward and backward" in calibrated.stdout
    assert "*" in calibrated.stdout.split("Devices")[-1]  # the table shows the measured peaks

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    searched = run_cli_in_process(
        "search",
        "--model",
        "bert-tiny",
        "--space",
        str(REPO / "search_spaces" / "tiny-test.yaml"),
        "--storage",
        storage,
        "--trials",
        "1",
        "--work-dir",
        str(tmp_path / "runs"),
        *FAST_SEARCH_ARGS,
        cwd=tmp_path,
        env={"AUTOTUNE_PEAKS_FILE": str(peaks_path)},
    )
    assert searched.returncode == 0, searched.stderr
    assert "MFU* against the measured peaks" in searched.stdout
    assert "%*" in searched.stdout  # the MFU cell against the measured peak
    # The study also holds queued seed trials (HF default, best practice): look at the one that ran.
    (trial,) = [t for t in optuna.load_study(study_name=None, storage=storage).trials if t.state.is_finished()]
    result = trial.user_attrs["result"]
    assert result["status"] == "ok"
    assert result["measured_peak_tflops"] == record["peaks_tflops"][result["peak_dtype"]]
    assert result["mfu_measured"] == pytest.approx(result["model_tflops"] / result["measured_peak_tflops"])
    assert result["mfu"] is None  # a CPU has no datasheet peak


def test_the_memory_bandwidth_is_stored_beside_the_peaks_and_kept_by_a_later_calibration(cpu, peaks_path):
    from autotune.spec.measured_peaks import load_measured_bandwidth

    assert load_measured_bandwidth(cpu.name) is None
    save_calibration(cpu, [MeasuredMatmulPeak("fp32", 0.5, 0.4, 256, 5)], bandwidth_gb_s=12.5)
    assert load_measured_bandwidth(cpu.name) == 12.5
    save_calibration(cpu, [MeasuredMatmulPeak("bf16", 1.5, 1.2, 256, 5)])
    assert load_measured_bandwidth(cpu.name) == 12.5


def test_a_cpus_timed_rates_are_stored_kept_and_win_over_the_priors_constants(cpu, peaks_path):
    """The per-element rates a CPU's calibration timed replace the prior's constants (measured on one EPYC);
    a later calibration that times none keeps them; a GPU's prior never reads them."""
    from autotune.estimate import speed_prior
    from autotune.spec.devices import known_gpu
    from autotune.spec.measured_peaks import load_measured_op_rates

    assert load_measured_op_rates(cpu.name) == {}
    timed = {"dropout_s_per_element": 3e-9, "loss_s_per_logit": 2e-8}
    save_calibration(cpu, [MeasuredMatmulPeak("fp32", 0.5, 0.4, 256, 5)], 12.5, timed)
    save_calibration(cpu, [MeasuredMatmulPeak("bf16", 1.5, 1.2, 256, 5)])
    assert load_measured_op_rates(cpu.name) == timed
    fit = speed_prior(cpu, {}, measured_op_rates=load_measured_op_rates(cpu.name))
    assert (fit.dropout_s_per_element, fit.loss_s_per_logit) == (3e-9, 2e-8)
    untimed = speed_prior(cpu, {})
    assert untimed.dropout_s_per_element > 0 and untimed.loss_s_per_logit > 0 and untimed.loss_s_per_logit != 2e-8
    gpu = speed_prior(known_gpu("h100-sxm").device(), {}, measured_op_rates=timed)
    assert (gpu.dropout_s_per_element, gpu.loss_s_per_logit) == (0.0, 0.0)
