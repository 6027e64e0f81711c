"""RealtimeSession with a scripted engine, an energy VAD (tone = speech) and a virtual speaker.

The real TurnCommitBuffer runs underneath (media.commit_buffer); only the speech probability
comes from signal energy, so every event sequence here is exact and repeatable.
"""

from __future__ import annotations

import asyncio
import base64
import threading

import numpy as np
import pytest
import pytest_asyncio

from app.realtime import input as input_module
from app.realtime.failures import failure_message
from app.realtime.session_config import SessionConfig, TurnDetection
from app.realtime.turn_taking import ECHO_TAIL_MS
from pipeline.contract import EngineError
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT, AssistantText, HistoryLimits, UserAudio, UserText
from tests.fakes import CODEC_FRAME_SAMPLES, HALF_DUPLEX, EnergyVad, ScriptedEngine, SessionHarness
from tests.speech import silence, tone

RATE = 16_000


class Harness(SessionHarness):
    def __init__(self, config: SessionConfig | None = None, reply: str = "Hello there friend") -> None:
        super().__init__(ScriptedEngine(reply), EnergyVad(), config)

    def utter(self, speech_ms: int = 600, silence_ms: int = 700) -> None:
        """One utterance: speech then enough silence for the VAD to commit (default wait 500 ms)."""
        self.push(tone(speech_ms))
        self.push(silence(silence_ms))


@pytest_asyncio.fixture(loop_scope="function")
async def h():
    async with Harness() as harness:
        yield harness


async def started(config: SessionConfig | None = None, reply: str = "Hello there friend") -> Harness:
    harness = Harness(config, reply)
    await harness.session.start()
    return harness


# -- session ----------------------------------------------------------------------------------


async def test_start_sends_session_created_with_the_full_effective_session(h):
    assert h.types() == ["session.created"]
    session = h.events[0]["session"]
    assert session["type"] == "realtime"
    assert session["instructions"] == DEFAULT_SYSTEM_PROMPT
    assert session["output_modalities"] == ["audio"]
    assert session["audio"]["output"]["voice"] == "ethan"
    assert session["audio"]["input"]["turn_detection"] == {
        "type": "server_vad",
        "threshold": 0.5,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
        "idle_timeout_ms": None,
        "create_response": True,
        "interrupt_response": True,  # OpenAI's default: barge-in
        "speculative_response": True,
        "interrupt_min_speech_ms": 700,
        "interrupt_resume_silence_ms": 250,
        "speech_floor_dbfs": -36.0,
        "speech_over_background_db": 12.0,
        "speech_under_user_db": 15.0,
    }
    assert session["max_output_tokens"] == "inf"
    assert session["model"] == "scripted-engine"


async def test_openai_client_session_update_is_accepted_and_mapped(h):
    await h.send(
        type="session.update",
        event_id="u1",
        session={
            "type": "realtime",
            "model": "gpt-realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "noise_reduction": {"type": "near_field"},
                    "transcription": {"model": "gpt-4o-transcribe"},
                    "turn_detection": {"type": "semantic_vad", "eagerness": "low", "interrupt_response": True},
                },
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.2},
            },
            "tracing": "auto",
            "tools": [{"type": "function", "name": "f"}],
        },
    )

    session = h.last("session.updated")["session"]
    # This session has no end-of-turn model: semantic_vad is refused, the rest applies.
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500
    assert session["audio"]["input"]["turn_detection"]["interrupt_response"] is True
    assert session["audio"]["output"]["voice"] == "ethan"  # an OpenAI voice keeps the Qwen voice
    assert session["audio"]["output"]["speed"] == 1.0  # accepted, not applied
    assert session["tracing"] is None
    # A tool without parameters takes none: an empty object schema.
    assert session["tools"] == [
        {"type": "function", "name": "f", "description": None, "parameters": {"type": "object", "properties": {}}}
    ]
    assert [e["error"]["code"] for e in h.of_type("error")] == ["semantic_vad_unavailable"]


async def test_beta_flat_session_keys_are_understood(h):
    await h.send(
        type="session.update",
        session={
            "modalities": ["text"],
            "voice": "chelsie",
            "max_response_output_tokens": 64,
            "turn_detection": None,
            "input_audio_format": "pcm16",
        },
    )

    session = h.last("session.updated")["session"]
    assert session["output_modalities"] == ["text"]
    assert session["audio"]["output"]["voice"] == "chelsie"
    assert session["max_output_tokens"] == 64
    assert session["audio"]["input"]["turn_detection"] is None


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"instructions": "Be brief.", "audio": {"output": {"voice": "bob"}}}, "session.audio.output.voice"),
        ({"instructions": "Be brief.", "max_output_tokens": 0}, "session.max_output_tokens"),
        ({"instructions": "Be brief.", "temperature": "hot"}, "session.temperature"),
        ({"instructions": "Be brief.", "output_modalities": ["video"]}, "session.output_modalities"),
        (
            {"instructions": "Be brief.", "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
            "session.audio.input.turn_detection.threshold",
        ),
        ({"instructions": "Be brief.", "type": "transcription"}, "session.type"),
    ],
)
async def test_bad_session_value_is_an_error_and_changes_nothing(h, session, param):
    await h.send(type="session.update", event_id="bad", session=session)

    error = h.last("error")["error"]
    assert error["param"] == param
    assert error["event_id"] == "bad"
    assert h.of_type("session.updated") == []
    h.utter()
    await h.turn_done()
    assert h.engine.requests[0].conversation.instructions is None  # "Be brief." was not applied


