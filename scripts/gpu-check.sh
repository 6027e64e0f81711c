#!/usr/bin/env bash
# The device check (scripts/gpu_check.py says what it measures): unattended, offline, under 8 minutes.
#   scripts/gpu-check.sh                       # CUDA, bfloat16, Qwen3-Omni's real size with random weights
#   scripts/gpu-check.sh --device cpu          # the dev model on CPU in float32 (a dry run)
# Python: $PYTHON, else .venv/bin/python when present, else python3 (the installed packages).
# Wheels: the packages the GPU image lacks (scripts/device-wheels.sh gathers them) are installed
# from $DEVICE_WHEELS, else .whl/, into a temporary directory put first on the path; nothing
# is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${PYTHON:-}" ]]; then
  python=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  python=.venv/bin/python
else
  python=python3
fi
wheels=${DEVICE_WHEELS:-.whl}
site=""
if compgen -G "$wheels/*.whl" > /dev/null; then
  site=$(mktemp -d -t gpu-check-site-XXXXXX)
  trap 'rm -rf "$site"' EXIT
  echo "gpu-check: installing $(ls "$wheels"/*.whl | wc -l) wheels from $wheels into $site"
  if ! "$python" -m pip --version > /dev/null 2>&1; then
    # No pip in the image: a wheel is a zip of its files as they lie in site-packages.
    "$python" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
      "$site" "$wheels"/*.whl
  else
    "$python" -m pip install --quiet --no-index --no-deps --target "$site" "$wheels"/*.whl
  fi
fi
# Nothing may be fetched: the tokenizer is built from the wheels' files, and the hub is off.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="${site:+$site:}$PWD${PYTHONPATH:+:$PYTHONPATH}"
# 470 s: the 8-minute budget less a margin for the interpreter to report a timeout.
timeout --kill-after=10 470 "$python" scripts/gpu_check.py "$@"
