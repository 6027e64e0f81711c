"""One Qwen3-Omni turn as a stream: text as the Thinker writes it, audio long before it has finished.

``stream_generation`` interleaves the computations ``generate()`` runs one stage after another
(Thinker prefill, Talker prefill, lockstep decoding, Code2Wav in chunks) and computes the same
thing: with greedy decoding the same tokens and codec frames. Turns decode together in a
``DecodeBatch``. The stages and why: docs/MODEL.md, "Streaming a turn"; what is exact: "What is
exact, and what is approximate".
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
