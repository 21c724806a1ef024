"""The precision a trial trained in, read back from torch in the child (never assumed from its levers).

Two switches decide it, and neither is the trial's ``dtype`` lever alone:

* **fp32 matmuls in TF32.** transformers turns TF32 on whenever ``torch_compile`` is set with
  ``tf32`` left unset and without fp16 (``transformers/training_args.py``, ``__post_init__``,
  "── 9. TF32 ──": ``if self.tf32 is None and not self.fp16 or self.bf16: enable_tf32(True)``), and
  accelerate does the same for a dynamo backend without mixed precision on CUDA
  (``accelerate/state.py``, ``AcceleratorState.__init__``: ``torch.backends.cuda.matmul.allow_tf32 =
  True``). So an "fp32 + inductor" trial runs its matmuls in TF32.
* **autocast.** accelerate enters ``torch.autocast`` around the forward pass for fp16/bf16
  (``accelerate/utils/modeling.py``, ``get_mixed_precision_context_manager``, through
  ``Trainer.autocast_smart_context_manager``).

torch >= 2.9 reads the matmul precision as ``torch.backends.cuda.matmul.fp32_precision`` (``"tf32"``,
``"ieee"``, or ``"none"``: inherit ``torch.backends.fp32_precision``), which also reflects the legacy
``allow_tf32`` flag; the legacy getters raise once the new API was used (transformers'
``enable_tf32`` in ``transformers/utils/import_utils.py`` uses the new one), seen here on torch 2.13:
"RuntimeError: ... you have used mix of the legacy and new APIs to set the TF32 status".
"""

from __future__ import annotations

from typing import Any

# torch dtypes under autocast, as autotune names them.
_AUTOCAST_NAMES = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}


def cuda_matmul_precision(torch_module: Any) -> str:
    """``tf32`` or ``ieee``: how fp32 matmuls on CUDA run in this process now.

    Args:
        torch_module: ``torch`` (a parameter so that a fake can stand in for a CUDA build).
    """
    matmul = torch_module.backends.cuda.matmul
    try:
        precision = str(matmul.fp32_precision)
    except AttributeError:  # torch < 2.9: only the legacy flag exists
        return "tf32" if bool(matmul.allow_tf32) else "ieee"
    if precision == "none":  # inherits the global setting
        precision = str(getattr(torch_module.backends, "fp32_precision", "none"))
    return "tf32" if precision == "tf32" else "ieee"


def align_legacy_tf32(torch_module: Any) -> None:
    """Make torch's legacy TF32 view agree with the new one, keeping the precision that runs.

    transformers 5 turns TF32 on through the new API (``enable_tf32`` in
    ``transformers/utils/import_utils.py``: ``torch.backends.fp32_precision = "tf32"``), accelerate
    sets the legacy ``allow_tf32`` only for compile without mixed precision (``accelerate/state.py``,
    ``AcceleratorState.__init__``), so under bf16/fp16 + compile the two views disagree, and the
    legacy getters inductor reads (``allow_tf32``, ``torch.get_float32_matmul_precision()``) then
    raise "you have used mix of the legacy and new APIs" (aten/src/ATen/Context.cpp,
    ``Context::allowTF32CuBLAS``; pytorch#166387, pytorch#196728, transformers#42371). Setting the
    legacy CUDA matmul flag to what the new view says (the setter updates both views) ends the
    disagreement; the CPU's (mkldnn) precision is not touched.

    Args:
        torch_module: ``torch`` (a parameter so the caller's module is the one changed).
    """
    matmul = torch_module.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):  # torch < 2.9: only the legacy view exists
        return
    matmul.allow_tf32 = cuda_matmul_precision(torch_module) == "tf32"


