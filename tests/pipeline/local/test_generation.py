"""stream_generation: the same Thinker tokens, codec frames and waveform as generate(), only sooner."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration
from transformers.modeling_flash_attention_utils import _pad_input, _unpad_input, _upad_input
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from pipeline.contract import AudioChunk, GenerationDone, TextDelta
from pipeline.conversation import AssistantText, Conversation, UserAudio, UserImage, UserText
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.decoder import DecoderStack
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import PromptRenderer
from pipeline.local.stages import ThinkerGeneration
from tests.pictures import encoded

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SAMPLES_PER_FRAME = 1920
IM_END, END_OF_TEXT = 151645, 151643
# Streamed audio vs. one Code2Wav decode of the same frames: chunks decoded from carried state
# are exact up to float32 rounding of samples near full scale (the dev model speaks at -20 dBFS).
WAVEFORM_ATOL = 1e-5


pytestmark = [pytest.mark.dev_model, pytest.mark.usefixtures("one_thread")]


def load_model(model_dir: Path) -> Qwen3OmniMoeForConditionalGeneration:
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def model(dev_model_dir):
    return load_model(dev_model_dir)


@pytest.fixture(scope="module")
def inputs(dev_model_dir):
    """A two-turn conversation whose current turn is spoken audio."""
    pcm, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
    conversation = Conversation(items=(UserText("hi there"), AssistantText("hello!"), UserAudio(pcm)))
    return PromptRenderer.from_pretrained(dev_model_dir).render(conversation)


@pytest.fixture(scope="module")
def typed_inputs(dev_model_dir):
    """A conversation without audio: the Talker's positions take the plain (not multimodal) path."""
    conversation = Conversation(items=(UserText("hi there"), AssistantText("hello!"), UserText("how are you?")))
    return PromptRenderer.from_pretrained(dev_model_dir).render(conversation)


@pytest.fixture(scope="module")
def image_inputs(dev_model_dir):
    """Two images and a typed question: the Talker's positions place the images on the 3-D grid."""
    images = tuple(UserImage(encoded(320, 240, seed=seed), 320, 240, 200_704) for seed in (1, 2))
    conversation = Conversation(items=(*images, UserText("what changed?")))
    return PromptRenderer.from_pretrained(dev_model_dir).render(conversation)


@pytest.fixture(scope="module")
def seen_and_heard_inputs(dev_model_dir):
    """A camera frame before spoken audio, after one exchange."""
    pcm, _ = sf.read(FIXTURES / "weather.wav", dtype="float32")
    frame = UserImage(encoded(512, 384, seed=3), 512, 384, 200_704)
    conversation = Conversation(items=(UserText("hello"), AssistantText("hi!"), frame, UserAudio(pcm)))
    return PromptRenderer.from_pretrained(dev_model_dir).render(conversation)


def never() -> bool:
    return False


def run(model, tokenizer, inputs, should_stop=never, **params):
    return list(stream_generation(model, tokenizer, inputs, GenerationParams(**params), should_stop))


def greedy(**params):
    return {"temperature": 0, "talker_do_sample": False, **params}


def pcm_of(events) -> np.ndarray:
    return np.concatenate([event.pcm for event in events if isinstance(event, AudioChunk)])


class Recorder:
    """Records, through hooks, what reaches the Thinker's and the Talker's first decoder layer
    (input embeddings: the prompt, then one entry per step: the answer token fed back, or the
    codec frame plus text) and Code2Wav (codes)."""

    def __init__(self, model) -> None:
        self.thinker_inputs: list[torch.Tensor] = []
        self.talker_inputs: list[torch.Tensor] = []
        self.code_calls: list[torch.Tensor] = []
        self._code_offset = model.code2wav.code_offset
        self._handles = [
            model.thinker.model.language_model.layers[0].register_forward_pre_hook(self._on_thinker),
            model.talker.model.layers[0].register_forward_pre_hook(self._on_talker),
            model.code2wav.code_embedding.register_forward_pre_hook(self._on_code2wav),
        ]

    def _on_thinker(self, module, args):
        self.thinker_inputs.append(args[0].clone())

    def _on_talker(self, module, args):
        self.talker_inputs.append(args[0].clone())

    def _on_code2wav(self, module, args):
        # Code2Wav embeds codes + each codebook's offset, whole or chunk by chunk.
        self.code_calls.append(args[0] - self._code_offset)

    def streamed_codes(self) -> torch.Tensor:
        """The frames of every Code2Wav call (whole decode or chunks), in order."""
        return torch.cat(self.code_calls, dim=-1)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def reference(model, inputs, *, max_tokens: int, frames: int, eos_ids: list[int], min_tokens: int = 0):
    """generate() with both stages greedy: (answer ids, recorder, codes [1, 16, F], waveform)."""
    audio = {}
    if inputs.input_features is not None:  # generate() cannot take None for these
        audio = {"input_features": inputs.input_features, "feature_attention_mask": inputs.feature_attention_mask}
    if inputs.pixel_values is not None:
        audio |= {"pixel_values": inputs.pixel_values, "image_grid_thw": inputs.image_grid_thw}
    recorder = Recorder(model)
    try:
        sequences, waveform = model.generate(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            **audio,
            thinker_max_new_tokens=max_tokens,
            thinker_min_new_tokens=min_tokens,
            thinker_do_sample=False,
            thinker_repetition_penalty=model.generation_config.repetition_penalty,
            thinker_eos_token_id=eos_ids,
            talker_do_sample=False,
            # force_output_tokens=N holds codec EOS for the Talker's first N - 1 codes.
            talker_min_new_tokens=max(min_tokens - 1, 0),
            talker_max_new_tokens=frames + 1,  # the last sampled code never becomes a frame
        )
    finally:
        recorder.close()
    (codes,) = recorder.code_calls  # under 300 frames generate() decodes once
    answer = sequences[0, inputs.input_ids.shape[1] :].tolist()
    return answer, recorder, codes, waveform.reshape(-1).numpy()


