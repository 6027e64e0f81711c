"""The media path's own share of end of speech → first answer audio, part by part, with no model.

Run: .venv/bin/python tests/bench/path_latency.py [--seconds 10] [--answers 40] [--out tests/bench/results/path_latency.json]

Offline, over the speech e2e_latency.py says (its espeak pair and its five finished sentences),
each at 16 alignments against the VAD's 32 ms windows, fed in 20 ms chunks as inbound WebRTC
delivers them (the server's own ``VoiceActivityDetector``, default server VAD, 500 ms):

- ``speech_to_vad_end_ms``: the fixture's last sample → the end of silero's last window at or above
  ``threshold``, where the server VAD places the end of speech (silero's lag, and the window);
- ``band_ms``: that window's end → the first window below the hysteresis threshold (the wait
  counted from there without speculation);
- ``commit_packet_ms``: the commit's sample → the end of the 20 ms packet that holds it (the commit
  cannot come before that packet);
- ``vad_lag_ms``: e2e_latency.py's figure, the commit's packet minus the fixture's last packet,
  beyond the 500 ms wait;
- ``opus_…``: the same over the fixture after Opus, encoded as the headless client encodes its
  microphone (libopus, 48 kbit/s, VoIP) and decoded by libopus, then resampled to 16 kHz by
  swresample as media/inbound.py does (the end of speech where the original's was): the codec's
  lookahead shifts the audio 6.5 ms, and its smeared tail keeps silero above threshold longer.

Live, two aiortc peers on 127.0.0.1 in this one process, each with the pieces its side uses in a
call: the server's inbound audio through ``media.playout.receive_audio`` (the receiver tap and
the jitter buffer) into ``media.inbound.InboundAudio``, its answer from ``OutboundAudioTrack``
through ``OpusTrack``; the client's microphone from ``app.client.webrtc.MicrophoneTrack``
through ``OpusTrack``, the answer read through ``receive_audio`` as the headless client reads it
(and once more through aiortc's own receiver, untouched, as an aiortc client that is not ours
reads it):

- ``inbound_ms``: a microphone frame handed to the client's RTP sender → its 16 kHz samples
  delivered by ``InboundAudio`` (aiortc's sender and receiver, SRTP, UDP, the jitter buffer,
  Opus decode, resampling), the median over ``--seconds`` of frames;
- ``pacing_slot_ms``: ``OutboundAudioTrack.write()`` of an answer at a random moment of the
  silence → its first frame handed to the encoder, over ``--answers`` answers;
- ``outbound_ms``: that frame handed to the encoder → released by the client's jitter buffer
  (Opus encode, RTP, SRTP, UDP, aiortc's receiver, the jitter buffer and Opus decode), and
  ``outbound_stock_aiortc_ms`` the same read through aiortc's own receiver (its ``JitterBuffer``
  holds 4 packets before it releases one, then its decoder thread).

Both peers share one event loop here (in a call they are separate processes), so a part that
waits on the loop is measured with the other side's work in it; the figures are medians, and the
JSON keeps every sample.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import soundfile as sf
import soxr

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aiortc import RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack  # noqa: E402
from e2e_latency import FINISHED, UTTERANCES, VAD_ALIGNMENTS  # noqa: E402
from harness import machine, write_report  # noqa: E402

from app.client.webrtc import AUDIBLE_PEAK, MicrophoneTrack  # noqa: E402
from app.transports.webrtc.ice import loopback_candidates  # noqa: E402
from app.transports.webrtc.sdp import with_opus_inband_fec  # noqa: E402
from media.detector_events import UtteranceCommitted
from media.detector_params import HYSTERESIS, TurnDetectionParams
from media.inbound import InboundAudio  # noqa: E402
from media.libopus import OpusDecoder, OpusEncoder  # noqa: E402
from media.opus import OPUS_BITRATE, OpusTrack  # noqa: E402
from media.outbound import OutboundAudioTrack  # noqa: E402
from media.pacing import FRAME_SAMPLES  # noqa: E402
from media.playout import receive_audio  # noqa: E402
from media.rates import SPEECH_RATE, WIRE_RATE  # noqa: E402
from media.vad import WINDOW_SAMPLES, SileroVad  # noqa: E402
from media.voice_activity_detector import VoiceActivityDetector

FIXTURES = REPO / "tests" / "fixtures"
DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "path_latency.json"
CHUNK = 320  # 20 ms at 16 kHz: one inbound packet
MS = SPEECH_RATE // 1000


# -- offline: the VAD's part -------------------------------------------------------------------


def vad_parts(pcm: np.ndarray, vad: SileroVad, params: TurnDetectionParams, length: int | None = None
              ) -> list[dict[str, float]]:
    """Per alignment: where silero ends the speech, the band, the commit's packet and the lag.
    ``length``: where the speech ends in ``pcm`` (default its end; a decoded clip runs past it)."""
    rows = []
    for alignment in range(VAD_ALIGNMENTS):
        lead = SPEECH_RATE + alignment * WINDOW_SAMPLES // VAD_ALIGNMENTS
        stream = np.concatenate([np.zeros(lead, np.float32), pcm, np.zeros(2 * SPEECH_RATE, np.float32)])
        end = lead + (len(pcm) if length is None else length)
        scores = silero_scores(vad, stream)
        last_speech = max(i for i, p in enumerate(scores) if p >= params.threshold)
        first_quiet = next(i for i in range(last_speech, len(scores)) if scores[i] < params.threshold - HYSTERESIS)
        detector = VoiceActivityDetector(vad, params)
        for start in range(0, len(stream), CHUNK):
            commits = [e for e in detector.push(stream[start : start + CHUNK]) if isinstance(e, UtteranceCommitted)]
            if commits:
                commit = commits[0].audio_end_ms * MS
                packet_end = start + CHUNK
                break
        end_packet = -(-end // CHUNK) * CHUNK
        rows.append({
            "speech_to_vad_end_ms": ((last_speech + 1) * WINDOW_SAMPLES - end) / MS,
            "band_ms": (first_quiet - last_speech - 1) * WINDOW_SAMPLES / MS,
            "commit_packet_ms": (packet_end - commit) / MS,
            "vad_lag_ms": (packet_end - end_packet) / MS - params.silence_duration_ms,
        })
    return rows


def silero_scores(vad: SileroVad, stream: np.ndarray) -> list[float]:
    speech = vad.new_stream()
    return [speech.probability(stream[i : i + WINDOW_SAMPLES]) for i in range(0, len(stream) - WINDOW_SAMPLES, WINDOW_SAMPLES)]


def through_opus(pcm16k: np.ndarray) -> np.ndarray:
    """``pcm16k`` as the server hears it: 48 kHz Opus (the client's encoder), libopus, swresample to 16 kHz."""
    pcm48 = soxr.resample(pcm16k, SPEECH_RATE, WIRE_RATE)
    samples = np.clip(np.rint(pcm48 * 32767), -32768, 32767).astype(np.int16)
    samples = np.concatenate([samples, np.zeros(-len(samples) % FRAME_SAMPLES + 4 * FRAME_SAMPLES, np.int16)])
    encoder, decoder = OpusEncoder(bitrate=OPUS_BITRATE), OpusDecoder()
    resampler = av.AudioResampler(format="fltp", rate=SPEECH_RATE)
    out = []
    for start in range(0, len(samples), FRAME_SAMPLES):
        frame = av.AudioFrame.from_ndarray(decoder.decode(encoder.encode(samples[start : start + FRAME_SAMPLES])).reshape(1, -1),
                                           format="s16", layout="mono")
        frame.sample_rate = WIRE_RATE
        out += [f.to_ndarray().mean(axis=0, dtype=np.float32) for f in resampler.resample(frame)]
    encoder.close()
    decoder.close()
    return np.concatenate(out)[: len(pcm16k) + 4 * CHUNK]


def offline(vad: SileroVad) -> dict[str, Any]:
    params = TurnDetectionParams()
    per_fixture: dict[str, Any] = {}
    for name in UTTERANCES + FINISHED:
        pcm = sf.read(FIXTURES / name, dtype="float32")[0]
        rows = vad_parts(pcm, vad, params)
        opus_rows = vad_parts(through_opus(pcm), vad, params, length=len(pcm))
        per_fixture[name] = {key: [row[key] for row in rows] for key in rows[0]}
        per_fixture[name] |= {f"opus_{key}": [row[key] for row in opus_rows] for key in opus_rows[0]}
    return per_fixture


# -- live: two peers on loopback ---------------------------------------------------------------


class StampedTrack(MediaStreamTrack):
    """Passes ``source``'s frames on, noting when each was handed on (by pts)."""

    kind = "audio"

    def __init__(self, source: MediaStreamTrack) -> None:
        super().__init__()
        self._source = source
        self.handed: dict[int, float] = {}

    async def recv(self) -> Any:
        frame = await self._source.recv()
        self.handed[int(frame.pts or 0)] = time.monotonic()
        return frame

    def stop(self) -> None:
        super().stop()
        self._source.stop()


class Pair:
    """A client and a server peer connected on loopback, with the media pieces of each side."""

    def __init__(self, *, stock_client_receiver: bool = False) -> None:
        self.microphone = MicrophoneTrack()
        self.stamped_microphone = StampedTrack(self.microphone)
        self.output = OutboundAudioTrack()
        self.started_at: float | None = None  # when the answer's first frame was handed to the encoder
        self.output.set_listener(self)
        self.inbound_frames: list[tuple[int, float]] = []  # (pts, released by the jitter buffer)
        self.inbound_delivered: list[float] = []  # each InboundAudio delivery
        self.received: list[tuple[float, float]] = []  # client: (arrival, peak) of each answer frame
        self._stock = stock_client_receiver
        self._tasks: list[asyncio.Task[None]] = []
        self._inbound: InboundAudio | None = None
        self.client = RTCPeerConnection()
        self.server = RTCPeerConnection()

    def on_playback_started(self) -> None:
        self.started_at = time.monotonic()

    def on_playback_stopped(self) -> None:
        return None

    async def connect(self) -> None:
        self.client.addTrack(OpusTrack(self.stamped_microphone))
        self.client.on("track", self._client_track)
        self.server.on("track", self._server_track)
        with loopback_candidates(True):
            await self.client.setLocalDescription(await self.client.createOffer())
            await self.server.setRemoteDescription(
                RTCSessionDescription(with_opus_inband_fec(self.client.localDescription.sdp), "offer"))
            self.server.addTrack(OpusTrack(self.output))
            await self.server.setLocalDescription(await self.server.createAnswer())
        await self.client.setRemoteDescription(
            RTCSessionDescription(with_opus_inband_fec(self.server.localDescription.sdp), "answer"))
        for _ in range(200):
            if self.received and self.inbound_delivered:
                return
            await asyncio.sleep(0.05)
        raise SystemExit("the loopback peers exchanged no audio within 10 s")

    def _server_track(self, track: MediaStreamTrack) -> None:
        receiver = next(t.receiver for t in self.server.getTransceivers() if t.receiver.track is track)
        playout = StampedTrack(receive_audio(receiver))
        self._server_playout = playout
        self._inbound = InboundAudio(playout, on_audio=lambda _: self.inbound_delivered.append(time.monotonic()))
        self._inbound.start()

    def _client_track(self, track: MediaStreamTrack) -> None:
        receiver = next(t.receiver for t in self.client.getTransceivers() if t.receiver.track is track)
        source = track if self._stock else receive_audio(receiver)
        self._tasks.append(asyncio.ensure_future(self._read_answer(source)))

    async def _read_answer(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                peak = float(np.max(np.abs(frame.to_ndarray()))) / 32768
                self.received.append((time.monotonic(), peak))

    async def close(self) -> None:
        if self._inbound is not None:
            await self._inbound.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()
        await self.server.close()


async def inbound(pair: Pair, seconds: float, speech48k: np.ndarray) -> list[float]:
    """Per microphone frame: handed to the client's sender → delivered by the server's InboundAudio."""
    pair.inbound_delivered.clear()
    playout: StampedTrack = pair._server_playout
    playout.handed.clear()
    first = len(pair.inbound_delivered)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await pair.microphone.play(speech48k)
    await asyncio.sleep(0.2)
    sent = pair.stamped_microphone.handed
    # The server's timeline counts from the first packet it received, the call's first frame (pts 0
    # on loopback, where nothing is lost): its pts are the client's.
    delays = []
    released = sorted(playout.handed.items())
    deliveries = pair.inbound_delivered[first:]
    for (pts, _), delivered in zip(released, deliveries, strict=False):  # one delivery per frame
        if pts in sent:
            delays.append((delivered - sent[pts]) * 1000)
    return delays


async def outbound(pair: Pair, answers: int, rng: random.Random) -> tuple[list[float], list[float]]:
    """Per answer written at a random moment: (write → first frame handed on, that → received audible)."""
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(2400) / 24_000)).astype(np.float32)  # 100 ms at 24 kHz
    slots, paths = [], []
    for _ in range(answers):
        await asyncio.sleep(0.3 + rng.random() * 0.02)  # past the last answer's tail, at a random phase
        pair.started_at = None
        mark = len(pair.received)
        written = time.monotonic()
        pair.output.write(tone)
        while True:
            await asyncio.sleep(0.005)
            heard = [at for at, peak in pair.received[mark:] if peak >= AUDIBLE_PEAK]
            if heard and pair.started_at is not None:
                break
        slots.append((pair.started_at - written) * 1000)
        paths.append((heard[0] - pair.started_at) * 1000)
    return slots, paths


