"""What a first run on a real GPU meets (issue 23), on the CPU: torch's own TF32 views, the CUDA failure
texts classified as the child classifies them, and the device's total through a FakeNvml (no GPU here)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from autotune.runner._failures import is_oom_exception, library_failure
from autotune.runner._limits import allocator_read_back
from autotune.runner._precision import align_legacy_tf32, cuda_matmul_precision
from autotune.spec.ceiling import parse_ceiling
from autotune.spec.devices import cuda_device, known_gpu
from autotune.units import GiB, MiB
from tests.runner.test_cuda_fakes import FakeNvml, FakeNvmlDevice

# torch's cuBLAS handle check (aten/src/ATen/cuda/CublasHandlePool.cpp).
CUBLAS_INIT = "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"


@pytest.fixture
def restored_fp32_precision():
    """torch's global precision settings as they were before the test."""
    saved = (
        torch.backends.fp32_precision,
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.mkldnn.matmul.fp32_precision,
    )
    yield
    torch.backends.fp32_precision = saved[0]
    torch.backends.cuda.matmul.fp32_precision = saved[1]
    torch.backends.mkldnn.matmul.fp32_precision = saved[2]
    torch.backends.cuda.matmul.allow_tf32 = saved[1] == "tf32"  # both views agree again


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_after_transformers_sets_tf32_through_the_new_api_the_legacy_getters_agree(restored_fp32_precision, precision):
    # What transformers' enable_tf32 does on torch >= 2.9 (transformers/utils/import_utils.py).
    torch.backends.fp32_precision = precision
    if precision == "tf32":
        # The mismatch inductor meets, reproduced on this CPU torch: the legacy getter raises.
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            _ = torch.backends.cuda.matmul.allow_tf32
    cpu_precision = torch.backends.mkldnn.matmul.fp32_precision
    align_legacy_tf32(torch)
    assert torch.backends.cuda.matmul.allow_tf32 is (precision == "tf32")
    assert torch.get_float32_matmul_precision() == ("high" if precision == "tf32" else "highest")
    assert cuda_matmul_precision(torch) == precision  # the precision that runs is unchanged
    assert torch.backends.mkldnn.matmul.fp32_precision == cpu_precision


def test_cublas_not_initialized_is_oom_only_under_memory_pressure_and_otherwise_names_the_library():
    assert not is_oom_exception(RuntimeError(CUBLAS_INIT))
    assert is_oom_exception(RuntimeError(CUBLAS_INIT), memory_pressure=True)
    wrapped = RuntimeError("the Trainer failed")
    wrapped.__cause__ = RuntimeError(CUBLAS_INIT)
    assert is_oom_exception(wrapped, memory_pressure=True)
    note = library_failure(wrapped)
    assert note is not None and note.startswith("cuBLAS could not initialise") and "driver" in note
    assert library_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None


# ------------------------------------------------------------------ the ceiling's total (FakeNvml: no GPU here)


@pytest.fixture
def fake_nvml(monkeypatch):
    nvml = FakeNvml([])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nvml


def h100(**kwargs) -> FakeNvmlDevice:
    # nvidia-smi's total on an H100 80GB; CUDA's total is 79.11 GiB (docs/facts.md): the reserve is the rest.
    total = 81559 * MiB
    return FakeNvmlDevice(
        "NVIDIA H100 80GB HBM3", "GPU-h100", total, 600 * MiB, (9, 0), reserved=total - int(79.11 * GiB), **kwargs
    )


def test_the_devices_total_is_what_cuda_can_allocate_not_nvmls_total(fake_nvml):
    fake_nvml.devices = [h100()]
    device = cuda_device(0)
    assert device.total_memory_bytes == int(79.11 * GiB)
    assert parse_ceiling("0.9", device.total_memory_bytes) == int(0.9 * int(79.11 * GiB))
    assert known_gpu("h100-sxm").device().total_memory_bytes == device.total_memory_bytes


def test_without_nvmls_v2_memory_info_the_total_is_nvmls(fake_nvml):
    fake_nvml.devices = [h100(has_memory_info_v2=False)]
    assert cuda_device(0).total_memory_bytes == 81559 * MiB


# --------------------------------------------- the allocator setting torch applied (FakeCudaAllocator: no GPU)


class FakeCudaAllocator:
    """``torch`` as far as :func:`allocator_read_back` reads it: ``torch.cuda.memory._snapshot()``, whose
    ``allocator_settings`` say what the CUDA caching allocator applied (pytorch/pytorch#183387's reading)."""

    def __init__(self, snapshot: dict) -> None:
        self.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(_snapshot=lambda: snapshot))


def test_the_allocator_setting_is_read_back_from_torch_not_from_the_variable(monkeypatch):
    # The variable asks for expandable segments; a torch that ignores the name runs without them.
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    ignored = FakeCudaAllocator({"segments": [], "allocator_settings": {"expandable_segments": False}})
    assert allocator_read_back(ignored) == {"allocator_expandable_segments": "false"}
    applied = FakeCudaAllocator({"segments": [], "allocator_settings": {"expandable_segments": True}})
    assert allocator_read_back(applied) == {"allocator_expandable_segments": "true"}
    assert allocator_read_back(FakeCudaAllocator({"segments": []})) == {}  # a torch whose snapshot lacks them