def streamed(model, tokenizer, inputs, **params):
    recorder = Recorder(model)
    try:
        events = run(model, tokenizer, inputs, **params)
    finally:
        recorder.close()
    return events, recorder, recorder.streamed_codes()


def assert_same_computation(events, recorder: Recorder, codes, reference_run, *, max_audio_frames: int) -> None:
    """The same Thinker tokens, Talker input embeddings step by step, codec frames and waveform."""
    answer, reference_recorder, reference_codes, reference_wave = reference_run
    # The prompt, then each answer token fed back.
    assert len(recorder.thinker_inputs) == len(reference_recorder.thinker_inputs)
    for step, (fed, expected) in enumerate(zip(recorder.thinker_inputs, reference_recorder.thinker_inputs)):
        assert torch.equal(fed, expected), f"thinker step {step}"
    # At the frame limit generate() runs one more Talker forward, whose code it drops.
    extra = 1 if codes.shape[-1] == max_audio_frames else 0
    assert len(reference_recorder.talker_inputs) == len(recorder.talker_inputs) + extra
    for step, (fed, expected) in enumerate(zip(recorder.talker_inputs, reference_recorder.talker_inputs)):
        assert fed.shape == expected.shape, step
        torch.testing.assert_close(fed, expected, rtol=0, atol=1e-6, msg=f"talker step {step}")
    assert torch.equal(codes, reference_codes)
    wave = pcm_of(events)
    assert wave.shape == reference_wave.shape
    np.testing.assert_allclose(wave, reference_wave, rtol=0, atol=WAVEFORM_ATOL)


def lend_the_talker_the_audio_window(model, monkeypatch) -> None:
    """Lets transformers 5.25's generate() run a prompt with images and audio: its Talker's
    ``get_rope_index`` (the Thinker's rule) reads the audio encoder's window from the Talker's
    config, which has none, and raises. Qwen's release (4.57.1) wrote the window into the rule
    (100 features, the real ``n_window`` 50 doubled): the Talker is lent the Thinker's audio config."""
    monkeypatch.setattr(model.talker.config, "audio_config", model.config.thinker_config.audio_config, raising=False)


@pytest.fixture
def talker_reads_the_audio_window(model, monkeypatch):
    lend_the_talker_the_audio_window(model, monkeypatch)


@pytest.mark.usefixtures("talker_reads_the_audio_window")
@pytest.mark.parametrize("turn", ["inputs", "typed_inputs", "image_inputs", "seen_and_heard_inputs"])
def test_greedy_stream_computes_what_generate_computes(model, tokenizer, turn, request):
    inputs = request.getfixturevalue(turn)
    reference_run = reference(model, inputs, min_tokens=12, max_tokens=12, frames=40, eos_ids=[IM_END, END_OF_TEXT])
    events, recorder, codes = streamed(
        model, tokenizer, inputs, **greedy(force_output_tokens=12, max_output_tokens=12, max_audio_frames=40)
    )
    done = events[-1]
    assert len(reference_run[0]) == 12 and done.finish_reason == "length"
    assert done.text == tokenizer.decode(reference_run[0], skip_special_tokens=True)
    assert codes.shape[-1] >= 11  # the whole text spoken
    assert_same_computation(events, recorder, codes, reference_run, max_audio_frames=40)


class TalkerPrefillPositions:
    """Records the positions each Talker prefill (a forward over more than one position) is given."""

    def __init__(self, model) -> None:
        self.prefills: list[torch.Tensor] = []
        self._handle = model.talker.register_forward_pre_hook(self._on_talker, with_kwargs=True)

    def _on_talker(self, module, args, kwargs):
        if kwargs["inputs_embeds"].shape[1] > 1:
            self.prefills.append(kwargs["position_ids"].clone())

    def close(self) -> None:
        self._handle.remove()


# The assistant preamble of the Talker's prompt (transformers 4.57.1 ``_get_talker_assistant_parts``):
# <|im_start|> assistant \n, four <tts_pad>, <tts_bos>, the first answer token; its ids are <tts_pad>.
ASSISTANT_PREAMBLE = 9


def qwen_talker_ids(model, inputs) -> torch.Tensor:
    """The Talker's ids as Qwen's release builds them (transformers 4.57.1 ``generate()``): every
    user segment's ids (system segments and past answers left out), then <tts_pad> over the
    assistant preamble."""
    config = model.config
    ids = inputs.input_ids[0].tolist()
    starts = [i for i, token in enumerate(ids) if token == config.im_start_token_id] + [len(ids)]
    user_ids = [
        token
        for start, end in zip(starts, starts[1:])
        if ids[start + 1] == config.user_token_id
        for token in ids[start:end]
    ]
    return torch.tensor([user_ids + [config.tts_pad_token_id] * ASSISTANT_PREAMBLE])