# -- server VAD turns ------------------------------------------------------------------------


async def test_vad_turn_exact_event_sequence(h):
    h.engine.hold = asyncio.Event()
    h.utter()
    await h.until("response.output_audio_transcript.delta")
    h.output.play()  # the first word's audio reaches the speaker while the rest is generated
    h.engine.hold.set()
    await h.until("response.done")
    h.output.play()

    assert h.types() == [
        "session.created",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "output_audio_buffer.started",
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "output_audio_buffer.stopped",
    ]


async def test_vad_turn_ids_and_fields_tie_together(h):
    h.utter(speech_ms=600, silence_ms=700)
    done = (await h.turn_done())["response"]

    started_, stopped, committed = (h.of_type(t)[0] for t in (
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed"))
    user_item = h.of_type("conversation.item.added")[0]["item"]
    assert started_["item_id"] == stopped["item_id"] == committed["item_id"] == user_item["id"]
    assert started_["audio_start_ms"] == 0  # speech from the first sample; nothing before it to pad
    assert stopped["audio_end_ms"] >= 600 + 500
    assert user_item["role"] == "user" and user_item["content"] == [{"type": "input_audio", "transcript": None}]
    assert done["status"] == "completed" and done["status_details"] is None
    assert done["output"][0]["content"] == [{"type": "output_audio", "transcript": "Hello there friend"}]
    assert done["usage"]["output_tokens"] == 6
    assert set(done["usage"]["input_token_details"]) >= {"text_tokens", "audio_tokens"}
    assert h.last("output_audio_buffer.stopped")["response_id"] == done["id"]
    deltas = h.of_type("response.output_audio_transcript.delta")
    assert "".join(d["delta"] for d in deltas) == "Hello there friend"
    assert {d["item_id"] for d in deltas} == {done["output"][0]["id"]}
    assert h.output.played_samples == 3 * CODEC_FRAME_SAMPLES


async def test_two_vad_turns_second_request_holds_first_user_audio_and_heard_answer(h):
    h.utter()
    await h.turn_done()
    h.push(silence(ECHO_TAIL_MS + 100))  # half-duplex listens again after the echo tail
    h.utter()
    await h.turn_done(2)

    first, second = h.engine.requests
    assert len(first.conversation.items) == 1 and isinstance(first.conversation.items[0], UserAudio)
    items = second.conversation.items
    assert [type(item) for item in items] == [UserAudio, AssistantText, UserAudio]
    assert np.array_equal(items[0].pcm, first.conversation.items[0].pcm)
    assert items[1] == AssistantText("Hello there friend")
    assert h.of_type("input_audio_buffer.committed")[1]["previous_item_id"] == h.of_type("response.done")[0][
        "response"]["output"][0]["id"]


async def test_create_response_false_commits_without_answering(h):
    await h.send(type="session.update", session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "create_response": False}}}})
    h.utter()
    await asyncio.sleep(0)

    assert "input_audio_buffer.committed" in h.types()
    assert "response.created" not in h.types()
    await h.send(type="response.create")
    await h.turn_done()
    assert isinstance(h.engine.requests[0].conversation.items[0], UserAudio)


async def test_response_done_reports_latency_split(h):
    h.utter()
    done = await h.turn_done()

    latency = done["latency"]
    assert latency["silence_wait_ms"] == 500
    # Started at the silence's first quiet window: the engine's 2 ms to first audio (the fake's) are
    # split at the commit between what the speculation hid and what was left.
    assert latency["speculative"] is True
    assert latency["engine_first_audio_ms"] + latency["speculation_hidden_ms"] == pytest.approx(2.0, abs=0.11)
    assert latency["end_of_speech_to_first_audio_ms"] >= latency["silence_wait_ms"]
    assert latency["other_ms"] == pytest.approx(
        latency["end_of_speech_to_first_audio_ms"] - latency["silence_wait_ms"] - latency["engine_first_audio_ms"],
        abs=0.2,
    )


# -- manual mode, text turns, settings reaching the engine ------------------------------------


async def test_manual_mode_commit_then_response_create():
    h = await started(SessionConfig(turn_detection=None))
    h.push(tone(400))
    await h.send(type="input_audio_buffer.commit", event_id="c1")
    await h.send(type="response.create")
    await h.turn_done()

    assert "input_audio_buffer.speech_started" not in h.types()
    committed = h.last("input_audio_buffer.committed")
    assert committed["previous_item_id"] is None
    (clip,) = h.engine.requests[0].conversation.items
    assert isinstance(clip, UserAudio) and clip.pcm.size == 400 * RATE // 1000
    await h.session.close()


