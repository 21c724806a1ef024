"""Where a profiled trial's step time went (``autotune/runner/_step_profile.py`` records it; ``verify --profile``)."""

from __future__ import annotations

import dataclasses
from typing import Any

# Below this share of the step with a kernel running, the step is called host-bound: the device waited on Python,
# kernel launches, synchronisations or the data loader for over a fifth of it (a step that keeps a GPU fed runs
# its kernels back to back). A threshold of judgement for the printed word, not a measured constant.
HOST_BOUND_BELOW = 0.8


@dataclasses.dataclass(frozen=True)
class ProfiledOp:
    """One operator of the profiled steps: its self time (on the device on CUDA, else on the CPU) and calls."""

    name: str
    self_s: float
    calls: int


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """torch's profiler over a few optimizer steps after warm-up, in seconds over the whole profiled window.

    Attributes:
        steps: Optimizer steps profiled.
        wall_s: The window's wall time (device synchronised at both ends).
        time_of: Whose time the operators' self times are: ``device`` (CUDA kernels) or ``cpu``.
        operators_s: The operators' self time in all.
        device_busy_s: CUDA only: how long some kernel ran (the union of their intervals); ``None`` on a CPU.
        data_loader_s: Host time inside the data loader's ``__next__``.
        optimizer_s: Host time inside the optimizers' ``step`` (on CUDA their kernels run later, and show among
            the operators).
        top: The operators with most self time, most first.
        table: The file of torch's table of every operator, beside the run's log.
        trace: The file of the trace (Chrome's format, gzipped; https://ui.perfetto.dev opens it), beside the run's log.
    """

    steps: int
    wall_s: float
    time_of: str
    operators_s: float
    device_busy_s: float | None
    data_loader_s: float
    optimizer_s: float
    top: tuple[ProfiledOp, ...]
    table: str
    trace: str

    @property
    def step_s(self) -> float:
        return self.wall_s / self.steps

    def share(self, seconds: float) -> float:
        """``seconds`` of the window as a fraction of its wall time."""
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def host_bound(self) -> bool:
        """On CUDA: the device ran kernels for less than :data:`HOST_BOUND_BELOW` of the window."""
        return self.device_busy_s is not None and self.share(self.device_busy_s) < HOST_BOUND_BELOW

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> StepProfile:
        top = tuple(ProfiledOp(**op) for op in values.get("top", ()))
        return cls(**{**values, "top": top})
