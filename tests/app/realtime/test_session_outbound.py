"""RealtimeSession playing through the real OutboundAudioTrack (paced by a fake clock)."""

from __future__ import annotations

import asyncio

import numpy as np

from app.realtime.protocol import server_event_adapter
from app.realtime.session import RealtimeSession
from app.realtime.session_config import SessionConfig, TurnDetection
from media.outbound import OutboundAudioTrack
from pipeline.conversation import AssistantText, UserAudio
from tests.clock import FakeClock
from tests.fakes import EnergyVad, ScriptedEngine

RATE = 16_000


def utterance(speech_ms: int = 600) -> np.ndarray:
    t = np.arange(speech_ms * RATE // 1000) / RATE
    speech = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return np.concatenate([speech, np.zeros(700 * RATE // 1000, dtype=np.float32)])


async def run(config: SessionConfig | None = None, reply: str = "one two three four five"):
    clock = FakeClock(start=0.0)
    track = OutboundAudioTrack(clock=clock, sleep=clock.sleep)
    engine = ScriptedEngine(reply)
    events: list[dict] = []

    def send(event: dict) -> None:
        server_event_adapter.validate_python(event)
        events.append(event)

    session = RealtimeSession(engine=engine, vad=EnergyVad(), output=track, send=send, config=config)
    await session.start()
    return session, engine, track, events


async def until(events: list[dict], event_type: str, count: int = 1) -> None:
    async with asyncio.timeout(10):
        while sum(e["type"] == event_type for e in events) < count:
            await asyncio.sleep(0)


def push(session: RealtimeSession, pcm: np.ndarray) -> None:
    for start in range(0, pcm.size, 320):
        session.push_audio(pcm[start : start + 320])


async def test_answer_played_through_the_track_enters_history_whole():
    session, engine, track, events = await run()
    push(session, utterance())
    await until(events, "response.done")
    while not any(e["type"] == "output_audio_buffer.stopped" for e in events):
        await track.recv()
    push(session, np.zeros(RATE, dtype=np.float32))  # past the echo tail
    push(session, utterance())
    await until(events, "response.done", 2)

    types = [e["type"] for e in events]
    assert types.count("output_audio_buffer.started") == 1
    assert engine.requests[1].conversation.items[1] == AssistantText("one two three four five")
    assert abs(track.played_samples - 5 * 1920) <= 2
    await session.close()


async def test_barge_in_through_the_track_truncates_to_the_frames_sent():
    session, engine, track, events = await run(SessionConfig(turn_detection=TurnDetection(interrupt_response=True)))
    push(session, utterance())
    await until(events, "response.done")
    for _ in range(12):  # 12 x 20 ms = 240 ms of the 400 ms answer sent
        await track.recv()
    push(session, utterance(1000))  # a sentence over the answer: it interrupts
    await until(events, "response.done", 2)

    truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
    assert truncated["audio_end_ms"] == 240  # 12 frames of 20 ms went out
    items = engine.requests[1].conversation.items
    assert [type(item) for item in items] == [UserAudio, AssistantText, UserAudio]
    assert items[1] == AssistantText("one two three ")  # 3 of 5 words' 80 ms frames were heard
    await session.close()
