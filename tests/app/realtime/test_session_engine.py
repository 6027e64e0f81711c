"""RealtimeSession end to end with the dev model: real VAD, real TransformersEngine, virtual speaker.

Each dev-model turn costs ~1-2 s of CPU, so this module keeps to a few turns on one engine.
"""

from __future__ import annotations

import dataclasses

import pytest

from app.realtime.session_config import InputTranscription, SessionConfig, TurnDetection
from app.realtime.turn_taking import ECHO_TAIL_MS
from pipeline.conversation import AssistantText, HistoryLimits, UserAudio, bound_history
from pipeline.local.tokenizer import load_tokenizer
from pipeline.local.transformers_engine import TransformersEngine
from tests.app.realtime.test_transcription import TRANSCRIPTION, assert_openai_parses
from tests.conftest import started_dev_engine
from tests.fakes import SessionHarness
from tests.speech import load_fixture, silence

# The engine lives on the session loop, so every test here runs on it too.
pytestmark = [pytest.mark.dev_model, pytest.mark.asyncio(loop_scope="session")]

MAX_AUDIO_FRAMES = 20  # a random Talker rarely says codec EOS: 20 frames (1.6 s) bound a turn's audio
TURN_GUARD_S = 300  # against hangs only: a CPU turn takes ~1-2 s, more when the machine is busy


class RecordingEngine:
    """Passes turns through to the real engine and keeps the requests (and which speculative ones
    were used: ``used``)."""

    def __init__(self, engine: TransformersEngine) -> None:
        self._engine = engine
        self.name = engine.name
        self.capabilities = engine.capabilities
        self.requests = []
        self.promoted = set()

    def run_generation(self, request):
        self.requests.append(request)
        return self._engine.run_generation(request)

    async def promote(self, preemptible_id):
        self.promoted.add(preemptible_id)
        return await self._engine.promote(preemptible_id)

    def used(self):
        """The answers' requests whose turns were used (a speculation thrown away is not)."""
        return [request for request in self.requests if request.task == "respond"
                and (request.preemptible_id is None or request.preemptible_id in self.promoted)]


@pytest.fixture(scope="module")
async def engine(dev_model_dir):
    async with started_dev_engine(dev_model_dir, generation={"max_audio_frames": MAX_AUDIO_FRAMES}) as engine:
        yield engine


async def test_two_spoken_turns_with_the_dev_model(engine, vad):
    recording = RecordingEngine(engine)
    h = SessionHarness(recording, vad, SessionConfig(max_output_tokens=8))
    await h.session.start()
    h.push(load_fixture("hello"))
    h.push(silence(800))
    first = (await h.turn_done(timeout_s=TURN_GUARD_S))["response"]
    h.push(silence(ECHO_TAIL_MS + 200))
    h.push(load_fixture("weather"))
    h.push(silence(800))
    second = (await h.turn_done(2, timeout_s=TURN_GUARD_S))["response"]

    assert first["status"] in ("completed", "incomplete") and second["status"] in ("completed", "incomplete")
    transcript = first["output"][0]["content"][0]["transcript"]
    deltas = [e["delta"] for e in h.of_type("response.output_audio_transcript.delta")
              if e["response_id"] == first["id"]]
    assert transcript and "".join(deltas) == transcript
    assert first["usage"]["input_token_details"]["audio_tokens"] > 0
    assert first["usage"]["output_token_details"]["audio_tokens"] > 0
    assert h.output.played_samples > 0
    latency = h.last("response.done")["latency"]
    assert latency["engine_first_audio_ms"] + latency["speculation_hidden_ms"] > 0
    items = recording.used()[1].conversation.items
    assert [type(item) for item in items] == [UserAudio, AssistantText, UserAudio]
    assert items[1] == AssistantText(transcript)  # played out whole, so heard whole
    assert h.types().count("output_audio_buffer.stopped") == 2
    await h.session.close()


async def test_cancelling_a_dev_model_turn_frees_the_session_for_the_next(engine, vad):
    h = SessionHarness(RecordingEngine(engine), vad, SessionConfig(turn_detection=None, output_modality="text"))
    await h.session.start()
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]})
    await h.send(type="response.create")  # unbounded: a random Thinker would run to the 4096-token cap
    await h.until("response.output_text.delta", timeout_s=TURN_GUARD_S)
    await h.send(type="response.cancel")

    assert h.last("response.done")["response"]["status"] == "cancelled"
    await h.send(type="response.create", response={"max_output_tokens": 4})
    done = (await h.turn_done(2, timeout_s=TURN_GUARD_S))["response"]
    assert done["status"] in ("completed", "incomplete")
    assert done["usage"]["output_token_details"]["text_tokens"] <= 4
    await h.session.close()


async def _spoken_turns(engine, vad, config: SessionConfig, fixtures: tuple[str, ...]) -> SessionHarness:
    """One spoken turn per fixture; with transcription on, each is transcribed before the next."""
    h = SessionHarness(RecordingEngine(engine), vad, config)
    await h.session.start()
    for turn, name in enumerate(fixtures, 1):
        h.push(load_fixture(name))
        h.push(silence(800))
        await h.turn_done(turn, timeout_s=TURN_GUARD_S)
        if config.transcription is not None:
            await h.until(f"{TRANSCRIPTION}.completed", turn, timeout_s=TURN_GUARD_S)
        h.push(silence(ECHO_TAIL_MS + 200))
    await h.session.close()
    return h


