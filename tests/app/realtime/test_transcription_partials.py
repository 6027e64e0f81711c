"""Partial transcripts while the user speaks, with a scripted engine: cadence, what each partial
sends, how the final transcription goes on from them, and the engine's capacity rules.

The scripted engine "hears" two words per second of the clip it transcribes (``counting``), so
each partial over more audio says more, as a real ASR turn would. Every event is checked against
openai-python's server-event union, the schema OpenAI's own clients parse with.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.realtime.session_config import SessionConfig
from app.realtime.transcription import PartialText, agreed_prefix, words
from pipeline.contract import GenerationRequest
from pipeline.conversation import Conversation, UserAudio, UserText
from tests.app.realtime.test_session import Harness
from tests.app.realtime.test_transcription import ON, TRANSCRIPTION, assert_openai_parses
from tests.fakes import STEADY_TONE_SPEECH
from tests.settle import settle
from tests.speech import silence, tone

DELTA = f"{TRANSCRIPTION}.delta"
COMPLETED = f"{TRANSCRIPTION}.completed"
NUMBERS = "one two three four five six seven eight nine ten eleven twelve".split()
PARTIALS_OFF = {"type": "session.update",
                "session": {"audio": {"input": {"transcription": {"model": "any", "partials": False}}}}}


def counting(clip: UserAudio) -> str:
    """Two words a second of audio, always the same ones: what a steady ASR hears of a clip."""
    return " ".join(NUMBERS[: int(clip.seconds * 2)])


def misheard_at_first(clip: UserAudio) -> str:
    """Hears "won" for "one" in the first 2.5 s of the clip, and right from then on."""
    text = counting(clip)
    return text if clip.seconds > 2.5 else text.replace("one", "won", 1)


async def started(transcript: Any = counting, config: SessionConfig | None = None) -> Harness:
    h = Harness(config)
    h.engine.transcript = transcript
    await h.session.start()
    await h.send(**ON)
    h.push(silence(300))  # the prefix padding before the speech is silence
    return h


async def partials_ended(h: Harness) -> None:
    """The loop settled, and no partial transcript is running: each ends within a few of its turns."""
    await settle()
    assert not h.session.stats()["partial_transcripts"]


async def speak(h: Harness, ms: int, *, step_ms: int = 100, wait: bool = True) -> None:
    """Speech in steps, the partials in flight running between them as they would in real time."""
    for _ in range(ms // step_ms):
        h.push(tone(step_ms))
        if wait:
            await partials_ended(h)
        else:
            await settle()  # held turns stay held


def partial_events(h: Harness) -> list[dict[str, Any]]:
    return [event for event in h.of_type(DELTA) if event["partial"]]


def partial_requests(h: Harness) -> list[GenerationRequest]:
    return [request for request in h.engine.requests if (request.preemptible_id or "").startswith("partial")]


def index_of(h: Harness, event_type: str) -> int:
    return h.types().index(event_type)


# -- what the partials send -------------------------------------------------------------------


async def test_partials_arrive_while_the_user_speaks_each_superseding_the_last():
    h = await started()
    await speak(h, 3_000)
    item_id = h.last("input_audio_buffer.speech_started")["item_id"]
    partials = partial_events(h)
    # The item holds 1 s of audio (its 300 ms of prefix padding included) at the first, then 1 s more each.
    assert [event["transcript"] for event in partials] == ["one two", "one two three four", "one two three four five six"]
    assert {event["item_id"] for event in partials} == {item_id}
    assert {event["content_index"] for event in partials} == {0}
    # delta: what the previous hypothesis agreed on, appended to what was sent (nothing at the first).
    assert [event["delta"] for event in partials] == ["", "one two", " three four"]
    assert "input_audio_buffer.committed" not in h.types()  # all of it while the user speaks
    assert [outcome for outcome, _ in h.partials] == ["started", "done"] * 3
    assert_openai_parses(partials)
    await h.session.close()


async def test_the_final_transcription_goes_on_from_the_partials_and_its_deltas_add_up():
    h = await started()
    await speak(h, 3_600)  # partials at 1, 2 and 3 s of the item; the item holds 3.9 s
    h.push(silence(700))
    completed = await h.until(COMPLETED)
    await h.turn_done()

    item_id = h.last("input_audio_buffer.committed")["item_id"]
    assert completed["item_id"] == item_id and completed["transcript"] == "one two three four five six seven"
    finals = [event for event in h.of_type(DELTA) if not event["partial"]]
    assert finals and all(event["item_id"] == item_id for event in finals)
    assert index_of(h, "input_audio_buffer.committed") < h.events.index(finals[0])
    # A client that appends every delta of the item (LiveKit) ends with the final text.
    assert "".join(event["delta"] for event in h.of_type(DELTA)) == completed["transcript"]
    # The final's deltas say only what it adds to what the partials agreed on.
    assert "".join(event["delta"] for event in finals) == " five six seven"
    assert finals[-1]["transcript"] == completed["transcript"]
    assert_openai_parses(h.of_type(DELTA) + [completed])
    await h.session.close()


async def test_words_a_later_partial_revises_are_never_taken_back_and_the_final_text_replaces_them():
    h = await started(misheard_at_first)
    await speak(h, 3_600)
    partials = partial_events(h)
    assert [event["transcript"] for event in partials] == [
        "won two", "won two three four", "one two three four five six",  # the newest hypothesis wins
    ]
    appended = "".join(event["delta"] for event in partials)
    assert appended == "won two"  # agreed before the revision; deltas only append
    h.push(silence(700))
    completed = await h.until(COMPLETED)
    await h.turn_done()
    assert completed["transcript"] == "one two three four five six seven"
    # The final does not start with what was appended: no delta of it, .completed tells.
    assert [event for event in h.of_type(DELTA) if not event["partial"]] == []
    entry = h.session._history.find(completed["item_id"])
    assert entry is not None and entry.item().content[0].transcript == completed["transcript"]
    await h.session.close()


async def test_the_same_hypothesis_again_sends_nothing():
    h = await started(lambda clip: "the same words")
    await speak(h, 3_000)
    assert [event["transcript"] for event in partial_events(h)] == ["the same words"]
    assert [outcome for outcome, _ in h.partials].count("done") == 3
    await h.session.close()


async def test_without_partials_the_deltas_are_the_final_transcriptions_alone():
    h = await started()
    await h.send(**PARTIALS_OFF)
    assert h.last("session.updated")["session"]["audio"]["input"]["transcription"]["partials"] is False
    await speak(h, 3_000)
    h.push(silence(700))
    completed = await h.until(COMPLETED)
    await h.turn_done()
    assert partial_events(h) == [] and partial_requests(h) == []
    assert "".join(event["delta"] for event in h.of_type(DELTA)) == completed["transcript"]
    await h.session.close()


async def test_the_servers_setting_is_the_default_a_session_may_override():
    h = await started(config=SessionConfig(partial_transcripts=False))
    assert h.last("session.updated")["session"]["audio"]["input"]["transcription"]["partials"] is False
    await speak(h, 2_000)
    assert partial_requests(h) == []
    await h.send(type="session.update", session={"audio": {"input": {"transcription": {"partials": True}}}})
    await speak(h, 1_200)
    assert len(partial_events(h)) == 2
    await h.session.close()


async def test_a_bad_partials_setting_is_refused_naming_it():
    h = await started()
    await h.send(type="session.update", session={"audio": {"input": {"transcription": {"partials": "yes"}}}})
    assert h.last("error")["error"]["param"] == "session.audio.input.transcription.partials"
    await h.session.close()


async def test_without_transcription_nothing_is_transcribed_while_the_user_speaks():
    h = Harness()
    h.engine.transcript = counting
    await h.session.start()
    await speak(h, 3_000)
    assert h.engine.requests == [] and h.of_type(DELTA) == []
    await h.session.close()


async def test_no_partial_starts_in_a_pause_and_they_resume_with_the_speech():
    h = await started()
    await speak(h, 600)
    h.push(silence(400))  # under the 500 ms wait: the utterance goes on, 1.3 s of it by now
    await partials_ended(h)
    assert partial_requests(h) == []
    await speak(h, 300)
    assert [round(request.conversation.items[0].seconds, 1) for request in partial_requests(h)] == [1.3]
    await h.session.close()


async def test_each_partial_transcribes_the_item_so_far_and_the_steps_grow_past_4_s():
    h = await started(config=STEADY_TONE_SPEECH)
    await speak(h, 8_000, step_ms=200)
    seconds = [round(request.conversation.items[0].seconds, 1) for request in partial_requests(h)]
    assert seconds == [1.0, 2.0, 3.0, 4.0, 5.0, 6.3, 7.8]  # past 4 s, a quarter of the audio so far
    assert all(request.task == "transcribe" and request.temperature == 0.0 for request in partial_requests(h))
    await h.session.close()


# -- one in flight; cancelled partials send nothing -------------------------------------------


async def test_a_newer_partial_supersedes_a_running_one_which_sends_nothing():
    h = await started()
    h.engine.hold_transcriptions = asyncio.Event()
    await speak(h, 2_000, wait=False)  # the first partial (1 s) is still running at 2 s
    assert [outcome for outcome, _ in h.partials] == ["started", "superseded", "started"]
    assert h.session.stats()["partial_transcripts"] <= 2  # the superseded one may still be stopping
    h.engine.hold_transcriptions.set()
    await partials_ended(h)
    assert [event["transcript"] for event in partial_events(h)] == ["one two three four"]
    assert h.engine.cancelled_turns == 1
    # Superseded once: the next step is 2 s, not 1 (an engine slower than the cadence still shows some).
    await speak(h, 1_000)
    assert len(partial_requests(h)) == 2
    await speak(h, 1_000)
    assert len(partial_requests(h)) == 3
    await h.session.close()


async def test_the_commit_cancels_a_running_partial_and_it_leaves_no_event():
    h = await started()
    h.engine.hold_transcriptions = asyncio.Event()
    await speak(h, 1_200, wait=False)
    assert [outcome for outcome, _ in h.partials] == ["started"]
    h.push(silence(700))
    await h.until("input_audio_buffer.committed")
    assert [outcome for outcome, _ in h.partials] == ["started", "cancelled"]
    h.engine.hold_transcriptions.set()
    await h.until(COMPLETED)
    await h.turn_done()
    assert partial_events(h) == []
    assert all(index_of(h, "input_audio_buffer.committed") < h.events.index(event) for event in h.of_type(DELTA))
    await h.session.close()


async def test_clearing_the_input_drops_the_utterance_and_its_running_partial():
    h = await started()
    h.engine.hold_transcriptions = asyncio.Event()
    await speak(h, 1_200, wait=False)
    await h.send(type="input_audio_buffer.clear")
    h.engine.hold_transcriptions.set()
    await partials_ended(h)
    assert [outcome for outcome, _ in h.partials] == ["started", "cancelled"]
    assert h.of_type(DELTA) == []
    await h.session.close()


async def test_turning_transcription_off_cancels_the_running_partial_at_once():
    h = await started()
    h.engine.hold_transcriptions = asyncio.Event()
    await speak(h, 1_200, wait=False)
    await h.send(type="session.update", session={"audio": {"input": {"transcription": None}}})
    h.engine.hold_transcriptions.set()
    await partials_ended(h)
    assert [outcome for outcome, _ in h.partials] == ["started", "cancelled"]
    assert h.of_type(DELTA) == []
    await h.session.close()


async def test_close_cancels_and_awaits_the_running_partial():
    h = await started()
    h.engine.hold_transcriptions = asyncio.Event()
    await speak(h, 1_200, wait=False)
    assert h.session.stats()["partial_transcripts"] == 1
    await h.session.close()
    assert h.session.stats()["partial_transcripts"] == 0
    assert h.engine.running == {}
    await h.session.close()


# -- never ahead of a committed turn ----------------------------------------------------------


def ordinary_turn() -> GenerationRequest:
    """Another visitor's committed answer."""
    return GenerationRequest(conversation=Conversation(items=(UserText("hello"),)))


