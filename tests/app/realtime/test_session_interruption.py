"""Speech over the playing answer: paused at once, interrupting only when it proves to be a turn.

A scripted engine, the energy VAD (a tone is speech) and the virtual speaker, which plays only
when told and nothing while paused, like the real track.
"""

from __future__ import annotations

import asyncio

import numpy as np
import soxr

from app.realtime.session_config import SessionConfig, TurnDetection
from media.rates import VOICE_RATE
from pipeline.conversation import AssistantText, UserAudio
from tests.fakes import CODEC_FRAME_SAMPLES, EnergyVad, ScriptedEngine, SessionHarness
from tests.speech import RATE, silence, tone

REPLY = "one two three four five six seven eight"
WORDS = len(REPLY.split())
BARGE_IN = SessionConfig(turn_detection=TurnDetection(interrupt_response=True))


class Harness(SessionHarness):
    def __init__(self, config: SessionConfig = BARGE_IN) -> None:
        super().__init__(ScriptedEngine(REPLY, waveform="tone"), EnergyVad(), config)
        self.outcomes_seen = self.interruptions  # the metrics' hook

    async def answering(self) -> None:
        """One spoken turn, its answer generated whole and two of its words heard."""
        self.push(tone(600))
        self.push(silence(700))
        await self.until("response.done")
        self.output.play(2 * CODEC_FRAME_SAMPLES)


async def test_a_backchannel_over_the_answer_leaves_it_whole_and_is_not_a_turn():
    async with Harness() as h:
        await h.answering()
        h.push(tone(400))  # "mm-hmm"
        assert h.output.paused  # the answer paused at its first window
        h.push(silence(300))
        assert not h.output.paused  # quiet: it plays on
        h.push(silence(500))  # the detector ends the utterance
        h.output.play()
        h.push(silence(900))  # past the echo tail
        h.push(tone(600))
        h.push(silence(700))
        await h.turn_done(2)

        assert h.types().count("input_audio_buffer.speech_started") == 2  # the two real turns only
        assert [e["response"]["status"] for e in h.of_type("response.done")] == ["completed", "completed"]
        assert h.of_type("output_audio_buffer.cleared") == []
        items = h.engine.requests[1].conversation.items
        assert [type(item) for item in items] == [UserAudio, AssistantText, UserAudio]
        assert items[1] == AssistantText(REPLY)  # heard whole; nothing of the backchannel kept
        assert h.outcomes_seen == ["resumed", "backchannel"]


async def test_a_false_interruption_resumes_the_answer_where_it_paused():
    async with Harness() as h:
        await h.answering()
        heard_before = h.output.played_samples
        h.push(tone(100))  # a knock: too short to be speech, long enough to pause
        assert h.output.paused
        assert h.output.play(CODEC_FRAME_SAMPLES) == 0  # paused: nothing goes out
        h.push(silence(300))
        assert not h.output.paused
        h.output.play()

        played = np.concatenate(h.output.played)
        assert h.output.played_samples == heard_before + (WORDS - 2) * CODEC_FRAME_SAMPLES
        assert np.array_equal(played, np.tile(h.engine.frame(), WORDS))  # every sample, once, in order
        assert h.outcomes_seen == ["resumed"]
        assert h.last("response.done")["response"]["status"] == "completed"


async def test_a_real_interruption_cancels_and_truncates_to_what_played_before_the_pause():
    async with Harness() as h:
        await h.answering()
        h.push(tone(1000))  # a sentence over the answer
        h.output.play(CODEC_FRAME_SAMPLES)  # the speaker got nothing more once paused
        h.push(silence(700))
        await h.until("response.done", 2)

        started = h.of_type("input_audio_buffer.speech_started")[1]
        assert started["audio_start_ms"] < 1400  # the onset, not the moment it was confirmed
        assert h.of_type("response.done")[0]["response"]["status"] == "completed"
        assert h.last("conversation.item.truncated")["audio_end_ms"] == 2 * CODEC_FRAME_SAMPLES * 1000 // VOICE_RATE
        assert h.engine.requests[1].conversation.items[1] == AssistantText("one two ")
        assert h.outcomes_seen == []


async def test_speech_over_an_answer_with_nothing_to_hear_interrupts_at_once():
    text_only = SessionConfig(turn_detection=TurnDetection(interrupt_response=True), output_modality="text")
    async with Harness(text_only) as h:
        h.engine.hold = asyncio.Event()  # a long answer being generated
        h.push(tone(600))
        h.push(silence(700))
        await h.until("response.output_text.delta")
        h.push(tone(300))  # a short word: with nothing playing, no backchannel to be polite about
        await h.until("response.done")

        assert h.last("response.done")["response"]["status"] == "cancelled"
        assert h.types().count("input_audio_buffer.speech_started") == 2
        h.engine.hold = None


async def test_the_answers_echo_pauses_it_but_never_cuts_it():
    """A speakerphone: what the speaker plays comes back 150 ms later at -12 dB."""
    async with Harness() as h:
        h.push(tone(600))
        h.push(silence(700))
        await h.until("response.done")
        echo = np.zeros(150 * RATE // 1000, np.float32)  # the acoustic path's delay
        step = 20 * VOICE_RATE // 1000
        for _ in range(400):  # 8 s of the call, 20 ms at a time
            before = len(h.output.played)
            h.output.play(step)
            sent = np.concatenate([*h.output.played[before:], np.zeros(0, np.float32)])
            sent = np.concatenate([sent, np.zeros(step - sent.size, np.float32)])
            echo = np.concatenate([echo, 0.25 * soxr.resample(sent, VOICE_RATE, RATE).astype(np.float32)])
            h.push(echo[:320])
            echo = echo[320:]
            if h.output.queued_samples == 0 and not h.output.paused:
                break

        assert h.output.queued_samples == 0  # played to its end
        assert h.types().count("input_audio_buffer.speech_started") == 1
        assert h.of_type("output_audio_buffer.cleared") == []
        assert "resumed" in h.outcomes_seen  # it did pause for its echo
        assert h.output.played_samples == WORDS * CODEC_FRAME_SAMPLES


async def test_barge_in_turned_off_while_the_answer_is_paused_lets_it_play_on():
    async with Harness() as h:
        await h.answering()
        h.push(tone(200))  # speech over the answer: paused, being judged
        assert h.output.paused
        await h.send(type="session.update", session={"audio": {"input": {"turn_detection": {
            "type": "server_vad", "interrupt_response": False}}}})
        h.push(silence(20))

        assert not h.output.paused
        h.output.play()
        assert h.output.played_samples == WORDS * CODEC_FRAME_SAMPLES
