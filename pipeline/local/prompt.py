"""Render a conversation into the Thinker's inputs: Qwen3-Omni's ChatML prompt plus audio features.

The prompt follows Qwen3-Omni's chat template::

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n<|audio_start|><|audio_pad|><|audio_end|>{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<|im_end|>\\n
    ...
    <|im_start|>assistant\\n

with its tool format where the conversation has tools, function calls or their outputs
(``pipeline.tool_format``), and the start of a forced call after the last line when
``tool_choice`` asks for one (``ThinkerInputs.answer_prefix``).

and, like ``Qwen3OmniMoeProcessor``, expands each ``<|audio_pad|>`` to the audio encoder's
output length for its clip and extracts all clips' log-mel features in one Whisper call
(padded to the longest clip, never truncated).

A user image (``UserImage``) is ``<|vision_start|><|image_pad|><|vision_end|>`` where it stands in
the message, the pad expanded to the image's tokens (one per 32x32 pixels), and its pixels go
through Qwen's image processor: ``Qwen2VLImageProcessorPil``, the Pillow/numpy one, since the
torchvision-backed processors (and ``AutoProcessor``, which loads the video processor) do not load
beside the CPU torch used here (docs/MODEL.md). Each image is fitted to its own ``max_pixels``.

A transcription turn (``GenerationRequest.task == "transcribe"``) is rendered the way Qwen3-Omni's
README ("Setting for Evaluation", github.com/QwenLM/Qwen3-Omni) prompts its ASR benchmarks: no
system prompt, the audio first, then the instruction as user text — "Transcribe the
<source_language> audio into text." ("请将这段中文语音转换为纯文本。" for Chinese), and
"Transcribe the audio into text." when no language is given. A client's transcription
``prompt`` (context: names, vocabulary) goes into a system message, where Qwen3-ASR takes its
recognition context; that part is our choice, not Qwen3-Omni's documented setting.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoderConfig,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeThinkerConfig,
    Qwen3OmniMoeVisionEncoderConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from media.rates import SPEECH_RATE
from pipeline.contract import GenerationRequest, TranscriptionHint
from pipeline.conversation import (
    AssistantText,
    Conversation,
    ConversationItem,
    UserAudio,
    UserImage,
    UserText,
    asr_instruction,
    bound_history,
)
from pipeline.images import MIN_PIXELS, decode_rgb
from pipeline.local.processed_cache import AUDIO_CACHE_BYTES, IMAGE_CACHE_BYTES, ProcessedCache
from pipeline.local.tokenizer import load_tokenizer
from pipeline.tool_format import (
    FunctionCall,
    FunctionOutput,
    Markup,
    Piece,
    Tool,
    ToolChoice,
    answer_prefix,
    call_pieces,
    offers_tools,
    output_pieces,
    system_content,
    template_pieces,
)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
AUDIO_START = "<|audio_start|>"
AUDIO_END = "<|audio_end|>"
AUDIO_PAD = "<|audio_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
MEL_BINS = 128


@dataclass(frozen=True)
class ThinkerInputs:
    input_ids: torch.Tensor  # [1, T] long
    attention_mask: torch.Tensor  # [1, T] long
    input_features: torch.Tensor | None  # [n_clips, 128, frames] float32, None when no audio
    feature_attention_mask: torch.Tensor | None  # [n_clips, frames] long
    text_tokens: int  # prompt tokens that are neither <|audio_pad|> nor <|image_pad|>
    audio_tokens: int  # expanded <|audio_pad|> tokens
    pixel_values: torch.Tensor | None = None  # [patches, 3 * 2 * 16 * 16] float32, every image's in prompt order
    image_grid_thw: torch.Tensor | None = None  # [images, 3] long: (1, patch rows, patch columns)
    image_tokens: int = 0  # expanded <|image_pad|> tokens
    # The assistant's answer as the prompt already starts it: a forced call's opening
    # (tool_choice "required" or a named function), which the answer's tokens continue.
    answer_prefix: str = ""


@dataclass(frozen=True)
class _AudioSlot:
    """Where one clip's expanded ``<|audio_pad|>`` run goes in the prompt."""

    clip: int


