"""Real faults, injected into real trial children at a given training step.

Each class is a ``transformers.TrainerCallback`` that a trial loads by name through
``TrialJob.callbacks`` (or ``autotune search --callback tests.support.faults:Name``), inside the child,
after the model and the Trainer are built and training has begun. Nothing is simulated: the child
really segfaults, really gets SIGKILL, really runs out of address space.

Files a fault leaves for the test to read go next to the trial's own directory (the parent of the
Trainer's ``output_dir``, which is the search's ``--work-dir``).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import time
from pathlib import Path

from transformers import TrainerCallback

GiB = 1024**3


class FaultAtStep(TrainerCallback):
    """Calls :meth:`fire` at the start of optimizer step ``at_step`` (1-based), once training runs."""

    at_step = 2

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.at_step:
            self.fire(args, kwargs)
        return control

    def fire(self, args, kwargs) -> None:
        raise NotImplementedError


class SigkillAtStep(FaultAtStep):
    """The child is killed by SIGKILL (as by the kernel or a user), no Python cleanup."""

    def fire(self, args, kwargs) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class SegfaultAtStep(FaultAtStep):
    """A real segmentation fault: ctypes reads address 0."""

    def fire(self, args, kwargs) -> None:
        ctypes.string_at(0)


class HangAtStep(FaultAtStep):
    """The child stops making progress (a deadlock, a stuck collective) and never returns.

    Writes its PID to ``<output_dir>/hung.pid`` first, so a test can check that it was killed. It hangs in its
    first step: with no step ended, the parent's timeout reads it as hung (tried again) at any timeout; a hang
    after steps of ~2 s (a tiny model's set-up and first step) would take a timeout many times that to tell
    from a slow trial (``runner._deadlines.STALL_STEPS``; ``tests/runner/test_deadlines.py`` checks that rule).
    """

    at_step = 1

    def fire(self, args, kwargs) -> None:
        (Path(args.output_dir) / "hung.pid").write_text(str(os.getpid()))
        while True:
            time.sleep(60)


class CompileAtStep(FaultAtStep):
    """torch.compile compiles at step 2 (a small function, with the ``eager`` backend), inside the step:
    what a batch of a shape the trial's graph cannot take costs, whatever makes one (a static length, a
    guard that fails). The step timer's compile clock (dynamo's cumulative timers) sees it."""

    def fire(self, args, kwargs) -> None:
        import torch

        torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))


class StepsPastTheTimeout(TrainerCallback):
    """Every optimizer step takes ``STEP_S`` longer (a config far slower than its timeout): its steps keep
    ending, so the timeout that kills it reads it as slow, not hung."""

    STEP_S = 3.0

    def on_step_begin(self, args, state, control, **kwargs):
        time.sleep(self.STEP_S)
        return control


class StopAtStep(FaultAtStep):
    """The child stops itself with SIGSTOP at step 1 (as a debugger, ``kill -STOP`` or a job-control
    stop would): alive, but never to run again. Appends its PID to ``<work-dir>/stopped.pids`` first."""

    at_step = 1

    def fire(self, args, kwargs) -> None:
        with open(Path(args.output_dir).parent / "stopped.pids", "a") as pids:
            pids.write(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGSTOP)


class ExitNonZeroAtStep(FaultAtStep):
    """A library calls ``_exit(3)`` under the Trainer: the child dies without a result or a signal."""

    def fire(self, args, kwargs) -> None:
        os._exit(3)


class MemoryErrorAtStep(FaultAtStep):
    """Python's allocator fails: a 4 GiB buffer, which only the child's address-space limit forbids
    (the test machines have far more RAM than that)."""

    def fire(self, args, kwargs) -> None:
        buffer = bytearray(4 * GiB)
        buffer[-1] = 1


class OneDnnOutOfAddressSpaceAtStep(FaultAtStep):
    """oneDNN cannot allocate a new primitive: the address-space limit is lowered to the child's
    current size and a convolution of a shape never run before is created, which oneDNN reports only
    as "could not create a primitive". The limit is put back before the error propagates, as freeing
    the failed step's tensors would, so the child can still report."""

    def fire(self, args, kwargs) -> None:
        import resource

        import psutil
        import torch

        images, weights = torch.randn(2, 3, 17, 17), torch.randn(5, 3, 3, 3)
        limit = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (psutil.Process().memory_info().vms, limit[1]))
        try:
            torch.nn.functional.conv2d(images, weights)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, limit)