async def live(seconds: float, answers: int) -> dict[str, list[float]]:
    speech48k = soxr.resample(sf.read(FIXTURES / "hello.wav", dtype="float32")[0], SPEECH_RATE, WIRE_RATE)
    rng = random.Random(33)
    pair = Pair()
    try:
        await pair.connect()
        inbound_ms = await inbound(pair, seconds, speech48k)
        slots, paths = await outbound(pair, answers, rng)
    finally:
        await pair.close()
    stock = Pair(stock_client_receiver=True)
    try:
        await stock.connect()
        _, stock_paths = await outbound(stock, answers, rng)
    finally:
        await stock.close()
    return {"inbound_ms": inbound_ms, "pacing_slot_ms": slots, "outbound_ms": paths, "outbound_stock_aiortc_ms": stock_paths}


def summarise(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 1), "mean": round(statistics.fmean(ordered), 1),
            "min": round(ordered[0], 1), "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
            "max": round(ordered[-1], 1), "n": len(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="of microphone frames for inbound_ms")
    parser.add_argument("--answers", type=int, default=40, help="answers written, per receiver")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    vad = SileroVad.load()
    per_fixture = offline(vad)
    pooled: dict[str, list[float]] = {}
    for rows in per_fixture.values():
        for key, values in rows.items():
            pooled.setdefault(key, []).extend(values)
    live_parts = asyncio.run(live(args.seconds, args.answers))
    parts = {**pooled, **live_parts}
    summary = {name: summarise(values) for name, values in parts.items()}
    print(f"{'part':<28}{'median':>8}{'mean':>8}{'min':>8}{'p90':>8}{'max':>8}{'n':>6}   (ms)")
    for name, stats in summary.items():
        print(f"{name:<28}" + "".join(f"{stats[k]:>8}" for k in ("median", "mean", "min", "p90", "max")) + f"{stats['n']:>6}")
    write_report(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine(),
                            "summary": summary, "per_fixture": per_fixture, "live": live_parts})


if __name__ == "__main__":
    main()