def test_the_talker_places_a_camera_frame_beside_speech_on_its_grid(model, tokenizer, seen_and_heard_inputs):
    # One exchange, a 512x384 frame (a 12 x 16 grid of merged patches), then speech: Qwen's rule is
    # the Thinker's get_rope_index on the Talker's ids with the image grid and the clip's length.
    inputs = seen_and_heard_inputs
    recorder = TalkerPrefillPositions(model)
    try:
        run(model, tokenizer, inputs, **greedy(force_output_tokens=2, max_output_tokens=2, max_audio_frames=1))
    finally:
        recorder.close()
    (positions,) = recorder.prefills
    talker_ids = qwen_talker_ids(model, inputs)
    assert positions.shape == (4, 1, talker_ids.shape[1])
    expected, _ = model.thinker.get_rope_index(
        talker_ids,
        image_grid_thw=inputs.image_grid_thw,
        attention_mask=torch.ones_like(talker_ids),
        audio_seqlens=inputs.feature_attention_mask.sum(dim=1),
    )
    assert torch.equal(positions[1:], expected)
    assert torch.equal(positions[0, 0], torch.arange(talker_ids.shape[1], dtype=positions.dtype))
    # Read directly: the frame's tokens span 12 rows of 16 on one time step, and whatever comes
    # after the frame goes on from its largest position + 1, so the prompt's last position is
    # its length less the 192 image tokens plus the 16 the grid spans, less one.
    image = (talker_ids[0] == model.config.thinker_config.image_token_id).nonzero().flatten()
    assert len(image) == 192 == inputs.image_tokens
    t, h, w = (positions[row, 0, image] - positions[row, 0, image[0]] for row in (1, 2, 3))
    assert torch.equal(t, torch.zeros(192))
    assert torch.equal(h, torch.arange(12).repeat_interleave(16).float())
    assert torch.equal(w, torch.arange(16).repeat(12).float())
    last = talker_ids.shape[1] - 192 + 16 - 1
    assert positions[1:, 0, -1].tolist() == [last] * 3


def test_greedy_stream_matches_generate_when_the_thinker_stops_by_itself(dev_model_dir, tokenizer, inputs):
    model = load_model(dev_model_dir)
    stop_ids = [IM_END, END_OF_TEXT]
    plain = reference(model, inputs, max_tokens=12, frames=1, eos_ids=stop_ids)[0]
    if plain[-1] not in stop_ids:
        # The answer does not end within 12 tokens: make its 6th token a stop token.
        position = next(i for i in range(5, 12) if plain[i] not in plain[:i])
        stop_ids.append(plain[position])
        model.generation_config.eos_token_id = stop_ids
        plain = plain[: position + 1]
    reference_run = reference(model, inputs, max_tokens=12, frames=30, eos_ids=stop_ids)
    events, recorder, codes = streamed(model, tokenizer, inputs, **greedy(max_output_tokens=12, max_audio_frames=30))
    done = events[-1]
    assert reference_run[0] == plain
    assert done.finish_reason == "stop"
    assert done.usage.output_text_tokens == len(plain) - 1  # the stop token is not counted
    assert done.text == tokenizer.decode(plain[:-1], skip_special_tokens=True)
    assert_same_computation(events, recorder, codes, reference_run, max_audio_frames=30)


@pytest.fixture(scope="module")
def long_turn(model, tokenizer, inputs):
    """A greedy turn of 80 text tokens and at most 80 frames: four chunks or more."""
    events, _, codes = streamed(
        model, tokenizer, inputs, **greedy(force_output_tokens=80, max_output_tokens=80, max_audio_frames=80)
    )
    return events, codes


def test_audio_chunks_concatenate_to_one_decode_of_all_frames(model, long_turn):
    events, codes = long_turn
    assert events[-1].usage.output_audio_tokens == codes.shape[-1] >= 79
    with torch.inference_mode():
        whole = model.code2wav(codes)[0, 0].numpy()
    wave = pcm_of(events)
    assert wave.shape == whole.shape
    np.testing.assert_allclose(wave, whole, rtol=0, atol=WAVEFORM_ATOL)


def test_first_chunk_holds_four_frames_then_chunks_hold_twenty_five(model, tokenizer, inputs):
    events, _, codes = streamed(
        model,
        tokenizer,
        inputs,
        **greedy(force_output_tokens=80, max_output_tokens=80, max_audio_frames=80, adaptive_chunks=False),
    )
    sizes = [len(event.pcm) for event in events if isinstance(event, AudioChunk)]
    with torch.inference_mode():
        first = model.code2wav(codes[..., :4])[0, 0]
    # Each chunk holds only final samples: the first lacks the few that need frame 5.
    assert sizes[0] == len(first) < 4 * SAMPLES_PER_FRAME
    frames = codes.shape[-1]
    assert len(sizes) == 1 + math.ceil((frames - 4) / 25) >= 4
    assert sizes[1:-1] == [25 * SAMPLES_PER_FRAME] * (len(sizes) - 2)
    assert 0 < sizes[-1] <= 25 * SAMPLES_PER_FRAME


def test_first_audio_arrives_while_the_thinker_is_still_writing(model, tokenizer, inputs):
    events = run(model, tokenizer, inputs, force_output_tokens=24, max_output_tokens=24, max_audio_frames=8, seed=3)
    first_audio = next(i for i, event in enumerate(events) if isinstance(event, AudioChunk))
    deltas_before = sum(isinstance(event, TextDelta) for event in events[:first_audio])
    deltas_after = sum(isinstance(event, TextDelta) for event in events[first_audio:])
    # Lockstep: the 4th frame needs answer token 5; 19 more tokens are still to come.
    assert 1 <= deltas_before <= 5
    assert deltas_after >= 10
    assert events[-1].usage.output_text_tokens == 24


def test_force_output_tokens_keeps_the_talker_speaking_until_the_text_is_used(model, tokenizer, inputs):
    events = run(model, tokenizer, inputs, force_output_tokens=20, max_output_tokens=20, max_audio_frames=30, seed=1)
    done = events[-1]
    assert done.usage.output_text_tokens == 20
    # The text fills Talker steps 0..18; codec EOS is held until then.
    assert done.usage.output_audio_tokens >= 19


