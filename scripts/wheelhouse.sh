#!/usr/bin/env bash
# Offline install: on a machine with a package index, write every wheel autotune needs for a target
# Python and platform into one directory; copy it to a machine without one and install from it.
#
#   scripts/wheelhouse.sh --out DIR [--llm] [--python-version 3.12] [--platform manylinux_2_17_x86_64]
#                         [--target-has NAME,...]
#
# Without --python-version/--platform the wheels are for the interpreter running this script
# (PYTHON, default python3). DIR receives autotune's own wheel (`pip wheel --no-deps`) and, from
# `pip download --only-binary=:all:`, its dependencies and theirs (with --llm, also its `sft` and `liger`
# extras, TRL and liger-kernel, for scripts/gpu_acceptance.sh llm, and what they need: TRL's datasets
# brings pyarrow and pandas, some 70 MB, past what the device tool carries if the target lacks them), except:
#   * what the target interpreter already has (scripts/wheelhouse-excluded.txt: a CUDA torch and
#     its stack), so that the interpreter's own torch is the one that trains;
#   * plotly, which only `autotune report` needs (pyproject's [report] extra);
#   * what --target-has names besides: projects this target has that the list does not (the lent H200's image has
#     pandas and pyarrow, which TRL's datasets needs: `--target-has pandas,pyarrow` keeps a --llm wheelhouse
#     within what the device tool carries; a target whose copy is too old fails the install in pip's one line).
# Every project the lock (requirements/lock-cpu-py311.txt) holds comes at its locked version (the target's
# own aside), and each file downloaded is checked against the lock's hashes (scripts/lock.py verify: every
# file of a pinned release is hashed there, so another Python or platform is checked too); a target Python
# that a locked release does not support fails in pip's resolution. What the lock does not hold
# (liger-kernel, with --llm) is named.
# On the target, into the interpreter that has torch (a venv made from a venv does not see it):
#   python3 -m pip install --no-index --find-links DIR autotune
# pip keeps every requirement the interpreter already satisfies and takes the rest from DIR; a wheel
# missing from DIR is an error there, never a download.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="" TARGET=() LLM=0 TARGET_HAS=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --llm) LLM=1; shift ;;
        --python-version) TARGET+=(--python-version "$2"); shift 2 ;;
        --platform) TARGET+=(--platform "$2"); shift 2 ;;
        --target-has) TARGET_HAS="$TARGET_HAS,$2"; shift 2 ;;
        *) echo "wheelhouse: error: unknown argument $1 (--out DIR [--llm] [--python-version X.Y] [--platform TAG] [--target-has NAME,...])" >&2; exit 2 ;;
    esac
done
if [[ -z "$OUT" ]]; then
    echo "wheelhouse: error: --out DIR is required" >&2
    exit 2
fi
if [[ ${#TARGET[@]} -gt 0 ]]; then
    TARGET+=(--implementation cp)
fi
mkdir -p "$OUT"

# Built from a copy of what the wheel holds (pyproject.toml names it), so no build/ left in the checkout
# can slip a stale file into the wheel.
SOURCE="$(mktemp -d)"
trap 'rm -rf "$SOURCE"' EXIT
cp -r "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/autotune" "$REPO/search_spaces" "$SOURCE/"
EXCLUDED="$SOURCE/excluded.txt"  # what the target has, and what the search does not need
{ cat "$REPO/scripts/wheelhouse-excluded.txt"; tr ',' '\n' <<< "$TARGET_HAS"; } > "$EXCLUDED"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$OUT" "$SOURCE"
LOCK="$REPO/requirements/lock-cpu-py311.txt"
"$PYTHON" "$REPO/scripts/wheelhouse_requirements.py" --constraints "$LOCK" "$EXCLUDED" > "$SOURCE/constraints.txt"
DOWNLOAD=("$PYTHON" -m pip download --quiet --only-binary=:all: "${TARGET[@]}" --constraint "$SOURCE/constraints.txt" --dest "$OUT")
# autotune's requirements, less what the target has and what the search does not need.
mapfile -t REQUIREMENTS < <("$PYTHON" "$REPO/scripts/wheelhouse_requirements.py" "$OUT" "$EXCLUDED")
"${DOWNLOAD[@]}" "${REQUIREMENTS[@]}"
# The sft and liger extras (TRL, liger-kernel) without their dependencies, then what they need that the
# target lacks, with theirs (scripts/wheelhouse_requirements.py says why in two steps).
if [[ $LLM -eq 1 ]]; then
    mapfile -t EXTRAS < <("$PYTHON" "$REPO/scripts/wheelhouse_requirements.py" --extras "$OUT")
    "${DOWNLOAD[@]}" --no-deps "${EXTRAS[@]}"
    mapfile -t EXTRAS_NEED < <("$PYTHON" "$REPO/scripts/wheelhouse_requirements.py" --extras-needs "$OUT" "$EXCLUDED")
    if [[ ${#EXTRAS_NEED[@]} -gt 0 ]]; then
        "${DOWNLOAD[@]}" "${EXTRAS_NEED[@]}"
    fi
fi
# Their own dependencies may name a preinstalled project (optuna needs numpy): the target's is used.
"$PYTHON" "$REPO/scripts/wheelhouse_requirements.py" --prune "$OUT" "$EXCLUDED"
"$PYTHON" "$REPO/scripts/lock.py" verify "$LOCK" "$OUT"
du -sh "$OUT" >&2
