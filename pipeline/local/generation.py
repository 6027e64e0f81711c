"""One Qwen3-Omni turn as a stream: text as the Thinker writes it, audio long before it has finished.

``Qwen3OmniMoeForConditionalGeneration.generate()`` runs its three stages one after the other:
the Thinker writes the whole answer, then the Talker turns it into codec frames, then Code2Wav
decodes every frame at once. The first sound therefore comes after the whole turn's compute.
``stream_generation`` interleaves the same computations:

1. Thinker prefill (prompt and audio features), which samples the first answer token.
2. Talker prefill, as soon as that token exists. The Talker's prompt is what ``generate()``
   builds: the user segments (text embeddings, and Thinker hidden states at
   ``accept_hidden_layer`` for audio), then the assistant preamble with the speaker and the
   first answer token.
3. Lockstep decoding: each Thinker step samples answer token ``k + 1``; the Talker's step ``j``
   adds the projected embedding of answer token ``j + 1`` (its "trailing text") to the codec
   frame it feeds back, so step ``j`` runs as soon as token ``j + 1`` exists and never ahead of
   it. Like ``generate()``, the answer's last token (``<|im_end|>``, or the token at which
   ``max_output_tokens`` cut it) is replaced by ``<tts_eos>``, and once the text is used up the
   Talker continues on ``<tts_pad>`` until it samples codec EOS (or reaches ``max_audio_frames``).
4. After ``first_chunk_frames`` frames, then whenever a chunk is due (its size adapts to how
   far the audio is ahead of the listener, see ``AudioChunker``), Code2Wav decodes the new
   frames from the state the turn's previous chunks left and the audio is yielded at once.

Positions, caches, processors and the code predictor mirror ``generate()``, so with greedy
decoding in both stages the stream produces the same tokens and codec frames as
``generate()``: streaming changes when things happen, not what is computed. Sampled turns draw
from the same distributions with each turn's own generator (other random numbers than
``generate()``'s). Decoding steps call the decoder layers directly (``DecoderStack``) with
left-padded caches (``KVCache``) so that any number of turns decode together
(``DecodeBatch``); a turn alone is a batch of one.

Code2Wav is causal layer by layer (``pipeline/local/code2wav.py``): each chunk is decoded from the
state the turn's previous chunks left (the sliding-window attention's keys and values, each
convolution's input history) and yields exactly the samples its frames make final, so the chunks
concatenate to one decode of all frames (docs/MODEL.md "What is exact").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from pipeline.contract import GenerationEvent
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import ThinkerInputs


def stream_generation(
    model,
    tokenizer,
    inputs: ThinkerInputs,
    params: GenerationParams,
    should_stop: Callable[[], bool],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[GenerationEvent]:
    """Run one turn, yielding TextDelta and AudioChunk as they are produced, then one GenerationDone.

    ``should_stop`` is polled before every Thinker step, Talker step and Code2Wav chunk; when
    it returns true the turn ends at once with ``finish_reason="cancelled"``.

    Usage counts the answer's text tokens without the closing ``<|im_end|>`` and the codec
    frames produced. ``finish_reason`` describes the text: "stop" when the Thinker ended it,
    "length" when ``max_output_tokens`` did. ``clock`` times the adaptive chunk schedule.

    The turn runs as a ``DecodeBatch`` of one: alone or batched, a turn takes the same path.
    """
    batch: DecodeBatch[str] = DecodeBatch(model, tokenizer, clock=clock)
    if should_stop():
        yield batch.cancelled_before_start(inputs)
        return
    yield from _events(batch.prefill_thinker(_ALONE, inputs, params))
    if batch.wants_talker(_ALONE):
        if should_stop():
            yield batch.cancel(_ALONE)
            return
        batch.prefill_talker(_ALONE)
    while not batch.decoded(_ALONE):
        if batch.thinker_rows:
            if should_stop():
                yield batch.cancel(_ALONE)
                return
            yield from _events(batch.step_thinker())
        if batch.talker_rows:
            if should_stop():
                yield batch.cancel(_ALONE)
                return
            batch.step_talker()
        if batch.chunks_due():
            if should_stop():
                yield batch.cancel(_ALONE)
                return
            yield from _events(batch.decode_chunks())
    yield batch.finish(_ALONE)


_ALONE = "turn"


def _events(keyed: list[tuple[str, GenerationEvent]]) -> Iterator[GenerationEvent]:
    return (event for _, event in keyed)