async def test_a_commit_of_100_ms_appended_at_once_holds_all_of_it():
    """OpenAI's minimum commit is 100 ms: the resampler's held samples are committed too."""
    h = await started(SessionConfig(turn_detection=None))
    pcm24 = (0.3 * np.sin(2 * np.pi * 220 * np.arange(2_400) / 24_000) * 32767).astype(np.int16)  # 100 ms
    await h.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm24.tobytes()).decode())
    await h.send(type="input_audio_buffer.commit", event_id="c1")
    assert "error" not in h.types()
    assert h.last("input_audio_buffer.committed")
    await h.send(type="response.create")
    await h.turn_done()
    (clip,) = h.engine.requests[0].conversation.items
    assert isinstance(clip, UserAudio) and abs(clip.pcm.size - 100 * RATE // 1000) <= 2
    await h.session.close()


async def test_manual_commit_of_empty_buffer_is_an_error():
    h = await started(SessionConfig(turn_detection=None))
    await h.send(type="input_audio_buffer.commit", event_id="c1")

    error = h.last("error")["error"]
    assert error["code"] == "input_audio_buffer_commit_empty"
    assert error["event_id"] == "c1"
    await h.session.close()


async def test_text_only_session_streams_output_text_and_writes_no_audio():
    h = await started(SessionConfig(output_modality="text", turn_detection=None))
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]})
    await h.send(type="response.create")
    done = (await h.turn_done())["response"]

    assert h.engine.requests[0].output_audio is False
    assert h.engine.requests[0].conversation.items == (UserText("Hi!"),)
    assert "".join(e["delta"] for e in h.of_type("response.output_text.delta")) == "Hello there friend"
    assert h.last("response.output_text.done")["text"] == "Hello there friend"
    assert h.last("response.content_part.added")["part"]["type"] == "text"
    assert done["output"][0]["content"] == [{"type": "output_text", "text": "Hello there friend"}]
    assert not any(t.startswith("output_audio_buffer") or "audio_transcript" in t for t in h.types())
    assert h.output.played_samples == 0
    await h.send(type="response.create")
    await h.turn_done(2)
    assert h.engine.requests[1].conversation.items == (UserText("Hi!"), AssistantText("Hello there friend"))
    await h.session.close()


async def test_text_item_in_an_audio_session_gets_a_spoken_answer(h):
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]})
    await h.send(type="response.create")
    await h.turn_done()

    assert h.engine.requests[0].output_audio is True
    assert h.output.played_samples == 3 * CODEC_FRAME_SAMPLES


async def test_input_audio_item_is_decoded_and_resampled_from_24k_to_16k(h):
    pcm16 = (np.sin(2 * np.pi * 300 * np.arange(24_000) / 24_000) * 8000).astype("<i2")
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(pcm16.tobytes()).decode()}]})
    await h.send(type="response.create")
    await h.turn_done()

    (clip,) = h.engine.requests[0].conversation.items
    assert isinstance(clip, UserAudio)
    assert clip.pcm.dtype == np.float32 and clip.pcm.size == RATE
    assert np.max(np.abs(clip.pcm)) == pytest.approx(8000 / 32768, rel=0.05)
    assert h.of_type("conversation.item.added")[0]["item"]["content"] == [{"type": "input_audio", "transcript": None}]


async def test_input_audio_items_are_decoded_off_the_event_loop(h, monkeypatch):
    # An item's audio is decoded and resampled off the loop (14 MB of µ-law takes 0.5 s).
    loop_thread = threading.current_thread()
    threads = []
    resample = input_module.soxr.resample

    def recording(*args, **kwargs):
        threads.append(threading.current_thread())
        return resample(*args, **kwargs)

    monkeypatch.setattr(input_module.soxr, "resample", recording)
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(bytes(48_000)).decode()}]})
    assert h.of_type("conversation.item.added") and threads and loop_thread not in threads


