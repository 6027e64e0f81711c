"""History as heard: played samples → codec frames → voiced Thinker tokens → text.

The mapping alone (``VoicedAudio``), then each edge case through a session with a scripted
engine (one word = one Thinker token = one codec frame) and a virtual speaker.
"""

from __future__ import annotations

import asyncio

import pytest

from app.realtime.heard import CODEC_FRAME_SAMPLES, VoicedAudio
from app.realtime.session_config import SessionConfig
from pipeline.conversation import AssistantText, UserText
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness

FRAME = CODEC_FRAME_SAMPLES
WORDS = "one two three four five six seven eight nine ten"


def test_tokens_heard_are_those_of_the_frames_played():
    voiced = VoicedAudio()
    # A decoder's chunks: 4 frames first, then 6; the Thinker was ahead (all 10 tokens released).
    voiced.add(4 * FRAME, frames=4, text_tokens_voiced=4, tokens_released=10)
    voiced.add(6 * FRAME, frames=6, text_tokens_voiced=10, tokens_released=10)
    assert voiced.tokens_heard(0) == 0
    assert voiced.tokens_heard(FRAME - 1) == 0  # a frame counts once all of it has played
    assert voiced.tokens_heard(FRAME) == 1
    assert voiced.tokens_heard(4 * FRAME) == 4
    assert voiced.tokens_heard(7 * FRAME + FRAME // 2) == 7
    assert voiced.tokens_heard(10 * FRAME) == 10


def test_frames_past_the_text_voice_nothing_more():
    voiced = VoicedAudio()
    # 3 tokens, then the Talker goes on with <tts_pad> frames until its codec EOS.
    voiced.add(4 * FRAME, frames=4, text_tokens_voiced=3, tokens_released=3)
    voiced.add(4 * FRAME, frames=4, text_tokens_voiced=3, tokens_released=3)
    assert voiced.tokens_heard(2 * FRAME) == 2
    assert voiced.tokens_heard(6 * FRAME) == 3


def test_chunks_that_are_not_whole_frames_split_by_their_samples():
    voiced = VoicedAudio()
    # The first chunk lacks a tail that the next frame completes; the second starts with it.
    voiced.add(4 * FRAME - 700, frames=4, text_tokens_voiced=4, tokens_released=8)
    voiced.add(4 * FRAME + 700, frames=4, text_tokens_voiced=8, tokens_released=8)
    assert voiced.tokens_heard(4 * FRAME - 700) == 4
    assert voiced.tokens_heard(4 * FRAME - 701) == 3
    assert voiced.tokens_heard(8 * FRAME) == 8


def test_an_engine_that_counts_no_frames_gets_one_per_80_ms_of_the_tokens_released():
    voiced = VoicedAudio()
    voiced.add(3 * FRAME, frames=0, text_tokens_voiced=0, tokens_released=2)  # audio ahead of text
    voiced.add(3 * FRAME, frames=0, text_tokens_voiced=0, tokens_released=6)
    assert voiced.tokens_heard(3 * FRAME) == 2
    assert voiced.tokens_heard(5 * FRAME) == 4  # two more frames, two more tokens
    assert voiced.tokens_heard(6 * FRAME) == 6


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


async def test_text_finished_before_audio_keeps_the_words_of_the_frames_heard():
    # The Thinker's whole answer is out before the first audio; the decoder keeps pace with playback.
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
    assert done["output"][0]["content"][0]["transcript"] == "one two three four "
    assert h.last("response.output_audio_transcript.done")["transcript"] == WORDS  # what was generated
    h.engine.hold = None
    await ask(h, "again")
    await h.turn_done(2)
    assert answer_in_prompt(h, 1) == ["one two three four "]
    await h.session.close()


async def test_response_cancel_while_audio_plays_keeps_the_audio_that_plays_out():
    h = await session(ScriptedEngine(WORDS, text_first=True, frames_per_chunk=3))
    h.engine.hold = asyncio.Event()
    await ask(h)
    await h.until("response.output_audio_transcript.delta", 10)
    await h.send(type="response.cancel")  # 3 frames were written; they still play
    assert "conversation.item.truncated" not in h.types()
    h.output.play()
    truncated = h.last("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 240
    assert h.types().index("conversation.item.truncated") < h.types().index("output_audio_buffer.stopped")
    h.engine.hold = None
    await ask(h, "again")
    await h.turn_done(2)
    assert answer_in_prompt(h, 1) == ["one two three "]
    await h.session.close()


async def test_audio_still_playing_when_the_next_turn_starts_counts_as_it_will_be_heard():
    h = await session(ScriptedEngine("one two three four"))
    await ask(h)
    await h.until("response.done")  # completed; none of its audio has played yet
    await ask(h, "next")
    await h.until("response.done", 2)
    # The next answer's audio is queued behind it: the listener hears all of it first.
    assert answer_in_prompt(h, 1) == ["one two three four"]

    cancelled = await session(ScriptedEngine(WORDS, text_first=True, frames_per_chunk=2))
    cancelled.engine.hold = asyncio.Event()
    await ask(cancelled)
    await cancelled.until("response.output_audio_transcript.delta", 10)
    await cancelled.send(type="response.cancel")
    cancelled.engine.hold = None
    await ask(cancelled, "next")  # its 2 frames are still queued
    await cancelled.until("response.done", 2)
    assert answer_in_prompt(cancelled, 1) == ["one two "]
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
