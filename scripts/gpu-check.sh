#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py says what it runs): unattended, offline, under 5 minutes.
#   scripts/gpu-check.sh                          # CUDA, bfloat16
#   scripts/gpu-check.sh --device cpu --dtype float32 --tokens 8 16   # dry run without a GPU
# Python: $PYTHON, else .venv/bin/python when present, else python3 (the installed packages).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${PYTHON:-}" ]]; then
  python=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  python=.venv/bin/python
else
  python=python3
fi
# Nothing may be fetched: the dev model is built from installed packages, and the hub is off.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# 290 s: the 5-minute budget less a margin for the interpreter to report a timeout.
exec timeout --kill-after=10 290 "$python" scripts/gpu_check.py "$@"
