"""The CUDA path without a GPU: fakes, named as such, that behave as the documented APIs do, driving the
real probe, classifier, device discovery and ceiling code.

* ``FakeNvml`` answers as nvidia-ml-py's ``pynvml`` does (the functions autotune calls, with the same
  names and return shapes; ``usedGpuMemory`` ``None`` as pynvml maps NVML_VALUE_NOT_AVAILABLE), for a
  bare-metal GPU, a container (per-process entries carry host PIDs), and a GPU split into MIG slices.
* ``FakeCudaMemory`` answers as ``torch.cuda``'s memory statistics do.
* The OOM texts are the exact messages torch, cuBLAS, cuDNN and Triton raise.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types

import pytest

from autotune.errors import AutotuneError
from autotune.runner import child_environment
from autotune.runner._failures import is_oom_exception, memory_pressure
from autotune.runner._memory_probe import CudaMemoryProbe, CudaReadings, cuda_peaks, failure_memory_pressure
from autotune.spec.ceiling import fits, parse_ceiling
from autotune.spec.devices import cuda_device
from autotune.spec.nvml_devices import visible_device_id

MiB = 1024**2
GiB = 1024**3


# ---------------------------------------------------------------------------------------------- fakes


class FakeNvmlError(Exception):
    """pynvml.NVMLError: raised for NOT_FOUND, NOT_SUPPORTED, ..."""


@dataclasses.dataclass
class FakeNvmlProcess:
    """One entry of nvmlDeviceGetComputeRunningProcesses (pynvml's c_nvmlProcessInfo_t)."""

    pid: int
    usedGpuMemory: int | None


@dataclasses.dataclass
class FakeNvmlDevice:
    """A GPU or a MIG slice as NVML describes it."""

    name: str
    uuid: str
    total: int
    used: int
    compute_capability: tuple[int, int]
    processes: list[FakeNvmlProcess] = dataclasses.field(default_factory=list)
    mig_enabled: bool = False
    mig_slices: list[FakeNvmlDevice] = dataclasses.field(default_factory=list)
    parent: FakeNvmlDevice | None = None
    gpu_instance_id: int = 0
    reserved: int = 0  # what nvmlDeviceGetMemoryInfo_v2 reports reserved by the driver and firmware
    has_memory_info_v2: bool = True  # False: an older driver ("Function Not Found")


class FakeNvml(types.ModuleType):
    """pynvml as nvidia-ml-py ships it, over a list of fake devices."""

    NVML_DEVICE_MIG_ENABLE = 1
    nvmlMemory_v2 = 0x02000028  # pynvml's version tag of nvmlMemory_v2_t
    NVMLError = FakeNvmlError

    def __init__(self, devices: list[FakeNvmlDevice]) -> None:
        super().__init__("pynvml")
        self.devices = devices

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlDevice:
        if index >= len(self.devices):
            raise FakeNvmlError("Invalid Argument")
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeNvmlDevice:
        for device in self.devices:
            for candidate in [device, *device.mig_slices]:
                if candidate.uuid == uuid:
                    return candidate
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetName(self, handle: FakeNvmlDevice) -> str:
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeNvmlDevice) -> str:
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeNvmlDevice, version: int | None = None):
        if version is None:  # v1: ``used`` includes the reserve
            return types.SimpleNamespace(total=handle.total, used=handle.used, free=handle.total - handle.used)
        if not handle.has_memory_info_v2:
            raise FakeNvmlError("Function Not Found")
        free = handle.total - handle.used
        return types.SimpleNamespace(
            version=version, total=handle.total, reserved=handle.reserved, free=free, used=handle.used - handle.reserved
        )

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeNvmlDevice) -> tuple[int, int]:
        if handle.parent is not None:
            raise FakeNvmlError("Not Supported")  # asked of the parent, as autotune does
        return handle.compute_capability

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeNvmlDevice) -> list[FakeNvmlProcess]:
        return list(handle.processes)

    def nvmlDeviceIsMigDeviceHandle(self, handle: FakeNvmlDevice) -> bool:
        return handle.parent is not None

    def nvmlDeviceGetMigMode(self, handle: FakeNvmlDevice) -> tuple[int, int]:
        mode = self.NVML_DEVICE_MIG_ENABLE if handle.mig_enabled else 0
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeNvmlDevice) -> int:
        return 7 if handle.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeNvmlDevice, index: int) -> FakeNvmlDevice:
        if index >= len(handle.mig_slices):
            raise FakeNvmlError("Not Found")
        return handle.mig_slices[index]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeNvmlDevice) -> FakeNvmlDevice:
        assert handle.parent is not None
        return handle.parent

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeNvmlDevice) -> int:
        return handle.gpu_instance_id