def test_text_only_turn_never_runs_the_talker(model, tokenizer, inputs):
    calls = []
    handle = model.talker.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        events = run(model, tokenizer, inputs, output_audio=False, force_output_tokens=6, max_output_tokens=6, seed=0)
    finally:
        handle.remove()
    assert not [event for event in events if isinstance(event, AudioChunk)]
    assert events[-1].usage.output_audio_tokens == 0
    assert events[-1].usage.output_text_tokens == 6
    assert calls == []


def test_deltas_concatenate_to_the_text_and_usage_counts_the_turn(model, tokenizer, inputs):
    events = run(model, tokenizer, inputs, force_output_tokens=10, max_output_tokens=10, max_audio_frames=12, seed=5)
    done = events[-1]
    assert isinstance(done, GenerationDone) and sum(isinstance(event, GenerationDone) for event in events) == 1
    assert "".join(event.text for event in events if isinstance(event, TextDelta)) == done.text
    # Every answer token is released in exactly one delta (held-back UTF-8 pieces included).
    assert sum(event.tokens for event in events if isinstance(event, TextDelta)) == done.usage.output_text_tokens
    assert "<|im_end|>" not in done.text
    assert done.usage.input_text_tokens == inputs.text_tokens
    assert done.usage.input_audio_tokens == inputs.audio_tokens
    assert done.usage.output_text_tokens == 10
    assert done.usage.output_audio_tokens * SAMPLES_PER_FRAME >= len(pcm_of(events)) > 0


def test_max_output_tokens_of_one_gives_text_without_audio(model, tokenizer, inputs):
    events = run(model, tokenizer, inputs, max_output_tokens=1, seed=0)
    assert not [event for event in events if isinstance(event, AudioChunk)]
    assert events[-1].finish_reason == "length"
    assert events[-1].usage.output_text_tokens == 1


def test_seed_makes_a_sampled_turn_reproducible(model, tokenizer, inputs):
    first = run(model, tokenizer, inputs, temperature=0.9, max_output_tokens=8, max_audio_frames=10, seed=7)
    again = run(model, tokenizer, inputs, temperature=0.9, max_output_tokens=8, max_audio_frames=10, seed=7)
    other = run(model, tokenizer, inputs, temperature=0.9, max_output_tokens=8, max_audio_frames=10, seed=8)
    assert first[-1].text == again[-1].text != other[-1].text
    np.testing.assert_array_equal(pcm_of(first), pcm_of(again))


def test_greedy_turn_is_reproducible_without_a_seed(model, tokenizer, inputs):
    first = run(model, tokenizer, inputs, temperature=0, max_output_tokens=6, max_audio_frames=8)
    torch.manual_seed(12345)  # whatever state the process is in
    again = run(model, tokenizer, inputs, temperature=0, max_output_tokens=6, max_audio_frames=8)
    assert first[-1].text == again[-1].text
    np.testing.assert_array_equal(pcm_of(first), pcm_of(again))


def test_should_stop_is_polled_every_decoding_step(model, tokenizer, inputs):
    polls = []
    events = run(
        model, tokenizer, inputs, lambda: polls.append(1) or False, max_output_tokens=8, max_audio_frames=12, seed=2
    )
    usage = events[-1].usage
    assert len(polls) >= 1 + usage.output_text_tokens + usage.output_audio_tokens


def test_cancel_while_the_thinker_writes_ends_the_turn_at_once(model, tokenizer, inputs):
    stop = False
    turn = stream_generation(model, tokenizer, inputs, GenerationParams(max_output_tokens=50, seed=0), lambda: stop)
    seen = []
    for event in turn:
        seen.append(event)
        if isinstance(event, TextDelta):
            stop = True
    done = seen[-1]
    assert done.finish_reason == "cancelled"
    assert done.usage.output_text_tokens == 1
    assert not [event for event in seen if isinstance(event, AudioChunk)]


def test_cancel_while_speaking_ends_the_turn_at_once(model, tokenizer, inputs):
    stop = False
    turn = stream_generation(
        model,
        tokenizer,
        inputs,
        GenerationParams(force_output_tokens=40, max_output_tokens=40, max_audio_frames=200, seed=0),
        lambda: stop,
    )
    seen = []
    for event in turn:
        seen.append(event)
        if isinstance(event, AudioChunk):
            stop = True
    chunks = [event for event in seen if isinstance(event, AudioChunk)]
    assert len(chunks) == 1 and isinstance(seen[-1], GenerationDone)
    assert seen[-1].finish_reason == "cancelled"
    assert seen[-1].usage.output_audio_tokens == 4  # no Talker step after the first chunk


@pytest.mark.parametrize(
    "bad",
    [
        {"voice": "bob"},
        {"max_output_tokens": 0},
        {"force_output_tokens": 0},
        {"first_chunk_frames": 0},
        {"chunk_frames": 0},
        {"max_audio_frames": 0},
    ],
)
def test_bad_generation_params_are_refused(bad):
    with pytest.raises(ValueError):
        GenerationParams(**bad)


class FrameClock:
    """A clock that reads ``seconds_per_frame`` per Talker step taken so far: the engine's speed
    as the adaptive chunk schedule sees it, without depending on the machine."""

    def __init__(self, model, seconds_per_frame: float) -> None:
        self.steps = 0
        self.seconds_per_frame = seconds_per_frame
        self._handle = model.talker.model.layers[0].register_forward_pre_hook(self._on_step)

    def _on_step(self, module, args):
        self.steps += 1

    def __call__(self) -> float:
        return self.steps * self.seconds_per_frame

    def close(self) -> None:
        self._handle.remove()


def adaptive_turn(model, tokenizer, inputs, seconds_per_frame: float, **settings):
    clock = FrameClock(model, seconds_per_frame)
    recorder = Recorder(model)
    params = GenerationParams(**greedy(force_output_tokens=80, max_output_tokens=80, max_audio_frames=120, **settings))
    try:
        events = list(stream_generation(model, tokenizer, inputs, params, never, clock=clock))
    finally:
        clock.close()
        recorder.close()
    return events, recorder.streamed_codes()


