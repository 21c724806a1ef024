#!/usr/bin/env bash
# Drift: the fast loop and one short search and export on the newest releases pyproject.toml's ranges allow
# (what `pip install autotune` would get today; torch still requirements/torch.txt's CPU build), in its own
# venv, .venv-latest, so that a release that breaks autotune is seen here before a user sees it. It is
# information, not CI: .ci/run does not run it. It records the date, the versions that differ from the lock
# (requirements/lock-cpu-py311.txt), the newer releases the ranges keep out, and each step's outcome in
# docs/drift.md; exit 1 if a step failed. Where all passed and versions moved, `bash scripts/lock.sh` takes
# them into the lock (then run the suite on it).
#   bash scripts/latest.sh
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-latest
LOCK=requirements/lock-cpu-py311.txt
RECORD=docs/drift.md
MARK='<!-- scripts/latest.sh writes below this line -->'
export HF_HUB_OFFLINE=1
unset PYTHONDONTWRITEBYTECODE
start=$(date +%s)
commit=$(git describe --always --dirty)
outcomes=()
failed=0
step() {  # step NAME COMMAND...: run it, its output in .venv-latest/logs/NAME.log, its outcome recorded
  local name=$1 status=0
  shift
  echo "latest: $name" >&2
  "$@" > "$VENV/logs/$name.log" 2>&1 || status=$?
  local last
  last=$(grep -v '^\s*$' "$VENV/logs/$name.log" | tail -1)
  if [ "$status" -eq 0 ]; then
    outcomes+=("| $name | passed | ${last//|/\\|} |")
  else
    outcomes+=("| $name | **failed** (exit $status) | ${last//|/\\|} |")
    failed=1
  fi
}

# The record's first lines, kept: everything up to the mark.
kept=$(grep -n -x -F "$MARK" "$RECORD" | cut -d: -f1)
if [ -z "$kept" ]; then
  echo "latest: error: $RECORD lacks the line $MARK (the record goes below it): put it back" >&2
  exit 2
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
mkdir -p "$VENV/logs"
"$VENV/bin/pip" install -q uv
PIP="$VENV/bin/pip" source scripts/pip_find_links.sh
install() {
  # --refresh: the package index asked again, not uv's cached answer (the newest releases of today).
  "$VENV/bin/uv" pip install --refresh --python "$VENV/bin/python" "${find_links[@]}" -r requirements/torch.txt -e '.[test]' &&
    echo "$("$VENV/bin/uv" pip freeze --python "$VENV/bin/python" | wc -l) projects installed"
}
step install install
# The fast loop less the one test that this venv fails on purpose: it holds the newest releases, not the lock.
step fast-loop "$VENV/bin/python" -m pytest -q -m "not slow" -n 2 -p no:cacheprovider \
  --deselect tests/test_lock.py::test_this_environment_is_the_tested_set
work=$(mktemp -d)
step search "$VENV/bin/autotune" search --model bert-tiny --device cpu --seq-len 64 --trials 3 \
  --space search_spaces/quick.yaml --storage "sqlite:///$work/study.db" --work-dir "$work/runs"
step export "$VENV/bin/autotune" export --storage "sqlite:///$work/study.db" --out "$work/best_args.json"
rm -rf "$work"

{
  head -n "$kept" "$RECORD"
  echo
  echo "Last run: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, $(($(date +%s) - start)) s," \
    "on $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)."
  echo
  echo "| step | outcome | its last line |"
  echo "|---|---|---|"
  printf '%s\n' "${outcomes[@]}"
  failures=$(grep -h '^FAILED ' "$VENV"/logs/*.log | sed 's/^FAILED /- /')
  if [ -n "$failures" ]; then
    printf '\nFailed tests:\n\n%s\n' "$failures"
  fi
  echo
  "$VENV/bin/python" scripts/lock.py drift "$LOCK"
  echo
  echo "Newer releases that pyproject.toml's ranges or other requirements keep out (\`uv pip list --outdated\`):"
  echo
  echo '```'
  "$VENV/bin/uv" pip list --outdated --python "$VENV/bin/python" 2> /dev/null
  echo '```'
} > "$RECORD.new"
mv "$RECORD.new" "$RECORD"
echo "latest: recorded in $RECORD ($([ "$failed" -eq 0 ] && echo 'every step passed' || echo 'a step failed'))" >&2
exit "$failed"
