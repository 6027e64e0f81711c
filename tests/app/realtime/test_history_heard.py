"""History as heard: samples played → answer tokens heard → text.

The rule alone (``tokens_heard``), then each edge case through a session with a scripted engine
(one word = one Thinker token = one codec frame of audio) and a virtual speaker.
"""

from __future__ import annotations

import asyncio

import pytest

from app.realtime.history import SPEAKING_TOKENS_PER_SECOND, tokens_heard
from app.realtime.session_config import SessionConfig
from media.rates import VOICE_RATE
from pipeline.conversation import AssistantText, UserText
from tests.fakes import CODEC_FRAME_SAMPLES, EnergyVad, ScriptedEngine, SessionHarness

FRAME = CODEC_FRAME_SAMPLES
WORDS = "one two three four five six seven eight nine ten"


def test_a_complete_answer_is_heard_in_proportion_to_its_audio_played():
    # 40 tokens spoken over 12 s: the Talker was fed them in 3.2 s, it speaks them in 12.
    samples = 12 * VOICE_RATE
    assert tokens_heard(0, audio_samples=samples, tokens=40, complete=True) == 0
    assert tokens_heard(3 * VOICE_RATE, audio_samples=samples, tokens=40, complete=True) == 10
    assert tokens_heard(samples * 2 // 5, audio_samples=samples, tokens=40, complete=True) == 16
    assert tokens_heard(samples - 1, audio_samples=samples, tokens=40, complete=True) == 39
    assert tokens_heard(samples, audio_samples=samples, tokens=40, complete=True) == 40


def test_a_token_counts_once_all_of_its_share_of_the_audio_has_played():
    assert tokens_heard(2 * FRAME - 1, audio_samples=10 * FRAME, tokens=5, complete=True) == 0
    assert tokens_heard(2 * FRAME, audio_samples=10 * FRAME, tokens=5, complete=True) == 1


def test_an_answer_cut_while_generating_is_heard_at_a_speaking_pace_within_its_text():
    # 3 s played of an answer whose total is unknown: 3.5 tokens a second, at most what was released.
    assert SPEAKING_TOKENS_PER_SECOND == 3.5
    assert tokens_heard(3 * VOICE_RATE, audio_samples=4 * VOICE_RATE, tokens=40, complete=False) == 10
    assert tokens_heard(3 * VOICE_RATE, audio_samples=4 * VOICE_RATE, tokens=6, complete=False) == 6
    assert tokens_heard(VOICE_RATE // 4, audio_samples=4 * VOICE_RATE, tokens=40, complete=False) == 0


def test_nothing_played_or_no_text_is_nothing_heard():
    assert tokens_heard(0, audio_samples=FRAME, tokens=3, complete=False) == 0
    assert tokens_heard(FRAME, audio_samples=FRAME, tokens=0, complete=True) == 0


# -- through a session --------------------------------------------------------------------------


async def session(engine: ScriptedEngine, config: SessionConfig | None = None) -> SessionHarness:
    harness = SessionHarness(engine, EnergyVad(), config)
    await harness.session.start()
    return harness


async def ask(h: SessionHarness, text: str = "hi") -> None:
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await h.send(type="response.create")


def answer_in_prompt(h: SessionHarness, request: int) -> list[str]:
    return [item.text for item in h.engine.requests[request].conversation.items if isinstance(item, AssistantText)]


async def test_text_finished_before_audio_keeps_the_words_spoken_in_the_audio_heard():
    # The Thinker's whole answer is out before the first audio; the decoder keeps pace with
    # playback. Cut while generating, the answer's total audio is unknown: 320 ms heard at
    # 3.5 tokens a second is one word.
    h = await session(ScriptedEngine(WORDS, text_first=True, frames_per_chunk=4))
    h.engine.hold = asyncio.Event()  # after the first chunk: the decoder has not caught up yet
    await ask(h)
    await h.until("response.output_audio_transcript.delta", 10)
    h.output.play(4 * FRAME)  # everything decoded so far has played: played == written
    await h.send(type="output_audio_buffer.clear")

    truncated = h.last("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 320
    done = h.last("response.done")["response"]
    assert done["status"] == "cancelled"
    assert done["output"][0]["content"][0]["transcript"] == "one "
    assert h.last("response.output_audio_transcript.done")["transcript"] == WORDS  # what was generated
    h.engine.hold = None
    await ask(h, "again")
    await h.turn_done(2)
    assert answer_in_prompt(h, 1) == ["one "]
    await h.session.close()


async def test_response_cancel_while_audio_plays_keeps_the_audio_that_plays_out():
    h = await session(ScriptedEngine(WORDS, text_first=True, frames_per_chunk=9))
    h.engine.hold = asyncio.Event()
    await ask(h)
    await h.until("response.output_audio_transcript.delta", 10)
    await h.send(type="response.cancel")  # 9 frames were written; they still play
    assert "conversation.item.truncated" not in h.types()
    h.output.play()
    truncated = h.last("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 720  # 2.5 tokens at a speaking pace: two words
    assert h.types().index("conversation.item.truncated") < h.types().index("output_audio_buffer.stopped")
    h.engine.hold = None
    await ask(h, "again")
    await h.turn_done(2)
    assert answer_in_prompt(h, 1) == ["one two "]
    await h.session.close()


async def test_audio_still_playing_when_the_next_turn_starts_counts_as_it_will_be_heard():
    h = await session(ScriptedEngine("one two three four"))
    await ask(h)
    await h.until("response.done")  # completed; none of its audio has played yet
    await ask(h, "next")
    await h.until("response.done", 2)
    # The next answer's audio is queued behind it: the listener hears all of it first.
    assert answer_in_prompt(h, 1) == ["one two three four"]

    cancelled = await session(ScriptedEngine(WORDS, text_first=True, frames_per_chunk=6))
    cancelled.engine.hold = asyncio.Event()
    await ask(cancelled)
    await cancelled.until("response.output_audio_transcript.delta", 10)
    await cancelled.send(type="response.cancel")
    cancelled.engine.hold = None
    await ask(cancelled, "next")  # its 6 frames (480 ms: 1.7 tokens at a speaking pace) are still queued
    await cancelled.until("response.done", 2)
    assert answer_in_prompt(cancelled, 1) == ["one "]
    await h.session.close()
    await cancelled.session.close()


async def test_a_text_only_response_is_heard_whole_and_never_truncated():
    h = await session(ScriptedEngine(WORDS), SessionConfig(output_modality="text"))
    await ask(h)
    await h.until("response.done")
    await ask(h, "next")
    await h.until("response.done", 2)
    assert answer_in_prompt(h, 1) == [WORDS]
    assert "conversation.item.truncated" not in h.types()
    await h.session.close()


async def test_an_answer_cut_by_max_output_tokens_plays_out_whole():
    h = await session(ScriptedEngine("one two three four"), SessionConfig(max_output_tokens=3))
    await ask(h)
    await h.turn_done()
    assert h.last("response.done")["response"]["status"] == "incomplete"
    await ask(h, "next")
    await h.until("response.done", 2)
    assert answer_in_prompt(h, 1) == ["one two three "]
    assert "conversation.item.truncated" not in h.types()
    await h.session.close()


@pytest.mark.parametrize(("audio_end_ms", "heard"), [(0, []), (79, []), (80, ["one "]), (200, ["one two "])])
async def test_client_truncate_keeps_the_words_of_the_frames_before_audio_end_ms(audio_end_ms, heard):
    h = await session(ScriptedEngine("one two three four"))
    await ask(h)
    done = (await h.turn_done())["response"]
    await h.send(type="conversation.item.truncate", item_id=done["output"][0]["id"], content_index=0,
                 audio_end_ms=audio_end_ms)
    truncated = h.last("conversation.item.truncated")
    assert truncated["audio_end_ms"] == audio_end_ms
    await ask(h, "next")
    await h.until("response.done", 2)
    assert answer_in_prompt(h, 1) == heard
    items = h.engine.requests[1].conversation.items
    assert items[0] == UserText("hi")
    await h.session.close()