class RaiseDeepInForward(FaultAtStep):
    """An exception deep inside the Trainer: a forward hook on the model's innermost last module raises
    during the forward pass of step ``at_step``, under Trainer.train -> training_step -> model."""

    def fire(self, args, kwargs) -> None:
        model = kwargs["model"]
        innermost = [module for module in model.modules() if not list(module.children())][-1]

        def explode(module, inputs, output):
            raise ValueError(f"injected fault in the forward of {type(module).__name__}")

        innermost.register_forward_hook(explode)


class GrabMemoryThenSigkill(FaultAtStep):
    """Touches 300 MiB, gives the orchestrator time to see it, then dies by SIGKILL: a crash (no OOM
    kill was counted, the host was not short of memory), with the memory seen from outside kept."""

    held_bytes = 300 * 1024**2

    def fire(self, args, kwargs) -> None:
        buffer = bytearray(self.held_bytes)
        for offset in range(0, len(buffer), 4096):
            buffer[offset] = 1  # resident, not just reserved
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGKILL)


class SigkillOnFirstAttempt(FaultAtStep):
    """A transient crash: SIGKILL the first time it runs in a trial directory, train normally after."""

    def fire(self, args, kwargs) -> None:
        marker = Path(args.output_dir) / "fault-fired"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


class StallSecondTrial(FaultAtStep):
    """The second trial child of a search stalls at step 1; the others train normally.

    Writes ``<work-dir>/stalled.pid`` (its PID) when it stalls, so a test knows a trial is
    mid-flight and can kill the orchestrator.
    """

    at_step = 1

    def fire(self, args, kwargs) -> None:
        work_root = Path(args.output_dir).parent
        with open(work_root / "starts.log", "a") as log:
            log.write(f"{os.getpid()}\n")
        starts = (work_root / "starts.log").read_text().split()
        if len(starts) == 2:
            (work_root / "stalled.pid").write_text(str(os.getpid()))
            while True:
                time.sleep(60)


class StallFirstTrial(StallSecondTrial):
    """The first trial child of a search stalls at step 1 (writes ``<work-dir>/stalled.pid``)."""

    def fire(self, args, kwargs) -> None:
        work_root = Path(args.output_dir).parent
        if not (work_root / "stalled.pid").exists():
            (work_root / "stalled.pid").write_text(str(os.getpid()))
            while True:
                time.sleep(60)


class RecordAddressSpaceLimit(FaultAtStep):
    """Not a fault, a probe: writes the child's address-space limit and current size to
    ``<output_dir>/address_space.json`` at step 1, so a test can check the limit the search set."""

    at_step = 1

    def fire(self, args, kwargs) -> None:
        import resource

        import psutil

        soft_limit, _ = resource.getrlimit(resource.RLIMIT_AS)
        record = {
            "limit_bytes": None if soft_limit == resource.RLIM_INFINITY else soft_limit,
            "vms_bytes": psutil.Process().memory_info().vms,
        }
        (Path(args.output_dir) / "address_space.json").write_text(json.dumps(record))


class RecordCollectorState(TrainerCallback):
    """Not a fault, a probe: writes ``<output_dir>/collector.json`` at the first step: how many objects
    were frozen (hidden from the collector) at each full collection since the trial built its
    callbacks, which includes the one ``Trainer.train()`` starts with, and how many at the first step."""

    def __init__(self) -> None:
        self._frozen_at_full_collections: list[int] = []
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            self._frozen_at_full_collections.append(gc.get_freeze_count())

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            gc.callbacks.remove(self._on_collection)
            record = {
                "frozen_at_full_collections": self._frozen_at_full_collections,
                "frozen_at_first_step": gc.get_freeze_count(),
            }
            (Path(args.output_dir) / "collector.json").write_text(json.dumps(record))
        return control