def chunk_frames(events) -> list[int]:
    return [event.frames for event in events if isinstance(event, AudioChunk)]


@pytest.mark.parametrize("max_chunk_frames", [25, 100])
def test_adaptive_chunks_grow_while_the_audio_runs_ahead_and_still_equal_one_decode(
    model, tokenizer, inputs, max_chunk_frames
):
    # Four times faster than real time (20 ms per 80 ms frame): the buffer ahead of the
    # listener grows, and so do the chunks, up to max_chunk_frames (here: 4, 5, 10, 20, 25, 15
    # frames with 25; 4, 5, 10, 20, 40 with the default 100).
    events, codes = adaptive_turn(model, tokenizer, inputs, seconds_per_frame=0.02, max_chunk_frames=max_chunk_frames)
    sizes = chunk_frames(events)
    assert sizes[0] == 4
    assert sizes[1:-1] == sorted(sizes[1:-1]) and sizes[1] < 25
    assert max(sizes) == 25 if max_chunk_frames == 25 else 25 < max(sizes) <= max_chunk_frames
    assert sum(sizes) == codes.shape[-1] == events[-1].usage.output_audio_tokens
    with torch.inference_mode():
        whole = model.code2wav(codes)[0, 0].numpy()
    wave = pcm_of(events)
    assert wave.shape == whole.shape
    np.testing.assert_allclose(wave, whole, rtol=0, atol=WAVEFORM_ATOL)


def test_adaptive_chunks_stay_small_when_the_engine_is_slower_than_real_time(model, tokenizer, inputs):
    # 200 ms per 80 ms frame: the listener is never ahead; every chunk is as small as the first.
    events, codes = adaptive_turn(model, tokenizer, inputs, seconds_per_frame=0.2)
    sizes = chunk_frames(events)
    assert all(size == 4 for size in sizes[:-1]) and 1 <= sizes[-1] <= 4
    with torch.inference_mode():
        whole = model.code2wav(codes)[0, 0].numpy()
    np.testing.assert_allclose(pcm_of(events), whole, rtol=0, atol=WAVEFORM_ATOL)


@pytest.mark.parametrize("talker_stops_by_itself", [False, True])
def test_audio_chunks_count_their_frames(model, tokenizer, inputs, talker_stops_by_itself):
    if talker_stops_by_itself:
        # The Talker ends its speech with codec EOS after the text (greedy: the dev model does).
        params = greedy(max_output_tokens=10, max_audio_frames=60)
    else:
        params = greedy(force_output_tokens=12, max_output_tokens=12, max_audio_frames=60)
    events = run(model, tokenizer, inputs, **params)
    chunks = [event for event in events if isinstance(event, AudioChunk)]
    assert sum(chunk.frames for chunk in chunks) == events[-1].usage.output_audio_tokens
    assert all(chunk.frames > 0 for chunk in chunks)


def test_talker_frames_per_token_holds_codec_eos_until_the_audio_is_that_long(model, tokenizer, inputs):
    events = run(model, tokenizer, inputs, force_output_tokens=8, max_output_tokens=8, talker_frames_per_token=3, seed=2)
    # 8 tokens at 3 frames each; the dev Talker may stop at any frame after that (~10 on average).
    assert events[-1].usage.output_audio_tokens >= 24


@pytest.fixture(scope="module")
def history_inputs(dev_model_dir):
    """A longer conversation: three past exchanges, then spoken audio."""
    pcm, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
    items = (
        UserText("hi there"),
        AssistantText("hello! how can I help you today?"),
        UserText("what is the weather like in Paris in spring?"),
        AssistantText("mild, often rainy, lovely in April."),
        UserText("and in winter?"),
        AssistantText("cold and grey."),
        UserAudio(pcm),
    )
    return PromptRenderer.from_pretrained(dev_model_dir).render(Conversation(items=items))


def drive(model, tokenizer, plan, *, cancel_at=None):
    """Run turns through one DecodeBatch: ``plan`` maps a key to (join step, inputs, params);
    ``cancel_at`` maps a key to the step before which it is cancelled. Returns each key's
    events and the batch's largest cache size and its cache size at the end."""
    cancel_at = cancel_at or {}
    batch = DecodeBatch(model, tokenizer)
    events = {key: [] for key in plan}
    rows_seen = []
    step = 0
    while step <= max(join for join, _, _ in plan.values()) or batch.keys:
        # Turns that join at the same step are prefilled together, as the engine does.
        joining = [(key, inputs, GenerationParams(**params)) for key, (join, inputs, params) in plan.items() if join == step]
        if joining:
            for key, event in batch.prefill_thinkers(joining):
                events[key].append(event)
            speaking = [key for key, _, _ in joining if batch.wants_talker(key)]
            if speaking:
                batch.prefill_talkers(speaking)
        for key, when in cancel_at.items():
            if when == step and key in batch.keys:
                events[key].append(batch.cancel(key))
        rows_seen.append((len(batch.thinker_rows), len(batch.talker_rows)))
        step_batch(batch, events)
        step += 1
    return events, rows_seen, batch


def step_batch(batch: DecodeBatch, events: dict) -> None:
    """One decoding step of the whole batch, as the engine takes it; each key's events into ``events``."""
    for key, event in batch.step_thinker():
        events[key].append(event)
    batch.step_talker()
    if batch.chunks_due():
        for key, event in batch.decode_chunks():
            events[key].append(event)
    for key in batch.finished_keys():
        events[key].append(batch.finish(key))


