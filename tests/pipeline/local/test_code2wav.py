"""Streaming Code2Wav with carried state equals one whole decode, at every chunk schedule the engine uses.

The model has the real ``code2wav_config``'s layout (8 transformer layers, sliding window 72,
upsampling [8, 5, 4, 3] x [2, 2], 16 codebooks of 2048) with random weights in float32; only its
widths are narrowed (hidden 32, decoder 16 channels), which changes nothing streaming carries
and makes a 300-frame decode cost ~0.3 s on one core instead of ~50 s.
``tests/bench/code2wav.py --config real`` checks the full widths.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from pipeline.local.code2wav import StreamingCode2Wav
from pipeline.local.qwen3_omni_config import code2wav_config
from tests.chunk_schedules import schedules_covering

pytestmark = [pytest.mark.dev_model, pytest.mark.usefixtures("one_thread")]

FRAMES = 300
FIRST_CHUNK = 4  # GenerationParams.first_chunk_frames
# Relative to the whole decode's peak: float32 rounding measures ~5e-7 (the attention sums the
# cache in another order than the whole sequence); a chunk seam computed without state is ~1.
MAX_RELATIVE_ERROR = 1e-4
NARROW = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "decoder_dim": 16}


@pytest.fixture(scope="module")
def code2wav():
    torch.manual_seed(0)
    return Qwen3OmniMoeCode2Wav(code2wav_config(**NARROW)).eval()


@pytest.fixture(scope="module")
def codes():
    return torch.randint(0, 2048, (1, 16, FRAMES), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def whole(code2wav, codes):
    with torch.inference_mode():
        return code2wav(codes)[0, 0]


def streamed(code2wav, codes, schedule: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return StreamingCode2Wav(code2wav).decode_in_chunks(codes, schedule)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape
    return ((got - expected).abs().max() / expected.abs().max()).item()


def test_the_model_has_the_real_layout(code2wav):
    config = code2wav.config
    assert (config.num_hidden_layers, config.sliding_window) == (8, 72)
    assert (config.upsample_rates, config.upsampling_ratios) == ([8, 5, 4, 3], [2, 2])
    assert (config.num_quantizers, config.codebook_size) == (16, 2048)
    assert code2wav.total_upsample == 1920


def test_every_chunk_size_from_1_to_100_after_a_first_chunk_of_4_equals_one_whole_decode(code2wav, codes, whole):
    runs = schedules_covering(range(1, 101), frames=FRAMES, first=FIRST_CHUNK)
    assert {size for run in runs for size in run[1:]} >= set(range(1, 101))
    errors = [relative_error(streamed(code2wav, codes, run), whole) for run in runs]
    assert max(errors) <= MAX_RELATIVE_ERROR, errors


@pytest.mark.parametrize(
    "schedule",
    [
        [FIRST_CHUNK, 67, 1, 72, 73, 71, 12],  # the cache exactly full (71), chunks of window +- 1
        [FIRST_CHUNK] + [1] * 40 + [256],  # one frame at a time: convolution history spans chunks
    ],
    ids=["window edges", "single frames"],
)
def test_schedules_around_the_window_and_the_convolution_histories_equal_one_whole_decode(
    code2wav, codes, whole, schedule
):
    assert sum(schedule) == FRAMES
    assert relative_error(streamed(code2wav, codes, schedule), whole) <= MAX_RELATIVE_ERROR


def test_a_chunk_decoded_without_carried_state_is_not_exact(code2wav, codes, whole):
    # The check is sharp: frames 100..300 decoded from a fresh state (no keys, values or
    # histories of frames 0..100) end where the whole decode ends, and differ from it.
    stream = StreamingCode2Wav(code2wav)
    with torch.inference_mode():
        rest, _ = stream.decode(codes[..., 100:], [stream.new_state()])
    assert relative_error(rest[0], whole[-rest.shape[-1] :]) > 100 * MAX_RELATIVE_ERROR


def test_turns_decoded_together_equal_each_turn_alone(code2wav, codes):
    # Two turns at different frames (both past the window) decode one chunk in one call.
    other = torch.randint(0, 2048, (1, 16, 150), generator=torch.Generator().manual_seed(2))
    stream = StreamingCode2Wav(code2wav)
    with torch.inference_mode():
        _, (a,) = stream.decode(codes[..., :120], [stream.new_state()])
        _, (b,) = stream.decode(other[..., :90], [stream.new_state()])
        assert a.batch_key() == b.batch_key()
        together, _ = stream.decode(torch.cat([codes[..., 120:130], other[..., 90:100]]), [a, b])
        alone_a, _ = stream.decode(codes[..., 120:130], [a])
        alone_b, _ = stream.decode(other[..., 90:100], [b])
    torch.testing.assert_close(together[0], alone_a[0], rtol=0, atol=1e-6 * alone_a.abs().max().item())
    torch.testing.assert_close(together[1], alone_b[0], rtol=0, atol=1e-6 * alone_b.abs().max().item())
