"""What a hostile peer sends, made reproducibly for the tests and tests/bench/abuse.py."""

from __future__ import annotations

import functools
import random
import string

# No '"' or '\\': JSON carries them as two characters, and an event of them would pass 256 KiB.
PUNCTUATION = string.punctuation.replace('"', "").replace("\\", "")


def punctuation(chars: int, seed: int = 34) -> str:
    """Random punctuation: Qwen's costliest text, ~0.7 tokens a byte (prose is ~0.2)."""
    rng = random.Random(seed)
    return "".join(rng.choice(PUNCTUATION) for _ in range(chars))


def punctuation_tools(count: int = 16, chars: int = 15_000) -> list[dict]:
    """The audit's ``session.update``: function tools whose descriptions are punctuation, each
    just under ``max_text_chars``; 16 of them make a ~241 KB event."""
    return [
        {"type": "function", "name": f"tool_{index}", "description": punctuation(chars, seed=index),
         "parameters": {"type": "object"}}
        for index in range(count)
    ]


def flac_silence(seconds: float = 600.0, rate: int = 24_000) -> bytes:
    """An audio decode bomb: ten minutes of silence at 24 kHz are 43 KB of FLAC (58 KB as base64)
    and 55 MiB once decoded to float32: what the audit's upstream sent."""
    import io

    import numpy as np
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(int(seconds * rate), np.float32), rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


@functools.cache
def flat_png(width: int, height: int) -> bytes:
    """An RGBA PNG of one colour, made a row at a time (never the whole image in memory): the
    audit's 50 MP one (7071 x 7071) is ~212 KB here (194 KB there) and decodes to 200 MB (~2.6 s to make)."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    compressor = zlib.compressobj(9)
    row = b"\x00" + bytes((10, 20, 30, 255)) * width  # filter byte 0, then one opaque colour
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


# A regular expression that backtracking engines (Python's ``re``) take exponential time on: a
# string of n characters without the final X costs ~2^n steps (29 characters ~10 s on the shared
# development box). RE2 and other linear-time engines answer at once.
CATASTROPHIC_PATTERN = "^(.+)+X$"


def catastrophic_pattern_tool(name: str = "lookup") -> dict:
    """A function tool whose one string parameter must match :data:`CATASTROPHIC_PATTERN`: checking
    a call's arguments against it runs the pattern on whatever the model wrote."""
    return {
        "type": "function", "name": name, "description": "Looks a code up.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "pattern": CATASTROPHIC_PATTERN}},
                       "required": ["code"]},
    }


def forced_tool_call(name: str, arguments: dict) -> str:
    """The reply that makes the dev model call a tool (``omni-rtc serve --dev-replies``): Qwen's
    tool-call markup, forced through the real tokenizer."""
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
