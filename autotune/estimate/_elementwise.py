"""The elementwise memory traffic of one transformer layer in eager mode, counted from the model's own code.

What the throughput prior's memory term needs is how many bytes the ops around the matmuls read and write per
token: RMSNorm's upcast, square, mean, scale and downcast; rotary's slices, negations, products and sums; the
activation and gating; the residual adds; autocast's casts of each matmul input; and the backward of each. Counted
from the saved activations alone (four passes over what autograd keeps, Korthikanti et al.'s per-layer bytes), a
Llama layer in eager mode moves 4-6x less than it does (``375 h + 28 f`` bytes a token measured below, against
``60 h + 16 f``), so the prior put an eager step too fast wherever memory bandwidth is short of the matmul rate
(on H100 more than on A100), and ``torch.compile``'s gain at 2.5 % where torchtitan's Llama 3.1 8B gained 16 %
(docs/benchmarks.md, "The throughput prior").

So the prior asks the model itself: :func:`eager_layer_traffic` runs a forward and a backward of the model's
transformers code on fake tensors (``torch._subclasses.FakeTensorMode``: shapes and dtypes only, no memory, no
arithmetic) under the trial's dtype regime (fp32; 16-bit autocast over fp32 weights; 16-bit weights), and sums the
bytes every elementwise op reads and writes (its tensor inputs and outputs; a view moves nothing; the matmuls and
the fused attention kernels are compute, counted as FLOPs). One and two layers, at three lengths: the difference
between the layer counts is one layer's, and the fit over the lengths keeps the part linear in the tokens, which
leaves out what does not grow with the tokens (weights' casts, gradients' accumulation: counted elsewhere) and what
grows with their square (materialised attention scores: ``_activations.attention_score_bytes``). The fake tensors are the
CPU's, so the casts are those of CPU autocast; transformers' modeling code upcasts its norms itself, which is most of
what differs from CUDA's autocast policy.

Kept on disk per config, task and regime (:mod:`autotune.spec.derived_cache`); where the model does not run on fake
tensors (routed experts' data-dependent dispatch), ``None``: the prior counts the saved bytes' passes as before.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import warnings
from collections.abc import Iterator
from typing import Any

from autotune.spec.models import ModelSpec

# The lengths counted (tokens in one row): enough to tell a term linear in the tokens from a quadratic one.
COUNTED_LENGTHS = (16, 32, 64)
# Config keys that give the number of layers (the first present is read by ``spec_from_config``).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers")
# Ops that are compute (their FLOPs are counted by ``autotune.spec.flops``), not elementwise traffic.
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution"})
FUSED_ATTENTION_PREFIXES = ("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")


@dataclasses.dataclass(frozen=True)
class LayerTraffic:
    """Bytes one layer's elementwise ops read and write per token, in eager mode.

    Attributes:
        forward: In the forward (again in a recomputed forward under checkpointing).
        backward: In the backward.
    """

    forward: float
    backward: float


def eager_layer_traffic(model: ModelSpec, weight_bytes: int, half_autocast: bool) -> LayerTraffic | None:
    """One layer's eager elementwise traffic per token under a dtype regime; ``None`` where it cannot be counted.

    Args:
        model: The model (its config and task).
        weight_bytes: The bytes of the weights the matmuls read (4: fp32; 2: 16-bit weights).
        half_autocast: 16-bit autocast over fp32 weights.
    """
    from autotune.spec.derived_cache import cached

    key = {
        "config": model.hf_config,
        "text_config_key": model.text_config_key,
        "task": model.task,
        "weight_bytes": weight_bytes,
        "half_autocast": half_autocast,
    }
    # The prior counts every config of a space: held in the process too, not read from disk (2 ms) each time.
    held = json.dumps(key, sort_keys=True, default=str)
    if held not in _HELD:
        counted = cached(
            "eager-layer-traffic",
            key,
            __file__,
            lambda: _count_or_none(model.hf_config, model.text_config_key, model.task, weight_bytes, half_autocast),
        )
        _HELD[held] = LayerTraffic(*counted) if counted else None
    return _HELD[held]


_HELD: dict[str, LayerTraffic | None] = {}


def _count_or_none(
    hf_config: dict[str, Any], text_key: str, task: str, weight_bytes: int, half_autocast: bool
) -> list[float] | None:
    try:
        return _count(hf_config, text_key, task, weight_bytes, half_autocast)
    except Exception:  # noqa: BLE001 - any architecture fake tensors cannot run: the prior's own count instead
        return None


def _count(hf_config: dict[str, Any], text_key: str, task: str, weight_bytes: int, half_autocast: bool) -> list[float]:
    """``[forward, backward]`` bytes per token of one layer (module docstring)."""
    one, two = (
        _traffic(_with_layers(hf_config, text_key, layers), task, weight_bytes, half_autocast) for layers in (1, 2)
    )
    return [max(_linear_term(COUNTED_LENGTHS, [b[i] - a[i] for a, b in zip(one, two)]), 0.0) for i in range(2)]


def _linear_term(xs: tuple[int, ...], ys: list[float]) -> float:
    """The ``b`` of ``a + b x + c x^2`` through three points."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    d01, d12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c = (d12 - d01) / (x2 - x0)
    return d01 - c * (x0 + x1)


