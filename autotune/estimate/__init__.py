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
  same pages): the prior measures that interpreter once per installation (``_baseline``).

The levers (``autotune.levers``, each naming the parts it moves) change these parts: a fused attention kernel (flash, flex,
SDPA's fused kernels on CUDA) keeps no ``s x s`` scores; Liger keeps no ``b x s x V`` logits; the
``padding`` knob changes the tokens of the fullest micro-batch (:func:`micro_batch_shape`), and a
flattened batch under a mask-based kernel adds its ``T x T`` mask. Length grouping and emptying the
cache change typical steps and the allocator's cache, not the tensors alive at the peak.

The model starts from one prior per device (:func:`memory_prior`), which the planner, the seeds, the
screening and the sampler share. :func:`fit_memory` fits two explainable corrections from a study's
measured peaks, by least squares: the context (an offset) and one scale on the activations (the
least certain part; model states and logits are exact counts).

Modules: ``_parts`` (each part's arithmetic, ``estimate_peak``), ``_zero`` (DeepSpeed ZeRO's model states
per rank, device and host), ``_fit`` (the prior and the fit), ``_baseline`` (the CPU prior's process
baseline, measured once per installation),
``_plan`` (the planner's table of a whole space).
"""

from __future__ import annotations

from autotune.estimate._baseline import (
    CPU_CHILD_START_RSS_BYTES,
    CPU_UNMAPPED_LIBRARY_BYTES,
    FALLBACK_CPU_PROCESS_BASELINE_BYTES,
    TRIAL_PROCESS_IMPORTS,
    cpu_process_baseline_bytes,
)
from autotune.estimate._fit import (
    ALLOCATOR_FRAGMENTATION_SHARE,
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACES,
    CUDA_CONTEXT_BYTES,
    PRIOR_ACTIVATION_SCALE,
    PRIOR_CONTEXT_BYTES,
    SCALE_BOUNDS,
    UNCALIBRATED_MARGIN,
    MeasuredMemory,
    MemoryFit,
    expandable_segments_enabled,
    fit_memory,
    memory_prior,
)
from autotune.estimate._parts import (
    CHECKPOINT_WORKING_LAYERS,
    MemoryEstimate,
    MicroBatchShape,
    activation_bytes,
    activation_element_bytes,
    adafactor_state_elements,
    allocator_overhead_bytes,
    attention_dropout,
    context_bytes,
    estimate_peak,
    layer_activation_bytes,
    logits_bytes,
    materializes_attention_scores,
    micro_batch_shape,
    model_state_bytes,
    optimizer_state_bytes,
    packed_mask_bytes,
)
from autotune.estimate._zero import (
    ADAMW_STEP_TEMPORARY_BYTES,
    DEEPSPEED_CPU_PROCESS_BYTES,
    FP32_GRAD_BYTES,
    MASTER_BYTES,
    ZeroStates,
    compute_weight_dtype,
    deepspeed_buffer_elements,
    zero_state_bytes,
)
from autotune.estimate._plan import (
    EstimateRow,
    FitAdvice,
    LeverChange,
    estimate_json,
    estimate_rows,
    largest_fitting,
    largest_peak_bytes,
    memory_distinct_configs,
    plan_rows,
    smallest_peak_bytes,
    what_would_fit,
)

__all__ = [
    "ALLOCATOR_FRAGMENTATION_SHARE", "CHECKPOINT_WORKING_LAYERS", "CPU_CHILD_START_RSS_BYTES",
    "CPU_UNMAPPED_LIBRARY_BYTES", "FALLBACK_CPU_PROCESS_BASELINE_BYTES", "TRIAL_PROCESS_IMPORTS", "CUBLAS_WORKSPACES", "CUBLAS_WORKSPACE_BYTES", "CUDA_CONTEXT_BYTES",
    "PRIOR_ACTIVATION_SCALE", "PRIOR_CONTEXT_BYTES", "SCALE_BOUNDS", "UNCALIBRATED_MARGIN", "EstimateRow", "FitAdvice",
    "LeverChange", "MeasuredMemory",
    "MemoryEstimate", "MemoryFit", "MicroBatchShape", "activation_bytes", "activation_element_bytes",
    "adafactor_state_elements", "allocator_overhead_bytes", "attention_dropout", "context_bytes",
    "cpu_process_baseline_bytes", "estimate_json", "estimate_peak", "estimate_rows", "expandable_segments_enabled", "fit_memory",
    "largest_fitting", "largest_peak_bytes", "layer_activation_bytes", "logits_bytes", "materializes_attention_scores",
    "memory_distinct_configs", "memory_prior", "micro_batch_shape", "model_state_bytes",
    "optimizer_state_bytes", "packed_mask_bytes", "plan_rows", "smallest_peak_bytes", "what_would_fit",
    "ADAMW_STEP_TEMPORARY_BYTES", "DEEPSPEED_CPU_PROCESS_BYTES", "FP32_GRAD_BYTES", "MASTER_BYTES", "ZeroStates", "compute_weight_dtype", "deepspeed_buffer_elements", "zero_state_bytes",
]
