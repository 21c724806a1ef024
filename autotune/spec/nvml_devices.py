"""Which NVML device a CUDA device number names, and how much of its memory CUDA can hand out.

A user's GPU number goes through ``CUDA_VISIBLE_DEVICES`` (indices, GPU UUIDs, MIG instances) before
NVML can describe it; :func:`autotune.spec.devices.cuda_device` and the trial child's NVML readings
(:mod:`autotune.runner._nvml`) both resolve it here, so the parent never creates a CUDA context.
"""

from __future__ import annotations

import os

from autotune.errors import AutotuneError


def cuda_allocatable_bytes(pynvml, handle) -> int:  # noqa: ANN001 - the pynvml module and its handle
    """The device memory CUDA can hand out: NVML's total less what NVML reports reserved.

    NVML's total (nvidia-smi's: 81,559 MiB on an H100 80GB) includes memory the driver and firmware
    reserve, about 0.5 GiB above ``cudaMemGetInfo``'s total (torch's OOM message: "total capacity of
    79.11 GiB" on an H100, vllm-project/vllm#27508). ``nvmlDeviceGetMemoryInfo_v2`` reports that
    reserve (NVML API reference, ``nvmlMemory_v2_t``: total, reserved, free, used; nvidia-ml-py's
    ``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)``). Where v2 is missing (an older
    driver or nvidia-ml-py) NVML's total is all there is. The trial child records CUDA's own total
    (``cuda_total_bytes`` in its runtime readings), which the acceptance compares with this.
    """
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        return int(info.total) - int(info.reserved)
    except (AttributeError, TypeError, pynvml.NVMLError):
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)


def visible_device_id(index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry that the user's GPU number ``index`` names.

    CUDA accepts indices, GPU UUIDs (``GPU-8c5b...``) and MIG instances (``MIG-<uuid>``, or the
    older ``MIG-GPU-<uuid>/<gi>/<ci>``) in ``CUDA_VISIBLE_DEVICES`` (CUDA C Programming Guide,
    "CUDA Environment Variables"; NVIDIA MIG User Guide, "CUDA Device Enumeration"). Without the
    variable the user's number is the NVML index itself.

    Raises:
        AutotuneError: ``index`` is beyond the entries the variable lists.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return str(index)
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if index >= len(ids):
        raise AutotuneError(f"--gpu {index} is not among CUDA_VISIBLE_DEVICES={visible}")
    return ids[index]


def physical_gpu_index(index: int) -> int:
    """Map the user's GPU number through ``CUDA_VISIBLE_DEVICES`` to an NVML index (indices only).

    Raises:
        AutotuneError: The variable names the device by UUID or MIG instance: use
            :func:`visible_device_id` and :func:`nvml_device_handle` for those.
    """
    device_id = visible_device_id(index)
    if not device_id.isdigit():
        raise AutotuneError(f"--gpu {index} is {device_id} in CUDA_VISIBLE_DEVICES: not an NVML index")
    return int(device_id)


def nvml_device_handle(pynvml, device_id: str, index: int):  # noqa: ANN001, ANN201 - pynvml and its handle
    """The NVML handle of a ``CUDA_VISIBLE_DEVICES`` entry: an index, a GPU UUID or a MIG instance.

    Raises:
        AutotuneError: No such device, or a GPU in MIG mode named by index (CUDA runs on a MIG
            instance only when it is named by its ``MIG-`` UUID; the message lists them).
    """
    if device_id.isdigit():
        count = pynvml.nvmlDeviceGetCount()
        if int(device_id) >= count:
            raise AutotuneError(f"--gpu {index}: this machine has {count} CUDA device(s), numbered from 0")
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(device_id))
        if _mig_enabled(pynvml, handle):
            raise AutotuneError(
                f"--gpu {index}: GPU {device_id} is in MIG mode; choose an instance with "
                f"CUDA_VISIBLE_DEVICES={_mig_uuids(pynvml, handle) or 'MIG-<uuid> (nvidia-smi -L lists them)'}"
            )
        return handle
    # MIG-GPU-<uuid>/<gi>/<ci> names the parent by its own GPU-<uuid>.
    uuid = device_id[len("MIG-") :].split("/", 1)[0] if device_id.startswith("MIG-GPU-") else device_id
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as exc:
        raise AutotuneError(f"--gpu {index}: NVML knows no device {device_id} ({exc})") from None
    if device_id.startswith("MIG-GPU-"):
        return _legacy_mig_handle(pynvml, handle, device_id, index)
    return handle


def _legacy_mig_handle(pynvml, parent, device_id: str, index: int):  # noqa: ANN001, ANN202 - pynvml ships no types
    """The MIG device ``MIG-GPU-<uuid>/<gi>/<ci>`` names: the parent's MIG device of that GPU instance."""
    try:
        gpu_instance = int(device_id.split("/")[1])
    except (IndexError, ValueError):
        raise AutotuneError(f"--gpu {index}: {device_id} is not MIG-GPU-<uuid>/<gi>/<ci>") from None
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
        except pynvml.NVMLError:
            continue
        if pynvml.nvmlDeviceGetGpuInstanceId(mig) == gpu_instance:
            return mig
    raise AutotuneError(f"--gpu {index}: GPU instance {gpu_instance} of {device_id} does not exist")


def is_mig_handle(pynvml, handle) -> bool:  # noqa: ANN001 - pynvml ships no types
    try:
        return bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle))
    except pynvml.NVMLError:
        return False  # a driver without MIG support


def _mig_enabled(pynvml, handle) -> bool:  # noqa: ANN001 - pynvml ships no types
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return False  # not MIG-capable (NVML_ERROR_NOT_SUPPORTED)
    return current == pynvml.NVML_DEVICE_MIG_ENABLE


def _mig_uuids(pynvml, parent) -> str:  # noqa: ANN001 - pynvml ships no types
    found = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot))
        except pynvml.NVMLError:
            continue
        found.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
    return ",".join(found)
