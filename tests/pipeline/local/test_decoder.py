"""TalkerDecoder: the code predictor's 15 residual codes as transformers' own generate() computes them."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerForConditionalGeneration

from pipeline.local.decoder import TalkerDecoder
from pipeline.local.devmodel import dev_model_config
from pipeline.local.sampling import Sampler

pytestmark = [pytest.mark.dev_model, pytest.mark.usefixtures("one_thread")]

ROWS = 8


@pytest.fixture(scope="module")
def talker():
    """The dev model's Talker at the real depths: its code predictor has the real 5 layers. With
    one layer a bidirectional two-position prefill cannot show (the last position attends to
    both either way, and the cache holds only the layer's inputs)."""
    config = dev_model_config("real").talker_config
    assert config.code_predictor_config.num_hidden_layers == 5
    torch.manual_seed(0)
    return Qwen3OmniMoeTalkerForConditionalGeneration(config).eval()


def frame_inputs(talker) -> tuple[torch.Tensor, torch.Tensor]:
    """What a Talker step hands the code predictor for ROWS frames: the Talker's last hidden state
    (normed: unit scale) and the embedding of the frame's first-layer code."""
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(ROWS, 1, talker.config.text_config.hidden_size, generator=generator)
    codes = torch.randint(0, 2048, (ROWS, 1), generator=generator)
    with torch.inference_mode():
        return hidden, talker.get_input_embeddings()(codes)


class PredictorScores:
    """Records what the code predictor's 15 heads score, [rows, vocab] per call (the last position's)."""

    def __init__(self, talker) -> None:
        self.calls: list[torch.Tensor] = []
        self._handles = [head.register_forward_hook(self._on_head) for head in talker.code_predictor.lm_head]

    def _on_head(self, module, args, output):
        self.calls.append((output if output.dim() == 2 else output[:, -1]).detach().float().clone())

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def greedy_residual_codes(talker, hidden: torch.Tensor, code_embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TalkerDecoder's residual codes [ROWS, 15] and their scores [15, ROWS, vocab], all rows at once."""
    samplers = [Sampler(LogitsProcessorList(), do_sample=False, generator=None) for _ in range(ROWS)]
    scores = PredictorScores(talker)
    try:
        with torch.inference_mode():
            codes = TalkerDecoder(talker).residual_codes(samplers, hidden, code_embed).codes
    finally:
        scores.close()
    return codes, torch.stack(scores.calls)


def generate_residual_codes(talker, hidden: torch.Tensor, code_embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The call the Talker's forward makes inside generate() (greedy), one row at a time as
    there: codes [ROWS, 15] and scores [15, ROWS, vocab]."""
    predictor = talker.code_predictor
    rows = []
    scores = PredictorScores(talker)
    try:
        with torch.inference_mode():
            for row in range(ROWS):
                result = predictor.generate(
                    inputs_embeds=torch.cat((hidden[row : row + 1], code_embed[row : row + 1]), dim=1),
                    max_new_tokens=talker.config.num_code_groups - 1,
                    do_sample=False,
                    return_dict_in_generate=True,
                )
                rows.append(result.sequences)
    finally:
        scores.close()
    by_row = torch.cat(scores.calls).reshape(ROWS, talker.config.num_code_groups - 1, -1)
    return torch.cat(rows), by_row.transpose(0, 1)


# Float rounding of one row against eight moves the scores by ~2e-7; a bidirectional prefill at
# five layers moved them by 5e-3 (greedy codes stayed the same on these rows: the random
# predictor's scores are far apart, and a turn's feedback through the Talker is what makes
# codes diverge).
SCORES_ATOL = 1e-5


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_residual_codes_at_the_real_predictor_depth_are_generates(talker, attention, monkeypatch):
    monkeypatch.setattr(talker.code_predictor.model.config, "_attn_implementation", attention)
    hidden, code_embed = frame_inputs(talker)
    expected_codes, expected_scores = generate_residual_codes(talker, hidden, code_embed)
    codes, scores = greedy_residual_codes(talker, hidden, code_embed)
    assert expected_codes.shape == (ROWS, 15) and scores.shape == expected_scores.shape
    for group, (mine, theirs) in enumerate(zip(scores, expected_scores), start=1):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=SCORES_ATOL, msg=f"residual code {group}")
    assert torch.equal(codes, expected_codes)