def a100_split_in_mig_slices() -> FakeNvmlDevice:
    parent = FakeNvmlDevice("NVIDIA A100-SXM4-40GB", "GPU-5f1c0a3e-aaaa", 40 * GiB, 0, (8, 0), mig_enabled=True)
    for gi, (profile, size) in enumerate([("3g.20gb", 20 * GiB), ("2g.10gb", 10 * GiB), ("1g.5gb", 5 * GiB)]):
        parent.mig_slices.append(
            FakeNvmlDevice(
                f"NVIDIA A100-SXM4-40GB MIG {profile}",
                f"MIG-9d3e1b7c-000{gi}",
                size - 256 * MiB,
                13 * MiB,
                (8, 0),
                parent=parent,
                gpu_instance_id=gi + 1,
            )
        )
    return parent


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a FakeNvml as ``pynvml``; the test fills in its devices."""
    nvml = FakeNvml([])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


class FakeCudaMemory:
    """``torch.cuda``'s memory statistics as one trial process would report them at its end."""

    def __init__(self, total: int, device_used: int, reserved: int, max_reserved: int, max_allocated: int) -> None:
        self.total, self.device_used = total, device_used
        self.reserved, self.max_reserved, self.max_allocated = reserved, max_reserved, max_allocated

    def synchronize(self) -> None:
        pass

    def mem_get_info(self) -> tuple[int, int]:
        return self.total - self.device_used, self.total  # (free, total), as cudaMemGetInfo

    def memory_reserved(self) -> int:
        return self.reserved

    def max_memory_reserved(self) -> int:
        return self.max_reserved

    def max_memory_allocated(self) -> int:
        return self.max_allocated

    def is_initialized(self) -> bool:
        return True


def probe_with(fake_cuda: FakeCudaMemory) -> CudaMemoryProbe:
    """The real CudaMemoryProbe (its NVML reading before the context taken now), reading FakeCudaMemory."""
    probe = CudaMemoryProbe()
    probe._torch = types.SimpleNamespace(cuda=fake_cuda)
    return probe


# ------------------------------------------------------------------- 3. memory outside the allocator


def test_in_a_container_nvml_lists_host_pids_and_the_probe_falls_back_to_nvmls_own_device_delta(fake_nvml):
    gpu = FakeNvmlDevice("NVIDIA A100-SXM4-80GB", "GPU-1", 80 * GiB, used=600 * MiB, compute_capability=(8, 0))
    fake_nvml.devices = [gpu]
    probe = probe_with(FakeCudaMemory(80 * GiB, device_used=0, reserved=0, max_reserved=0, max_allocated=0))
    assert probe._nvml_device_used_before == 600 * MiB  # NVML's "used" counts driver-reserved memory
    # Training: the allocator reserves 10 GiB (12 at its peak); context and workspaces 700 MiB more.
    # NVML lists the process under its host PID, never this container's os.getpid().
    gpu.used += 10 * GiB + 700 * MiB
    gpu.processes = [FakeNvmlProcess(pid=os.getpid() + 4242, usedGpuMemory=10 * GiB + 700 * MiB)]
    # cudaMemGetInfo leaves out the 600 MiB the driver reserves: mixing it with NVML's "before"
    # (the old fallback) would have said 10.7 GiB - 0.6 GiB - 10 GiB = 100 MiB outside.
    probe._torch.cuda.device_used = 10 * GiB + 700 * MiB
    probe._torch.cuda.reserved, probe._torch.cuda.max_reserved = 10 * GiB, 12 * GiB
    peaks = probe.peaks()
    assert probe.notes() == {"outside_allocator_source": "nvml_device_delta"}
    assert peaks["outside_allocator_bytes"] == 700 * MiB
    assert peaks["peak_device_bytes"] == 12 * GiB + 700 * MiB
    assert "nvml_process_used_bytes" not in peaks
    assert peaks["device_total_bytes"] == 80 * GiB


