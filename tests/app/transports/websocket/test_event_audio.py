"""The session as the WebSocket carries it: audio as delta events, playback as the client reports it.

Without acknowledgements an answer counts as heard once generated (OpenAI's WebSocket); from the
first ``playback.ack`` on, only as far as the client says it played (vllm-omni's seed protocol),
and half-duplex listens again only once the answer has played out.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
import soxr

from app.realtime.gate import REPLIES_PER_SECOND, REPLY_BURST
from app.realtime.history import History, acknowledge_playback
from app.realtime.input import APPEND_RATE, MAX_APPEND_AHEAD_MS, MIN_APPEND_CHARGE_MS
from app.realtime.playback import PlaybackLedger
from app.realtime.protocol import PlaybackAckEvent
from app.realtime.session_config import SessionConfig
from app.transports.websocket.event_audio import EventAudioOutput
from media import g711
from pipeline.conversation import AssistantText
from tests.fakes import CODEC_FRAME_SAMPLES, HALF_DUPLEX, ScriptedEngine, SessionHarness, SocketSessionHarness
from tests.speech import silence, tone

REPLY = "Hello there friend"  # three words: three 80 ms frames of audio
RATE = 16_000


async def append(h: SocketSessionHarness, pcm16k: np.ndarray, *, chunk_ms: int = 100) -> None:
    """16 kHz audio as the WebSocket brings it: base64 PCM16 at 24 kHz, one append per ``chunk_ms``."""
    pcm24 = soxr.resample(pcm16k, RATE, 24_000)
    samples = (np.clip(pcm24, -1, 1) * 32767).astype("<i2")
    step = chunk_ms * 24
    for start in range(0, samples.size, step):
        await h.send(type="input_audio_buffer.append", audio=base64.b64encode(samples[start:start + step].tobytes()).decode())


async def say(h: SocketSessionHarness) -> None:
    await append(h, np.concatenate([silence(500), tone(600), silence(800)]))


async def started(reply: str = REPLY, config: SessionConfig | None = None) -> SocketSessionHarness:
    h = SocketSessionHarness(ScriptedEngine(reply), config=config)
    await h.session.start()
    return h


async def text_turn(h: SocketSessionHarness, count: int) -> dict:
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    await h.send(type="response.create")
    return await h.turn_done(count)


def heard_assistant_text(h: SocketSessionHarness, request: int) -> list[str]:
    return [item.text for item in h.engine.requests[request].conversation.items if isinstance(item, AssistantText)]


async def test_audio_leaves_as_deltas_and_no_output_audio_buffer_events():
    h = await started()
    done = await text_turn(h, 1)
    response_id = done["response"]["id"]
    pcm = np.frombuffer(h.answer_audio(response_id), dtype="<i2").astype(np.float32) / 32768
    expected = np.tile(np.linspace(0.0, 0.1, CODEC_FRAME_SAMPLES, dtype=np.float32), 3)  # ScriptedEngine's frames
    assert pcm.size == expected.size
    assert np.max(np.abs(pcm - expected)) < 1e-4
    types = h.types()
    assert not [t for t in types if t.startswith("output_audio_buffer.")]
    assert types.index("response.output_audio.delta") < types.index("response.output_audio.done")
    delta = h.of_type("response.output_audio.delta")[0]
    assert delta["item_id"] == done["response"]["output"][0]["id"]
    assert (delta["output_index"], delta["content_index"]) == (0, 0)
    await h.session.close()


async def test_without_acks_an_answer_is_heard_in_full_once_generated():
    h = await started()
    await text_turn(h, 1)
    assert h.session.stats()["playbacks"] == 0  # nothing waits for playback
    await text_turn(h, 2)
    assert heard_assistant_text(h, 1) == [REPLY]
    await h.session.close()


async def test_without_acks_half_duplex_ignores_input_only_while_generating():
    h = await started(config=HALF_DUPLEX)
    h.engine.hold = asyncio.Event()
    await say(h)  # answered: the engine holds after its first word
    await h.until("response.created")
    await say(h)  # while the answer is generated: not acted on
    assert len(h.of_type("input_audio_buffer.speech_started")) == 1
    h.engine.hold.set()
    await h.turn_done(1)
    h.engine.hold = None
    await say(h)  # after it: heard (its leading 500 ms of silence outlasts the 400 ms echo tail)
    await h.turn_done(2)
    assert len(h.of_type("input_audio_buffer.speech_started")) == 2
    await h.session.close()


async def test_with_acks_the_answer_waits_for_playback_and_so_does_listening():
    h = await started(config=HALF_DUPLEX)
    done = await text_turn(h, 1)
    await h.send(type="playback.ack", played_ms=240, response_id=done["response"]["id"])  # all of it
    ack = (await h.until("playback.acknowledged"))["event"]
    assert ack["played_ms"] == ack["committed_ms"] == ack["audio_ms"] == 240
    assert ack["history_committed"] is True

    second = await text_turn(h, 2)  # from now on the client reports what it played
    assert h.session.stats()["playbacks"] == 1
    await say(h)
    assert h.of_type("input_audio_buffer.speech_started") == []  # the answer is still playing
    item_id = second["response"]["output"][0]["id"]
    await h.send(type="playback.ack", played_ms=80, item_id=item_id)
    assert (await h.until("playback.acknowledged", 2))["event"]["history_committed"] is False
    await h.send(type="playback.ack", played_ms=240, item_id=item_id)
    assert (await h.until("playback.acknowledged", 3))["event"]["history_committed"] is True
    assert h.session.stats()["playbacks"] == 0
    await say(h)
    await h.turn_done(3)
    assert len(h.of_type("input_audio_buffer.speech_started")) == 1
    assert heard_assistant_text(h, 2) == [REPLY, REPLY]
    await h.session.close()


async def test_committed_ms_is_what_enters_the_history():
    h = await started("one two three four")
    first = await text_turn(h, 1)
    await h.send(type="playback.ack", played_ms=320, committed_ms=160, response_id=first["response"]["id"])
    await h.until("playback.acknowledged")
    await text_turn(h, 2)
    assert heard_assistant_text(h, 1) == ["one two "]  # half the audio: half the tokens
    await h.session.close()


async def test_a_truncate_ends_playback_when_the_client_acknowledges():
    h = await started()
    first = await text_turn(h, 1)
    await h.send(type="playback.ack", played_ms=240, response_id=first["response"]["id"])
    second = await text_turn(h, 2)
    item_id = second["response"]["output"][0]["id"]
    await h.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=80)
    await h.until("conversation.item.truncated")
    assert h.session.stats()["playbacks"] == 0  # the client stopped playing it
    await text_turn(h, 3)
    assert heard_assistant_text(h, 2) == [REPLY, "Hello "]
    await h.session.close()


async def test_acks_that_name_nothing_known_are_errors():
    h = await started()
    await h.send(type="playback.ack", played_ms=10, event_id="e1")
    error = (await h.until("error"))["error"]
    assert (error["code"], error["event_id"]) == ("playback_item_not_found", "e1")
    await text_turn(h, 1)
    await h.send(type="playback.ack", played_ms=10, item_id="item_nope")
    assert (await h.until("error", 2))["error"]["code"] == "playback_item_not_found"
    await h.send(type="playback.ack", played_ms=-1)
    assert (await h.until("error", 3))["error"]["code"] == "invalid_value"
    await h.session.close()


async def test_over_webrtc_the_media_track_knows_and_acks_are_refused():
    h = SessionHarness(ScriptedEngine(REPLY))
    await h.session.start()
    await h.send(type="playback.ack", played_ms=10)
    assert (await h.until("error"))["error"]["code"] == "playback_ack_unsupported"
    await h.session.close()


@pytest.mark.parametrize("format_type", ["audio/pcmu", "audio/pcma"])
async def test_g711_sessions_take_and_give_8_khz_audio(format_type):
    h = await started()
    await h.send(type="session.update", session={
        "audio": {"input": {"format": {"type": format_type}}, "output": {"format": {"type": format_type}}}})
    speech = soxr.resample(np.concatenate([silence(500), tone(600), silence(800)]), RATE, 8_000)
    encoded = g711.encode(speech, format_type)
    for start in range(0, len(encoded), 800):
        await h.send(type="input_audio_buffer.append", audio=base64.b64encode(encoded[start:start + 800]).decode())
    done = await h.turn_done(1)
    assert len(h.of_type("input_audio_buffer.speech_started")) == 1
    answer = g711.decode(h.answer_audio(done["response"]["id"]), format_type)
    assert answer.size == 3 * CODEC_FRAME_SAMPLES // 3  # 24 kHz → 8 kHz, the resampler's tail flushed
    assert np.max(np.abs(answer)) == pytest.approx(0.1, abs=0.02)
    await h.session.close()


async def test_bad_base64_and_too_fast_appends_are_errors_and_the_session_goes_on():
    h = await started()
    await h.send(type="input_audio_buffer.append", audio="%%%not base64", event_id="b64")
    error = (await h.until("error"))["error"]
    assert (error["code"], error["event_id"]) == ("invalid_value", "b64")
    chunk = base64.b64encode(bytes(2 * 24_000)).decode()  # one second of silence
    for _ in range(MAX_APPEND_AHEAD_MS // 1000 + 10):  # 10 s past the bound: refused however slow this runs
        await h.send(type="input_audio_buffer.append", audio=chunk)
    refused = [e["error"]["code"] for e in h.of_type("error")][1:]
    assert refused and set(refused) == {"input_audio_too_fast"}
    await text_turn(h, 1)
    assert h.of_type("response.done")[0]["response"]["status"] == "completed"
    await h.session.close()


class SteppedClock:
    """The time a test says it is."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_30_s_of_10_ms_appends_in_real_time_are_all_taken_while_a_flood_of_other_events_is_refused():
    # LiveKit's and WebRTC's frame: 100 appends a second, twice the event rate (50 a second, bursts of 100).
    clock = SteppedClock()
    h = SocketSessionHarness(ScriptedEngine(REPLY), config=SessionConfig(turn_detection=None), clock=clock)
    await h.session.start()
    pcm16 = (0.1 * np.sin(2 * np.pi * 220 * np.arange(240) / 24_000) * 32767).astype("<i2")
    chunk = base64.b64encode(pcm16.tobytes()).decode()  # 10 ms at 24 kHz
    for number in range(3_000):  # 30 s, one append every 10 ms of the clock
        clock.now = number / 100
        await h.send(type="input_audio_buffer.append", audio=chunk, event_id=f"audio{number}")
        if number % 5 < 3:  # 60 other events a second beside it, past the 50 a second they may send
            await h.send(type="conversation.item.retrieve", item_id="none", event_id=f"flood{number}")

    codes = [event["error"]["code"] for event in h.of_type("error")]
    assert "input_audio_too_fast" not in codes
    assert set(codes) == {"item_not_found", "rate_limit_exceeded"}
    assert codes.count("item_not_found") <= 100 + 50 * 30  # the flood got its burst and 50 a second, no more
    assert not h.session.flooding  # refused, answered at the replies' rate, and never a flood
    # Every append's audio reached the session: 30 s at 16 kHz, less what the resampler's filter
    # holds back (18 ms here).
    assert h.session.stats()["manual_buffer_samples"] >= (30_000 - 50) * RATE // 1000
    await h.session.close()