class RecordParameters(TrainerCallback):
    """Not a fault, a probe: after the first optimizer step writes ``<output_dir>/parameters.json``:
    the parameters' dtypes (trainable and frozen counts) and the optimizer states' dtypes, as the
    trial child built and trained them."""

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.global_step != 1:
            return control
        params = list(model.parameters())
        states = [t for s in optimizer.state.values() for t in s.values() if hasattr(t, "dtype") and t.dim() > 0]
        record = {
            "parameter_dtypes": sorted({str(p.dtype) for p in params}),
            "trainable_dtypes": sorted({str(p.dtype) for p in params if p.requires_grad}),
            "trainable": sum(p.numel() for p in params if p.requires_grad),
            "frozen": sum(p.numel() for p in params if not p.requires_grad),
            "state_dtypes": sorted({str(t.dtype) for t in states}),
            "model_class": type(model).__name__,
        }
        (Path(args.output_dir) / "parameters.json").write_text(json.dumps(record))
        return control


def fill_file_system(directory: str) -> None:
    """Write ``<directory>/filler`` until the file system is full (ENOSPC): a real full disk."""
    chunk = b"\0" * (64 * 1024)
    with open(Path(directory) / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass  # full: smaller writes may still fit, but SQLite's journal and page writes will not
    with open(Path(directory) / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            return


# The file that names the path a fault acts on (FillDiskAtTrainEnd, DeleteFileAtTrainEnd): beside the
# search's work directory, not in it (the work directory holds what the search wrote, which tests read).
# A file rather than an environment variable: a trial child forks from a forkserver that keeps the
# environment it started with, so a search run in the test's process (tests/support/cli.py
# run_cli_in_process) could not hand it a variable, and a file reaches every child.
FAULT_TARGET_FILE = "fault-target"


def aim_fault(work_dir: Path, target: Path) -> None:
    """Name ``target`` as the path the fault of a search with ``--work-dir work_dir`` acts on."""
    (work_dir.parent / FAULT_TARGET_FILE).write_text(str(target))


def _fault_target(args) -> str:
    """The path :func:`aim_fault` named, read in the trial child (``args.output_dir`` is ``<work-dir>/trial-*``)."""
    return (Path(args.output_dir).parent.parent / FAULT_TARGET_FILE).read_text()


class FillDiskAtTrainEnd(TrainerCallback):
    """Fills the file system of the directory :func:`aim_fault` named once training ends: the trial is
    measured, and the parent's tell of it meets a full disk."""

    def on_train_end(self, args, state, control, **kwargs):
        fill_file_system(_fault_target(args))
        return control


class DeleteFileAtTrainEnd(TrainerCallback):
    """Deletes the file :func:`aim_fault` named (the study's SQLite file) once training ends: the trial is
    measured, and the parent's tell of it meets a database whose file is gone."""

    def on_train_end(self, args, state, control, **kwargs):
        os.unlink(_fault_target(args))
        return control


class PoisonWeightsAtStep(FaultAtStep):
    """Training blows up: a NaN written into the weights at step ``at_step`` (the first LayerNorm's,
    which every token passes through), so that step's loss is NaN and the optimizer spreads NaN
    through every weight, as a real divergence does."""

    at_step = 3

    def fire(self, args, kwargs) -> None:
        import torch

        norm = next(m for m in kwargs["model"].modules() if isinstance(m, torch.nn.LayerNorm))
        with torch.no_grad():
            norm.weight[0] = float("nan")


class HugeLearningRateUnlessMicroBatch8(TrainerCallback):
    """A config whose training runs away: every trial except those at micro-batch 8 (the HF default's)
    trains with its learning rate raised 10^6-fold (the scheduler's base rates and the optimizer's
    groups), so the loss grows far above the default's over the same steps."""

    factor = 1e6

    def on_train_begin(self, args, state, control, **kwargs):
        if args.per_device_train_batch_size == 8:
            return control
        scheduler, optimizer = kwargs["lr_scheduler"], kwargs["optimizer"]
        scheduler.base_lrs = [lr * self.factor for lr in scheduler.base_lrs]
        for group in optimizer.param_groups:
            group["lr"] *= self.factor
        return control


class CpuGradScalerOverflow(TrainerCallback):
    """What fp16 on a GPU does, on the CPU: a real ``torch.amp.GradScaler("cpu")`` is installed in the
    Trainer's ``AcceleratedOptimizer`` the way accelerate installs a CUDA one for fp16 (accelerate
    ``optimizer.py``, ``AcceleratedOptimizer.__init__``; it creates none on the CPU), and an inf is
    written into a gradient before the optimizer steps listed in ``overflow_steps`` (``None``: every
    step). The real scaler finds it and skips those steps; accelerate marks them ``step_was_skipped``.
    """

    overflow_steps: tuple[int, ...] | None = (5, 6)

    def on_train_begin(self, args, state, control, **kwargs):
        import torch
        from accelerate.optimizer import patch_optimizer_step

        optimizer = kwargs["optimizer"]
        scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=10**6)
        scaler.scale(torch.ones(()))  # the scaler creates its scale tensor on first use
        optimizer.scaler = scaler
        optimizer._accelerate_step_called = False
        optimizer._optimizer_original_step_method = optimizer.optimizer.step
        optimizer._optimizer_patched_step_method = patch_optimizer_step(optimizer, optimizer.optimizer.step)
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        step = state.global_step + 1
        if self.overflow_steps is None or step in self.overflow_steps:
            grads = [p.grad for p in kwargs["model"].parameters() if p.grad is not None]
            grads[0].view(-1)[0] = float("inf")
        return control


class CpuGradScalerOverflowEveryStep(CpuGradScalerOverflow):
    """:class:`CpuGradScalerOverflow` with every optimizer step overflowing: nothing ever trains."""

    overflow_steps = None


class SigkillRankOneAtStep(FaultAtStep):
    """Rank 1 of a multi-rank trial kills itself with SIGKILL (the other ranks go on until torch's
    launcher stops them): a rank that dies mid-trial."""

    def fire(self, args, kwargs) -> None:
        if os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGKILL)


