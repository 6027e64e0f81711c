"""Input that reaches the session outside WebRTC's 16 kHz stream, read and bounded.

- Audio: base64 in the session's input format (PCM16 at 24 kHz or its ``rate``, G.711 at
  8 kHz) decoded and resampled to 16 kHz (:func:`decode_input_audio`, :func:`read_item_audio`);
  :class:`AppendDecoder` holds ``input_audio_buffer.append`` to real time (20 s ahead, then at
  most twice real time); :class:`ManualBuffer` keeps manual mode's uncommitted audio (60 s).
- Images: ``input_image`` data URLs and pushed frames checked by their header, decoded in a
  worker thread and fitted to the pixel budget (:func:`read_item_images`, :func:`read_frame`),
  within a per-session decode budget (:func:`decode_budget`).
- Camera frames: which sampled frames join the utterance being committed (:class:`TurnFrames`).
Every problem is a ``ProtocolError`` naming the ``param``. docs/SESSION.md "Over a WebSocket" and
"Images and the camera".
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import math
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import soxr

from app.realtime.protocol import (
    ClientContentPart,
    ImageDetail,
    ProtocolError,
)
from app.realtime.session_config import DETAIL_MAX_PIXELS, VideoInput
from app.token_bucket import TokenBucket
from media import g711
from media.frames import FramePlan, SampledFrame
from media.rates import SPEECH_RATE, VOICE_RATE
from pipeline.conversation import UserAudio, UserImage
from pipeline.images import FORMATS, MAX_DECODE_BYTES, ImageError, ImageInfo, decode_bytes, fit, fitted_size, probe

# ---- input_readers ----

MIN_COMMIT_MS = 100  # OpenAI refuses to commit (or take as an item) less than 100 ms of audio


def base64_decoded_size(data: str) -> int:
    """The bytes ``data`` decodes to, read off its length: 3 for each 4 characters, less one for
    each ``=`` of padding (1 s of G.711 is 8,000 bytes, 10,668 characters with one ``=``)."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def decode_pcm16(data: str, param: str) -> np.ndarray:
    """Base64 PCM16 little-endian mono → float32 in [-1, 1); ``ProtocolError`` naming ``param``."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    if len(raw) % 2:
        raise ProtocolError("invalid_value", f"{param} is not whole PCM16 samples (odd byte count).", param=param)
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def decode_input_audio(
    data: str, format_type: str, param: str, *, pcm_rate: int = VOICE_RATE
) -> tuple[np.ndarray, int]:
    """Base64 audio in the session's input format → (float32 PCM, its rate): ``audio/pcm`` is PCM16
    at ``pcm_rate`` (24 kHz unless the session says otherwise), ``audio/pcmu`` / ``audio/pcma``
    G.711 at 8 kHz; ``ProtocolError`` naming ``param``."""
    if format_type not in g711.G711_FORMATS:
        return decode_pcm16(data, param), pcm_rate
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    return g711.decode(raw, format_type), g711.G711_RATE


def audio_ms(data: str, format_type: str, pcm_rate: int = VOICE_RATE) -> float:
    """The milliseconds of audio base64 ``data`` holds in ``format_type``, read off its length."""
    rate, sample_bytes = (g711.G711_RATE, 1) if format_type in g711.G711_FORMATS else (pcm_rate, 2)
    return base64_decoded_size(data) // sample_bytes * 1000 / rate


def read_item_audio(
    content: Sequence[ClientContentPart], *, input_audio_format: str, max_seconds: float,
    input_audio_rate: int = VOICE_RATE,
) -> dict[int, UserAudio]:
    """A user message's ``input_audio`` parts, by part index, as 16 kHz clips; blocking (decoding
    and resampling: call it off the loop). ``input_audio_rate``: the rate of ``audio/pcm`` input.
    Their length is checked from the base64 before any is decoded: the message's audio together is
    at most ``max_seconds`` (one turn's worth, ``HistoryLimits.max_audio_seconds``)."""
    indexed = [(index, part) for index, part in enumerate(content) if part.type == "input_audio"]
    rate, sample_bytes = (g711.G711_RATE, 1) if input_audio_format in g711.G711_FORMATS else (input_audio_rate, 2)
    seconds = 0.0
    for index, part in indexed:
        param = f"item.content[{index}].audio"
        if part.audio is None:
            raise ProtocolError("missing_required_parameter", f"{param} is required.", param=param)
        seconds += base64_decoded_size(part.audio) / sample_bytes / rate
        if seconds > max_seconds:
            raise ProtocolError(
                "invalid_value", f"{param}: the message's audio passes {max_seconds:g} s (one turn's most).", param=param
            )
    clips: dict[int, UserAudio] = {}
    for index, part in indexed:
        param = f"item.content[{index}].audio"
        assert part.audio is not None  # checked above
        pcm, rate = decode_input_audio(part.audio, input_audio_format, param, pcm_rate=input_audio_rate)
        if pcm.size < MIN_COMMIT_MS * rate // 1000:
            raise ProtocolError("invalid_value", f"{param} holds less than {MIN_COMMIT_MS} ms.", param=param)
        clips[index] = UserAudio(soxr.resample(pcm, rate, SPEECH_RATE).astype(np.float32))
    return clips


# ---- input_buffer ----

# Manual mode keeps at most this much uncommitted input audio (the oldest is dropped).
MAX_MANUAL_BUFFER_MS = 60_000
# Appends are bounded by the audio they carry, not by their count (the event gate does not count
# them): a token bucket of audio milliseconds that holds MAX_APPEND_AHEAD_MS and refills at
# APPEND_RATE times real time; past it an append is refused (``input_audio_too_fast``) and
# dropped. A microphone streams at real time, in events of 10 to 100 ms; SDK examples append a
# recorded utterance at once, and 20 s holds any single utterance. Twice real time leaves a
# client that fell behind room to catch up, and keeps one from making the server run VAD over
# hours of audio in seconds (one append of 256 KiB, 5.5 s of PCM16, costs ~170 VAD windows
# inline). Each append costs at least MIN_APPEND_CHARGE_MS, so tiny appends cannot make a flood
# of events: at most 200 a second once the head start is spent, twice what 10 ms events in real
# time need (10 ms events in real time, counted as events at 50 a second, lost 151 of 500).
MAX_APPEND_AHEAD_MS = 20_000
APPEND_RATE = 2.0
MIN_APPEND_CHARGE_MS = 10.0


class ManualBuffer:
    """16 kHz input waiting for ``input_audio_buffer.commit``; the oldest beyond a minute is dropped."""

    def __init__(self) -> None:
        self._chunks: deque[np.ndarray] = deque()
        self.samples = 0

    def append(self, pcm: np.ndarray) -> None:
        self._chunks.append(pcm)
        self.samples += pcm.size
        limit = MAX_MANUAL_BUFFER_MS * SPEECH_RATE // 1000
        while self.samples - self._chunks[0].size >= limit:
            self.samples -= self._chunks.popleft().size

    def clear(self) -> None:
        self._chunks.clear()
        self.samples = 0

    def take(self) -> np.ndarray:
        """Everything buffered, which is then cleared; ``ProtocolError`` below ``MIN_COMMIT_MS``."""
        if self.samples < MIN_COMMIT_MS * SPEECH_RATE // 1000:
            raise ProtocolError(
                "input_audio_buffer_commit_empty",
                f"Buffer too small: expected at least {MIN_COMMIT_MS} ms of audio, "
                f"got {self.samples * 1000 // SPEECH_RATE} ms.",
            )
        pcm = np.concatenate(self._chunks)
        self.clear()
        return pcm


class AppendDecoder:
    """Base64 appends → 16 kHz float32, resampled without seams between appends, bounded by their
    duration: ``MAX_APPEND_AHEAD_MS`` at once, then ``APPEND_RATE`` times real time (a token
    bucket of audio milliseconds; each append costs at least ``MIN_APPEND_CHARGE_MS``)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_ahead_ms: int = MAX_APPEND_AHEAD_MS) -> None:
        self._max_ahead_ms = max_ahead_ms
        self._audio_budget = TokenBucket(max_ahead_ms, 1000 * APPEND_RATE, clock=clock)
        self._format: tuple[str, int] | None = None
        self._resampler: soxr.ResampleStream | None = None

    def decode(self, audio: str, *, input_audio_format: str, pcm_rate: int = VOICE_RATE) -> np.ndarray:
        """The append's audio at 16 kHz. It is charged the duration its base64 claims before it is
        decoded, so an append that fails to decode costs as much as one that does."""
        self._admit(max(audio_ms(audio, input_audio_format, pcm_rate), MIN_APPEND_CHARGE_MS))
        pcm, rate = decode_input_audio(audio, input_audio_format, "audio", pcm_rate=pcm_rate)
        if self._resampler is None or self._format != (input_audio_format, rate):
            self._format = (input_audio_format, rate)  # a new format starts a new stream
            self._resampler = soxr.ResampleStream(rate, SPEECH_RATE, 1, dtype="float32")
        return self._resampler.resample_chunk(pcm)

    def flush(self) -> np.ndarray:
        """What the resampler still holds of the appends so far (its filter's delay: ~9 ms at
        24 kHz), at 16 kHz; the next append starts a new stream. A commit takes it, so that 100 ms
        appended is 100 ms committed; a clear drops it."""
        resampler, self._resampler = self._resampler, None
        if resampler is None:
            return np.zeros(0, dtype=np.float32)
        return resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)

    def _admit(self, audio_ms: float) -> None:
        if not self._audio_budget.take(audio_ms):
            raise ProtocolError(
                "input_audio_too_fast",
                f"Input audio is arriving too fast: {self._max_ahead_ms / 1000:g} s at once, then at most "
                f"{APPEND_RATE:g} times real time, is accepted (each append counts at least "
                f"{MIN_APPEND_CHARGE_MS:g} ms); this append ({audio_ms:.0f} ms) was dropped.",
                param="audio",
            )


# ---- input_images ----

# Images in one message: each costs up to 980 prompt tokens at "high" detail, so eight are a
# prompt of ~8,000 tokens before a word is said.
MAX_IMAGES_PER_ITEM = 8
IMAGE_TOO_LARGE = "image_too_large"
_MIME_TYPES = frozenset(FORMATS.values()) | {"image/jpg"}  # a common misspelling of image/jpeg
# A session's image decoding: the largest image's worth every 6 s (a 4K RGBA screenshot every 4 s;
# a 12 MP photo at "high" decodes 3 MP, 12 MB), bursts of four of the largest. On the loaded dev
# box the largest takes 0.4-1.3 s of a core to decode and fit (tests/bench/abuse.py), so a session
# held to this uses at most a fifth of one.
DECODE_BYTES_PER_SECOND = 16 * 1024 * 1024
DECODE_BURST_BYTES = 4 * MAX_DECODE_BYTES


def decode_budget(*, clock: Callable[[], float] = time.monotonic) -> TokenBucket:
    """A session's budget of decoding (bytes of pixels decoded): ``DECODE_BURST_BYTES`` at once,
    then ``DECODE_BYTES_PER_SECOND``; an image is decoded only if the budget takes its cost."""
    return TokenBucket(DECODE_BURST_BYTES, DECODE_BYTES_PER_SECOND, clock=clock)


async def read_item_images(
    content: Sequence[ClientContentPart], *, max_bytes: int, budget: TokenBucket
) -> dict[int, UserImage]:
    """The images of a user message's ``content``, by part index; decoded in a worker thread,
    once their headers say ``budget`` holds what decoding them takes."""
    indexed = [(index, part) for index, part in enumerate(content) if part.type == "input_image"]
    if not indexed:
        return {}
    if len(indexed) > MAX_IMAGES_PER_ITEM:
        raise ProtocolError(
            "invalid_value", f"A message takes at most {MAX_IMAGES_PER_ITEM} images.", param="item.content"
        )
    return await asyncio.to_thread(_read_all, indexed, max_bytes, budget)


def _read_all(indexed: list[tuple[int, ClientContentPart]], max_bytes: int, budget: TokenBucket) -> dict[int, UserImage]:
    checked = [(index, *check_image(part.image_url, part.detail, max_bytes=max_bytes, param=f"item.content[{index}]"))
               for index, part in indexed]
    cost = sum(cost for *_, cost in checked)
    if not budget.take(cost):
        raise ProtocolError(
            "rate_limit_exceeded",
            f"This message's images take {cost / 2**20:.0f} MiB to decode; a session decodes at most "
            f"{budget.per_second / 2**20:.0f} MiB a second (bursts of {budget.burst / 2**20:.0f}): it was dropped.",
            param="item.content",
        )
    return {index: fitted(data, info, max_pixels, param=f"item.content[{index}].image_url")
            for index, data, info, max_pixels, _ in checked}


def read_frame(image: str, *, max_bytes: int, max_pixels: int, budget: TokenBucket, param: str = "image") -> UserImage:
    """A camera frame a client pushed (``input_image_buffer.append``): base64 JPEG or PNG bytes, no
    data URL; checked, decoded and fitted to ``max_pixels`` (the session's ``video`` budget) when
    ``budget`` holds its decoding. Blocking."""
    if len(image) // 4 * 3 > max_bytes + 2:  # checked before decoding anything
        raise ProtocolError(IMAGE_TOO_LARGE, f"{param} holds more than {max_bytes} bytes of image.", param=param)
    try:
        data = base64.b64decode(image, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    info, cost = _probed(data, max_pixels, max_bytes=max_bytes, param=param)
    if not budget.take(cost):
        raise ProtocolError(
            "rate_limit_exceeded",
            f"This frame takes {cost / 2**20:.0f} MiB to decode; a session decodes at most "
            f"{budget.per_second / 2**20:.0f} MiB a second (bursts of {budget.burst / 2**20:.0f}): it was dropped.",
            param=param,
        )
    return fitted(data, info, max_pixels, param=param)


def check_image(
    url: str | None, detail: ImageDetail | None, *, max_bytes: int, param: str
) -> tuple[bytes, ImageInfo, int, int]:
    """One ``input_image`` checked from its data URL and header, nothing decoded: its bytes, its
    header's facts, its ``detail``'s pixel budget and the memory decoding it takes. Blocking (base64)."""
    url_param = f"{param}.image_url"
    if url is None:
        raise ProtocolError("missing_required_parameter", f"{url_param} is required.", param=url_param)
    header, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise ProtocolError(
            "invalid_value",
            f"{url_param} must be a data URL (data:image/png;base64,... or data:image/jpeg;base64,...); "
            "this server fetches no URLs.",
            param=url_param,
        )
    mime, *parameters = header.removeprefix("data:").split(";")
    if mime.lower() not in _MIME_TYPES or "base64" not in parameters:
        raise ProtocolError(
            "invalid_value",
            f"{url_param} is a data URL of {mime or 'no type'!r}; base64 PNG and JPEG images are taken.",
            param=url_param,
        )
    if len(payload) // 4 * 3 > max_bytes + 2:  # checked before decoding anything
        raise ProtocolError(IMAGE_TOO_LARGE, f"{url_param} holds more than {max_bytes} bytes of image.",
                            param=url_param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{url_param} is not valid base64.", param=url_param) from None
    max_pixels = DETAIL_MAX_PIXELS[detail or "auto"]
    info, cost = _probed(data, max_pixels, max_bytes=max_bytes, param=url_param)
    return data, info, max_pixels, cost


def _probed(data: bytes, max_pixels: int, *, max_bytes: int, param: str) -> tuple[ImageInfo, int]:
    """An image's header facts and the memory decoding it to ``max_pixels`` takes, nothing decoded."""
    if len(data) > max_bytes:
        raise ProtocolError(IMAGE_TOO_LARGE, f"{param} holds more than {max_bytes} bytes of image.", param=param)
    try:
        info = probe(data)
        cost = decode_bytes(data, info, max_pixels)
    except ImageError as exc:
        raise ProtocolError("invalid_value", f"{param}: {exc}.", param=param) from None
    if cost > MAX_DECODE_BYTES:
        why = f"decoding it takes more than {MAX_DECODE_BYTES // 2**20} MiB (a JPEG of it, or a smaller one, is taken)"
        raise ProtocolError("invalid_value", f"{param}: the image is {info.width}x{info.height}; {why}.", param=param)
    return info, cost


def fitted(data: bytes, info: ImageInfo, max_pixels: int, *, param: str) -> UserImage:
    """A checked image decoded and fitted to ``max_pixels`` (``param`` names it in errors). Blocking."""
    try:
        fitted_data, width, height = fit(data, info, max_pixels)
    except ImageError as exc:
        raise ProtocolError("invalid_value", f"{param}: {exc}.", param=param) from None
    return UserImage(fitted_data, width, height, max_pixels)


# ---- camera_frames ----

class TurnFrames:
    """The recent camera frames of one session and whether the user is speaking."""

    def __init__(self) -> None:
        self.speaking = False
        self._idle: deque[UserImage] = deque()  # seen while not speaking, newest last
        self._before: UserImage | None = None  # the last idle frame when speech started
        self._during: deque[UserImage] = deque()  # seen while speaking, since speech or the last take
        self._pushed_at = -math.inf  # when the last pushed frame was kept (the loop's monotonic clock)

    def __len__(self) -> int:
        return len(self._idle) + len(self._during) + (self._before is not None)

    def plan(self, video: VideoInput) -> FramePlan | None:
        """How often to sample the camera now and at what size; None: no frame is wanted now."""
        fps = video.speaking_fps if self.speaking else video.idle_fps
        if fps <= 0 or video.frames_per_turn == 0:
            return None
        max_pixels = video.max_pixels
        return FramePlan(1.0 / fps, lambda width, height: fitted_size(width, height, max_pixels=max_pixels))

    def wants_pushed(self, video: VideoInput, now: float) -> bool:
        """Whether a frame a client pushes at ``now`` is to be kept: one per sampling interval."""
        plan = self.plan(video)
        return plan is not None and now - self._pushed_at >= plan.interval_s

    def add_pushed(self, frame: UserImage, video: VideoInput, now: float) -> None:
        self._pushed_at = now
        self.add(frame, video.frames_per_turn)

    def keep(self, frame: SampledFrame, video: VideoInput) -> None:
        """A frame the call sampled, kept as an image at the session's pixel budget."""
        self.add(UserImage(frame.data, frame.width, frame.height, video.max_pixels), video.frames_per_turn)

    def add(self, frame: UserImage, frames_per_turn: int) -> None:
        if frames_per_turn == 0:
            return
        if self.speaking:
            _push(self._during, frame, frames_per_turn)
        else:
            _push(self._idle, frame, frames_per_turn + 1)

    def speech_started(self) -> None:
        self.speaking = True
        self._before = self._idle[-1] if self._idle else None
        self._idle.clear()
        self._during.clear()

    def speech_ended(self) -> None:
        """The utterance was committed or dropped: later frames are idle ones."""
        self.speaking = False
        self._before = None
        self._during.clear()

    def take(self, frames_per_turn: int) -> tuple[UserImage, ...]:
        """The frames of the utterance being committed (see the module docstring), oldest first."""
        taken = self.peek(frames_per_turn)
        if frames_per_turn and self.speaking:
            self._before = None
            self._during.clear()
        elif frames_per_turn:
            self._idle.clear()
        return taken

    def peek(self, frames_per_turn: int) -> tuple[UserImage, ...]:
        """What ``take`` would return now, taking nothing (a speculative answer's frames)."""
        if frames_per_turn == 0:
            return ()
        if self.speaking:
            before = () if self._before is None else (self._before,)
            return (*before, *list(self._during)[-frames_per_turn:])
        return tuple(list(self._idle)[-(frames_per_turn + 1) :])


def _push(frames: deque[UserImage], frame: UserImage, keep: int) -> None:
    frames.append(frame)
    while len(frames) > keep:
        frames.popleft()