async def test_a_g711_session_takes_g711_audio_in_created_items():
    h = await started()
    await h.send(type="session.update", session={"audio": {"input": {"format": {"type": "audio/pcma"}}}})
    clip = g711.encode(soxr.resample(tone(500), RATE, 8_000), "audio/pcma")
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(clip).decode()}]})
    await h.send(type="response.create")
    await h.turn_done(1)
    (user_audio,) = h.engine.requests[0].conversation.items
    assert user_audio.pcm.size == 500 * RATE // 1000  # 8 kHz in, 16 kHz to the model
    assert np.max(np.abs(user_audio.pcm)) == pytest.approx(0.3, abs=0.03)
    await h.session.close()


def test_an_ack_of_a_segments_whole_milliseconds_is_all_of_it():
    class Listener:
        stopped = 0

        def on_playback_started(self) -> None: ...

        def on_playback_stopped(self) -> None:
            self.stopped += 1

    sent: list[dict] = []
    output = EventAudioOutput(sent.append)
    listener = Listener()
    output.set_listener(listener)
    output.acknowledging = True  # the client has acknowledged an earlier answer
    output.observe({"type": "response.output_item.added", "response_id": "resp_1",
                    "item": {"id": "item_1", "role": "assistant"}})
    output.write(np.zeros(1_000, dtype=np.float32))  # 41.67 ms: a client counting whole ms says 41
    assert output.played_samples == 0
    acknowledge_playback(PlaybackAckEvent(type="playback.ack", played_ms=41, item_id="item_1"),
                         output.playback_reports, History(), PlaybackLedger(), "sess_1")
    assert output.played_samples == 1_000 and listener.stopped == 1


