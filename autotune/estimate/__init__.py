"""Analytical peak-memory model of one training configuration, calibrated online from measured trials.

The estimate is a sum of parts a user can check by hand:

* **weights**: fp32 parameters (HF Trainer keeps fp32 master weights under fp16/bf16 mixed
  precision), plus the half-precision copies autocast makes of every matmul weight and keeps for
  the backward pass;
* **gradients**: one fp32 gradient per parameter;
* **optimizer states**: bytes per parameter per optimizer (docs/facts.md: AdamW 8; 8-bit AdamW 2 with
  embeddings kept 32-bit; Adafactor's factored second moment; SGD without momentum 0);
* **activations**: what autograd keeps per transformer layer, after Korthikanti et al. 2022
  ("Reducing Activation Recomputation in Large Transformer Models", section 4.1), generalised to
  the FFN width and to the element size of each saved tensor; with full (per-layer) checkpointing
  only each layer's input is kept, plus one layer recomputed in the backward pass;
* **logits**: the language-model head's ``b * s * V`` logits and the loss's fp32 copies (with Liger's
  fused linear cross-entropy, a chunk of about ``b * s * h`` instead);
* **allocator**: on CUDA, what the caching allocator reserves beyond the live tensors (cuBLAS and
  cuBLASLt workspaces, block rounding, fragmentation), so that the total predicts ``nvidia-smi``'s
  figure for the process (docs/estimator.md, "The CUDA prior"); 0 on the CPU;
* **context**: what the process holds before training. On CUDA the CUDA context and the kernels
  loaded into it, by GPU generation (docs/estimator.md); on the CPU the measured figure is the
  resident set of the whole process tree, which includes the interpreter with torch and
  transformers imported (and one copy of it per dataloader worker, since forked workers map the
  same pages): the runner measures that interpreter once per installation (``autotune.runner._baseline``) and the
  prior takes its figure.

The levers (``autotune.levers``, each naming the parts it moves) change these parts through their
``MemoryTraits``, the estimator's words for what a value does, so that no part names a lever: a fused
attention kernel (flash, flex, SDPA's fused kernels on CUDA) keeps no ``s x s`` scores; Liger keeps
no ``b x s x V`` logits; padding changes the tokens of the fullest micro-batch
(``_activations.micro_batch_shape``), and a flattened batch under a mask-based kernel adds its ``T x T``
mask. Length grouping and emptying the cache change typical steps and the allocator's cache, not
the tensors alive at the peak.

The model starts from one prior per device (:func:`memory_prior`), which the planner, the seeds, the
screening and the sampler share. :func:`fit_memory` fits two explainable corrections from a study's
measured peaks, by least squares: the context (an offset) and one scale on the activations (the
least certain part; model states and logits are exact counts).

Modules: ``_parts`` (each part's arithmetic, ``estimate_peak``), ``_zero`` (DeepSpeed ZeRO's model states
per rank, device and host), ``_fsdp`` (FSDP's), ``_prior`` (the prior of a device), ``_fit`` (the fit on
measured peaks), ``_plan_table`` (the planner's table of a whole space, and what would fit).
"""

from __future__ import annotations

from autotune.estimate._fit import MeasuredMemory, fit_memory
from autotune.estimate._parts import MemoryEstimate, estimate_peak
from autotune.estimate._plan_table import (
    EstimateRow,
    FitAdvice,
    SettingRow,
    by_setting,
    estimate_json,
    largest_peak_bytes,
    plan_rows,
    predicted_winner,
    smallest_peak_bytes,
    some_config_pads_to_longest,
    what_would_fit,
)
from autotune.estimate._prior import (
    CPU_CHILD_START_RSS_BYTES,
    FALLBACK_CPU_PROCESS_BASELINE_BYTES,
    UNCALIBRATED_MARGIN,
    MemoryFit,
    memory_prior,
)
from autotune.estimate._speed import StepWork, TypicalBatch, step_work, typical_micro_batch
from autotune.estimate._speed_prior import cpu_nominal_peaks_tflops, fit_speed, speed_expected_error, speed_prior
from autotune.estimate._speed_time import SpeedEstimate, SpeedFit, SpeedModel, estimate_speed, predict_speed

__all__ = [
    "CPU_CHILD_START_RSS_BYTES",
    "EstimateRow",
    "SettingRow",
    "FALLBACK_CPU_PROCESS_BASELINE_BYTES",
    "FitAdvice",
    "MeasuredMemory",
    "MemoryEstimate",
    "MemoryFit",
    "SpeedEstimate",
    "SpeedFit",
    "SpeedModel",
    "StepWork",
    "TypicalBatch",
    "UNCALIBRATED_MARGIN",
    "by_setting",
    "estimate_json",
    "cpu_nominal_peaks_tflops",
    "estimate_peak",
    "estimate_speed",
    "fit_speed",
    "fit_memory",
    "largest_peak_bytes",
    "memory_prior",
    "plan_rows",
    "predict_speed",
    "predicted_winner",
    "smallest_peak_bytes",
    "some_config_pads_to_longest",
    "speed_expected_error",
    "speed_prior",
    "step_work",
    "typical_micro_batch",
    "what_would_fit",
]
