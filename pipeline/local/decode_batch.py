"""Turns decoded together, one Thinker, Talker and Code2Wav step at a time for all of them
(``pipeline.local.generation`` has the streaming and what is exact)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, NamedTuple

import numpy as np
import torch

from pipeline.contract import AudioChunk, GenerationDone, GenerationEvent, Usage
from pipeline.local.batch_rows import BatchGeneration, GenerationKey, GenerationSpeech, StageRows
from pipeline.local.chunked_prefill import PREFILL_CHUNK_POSITIONS, ChunkedPrefill, ChunkedTalkerPrefill, PrefillOutput
from pipeline.local.code2wav import StreamingCode2Wav
from pipeline.local.decoder import DecoderStack, TalkerDecoder
from pipeline.local.kv_cache import KVCache
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import ThinkerInputs
from pipeline.local.sampling import choose_rows
from pipeline.local.stages import TalkerGeneration
from pipeline.local.streaming import AudioChunker
from pipeline.local.talker_positions import talker_prompt_positions
from pipeline.local.thinker_prompt import ThinkerPrompt


class TtsEmbeddings(NamedTuple):
    """The Talker's text markers in its input space ([1, 1, hidden] each): ``bos`` opens the
    answer's text in the Talker's prompt (``pad`` fills the prompt beside the codec preamble),
    ``eos`` takes the place of the text's end, and ``pad`` feeds the Talker once it is used up."""

    bos: torch.Tensor
    eos: torch.Tensor
    pad: torch.Tensor


@dataclass
class PrefillInProgress(Generic[GenerationKey]):
    """A turn whose Thinker prefill runs a chunk at a time before it joins a ``DecodeBatch``."""

    turn: BatchGeneration[GenerationKey]
    chunks: ChunkedPrefill

    @property
    def key(self) -> GenerationKey:
        return self.turn.key

    def advance(self) -> bool:
        """The next chunk; True once the whole prompt is prefilled."""
        return self.chunks.advance()


@dataclass
class TalkerPrefillInProgress(Generic[GenerationKey]):
    """A turn in the Thinker's rows whose Talker prefill runs a chunk at a time before it joins
    the Talker's rows (``DecodeBatch.join_talker_prefilled``)."""

    turn: BatchGeneration[GenerationKey]
    chunks: ChunkedTalkerPrefill

    @property
    def key(self) -> GenerationKey:
        return self.turn.key

    def advance(self) -> bool:
        """The next chunk; True once the whole Talker prompt is prefilled."""
        return self.chunks.advance()


