"""RealtimeSession end to end with the dev model: real VAD, real TransformersEngine, virtual speaker.

Each dev-model turn costs ~1-2 s of CPU, so this module keeps to a few turns on one engine.
"""

from __future__ import annotations

import pytest

from app.realtime.session import ECHO_TAIL_MS
from app.realtime.session_config import SessionConfig
from media.vad import SileroVad
from pipeline.conversation import AssistantText, UserAudio
from pipeline.engine import TransformersEngine
from tests.fakes import SessionHarness
from tests.speech import load_fixture, silence

# The engine lives on the session loop, so every test here runs on it too.
pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_AUDIO_FRAMES = 20  # a random Talker rarely says codec EOS: 20 frames (1.6 s) bound a turn's audio
TURN_GUARD_S = 300  # against hangs only: a CPU turn takes ~1-2 s, more when the machine is busy


class RecordingEngine:
    """Passes turns through to the real engine and keeps the requests."""

    def __init__(self, engine: TransformersEngine) -> None:
        self._engine = engine
        self.name = engine.name
        self.requests = []

    def run_turn(self, request):
        self.requests.append(request)
        return self._engine.run_turn(request)


@pytest.fixture(scope="module")
async def engine(dev_model_dir):
    engine = TransformersEngine(
        dev_model_dir, device="cpu", seed=0, threads=1, generation={"max_audio_frames": MAX_AUDIO_FRAMES}
    )
    await engine.start()
    yield engine
    await engine.close()


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad.load()


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
    assert h.last("response.done")["latency"]["engine_first_audio_ms"] > 0
    items = recording.requests[1].conversation.items
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
