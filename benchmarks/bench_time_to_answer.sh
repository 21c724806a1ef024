#!/usr/bin/env bash
# Time to the answer, today's code against another commit, side by side on this machine (docs/benchmarks.md,
# "Time to the answer"). Each tree is a fresh clone; in turn, interleaved (BASE, HEAD): `bash scripts/demo.sh`
# (install included, its own .venv), then the README's CPU command on the default space. Every step's wall
# time and the load average before and after go to OUT/times.tsv; the share of wall time in measured steps is
# read from each study by benchmarks/bench_time_share.py.
#   bash benchmarks/bench_time_to_answer.sh BASE_REV [OUT]
#   README_TREES=head bash benchmarks/bench_time_to_answer.sh BASE_REV   # the README command on HEAD only
# (before issue 29 the README's command took more than 10 minutes for 6 of its 12 trials on this machine).
set -euo pipefail
BASE_REV="$1"
OUT="${2:-/tmp/bench-time-to-answer}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
HEAD_REV="$(git -C "$REPO" rev-parse HEAD)"
mkdir -p "$OUT"
printf 'tree\tstep\tstart\twall_s\tload_before\tload_after\n' > "$OUT/times.tsv"
load() { cut -d' ' -f1-3 /proc/loadavg; }
for tree in base head; do
  rev="$BASE_REV"; [[ "$tree" == head ]] && rev="$HEAD_REV"
  rm -rf "$OUT/$tree"
  git clone -q "$REPO" "$OUT/$tree"
  git -C "$OUT/$tree" checkout -q "$rev"
done
run() {  # tree step command...
  local tree="$1" step="$2"; shift 2
  local before start end
  before="$(load)"; start="$(date -u +%FT%TZ)"; local t0; t0="$(date +%s.%N)"
  (cd "$OUT/$tree" && "$@") > "$OUT/$tree-$step.log" 2>&1
  end="$(date +%s.%N)"
  printf '%s\t%s\t%s\t%.1f\t%s\t%s\n' "$tree" "$step" "$start" "$(echo "$end - $t0" | bc)" "$before" "$(load)" >> "$OUT/times.tsv"
}
for tree in base head; do run "$tree" demo bash scripts/demo.sh; done
for tree in ${README_TREES:-base head}; do
  run "$tree" readme env HF_HUB_OFFLINE=1 .venv/bin/autotune search --model bert-tiny --device cpu --seq-len 128 \
    --trials 12 --storage "sqlite:///$OUT/$tree/readme.db"
done
cat "$OUT/times.tsv"