async def test_no_partial_starts_while_every_engine_slot_is_taken():
    h = await started()
    h.engine.max_batch = 1
    h.engine.hold = asyncio.Event()  # the committed turn holds the only slot
    committed = h.engine.run_generation(ordinary_turn())
    await anext(committed)
    await speak(h, 3_000)
    assert [outcome for outcome, _ in h.partials] == ["started", "refused"] * 3
    assert partial_events(h) == []
    assert all(request.preemptible_id is not None for request in partial_requests(h))  # never queued behind it
    h.engine.hold.set()
    await committed.aclose()
    await h.session.close()


async def test_a_committed_turn_takes_a_running_partials_slot_and_nothing_of_it_is_shown():
    h = await started()
    h.engine.max_batch = 1
    h.engine.hold_transcriptions = asyncio.Event()
    await speak(h, 1_200, wait=False)
    assert len(h.engine.running) == 1  # the partial holds the only slot
    events = [event async for event in h.engine.run_generation(ordinary_turn())]  # not queued: it preempts
    assert events[-1].finish_reason == "stop"
    await partials_ended(h)
    assert [outcome for outcome, _ in h.partials] == ["started", "preempted"]
    assert partial_events(h) == []
    await h.session.close()


# -- content index ----------------------------------------------------------------------------


