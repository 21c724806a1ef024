#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
#   bash scripts/test.sh            # the whole suite
#   bash scripts/test.sh -k export  # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: Chromium renders the HTML report in its test; the PostgreSQL server backs the
# multi-worker tests (the suite starts its own server in a temp dir, on loopback).
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)  # selenium drives chromium through it
# DeepSpeed compiles its C++ ops (the zero lever's tests) with the system's C++ compiler.
command -v g++ >/dev/null 2>&1 || need+=(g++)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# torch first, pinned: an open `torch` requirement with no torch installed pulls a multi-GB CUDA build.
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
# DeepSpeed next (the [test] extra's own requirement lines, read from pyproject.toml), then its two C++ ops
# built in the background (scripts/build_deepspeed_ops.py: minutes of compiling on 2 cores, which would
# otherwise happen inside the ZeRO tests' trials), while the rest installs and lint and types run.
mapfile -t deepspeed_requirements < <(python3 -c '
import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]
print("\n".join(r for r in extra if r.startswith(("deepspeed", "ninja"))))')
.venv/bin/pip install -q "${deepspeed_requirements[@]}"
mkdir -p .venv/logs
op_builds=()
for op in ShareMemCommBuilder CPUAdamBuilder; do
  .venv/bin/python scripts/build_deepspeed_ops.py "$op" > ".venv/logs/build-$op.log" 2>&1 &
  op_builds+=($!)
done
.venv/bin/pip install -q -e '.[test]'

# Lint, format and types first (seconds; mypy about a minute): a red line here names the file and the fix.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy

export HF_HUB_OFFLINE=1
# Bytecode caches written: a machine that sets PYTHONDONTWRITEBYTECODE (this one does) has every process
# (each search, each forkserver, each rank) compile autotune's editable sources again, about 0.7 s each.
unset PYTHONDONTWRITEBYTECODE
status=0
# Three workers on two cores (each trial with one OpenMP thread: tests/conftest.py); the cores are busy
# throughout (vmstat), so a fourth worker would only share them.
# --no-loadscope-reorder: files start in the order tests/conftest.py gives them (heaviest first).
# --durations: every CI log shows where the time goes (the suite runs close to its time limit).
.venv/bin/python -m pytest -q -ra -n 3 --dist loadfile --no-loadscope-reorder --durations=40 "$@" || status=$?
for build in "${op_builds[@]}"; do wait "$build" || echo "a DeepSpeed op build failed (the trials built it themselves): $(ls .venv/logs/build-*.log)" >&2; done
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here, not a pass" >&2
  exit 1
fi
exit "$status"
