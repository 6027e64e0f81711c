"""What a huge camera costs a media process's memory: a call whose peer sends a 4096x4096 VP8
stream at ~30 KB/s (unguarded, aiortc decodes every frame, 25 MB each, and queues them unbounded).

Run: .venv/bin/python tests/bench/video_abuse.py [--sizes 640 4096] [--seconds 20] [--fps 10]
     [--out tests/bench/results/video_abuse.json]

One process holds both ends on 127.0.0.1: a call (``app.transports.webrtc.peer_call.Call``) whose session stand-in
wants a camera frame every second at the session's default budget (100,352 pixels), and an aiortc
peer whose camera sends one flat grey key frame and 9 inter frames coded once by libvpx
(``tests/hostile_video.py``: ~28 KB and ~0.3 KB each), over and over at ``--fps``. The process's
RSS is sampled every 0.5 s for ``--seconds`` from before the call; the result is its peak and its
last value above that start, with the frames the call decoded and kept. Each size is one call, in
turn, after a 3 s call that loads what any call loads (aiortc's codecs, libopus...): a 640x640
camera is the control, what a call costs with a camera decoded. The script runs on the tree
before the fix too (it uses the call, not the gate), which is how the "before" was taken.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import psutil
from aiortc import RTCPeerConnection, RTCSessionDescription
from harness import machine, write_report  # this folder: a script's is first on sys.path

from app.client.webrtc import MicrophoneTrack
from app.transports.webrtc.ice import loopback_candidates, rtc_configuration
from app.transports.webrtc.peer_call import Call
from media.frames import FramePlan, SampledFrame
from pipeline.images import fitted_size
from tests import hostile_video

SESSION_PIXELS = 100_352  # the session's default camera budget (app/realtime/session_config.py, "low")


class WantsFrames:
    """The session's side of a call, as far as the camera goes: a frame a second, kept."""

    def __init__(self, output: Any, send: Any) -> None:
        self.frames: list[SampledFrame] = []

    async def start(self) -> None:
        pass

    async def handle_message(self, raw: str | bytes) -> None:
        pass

    flooding = False
    echo_cancellation = False

    def push_audio(self, pcm: Any) -> None:
        pass

    def video_plan(self) -> FramePlan:
        return FramePlan(1.0, lambda width, height: fitted_size(width, height, max_pixels=SESSION_PIXELS))

    def add_video_frame(self, frame: SampledFrame) -> None:
        self.frames = [*self.frames[-4:], frame]  # the session keeps a handful

    async def close(self) -> None:
        pass

    def on_playback_started(self) -> None:
        pass

    def on_playback_stopped(self) -> None:
        pass

    def transport_sent(self, event: dict[str, Any]) -> None:
        pass


async def measure(size: int, seconds: float, fps: float) -> dict[str, Any]:
    frames = hostile_video.coded_frames("libvpx", size, size, count=10)
    process = psutil.Process()
    start_rss = process.memory_info().rss
    sessions: list[WantsFrames] = []

    def make_session(output: Any, send: Any) -> WantsFrames:
        sessions.append(WantsFrames(output, send))
        return sessions[-1]

    call = Call(make_session=make_session, configuration=rtc_configuration([]), ice_loopback=True)  # type: ignore[arg-type]
    pc = RTCPeerConnection(rtc_configuration([]))
    camera = hostile_video.CodedVideoTrack(frames, fps=fps)
    pc.createDataChannel("oai-events")
    pc.addTrack(MicrophoneTrack())
    pc.addTransceiver(camera, direction="sendonly")
    samples: list[int] = []
    try:
        with loopback_candidates():
            await pc.setLocalDescription(await pc.createOffer())
        answer = await call.answer(pc.localDescription.sdp)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await asyncio.sleep(0.5)
            samples.append(process.memory_info().rss - start_rss)
        video: Any = call._video
        gate = getattr(video, "gate", None)
        return {
            "size": f"{size}x{size}", "seconds": seconds, "fps": fps,
            "coded_kb_per_s": round(sum(len(frame) for frame in frames) / len(frames) * fps / 1000, 1),
            "frames_sent": camera.sent,
            "frames_decoded": video.frames_received if video is not None else 0,
            "frames_sampled": video.frames_sampled if video is not None else 0,
            "frames_refused_undecoded": gate.frames_refused if gate is not None else None,
            "rss_peak_mb": round(max(samples) / 1e6, 1),
            "rss_end_mb": round(samples[-1] / 1e6, 1),
        }
    finally:
        await pc.close()
        await call.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[640, 4096])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--fps", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "video_abuse.json")
    args = parser.parse_args()
    await measure(64, 3.0, args.fps)  # warm-up
    results = []
    for size in args.sizes:
        result = await measure(size, args.seconds, args.fps)
        results.append(result)
        print(
            f"{result['size']} VP8 at {result['coded_kb_per_s']} KB/s for {result['seconds']:g} s: "
            f"RSS +{result['rss_peak_mb']} MB at its peak, +{result['rss_end_mb']} MB at the end; "
            f"{result['frames_decoded']} of {result['frames_sent']} frames decoded, {result['frames_sampled']} kept, "
            f"{result['frames_refused_undecoded']} refused undecoded", flush=True,
        )
    write_report(args.out, {"machine": machine(), "results": results})


if __name__ == "__main__":
    asyncio.run(main())