async def test_an_items_audio_past_one_turns_worth_is_refused_from_its_length():
    config = SessionConfig(turn_detection=None, max_event_bytes=8 * 1024 * 1024)
    h = SessionHarness(ScriptedEngine(), EnergyVad(), config)
    await h.session.start()
    await h.send(type="session.update", session={"input_audio_format": "g711_ulaw"})
    half = base64.b64encode(bytes(8_000 * 70)).decode()  # 70 s at 8 kHz
    await h.send(event_id="long", type="conversation.item.create", item={"type": "message", "role": "user",
                 "content": [{"type": "input_audio", "audio": half}, {"type": "input_audio", "audio": half}]})
    error = h.last("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "item.content[1].audio", "long")
    assert "120 s" in error["message"] and not h.of_type("conversation.item.added")
    await h.session.close()


async def test_input_audio_buffer_append_feeds_the_vad(h):
    speech = np.concatenate([tone(600), silence(700)])
    pcm24 = (np.interp(np.arange(speech.size * 3 // 2) / 1.5, np.arange(speech.size), speech) * 32767).astype("<i2")
    for start in range(0, pcm24.size, 4800):
        await h.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm24[start:start + 4800].tobytes()).decode())
    await h.turn_done()

    assert h.types()[1:4] == [
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]


async def test_instructions_set_before_the_first_commit_reach_the_engine(h):
    await h.send(type="session.update", session={"instructions": "Answer in one word."})
    h.utter()
    await h.turn_done()

    assert h.last("session.updated")["session"]["instructions"] == "Answer in one word."
    assert h.engine.requests[0].conversation.instructions == "Answer in one word."
    assert h.engine.requests[0].conversation.system_prompt == "Answer in one word."


async def test_sampling_settings_reach_the_engine(h):
    await h.send(type="session.update", session={"temperature": 0.3, "max_output_tokens": 2})
    h.utter()
    done = (await h.turn_done())["response"]

    request = h.engine.requests[0]
    assert request.temperature == 0.3
    assert request.max_output_tokens == 2
    assert done["status"] == "incomplete"
    assert done["status_details"] == {"type": "incomplete", "reason": "max_output_tokens", "error": None}
    assert done["max_output_tokens"] == 2


async def test_response_create_overrides_apply_to_that_response_only():
    h = await started(SessionConfig(turn_detection=None))
    await h.send(type="response.create", response={
        "instructions": "Whisper.", "audio": {"output": {"voice": "aiden"}}, "temperature": 0.1,
        "max_output_tokens": "inf", "metadata": {"topic": "test"}})
    done = (await h.turn_done())["response"]
    await h.send(type="response.create")
    await h.turn_done(2)

    first, second = h.engine.requests
    assert (first.voice, first.temperature, first.conversation.instructions) == ("aiden", 0.1, "Whisper.")
    assert (second.voice, second.temperature, second.conversation.instructions) == ("ethan", 0.8, None)
    assert done["metadata"] == {"topic": "test"}
    assert done["audio"]["output"]["voice"] == "aiden"
    await h.session.close()


async def test_voice_change_reaches_the_engine(h):
    await h.send(type="session.update", session={"audio": {"output": {"voice": "chelsie"}}})
    h.utter()
    await h.turn_done()
    await h.send(type="session.update", session={"audio": {"output": {"voice": "Aiden"}}})
    h.push(silence(ECHO_TAIL_MS + 100))
    h.utter()
    await h.turn_done(2)

    assert [request.voice for request in h.engine.requests] == ["chelsie", "aiden"]


# -- half-duplex and barge-in ----------------------------------------------------------------


async def test_half_duplex_speech_during_playback_neither_cancels_nor_creates_a_turn():
    h = await started(HALF_DUPLEX)
    h.utter()
    await h.until("response.done")
    events_before = len(h.events)
    h.output.play(CODEC_FRAME_SAMPLES)  # audio is playing...
    h.utter()  # ...and the user talks over it (or it echoes back)
    h.output.play()
    h.push(silence(ECHO_TAIL_MS + 100))

    assert h.types()[events_before:] == ["output_audio_buffer.started", "output_audio_buffer.stopped"]
    assert len(h.engine.requests) == 1
    assert h.engine.cancelled_turns == 0
    h.utter()  # after the tail, the next utterance is a turn
    await h.turn_done(2)
    assert len(h.engine.requests) == 2
    assert [type(item) for item in h.engine.requests[1].conversation.items] == [UserAudio, AssistantText, UserAudio]
    await h.session.close()


async def test_half_duplex_speech_while_generating_is_not_answered():
    h = await started(HALF_DUPLEX)
    h.engine.hold = asyncio.Event()
    h.utter()
    await h.until("response.output_audio_transcript.delta")
    h.utter()
    h.engine.hold.set()
    await h.turn_done()
    h.push(silence(ECHO_TAIL_MS + 100))

    assert h.types().count("input_audio_buffer.committed") == 1
    assert len(h.engine.requests) == 1
    assert h.last("response.done")["response"]["status"] == "completed"
    await h.session.close()


async def test_half_duplex_leftover_speech_is_not_committed_after_playback():
    h = await started(HALF_DUPLEX)
    h.utter()
    await h.until("response.done")
    h.output.play(CODEC_FRAME_SAMPLES)
    h.push(tone(500))  # the user starts talking during playback...
    h.output.play()  # ...playback ends...
    h.push(tone(500))  # ...and the user goes on
    h.push(silence(700))
    h.push(silence(ECHO_TAIL_MS))

    assert h.types().count("input_audio_buffer.committed") == 1
    assert h.types().count("input_audio_buffer.speech_started") == 1
    assert len(h.engine.requests) == 1
    await h.session.close()


async def test_barge_in_cancels_clears_and_truncates_to_what_was_heard():
    h = await started(SessionConfig(turn_detection=TurnDetection(interrupt_response=True)),
                      reply="one two three four five six seven eight")
    h.engine.hold = asyncio.Event()  # a long answer: only the first word is generated
    h.utter()
    await h.until("response.output_audio_transcript.delta")
    h.output.play(CODEC_FRAME_SAMPLES // 2)  # half of the first word's audio is heard
    events_before = len(h.events)
    h.push(tone(1000))  # the user barges in: a sentence, not a backchannel
    await h.until("response.done")

    assert h.types()[events_before:events_before + 3] == [
        "input_audio_buffer.speech_started", "output_audio_buffer.cleared", "conversation.item.truncated"]
    truncated = h.last("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 40  # 960 samples at 24 kHz
    done = h.last("response.done")["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"
    assert truncated["item_id"] == done["output"][0]["id"]
    assert h.engine.cancelled_turns == 1
    assert h.output.queued_samples == 0
    h.engine.hold = None
    h.push(silence(700))
    await h.turn_done(2)
    assert h.last("response.done")["response"]["status"] == "completed"
    # Half of the first codec frame was heard: a frame counts once all of it has played, so no word.
    items = h.engine.requests[1].conversation.items
    assert [type(item) for item in items] == [UserAudio, UserAudio]
    await h.session.close()


async def test_barge_in_during_playback_after_generation_keeps_the_heard_part():
    h = await started(SessionConfig(turn_detection=TurnDetection(interrupt_response=True)),
                      reply="one two three four")
    h.utter()
    await h.until("response.done")
    h.output.play(2 * CODEC_FRAME_SAMPLES)  # two of four words heard
    h.utter(1000)  # a sentence over the answer: it interrupts
    await h.turn_done(2)

    assert h.last("conversation.item.truncated")["audio_end_ms"] == 160
    assert h.of_type("response.done")[0]["response"]["status"] == "completed"
    assert h.engine.requests[1].conversation.items[1] == AssistantText("one two ")
    await h.session.close()


async def barged_in() -> Harness:
    """A session whose answer is being generated when the user starts speaking over it."""
    h = await started(reply="one two three four five six seven eight")
    h.engine.hold = asyncio.Event()  # a long answer: only the first word is generated
    h.utter()
    await h.until("response.output_audio_transcript.delta")
    h.push(tone(1000))  # the user barges in: the server cancels the answer itself
    return h


async def test_a_cancel_sent_as_the_server_cancels_at_barge_in_joins_that_cancel():
    h = await barged_in()  # the cancel is under way: its response.done has not been sent
    await h.send(type="response.cancel", event_id="c1")  # a client's reply to speech_started (LiveKit)

    assert h.of_type("error") == []
    (done,) = h.of_type("response.done")  # one response.done answers both
    assert (done["response"]["status"], done["response"]["status_details"]["reason"]) == ("cancelled", "turn_detected")
    await h.session.close()


async def test_a_truncate_sent_as_the_server_cancels_at_barge_in_cuts_the_item_once_cancelled():
    h = await barged_in()  # the answer's item is in progress until its cancel ends
    item_id = h.last("response.output_item.added")["item"]["id"]
    # pipecat's and the Agents SDK's reply to speech_started: the audio they had played
    await h.send(type="conversation.item.truncate", event_id="t1", item_id=item_id, content_index=0, audio_end_ms=40)

    assert h.of_type("error") == []
    types = h.types()
    assert types.index("response.done") < len(types) - 1 - types[::-1].index("conversation.item.truncated")
    truncated = h.last("conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 40)
    await h.session.close()


async def test_a_cancel_that_crossed_the_barge_in_response_done_is_answered_by_it():
    h = await barged_in()
    done = await h.until("response.done")
    await h.send(type="response.cancel", event_id="c1")  # sent before the client saw response.done
    await h.send(type="response.cancel", event_id="c2", response_id=done["response"]["id"])  # LiveKit sends two
    assert h.of_type("error") == []
    assert len(h.of_type("response.done")) == 1

    await h.send(type="response.cancel", event_id="c3", response_id="resp_other")  # not that response
    (error,) = [e["error"] for e in h.of_type("error")]
    assert (error["code"], error["event_id"]) == ("response_cancel_not_active", "c3")
    assert error["message"].startswith("Cancellation failed")  # what LiveKit ignores
    h.engine.hold = None
    h.push(silence(700))  # the barge-in utterance is answered
    second = await h.turn_done(2)
    assert second["response"]["status"] == "completed" and second["response"]["id"] != done["response"]["id"]
    await h.send(type="response.cancel", event_id="c4")  # after a newer response: OpenAI's error
    assert h.last("error")["error"]["event_id"] == "c4"
    await h.session.close()


# -- cancel, clear, delete, truncate ----------------------------------------------------------


async def test_response_cancel_ends_the_response_cancelled_and_the_next_turn_works(h):
    h.engine.hold = asyncio.Event()
    await h.send(type="response.create")
    await h.until("response.output_audio_transcript.delta")
    await h.send(type="response.cancel", event_id="x1")

    done = h.last("response.done")["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "client_cancelled"
    assert h.types().count("response.done") == 1
    h.engine.hold = None
    h.output.play()
    await h.send(type="response.cancel", event_id="x2")
    assert h.last("error")["error"]["code"] == "response_cancel_not_active"
    await h.send(type="response.create")
    assert (await h.turn_done(2))["response"]["status"] == "completed"


async def test_output_audio_buffer_clear_stops_generation_and_truncates(h):
    h.engine.hold = asyncio.Event()
    await h.send(type="response.create")
    await h.until("response.output_audio_transcript.delta")
    h.output.play(CODEC_FRAME_SAMPLES)
    await h.send(type="output_audio_buffer.clear")

    assert h.last("response.done")["response"]["status"] == "cancelled"
    assert h.last("output_audio_buffer.cleared")["response_id"] == h.last("response.done")["response"]["id"]
    # All the audio generated was heard, but the answer was cut short: its item says so.
    assert h.last("conversation.item.truncated")["audio_end_ms"] == 80
    h.engine.hold = None
    await h.send(type="response.create")
    await h.turn_done(2)
    # Cut while generating, 80 ms is less than a token at a speaking pace (3.5 a second):
    # nothing of it was heard, and the next prompt leaves it out.
    assert h.engine.requests[1].conversation.items == ()


async def test_second_response_create_while_one_runs_is_an_error(h):
    h.engine.hold = asyncio.Event()
    await h.send(type="response.create")
    await h.until("response.created")
    await h.send(type="response.create", event_id="r2")

    error = h.last("error")["error"]
    assert error["code"] == "conversation_already_has_active_response"
    assert error["event_id"] == "r2"
    h.engine.hold.set()
    await h.turn_done()
    assert h.types().count("response.created") == 1


async def test_items_inserted_at_root_after_an_answered_turn_leave_the_next_prompt_within_the_budget():
    h = Harness(SessionConfig(max_events_per_second=10_000, max_event_burst=10_000))
    await h.session.start()
    try:
        await h.send(type="conversation.item.create", item={"type": "message", "role": "user", "id": "u1",
                                                            "content": [{"type": "input_text", "text": "one"}]})
        await h.send(type="response.create")
        await h.turn_done()
        for n in range(300):
            await h.send(type="conversation.item.create", previous_item_id="root", item={
                "type": "message", "role": "user", "id": f"r{n}", "content": [{"type": "input_text", "text": "x" * 1_000}]})
        await h.send(type="response.create")
        await h.turn_done(2)
    finally:
        await h.session.close()
    prompt = h.engine.requests[-1].conversation.items
    assert sum(item.prompt_tokens() for item in prompt) <= HistoryLimits().max_prompt_tokens
    assert prompt[-2:] == (UserText("one"), AssistantText("Hello there friend"))  # the oldest went, not these
    deleted = {event["item_id"] for event in h.of_type("conversation.item.deleted")}
    assert len(deleted) == 300 - (len(prompt) - 2)  # every item that went was announced


async def test_delete_and_truncate_items_and_unknown_ids(h):
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user", "id": "u1",
                                                        "content": [{"type": "input_text", "text": "one"}]})
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user", "id": "u2",
                                                        "content": [{"type": "input_text", "text": "two"}]})
    await h.send(type="response.create")
    done = (await h.turn_done())["response"]
    answer_id = done["output"][0]["id"]

    await h.send(type="conversation.item.delete", item_id="u1")
    await h.send(type="conversation.item.truncate", item_id=answer_id, content_index=0, audio_end_ms=80)
    await h.send(type="conversation.item.delete", item_id="nope", event_id="d9")
    await h.send(type="conversation.item.truncate", item_id=answer_id, content_index=0, audio_end_ms=10_000,
                 event_id="t9")
    await h.send(type="response.create")
    await h.turn_done(2)

    assert h.last("conversation.item.deleted")["item_id"] == "u1"
    assert h.last("conversation.item.truncated") ["audio_end_ms"] == 80
    errors = [e["error"] for e in h.of_type("error")]
    assert [(e["code"], e["event_id"]) for e in errors] == [("item_not_found", "d9"), ("invalid_value", "t9")]
    assert h.engine.requests[1].conversation.items == (UserText("two"), AssistantText("Hello "))


class FractionalMsEngine(ScriptedEngine):
    """Frames of 4,935 samples: a three-word answer is 14,805 samples (29,610 bytes of PCM16),
    616.875 ms, as the answers of the openai-agents runs were."""

    def frame(self) -> np.ndarray:
        return np.full(4_935, 0.05, dtype=np.float32)


async def test_a_truncate_at_the_answers_length_rounded_up_is_taken_and_clamped():
    # openai-agents bounds audio_end_ms by the audio received rounded *up* to a whole ms (617).
    h = SessionHarness(FractionalMsEngine("one two three"), EnergyVad())
    await h.session.start()
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                        "content": [{"type": "input_text", "text": "hi"}]})
    await h.send(type="response.create")
    answer_id = (await h.turn_done())["response"]["output"][0]["id"]
    await h.send(type="conversation.item.truncate", item_id=answer_id, content_index=0, audio_end_ms=617, event_id="t1")
    await h.send(type="conversation.item.truncate", item_id=answer_id, content_index=0, audio_end_ms=618, event_id="t2")
    await h.send(type="conversation.item.retrieve", item_id=answer_id)

    assert h.last("conversation.item.truncated")["audio_end_ms"] == 617
    (error,) = [e["error"] for e in h.of_type("error")]
    assert (error["code"], error["event_id"], error["param"]) == ("invalid_value", "t2", "audio_end_ms")
    assert "(617 ms)" in error["message"]  # the bound it can be truncated at, as the client counts it
    # 617 ms is all of its audio: all of it was heard.
    assert h.last("conversation.item.retrieved")["item"]["content"][0]["transcript"] == "one two three"
    await h.session.close()


async def test_retrieve_gives_an_item_as_it_stands_and_an_unknown_id_an_error(h):
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user", "id": "u1",
                                                        "content": [{"type": "input_text", "text": "one"}]})
    await h.send(type="response.create")
    answer_id = (await h.turn_done())["response"]["output"][0]["id"]
    await h.send(type="conversation.item.truncate", item_id=answer_id, content_index=0, audio_end_ms=80)
    await h.send(type="conversation.item.retrieve", item_id="u1")
    await h.send(type="conversation.item.retrieve", item_id=answer_id)
    await h.send(type="conversation.item.retrieve", item_id="nope", event_id="r9")

    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    retrieved = h.of_type("conversation.item.retrieved")
    assert all(TypeAdapter(RealtimeServerEvent).validate_python(event).type == event["type"] for event in retrieved)
    user, answer = (event["item"] for event in retrieved)
    assert (user["id"], user["content"][0]["text"]) == ("u1", "one")
    assert (answer["id"], answer["content"][0]["transcript"]) == (answer_id, "Hello ")  # as heard
    (error,) = [e["error"] for e in h.of_type("error")]
    assert (error["code"], error["event_id"]) == ("item_not_found", "r9")


