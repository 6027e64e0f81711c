"""The DashScope dialect (``app.transports.websocket.dashscope``) and the session events it brings.

Client events are the ones the real ``dashscope`` 2.0.2 SDK writes (its socket replaced by a
list); the session runs with a scripted engine and an energy VAD (a tone is speech).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from dashscope.audio.qwen_omni import (
    AudioFormatConfig,
    MultiModality,
    OmniRealtimeCallback,
    OmniRealtimeConversation,
)
from PIL import Image

from app.realtime.protocol import (
    ConversationItemDoneEvent,
    MessageItem,
    OutputAudioContent,
    ProtocolError,
    ResponseOutputAudioDeltaEvent,
    ResponseOutputAudioTranscriptDeltaEvent,
    ResponseOutputTextDeltaEvent,
)
from app.realtime.session_config import SessionConfig
from app.transports.websocket.dashscope import DASHSCOPE_VOICES, DashScopeDialect, dashscope_threshold, vad_threshold
from pipeline.conversation import UserAudio, UserImage
from pipeline.images import image_tokens
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness
from tests.pictures import encoded
from tests.speech import silence, tone

DIALECT = DashScopeDialect()
RATE = 16_000


def sdk_sends(call: Callable[[OmniRealtimeConversation], None]) -> list[dict[str, Any]]:
    """The events the real SDK writes for ``call``, its socket replaced by a list."""
    sent: list[dict[str, Any]] = []
    conversation = OmniRealtimeConversation(
        model="qwen3-omni-flash-realtime", callback=OmniRealtimeCallback(), api_key="sk-unused"
    )
    conversation._OmniRealtimeConversation__send_str = (  # type: ignore[attr-defined]
        lambda data, enable_log=True: sent.append(json.loads(data))
    )
    call(conversation)
    return sent


def sdk_update(**options: Any) -> dict[str, Any]:
    """The SDK's ``update_session`` as its documentation calls it: audio and text, voice Cherry."""
    options.setdefault("voice", "Cherry")
    (event,) = sdk_sends(lambda c: c.update_session([MultiModality.AUDIO, MultiModality.TEXT], **options))
    return event


def pcm16(pcm: np.ndarray) -> bytes:
    return (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()


class Harness(SessionHarness):
    def __init__(self) -> None:
        super().__init__(ScriptedEngine("I see it"), EnergyVad(), DIALECT.initial_config(SessionConfig()),
                         session_fields=DIALECT.session_fields)

    async def sdk(self, call: Callable[[OmniRealtimeConversation], None]) -> None:
        for event in sdk_sends(call):
            await self.send(**event)

    def current(self) -> dict[str, Any]:
        """The effective session, as the last ``session.updated`` (or ``session.created``) shows it."""
        updated = self.of_type("session.updated")
        return (updated[-1] if updated else self.events[0])["session"]

    def utter(self, speech_ms: int = 600) -> None:
        self.push(tone(speech_ms))
        self.push(silence(1000))  # DashScope's silence wait is 800 ms


@pytest_asyncio.fixture(loop_scope="function")
async def h():
    async with Harness() as harness:
        yield harness


# -- fields in --------------------------------------------------------------------------------


async def test_the_sdks_documented_update_with_cherry_is_applied_whole(h):
    await h.send(**sdk_update())
    session = h.current()
    assert "error" not in h.types()
    assert session["output_modalities"] == ["audio"]
    assert session["audio"]["output"]["voice"] == "chelsie"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16_000}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24_000}
    assert session["audio"]["input"]["transcription"] is not None  # the SDK turns it on by default
    assert session["audio"]["input"]["turn_detection"] == {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 800,
        "idle_timeout_ms": None, "create_response": True, "interrupt_response": True, "speculative_response": True,
        "interrupt_min_speech_ms": 700, "interrupt_resume_silence_ms": 250,
        "speech_floor_dbfs": -36.0, "speech_over_background_db": 12.0, "speech_under_user_db": 15.0,
    }


