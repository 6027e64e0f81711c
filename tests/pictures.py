"""Images and video as tests make them: small, seeded, in the formats clients send."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
from PIL import Image


def rgb(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient with seeded colours (compresses like a photo, unlike noise)."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, size=(2, 2, 3)).astype(np.float32)
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    x = np.linspace(0.0, 1.0, width)[None, :, None]
    top = corners[0, 0] * (1 - x) + corners[0, 1] * x
    bottom = corners[1, 0] * (1 - x) + corners[1, 1] * x
    return (top * (1 - y) + bottom * y).astype(np.uint8)


def encoded(width: int, height: int, *, format: str = "JPEG", seed: int = 0) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb(width, height, seed)).save(out, format=format)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def write_y4m(path: Path, *, width: int, height: int, fps: int, frames: int) -> Path:
    """An uncompressed YUV 4:2:0 video (what Chromium's fake camera and ffmpeg read), each frame
    of its own flat colour so that frames can be told apart."""
    with open(path, "wb") as out:
        out.write(f"YUV4MPEG2 W{width} H{height} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for index in range(frames):
            luma = np.full((height, width), 40 + (index * 37) % 180, dtype=np.uint8)
            chroma = np.full((height // 2, width // 2), 128 + (index * 11) % 64 - 32, dtype=np.uint8)
            out.write(b"FRAME\n" + luma.tobytes() + chroma.tobytes() + chroma.tobytes())
    return path
