"""The Thinker's probability that ``<|im_end|>`` comes next after a prompt, which semantic VAD's
text judge asks for (task "end_of_turn"): one forward for a prompt that fits a prefill chunk,
a chunk at a time (``ChunkedMessageEndProbability``) for a longer one, so that the turns
decoding meanwhile take their steps between its chunks and a cancel is seen between them."""

from __future__ import annotations

import torch

from pipeline.local.chunked_prefill import PREFILL_CHUNK_POSITIONS, ChunkedPrefill
from pipeline.local.prompt import ThinkerInputs
from pipeline.local.thinker_prompt import ThinkerPrompt


def message_end_probability(model, inputs: ThinkerInputs, end_id: int) -> float:
    """The probability that ``end_id`` comes next after ``inputs``: one forward pass without a
    cache, the LM head on the last position only."""
    thinker = model.thinker
    with torch.inference_mode():
        prompt = ThinkerPrompt.of(thinker, inputs)
        output = thinker.model(input_ids=prompt.input_ids, attention_mask=prompt.attention_mask,
                               position_ids=prompt.position_ids, use_cache=False, output_router_logits=False,
                               use_audio_in_video=False)
    return _probability(thinker, output.last_hidden_state[:, -1:], end_id)


class ChunkedMessageEndProbability:
    """``message_end_probability`` a chunk of ``chunk`` positions at a time: ``advance()`` until
    done, then ``probability()``. Causal attention over the growing cache gives the last
    position the whole forward's output, up to float rounding."""

    def __init__(self, model, inputs: ThinkerInputs, end_id: int, *, chunk: int = PREFILL_CHUNK_POSITIONS) -> None:
        self._thinker = model.thinker
        self._end_id = end_id
        with torch.inference_mode():
            prompt = ThinkerPrompt.of(self._thinker, inputs)
        self._chunks = ChunkedPrefill(self._thinker, prompt, keep_hidden=False, chunk=chunk)

    def advance(self) -> bool:
        """The next chunk; True once the whole prompt is in."""
        return self._chunks.advance()

    def probability(self) -> float:
        return _probability(self._thinker, self._chunks.output().last_hidden, self._end_id)


def _probability(thinker, last_hidden: torch.Tensor, end_id: int) -> float:
    """[1, 1, hidden] last position's output -> the probability of ``end_id`` next."""
    with torch.inference_mode():
        logits = thinker.lm_head(last_hidden)[0, -1].float()
        return float(torch.softmax(logits, dim=-1)[end_id])