async def test_client_items_insert_after_previous_item_id(h):
    for item_id, previous in (("a", None), ("c", None), ("b", "a"), ("z", "root")):
        await h.send(type="conversation.item.create", previous_item_id=previous,
                     item={"type": "message", "role": "user", "id": item_id,
                           "content": [{"type": "input_text", "text": item_id}]})
    await h.send(type="conversation.item.create", item={"type": "message", "role": "assistant",
                                                        "content": [{"type": "output_text", "text": "ok"}]})
    await h.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                        "content": [{"type": "input_text", "text": "d"}]})
    await h.send(type="response.create")
    await h.turn_done()

    assert h.engine.requests[0].conversation.items == (
        UserText("z"), UserText("a"), UserText("b"), UserText("c"), AssistantText("ok"), UserText("d"))


# -- bad input and failures -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("this is not json", "invalid_json"),
        ('{"type": "nope", "event_id": "bad1"}', "invalid_value"),
        ('{"type": "conversation.item.truncate", "item_id": 5, "event_id": "bad1"}', "invalid_type"),
        ('{"type": "input_audio_buffer.commit", "event_id": "bad1"}', "turn_detection_enabled"),
        ('{"type": "response.cancel", "event_id": "bad1"}', "response_cancel_not_active"),
        ('{"type": "conversation.item.delete", "item_id": "item_x", "event_id": "bad1"}', "item_not_found"),
        ('{"type": "input_audio_buffer.append", "audio": "%%%", "event_id": "bad1"}', "invalid_value"),
        ('{"type": "conversation.item.create", "event_id": "bad1", "item": {"type": "message", "role": "system",'
         ' "content": [{"type": "input_text", "text": "x"}]}}', "invalid_value"),
    ],
)
async def test_bad_input_gets_an_error_and_the_session_still_serves_a_turn(h, raw, code):
    await h.session.handle_message(raw)

    (error,) = h.of_type("error")
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["code"] == code
    if "bad1" in raw:
        assert error["error"]["event_id"] == "bad1"
    h.utter()
    assert (await h.turn_done())["response"]["status"] == "completed"


