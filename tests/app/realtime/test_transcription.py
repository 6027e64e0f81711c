"""Input audio transcription with a scripted engine: events, their order, settings, failures, history.

Every transcription event is also checked against openai-python's server-event union, the
schema OpenAI's own clients parse with.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from app.realtime.session_config import SessionConfig, TurnDetection
from app.realtime.transcription import MAX_TRANSCRIPTIONS_RUNNING
from app.realtime.turn_taking import ECHO_TAIL_MS
from pipeline.contract import EngineError, GenerationRequest
from pipeline.conversation import HistoryLimits, UserAudio
from tests.app.realtime.test_session import Harness, silence, started
from tests.fakes import ScriptedEngine, SessionHarness
from tests.settle import settle

TRANSCRIPTION = "conversation.item.input_audio_transcription"
OPENAI_SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
ON = {"type": "session.update", "session": {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}}


def transcription_events(h: Harness) -> list[dict[str, Any]]:
    return [event for event in h.events if event["type"].startswith(TRANSCRIPTION)]


def assert_openai_parses(events: list[dict[str, Any]]) -> None:
    for event in events:
        parsed = OPENAI_SERVER_EVENT.validate_python(event)
        assert parsed.type == event["type"] and parsed.event_id == event["event_id"]


async def next_turn(h: Harness, count: int) -> None:
    """Play out the answer and wait out the echo tail, so the next utterance is heard."""
    await h.turn_done(count)
    h.push(silence(ECHO_TAIL_MS + 100))


async def test_a_spoken_turn_is_transcribed_beside_its_answer():
    h = await started()
    await h.send(**ON)
    h.utter()
    completed = await h.until(f"{TRANSCRIPTION}.completed")
    await h.turn_done()

    item_id = h.last("input_audio_buffer.committed")["item_id"]
    assert completed["item_id"] == item_id and completed["content_index"] == 0
    assert completed["transcript"] == "What is the weather like?"
    deltas = [e for e in h.events if e["type"] == f"{TRANSCRIPTION}.delta"]
    assert "".join(e["delta"] for e in deltas) == completed["transcript"]
    assert {e["item_id"] for e in deltas} == {item_id}
    usage = completed["usage"]
    assert usage["type"] == "tokens" and usage["output_tokens"] == 5
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert_openai_parses(transcription_events(h))

    # What we guarantee: the user item is announced first; the answer is scheduled first and
    # the transcription starts only once the answer has its first audio.
    types = h.types()
    user_done = next(i for i, e in enumerate(h.events) if e["type"] == "conversation.item.done"
                     and e["item"]["id"] == item_id)
    first_answer_delta = types.index("response.output_audio_transcript.delta")
    first_transcription = types.index(f"{TRANSCRIPTION}.delta")
    assert user_done < types.index("response.created") < first_answer_delta < first_transcription
    assert first_transcription < types.index(f"{TRANSCRIPTION}.completed")
    assert [request.task for request in h.engine.requests] == ["respond", "transcribe"]
    await h.session.close()


async def test_the_transcript_stays_with_the_item_and_reaches_the_next_prompt():
    h = await started()
    await h.send(**ON)
    h.utter()
    await h.until(f"{TRANSCRIPTION}.completed")
    await next_turn(h, 1)
    h.utter()
    await h.turn_done(2)

    first_item = h.of_type("input_audio_buffer.committed")[0]["item_id"]
    entry = h.session._history.find(first_item)
    assert entry is not None and entry.item().content[0].transcript == "What is the weather like?"
    second_answer = [r for r in h.engine.requests if r.task == "respond"][1]
    clips = [item for item in second_answer.conversation.items if isinstance(item, UserAudio)]
    assert clips[0].transcript == "What is the weather like?"
    await h.session.close()


async def test_without_transcription_no_transcription_event_is_sent():
    h = await started()
    h.utter()
    await h.turn_done()
    assert h.session.stats()["tasks"] == 0  # no transcription waiting to run either
    assert transcription_events(h) == []
    assert [request.task for request in h.engine.requests] == ["respond"]
    assert h.events[0]["session"]["audio"]["input"]["transcription"] is None
    await h.session.close()


async def test_settings_are_reported_and_the_hints_reach_the_engine():
    h = await started()
    settings = {"model": "whisper-1", "language": "de", "prompt": "Namen: Jürgen", "delay": "low"}
    await h.send(type="session.update", session={"audio": {"input": {"transcription": settings}}})
    reported = h.last("session.updated")["session"]["audio"]["input"]["transcription"]
    assert reported == {"model": "whisper-1", "language": "de", "prompt": "Namen: Jürgen", "partials": True}
    assert_openai_parses([h.last("session.updated")])
    h.utter()
    await h.until(f"{TRANSCRIPTION}.completed")
    request = h.engine.requests[-1]
    assert request.task == "transcribe" and request.output_audio is False and request.temperature == 0.0
    assert (request.hint.language, request.hint.prompt) == ("de", "Namen: Jürgen")
    await h.turn_done()
    await h.session.close()


async def test_the_beta_key_turns_it_on_and_null_turns_it_off():
    h = await started()
    await h.send(type="session.update", session={"input_audio_transcription": {"model": "whisper-1"}})
    assert h.last("session.updated")["session"]["audio"]["input"]["transcription"]["model"] == "whisper-1"
    await h.send(type="session.update", session={"audio": {"input": {"transcription": None}}})
    assert h.last("session.updated")["session"]["audio"]["input"]["transcription"] is None
    await h.session.close()


@pytest.mark.parametrize(
    ("transcription", "param"),
    [("whisper-1", "session.audio.input.transcription"), ({"language": 5}, "session.audio.input.transcription.language")],
)
async def test_a_bad_transcription_setting_is_refused_naming_it(transcription, param):
    h = await started()
    await h.send(type="session.update", session={"audio": {"input": {"transcription": transcription}}})
    assert h.last("error")["error"]["param"] == param
    assert "session.updated" not in h.types()
    await h.session.close()


class FailingTranscriptions(Harness):
    def __init__(self) -> None:
        super().__init__()
        engine = self.engine
        answer = engine.run_generation

        def run_generation(request: GenerationRequest):
            if request.task == "transcribe":
                return self._fail()
            return answer(request)

        engine.run_generation = run_generation  # type: ignore[method-assign]

    @staticmethod
    async def _fail():
        raise EngineError("the engine process exited with code -9", code="engine_died")
        yield  # an async generator, like every engine's run_generation


async def test_a_failed_transcription_is_reported_for_its_item_and_the_session_goes_on():
    h = FailingTranscriptions()
    await h.session.start()
    await h.send(**ON)
    h.utter()
    failed = await h.until(f"{TRANSCRIPTION}.failed")
    done = await h.turn_done()
    assert done["response"]["status"] == "completed"
    assert failed["item_id"] == h.last("input_audio_buffer.committed")["item_id"]
    assert failed["error"]["code"] == "engine_died" and failed["error"]["message"]
    assert f"{TRANSCRIPTION}.completed" not in h.types()
    assert_openai_parses([failed])
    await h.session.close()


async def test_older_turns_beyond_the_audio_budget_are_kept_once_transcribed():
    limits = HistoryLimits(max_audio_clips=1)
    h = await started(SessionConfig(history=limits))
    await h.send(**ON)
    for turn in range(1, 4):
        h.utter()
        await h.until(f"{TRANSCRIPTION}.completed", turn)
        await next_turn(h, turn)
    # Three answered turns with one clip each over a budget of one clip: all kept, as text.
    assert h.session.stats()["items"] == 6

    plain = await started(SessionConfig(history=limits))
    for turn in range(1, 4):
        plain.utter()
        await next_turn(plain, turn)
    assert plain.session.stats()["items"] == 2  # only the newest turn fits the budget of one clip
    await h.session.close()
    await plain.session.close()


async def test_close_cancels_a_waiting_transcription():
    h = Harness()
    h.engine.hold = asyncio.Event()  # the answer never gets past its first word
    await h.session.start()
    await h.send(**ON)
    h.utter()
    await h.until("response.output_audio_transcript.delta")
    assert h.session.stats()["tasks"] == 2  # the response and the transcription waiting on it
    await h.session.close()
    assert h.session.stats()["tasks"] == 0
    await h.session.close()


async def test_the_idle_timeouts_silent_clip_is_transcribed_as_nothing_without_the_engine():
    h = await started(SessionConfig(turn_detection=TurnDetection(idle_timeout_ms=1_000)))
    await h.send(**ON)
    h.utter()
    await next_turn(h, 1)
    await h.until(f"{TRANSCRIPTION}.completed")
    h.push(silence(1_100))
    await h.turn_done(2)
    idle_item = h.last("input_audio_buffer.timeout_triggered")["item_id"]
    completed = await h.until(f"{TRANSCRIPTION}.completed", 2)
    assert completed["item_id"] == idle_item
    assert completed["transcript"] == "" and completed["usage"]["total_tokens"] == 0
    assert_openai_parses([completed])
    assert [request.task for request in h.engine.requests] == ["respond", "transcribe", "respond"]
    await h.session.close()


# 200 ms of a 220 Hz tone, as PCM16 at 24 kHz (the session's default input format), in base64.
TONE_200_MS = base64.b64encode(
    (0.3 * np.sin(2 * np.pi * 220 * np.arange(4_800) / 24_000) * 32_767).astype("<i2").tobytes()
).decode()


async def test_a_flood_of_commits_runs_at_most_two_transcriptions_at_once_and_drops_those_pruned():
    """Manual commits with transcription on: each is one engine generation; a session runs
    MAX_TRANSCRIPTIONS_RUNNING of them at once, and one whose item left the history never runs."""
    engine = ScriptedEngine()
    engine.hold_transcriptions = asyncio.Event()
    h = SessionHarness(engine, config=SessionConfig(turn_detection=None,
                                                    history=HistoryLimits(max_items=4)))
    await h.session.start()
    await h.send(**ON)
    for _ in range(8):
        await h.send(type="input_audio_buffer.append", audio=TONE_200_MS)
        await h.send(type="input_audio_buffer.commit")
    await settle()

    assert len(engine.running) == MAX_TRANSCRIPTIONS_RUNNING
    engine.hold_transcriptions.set()
    await settle(seconds=0.2)
    completed = [event["item_id"] for event in h.events if event["type"] == f"{TRANSCRIPTION}.completed"]
    kept = [event["item"]["id"] for event in h.events if event["type"] == "conversation.item.done"]
    deleted = {event["item_id"] for event in h.events if event["type"] == "conversation.item.deleted"}
    assert deleted == set(kept[:4])  # pruned to the history's 4 items
    assert completed == kept[4:] and len(engine.requests) == 4  # the pruned ones never ran
    assert h.session.stats()["tasks"] == 0
    await h.session.close()
