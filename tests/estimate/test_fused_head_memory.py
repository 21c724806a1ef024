"""TRL's fused LM head off CUDA holds what the memory prior counts for it (``estimate._logits.fused_lm_head_bytes``):
its torch fallback's forward and backward over one tile of llama-tiny's 32,000-id head, run in a fresh process
as SFTTrainer runs it (bf16 autocast, the outputs SFTTrainer asks for), its peak resident memory above what
the process held before. A test on the head alone: a trial's peak also holds the process, whose baseline the
prior measures per installation within about 100 MiB, more than the head's share of a small trial."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

TOKENS, HIDDEN = 2048, 64  # micro-batch 8 at seq 256 (the CPU dry run of the GPU proof), llama-tiny's hidden size

CHILD = f"""
import json, resource, psutil, torch
from trl.kernels import ChunkedLogProbFunction
torch.manual_seed(0)
hidden = torch.randn({TOKENS}, {HIDDEN}, requires_grad=True)
weight = torch.randn(32000, {HIDDEN}, requires_grad=True)
targets = torch.randint(0, 32000, ({TOKENS},))
before = psutil.Process().memory_info().rss
with torch.autocast("cpu", dtype=torch.bfloat16):  # as SFTTrainer's default bf16 runs it
    # trl/trainer/utils.py: temperature 1, TRL's 32768-column chunks, no softcapping, logit scale 1;
    # sft_trainer.py:1146 asks for the entropy and the top-1 flag beside the log-probabilities.
    log_probs = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0, ("log_probs", "entropy", "is_top1"))[0]
log_probs.sum().backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
print(json.dumps({{"held_bytes": peak - before}}))
"""


def test_the_head_off_cuda_holds_the_tiles_the_prior_counts():
    from autotune.estimate._logits import fused_lm_head_bytes
    from autotune.spec.models import resolve_model

    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    held = json.loads(done.stdout.strip().splitlines()[-1])["held_bytes"]
    predicted = fused_lm_head_bytes(resolve_model("llama-tiny"), TOKENS, "cpu")
    # Counted as the forward's 4 tiles it was half of what the backward holds (about 8).
    assert 0.8 < held / predicted < 1.25, (held, predicted)
