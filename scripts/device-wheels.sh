#!/usr/bin/env bash
# The wheels scripts/gpu-check.sh needs beyond the GPU image (docs/GPU.md): Linux x86-64 wheels
# from PyPI, for the image's Python, into a folder that travels with the working tree.
#   scripts/device-wheels.sh [--python-version 3.12] [--dest .whl]
# The image has torch, transformers 5.17, numpy, scipy, tokenizers, safetensors, huggingface-hub,
# pillow, httpx, jinja2, pyyaml, psutil... This tree calls transformers 5.24's module layout
# (pyproject.toml), whose import-time checks want newer tokenizers, safetensors, regex and
# huggingface-hub than 5.17 does; dashscope ships the Qwen BPE ranks the dev tokenizer is built
# from (only its files are read, so none of its dependencies come); accelerate is what
# from_pretrained(device_map=...) needs, as the engine process loads a checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=3.12
dest=.whl
while [[ $# -gt 0 ]]; do
  case $1 in
    --python-version) python_version=$2; shift 2 ;;
    --dest) dest=$2; shift 2 ;;
    *) echo "usage: $0 [--python-version X.Y] [--dest DIR]" >&2; exit 2 ;;
  esac
done
# The versions this tree is tested with (the development venv's).
packages=(
  transformers==5.24.0
  huggingface-hub==1.33.0   # transformers 5.24 wants >= 1.31; 2.x would need httpx2 and a newer click
  tokenizers==0.23.3
  safetensors==0.8.0
  regex==2026.11.19
  dashscope==2.0.2
  accelerate==1.15.0
)
python=${PYTHON:-python3}
mkdir -p "$dest"
rm -f "$dest"/*.whl
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dest" \
  --implementation cp --python-version "$python_version" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any "${packages[@]}"
total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
ls -l "$dest"/*.whl
echo "device-wheels: $(ls "$dest"/*.whl | wc -l) wheels, $(( (total + 1048575) / 1048576 )) MiB in $dest (rounded up)"
# The issue's budget for the kit: the working tree and the wheels travel together within 64 MiB.
if (( total > 48 * 1024 * 1024 )); then
  echo "device-wheels: over the 48 MiB budget" >&2
  exit 1
fi
