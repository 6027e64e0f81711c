"""Debian's Chromium, headless, with a fake microphone that plays a WAV once (and, if asked, a fake
camera that plays a Y4M video in a loop).

Playwright drives the system browser (``/usr/bin/chromium``); ``playwright install`` is never
needed. The flags keep Chromium off the network (no component updates, sync or QUIC probes)
and let WebRTC use the loopback interface, so a test talks only to 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
from playwright.async_api import Browser, Playwright

CHROMIUM = "/usr/bin/chromium"
# Chromium's fake capture device converts whatever the WAV holds to its capture format; 48 kHz
# mono PCM16 is that format already, so the file plays exactly as written.
FAKE_MICROPHONE_RATE = 48_000

QUIET_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-loopback-in-peer-connection",
]


@dataclass(frozen=True)
class Silence:
    seconds: float


def write_fake_microphone(path: Path, segments: Iterable[Path | Silence]) -> Path:
    """Concatenates speech WAVs and silences into one 48 kHz mono PCM16 WAV at ``path``."""
    parts = []
    for segment in segments:
        if isinstance(segment, Silence):
            parts.append(np.zeros(round(segment.seconds * FAKE_MICROPHONE_RATE), dtype=np.float32))
            continue
        audio, rate = sf.read(segment, dtype="float32", always_2d=True)
        parts.append(soxr.resample(audio.mean(axis=1), rate, FAKE_MICROPHONE_RATE).astype(np.float32))
    sf.write(path, np.concatenate(parts), FAKE_MICROPHONE_RATE, subtype="PCM_16")
    return path


async def launch_chromium(
    playwright: Playwright, *, microphone: Path | None, camera: Path | None = None, extra_args: Iterable[str] = ()
) -> Browser:
    """Headless Chromium. With ``microphone``, getUserMedia is granted without a prompt and
    captures the WAV (played once, then silence); without it, no permission is granted, so a
    page that asks for the microphone is refused. ``camera``: a Y4M file the fake camera plays
    (looped); without it the fake camera shows Chromium's own test pattern. ``extra_args`` go
    to Chromium as they are."""
    args = [*QUIET_ARGS, *extra_args]
    if microphone is not None:
        args += [
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={microphone}%noloop",
        ]
        if camera is not None:
            args.append(f"--use-file-for-fake-video-capture={camera}")
    else:
        # A fake device still exists, so the refusal is the permission's, not a missing device.
        args += ["--use-fake-device-for-media-stream", "--deny-permission-prompts"]
    return await playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