class AutocastRecorder:
    """Forward pre-hooks that record the autocast state the model's layers run under.

    accelerate enters autocast *inside* the model's forward: ``prepare_model`` replaces
    ``model.forward`` with an autocast-wrapped one (accelerate/accelerator.py, ``prepare_model``:
    ``model.forward = MethodType(autocast_context(model_forward_func), model)``), so a pre-hook on
    the model itself runs before autocast is entered (seen here: a bf16 trial read no autocast there).
    The hooks therefore go on the model's direct children, which the forward calls inside it. The
    first call records ``torch.is_autocast_enabled(device_type)`` and
    ``torch.get_autocast_dtype(device_type)`` (without autocast: the dtype of the child's weights, half
    precision where DeepSpeed cast the model) and removes every hook, so later steps run as a plain
    run does. ``seen`` stays False where no hook ran: the caller falls back to the accelerator's
    mixed-precision setting.
    """

    def __init__(self, torch_module: Any, device_type: str) -> None:
        self._torch = torch_module
        self._device_type = device_type
        self._handles: list[Any] = []
        self.seen = False
        self.dtype: str | None = None  # ``fp16``/``bf16`` under autocast or in half-precision weights, ``None``: fp32

    def attach(self, model: Any) -> None:
        """Hook every direct child of ``model`` (the model itself where it has none)."""
        for module in list(model.children()) or [model]:
            self._handles.append(module.register_forward_pre_hook(self))

    def __call__(self, module: Any, args: Any) -> None:
        if self.seen:
            return
        self.seen = True
        if self._torch.is_autocast_enabled(self._device_type):
            self.dtype = _AUTOCAST_NAMES.get(str(self._torch.get_autocast_dtype(self._device_type)), "other")
        else:
            # No autocast, but the weights themselves may be half precision: DeepSpeed's bf16 casts the
            # module (deepspeed/runtime/engine.py, ``_configure_distributed_model``: ``_cast_module_mixed_precision``)
            # and uses no autocast; seen on an H200, where a ZeRO bf16 trial was labelled fp32.
            weight = next((p for p in module.parameters() if p.is_floating_point()), None)
            self.dtype = _AUTOCAST_NAMES.get(str(weight.dtype)) if weight is not None else None
        for handle in self._handles:
            handle.remove()


def accelerator_autocast_dtype(mixed_precision: str | None) -> str | None:
    """The autocast dtype accelerate uses for a ``mixed_precision`` setting (``no``/``fp16``/``bf16``)."""
    return mixed_precision if mixed_precision in ("fp16", "bf16") else None


def ran_dtype(device_kind: str, autocast_dtype: str | None, matmul_precision: str) -> str:
    """The dtype whose peak bounds the matmuls that ran: the label, MFU and export follow it.

    Args:
        device_kind: ``cpu`` or ``cuda``; TF32 is a CUDA (Ampere+) matmul mode, so the CPU is
            never TF32.
        autocast_dtype: ``fp16``/``bf16`` when the forward ran under autocast, else ``None``.
        matmul_precision: From :func:`cuda_matmul_precision`.
    """
    if autocast_dtype is not None:
        return autocast_dtype
    return "tf32" if device_kind == "cuda" and matmul_precision == "tf32" else "fp32"


def predicted_tf32(dtype: str, compile_backend: str, device_kind: str, base_args: dict[str, Any]) -> bool:
    """Whether a trial's fp32 matmuls will run in TF32, by the transformers rule quoted above.

    Used before a trial runs (the peak its MFU is judged against, the calibrated peak the job
    carries); the child's reading replaces it afterwards.
    """
    if device_kind != "cuda":
        return False
    if dtype == "tf32" or base_args.get("tf32") is True:
        return True
    if base_args.get("tf32") is False:
        return False
    return compile_backend != "off" and dtype != "fp16"


def utilisation_defect(name: str, value: float | None, peak_dtype: str) -> str | None:
    """A one-line defect when a utilisation is above 100 %, which no hardware does.

    MFU above 1 means the peak it was divided by is not the one that ran (fp32 against TF32 work,
    a MIG slice against a whole GPU) or the FLOPs were over-counted: the figure is dropped and the
    reason kept with the trial, never shown as a valid figure.
    """
    if value is None or value <= 1.0:
        return None
    return (
        f"{name} {value:.0%} against the {peak_dtype} datasheet peak is impossible (above 100 %): "
        "the precision or the peak does not match what ran; figure not recorded"
    )
