#!/usr/bin/env bash
# GPU acceptance: on a machine with one NVIDIA GPU, prove the CUDA path end to end in one command.
#
#   scripts/gpu_acceptance.sh [OUT_DIR]          (default: gpu_acceptance_out)
#
# Installs autotune into a virtual environment that sees the CUDA torch already installed
# (--system-site-packages; pip installs torch only where none is present), then runs, in order:
#   autotune devices; autotune devices --calibrate; autotune estimate; a 12-trial search of
#   bert-large-uncased at seq len 512; autotune best; autotune export; the exported JSON trained
#   by a plain transformers Trainer in a fresh process (scripts/bench_fidelity.py --plain);
# and writes OUT_DIR/results.json and OUT_DIR/results.md: the plain run's samples/s and peak memory
# against the study's record, and each trial's predicted against measured peak.
#
# Environment: AUTOTUNE_PYTHON=/path/to/python uses that interpreter as is (no install);
# GPU_ACCEPTANCE_TRIALS (12), GPU_ACCEPTANCE_MODEL (bert-large-uncased), GPU_ACCEPTANCE_SEQ_LEN (512).
# A step that fails stops the script with one line naming it (the command's own message is above it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-gpu_acceptance_out}" && cd "${1:-gpu_acceptance_out}" && pwd)"
MODEL="${GPU_ACCEPTANCE_MODEL:-bert-large-uncased}"
SEQ_LEN="${GPU_ACCEPTANCE_SEQ_LEN:-512}"
TRIALS="${GPU_ACCEPTANCE_TRIALS:-12}"
STORAGE="sqlite:///$OUT/study.db"
STUDY="gpu-acceptance"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"  # models are built from the catalog's configs

step() {  # step NAME COMMAND...: run it; on failure, one line naming the step, and stop
    local name="$1"; shift
    echo "== $name" >&2
    if ! "$@"; then
        echo "gpu_acceptance: step '$name' failed (its message is above); results so far in $OUT" >&2
        exit 1
    fi
}

install() {
    if [[ -n "${AUTOTUNE_PYTHON:-}" ]]; then
        PYTHON="$AUTOTUNE_PYTHON"
        return
    fi
    local venv="$OUT/venv"
    python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # A CUDA torch already installed (the PyTorch images, a DL AMI) is kept: pip sees it through
    # --system-site-packages and satisfies `torch` with it.
    "$venv/bin/python" -m pip install --quiet "$REPO"
    PYTHON="$venv/bin/python"
}

autotune() { (cd "$REPO" && PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m autotune "$@"); }

step "install" install
step "devices" autotune devices
step "devices --calibrate" autotune devices --calibrate --device cuda:0
estimate_json() { autotune estimate --model "$MODEL" --seq-len "$SEQ_LEN" --gpu 0 --json > "$OUT/estimate.json"; }
results() {
    (cd "$REPO" && PYTHONPATH="$REPO" "$PYTHON" scripts/gpu_acceptance_results.py --storage "$STORAGE" \
        --study-name "$STUDY" --args "$OUT/best_args.json" --model "$MODEL" --seq-len "$SEQ_LEN" --out "$OUT")
}

step "estimate" estimate_json
step "search" autotune search --model "$MODEL" --seq-len "$SEQ_LEN" --gpu 0 --trials "$TRIALS" \
    --storage "$STORAGE" --study-name "$STUDY" --work-dir "$OUT/runs"
step "best" autotune best --storage "$STORAGE" --study-name "$STUDY"
step "export" autotune export --storage "$STORAGE" --study-name "$STUDY" --out "$OUT/best_args.json"
step "plain Trainer run and results" results
echo "gpu_acceptance: done; results in $OUT/results.md and $OUT/results.json" >&2