async def test_engine_failure_ends_the_response_failed_and_the_next_turn_works(h, caplog):
    h.engine.fail_next = EngineError("CUDA out of memory at /opt/model/shard-3", code="engine_error")
    h.utter()
    done = (await h.turn_done())["response"]

    assert done["status"] == "failed"
    assert done["status_details"]["error"] == {"type": "server_error", "code": "engine_error", "message": None}
    error_event = h.last("error")
    error = error_event["error"]
    # The client gets the code and a fixed message; the cause goes to the log beside the event's id.
    assert (error["type"], error["code"], error["message"]) == ("server_error", "engine_error", failure_message("engine_error"))
    [logged] = [r.getMessage() for r in caplog.records if error_event["event_id"] in r.getMessage()]
    assert "CUDA out of memory at /opt/model/shard-3" in logged
    h.push(silence(ECHO_TAIL_MS + 100))
    h.utter()
    assert (await h.turn_done(2))["response"]["status"] == "completed"


async def test_unexpected_engine_exception_also_fails_only_that_response(h):
    h.engine.fail_next = RuntimeError("boom: /etc/secret")
    await h.send(type="response.create")
    assert (await h.turn_done())["response"]["status"] == "failed"
    assert "boom" not in h.last("error")["error"]["message"]
    await h.send(type="response.create")
    assert (await h.turn_done(2))["response"]["status"] == "completed"


