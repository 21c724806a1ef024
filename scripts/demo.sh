#!/usr/bin/env bash
# Install autotune into .venv and run a real search on the CPU: a tiny BERT, 12 trials, the study in
# ./autotune.db. Then: `.venv/bin/autotune best` and `.venv/bin/autotune export --out best_args.json`.
#   bash scripts/demo.sh                      # defaults below
#   bash scripts/demo.sh --trials 30          # extra arguments go to `autotune search`
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# The demo's extras at the versions the suite ran with: requirements/lock-cpu-py311.txt as constraints (uv
# checks each file's hash against it). With uv: 5 s where pip takes about a minute. torch pinned
# (requirements/torch.txt): the CPU build where the machine keeps it (pip's find-links, passed on: uv does
# not read pip's configuration); on a GPU box install your CUDA build first instead (an open `torch`
# requirement pulls a multi-GB CUDA build). Bytecode is written
# by the first process that imports a module, for the modules a search imports only (compiling every
# installed module up front, as pip does, took 26 s more here); a machine that sets
# PYTHONDONTWRITEBYTECODE would compile them again in every process.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/pip install -q uv
source scripts/pip_find_links.sh
.venv/bin/uv pip install -q --python .venv/bin/python "${find_links[@]}" --constraint requirements/lock-cpu-py311.txt \
  -r requirements/torch.txt -e '.[bnb,report]'
HF_HUB_OFFLINE=1 .venv/bin/autotune search --model bert-tiny --device cpu --seq-len 128 --trials 12 \
  --space search_spaces/quick.yaml "$@"