async def test_a_partials_content_index_is_the_audio_parts_a_commit_would_give(monkeypatch):
    h = await started()
    frames = {"count": 0}
    monkeypatch.setattr(h.session._partials, "_content_index", lambda: frames["count"])
    await speak(h, 2_000)
    frames["count"] = 2  # two camera frames joined the utterance: the audio part comes after them
    await speak(h, 1_000)
    assert [(event["content_index"], event["delta"]) for event in partial_events(h)] == [
        (0, ""), (0, "one two"), (2, ""),  # that part's text starts over
    ]
    await h.session.close()


# -- the agreement ----------------------------------------------------------------------------


def test_words_join_back_to_the_text_and_cjk_characters_are_words():
    for text in ("Hello, can you hear me?", "  two  spaces ", "今天天气怎么样", "Qwen 是 good"):
        assert "".join(words(text)) == text
    assert words("今天 ok") == ["今", "天", " ok"]


def test_the_agreed_prefix_is_whole_words_two_hypotheses_share():
    assert agreed_prefix("hello wor", "hello world how") == "hello"
    assert agreed_prefix("Hello, can", "Hello. Can you") == ""
    assert agreed_prefix("今天天", "今天天气") == "今天天"


def test_partial_text_appends_agreed_words_and_never_takes_any_back():
    text = PartialText(0)
    assert text.partial("") is None  # a first empty hypothesis says nothing
    assert text.partial("hello wor") == ""
    assert text.partial("hello world how") == "hello"
    assert text.partial("hello world how") is None
    assert text.partial("yellow world how are") == ""  # revised: nothing appended, nothing taken back
    assert text.partial("hello world how are you") == ""  # agrees with the last only on nothing
    assert text.shown == "hello"
    assert text.final("hello") is None
    assert text.final("hello world") == " world"
    assert text.final("jello world") is None and text.shown == "hello world"