# -- lifetime and bounds ----------------------------------------------------------------------


async def test_close_cancels_the_running_response_and_is_safe_twice(h):
    h.engine.hold = asyncio.Event()
    h.utter()
    await h.until("response.created")
    await h.session.close()
    await h.session.close()

    assert h.engine.cancelled_turns == 1
    assert h.session.stats()["tasks"] == 0
    events_after_close = len(h.events)
    h.utter()
    await h.session.handle_message('{"type": "response.create"}')
    assert len(h.events) == events_after_close


async def test_200_short_turns_leave_per_session_structures_bounded():
    limits = HistoryLimits(max_turns=3, max_audio_clips=2, max_audio_seconds=10.0)
    h = await started(SessionConfig(history=limits), reply="ok")
    sizes = []
    for turn in range(200):
        h.utter(speech_ms=300, silence_ms=600)
        await h.turn_done(turn + 1)
        h.push(silence(ECHO_TAIL_MS + 40))
        sizes.append(h.session.stats())

    assert len(h.engine.requests) == 200
    assert max(s["items"] for s in sizes) <= 2 * limits.max_turns
    assert max(s["audio_clips"] for s in sizes) <= limits.max_audio_clips
    assert sizes[-1] == {"items": 4, "audio_clips": 2, "playbacks": 0, "tasks": 0, "speculations": 0,
                         "manual_buffer_samples": 0, "responses": 0, "images": 0, "camera_frames": 0,
                         "partial_transcripts": 0}
    last_request = h.engine.requests[-1].conversation.items
    assert [type(item) for item in last_request] == [UserAudio, AssistantText, UserAudio, AssistantText, UserAudio]
    await h.session.close()