@dataclass(frozen=True)
class _ImageSlot:
    """Where one image's expanded ``<|image_pad|>`` run goes in the prompt."""

    image: int


_Piece = str | int | _AudioSlot | _ImageSlot  # text, a special token id, or an audio or image slot


class PromptRenderer:
    """Turns a ``Conversation`` into ``ThinkerInputs`` for one checkpoint's tokenizer and audio encoder."""

    def __init__(
        self,
        tokenizer,
        feature_extractor: WhisperFeatureExtractor,
        *,
        n_window: int,
        image_processor: Qwen2VLImageProcessorPil | None = None,
    ) -> None:
        """``image_processor`` None: a renderer for text and audio only (a conversation with an
        image is refused)."""
        if feature_extractor.sampling_rate != SPEECH_RATE or feature_extractor.feature_size != MEL_BINS:
            raise ValueError(
                f"expected a {SPEECH_RATE} Hz, {MEL_BINS}-bin Whisper feature extractor, got "
                f"{feature_extractor.sampling_rate} Hz, {feature_extractor.feature_size} bins"
            )
        self._tokenizer = tokenizer
        self._feature_extractor = feature_extractor
        self._image_processor = image_processor
        # Past turns' images and clips come again every turn (pipeline/local/processed_cache.py).
        self.processed_images = ProcessedCache(IMAGE_CACHE_BYTES)
        self.audio_features = ProcessedCache(AUDIO_CACHE_BYTES)
        self._n_window = n_window
        self._special_ids = {
            token: self._token_id(token) for token in (IM_START, IM_END, AUDIO_START, AUDIO_END, VISION_START, VISION_END)
        }
        # Qwen's non-special added tokens (the tool markup, <think>, the FIM tokens): its tokenizer
        # finds them in any text, so text holding one is encoded without them (``_encode_text``).
        self._added_in_text = tuple(
            token.content for token in tokenizer.added_tokens_decoder.values() if not token.special
        )
        self._audio_pad_id = self._token_id(AUDIO_PAD)
        self._image_pad_id = self._token_id(IMAGE_PAD)
        # torch.stft reflect-pads n_fft // 2 = 200 samples each side and fails on shorter input;
        # one full 400-sample (25 ms) analysis window is the least that makes a feature frame.
        self._min_clip_samples = feature_extractor.n_fft

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, *, tokenizer=None) -> PromptRenderer:
        """The renderer for a checkpoint; pass ``tokenizer`` when it is already loaded from it."""
        config = Qwen3OmniMoeConfig.from_pretrained(model_dir)
        thinker_config = cast(Qwen3OmniMoeThinkerConfig, config.thinker_config)
        audio_config = cast(Qwen3OmniMoeAudioEncoderConfig, thinker_config.audio_config)
        vision_config = cast(Qwen3OmniMoeVisionEncoderConfig, thinker_config.vision_config)
        return cls(
            tokenizer if tokenizer is not None else load_tokenizer(model_dir),
            WhisperFeatureExtractor.from_pretrained(model_dir),
            n_window=audio_config.n_window,
            image_processor=load_image_processor(model_dir, vision_config),
        )

    def render(self, conversation: Conversation) -> ThinkerInputs:
        return self._render(
            conversation.system_prompt, bound_history(conversation), conversation.tools, conversation.tool_choice
        )

    def render_request(self, request: GenerationRequest) -> ThinkerInputs:
        """The Thinker's inputs for ``request``: an answer to its conversation, a transcription, or
        an open user message whose end is scored (``end_of_turn``)."""
        if request.task == "respond":
            return self.render(request.conversation)
        if request.task == "end_of_turn":
            texts = [item for item in request.conversation.items if isinstance(item, UserText)]
            if len(texts) != 1 or len(request.conversation.items) != 1:
                raise ValueError("an end-of-turn turn takes one user text and nothing else")
            return self.render_open_user_message(texts[0].text)
        clips = [item for item in request.conversation.items if isinstance(item, UserAudio)]
        if len(clips) != 1 or len(request.conversation.items) != 1:
            raise ValueError(
                f"a transcription turn takes one audio clip and nothing else, got {len(request.conversation.items)} items"
            )
        hint = request.hint or TranscriptionHint()
        clip = UserAudio(clips[0].pcm)
        return self._render(hint.prompt or None, (clip, UserText(asr_instruction(hint.language))))

    def render_open_user_message(self, text: str) -> ThinkerInputs:
        """``<|im_start|>user\n{text}``, the message left open: the next token says whether it ends."""
        ids = [self._special_ids[IM_START], *self._encode_text(f"user\n{text}")]
        input_ids = torch.tensor([ids], dtype=torch.long)
        return ThinkerInputs(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), input_features=None,
                             feature_attention_mask=None, text_tokens=len(ids), audio_tokens=0)

    @property
    def message_end_id(self) -> int:
        """``<|im_end|>``: the token that closes a message."""
        return self._special_ids[IM_END]

    def _render(
        self,
        system_prompt: str | None,
        items: Sequence[ConversationItem],
        tools: tuple[Tool, ...] = (),
        tool_choice: ToolChoice = ToolChoice(),
    ) -> ThinkerInputs:
        images = [item for item in items if isinstance(item, UserImage)]
        pixel_values, image_grid_thw, image_pads = self._image_inputs(images)
        clips = [item for item in items if isinstance(item, UserAudio)]
        for index, clip in enumerate(clips):
            if clip.pcm.ndim != 1 or len(clip.pcm) < self._min_clip_samples:
                raise ValueError(
                    f"audio clip {index} must be mono with at least {self._min_clip_samples} samples "
                    f"({self._min_clip_samples * 1000 // SPEECH_RATE} ms at {SPEECH_RATE} Hz), "
                    f"got shape {clip.pcm.shape}"
                )

        input_features, feature_attention_mask, pad_counts = self._audio_inputs(clips)

        prefix = answer_prefix(tool_choice) if offers_tools(tools, tool_choice) else ""
        pieces = self._pieces(system_prompt, items, tools if offers_tools(tools, tool_choice) else (), prefix)
        ids: list[int] = []
        for piece in self._merge_text(pieces):
            if isinstance(piece, str):
                ids.extend(self._encode_text(piece))
            elif isinstance(piece, _AudioSlot):
                ids.extend([self._audio_pad_id] * pad_counts[piece.clip])
            elif isinstance(piece, _ImageSlot):
                ids.extend([self._image_pad_id] * image_pads[piece.image])
            else:
                ids.append(piece)

        input_ids = torch.tensor([ids], dtype=torch.long)
        audio_tokens = sum(pad_counts)
        image_tokens = sum(image_pads)
        return ThinkerInputs(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            input_features=input_features,
            feature_attention_mask=feature_attention_mask,
            text_tokens=len(ids) - audio_tokens - image_tokens,
            audio_tokens=audio_tokens,
            pixel_values=pixel_values,
            image_grid_thw=image_grid_thw,
            image_tokens=image_tokens,
            answer_prefix=prefix,
        )

    def _audio_inputs(self, clips: Sequence[UserAudio]) -> tuple[torch.Tensor | None, torch.Tensor | None, list[int]]:
        """Every clip's Whisper features (in order) padded to the longest, their mask, and each
        clip's ``<|audio_pad|>`` count.

        Each clip's features are extracted alone, Qwen3OmniMoeProcessor's call for one clip, so a
        clip has the same features in every prompt that holds it and is extracted once. (In one
        batch padded to the longest, the processor's call for several, a shorter clip's last frame
        takes in the padding's zeros: it changes, by ~0.04, with the clips beside it. The audio
        tower drops the padded frames.)"""
        if not clips:
            return None, None, []

        def extract(pcm: np.ndarray) -> tuple[torch.Tensor]:
            features = self._feature_extractor(
                [pcm],
                sampling_rate=SPEECH_RATE,
                padding="longest",  # what padding=True means; the stubs take the string
                truncation=False,
                return_attention_mask=True,
                return_tensors="pt",
            )
            frames = int(features["attention_mask"][0].sum())
            return (features["input_features"][0, :, :frames].to(torch.float32),)

        pcms = [np.ascontiguousarray(clip.pcm, dtype=np.float32) for clip in clips]
        per_clip = [self.audio_features.get(pcm.tobytes(), 0, partial(extract, pcm))[0] for pcm in pcms]
        frames = torch.tensor([features.shape[-1] for features in per_clip])
        input_features = torch.zeros(len(per_clip), MEL_BINS, int(frames.max()))
        for row, features in enumerate(per_clip):
            input_features[row, :, : features.shape[-1]] = features
        feature_attention_mask = (torch.arange(input_features.shape[-1]) < frames[:, None]).to(torch.long)
        # The model's own formula: its position ids and audio tower use the same one.
        return input_features, feature_attention_mask, _get_feat_extract_output_lengths(frames, self._n_window).tolist()

    def _image_inputs(self, images: Sequence[UserImage]) -> tuple[torch.Tensor | None, torch.Tensor | None, list[int]]:
        """Every image's patches (in order), its (t, h, w) patch grid, and its ``<|image_pad|>`` count."""
        if not images:
            return None, None, []
        processor = self._image_processor
        if processor is None:
            raise ValueError("this renderer has no image processor: the conversation holds an image")

        def process(image: UserImage) -> tuple[torch.Tensor, torch.Tensor]:
            # One call per image: each has its own pixel budget (detail, camera settings).
            processed = processor(
                images=[decode_rgb(image.data)],
                size={"shortest_edge": MIN_PIXELS, "longest_edge": image.max_pixels},
                return_tensors="pt",
            )
            return processed["pixel_values"].to(torch.float32), processed["image_grid_thw"].to(torch.long)

        processed = [self.processed_images.get(image.data, image.max_pixels, partial(process, image)) for image in images]
        patches, grids = zip(*processed, strict=True)
        image_grid_thw = torch.cat(grids)
        merge = processor.merge_size
        pads = (image_grid_thw.prod(dim=-1) // (merge * merge)).tolist()
        return torch.cat(patches), image_grid_thw, pads

    def _encode_text(self, text: str) -> list[int]:
        """Text is data: "<|im_end|>" or "<tool_call>" typed by a client stays plain text, encoded
        as Qwen's BPE encodes any other text; only the template's own pieces make those tokens.

        Special tokens are kept out by ``split_special_tokens``; the tokenizer still finds its
        non-special added tokens in text, so text holding one goes through the normaliser, the
        pre-tokenizer and the BPE model alone (the ids tiktoken's ``encode_ordinary`` gives on
        the same ranks: tests/pipeline/local/test_prompt.py). That path costs a Python call per word,
        so it is taken only for such text."""
        if not any(token in text for token in self._added_in_text):
            return self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        backend = self._tokenizer.backend_tokenizer
        normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        words = backend.pre_tokenizer.pre_tokenize_str(normalized)
        return [token.id for word, _ in words for token in backend.model.tokenize(word)]

    def _template(self, pieces: Sequence[Piece]) -> Iterator[_Piece]:
        """``pipeline.tool_format``'s pieces: its markup as tokens, its text as text."""
        for piece in pieces:
            yield self._token_id(piece.token) if isinstance(piece, Markup) else piece

    def _token_id(self, token: str) -> int:
        ids = self._tokenizer.convert_tokens_to_ids([token])
        if not ids or ids[0] is None or ids[0] == self._tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no {token} token")
        return ids[0]

    def _pieces(
        self, system_prompt: str | None, items: Sequence[ConversationItem], tools: tuple[Tool, ...], prefix: str
    ) -> Iterator[_Piece]:
        """None: no system message (Qwen's ASR setting). ``tools``: the tool block after the
        system prompt; ``prefix``: how the assistant's answer starts.

        Messages follow the template: consecutive user items are one user message; an answer
        opens an assistant message that its function calls join; consecutive function outputs
        are one user message of ``<tool_response>`` blocks.
        """
        im_start, im_end = self._special_ids[IM_START], self._special_ids[IM_END]
        if tools:
            yield from (im_start, "system\n", *self._template(system_content(system_prompt, tools)), im_end, "\n")
        elif system_prompt is not None:
            yield from (im_start, f"system\n{system_prompt}", im_end, "\n")
        clip = image = 0
        open_message: str | None = None  # "user", "assistant" or "outputs": the message being written
        assistant_text = False  # the open assistant message has text
        calls = 0  # calls in the open assistant message
        for item in items:
            if isinstance(item, AssistantText | FunctionCall):
                if isinstance(item, AssistantText) or open_message != "assistant":
                    if open_message is not None:
                        yield from (im_end, "\n")
                    text = item.text if isinstance(item, AssistantText) else ""
                    yield from (im_start, f"assistant\n{text}")
                    open_message, assistant_text, calls = "assistant", bool(text), 0
                if isinstance(item, FunctionCall):
                    yield from self._template(call_pieces(item, newline_before=assistant_text or calls > 0))
                    calls += 1
                continue
            if isinstance(item, FunctionOutput):
                if open_message != "outputs":
                    if open_message is not None:
                        yield from (im_end, "\n")
                    yield from (im_start, "user")
                    open_message = "outputs"
                yield from self._template(output_pieces(item))
                continue
            if open_message != "user":
                if open_message is not None:
                    yield from (im_end, "\n")
                yield from (im_start, "user\n")
                open_message = "user"
            if isinstance(item, UserAudio):
                yield from (self._special_ids[AUDIO_START], _AudioSlot(clip), self._special_ids[AUDIO_END])
                clip += 1
            elif isinstance(item, UserImage):
                yield from (self._special_ids[VISION_START], _ImageSlot(image), self._special_ids[VISION_END])
                image += 1
            elif isinstance(item, UserText):
                yield item.text
            else:
                raise TypeError(f"not a conversation item: {item!r}")
        if open_message is not None:
            yield from (im_end, "\n")
        yield from (im_start, "assistant\n", *self._template(template_pieces(prefix)))

    @staticmethod
    def _merge_text(pieces: Iterator[_Piece]) -> Iterator[_Piece]:
        """Join adjacent text so it is tokenized as the chat template's string would be."""
        text: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                text.append(piece)
                continue
            if text:
                yield "".join(text)
                text = []
            yield piece
        if text:
            yield "".join(text)


def load_image_processor(model_dir: str | Path, vision_config: Qwen3OmniMoeVisionEncoderConfig) -> Qwen2VLImageProcessorPil:
    """The checkpoint's image processor (its ``preprocessor_config.json``), as the Pillow/numpy
    class; its patching must be the vision tower's, or every image would be cut wrongly."""
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))
    for key, expected in (
        ("patch_size", vision_config.patch_size),
        ("merge_size", vision_config.spatial_merge_size),
        ("temporal_patch_size", vision_config.temporal_patch_size),
    ):
        if getattr(processor, key) != expected:
            raise ValueError(
                f"{model_dir}: preprocessor_config.json {key} is {getattr(processor, key)}, "
                f"the vision tower's is {expected}"
            )
    return processor
