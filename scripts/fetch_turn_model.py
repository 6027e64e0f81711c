"""Install-time fetch of the end-of-turn model (smart-turn v3.2) from the pipecat-ai wheel on PyPI.

Run by ``make`` when the venv is (re)built: ``python scripts/fetch_turn_model.py [--cache-dir DIR]``.
``pip download``s the wheel (no dependencies) into a temporary directory, extracts only the ONNX
file, checks its sha256 and writes it to ``DIR/smart-turn-v3.2-cpu.onnx`` (default
``~/.cache/omni-rtc``, the dev model's cache). A file already there with the right checksum is
kept, so re-running costs nothing and needs no network. The server never downloads it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from media.end_of_turn_model import (
    TURN_MODEL_SHA256,
    TURN_MODEL_WHEEL,
    TURN_MODEL_WHEEL_PATH,
    default_turn_model_path,
    file_sha256,
)


def fetch(cache_dir: Path) -> Path:
    target = default_turn_model_path(cache_dir)
    if target.is_file() and file_sha256(target) == TURN_MODEL_SHA256:
        print(f"{target}: present, sha256 ok")
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "-d", scratch, TURN_MODEL_WHEEL],
            check=True,
        )
        (wheel,) = Path(scratch).glob("pipecat_ai-*.whl")
        partial = target.with_suffix(".part")
        with zipfile.ZipFile(wheel) as archive, archive.open(TURN_MODEL_WHEEL_PATH) as source:
            partial.write_bytes(source.read())
    digest = file_sha256(partial)
    if digest != TURN_MODEL_SHA256:
        partial.unlink()
        raise SystemExit(f"{TURN_MODEL_WHEEL_PATH} from {TURN_MODEL_WHEEL} has sha256 {digest}, "
                         f"expected {TURN_MODEL_SHA256}; not installed")
    partial.replace(target)
    print(f"{target}: fetched from {TURN_MODEL_WHEEL}, sha256 ok")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "omni-rtc")
    fetch(parser.parse_args().cache_dir)


if __name__ == "__main__":
    main()