async def test_idle_timeout_prompts_a_response_after_the_answer_has_played():
    h = await started(SessionConfig(turn_detection=TurnDetection(idle_timeout_ms=5_000)))
    h.push(silence(6_000))  # no answer yet: nothing to time out from
    assert "input_audio_buffer.timeout_triggered" not in h.types()
    h.utter()
    await h.turn_done()
    played_out_ms = 6_000 + 600 + 700  # all input so far: the answer played out after it
    h.push(silence(4_900))
    assert "input_audio_buffer.timeout_triggered" not in h.types()
    h.push(silence(200))
    await h.turn_done(2)

    triggered = h.last("input_audio_buffer.timeout_triggered")
    assert triggered["audio_start_ms"] == played_out_ms
    assert triggered["audio_end_ms"] - triggered["audio_start_ms"] >= 5_000
    assert h.types()[h.types().index("input_audio_buffer.timeout_triggered") + 1:][:4] == [
        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done", "response.created"]
    assert h.last("input_audio_buffer.committed")["item_id"] == triggered["item_id"]
    idle_clip = h.engine.requests[1].conversation.items[-1]
    assert isinstance(idle_clip, UserAudio) and not idle_clip.pcm.any()
    await h.session.close()


async def test_speech_resets_the_idle_timeout():
    h = await started(SessionConfig(turn_detection=TurnDetection(idle_timeout_ms=5_000, create_response=False)))
    await h.send(type="response.create")
    await h.turn_done()
    h.push(silence(3_000))
    h.utter()  # committed, not answered (create_response false): the user is there
    h.push(silence(4_000))

    assert "input_audio_buffer.timeout_triggered" not in h.types()
    await h.session.close()


async def test_a_whole_barge_in_utterance_in_one_push_waits_for_the_cancelled_response():
    h = await started(SessionConfig(turn_detection=TurnDetection(interrupt_response=True)))
    h.engine.hold = asyncio.Event()
    h.utter()
    await h.until("response.output_audio_transcript.delta")
    h.engine.hold = None
    h.session.push_audio(np.concatenate([tone(1000), silence(700)]))  # speech start and commit at once
    await h.turn_done(2)

    types = h.types()
    second_created = [i for i, t in enumerate(types) if t == "response.created"][1]
    assert types.index("response.done") < second_created
    assert [d["response"]["status"] for d in h.of_type("response.done")] == ["cancelled", "completed"]
    await h.session.close()


async def test_the_session_is_idle_only_while_nothing_happens():
    h = await started()
    h.engine.hold = asyncio.Event()
    first = h.session.idle_since()
    assert first is not None
    h.push(tone(600))  # speech acted on: not idle
    assert h.session.idle_since() is None
    h.push(silence(700))
    await h.until("response.created")
    assert h.session.idle_since() is None  # answering
    h.engine.hold.set()
    await h.turn_done()
    since = h.session.idle_since()
    assert since is not None and since > first  # idle again, from the answer's end
    await h.session.close()