async def test_spoken_turns_are_transcribed_and_kept_as_text_beyond_the_audio_budget(engine, vad, dev_model_dir):
    # A budget of one past clip: the third turn hears the second as audio; the first only as text.
    config = SessionConfig(max_output_tokens=8, history=HistoryLimits(max_audio_clips=1))
    fixtures = ("hello", "weather", "hello")
    on = await _spoken_turns(engine, vad, dataclasses.replace(config, transcription=InputTranscription("any")),
                             fixtures)
    off = await _spoken_turns(engine, vad, config, fixtures)

    completed = on.of_type(f"{TRANSCRIPTION}.completed")
    committed = [event["item_id"] for event in on.of_type("input_audio_buffer.committed")]
    assert [event["item_id"] for event in completed] == committed
    assert all(event["transcript"] for event in completed)
    assert_openai_parses([event for event in on.events if event["type"].startswith(TRANSCRIPTION)])
    assert off.of_type(f"{TRANSCRIPTION}.completed") == []

    third_on = on.of_type("response.done")[2]["response"]["usage"]["input_token_details"]
    third_off = off.of_type("response.done")[2]["response"]["usage"]["input_token_details"]

    def clips_heard(h: SessionHarness) -> list[float]:
        return [item.seconds for item in bound_history(h.engine.used()[2].conversation) if isinstance(item, UserAudio)]

    # The same two clips as audio. Not their audio tokens: the third answer's own clip ends at the
    # first quiet window when it was speculative, at the silence wait's end when it started at the
    # commit, and whether a speculation ran depends on its per-second bound, so on the wall clock.
    assert len(clips_heard(on)) == len(clips_heard(off)) == 2
    first_transcript = completed[0]["transcript"]
    tokens = len(load_tokenizer(dev_model_dir).encode(first_transcript, add_special_tokens=False))
    assert third_on["text_tokens"] - third_off["text_tokens"] >= tokens


async def test_a_forced_tool_choice_makes_the_dev_model_call(engine, vad):
    """``required`` and a named function start the answer inside a call: it comes out as a
    function_call item (the random model names no function after ``required``, and rarely
    closes the call: delivered as written), with no message and no audio."""
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    h = SessionHarness(RecordingEngine(engine), vad, SessionConfig(turn_detection=None, max_output_tokens=12))
    await h.session.start()
    await h.send(type="session.update", session={"tools": [tool], "tool_choice": {"type": "function", "name": "get_time"}})
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Time?"}]})
    outputs = []
    for count, choice in enumerate(({"type": "function", "name": "get_time"}, "required"), 1):
        await h.send(type="response.create", response={"tool_choice": choice})
        outputs.append((await h.turn_done(count, timeout_s=TURN_GUARD_S))["response"]["output"])
    named, required = outputs
    assert [(item["type"], item["name"]) for item in named] == [("function_call", "get_time")]
    assert [item["type"] for item in required] == ["function_call"]
    assert not h.of_type("response.output_audio.done") and h.output.played_samples == 0
    assert not h.of_type("error")
    await h.session.close()


# A dev model that speaks like a trained Talker: 20 answer tokens over 60 codec frames (4.8 s,
# ~4 tokens a second), where the Talker is fed them in 20 frames.
SLOW_TALKER = {"force_output_tokens": 20, "talker_frames_per_token": 3, "max_audio_frames": 60}


async def test_barge_in_at_40_percent_of_the_audio_keeps_40_percent_of_the_text(dev_model_dir, vad):
    async with started_dev_engine(dev_model_dir, generation=SLOW_TALKER) as engine:
        recording = RecordingEngine(engine)
        config = SessionConfig(max_output_tokens=20, turn_detection=TurnDetection(interrupt_response=True))
        h = SessionHarness(recording, vad, config)
        await h.session.start()
        h.push(load_fixture("hello"))
        h.push(silence(800))
        done = (await h.until("response.done", timeout_s=TURN_GUARD_S))["response"]
        deltas = [e["delta"] for e in h.of_type("response.output_audio_transcript.delta") if e["response_id"] == done["id"]]
        assert done["usage"]["output_token_details"]["audio_tokens"] == 60 and len(deltas) >= 18
        h.output.play(h.output.queued_samples * 2 // 5)  # 40% of the answer's audio
        h.push(load_fixture("weather"))  # the user talks over it
        h.push(silence(800))
        truncated = await h.until("conversation.item.truncated", timeout_s=TURN_GUARD_S)
        await h.until("response.created", 2, timeout_s=TURN_GUARD_S)
        (heard,) = [item.text for item in recording.used()[1].conversation.items if isinstance(item, AssistantText)]
        await h.session.close()

    assert 1900 <= truncated["audio_end_ms"] <= 1920  # 40% of 4.8 s (less the last chunk's 23 ms tail)
    # Tokens heard, counted in the deltas the text came in (one token each, a held-back UTF-8
    # character's tokens together): 40% of the text, give or take two. Counting one token per
    # frame played, as the Talker is fed, would keep 19 of 20.
    heard_deltas = 0
    while heard_deltas < len(deltas) and heard.startswith("".join(deltas[: heard_deltas + 1])):
        heard_deltas += 1
    assert "".join(deltas[:heard_deltas]) == heard
    assert abs(heard_deltas - 0.4 * len(deltas)) <= 2, (heard_deltas, len(deltas))