def assert_same_turn(batched, alone, *, atol):
    assert [type(event) for event in batched] == [type(event) for event in alone]
    assert batched[-1] == alone[-1]  # text, usage, finish reason
    for got, expected in zip(batched, alone):
        if isinstance(expected, TextDelta):
            assert got == expected
        elif isinstance(expected, AudioChunk):
            assert got.frames == expected.frames
            np.testing.assert_allclose(got.pcm, expected.pcm, rtol=0, atol=atol)


# Batched Code2Wav and batched matrix products round differently from one row's.
BATCH_WAVEFORM_ATOL = 1e-5


def test_turns_decoded_together_equal_each_turn_alone(model, tokenizer, inputs, typed_inputs, history_inputs):
    fixed = {"adaptive_chunks": False}
    plan = {
        "spoken": (0, inputs, greedy(force_output_tokens=20, max_output_tokens=20, max_audio_frames=40, **fixed)),
        "typed": (3, typed_inputs, greedy(force_output_tokens=12, max_output_tokens=12, max_audio_frames=30, **fixed)),
        "history": (
            7,
            history_inputs,
            greedy(force_output_tokens=30, max_output_tokens=30, max_audio_frames=36, **fixed),
        ),
        "text only": (5, typed_inputs, greedy(force_output_tokens=9, max_output_tokens=9, output_audio=False)),
    }
    events, rows_seen, batch = drive(model, tokenizer, plan)
    assert max(thinker for thinker, _ in rows_seen) == 4 and max(talker for _, talker in rows_seen) == 3
    for key, (_, turn_inputs, params) in plan.items():
        alone = run(model, tokenizer, turn_inputs, **params)
        assert_same_turn(events[key], alone, atol=BATCH_WAVEFORM_ATOL)
    assert batch.keys == [] and batch.cache_bytes() == 0


@pytest.fixture(scope="module")
def weather_inputs(dev_model_dir):
    """Spoken audio of another length than hello.wav, after one exchange."""
    pcm, _ = sf.read(FIXTURES / "weather.wav", dtype="float32")
    conversation = Conversation(items=(UserText("hello"), AssistantText("hi!"), UserAudio(pcm)))
    return PromptRenderer.from_pretrained(dev_model_dir).render(conversation)


def test_turns_prefilled_together_equal_each_turn_alone(
    model, tokenizer, inputs, typed_inputs, history_inputs, weather_inputs
):
    # Four prompts of different lengths (two clips of different lengths, one without audio)
    # prefilled in one Thinker and one Talker forward, then two more joining together later.
    lengths = {turn.input_ids.shape[1] for turn in (inputs, typed_inputs, history_inputs, weather_inputs)}
    assert len(lengths) == 4
    fixed = {"adaptive_chunks": False}
    plan = {
        "spoken": (0, inputs, greedy(force_output_tokens=14, max_output_tokens=14, max_audio_frames=30, **fixed)),
        "typed": (0, typed_inputs, greedy(force_output_tokens=10, max_output_tokens=10, max_audio_frames=24, **fixed)),
        "history": (0, history_inputs, greedy(force_output_tokens=16, max_output_tokens=16, max_audio_frames=30, **fixed)),
        "weather": (0, weather_inputs, greedy(force_output_tokens=12, max_output_tokens=12, max_audio_frames=30, **fixed)),
        "later weather": (4, weather_inputs, greedy(force_output_tokens=8, max_output_tokens=8, max_audio_frames=20, **fixed)),
        "later text": (4, history_inputs, greedy(force_output_tokens=6, max_output_tokens=6, output_audio=False)),
    }
    events, rows_seen, batch = drive(model, tokenizer, plan)
    assert rows_seen[0] == (4, 4) and max(thinker for thinker, _ in rows_seen) == 6
    for key, (_, turn_inputs, params) in plan.items():
        assert_same_turn(events[key], run(model, tokenizer, turn_inputs, **params), atol=BATCH_WAVEFORM_ATOL)
    assert batch.keys == [] and batch.cache_bytes() == 0


def test_sampled_turns_in_a_batch_draw_what_they_draw_alone(model, tokenizer, inputs, history_inputs):
    sampled = {"temperature": 0.9, "max_output_tokens": 10, "max_audio_frames": 16, "adaptive_chunks": False}
    plan = {
        "a": (0, inputs, {**sampled, "seed": 11}),
        "b": (2, history_inputs, {**sampled, "seed": 12}),
        "c": (2, inputs, {**sampled, "seed": 13}),
    }
    events, _, _ = drive(model, tokenizer, plan)
    for key, (_, turn_inputs, params) in plan.items():
        assert_same_turn(events[key], run(model, tokenizer, turn_inputs, **params), atol=BATCH_WAVEFORM_ATOL)


def test_a_cancelled_turn_leaves_the_batch_at_the_next_step_and_frees_its_rows(model, tokenizer, inputs, typed_inputs):
    fixed = {"adaptive_chunks": False}
    plan = {
        "stays": (0, inputs, greedy(force_output_tokens=16, max_output_tokens=16, max_audio_frames=24, **fixed)),
        "cancelled": (
            0,
            typed_inputs,
            greedy(force_output_tokens=40, max_output_tokens=40, max_audio_frames=60, **fixed),
        ),
    }
    events, rows_seen, _ = drive(model, tokenizer, plan, cancel_at={"cancelled": 6})
    assert rows_seen[5] == (2, 2) and rows_seen[6] == (1, 1)
    done = events["cancelled"][-1]
    assert done.finish_reason == "cancelled" and done.usage.output_text_tokens == 7  # prefill, steps 0-5
    assert_same_turn(events["stays"], run(model, tokenizer, inputs, **plan["stays"][2]), atol=BATCH_WAVEFORM_ATOL)


