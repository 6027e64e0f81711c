"""The equivalence checks of test_generation.py on the dev model at the real depths (Thinker 48
layers of 128 experts, 8 per token; Talker 20 layers of 128, 6 per token; code predictor 5 layers;
Code2Wav 8; tiny widths): what depends on depth or expert routing, which the tiny dev model cannot
show. docs/MODEL.md, "The dev model", says what these cost."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf
from transformers import Qwen3OmniMoeForConditionalGeneration

from pipeline.conversation import AssistantText, Conversation, UserAudio, UserImage, UserText
from pipeline.local.prompt import PromptRenderer, ThinkerInputs
from pipeline.local.tokenizer import load_tokenizer
from tests.pictures import encoded
from tests.pipeline.local.test_generation import (
    BATCH_WAVEFORM_ATOL,
    END_OF_TEXT,
    IM_END,
    assert_same_computation,
    assert_same_turn,
    drive,
    greedy,
    lend_the_talker_the_audio_window,
    reference,
    run,
    streamed,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

pytestmark = [pytest.mark.dev_model, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def model(real_depth_model_dir):
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(real_depth_model_dir).eval()


@pytest.fixture(scope="module")
def eager_model(real_depth_model_dir):
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        real_depth_model_dir, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def tokenizer(real_depth_model_dir):
    return load_tokenizer(real_depth_model_dir)


def render(model_dir: Path, *items) -> ThinkerInputs:
    return PromptRenderer.from_pretrained(model_dir).render(Conversation(items=items))


@pytest.fixture(scope="module")
def spoken_inputs(real_depth_model_dir):
    """One exchange, then spoken audio."""
    pcm, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
    return render(real_depth_model_dir, UserText("hi there"), AssistantText("hello!"), UserAudio(pcm))


@pytest.fixture(scope="module")
def seen_and_heard_inputs(real_depth_model_dir):
    """One exchange, a 512x384 camera frame, then spoken audio."""
    pcm, _ = sf.read(FIXTURES / "weather.wav", dtype="float32")
    frame = UserImage(encoded(512, 384, seed=3), 512, 384, 200_704)
    return render(real_depth_model_dir, UserText("hello"), AssistantText("hi!"), frame, UserAudio(pcm))


@pytest.fixture(scope="module")
def typed_inputs(real_depth_model_dir):
    return render(real_depth_model_dir, UserText("hi there"), AssistantText("hello!"), UserText("how are you?"))


@pytest.mark.parametrize("attention", ["model", "eager_model"])
@pytest.mark.parametrize("turn", ["spoken_inputs", "seen_and_heard_inputs"])
def test_greedy_stream_computes_what_generate_computes_at_the_real_depths(
    tokenizer, turn, attention, request, monkeypatch
):
    model = request.getfixturevalue(attention)
    inputs = request.getfixturevalue(turn)
    lend_the_talker_the_audio_window(model, monkeypatch)
    reference_run = reference(model, inputs, min_tokens=8, max_tokens=8, frames=24, eos_ids=[IM_END, END_OF_TEXT])
    events, recorder, codes = streamed(
        model, tokenizer, inputs, **greedy(force_output_tokens=8, max_output_tokens=8, max_audio_frames=24)
    )
    assert len(reference_run[0]) == 8 and events[-1].finish_reason == "length"
    assert codes.shape[-1] >= 7  # the whole text spoken
    assert_same_computation(events, recorder, codes, reference_run, max_audio_frames=24)


def test_turns_decoded_together_equal_each_turn_alone_at_the_real_depths(
    model, tokenizer, spoken_inputs, seen_and_heard_inputs, typed_inputs
):
    # Rows of different lengths, with audio, a frame and text only, two prefilled together and one
    # joining later: every row routes its own tokens among the 128 experts of 48 layers.
    fixed = {"adaptive_chunks": False}
    plan = {
        "spoken": (0, spoken_inputs, greedy(force_output_tokens=8, max_output_tokens=8, max_audio_frames=16, **fixed)),
        "both": (0, seen_and_heard_inputs, greedy(force_output_tokens=8, max_output_tokens=8, max_audio_frames=16, **fixed)),
        "typed": (3, typed_inputs, greedy(force_output_tokens=6, max_output_tokens=6, max_audio_frames=12, **fixed)),
    }
    events, rows_seen, batch = drive(model, tokenizer, plan)
    assert rows_seen[0] == (2, 2) and max(thinker for thinker, _ in rows_seen) == 3
    for key, (_, turn_inputs, params) in plan.items():
        assert_same_turn(events[key], run(model, tokenizer, turn_inputs, **params), atol=BATCH_WAVEFORM_ATOL)
    assert batch.keys == [] and batch.cache_bytes() == 0
