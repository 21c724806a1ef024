#!/usr/bin/env bash
# The fast loop (README: `pytest -m "not slow" -n 2`), timed: its wall time and the machine's load.
# Its budget (2 minutes on a 2-core machine) is checked here, by whoever runs it, never by a test:
# the suite holds no timing assertion. What keeps the loop fast is tests/support/slow_guard.py.
#   bash scripts/fast_loop.sh            # after `bash scripts/test.sh` made .venv
#   bash scripts/fast_loop.sh -k export  # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
start=$(date +%s)
status=0
.venv/bin/python -m pytest -q -m "not slow" -n 2 "$@" || status=$?
echo "fast loop: $(($(date +%s) - start)) s wall (budget: 120 s on 2 quiet cores); load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