def test_nvml_per_process_figure_wins_where_it_sees_this_pid(fake_nvml):
    gpu = FakeNvmlDevice("NVIDIA H100 80GB HBM3", "GPU-2", 80 * GiB, used=4 * GiB, compute_capability=(9, 0))
    fake_nvml.devices = [gpu]
    probe = probe_with(FakeCudaMemory(80 * GiB, device_used=0, reserved=0, max_reserved=0, max_allocated=0))
    gpu.used += 6 * GiB + 500 * MiB  # another process's 4 GiB were there before: the delta is exact too
    gpu.processes = [FakeNvmlProcess(pid=1, usedGpuMemory=4 * GiB), FakeNvmlProcess(os.getpid(), 6 * GiB + 500 * MiB)]
    probe._torch.cuda.device_used = 10 * GiB + 500 * MiB
    probe._torch.cuda.reserved, probe._torch.cuda.max_reserved = 6 * GiB, 7 * GiB
    peaks = probe.peaks()
    assert probe.notes()["outside_allocator_source"] == "nvml_process"
    assert peaks["outside_allocator_bytes"] == 500 * MiB
    assert peaks["outside_allocator_nvml_device_delta_bytes"] == 500 * MiB  # both NVML: they agree
    assert peaks["peak_device_bytes"] == 7 * GiB + 500 * MiB


def readings(**overrides: int | None) -> CudaReadings:
    values = dict(
        max_reserved=6 * GiB,
        max_allocated=5 * GiB,
        reserved_now=4 * GiB,
        cuda_device_used_now=9 * GiB,
        nvml_device_used_before=4 * GiB,
        nvml_device_used_now=9 * GiB + 300 * MiB,
        nvml_process_used=4 * GiB + 700 * MiB,
    )
    values.update(overrides)
    return CudaReadings(**values)  # type: ignore[arg-type]  # the fake's readings, each of its field's type


def test_an_nvml_per_process_value_below_what_the_allocator_holds_is_discarded():
    peaks, source = cuda_peaks(readings(nvml_process_used=1 * GiB))  # less than the 4 GiB reserved: not ours
    assert source == "nvml_device_delta"
    assert peaks["nvml_process_discarded_bytes"] == 1 * GiB
    assert peaks["outside_allocator_bytes"] == 1 * GiB + 300 * MiB


def test_no_part_is_ever_negative_and_the_last_resort_is_cudas_own_device_wide_use():
    # NVML unreadable; the allocator holds more than CUDA's device-wide figure says (a reading race).
    peaks, source = cuda_peaks(
        readings(nvml_process_used=None, nvml_device_used_before=None, cuda_device_used_now=3 * GiB)
    )
    assert source == "cuda_device_used"
    assert peaks["outside_allocator_bytes"] == 0
    assert peaks["peak_device_bytes"] == 6 * GiB
    # NVML "now" below "before" (another process exited meanwhile): zero, not negative.
    peaks, _ = cuda_peaks(readings(nvml_process_used=None, nvml_device_used_now=2 * GiB))
    assert peaks["outside_allocator_nvml_device_delta_bytes"] == 0
    assert all(value >= 0 for value in peaks.values())


# ----------------------------------------------------------------------- 4. every GPU OOM is an OOM

# The exact texts: torch's cuBLAS handle check (aten/src/ATen/cuda/CublasHandlePool.cpp), torch's
# driver-API check (c10/cuda/driver_api.h), Triton's launcher (pytorch/pytorch#98186), cuDNN through
# torch's checks (aten/src/ATen/cudnn/Exceptions.h).
DRIVER_OOM = "CUDA driver error: out of memory"
TRITON_OOM = "Triton Error [CUDA]: out of memory"
CUDNN_UNSUPPORTED = (
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."
)


@pytest.mark.parametrize("text", [DRIVER_OOM, TRITON_OOM])
def test_driver_and_triton_out_of_memory_are_oom(text):
    assert is_oom_exception(RuntimeError(text))
    wrapped = RuntimeError("the Trainer failed")
    wrapped.__cause__ = RuntimeError(text)
    assert is_oom_exception(wrapped)


def test_tritons_shared_memory_limit_is_not_device_memory():
    assert not is_oom_exception(RuntimeError("triton.runtime.errors.OutOfResources: out of resource: shared memory"))