def test_a_batch_releases_cache_memory_as_turns_leave(model, tokenizer, inputs, history_inputs):
    batch = DecodeBatch(model, tokenizer)
    short = GenerationParams(**greedy(force_output_tokens=4, max_output_tokens=4, max_audio_frames=6))
    long = GenerationParams(**greedy(force_output_tokens=30, max_output_tokens=30, max_audio_frames=40))
    for key, turn_inputs, params in (("long", inputs, long), ("short", history_inputs, short)):
        batch.prefill_thinker(key, turn_inputs, params)
        batch.prefill_talker(key)
    both = batch.cache_bytes()
    while "short" not in batch.finished_keys():
        batch.step_thinker()
        batch.step_talker()
        if batch.chunks_due():
            batch.decode_chunks()
    batch.finish("short")
    # The longer history's rows and the padding the other row needed for it are gone.
    assert batch.cache_bytes() < both / 2
    batch.cancel("long")
    assert batch.cache_bytes() == 0


def test_padded_rows_are_masked_with_eager_attention_too(dev_model_dir, tokenizer, inputs, history_inputs):
    # Rows of different prompt lengths are left-padded; eager attention adds the mask to its
    # scores (sdpa takes it either way), so the padding must be masked additively.
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir, attn_implementation="eager").eval()
    fixed = {"adaptive_chunks": False}
    plan = {
        "short": (0, inputs, greedy(force_output_tokens=10, max_output_tokens=10, max_audio_frames=16, **fixed)),
        "long": (2, history_inputs, greedy(force_output_tokens=10, max_output_tokens=10, max_audio_frames=16, **fixed)),
    }
    assert inputs.input_ids.shape[1] != history_inputs.input_ids.shape[1]
    events, _, _ = drive(model, tokenizer, plan)
    for key, (_, turn_inputs, params) in plan.items():
        assert_same_turn(events[key], run(model, tokenizer, turn_inputs, **params), atol=BATCH_WAVEFORM_ATOL)


def test_usage_counts_the_image_tokens_apart_from_text_and_audio(model, tokenizer, seen_and_heard_inputs):
    done = run(model, tokenizer, seen_and_heard_inputs, **greedy(max_output_tokens=3, output_audio=False))[-1]
    assert done.usage.input_image_tokens == seen_and_heard_inputs.image_tokens == 192
    assert done.usage.input_audio_tokens == seen_and_heard_inputs.audio_tokens > 0
    assert done.usage.input_tokens == seen_and_heard_inputs.input_ids.shape[1]


def test_image_turns_prefilled_with_others_equal_each_turn_alone(
    model, tokenizer, inputs, image_inputs, seen_and_heard_inputs
):
    # Rows with images, audio, both: every row's patches reach its own <|image_pad|> positions.
    fixed = {"adaptive_chunks": False}
    plan = {
        "spoken": (0, inputs, greedy(force_output_tokens=8, max_output_tokens=8, max_audio_frames=16, **fixed)),
        "images": (0, image_inputs, greedy(force_output_tokens=8, max_output_tokens=8, max_audio_frames=16, **fixed)),
        "both": (0, seen_and_heard_inputs, greedy(force_output_tokens=8, max_output_tokens=8, max_audio_frames=16, **fixed)),
    }
    events, rows_seen, _ = drive(model, tokenizer, plan)
    assert rows_seen[0] == (3, 3)
    for key, (_, turn_inputs, params) in plan.items():
        assert_same_turn(events[key], run(model, tokenizer, turn_inputs, **params), atol=BATCH_WAVEFORM_ATOL)


# Thinker logits, stream vs generate() and batched vs alone: float32 rounding of batched and
# differently shaped matrix products moves them by ~1e-6 on the dev model. Decode positions
# shifted by one move them by up to 1.7e-2 (measured on the hello.wav turn) while every greedy
# token of a 16-token answer stays the same, so tokens alone cannot catch a position bug; 1e-4
# does (test_the_logit_checks_catch_decode_positions_shifted_by_one).
LOGITS_ATOL = 1e-4


class ThinkerLogits:
    """Each turn's Thinker logits as its sampling sees them ([1, vocab] per token, prefill first),
    recorded from ``ThinkerGeneration.scores``: per turn whatever rows the batch gives it."""

    def __init__(self, monkeypatch) -> None:
        self.by_turn: dict[int, list[torch.Tensor]] = {}
        original = ThinkerGeneration.scores
        recorder = self

        def scores(turn, logits):
            recorder.by_turn.setdefault(id(turn), []).append(logits.detach().float().clone())
            return original(turn, logits)

        monkeypatch.setattr(ThinkerGeneration, "scores", scores)

    def turns(self) -> list[list[torch.Tensor]]:
        """Every turn's logits, turns in the order they were first scored."""
        return list(self.by_turn.values())


def generate_thinker_logits(model, inputs, tokens: int) -> list[torch.Tensor]:
    """generate()'s Thinker logits at each of ``tokens`` greedy steps (text only)."""
    logits: list[torch.Tensor] = []
    handle = model.thinker.lm_head.register_forward_hook(
        lambda module, args, output: logits.append(output[:, -1].detach().float().clone())
    )
    try:
        model.generate(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            **(
                {}
                if inputs.input_features is None
                else {"input_features": inputs.input_features, "feature_attention_mask": inputs.feature_attention_mask}
            ),
            return_audio=False,
            thinker_max_new_tokens=tokens,
            thinker_min_new_tokens=tokens,
            thinker_do_sample=False,
            thinker_repetition_penalty=model.generation_config.repetition_penalty,
        )
    finally:
        handle.remove()
    return logits