async def test_a_null_voice_keeps_the_sessions_voice(h):
    await h.send(**sdk_update(voice="Aiden"))
    await h.send(**sdk_update(voice=None))
    assert "error" not in h.types()
    assert h.current()["audio"]["output"]["voice"] == "aiden"


@pytest.mark.parametrize(("voice", "served"), [("Cherry", "chelsie"), ("Serena", "chelsie"), ("Ethan", "ethan"),
                                               ("Dylan", "ethan"), ("Eldric Sage", "ethan"), ("aiden", "aiden")])
async def test_dashscope_voices_speak_as_the_nearest_served_voice(h, voice, served):
    await h.send(**sdk_update(voice=voice))
    assert h.current()["audio"]["output"]["voice"] == served


def test_every_dashscope_voice_maps_to_a_served_one():
    assert set(DASHSCOPE_VOICES.values()) == {"chelsie", "ethan", "aiden"}
    assert len(DASHSCOPE_VOICES) >= 49


async def test_an_unknown_voice_is_refused_naming_session_voice_and_nothing_changes(h):
    await h.send(**sdk_update(voice="Nobody", input_audio_config=AudioFormatConfig(sample_rate=8_000)))
    error = h.last("error")["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "session.voice")
    assert "Cherry" in error["message"]
    assert "session.updated" not in h.types()
    assert h.current()["audio"]["input"]["format"]["rate"] == 16_000


async def appended_samples(h: Harness, pcm: bytes) -> int:
    """``pcm`` appended as the SDK appends (100 ms events), committed and answered: the samples of
    the user audio the model got (at 16 kHz)."""
    await h.sdk(lambda c: [c.append_audio(base64.b64encode(pcm[i:i + 3200]).decode())
                           for i in range(0, len(pcm), 3200)])
    await h.sdk(lambda c: (c.commit(), c.create_response()))
    await h.turn_done()
    (audio,) = [item for item in h.engine.requests[0].conversation.items if isinstance(item, UserAudio)]
    return audio.pcm.size


async def test_16khz_pcm16_appends_reach_the_model_at_their_own_length(h):
    await h.send(**sdk_update(enable_turn_detection=False))
    samples = await appended_samples(h, pcm16(tone(1000)))
    assert abs(samples - RATE) <= 160  # one second (read as 24 kHz it would be 2/3 of one)


async def test_the_sdks_newer_format_config_sets_the_input_rate(h):
    await h.send(**sdk_update(enable_turn_detection=False, input_audio_config=AudioFormatConfig(sample_rate=8_000),
                              output_audio_config=AudioFormatConfig(sample_rate=24_000)))
    assert h.current()["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 8_000}
    two_seconds_at_8khz = pcm16(tone(2000)[::2])
    # Two seconds, less the resampler's delay (~30 ms at 8 → 16 kHz); read as 24 kHz it would be 1.3 s.
    assert abs(await appended_samples(h, two_seconds_at_8khz) - 2 * RATE) <= 50 * RATE // 1000


async def test_an_output_rate_other_than_24khz_is_refused(h):
    await h.send(**sdk_update(output_audio_config=AudioFormatConfig(sample_rate=16_000)))
    error = h.last("error")["error"]
    assert error["param"] == "session.audio.output.format.sample_rate"


def test_dashscopes_threshold_scale_puts_its_default_on_ours_and_keeps_its_order():
    assert vad_threshold(0.2) == pytest.approx(0.5)
    assert vad_threshold(-1.0) == pytest.approx(0.1)
    assert vad_threshold(1.0) == pytest.approx(0.95)
    scale = np.linspace(-1, 1, 41)
    mapped = [vad_threshold(value) for value in scale]
    assert mapped == sorted(mapped) and all(0 < value < 1 for value in mapped)
    assert [dashscope_threshold(value) for value in mapped] == pytest.approx(scale, abs=1e-3)


@pytest.mark.parametrize("threshold", [-1.5, 1.01, "0.5", True])
def test_a_threshold_off_dashscopes_scale_is_refused(threshold):
    with pytest.raises(ProtocolError) as refused:
        DIALECT.session_fields({"turn_detection": {"type": "server_vad", "threshold": threshold}})
    assert refused.value.param == "session.turn_detection.threshold"


def test_turn_detection_keeps_barge_in_unless_the_client_turns_it_off():
    assert DIALECT.session_fields({"turn_detection": {"type": "server_vad"}})["turn_detection"][
        "interrupt_response"] is True
    assert DIALECT.session_fields({"turn_detection": {"interrupt_response": False}})["turn_detection"][
        "interrupt_response"] is False


def test_max_tokens_is_max_output_tokens_within_4096():
    assert DIALECT.session_fields({"max_tokens": 16_384})["max_output_tokens"] == 4096
    assert DIALECT.session_fields({"max_tokens": 100})["max_output_tokens"] == 100


@pytest.mark.parametrize("value", [0, -5, "16384", None, 1.5])
def test_a_max_tokens_that_is_no_positive_integer_is_refused_naming_it(value):
    with pytest.raises(ProtocolError) as refused:
        DIALECT.session_fields({"max_tokens": value})
    assert refused.value.param == "session.max_tokens"


JUNK = [None, True, -1, 1e309, "x", [], [1], {}, {"type": "wav"}, {"sample_rate": 44_100}]
DASHSCOPE_KEYS = ["voice", "input_audio_format", "output_audio_format", "sample_rate", "audio", "turn_detection",
                  "max_tokens", "tools", "video", "modalities", "input_audio_transcription"]


def test_junk_in_any_dashscope_field_is_refused_naming_it_or_applied_never_a_crash():
    config = DIALECT.initial_config(SessionConfig())
    refused = 0
    for key in DASHSCOPE_KEYS:
        for value in JUNK:
            for session in ({key: value}, {"audio": {"input": {"format": value}}}):
                try:
                    config.updated(DIALECT.session_fields(session))
                except ProtocolError as error:  # anything else fails the test
                    assert error.code == "invalid_value" and error.param, (session, error.message)
                    refused += 1
    assert refused > len(DASHSCOPE_KEYS)


def test_chat_completions_tools_are_read_as_realtime_tools():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    assert DIALECT.session_fields({"tools": [tool]})["tools"] == [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    ]


def test_dashscopes_video_input_setting_is_not_read_as_the_camera_setting():
    sent = sdk_update(input_video_representation_compact="on")["session"]
    assert sent["video"] == {"input": {"representation_compact": "on"}}
    assert "video" not in DIALECT.session_fields(sent)


async def test_dashscopes_sampling_fields_are_accepted(h):
    await h.sdk(lambda c: c.update_session([MultiModality.TEXT], voice="Cherry", seed=1314, max_tokens=16_384,
                                           repetition_penalty=1.05, presence_penalty=0.0, top_k=50, top_p=1.0,
                                           temperature=0.9, smooth_output=True, enable_search=False))
    session = h.current()
    assert "error" not in h.types()
    assert (session["output_modalities"], session["max_output_tokens"], session["temperature"]) == (["text"], 4096, 0.9)


# -- names out --------------------------------------------------------------------------------


def test_answers_take_dashscopes_names():
    ids = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
    for event, name in ((ResponseOutputAudioDeltaEvent(delta="AAAA", **ids), "response.audio.delta"),
                        (ResponseOutputAudioTranscriptDeltaEvent(delta="Hi", **ids), "response.audio_transcript.delta"),
                        (ResponseOutputTextDeltaEvent(delta="Hi", **ids), "response.text.delta")):
        spoken = DIALECT.server_event(event.to_json())
        assert spoken is not None and spoken == {**event.to_json(), "type": name}


def test_conversation_item_done_is_not_sent():
    item = MessageItem(id="item_1", status="completed", role="assistant", content=[OutputAudioContent(transcript="Hi")])
    assert DIALECT.server_event(ConversationItemDoneEvent(previous_item_id=None, item=item).to_json()) is None


async def test_items_and_responses_read_as_the_beta_wrote_them(h):
    await h.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    await h.send(type="response.create")
    await h.turn_done()
    spoken = [DIALECT.server_event(event) for event in h.events]
    types = [event["type"] for event in spoken if event is not None]
    assert "conversation.item.done" not in types and types.count("conversation.item.created") == 2
    done = next(event for event in spoken if event is not None and event["type"] == "response.done")["response"]
    assert done["modalities"] == ["text", "audio"] and "output_modalities" not in done
    assert done["output"][0]["content"] == [{"type": "audio", "transcript": "I see it"}]


async def test_the_session_is_dashscopes_flat_object(h):
    flat = DIALECT.server_event(h.events[0])
    assert flat is not None and flat["type"] == "session.created"
    session = flat["session"]
    assert session["object"] == "realtime.session" and session["id"].startswith("sess_")
    assert session["modalities"] == ["text", "audio"]
    assert (session["voice"], session["input_audio_format"], session["output_audio_format"]) == (
        "Ethan", "pcm16", "pcm24")
    assert session["turn_detection"]["threshold"] == 0.2  # DashScope's scale
    assert session["turn_detection"]["interrupt_response"] is True
    assert session["turn_detection"]["silence_duration_ms"] == 800
    assert session["input_audio_transcription"] == {"model": None}
    assert "audio" in session and session["audio"]["input"]["format"] == {"type": "pcm", "sample_rate": 16_000}


# -- camera frames (input_image_buffer.append) -----------------------------------------------


def frame_event(data: bytes) -> dict[str, Any]:
    (event,) = sdk_sends(lambda c: c.append_video(base64.b64encode(data).decode()))
    return event


async def test_a_pushed_frame_joins_the_next_utterance_as_its_image(h):
    await h.send(**frame_event(encoded(640, 480, seed=1)))
    h.utter()
    done = await h.turn_done()
    (image,) = [item for item in h.engine.requests[0].conversation.items if isinstance(item, UserImage)]
    assert image.tokens == image_tokens(640, 480, 100_352) == 88
    assert done["response"]["usage"]["input_token_details"]["image_tokens"] == 88
    assert "error" not in h.types()


async def test_pushed_frames_are_kept_one_per_sampling_interval(h):
    for seed in range(3):  # at once: the idle rate is one frame every 4 s
        await h.send(**frame_event(encoded(320, 240, seed=seed)))
    assert h.session.stats()["camera_frames"] == 1


async def test_a_frame_that_is_no_image_gets_an_error_naming_image(h):
    await h.send(**frame_event(b"not a picture"))
    error = h.last("error")["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "image")
    assert h.session.stats()["camera_frames"] == 0


async def test_a_frame_past_the_ordinary_event_limit_is_taken(h):
    noise = np.random.default_rng(0).integers(0, 256, size=(720, 1280, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(noise).save(out, format="JPEG", quality=90)  # DashScope takes up to 500 KB
    event = frame_event(out.getvalue())
    assert len(json.dumps(event)) > SessionConfig().max_event_bytes
    await h.send(**event)
    assert "error" not in h.types()
    assert h.session.stats()["camera_frames"] == 1


# -- session.finish ----------------------------------------------------------------------------


async def test_session_finish_cancels_the_response_and_session_finished_comes_last(h):
    h.engine.hold = asyncio.Event()
    h.utter()
    await h.until("response.created")
    await h.sdk(lambda c: c.end_session_async())
    await h.until("session.finished")
    types = h.types()
    assert types[-2:] == ["response.done", "session.finished"]
    assert h.last("response.done")["response"]["status"] == "cancelled"
    count = len(h.events)
    h.utter()
    await h.send(type="response.create")
    assert len(h.events) == count  # nothing is taken or sent after it


async def test_session_finish_with_nothing_running_is_answered_at_once(h):
    await h.sdk(lambda c: c.end_session_async())
    assert h.types() == ["session.created", "session.finished"]
