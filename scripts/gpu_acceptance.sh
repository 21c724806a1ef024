#!/usr/bin/env bash
# GPU acceptance: on a machine with one NVIDIA GPU, prove the CUDA path end to end, offline, in steps
# that each end inside a 10-minute call (a lent GPU machine's limit; `all` runs them one after another).
#
#   scripts/gpu_acceptance.sh STEP [OUT_DIR]        (OUT_DIR default: gpu_acceptance_out)
#
# Steps, in order:
#   install   autotune into the interpreter that has the CUDA torch (PYTHON, default python3), from a
#             wheelhouse with the index disabled (WHEELHOUSE=DIR, written by scripts/wheelhouse.sh on a
#             connected machine), else from this checkout with pip's index; the interpreter's torch is
#             kept. A python3 that is itself a venv is installed into as is: a venv made from it with
#             --system-site-packages would not see its torch.
#   devices   autotune devices; autotune devices --calibrate
#   estimate  autotune estimate --json
#   search    a bert-large-uncased search at seq len 512 up to TRIALS trials in the study; each call
#             starts no trial after SEARCH_START_S and is stopped as by Ctrl-C at STEP_S (the running
#             trial is queued again): run the step again until it says "search: done" (exit 0; exit 3:
#             trials remain)
#   export    autotune best; autotune export
#   results   the exported JSON trained by a plain transformers Trainer in a fresh process, and
#             OUT_DIR/results.md (and .json): its samples/s and peak memory against the study's record,
#             each trial's predicted peak (prior and calibrated) against its measured one
#   offload   ZeRO offload makes it fit (issue 22: on a CPU the device is the host, so only a GPU shows
#             it): a search of zero 2 and 2+offload (OFFLOAD_MODEL, micro-batch 1, bf16, every config
#             run: --no-screen) under a ceiling halfway between their predicted peaks
#             (scripts/gpu_acceptance_offload.py); OUT_DIR/offload.md, and a failure unless 2+offload
#             won and trained while zero 2 went over the ceiling. Needs deepspeed (cpu_adam is built once)
#   all       every step in order, the search step until done, then offload
#
# Environment: GPU_ACCEPTANCE_TRIALS (12), GPU_ACCEPTANCE_MODEL (bert-large-uncased),
# GPU_ACCEPTANCE_SEQ_LEN (512), GPU_ACCEPTANCE_STEP_S (540), GPU_ACCEPTANCE_SEARCH_START_S (300),
# GPU_ACCEPTANCE_OFFLOAD_MODEL (gpt2-large), GPU_ACCEPTANCE_SPACE (a name in search_spaces/, default `default`, or a YAML file's path; `quick`
# measures more configs inside a lent machine's few minutes than one full of torch.compile modes),
# GPU_ACCEPTANCE_PEFT (unset; `lora`, `qlora` or an adapter config file: a LoRA study, whose plain run
# wraps the model as the export says), GPU_ACCEPTANCE_CEILING (unset: the device's; e.g. 24GiB to search
# as on a smaller card).
# A step that fails stops the script with one line naming it (the command's own message is above it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEP="${1:?usage: scripts/gpu_acceptance.sh install|devices|estimate|search|export|results|offload|all [OUT_DIR]}"
OUT="$(mkdir -p "${2:-gpu_acceptance_out}" && cd "${2:-gpu_acceptance_out}" && pwd)"
PYTHON="${PYTHON:-python3}"
MODEL="${GPU_ACCEPTANCE_MODEL:-bert-large-uncased}"
SEQ_LEN="${GPU_ACCEPTANCE_SEQ_LEN:-512}"
TRIALS="${GPU_ACCEPTANCE_TRIALS:-12}"
STEP_S="${GPU_ACCEPTANCE_STEP_S:-540}"
SEARCH_START_S="${GPU_ACCEPTANCE_SEARCH_START_S:-300}"
OFFLOAD_MODEL="${GPU_ACCEPTANCE_OFFLOAD_MODEL:-gpt2-large}"
SPACE="${GPU_ACCEPTANCE_SPACE:-default}"
if [[ "$SPACE" == */* ]]; then SPACE="$(realpath "$SPACE")"; else SPACE="$REPO/search_spaces/$SPACE.yaml"; fi
SEARCH_EXTRA=()
[[ -n "${GPU_ACCEPTANCE_PEFT:-}" ]] && SEARCH_EXTRA+=(--peft "$GPU_ACCEPTANCE_PEFT")
[[ -n "${GPU_ACCEPTANCE_CEILING:-}" ]] && SEARCH_EXTRA+=(--memory-ceiling "$GPU_ACCEPTANCE_CEILING")
STORAGE="sqlite:///$OUT/study.db"
STUDY="gpu-acceptance"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"  # models are built from the catalog's configs

fail() { echo "gpu_acceptance: step '$1' failed (its message is above); results so far in $OUT" >&2; exit 1; }
# bounded COMMAND...: run it, stopped as by Ctrl-C at STEP_S (and killed 30 s later), so a step ends in time.
bounded() { timeout -k 30 -s INT "$STEP_S" "$@"; }
# Run from OUT_DIR: the installed autotune, or this checkout's where none is installed (a source tree runs).
autotune() {
    if ! "$PYTHON" -c "import autotune" 2>/dev/null; then
        export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    fi
    (cd "$OUT" && "$PYTHON" -m autotune "$@")
}

step_install() {
    if [[ -n "${WHEELHOUSE:-}" ]]; then
        "$PYTHON" -m pip install --no-index --find-links "$WHEELHOUSE" autotune
    else
        "$PYTHON" -m pip install "$REPO"
    fi
    "$PYTHON" -c "import autotune, torch; print('autotune', autotune.__file__, '| torch', torch.__version__, torch.version.cuda)"
}

step_devices() {
    bounded autotune devices && bounded autotune devices --calibrate --device cuda:0
}

step_estimate() {
    bounded autotune estimate --model "$MODEL" --seq-len "$SEQ_LEN" --gpu 0 --json > "$OUT/estimate.json"
}

finished_trials() {  # trials of the budget that ended (the study-wide cap counts these)
    "$PYTHON" - "$STORAGE" "$STUDY" <<'EOF'
import sys
import optuna
from optuna.trial import TrialState
try:
    study = optuna.load_study(study_name=sys.argv[2], storage=sys.argv[1])
except KeyError:
    print(0)
else:
    print(len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))))
EOF
}

step_search() {
    local status=0 before done_trials
    before="$(finished_trials)"
    bounded autotune search --model "$MODEL" --seq-len "$SEQ_LEN" --gpu 0 --space "$SPACE" --trials "$TRIALS" ${SEARCH_EXTRA[@]+"${SEARCH_EXTRA[@]}"} \
        --max-total-trials "$TRIALS" --timeout "$SEARCH_START_S" --confirm-top 0 \
        --storage "$STORAGE" --study-name "$STUDY" --work-dir "$OUT/runs" || status=$?
    if [[ $status -ne 0 && $status -ne 130 && $status -ne 124 ]]; then  # 130/124: stopped at STEP_S
        return "$status"
    fi
    done_trials="$(finished_trials)"
    # Done at the budget, or when a search that ended by itself ran nothing more (the space is measured).
    if [[ "$done_trials" -ge "$TRIALS" || ( $status -eq 0 && "$done_trials" -eq "$before" ) ]]; then
        echo "search: done ($done_trials trials)" >&2
        return 0
    fi
    echo "search: $done_trials of $TRIALS trials; run the search step again" >&2
    return 3
}

step_export() {
    bounded autotune best --storage "$STORAGE" --study-name "$STUDY" \
        && bounded autotune export --storage "$STORAGE" --study-name "$STUDY" --out "$OUT/best_args.json"
}

step_results() {
    # The results script reads the plain run's helpers from the repository's benchmarks/ package.
    (cd "$OUT" && export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" \
        && bounded "$PYTHON" "$REPO/scripts/gpu_acceptance_results.py" --storage "$STORAGE" \
        --study-name "$STUDY" --args "$OUT/best_args.json" --model "$MODEL" --seq-len "$SEQ_LEN" --out "$OUT")
}

step_offload() {
    local ceiling offload_py="$REPO/scripts/gpu_acceptance_offload.py"
    if ! "$PYTHON" -c "import autotune" 2>/dev/null; then
        export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$PYTHON" "$offload_py" space "$OUT/offload_space.yaml"
    ceiling="$("$PYTHON" "$offload_py" ceiling "$OFFLOAD_MODEL" "$SEQ_LEN")"
    bounded autotune search --model "$OFFLOAD_MODEL" --seq-len "$SEQ_LEN" --gpu 0 --space "$OUT/offload_space.yaml" \
        --memory-ceiling "$ceiling" --trials 2 --confirm-top 0 --no-screen \
        --storage "$STORAGE" --study-name offload --work-dir "$OUT/runs-offload" || return $?
    "$PYTHON" "$offload_py" check --storage "$STORAGE" --study-name offload --out "$OUT"
}

run_step() {  # run_step NAME: run it; the search step's "run me again" (3) is passed on, anything else stops
    local name="$1" status=0
    echo "== $name" >&2
    "step_$name" || status=$?
    if [[ $status -eq 3 && "$name" == "search" ]]; then
        return 3
    fi
    [[ $status -eq 0 ]] || fail "$name"
}

case "$STEP" in
    install|devices|estimate|search|export|results|offload)
        run_step "$STEP"
        ;;
    all)
        run_step install
        run_step devices
        run_step estimate
        until run_step search; do :; done
        run_step export
        run_step results
        run_step offload
        echo "gpu_acceptance: done; results in $OUT/results.md, $OUT/results.json and $OUT/offload.md" >&2
        ;;
    *)
        echo "gpu_acceptance: error: unknown step '$STEP' (install, devices, estimate, search, export, results, offload, all)" >&2
        exit 2
        ;;
esac