def assert_same_logits(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for step, (mine, theirs) in enumerate(zip(got, expected)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=LOGITS_ATOL, msg=f"thinker step {step}")


class ShiftedThinkerPositions:
    """Adds ``shift`` to the Thinker's decoding positions (the bug the logit checks must catch)."""

    def __init__(self, monkeypatch, model, shift: int) -> None:
        thinker_layer = model.thinker.model.language_model.layers[0]
        original = DecoderStack.__call__

        def call(stack, hidden, cache, *, positions=None, position_embeddings=None):
            if positions is not None and stack.layers[0] is thinker_layer:
                positions = positions + shift
            return original(stack, hidden, cache, positions=positions, position_embeddings=position_embeddings)

        monkeypatch.setattr(DecoderStack, "__call__", call)


def stream_thinker_logits(model, tokenizer, inputs, tokens: int, monkeypatch) -> list[torch.Tensor]:
    recorded = ThinkerLogits(monkeypatch)
    run(model, tokenizer, inputs, **greedy(force_output_tokens=tokens, max_output_tokens=tokens, output_audio=False))
    (logits,) = recorded.turns()
    return logits


@pytest.mark.parametrize("turn", ["inputs", "typed_inputs"])
def test_greedy_stream_gives_the_thinker_logits_generate_gives(model, tokenizer, turn, request, monkeypatch):
    turn_inputs = request.getfixturevalue(turn)
    expected = generate_thinker_logits(model, turn_inputs, 16)
    assert_same_logits(stream_thinker_logits(model, tokenizer, turn_inputs, 16, monkeypatch), expected)


def test_turns_decoded_together_give_the_thinker_logits_they_give_alone(
    model, tokenizer, inputs, typed_inputs, history_inputs, monkeypatch
):
    # Three prompts of different lengths joining at different steps: left padding, joins and
    # a leaving row all move the rows around each other.
    text = {"output_audio": False}
    plan = {
        "spoken": (0, inputs, greedy(force_output_tokens=16, max_output_tokens=16, **text)),
        "typed": (2, typed_inputs, greedy(force_output_tokens=6, max_output_tokens=6, **text)),
        "history": (3, history_inputs, greedy(force_output_tokens=14, max_output_tokens=14, **text)),
    }
    recorded = ThinkerLogits(monkeypatch)
    drive(model, tokenizer, plan)
    batched = recorded.turns()
    for (_, turn_inputs, params), together in zip(plan.values(), batched):
        recorded.by_turn.clear()
        run(model, tokenizer, turn_inputs, **params)
        (alone,) = recorded.turns()
        assert_same_logits(together, alone)


def test_the_logit_checks_catch_decode_positions_shifted_by_one(model, tokenizer, inputs, monkeypatch):
    expected = generate_thinker_logits(model, inputs, 16)
    ShiftedThinkerPositions(monkeypatch, model, shift=1)
    shifted = stream_thinker_logits(model, tokenizer, inputs, 16, monkeypatch)
    with pytest.raises(AssertionError, match="thinker step 1"):
        assert_same_logits(shifted, expected)


def flash_attention_on_a_cpu(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """What transformers' flash-attention path computes, with plain torch for the kernel: any
    mask goes through transformers' own ``_upad_input`` (as ``_flash_attention_forward`` does),
    then each sequence attends causally, bottom-right aligned (flash-attn >= 2.1)."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [batch, length, heads, dim], as flash takes them
    batch, q_len = q.shape[:2]
    if attention_mask is None:
        sequences = [(q[row], k[row], v[row]) for row in range(batch)]
    else:
        q, k, v, indices_q, (cu_q, cu_k), _ = _upad_input(q, k, v, attention_mask, q_len, _unpad_input)
        sequences = [
            (q[cu_q[row] : cu_q[row + 1]], k[cu_k[row] : cu_k[row + 1]], v[cu_k[row] : cu_k[row + 1]])
            for row in range(batch)
        ]
    outputs = []
    for queries, keys, values in sequences:
        groups = queries.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        causal = torch.arange(len(keys))[None, :] <= torch.arange(len(queries))[:, None] + len(keys) - len(queries)
        out = torch.nn.functional.scaled_dot_product_attention(
            queries.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=causal, scale=scaling
        )
        outputs.append(out.transpose(0, 1))
    if attention_mask is None:
        return torch.stack(outputs), None
    return _pad_input(torch.cat(outputs), indices_q, batch, q_len), None


def test_padded_rows_decode_with_flash_attentions_inputs_too(dev_model_dir, tokenizer, inputs, typed_inputs, monkeypatch):
    # flash-attn does not run on a CPU; the stand-in above receives exactly what transformers'
    # flash path would hand it, so the masks the batch builds for flash attention are what is tested.
    model = load_model(dev_model_dir)
    params = greedy(force_output_tokens=10, max_output_tokens=10, max_audio_frames=16, adaptive_chunks=False)
    with_sdpa = run(model, tokenizer, inputs, **params)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flash_attention_2", flash_attention_on_a_cpu)
    for stack in (model.thinker.model.language_model, model.talker.model, model.talker.code_predictor.model):
        monkeypatch.setattr(stack.config, "_attn_implementation", "flash_attention_2")
    assert inputs.input_ids.shape[1] - typed_inputs.input_ids.shape[1] >= 8
    plan = {"spoken": (0, inputs, params), "typed": (0, typed_inputs, params)}
    events, _, _ = drive(model, tokenizer, plan)
    for key, (_, turn_inputs, _) in plan.items():
        assert_same_turn(events[key], run(model, tokenizer, turn_inputs, **params), atol=BATCH_WAVEFORM_ATOL)
    assert_same_turn(events["spoken"], with_sdpa, atol=BATCH_WAVEFORM_ATOL)  # the stand-in is attention
