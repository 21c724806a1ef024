#!/usr/bin/env bash
# Refresh requirements/lock-cpu-py311.txt: the newest releases that satisfy pyproject.toml's ranges, with
# torch's CPU build (requirements/torch.txt), every one pinned with the hashes of its files. Then run the
# suite on them (bash scripts/test.sh installs exactly the lock) and commit the lock with the result.
#   bash scripts/lock.sh                           # everything to its newest release
#   bash scripts/lock.sh --exclude-newer 2026-12-01  # extra arguments go to `uv pip compile`
#
# The lock is for Linux x86_64, CPython 3.11 (the machines the suite runs on); every file's hash of each
# pinned release is recorded, so another Python or platform can check its wheels against it
# (scripts/wheelhouse.sh does). It covers the [test] extra, which holds every other extra but [liger]
# (CUDA only: Triton), and [bnb,report], the demo's. torch itself is resolved (its CPU build's
# requirements are locked) but not written: its CPU build is not on PyPI (it comes from the machine's own
# wheels, or PyTorch's index), and a GPU machine's CUDA build, or the Docker image's, takes its place, so
# the lock serves every torch build; scripts/test.sh installs it from requirements/torch.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=requirements/lock-cpu-py311.txt
[ -x .venv/bin/uv ] || { python3 -m venv .venv && .venv/bin/pip install -q uv; }
source scripts/pip_find_links.sh
.venv/bin/uv pip compile pyproject.toml requirements/torch.txt --extra test --extra bnb --extra report \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 "${find_links[@]}" \
  --generate-hashes --no-emit-package torch --upgrade --quiet \
  --custom-compile-command "bash scripts/lock.sh" --output-file "$LOCK" "$@"
# torch's CUDA build (PyPI's, where no find-links hold the CPU one) would lock its NVIDIA libraries and Triton.
if grep -q -E '^(triton|nvidia-(cu|nccl)[a-z0-9-]*)==' "$LOCK"; then
  echo "lock: error: $LOCK resolved torch's CUDA build (NVIDIA wheels in it); put the CPU build's wheel" \
    "(torch-2.13.0+cpu, https://download.pytorch.org/whl/cpu) in a directory PIP_FIND_LINKS names and run again" >&2
  exit 1
fi
echo "$LOCK: $(grep -c -E '^[a-z0-9]' "$LOCK") projects pinned with their hashes (torch: requirements/torch.txt)"
