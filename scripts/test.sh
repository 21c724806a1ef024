#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
#   bash scripts/test.sh            # the whole suite
#   bash scripts/test.sh -k export  # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's start on its own line, seconds since this script started: CI's log shows where its time went
# (pytest's own "in N s" counts only its session).
phase() { echo "== ${SECONDS} s: $*"; }
phase "install"

# System packages: Chromium renders the HTML report in its test; the PostgreSQL server backs the
# multi-worker tests (the suite starts its own server in a temp dir, on loopback). Installed in the
# background, while the Python packages install and lint and types run: only pytest needs them.
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)  # selenium drives chromium through it
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
# DeepSpeed compiles its C++ ops (the zero lever's tests) with the system's C++ compiler: needed first.
if ! command -v g++ >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends g++ >/dev/null
fi
python3 -m venv .venv
mkdir -p .venv/logs
# Bytecode caches written: a machine that sets PYTHONDONTWRITEBYTECODE (this one does) has every process
# (each search, each forkserver, each rank) compile autotune's editable sources and the libraries it
# imports again, about 0.7 s for autotune alone; written once, read by every later process.
unset PYTHONDONTWRITEBYTECODE
system_packages=""
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages in the background: ${need[*]}"
  ( $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" ) \
    > .venv/logs/apt.log 2>&1 &
  system_packages=$!
fi

# The tested set, exactly: requirements/lock-cpu-py311.txt (bash scripts/lock.sh refreshes it) with every
# file's hash checked, and nothing else (`uv pip sync` removes what the lock does not name; it keeps pip and
# uv); then torch (requirements/torch.txt: outside the hashed lock, scripts/lock.sh says why), with the lock
# as constraints, and autotune itself without resolving anything. tests/test_lock.py checks that the venv
# the suite runs in is this set. With uv: the [test] extra in seconds where pip takes about a minute, and
# torch's wheel in 7 s where pip takes 32 s (measured on this 2-core machine, docs/benchmarks.md "The test
# suite"). uv does not read pip's configuration, so pip's find-links (where a machine keeps wheels, such as
# torch's CPU build) are passed on. No bytecode compiled here: each module's is written by the first process
# that imports it.
.venv/bin/pip install -q uv
source scripts/pip_find_links.sh
venv=(--quiet --python .venv/bin/python)
.venv/bin/uv pip sync "${venv[@]}" --require-hashes requirements/lock-cpu-py311.txt
.venv/bin/uv pip install "${venv[@]}" "${find_links[@]}" --constraint requirements/lock-cpu-py311.txt -r requirements/torch.txt
.venv/bin/uv pip install "${venv[@]}" --no-deps -e .
# DeepSpeed's two C++ ops built in the background (scripts/build_deepspeed_ops.py: minutes of compiling on
# 2 cores, which would otherwise happen inside the ZeRO tests' trials), while lint and types run; without
# debug information (scripts/cxx_without_debug_info says why), with the same CXX for pytest's trials, which
# then find them built.
export CXX="${CXX:-$PWD/scripts/cxx_without_debug_info}"
op_builds=()
for op in ShareMemCommBuilder CPUAdamBuilder; do
  .venv/bin/python scripts/build_deepspeed_ops.py "$op" > ".venv/logs/build-$op.log" 2>&1 &
  op_builds+=($!)
done

phase "lint and types (DeepSpeed's ops building in the background)"
# Lint, format and types first (seconds; mypy about a minute): a red line here names the file and the fix.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy

if [ -n "$system_packages" ] && ! wait "$system_packages"; then
  echo "installing the system packages failed (${need[*]}):" >&2
  cat .venv/logs/apt.log >&2
  exit 1
fi

export HF_HUB_OFFLINE=1
status=0
# Three workers on two cores (each trial with one OpenMP thread: tests/conftest.py); the cores are busy
# throughout (vmstat), so a fourth worker would only share them.
# --no-loadscope-reorder: files start in the order tests/conftest.py gives them (heaviest first).
# --durations: every CI log shows where the time goes (the suite runs close to its time limit).
phase "pytest"
.venv/bin/python -m pytest -q -ra -n 3 --dist loadfile --no-loadscope-reorder --durations=40 "$@" || status=$?
phase "pytest ended (exit status $status)"
for build in "${op_builds[@]}"; do wait "$build" || echo "a DeepSpeed op build failed (the trials built it themselves): $(ls .venv/logs/build-*.log)" >&2; done
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here, not a pass" >&2
  exit 1
fi
phase "done"
exit "$status"
