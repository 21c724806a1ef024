#!/usr/bin/env bash
# Issue 41's call on a lent GPU machine (the device tool of this workplace): the install from a --llm
# wheelhouse, then `scripts/gpu_acceptance.sh proof` bounded so that the whole call ends inside its
# 600 s limit, then what it measured copied into OUT_DIR within what such a call brings back (8 files).
#
#   WHEELHOUSE=wheelhouse bash scripts/gpu_proof_call.sh OUT_DIR
#
# Seen on an H200 on 2026-11-30 (docs/benchmarks.md, "The LLM proof on a lent H200"): 457 s in all.
# GPU_ACCEPTANCE_* variables pass through to the proof (scripts/gpu_acceptance.sh's header).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$(mkdir -p "${1:?usage: scripts/gpu_proof_call.sh OUT_DIR}" && cd "$1" && pwd)"
CALL_S="${GPU_PROOF_CALL_S:-555}"  # the proof's end, counted from the call's start; tar and copies follow
START=$SECONDS
WORK=/tmp/gpu-proof  # the trials' folders stay here: only the results travel back
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 PYTHON="${PYTHON:-python3}"
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    WHEELHOUSE="${WHEELHOUSE:-$REPO/wheelhouse}" bash "$REPO/scripts/gpu_acceptance.sh" install "$WORK" || echo "install failed"
    "$PYTHON" -m pip list 2>/dev/null | grep -iE "^(trl|liger.kernel|datasets|optuna|transformers|torch|peft|accelerate|pyarrow|triton|autotune) "
    left=$((CALL_S - (SECONDS - START)))
    echo "proof budget: $left s (install and checks took $((SECONDS - START)) s)"
    GPU_ACCEPTANCE_PROOF_S=$left timeout -k 5 $((left + 20)) bash "$REPO/scripts/gpu_acceptance.sh" proof "$WORK"
    echo "proof exit $? after $((SECONDS - START)) s"
    date -u
} 2>&1 | tee "$OUT_DIR/log.txt"
for name in llm.md dpo.md trials.md verify.md study.db; do
    [[ -f "$WORK/$name" ]] && cp "$WORK/$name" "$OUT_DIR/"
done
# The trials' logs (a failed trial's traceback) and the profiled runs' tables of every operator, without the
# prepared datasets, any weights, or the profiler's traces (tens of MB for a step of a 1B model: one file over
# what a call brings back would lose the archive).
tar czf "$OUT_DIR/runs.tgz" --exclude='*.arrow' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    --exclude=chat.jsonl --exclude=prefs.jsonl --exclude=trace.json.gz -C "$WORK" .
ls -la "$OUT_DIR"