class DecodeBatch(Generic[GenerationKey]):
    """Turns decoded together: one Thinker forward, one Talker forward and one code-predictor
    loop per step for every turn that needs it, and Code2Wav for the chunks that are due.

    A turn joins with ``prefill_thinker`` (and ``prefill_talker`` when it speaks), between
    steps; a prompt longer than ``prefill_chunk`` positions is prefilled a chunk at a time
    between steps instead (``begin_prefill``, ``begin_talker_prefills``), and until its Talker
    prefill is over the turn decodes its text in the Thinker's rows alone, each token kept for
    the Talker. It leaves the Thinker's rows when its text ends and the Talker's when its audio
    does, and ``finish`` or ``cancel`` forget it. Each stage keeps one left-padded
    ``KVCache`` for its rows, with each row's own (multimodal RoPE) positions: joining
    right-aligns the new turn's cache with the others, leaving drops its row and the padding
    no row needs any more. Sampling is per turn (its own settings, processors and seeded
    generator), so a turn's tokens do not depend on who else is in the batch; with greedy
    decoding a turn in a batch computes what it computes alone, up to float rounding of the
    batched matrix products.

    Keys are any hashable turn ids. Events come back as ``(key, event)`` pairs.
    """

    def __init__(self, model, tokenizer, *, clock: Callable[[], float] = time.monotonic,
                 prefill_chunk: int = PREFILL_CHUNK_POSITIONS) -> None:
        self._model = model
        self._prefill_chunk = prefill_chunk
        self._tokenizer = tokenizer
        self._clock = clock
        self._turns: dict[GenerationKey, BatchGeneration[GenerationKey]] = {}
        thinker_text = model.thinker.model.language_model
        self._thinker_stack = DecoderStack(thinker_text)
        self._thinker_embed = thinker_text.embed_tokens
        self._thinker_head = model.thinker.lm_head
        self._thinking: StageRows[GenerationKey] | None = None
        self._speaking: StageRows[GenerationKey] | None = None
        # None: a checkpoint loaded without audio output (text-only turns).
        self._speech_model = TalkerDecoder(model.talker) if getattr(model, "talker", None) is not None else None
        self._tts: TtsEmbeddings | None = None
        # Due chunks of one shape go through Code2Wav together on an accelerator, one call each on a CPU.
        code2wav = getattr(model, "code2wav", None)  # None: loaded without audio output
        self._code2wav = None if code2wav is None else StreamingCode2Wav(code2wav)
        self._code2wav_batches = code2wav is not None and code2wav.device.type != "cpu"

    @property
    def thinker_rows(self) -> list[BatchGeneration[GenerationKey]]:
        """Turns whose text goes on, in row order."""
        return [] if self._thinking is None else self._thinking.turns

    @property
    def talker_rows(self) -> list[BatchGeneration[GenerationKey]]:
        """Turns whose audio goes on, in row order."""
        return [] if self._speaking is None else self._speaking.turns

    def _streaming_code2wav(self) -> StreamingCode2Wav:
        if self._code2wav is None:
            raise ValueError("this model was loaded without its Code2Wav: ask for text only")
        return self._code2wav

    def _speech(self) -> TalkerDecoder:
        if self._speech_model is None:
            raise ValueError("this model was loaded without its Talker: ask for text only")
        return self._speech_model

    # -- joining --------------------------------------------------------------------------

    def cancelled_before_start(self, inputs: ThinkerInputs) -> GenerationDone:
        usage = Usage(
            input_text_tokens=inputs.text_tokens,
            input_audio_tokens=inputs.audio_tokens,
            output_text_tokens=0,
            input_image_tokens=inputs.image_tokens,
        )
        return GenerationDone(text="", usage=usage, finish_reason="cancelled")

    def prefill_thinker(
        self, key: GenerationKey, inputs: ThinkerInputs, params: GenerationParams
    ) -> list[tuple[GenerationKey, GenerationEvent]]:
        """Run the Thinker's prefill for a new turn, which samples its first answer token."""
        return self.prefill_thinkers([(key, inputs, params)])

    def prefill_thinkers(
        self, joining: list[tuple[GenerationKey, ThinkerInputs, GenerationParams]]
    ) -> list[tuple[GenerationKey, GenerationEvent]]:
        """The Thinker's prefill for new turns in one forward (prompts left-padded, each row
        with the positions it has alone, every clip through the audio encoder together); each
        samples its first answer token. Four dev-model prefills cost ~1.5 one, not 4."""
        for key, _, _ in joining:
            if key in self._turns or sum(other == key for other, _, _ in joining) > 1:
                raise ValueError(f"turn {key!r} is already in the batch")
        turns = [BatchGeneration(key, self._model, self._tokenizer, inputs, params, self._clock) for key, inputs, params in joining]
        thinker = self._model.thinker
        with torch.inference_mode():
            rows = [ThinkerPrompt.of(thinker, turn.inputs) for turn in turns]
            batch = ThinkerPrompt.padded(rows)
            forward_kwargs: dict[str, torch.Tensor] = {}
            if batch.input_features is not None and batch.feature_attention_mask is not None:
                forward_kwargs["input_features"] = batch.input_features.to(thinker.dtype)
                forward_kwargs["feature_attention_mask"] = batch.feature_attention_mask
            if batch.pixel_values is not None and batch.image_grid_thw is not None:
                forward_kwargs["pixel_values"] = batch.pixel_values.to(thinker.dtype)
                forward_kwargs["image_grid_thw"] = batch.image_grid_thw
            keep_hidden = any(turn.params.output_audio for turn in turns)
            # The Thinker's model, then its head on the last position only: thinker(...) would
            # score every prompt position against the 152k vocabulary (150 of the 160 ms a
            # dev-model prefill took).
            output = thinker.model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=True,
                output_hidden_states=keep_hidden,
                output_router_logits=False,
                use_audio_in_video=False,
                **forward_kwargs,
            )
            prefilled = PrefillOutput(output.last_hidden_state[:, -1:], output.hidden_states if keep_hidden else None,
                                      output.cache)
        return self._join_thinkers(turns, rows, batch, prefilled)

    @property
    def prefill_chunk(self) -> int:
        """Positions per chunk of a long prompt's prefill."""
        return self._prefill_chunk

    def chunked(self, inputs: ThinkerInputs) -> bool:
        """The prompt is longer than a chunk: it is prefilled alone, a chunk at a time
        (``begin_prefill``), never padded into other turns' batched prefill."""
        return int(inputs.input_ids.shape[-1]) > self._prefill_chunk

    def begin_prefill(self, key: GenerationKey, inputs: ThinkerInputs, params: GenerationParams) -> PrefillInProgress[GenerationKey]:
        """A turn's Thinker prefill to run a chunk at a time (``PrefillInProgress.advance``) between
        the batch's steps; ``join_prefilled`` once it is done. Nothing is in the batch until then."""
        if key in self._turns:
            raise ValueError(f"turn {key!r} is already in the batch")
        turn = BatchGeneration(key, self._model, self._tokenizer, inputs, params, self._clock)
        with torch.inference_mode():
            prompt = ThinkerPrompt.of(self._model.thinker, inputs)
        chunks = ChunkedPrefill(self._model.thinker, prompt, keep_hidden=params.output_audio, chunk=self._prefill_chunk)
        return PrefillInProgress(turn, chunks)

    def join_prefilled(self, prefill: PrefillInProgress[GenerationKey]) -> list[tuple[GenerationKey, GenerationEvent]]:
        """The turn whose chunked prefill is over samples its first answer token and joins the batch."""
        if prefill.turn.key in self._turns:
            raise ValueError(f"turn {prefill.turn.key!r} is already in the batch")
        prompt = prefill.chunks.prompt
        return self._join_thinkers([prefill.turn], [prompt], prompt, prefill.chunks.output())

    def _join_thinkers(
        self,
        turns: list[BatchGeneration[GenerationKey]],
        rows: list[ThinkerPrompt],
        batch: ThinkerPrompt,
        prefilled: PrefillOutput,
    ) -> list[tuple[GenerationKey, GenerationEvent]]:
        """After the Thinker's prefill of ``turns`` (``batch``: their prompts padded together): each
        samples its first answer token, keeps what the Talker's prefill needs, and joins the rows."""
        thinker = self._model.thinker
        with torch.inference_mode():
            last_hidden = prefilled.last_hidden
            logits = thinker.lm_head(last_hidden)[:, -1, :]
            scores = torch.cat([turn.thinker.scores(logits[row : row + 1]) for row, turn in enumerate(turns)])
            tokens = choose_rows([turn.thinker.sampler for turn in turns], scores)
            for row, (turn, prompt) in enumerate(zip(turns, rows)):
                pad = batch.pads[row]
                if turn.params.output_audio and prefilled.hidden_states is not None:
                    layer = self._model.config.talker_config.accept_hidden_layer
                    turn.prompt_embeds = prefilled.hidden_states[0][row : row + 1, pad:]
                    turn.prompt_hidden = prefilled.hidden_states[layer][row : row + 1, pad:]
                turn.thinker.sequence = prompt.input_ids
                turn.thinker.accept(tokens[row : row + 1])
            cache = KVCache.of(prefilled.cache, batch.pads)
        token_ids = tokens[:, 0].tolist()
        events: list[tuple[GenerationKey, GenerationEvent]] = []
        for turn, token_id in zip(turns, token_ids):
            turn.thinker.record(token_id)
            self._turns[turn.key] = turn
            events.extend((turn.key, event) for event in turn.token_events(token_id))
        joined = StageRows(turns, cache, batch.position_ids[-3:, :, -1:], tokens, last_hidden).kept(
            [row for row, turn in enumerate(turns) if not turn.thinker.finished]
        )
        if joined is not None:
            self._thinking = joined if self._thinking is None else self._thinking.joined(joined)
        return events

    def wants_talker(self, key: GenerationKey) -> bool:
        """An answer of one token is only its end marker (or one token cut short): nothing to
        speak, and generate() cannot build a Talker prompt for it either. Nor is there for one
        that begins with a function call."""
        turn = self._turns[key]
        return turn.params.output_audio and not turn.thinker.finished and turn.calls.speaking

    def prefill_talker(self, key: GenerationKey) -> None:
        """Build the turn's Talker prompt as generate() does and prefill it; the turn joins the Talker's rows."""
        self.prefill_talkers([key])

    def prefill_talkers(self, keys: list[GenerationKey]) -> None:
        """``prefill_talker`` for several turns in one Talker forward (prompts left-padded,
        each row with the positions it has alone), whatever their length."""
        turns = [self._turns[key] for key in keys]
        self._prefill_talker_prompts(turns, [self._talker_prompt_of(turn) for turn in turns])

    def begin_talker_prefills(self, keys: list[GenerationKey]) -> list[TalkerPrefillInProgress[GenerationKey]]:
        """The Talker's prefill for turns that just joined the Thinker's rows. The Talker prompts
        that fit a chunk go through one forward together (as ``prefill_talkers``) and their turns
        join the Talker's rows now. Each longer one (its prompt holds the user parts of the whole
        conversation) is returned, to run a chunk at a time between the batch's steps
        (``TalkerPrefillInProgress.advance``, then ``join_talker_prefilled``); its turn speaks from
        now on, so the tokens its Thinker decodes meanwhile wait, in order, as the Talker's
        trailing text, and none is lost."""
        turns = [self._turns[key] for key in keys]
        prompts = [self._talker_prompt_of(turn) for turn in turns]
        fits = [row for row, (embeds, _) in enumerate(prompts) if embeds.shape[1] <= self._prefill_chunk]
        if fits:
            self._prefill_talker_prompts([turns[row] for row in fits], [prompts[row] for row in fits])
        talker = self._speech().talker
        started: list[TalkerPrefillInProgress[GenerationKey]] = []
        for row, (turn, (embeds, positions)) in enumerate(zip(turns, prompts)):
            if row in fits:
                continue
            turn.speech = self._new_speech(turn)
            started.append(TalkerPrefillInProgress(turn, ChunkedTalkerPrefill(talker, embeds, positions, chunk=self._prefill_chunk)))
        return started

    def join_talker_prefilled(self, prefill: TalkerPrefillInProgress[GenerationKey]) -> None:
        """The turn whose chunked Talker prefill is over samples its first code and joins the Talker's rows."""
        turn = prefill.turn
        if self._turns.get(turn.key) is not turn:
            raise ValueError(f"turn {turn.key!r} is no longer in the batch")
        output = prefill.chunks.output()
        with torch.inference_mode():
            logits = self._speech().talker.codec_head(output.last_hidden)[:, -1, :]
            cache = KVCache.of(output.cache)
        self._join_talkers([turn], [turn.speaking()], logits, output.last_hidden, cache,
                           prefill.chunks.positions[-3:, :, -1:])

    def _talker_prompt_of(self, turn: BatchGeneration[GenerationKey]) -> tuple[torch.Tensor, torch.Tensor]:
        """The turn's Talker prompt: embeddings [1, T, hidden] and positions [4, 1, T]."""
        speaker_id = self._model.config.talker_config.speaker_id.get(turn.params.voice.lower())
        if speaker_id is None:
            raise ValueError(f"the checkpoint has no speaker {turn.params.voice!r}")
        prompt_embeds, prompt_ids = self._talker_prompt(turn, speaker_id, self._tts_embeds())
        with torch.inference_mode():
            positions = talker_prompt_positions(self._model.thinker, prompt_ids, turn.inputs)
        # Drop what only the Talker's prompt needed.
        turn.prompt_embeds = turn.prompt_hidden = None
        return prompt_embeds, positions

    def _new_speech(self, turn: BatchGeneration[GenerationKey]) -> GenerationSpeech:
        return GenerationSpeech(
            TalkerGeneration(self._model, turn.params, turn.generator),
            AudioChunker(self._streaming_code2wav(), turn.params, turn.clock),
        )

    def _prefill_talker_prompts(
        self, turns: list[BatchGeneration[GenerationKey]], prompts: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """One Talker forward over the turns' prompts (embeddings, positions), left-padded; they join the Talker's rows."""
        talker = self._speech().talker
        device = talker.device
        length = max(embeds.shape[1] for embeds, _ in prompts)
        pads = [length - embeds.shape[1] for embeds, _ in prompts]
        pad = torch.nn.functional.pad
        with torch.inference_mode():
            # Padding embeddings are zeros and masked out; padding positions are 1, as generate() pads.
            prompt_embeds = torch.cat([pad(embeds, (0, 0, gap, 0)) for (embeds, _), gap in zip(prompts, pads)])
            position_ids = torch.cat([pad(positions, (gap, 0), value=1) for (_, positions), gap in zip(prompts, pads)], dim=1)
            attention_mask = torch.ones(prompt_embeds.shape[:2], dtype=torch.long, device=device)
            for row, gap in enumerate(pads):
                attention_mask[row, :gap] = 0
            output = talker(
                inputs_embeds=prompt_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=True,
            )
            # generate() feeds the code predictor the last layer's output at the last position.
            hidden = output.hidden_states[0][-1][:, -1:]
            cache = KVCache.of(output.cache, pads)
        self._join_talkers(turns, [self._new_speech(turn) for turn in turns], output.logits[:, -1, :], hidden, cache,
                           position_ids[-3:, :, -1:])

    def _join_talkers(
        self,
        turns: list[BatchGeneration[GenerationKey]],
        speeches: list[GenerationSpeech],
        logits: torch.Tensor,
        hidden: torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor,
    ) -> None:
        """After the Talker's prefill of ``turns`` (``logits`` [rows, vocab] and ``hidden`` [rows, 1,
        hidden] at each row's last position): each samples its first code and joins the Talker's rows."""
        with torch.inference_mode():
            scores = torch.cat(
                [speech.talker.scores(logits[row : row + 1], consumed_through=-1) for row, speech in enumerate(speeches)]
            )
            codes = choose_rows([speech.talker.sampler for speech in speeches], scores)
            for row, speech in enumerate(speeches):
                speech.talker.accept(codes[row : row + 1])
        for turn, speech, code_id in zip(turns, speeches, codes[:, 0].tolist()):
            speech.talker.absorb_code(code_id)
            turn.speech = speech
        joining = StageRows(turns, cache, positions, codes, hidden)
        self._speaking = joining if self._speaking is None else self._speaking.joined(joining)

    def _tts_embeds(self) -> TtsEmbeddings:
        """<tts_bos>, <tts_eos>, <tts_pad> in the Talker's input space, computed once."""
        if self._tts is None:
            config = self._model.config
            with torch.inference_mode():
                tts_tokens = torch.tensor(
                    [[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]],
                    device=self._model.thinker.device,
                )
                talker = self._speech().talker
                embeds = talker.text_projection(self._thinker_embed(tts_tokens)).to(talker.device)
            self._tts = TtsEmbeddings(*embeds.chunk(3, dim=1))
        return self._tts

    def _talker_prompt(self, turn: BatchGeneration[GenerationKey], speaker_id, tts: TtsEmbeddings):
        """The Talker's prompt exactly as generate() builds it (batch of one, no padding)."""
        model = self._model
        config = model.config
        device = self._speech().talker.device
        input_ids = turn.inputs.input_ids.to(device)
        length = input_ids.shape[1]
        thinker_config = config.thinker_config
        multimodal_mask = (
            (input_ids == thinker_config.audio_token_id)
            | (input_ids == thinker_config.image_token_id)
            | (input_ids == thinker_config.video_token_id)
        )
        if turn.prompt_embeds is None or turn.prompt_hidden is None:
            raise ValueError(f"turn {turn.key!r} was prefilled without audio output: it has no Talker prompt")
        prompt_embeds = turn.prompt_embeds.to(device)
        prompt_hidden = turn.prompt_hidden.to(device)
        with torch.inference_mode():
            # Every position whose segment (from the last <|im_start|>) is a user turn.
            positions = torch.arange(length, device=device).unsqueeze(0)
            im_starts = torch.where(input_ids == config.im_start_token_id, positions, positions.new_full((), -1))
            segment_start = torch.cummax(im_starts, dim=-1).values.clamp_min(0)
            roles = input_ids.gather(1, (segment_start + 1).clamp_max(length - 1))
            user_positions = torch.nonzero(roles[0] == config.user_token_id).flatten()
            user_embeds = model._get_talker_user_parts(0, length, multimodal_mask, prompt_hidden, prompt_embeds)
            user_embeds = user_embeds[:, user_positions]
            user_ids = input_ids[:, user_positions]

            assistant_starts = (input_ids[0, :-1] == config.im_start_token_id) & (
                input_ids[0, 1:] == config.assistant_token_id
            )
            starts = torch.nonzero(assistant_starts).flatten()
            if starts.numel() == 0:
                raise ValueError("the prompt has no '<|im_start|>assistant' for the Talker to speak from")
            assistant_start = int(starts[-1].item())
            # The assistant preamble ends with the first answer token's embedding.
            first = self._thinker_embed(torch.tensor([[turn.thinker.tokens[0]]], device=self._model.thinker.device))
            embeds = torch.cat([prompt_embeds, first.to(device)], dim=1)
            assistant_embeds, assistant_ids, _ = model._get_talker_assistant_parts(
                assistant_start, length + 1, speaker_id, embeds,
                tts_pad_embed=tts.pad, tts_bos_embed=tts.bos, tts_eos_embed=tts.eos,
            )
        return torch.cat([user_embeds, assistant_embeds], dim=1), torch.cat([user_ids, assistant_ids], dim=1)

    # -- leaving --------------------------------------------------------------------------

    def _drop(self, turn: BatchGeneration[GenerationKey]) -> None:
        if self._thinking is not None:
            self._thinking = self._thinking.kept(
                [row for row, other in enumerate(self._thinking.turns) if other is not turn]
            )
        if self._speaking is not None:
            self._speaking = self._speaking.kept(
                [row for row, other in enumerate(self._speaking.turns) if other is not turn]
            )
        del self._turns[turn.key]

    def cancel(self, key: GenerationKey) -> GenerationDone:
        """The turn leaves now, whatever it was doing; its ``GenerationDone`` says "cancelled"."""
        turn = self._turns[key]
        self._drop(turn)
        return turn.done("cancelled")

    def finish(self, key: GenerationKey) -> GenerationDone:
        """The last event of a turn that is ``decoded``; the turn leaves the batch."""
        turn = self._turns[key]
        if not self._decoded(turn):
            raise ValueError(f"turn {key!r} is still decoding")
        self._drop(turn)
        return turn.done(turn.thinker.finish_reason)

    def decoded(self, key: GenerationKey) -> bool:
        return self._decoded(self._turns[key])

    @staticmethod
    def _decoded(turn: BatchGeneration) -> bool:
        """Text over, audio over (or never started) and every frame decoded into audio."""
        if not turn.thinker.finished:
            return False
        if turn.speech is None:
            return True
        return turn.speech.talker.finished and turn.speech.audio.pending_frames == 0

    def finished_keys(self) -> list[GenerationKey]:
        return [key for key, turn in self._turns.items() if self._decoded(turn)]

    @property
    def keys(self) -> list[GenerationKey]:
        return list(self._turns)

    def cache_bytes(self) -> int:
        """Key/value memory the batch holds for its rows (Thinker and Talker)."""
        return sum(rows.cache.nbytes() for rows in (self._thinking, self._speaking) if rows is not None)

    # -- decoding steps -------------------------------------------------------------------

    def step_thinker(self) -> list[tuple[GenerationKey, GenerationEvent]]:
        """One answer token for every turn whose text goes on; a turn whose text ends leaves these rows."""
        state = self._thinking
        if state is None:
            return []
        rows = state.turns
        with torch.inference_mode():
            state.positions = state.positions + 1
            hidden = self._thinker_stack(self._thinker_embed(state.last), state.cache, positions=state.positions)
            state.hidden = hidden[:, -1:]
            logits = self._thinker_head(hidden[:, -1])
            scores = torch.cat([turn.thinker.scores(logits[row : row + 1]) for row, turn in enumerate(rows)])
            state.last = choose_rows([turn.thinker.sampler for turn in rows], scores)
            for row, turn in enumerate(rows):
                turn.thinker.accept(state.last[row : row + 1])
            token_ids = state.last[:, 0].tolist()
            for row, turn in enumerate(rows):
                turn.thinker.record(token_ids[row])
            released = [turn.token_events(token_ids[row]) for row, turn in enumerate(rows)]
            # The Talker's trailing text: each new token projected, in one call for all rows.
            fed = [row for row, turn in enumerate(rows) if turn.feeds_talker]
            if fed:
                talker = self._speech().talker
                ids = state.last if len(fed) == len(rows) else state.last[fed]
                projected = talker.text_projection(self._thinker_embed(ids)).to(talker.device)
        events: list[tuple[GenerationKey, GenerationEvent]] = []
        keep = []
        for row, turn in enumerate(rows):
            if turn.speech is not None and not turn.speech.talker.text_done:
                if row in fed:
                    turn.speech.talker.trailing.append(projected[fed.index(row)].unsqueeze(0))
                else:  # the text ended, or a function call began: generate()'s <tts_eos> in its place
                    turn.speech.talker.trailing.append(self._tts_embeds().eos)
                    turn.speech.talker.text_done = True
            events.extend((turn.key, event) for event in released[row])
            if not turn.thinker.finished:
                keep.append(row)
        self._thinking = state.kept(keep)
        return events

    def step_talker(self) -> None:
        """One codec frame for every speaking turn: the code predictor completes it, and the
        Talker samples the next first-layer code unless the frame was the turn's last."""
        state = self._speaking
        if state is None:
            return
        speech_model = self._speech()
        talker = speech_model.talker
        speeches = [turn.speaking() for turn in state.turns]
        with torch.inference_mode():
            last_code_embed = talker.get_input_embeddings()(state.last)
            residual = speech_model.residual_codes(
                [speech.talker.predictor_sampler for speech in speeches], state.hidden, last_code_embed
            )
            frames = torch.cat((state.last, residual.codes), dim=-1)
        keep = []
        for row, speech in enumerate(speeches):
            speech.audio.push(frames[row])
            if not speech.talker.frame_done():
                keep.append(row)
        with torch.inference_mode():
            inputs_embeds = torch.cat([last_code_embed, residual.embeds], dim=1).sum(1, keepdim=True)
            tts_pad = self._tts_embeds().pad
            text = [
                speech.talker.trailing[speech.talker.frames - 1]
                if speech.talker.frames - 1 < len(speech.talker.trailing)
                else tts_pad
                for speech in speeches
            ]
            inputs_embeds = inputs_embeds + torch.cat(text, dim=0)
            if len(keep) < len(speeches):
                inputs_embeds = inputs_embeds[keep]
            kept = state.kept(keep)
            if kept is None:
                self._speaking = None
                return
            state = kept
            speeches = [turn.speaking() for turn in state.turns]
            state.positions = state.positions + 1
            hidden = speech_model.stack(inputs_embeds, state.cache, positions=state.positions)
            state.hidden = hidden[:, -1:]
            logits = talker.codec_head(hidden[:, -1])
            scores = torch.cat(
                [
                    speech.talker.scores(logits[row : row + 1], consumed_through=speech.talker.frames - 1)
                    for row, speech in enumerate(speeches)
                ]
            )
            state.last = choose_rows([speech.talker.sampler for speech in speeches], scores)
            for row, speech in enumerate(speeches):
                speech.talker.accept(state.last[row : row + 1])
            code_ids = state.last[:, 0].tolist()
        keep = []
        for row, speech in enumerate(speeches):
            speech.talker.absorb_code(code_ids[row])
            if not speech.talker.finished:
                keep.append(row)
        self._speaking = state.kept(keep)

    def _due(self) -> list[tuple[BatchGeneration[GenerationKey], GenerationSpeech]]:
        return [
            (turn, turn.speech)
            for turn in self._turns.values()
            if turn.speech is not None and turn.speech.audio.chunk_due(turn.speech.talker.finished)
        ]

    def chunks_due(self) -> bool:
        return bool(self._due())

    def decode_chunks(self) -> list[tuple[GenerationKey, GenerationEvent]]:
        """Decode every due chunk (a turn's last frames once its audio ended), each from the
        Code2Wav state its turn's previous chunks left. On an accelerator chunks of the same
        length and state shape go through Code2Wav together; on a CPU each goes alone,
        because Code2Wav's upsampled activations outgrow the cache: four 50-frame chunks
        together cost 59 ms against 4 x 13 ms alone (dev model, one core)."""
        code2wav = self._streaming_code2wav()
        due = self._due()
        groups: dict[Hashable, list[tuple[BatchGeneration[GenerationKey], AudioChunker, torch.Tensor]]] = {}
        for turn, speech in due:
            codes = speech.audio.pending_codes()
            key = (codes.shape[-1], speech.audio.state.batch_key()) if self._code2wav_batches else turn.key
            groups.setdefault(key, []).append((turn, speech.audio, codes))
        events: list[tuple[GenerationKey, GenerationEvent]] = []
        decoded: dict[GenerationKey, np.ndarray] = {}
        with torch.inference_mode():
            for members in groups.values():
                waves, states = code2wav.decode(
                    torch.cat([codes for _, _, codes in members]), [audio.state for _, audio, _ in members]
                )
                for (turn, audio, _), wave, state in zip(members, waves.float().cpu().numpy(), states):
                    decoded[turn.key] = wave
                    audio.state = state
        for turn, speech in due:
            pcm = decoded[turn.key]
            frames = speech.audio.emit(pcm)
            events.append((turn.key, AudioChunk(pcm, frames=frames)))
        return events