async def test_a_flood_of_malformed_appends_is_answered_at_a_rate_then_the_session_ends():
    clock = SteppedClock()
    h = SocketSessionHarness(ScriptedEngine(REPLY), config=SessionConfig(turn_detection=None), clock=clock)
    await h.session.start()
    sent = 0
    while not h.session.flooding and sent < 5_000:  # as fast as a client can: 1 ms apart
        clock.now = sent / 1000
        await h.send(type="input_audio_buffer.append", audio="!")
        sent += 1
    errors = h.of_type("error")
    assert h.session.flooding and sent < 5_000
    # Each malformed append costs the audio it claims, at least MIN_APPEND_CHARGE_MS: answered
    # (invalid_value) while the audio's budget lasts, refused past it, and the refusals answered
    # at the replies' rate, not one by one.
    too_fast = [e for e in errors if e["error"]["code"] == "input_audio_too_fast"]
    assert 0 < len(too_fast) <= REPLY_BURST + REPLIES_PER_SECOND * clock.now + 1
    malformed = [e for e in errors if e["error"]["code"] == "invalid_value"]
    budget = (MAX_APPEND_AHEAD_MS + APPEND_RATE * 1000 * clock.now) / MIN_APPEND_CHARGE_MS
    assert len(malformed) <= budget + 1 < sent
    last = errors[-1]["error"]
    assert last["code"] == "rate_limit_exceeded" and "closed" in last["message"]
    await h.send(type="conversation.item.retrieve", item_id="none")
    assert len(h.of_type("error")) == len(errors)  # nothing more is taken
    await h.session.close()