class SigkillRankOneOnTheFirstAttempt(SigkillRankOneAtStep):
    """Rank 1 kills itself in a trial's first attempt only (a mark left in the trial's work directory, which its
    retry shares, says it did): a search shows the rank's death as the attempt's crash, and the retry trains."""

    def fire(self, args, kwargs) -> None:
        mark = Path(args.output_dir) / "rank-1-killed-once"
        if os.environ.get("RANK") == "1" and not mark.exists():
            mark.touch()
            super().fire(args, kwargs)


class SlowSteps(TrainerCallback):
    """Not a fault, a slower install: every optimizer step takes ``1 + factor`` times its own time (it
    sleeps ``factor`` x the time the step took, at its end), as a library that got slower everywhere
    would: every config's throughput falls by the same factor, and the speedup between two configs
    stays as it was. ``autotune verify`` of a study searched with it finds the answer faster than
    recorded without it, and slower with :class:`SlowerSteps`."""

    factor = 3.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._began = time.perf_counter()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.factor * (time.perf_counter() - self._began))
        return control


class SlowerSteps(SlowSteps):
    """:class:`SlowSteps` at 16 times each step's own time: four times as slow as :class:`SlowSteps`."""

    factor = 15.0


class SlowFullestBatch(TrainerCallback):
    """Training ends, then the model's forward takes an hour: the one step after the timed ones, on the fullest
    batch (autotune/runner/_trial.py: worst_case_peaks), outlasts any timeout (a batch far longer than those the
    timed steps drew)."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        forward = model.forward

        def an_hour_late(*inputs, **named):
            time.sleep(3600)
            return forward(*inputs, **named)

        model.forward = an_hour_late
        return control
