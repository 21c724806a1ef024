"""The memory model's prior: the parameters of ``peak = context * processes + fixed + scale * activations``
(:class:`MemoryFit`) and their values for a device before any trial (:func:`memory_prior`). The planner
(``autotune estimate``), the seeds, the screening and the sampler all start from it, so they predict the
same peak before any trial; :mod:`autotune.estimate._fit` calibrates it on a study's measured peaks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from autotune.spec.devices import DeviceSpec
from autotune.units import GiB

MiB = 1024**2

# A forkserver trial child's resident set before it builds a model (python + torch + transformers
# imported), measured in a long-lived venv here (docs/benchmarks-archive.md, "Fidelity").
CPU_CHILD_START_RSS_BYTES = int(0.40 * GiB)
# The library pages a fresh process maps and a forkserver child does not, which the CPU probe adds
# (runner.unmapped_import_file_bytes): 114 MiB measured in the same venv.
CPU_UNMAPPED_LIBRARY_BYTES = int(0.10 * GiB)
# The baseline where it cannot be measured (no /proc, the subprocess failed): the two figures above.
FALLBACK_CPU_PROCESS_BASELINE_BYTES = CPU_CHILD_START_RSS_BYTES + CPU_UNMAPPED_LIBRARY_BYTES

# Before any trial is measured. CPU: one process's baseline, measured for this installation by
# memory_prior (_baseline.cpu_process_baseline_bytes); this constant where it is not measured (the
# arithmetic of MemoryFit.prior alone). CUDA: a generation's context (CUDA_CONTEXT_BYTES) where the
# compute capability is known, else the Ampere figure.
PRIOR_CONTEXT_BYTES = {"cpu": FALLBACK_CPU_PROCESS_BASELINE_BYTES, "cuda": int(0.6 * GiB)}

# The CUDA prior: what nvidia-smi shows for a training process beyond its live tensors. Evidence for
# each figure, and the prior's expected error, in docs/estimator.md ("The CUDA prior").
# The CUDA context with the kernels a training run loads into it, by the compute capability's major
# version: about 300-400 MB right after initialisation with lazy module loading (CUDA >= 11.7, the
# default in PyTorch; pytorch/pytorch#107667, #109888), more once cuBLAS, cuDNN and torch's training
# kernels are loaded; newer architectures carry larger kernel images.
CUDA_CONTEXT_BYTES = {7: int(0.5 * GiB), 8: int(0.6 * GiB), 9: int(0.7 * GiB)}
# cuBLAS's workspace per handle, allocated through the caching allocator: torch's default
# CUBLAS_WORKSPACE_CONFIG is ":4096:8" (32 MiB) on Hopper and newer, ":4096:2:16:8" (8 MiB + 128 KiB)
# before (aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize, following the cuBLAS docs'
# cublasSetWorkspace advice). cuBLASLt gets a workspace of the same size: two per process.
CUBLAS_WORKSPACE_BYTES = {7: 4096 * 1024 * 2 + 16 * 1024 * 8, 8: 4096 * 1024 * 2 + 16 * 1024 * 8, 9: 4096 * 1024 * 8}
CUBLAS_WORKSPACES = 2
# Reserved over allocated at the peak, as a share of the memory that is allocated and freed every
# step (activations, logits, gradients): freed blocks split by later requests, 2 MiB rounding of
# large blocks, 1-10 MiB requests carved from 20 MiB segments, small ones from 2 MiB segments
# (torch/include/c10/core/AllocatorConfig.h: kSmallBuffer, kMinLargeAlloc, kRoundLarge). With
# expandable_segments the allocator maps 2 MiB pages into one growing segment and little is left
# between blocks (pytorch/pytorch#96995).
ALLOCATOR_FRAGMENTATION_SHARE = {"default": 0.15, "expandable_segments": 0.05}
# CPU resident memory runs ahead of the tensors alive: freed blocks stay in malloc's arenas. The
# prior activation scale says so (fitted on bert-mini, docs/benchmarks.md); the fit replaces it.
PRIOR_ACTIVATION_SCALE = {"cpu": 1.1, "cuda": 1.0}
# How far the prior may be off before any trial calibrates it (docs/estimator.md, "The CUDA prior":
# within +-25 %): screening runs a config predicted up to this factor over the ceiling, a search stops
# before its first trial only when every config is predicted over it, and ``auto``'s small micro-batches
# stay searched unless the next larger one is predicted under the ceiling by this factor.
UNCALIBRATED_MARGIN = 1.25


@dataclasses.dataclass(frozen=True)
class MemoryFit:
    """The memory model's corrections: ``peak = context * processes + fixed + scale * activations``.

    Before any trial they are the device's prior (:func:`memory_prior`); :func:`fit_memory` fits
    them on a study's measured peaks.

    Attributes:
        device_kind: ``cpu`` or ``cuda``.
        context_bytes: One process's baseline (CPU) or the CUDA context (GPU).
        activation_scale: Multiplies the activations (the model's least certain part).
        points: Measured trials the fit used (0: the priors).
        max_relative_error: Worst ``|predicted - measured| / measured`` over those trials after
            the fit; ``None`` with no points.
        ranks: Processes one trial spans (``--devices-per-trial``); the estimate is one rank's
            (:func:`autotune.estimate._parts.ddp_bucket_bytes`). Set by ``Workload.memory_prior``.
    """

    device_kind: str
    context_bytes: int
    activation_scale: float
    points: int = 0
    max_relative_error: float | None = None
    allocator_share: float = 0.0
    workspace_bytes: int = 0
    ranks: int = 1

    @classmethod
    def prior(
        cls, device_kind: str, compute_capability: tuple[int, int] | None = None, expandable_segments: bool = False
    ) -> MemoryFit:
        """The figures before any trial is measured.

        Args:
            device_kind: ``cpu`` or ``cuda``.
            compute_capability: On CUDA, the GPU's (its generation picks the context and the
                cuBLAS workspace); ``None``: the Ampere figures.
            expandable_segments: The allocator runs with ``expandable_segments:True``
                (``PYTORCH_ALLOC_CONF``), which leaves less fragmentation.
        """
        if device_kind != "cuda":
            return cls(device_kind, PRIOR_CONTEXT_BYTES[device_kind], PRIOR_ACTIVATION_SCALE[device_kind])
        major = min(max((compute_capability or (8, 0))[0], 7), 9)
        return cls(
            device_kind=device_kind,
            context_bytes=CUDA_CONTEXT_BYTES[major] if compute_capability else PRIOR_CONTEXT_BYTES["cuda"],
            activation_scale=PRIOR_ACTIVATION_SCALE[device_kind],
            allocator_share=ALLOCATOR_FRAGMENTATION_SHARE["expandable_segments" if expandable_segments else "default"],
            workspace_bytes=CUBLAS_WORKSPACES * CUBLAS_WORKSPACE_BYTES[major],
        )

    def describe(self) -> str:
        """One line a user can read: what the corrections are and where they come from."""
        context = f"context {self.context_bytes / GiB:.2f} GiB"
        scale = f"activation scale {self.activation_scale:.2f}"
        if self.allocator_share or self.workspace_bytes:
            scale += (
                f", allocator {self.allocator_share:.0%} of per-step memory + {self.workspace_bytes / MiB:.0f} MiB "
                "cuBLAS workspaces (docs/estimator.md)"
            )
        if not self.points:
            return f"prior ({context}, {scale}; not calibrated: no measured trial)"
        error = f", worst error {self.max_relative_error:.1%}" if self.max_relative_error is not None else ""
        return f"calibrated on {self.points} measured trial(s) ({context}, {scale}{error})"


def expandable_segments_enabled(environ: Mapping[str, str]) -> bool:
    """Whether the allocator settings in ``environ`` turn expandable segments on (PYTORCH_ALLOC_CONF
    wins over PYTORCH_CUDA_ALLOC_CONF, torch/include/c10/core/AllocatorConfig.h)."""
    conf = environ.get("PYTORCH_ALLOC_CONF") or environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    return "expandable_segments:true" in conf.replace(" ", "").lower()


def memory_prior(
    device: DeviceSpec, allocator_env: Mapping[str, str], cpu_process_baseline_bytes: int | None = None
) -> MemoryFit:
    """The one prior for a device: what every prediction starts from before a trial is measured.

    Args:
        device: The device the trials run on (on CUDA its compute capability picks the context and
            the cuBLAS workspaces).
        allocator_env: The caching allocator's settings the trials train under (``PYTORCH_ALLOC_CONF``
            / ``PYTORCH_CUDA_ALLOC_CONF``): expandable segments leave less fragmentation.
        cpu_process_baseline_bytes: On the CPU, the resident memory of a process that has imported what
            a trial child imports, measured for this installation by the runner
            (:func:`autotune.runner.cpu_process_baseline_bytes`); ``None``: the documented constant.

    On the CPU the process baseline is this installation's, measured once and cached
    (:func:`autotune.runner._baseline.cpu_process_baseline_bytes`: the library pages a trial holds
    move with the page cache, by about 90 MiB between a just-installed venv and a long-lived one).
    """
    prior = MemoryFit.prior(device.kind, device.compute_capability, expandable_segments_enabled(allocator_env))
    if device.kind == "cpu" and cpu_process_baseline_bytes is not None:
        return dataclasses.replace(prior, context_bytes=cpu_process_baseline_bytes)
    return prior
