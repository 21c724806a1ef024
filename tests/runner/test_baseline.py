"""The CPU prior's process baseline (estimate/_baseline.py): measured in a real subprocess once per
installation, cached, and the documented constant where it cannot be measured.

The measuring interpreter imports a light module here instead of torch and transformers (seconds
each): what is tested is the measurement, the cache and the fallback, not the figure of torch."""

from __future__ import annotations

import json

import pytest

from autotune.estimate import FALLBACK_CPU_PROCESS_BASELINE_BYTES, memory_prior
from autotune.runner import _baseline
from autotune.runner._job import trial_memory_prior

MiB = 1024**2


@pytest.fixture
def light_cache(monkeypatch, tmp_path):
    """An empty cache directory and a light import list; the in-process memo cleared before and after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(_baseline, "CPU_TRIAL_PROCESS_IMPORTS", ("json",))
    _baseline.cpu_process_baseline_bytes.cache_clear()
    yield tmp_path / "cache" / "autotune" / "process_baseline.json"
    _baseline.cpu_process_baseline_bytes.cache_clear()


@pytest.mark.slow
def test_the_baseline_is_measured_once_and_read_back_from_the_cache(light_cache, monkeypatch, cpu):
    measured = _baseline.cpu_process_baseline_bytes()
    stored = json.loads(light_cache.read_text())[_baseline.installation_key()]
    assert measured == stored["VmRSS"] == stored["RssAnon"] + stored["RssFile"] + stored["RssShmem"]
    assert 4 * MiB < measured < FALLBACK_CPU_PROCESS_BASELINE_BYTES  # an interpreter with json, not torch
    assert trial_memory_prior(cpu, {}, 1).context_bytes == measured  # the planner's and the search's prior

    def no_second_measurement() -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(_baseline, "_measure", no_second_measurement)
    _baseline.cpu_process_baseline_bytes.cache_clear()
    assert _baseline.cpu_process_baseline_bytes() == measured  # another process of the same installation


@pytest.mark.slow
def test_a_damaged_cache_is_measured_again(light_cache):
    light_cache.parent.mkdir(parents=True)
    light_cache.write_text("{not json")
    measured = _baseline.cpu_process_baseline_bytes()
    assert json.loads(light_cache.read_text())[_baseline.installation_key()]["VmRSS"] == measured


@pytest.mark.slow
def test_the_documented_constant_where_it_cannot_be_measured(light_cache, monkeypatch):
    monkeypatch.setattr(_baseline, "CPU_TRIAL_PROCESS_IMPORTS", ("autotune_no_such_module",))
    assert _baseline.cpu_process_baseline_bytes() == FALLBACK_CPU_PROCESS_BASELINE_BYTES
    assert not light_cache.exists()  # nothing cached: the next process tries again


def test_the_cuda_prior_measures_nothing(light_cache, monkeypatch):
    from autotune.spec.devices import DeviceSpec

    monkeypatch.setattr(_baseline, "_measure", lambda: pytest.fail("measured for a GPU"))
    gpu = DeviceSpec(
        kind="cuda",
        index=0,
        name="FakeGPU",
        total_memory_bytes=16 * 1024**3,
        supported_dtypes=("fp32",),
        compute_capability=(8, 0),
    )
    assert memory_prior(gpu, {}).context_bytes == int(0.6 * 1024**3)