def test_cudnn_not_supported_is_oom_only_under_memory_pressure(monkeypatch):
    assert not is_oom_exception(RuntimeError(CUDNN_UNSUPPORTED))
    assert is_oom_exception(RuntimeError(CUDNN_UNSUPPORTED), memory_pressure=True)
    assert memory_pressure(reserved_bytes=15 * GiB, total_bytes=16 * GiB)
    assert not memory_pressure(reserved_bytes=2 * GiB, total_bytes=16 * GiB, free_bytes=13 * GiB)
    assert memory_pressure(reserved_bytes=2 * GiB, total_bytes=16 * GiB, free_bytes=512 * MiB)  # others hold it
    # The child's reading, from torch.cuda at the failure (FakeCudaMemory in place of a GPU).
    import torch

    fake = FakeCudaMemory(
        16 * GiB, device_used=int(15.5 * GiB), reserved=3 * GiB, max_reserved=15 * GiB, max_allocated=14 * GiB
    )
    for name in ("is_initialized", "mem_get_info", "max_memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    assert failure_memory_pressure()  # the allocator let its cache go on the failure; its peak says 15 of 16 GiB
    fake.max_reserved, fake.device_used = 4 * GiB, 4 * GiB
    assert not failure_memory_pressure()


# --------------------------------------------------------------------------------- 5. device identity


def test_cuda_visible_devices_as_gpu_uuids(fake_nvml, monkeypatch):
    fake_nvml.devices = [
        FakeNvmlDevice("NVIDIA A100-SXM4-80GB", "GPU-aaaa", 80 * GiB, 0, (8, 0)),
        FakeNvmlDevice("NVIDIA H100 80GB HBM3", "GPU-bbbb", int(79.6 * GiB), 0, (9, 0)),
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,GPU-aaaa")
    device = cuda_device(0)
    assert device.name == "NVIDIA H100 80GB HBM3" and device.compute_capability == (9, 0)
    assert child_environment(device)["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"  # the child sees that one GPU
    assert cuda_device(1).name == "NVIDIA A100-SXM4-80GB"
    with pytest.raises(AutotuneError, match="not among CUDA_VISIBLE_DEVICES"):
        cuda_device(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc")
    with pytest.raises(AutotuneError, match="NVML knows no device GPU-cccc"):
        cuda_device(0)


def test_on_a_mig_slice_the_device_and_the_ceiling_are_the_slices(fake_nvml, monkeypatch):
    parent = a100_split_in_mig_slices()
    fake_nvml.devices = [parent]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-9d3e1b7c-0001")
    device = cuda_device(0)
    assert device.name.endswith("MIG 2g.10gb")
    assert device.total_memory_bytes == 10 * GiB - 256 * MiB  # the slice, not the parent's 40 GiB
    assert device.compute_capability == (8, 0) and "bf16" in device.supported_dtypes
    assert parse_ceiling("0.9", device.total_memory_bytes) == int(0.9 * (10 * GiB - 256 * MiB))
    assert not fits(12 * GiB, parse_ceiling("0.9", device.total_memory_bytes))
    assert device.datasheet_peak_tflops("bf16") is None  # a slice's peak is not the whole A100's
    assert child_environment(device)["CUDA_VISIBLE_DEVICES"] == "MIG-9d3e1b7c-0001"
    # The child's NVML readings are the slice's too.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-9d3e1b7c-0001")
    from autotune.runner._nvml import nvml_device_used_bytes

    assert nvml_device_used_bytes() == 13 * MiB


def test_the_older_mig_gpu_uuid_gi_ci_form_names_the_gpu_instance(fake_nvml, monkeypatch):
    fake_nvml.devices = [a100_split_in_mig_slices()]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-5f1c0a3e-aaaa/3/0")
    assert cuda_device(0).name.endswith("MIG 1g.5gb")


def test_a_gpu_in_mig_mode_named_by_index_is_refused_with_its_instances(fake_nvml, monkeypatch):
    fake_nvml.devices = [a100_split_in_mig_slices()]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(AutotuneError, match="MIG mode.*CUDA_VISIBLE_DEVICES=MIG-9d3e1b7c-0000,MIG-9d3e1b7c-0001"):
        cuda_device(0)


def test_visible_device_id_passes_indices_through(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert visible_device_id(1) == "1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_device_id(2) == "2"


def test_a_rank_of_a_multi_gpu_trial_reads_its_own_gpu_through_nvml(fake_nvml, monkeypatch):
    from autotune.runner._nvml import nvml_device_used_bytes

    fake_nvml.devices = [
        FakeNvmlDevice("NVIDIA H100 80GB HBM3", f"GPU-{i}", int(79.6 * GiB), (i + 1) * MiB, (9, 0)) for i in range(8)
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the trial's group (runner._limits.ranks_environment)
    monkeypatch.setenv("LOCAL_RANK", "2")  # set by torch's launcher
    assert nvml_device_used_bytes() == 7 * MiB  # GPU 6: the rank's own, not the group's first