def _with_layers(hf_config: dict[str, Any], text_key: str, layers: int) -> dict[str, Any]:
    """The config with ``layers`` layers; a per-layer list (Gemma's ``layer_types``) cut to as many."""
    config = copy.deepcopy(hf_config)
    text = config[text_key] if text_key else config
    original = next(text[k] for k in LAYER_KEYS if isinstance(text.get(k), int))
    for k in LAYER_KEYS:
        if isinstance(text.get(k), int):
            text[k] = layers
    for k, value in list(text.items()):
        if isinstance(value, list) and len(value) == original:
            text[k] = value[:layers]
    return config


def _traffic(
    hf_config: dict[str, Any], task: str, weight_bytes: int, half_autocast: bool, fake: bool = True
) -> list[tuple[float, float]]:
    """Elementwise bytes of one forward and one backward over one row of each of :data:`COUNTED_LENGTHS`, on fake
    tensors (``fake=False``: real ones on the CPU, which a test compares), torch's and transformers' logs held back
    (a failed count is not the user's error)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.spec.building import build_model

    dtype = "float32" if weight_bytes == 4 else "bfloat16"
    counted = []
    with _quiet(), FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
        model = build_model(hf_config, task, dtype=dtype)  # its default attention: SDPA where it has it
        model.train()
        for tokens in COUNTED_LENGTHS:
            ids = torch.zeros((1, tokens), dtype=torch.long)
            labels = torch.zeros((1,), dtype=torch.long) if task == "sequence-classification" else ids
            model.zero_grad(set_to_none=True)  # each backward writes its gradients afresh: the same fixed cost
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half_autocast), _traffic_mode() as forward:
                loss = model(input_ids=ids, labels=labels).loss
            with _traffic_mode() as backward:
                loss.backward()
            counted.append((forward.bytes, backward.bytes))
    return counted


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch's fake-tensor log (an op it cannot run on fake tensors: the count falls back) and transformers' warnings
    off for the count."""
    loggers = [logging.getLogger(name) for name in ("torch._subclasses.fake_tensor", "transformers")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def _is_compute(name: str) -> bool:
    return name in MATMUL_OPS or name.startswith(FUSED_ATTENTION_PREFIXES)


def _traffic_mode() -> Any:
    """A dispatch mode whose ``bytes`` sums every elementwise op's tensor inputs and outputs (torch is imported
    only where a count runs)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Traffic(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0.0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func.namespace == "aten" and not func.is_view and not _is_compute(func.overloadpacket.__name__):
                tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
                self.bytes += sum(t.numel() * t.element_size() for t in tensors if t.numel() > 1)
            return out

    return Traffic()
