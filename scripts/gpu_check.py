"""The device check: Qwen3-Omni at its real size (random weights) or the dev model, measured on one device.

Run: scripts/gpu-check.sh [--size full|dev] [--model DIR] [--device cuda] [--dtype bfloat16] [--tokens 24] [--out DIR]

For the day a GPU is lent (15 minutes, a bare image): it runs unattended, offline, in under 8
minutes, with only this working tree and the wheels scripts/device-wheels.sh gathered, and
prints one table (exit status 1 if a step failed). docs/GPU.md has the command and the results.

``--size full`` (the default on CUDA) builds, directly in device memory, a model with
Qwen3-Omni-30B-A3B-Instruct's exact configuration (pipeline/local/qwen3_omni_config.py) and random
weights, with the dev tokenizer: a decoding step costs what it costs with the real weights.
``--size dev`` (the default on CPU) is the tiny dev model, and adds one full turn through the
engine process. ``--model DIR`` loads a real checkpoint (Qwen3-Omni-30B-A3B-Instruct's files and
weights) instead, and its own tokenizer and processor. Steps, each a row of the table:

1. Qwen's files: with ``--model``, the checkpoint's files against the published sha256 and its
   chat template against tests/fixtures/qwen3_omni/chat_template.jinja (a differing template fails);
2. processor ids: five conversations (tests/qwen_template.py) through the renderer and through
   ``Qwen3OmniMoeProcessor`` (the checkpoint's, or one of the dev tokenizer with Qwen's template):
   the same ids, or the row fails;
3. build: the model on the device (parameters, device memory, seconds);
4. generation config: the checkpoint's ``generation_config.json`` as it is, and the sampling the
   engine takes from it;
5. engine turn (dev only): one spoken turn through ``TransformersEngine``, as the server runs it;
6. greedy stream vs ``generate()`` at the check's dtype: the same answer text and codec frames;
7. ASR round trip: the model's spoken answer, resampled to 16 kHz, transcribed by the model (its
   transcription prompt): the word error rate against the answer's text (a real checkpoint fails
   above 0.3; random weights say nothing);
8. Thinker prefill of a spoken turn holding 10 s of audio (median of 3, after a warm-up);
9. TTFA: time to the first ``AudioChunk`` of a streamed turn (median of 3);
10. per-frame cost of a turn of ``--tokens`` answer tokens spoken over 3 frames each (a trained
   Talker's pace): Thinker token, Talker step, the code predictor's 15 passes, Code2Wav, per frame;
11. streaming RTF with 1, 4 and 8 turns decoded together (the same forced lengths): wall time
   over one turn's audio seconds (below 1: every listener's audio comes faster than it plays);
12. Code2Wav streaming: 300 random frames in chunks of 4 then 25, against one whole decode
   (relative error at this dtype) and its cost per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "bench"))

import transformers  # noqa: E402
from frame_cost import measure_turn  # noqa: E402
from harness import read_wav  # noqa: E402
from transformers import Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor  # noqa: E402

from media.rates import SPEECH_RATE, VOICE_RATE  # noqa: E402
from pipeline.contract import AudioChunk, GenerationDone, GenerationRequest, TextDelta  # noqa: E402
from pipeline.conversation import AssistantText, Conversation, UserAudio, UserText  # noqa: E402
from pipeline.images import decode_rgb  # noqa: E402
from pipeline.local.code2wav import StreamingCode2Wav  # noqa: E402
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.devmodel import (  # noqa: E402
    dev_feature_extractor,
    dev_generation_config,
    dev_image_processor,
    dev_model,
    ensure_dev_model,
    initialise_talker_experts,
)
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams  # noqa: E402
from pipeline.local.prompt import PromptRenderer  # noqa: E402
from pipeline.local.qwen3_omni_config import instruct_config  # noqa: E402
from pipeline.local.sampling import talker_sampling, thinker_sampling  # noqa: E402
from pipeline.local.tokenizer import build_tokenizer, load_tokenizer  # noqa: E402
from pipeline.local.transformers_engine import TransformersEngine  # noqa: E402
from tests.qwen_template import FIVE_CONVERSATIONS, QWEN_FILES, QWEN_TEMPLATE, template_text  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
FRAME_S = 0.08
FRAMES_PER_TOKEN = 3  # a trained Talker's pace: ~4 tokens a second at 12.5 frames a second
PREFILL_AUDIO_S = 10
CONCURRENT_TURNS = (1, 4, 8)
CODE2WAV_FRAMES = 300
CODE2WAV_SCHEDULE = [4] + [25] * 12  # the first chunk, then vllm-omni's chunk size: 304 frames, cut to 300
ENGINE_TURN_TIMEOUT_S = 120
# gpu-check.sh stops the whole run at 470 s; a step that starts after this many seconds is skipped.
BUDGET_S = 420
TEMPERATURE = 0.8
SEED = 0
IM_END, END_OF_TEXT = 151645, 151643
# A real checkpoint that mishears its own clear synthetic speech this often is broken somewhere
# between its Talker and its audio encoder (Qwen reports a few percent WER on clean English).
ASR_MAX_WER = 0.3


@dataclass
class Row:
    step: str
    status: str  # "ok", "FAIL", "skipped"
    seconds: float
    figures: str


class Check:
    """The model on the device and what every step needs: prompts, params, the clock to sync on."""

    def __init__(self, size: str, device: str, dtype: torch.dtype, tokens: int, model_dir: Path | None = None) -> None:
        self.size, self.device, self.dtype, self.tokens, self.model_dir = size, device, dtype, tokens, model_dir
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.model: Qwen3OmniMoeForConditionalGeneration | None = None
        if model_dir is not None:
            self.tokenizer = load_tokenizer(model_dir)
            self.renderer = PromptRenderer.from_pretrained(model_dir, tokenizer=self.tokenizer)
        else:
            self.tokenizer = build_tokenizer()
            self.renderer = PromptRenderer(
                self.tokenizer, dev_feature_extractor(), n_window=50, image_processor=dev_image_processor()
            )
        hello = read_wav(FIXTURES / "hello.wav")
        self.spoken = self.renderer.render(
            Conversation(items=(UserText("hi there"), AssistantText("Hello! How can I help?"), UserAudio(hello)))
        )
        ten_seconds = np.resize(hello, PREFILL_AUDIO_S * SPEECH_RATE)
        self.long_audio = self.renderer.render(Conversation(items=(UserAudio(ten_seconds),)))

    def build(self) -> str:
        started = time.perf_counter()
        if self.model_dir is not None:
            model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
                self.model_dir, dtype=self.dtype, device_map=self.device
            )
        elif self.size == "full":
            previous = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
            try:
                with torch.device(self.device):
                    model = Qwen3OmniMoeForConditionalGeneration(instruct_config())
                    initialise_talker_experts(model)
            finally:
                torch.set_default_dtype(previous)
            model.generation_config = dev_generation_config()
        else:
            model = dev_model(seed=SEED).to(device=self.device, dtype=self.dtype)
        self.model = model.eval()
        self.sync()
        parameters = sum(p.numel() for p in model.parameters())
        memory = f", {torch.cuda.memory_allocated() / 2**30:.1f} GiB on the device" if self.device.startswith("cuda") else ""
        return f"{parameters / 1e9:.2f} B parameters{memory}, built in {time.perf_counter() - started:.1f} s"

    def params(self, seed: int = SEED) -> GenerationParams:
        tokens = self.tokens
        return GenerationParams(
            temperature=TEMPERATURE,
            seed=seed,
            force_output_tokens=tokens,
            max_output_tokens=tokens,
            talker_frames_per_token=FRAMES_PER_TOKEN,
            max_audio_frames=FRAMES_PER_TOKEN * tokens,
        )

    def timed(self, action: Callable[[], object], runs: int = 3) -> float:
        """Median wall seconds of ``runs`` calls after one warm-up (kernels, allocator)."""
        action()
        seconds = []
        for _ in range(runs):
            self.sync()
            started = time.perf_counter()
            action()
            self.sync()
            seconds.append(time.perf_counter() - started)
        return statistics.median(seconds)

    def processor(self) -> tuple[Qwen3OmniMoeProcessor, str]:
        """The real processor of ``--model``, else transformers' processor class holding the dev
        tokenizer, feature extractor and image processor, and Qwen's template (no video processor:
        none of the conversations has video)."""
        if self.model_dir is not None:
            return Qwen3OmniMoeProcessor.from_pretrained(self.model_dir), "the checkpoint's processor"
        processor = ProcessorWithoutVideo(
            image_processor=dev_image_processor(),
            video_processor=None,
            feature_extractor=dev_feature_extractor(),
            tokenizer=self.tokenizer,
            chat_template=QWEN_TEMPLATE,
        )
        return processor, "Qwen3OmniMoeProcessor with the dev tokenizer and Qwen's template"

    def processor_ids(self) -> str:
        processor, source = self.processor()
        chat_template = processor.chat_template
        if not isinstance(chat_template, str):
            raise RuntimeError(f"the processor has no single chat template: {type(chat_template).__name__}")
        parts, different = [], 0
        for name, make in FIVE_CONVERSATIONS.items():
            case = make()
            ours = self.renderer.render_request(case.request).input_ids[0].tolist()
            media: dict[str, list] = {}
            if case.clips:
                media["audio"] = [clip.pcm for clip in case.clips]
            if case.images:
                media["images"] = [decode_rgb(image.data) for image in case.images]
            theirs = processor(text=template_text(processor.tokenizer, case, chat_template), **media)["input_ids"][0]
            theirs = [int(token) for token in theirs]
            if ours == theirs:
                parts.append(f"{name} {len(ours)}")
                continue
            different += 1
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
            parts.append(f"{name}: first difference at token {at} of {len(ours)} (processor: {len(theirs)} tokens)")
        figures = f"{len(parts) - different}/{len(parts)} equal ({'; '.join(parts)}), {source}"
        if different:
            raise RuntimeError(figures)
        return figures

    def generation_config(self) -> str:
        """The checkpoint's generation_config.json as it is, and what the engine samples with."""
        if self.model_dir is not None:
            path = self.model_dir / "generation_config.json"
            raw = json.dumps(json.loads(path.read_text()), ensure_ascii=False) if path.exists() else "(no file)"
            config = self.require_model().generation_config
            origin = f"{path.name}: {raw}"
        else:
            config = self.require_model().generation_config
            origin = f"the {self.size} model's (no --model): {json.dumps(config.to_diff_dict(), ensure_ascii=False)}"
        thinker = thinker_sampling(config, None)
        talker = talker_sampling(config)
        return (
            f"{origin}; the engine samples the Thinker at temperature {thinker.temperature}, top_k {thinker.top_k}, "
            f"top_p {thinker.top_p}, repetition penalty {thinker.repetition_penalty}"
            f"{'' if thinker.do_sample else ' (greedy)'}; the Talker at temperature {talker.temperature}, "
            f"top_k {talker.top_k}, top_p {talker.top_p}, repetition penalty {talker.repetition_penalty}"
        )

    def greedy_params(self, *, output_audio: bool = True, max_tokens: int | None = None) -> GenerationParams:
        """Both stages greedy; random weights get a forced answer length (a trained model ends by itself)."""
        tokens = max_tokens or self.tokens
        forced = self.model_dir is None and output_audio
        return GenerationParams(
            temperature=0,
            talker_do_sample=False,
            output_audio=output_audio,
            max_output_tokens=tokens,
            max_audio_frames=FRAMES_PER_TOKEN * tokens,
            force_output_tokens=tokens if forced else None,
            talker_frames_per_token=FRAMES_PER_TOKEN if forced else None,
        )

    def stream_vs_generate(self) -> str:
        """A greedy turn streamed and through ``generate()``: the same text and codec frames."""
        model, inputs, tokens = self.require_model(), self.spoken, self.tokens
        forced = self.model_dir is None
        frames = FRAMES_PER_TOKEN * tokens
        with CodeRecorder(model) as streamed:
            events = list(stream_generation(
                model, self.tokenizer, inputs,
                dataclasses.replace(self.greedy_params(), talker_frames_per_token=None), lambda: False,
            ))
        done = events[-1]
        if not isinstance(done, GenerationDone):
            raise RuntimeError(f"the stream ended with {done!r}")
        media: dict[str, torch.Tensor] = {}
        if inputs.input_features is not None:
            media = {"input_features": inputs.input_features, "feature_attention_mask": inputs.feature_attention_mask}
        with CodeRecorder(model) as generated, torch.inference_mode():
            sequences, _ = model.generate(
                input_ids=inputs.input_ids.to(self.device),
                attention_mask=inputs.attention_mask.to(self.device),
                **{key: value.to(self.device) for key, value in media.items()},
                thinker_max_new_tokens=tokens,
                thinker_min_new_tokens=tokens if forced else 0,
                thinker_do_sample=False,
                thinker_repetition_penalty=model.generation_config.repetition_penalty,
                thinker_eos_token_id=[IM_END, END_OF_TEXT],
                talker_do_sample=False,
                talker_min_new_tokens=max(tokens - 1, 0) if forced else 0,
                talker_max_new_tokens=frames + 1,  # the last sampled code never becomes a frame
            )
        answer = self.tokenizer.decode(sequences[0, inputs.input_ids.shape[1]:].tolist(), skip_special_tokens=True)
        ours, theirs = streamed.codes(), generated.codes()
        equal_frames = 0
        for frame in range(min(ours.shape[-1], theirs.shape[-1])):
            if not torch.equal(ours[..., frame], theirs[..., frame]):
                break
            equal_frames += 1
        same_text = done.text == answer
        figures = (
            f"text {'equal' if same_text else 'differs'} ({done.usage.output_text_tokens} tokens); codec frames "
            f"{equal_frames} of {theirs.shape[-1]} equal from the first (stream: {ours.shape[-1]})"
        )
        if not same_text or equal_frames != ours.shape[-1] or ours.shape[-1] != theirs.shape[-1]:
            raise RuntimeError(f"{figures}; stream {done.text!r}, generate() {answer!r}")
        return figures

    def asr_round_trip(self) -> str:
        """The model's spoken answer to the spoken conversation, transcribed by the model."""
        model = self.require_model()
        events = list(stream_generation(model, self.tokenizer, self.spoken, self.greedy_params(), lambda: False))
        said = events[-1]
        if not isinstance(said, GenerationDone):
            raise RuntimeError(f"the answer ended with {said!r}")
        speech = np.concatenate([event.pcm for event in events if isinstance(event, AudioChunk)])
        request = GenerationRequest.transcription(UserAudio(resample(speech, VOICE_RATE, SPEECH_RATE)))
        heard_events = list(stream_generation(
            model, self.tokenizer, self.renderer.render_request(request),
            self.greedy_params(output_audio=False, max_tokens=request.max_output_tokens), lambda: False,
        ))
        heard = heard_events[-1]
        if not isinstance(heard, GenerationDone):
            raise RuntimeError(f"the transcription ended with {heard!r}")
        error = word_error_rate(said.text, heard.text)
        figures = f"WER {error:.2f} over {len(words(said.text))} words said in {len(speech) / VOICE_RATE:.1f} s"
        if self.model_dir is None:
            return f"{figures} (random weights: the figure says nothing of the model)"
        if error > ASR_MAX_WER:
            raise RuntimeError(f"{figures}: said {said.text!r}, heard {heard.text!r}")
        return f"{figures}: said {said.text!r}, heard {heard.text!r}"

    def prefill(self) -> str:
        model = self.require_model()

        def once() -> None:
            batch: DecodeBatch[str] = DecodeBatch(model, self.tokenizer)
            with torch.inference_mode():
                batch.prefill_thinker("turn", self.long_audio, self.params())

        seconds = self.timed(once)
        inputs = self.long_audio
        return (
            f"{seconds * 1000:.0f} ms for {inputs.input_ids.shape[1]} prompt tokens "
            f"({inputs.audio_tokens} of them audio, {PREFILL_AUDIO_S} s)"
        )

    def ttfa(self) -> str:
        model = self.require_model()

        def first_audio() -> None:
            stop = False
            for event in stream_generation(model, self.tokenizer, self.spoken, self.params(), lambda: stop):
                if isinstance(event, AudioChunk):
                    stop = True

        return f"{self.timed(first_audio) * 1000:.0f} ms to the first audio chunk (4 frames)"

    def frame_cost(self) -> str:
        model = self.require_model()
        measure_turn(model, self.tokenizer, self.spoken, 4, 4 * FRAMES_PER_TOKEN, sync=self.sync)  # warm-up
        report = measure_turn(
            model,
            self.tokenizer,
            self.spoken,
            self.tokens,
            FRAMES_PER_TOKEN * self.tokens,
            talker_frames_per_token=FRAMES_PER_TOKEN,
            sync=self.sync,
        )
        wall = {stage: values["wall"] for stage, values in report["ms_per_frame"].items()}
        return (
            f"ms per frame: thinker token {wall['thinker step']:.1f}, talker step {wall['talker step']:.1f}, "
            f"code predictor {wall['code predictor']:.1f}, code2wav {wall['code2wav']:.1f}, "
            f"total {wall['frame total']:.1f} ({report['frames']} frames, RTF {report['rtf']['wall']:.2f})"
        )

    def concurrent(self) -> str:
        model = self.require_model()
        parts = []
        for turns in CONCURRENT_TURNS:
            frames, seconds = self._decode_together(model, turns)
            audio_s = frames / turns * FRAME_S
            parts.append(f"{turns}: RTF {seconds / audio_s:.2f} ({frames / seconds:.0f} frames/s)")
        return "; ".join(parts)

    def _decode_together(self, model, turns: int) -> tuple[int, float]:
        """``turns`` forced turns joining one DecodeBatch at once, decoded to the end: (frames, wall s)."""
        batch: DecodeBatch[int] = DecodeBatch(model, self.tokenizer)
        frames = 0
        self.sync()
        started = time.perf_counter()
        with torch.inference_mode():
            batch.prefill_thinkers([(key, self.spoken, self.params(seed=key)) for key in range(turns)])
            batch.prefill_talkers([key for key in range(turns) if batch.wants_talker(key)])
            while batch.keys:
                batch.step_thinker()
                batch.step_talker()
                if batch.chunks_due():
                    batch.decode_chunks()
                for key in batch.finished_keys():
                    frames += batch.finish(key).usage.output_audio_tokens
        self.sync()
        return frames, time.perf_counter() - started

    def code2wav(self) -> str:
        code2wav = self.require_model().code2wav
        config = code2wav.config
        generator = torch.Generator().manual_seed(SEED)
        codes = torch.randint(
            0, config.codebook_size, (1, config.num_quantizers, CODE2WAV_FRAMES), generator=generator
        ).to(self.device)
        schedule, start = [], 0
        for size in CODE2WAV_SCHEDULE:
            size = min(size, CODE2WAV_FRAMES - start)
            if size > 0:
                schedule.append(size)
                start += size
        stream = StreamingCode2Wav(code2wav)

        def streamed() -> torch.Tensor:
            with torch.inference_mode():
                return stream.decode_in_chunks(codes, schedule)

        def whole() -> torch.Tensor:
            with torch.inference_mode():
                return code2wav(codes)[0, 0]

        stream_s, whole_s = self.timed(streamed, runs=1), self.timed(whole, runs=1)
        got, expected = streamed().float(), whole().float()
        error = ((got - expected).abs().max() / expected.abs().max()).item()
        return (
            f"chunks of 4 then 25 vs one decode of {CODE2WAV_FRAMES} frames: max relative error {error:.1e}; "
            f"{stream_s / CODE2WAV_FRAMES * 1000:.2f} ms per frame streamed, {whole_s / CODE2WAV_FRAMES * 1000:.2f} whole"
        )

    def require_model(self) -> Qwen3OmniMoeForConditionalGeneration:
        if self.model is None:
            raise RuntimeError("the model was not built")
        return self.model


class ProcessorWithoutVideo(Qwen3OmniMoeProcessor):
    """transformers' Qwen3-Omni processor with no video processor: the video processors' base class
    imports torchvision, which does not load beside the CPU torch (docs/MODEL.md, "Images")."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


class CodeRecorder:
    """The codes every Code2Wav call decodes (whole or chunk by chunk), as a context manager."""

    def __init__(self, model: Qwen3OmniMoeForConditionalGeneration) -> None:
        self._model = model
        self._calls: list[torch.Tensor] = []

    def __enter__(self) -> CodeRecorder:
        offset = self._model.code2wav.code_offset
        self._handle = self._model.code2wav.code_embedding.register_forward_pre_hook(
            lambda _module, args: self._calls.append((args[0] - offset).cpu())
        )
        return self

    def __exit__(self, *_exc: object) -> None:
        self._handle.remove()

    def codes(self) -> torch.Tensor:
        """[1, quantizers, frames]: every call's frames in order (none: zero frames)."""
        if not self._calls:
            quantizers = self._model.code2wav.config.num_quantizers
            return torch.zeros((1, quantizers, 0), dtype=torch.long)
        return torch.cat(self._calls, dim=-1)


def resample(pcm: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    """Band-limited resampling by the FFT (the GPU image has no soxr): ample for an ASR check."""
    length = round(len(pcm) * target_rate / source_rate)
    spectrum = np.fft.rfft(pcm.astype(np.float64))[: length // 2 + 1]
    return (np.fft.irfft(spectrum, length) * length / len(pcm)).astype(np.float32)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's words (1.0 for an empty reference heard as words)."""
    said, heard = words(reference), words(hypothesis)
    row = list(range(len(heard) + 1))
    for i, word in enumerate(said, start=1):
        previous, row[0] = row[0], i
        for j, other in enumerate(heard, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != other))
    return row[-1] / max(len(said), 1)


def qwen_files(model_dir: Path | None) -> str:
    """The checkpoint's files against the published sha256, and its chat template against the fixture."""
    fixture = hashlib.sha256(QWEN_TEMPLATE.encode()).hexdigest()
    if model_dir is None:
        return f"no --model: the checkpoint's files are not read (template fixture sha256 {fixture[:12]})"
    published = json.loads((QWEN_FILES / "published_sha256.json").read_text())
    parts = []
    for name, expected in published["sha256"].items():
        path = model_dir / name
        actual = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
        parts.append(f"{name} " + ("missing" if actual is None else "= published" if actual == expected
                                   else f"differs ({actual[:12]})"))
    # Qwen publishes chat_template.json; transformers 5 saves chat_template.jinja.
    template_json, template_jinja = model_dir / "chat_template.json", model_dir / "chat_template.jinja"
    if template_json.exists():
        theirs = json.loads(template_json.read_text())["chat_template"]
    elif template_jinja.exists():
        theirs = template_jinja.read_text()
    else:
        raise RuntimeError("; ".join([*parts, "no chat_template.json"]))
    same = theirs.rstrip("\n") == QWEN_TEMPLATE.rstrip("\n")
    parts.append("chat template " + ("= the fixture" if same else "DIFFERS from the fixture"))
    if not same:
        raise RuntimeError("; ".join(parts))
    return f"{'; '.join(parts)} (published revision {published['revision'][:12]})"


async def engine_turn(model_dir: Path, device: str, dtype: str, tokens: int) -> str:
    """One spoken turn through the engine process, twice: after the engine's warm-up (pipeline/local/warmup.py)
    the first should cost what the second does (its TTFA is reported beside the second's)."""
    started = time.perf_counter()
    generation = {"force_output_tokens": tokens, "talker_frames_per_token": FRAMES_PER_TOKEN,
                  "max_audio_frames": FRAMES_PER_TOKEN * tokens}
    engine = TransformersEngine(model_dir, device=device, dtype=dtype, seed=0, threads=1, generation=generation)
    request = GenerationRequest(conversation=Conversation(items=(UserAudio(read_wav(FIXTURES / "hello.wav")),)),
                          max_output_tokens=tokens)
    try:
        await engine.start()
        loaded_s = time.perf_counter() - started
        warm_up = engine.describe()["warm_up"] or {}
        first_audios: list[float] = []
        for _ in range(2):
            chunks, first_audio_s, done = [], None, None
            turn_started = time.perf_counter()
            async for event in engine.run_generation(request):
                if isinstance(event, AudioChunk):
                    first_audio_s = first_audio_s or time.perf_counter() - turn_started
                    chunks.append(event.pcm)
                elif isinstance(event, GenerationDone):
                    done = event
                elif not isinstance(event, TextDelta):
                    raise RuntimeError(f"unexpected event {event!r}")
            turn_s = time.perf_counter() - turn_started
            if first_audio_s is not None:
                first_audios.append(first_audio_s)
    finally:
        await engine.close()
    if done is None or first_audio_s is None:
        raise RuntimeError("the turn ended without audio or without a GenerationDone")
    audio = np.concatenate(chunks)
    if not np.isfinite(audio).all():
        raise RuntimeError("the answer's audio holds NaN or infinity")
    rms_dbfs = 20 * np.log10(max(float(np.sqrt(np.mean(audio**2))), 1e-12))
    if rms_dbfs < -60:
        raise RuntimeError(f"the answer is silent ({rms_dbfs:.0f} dBFS)")
    audio_s = len(audio) / VOICE_RATE
    return (
        f"engine start {loaded_s:.1f} s (warm-up {warm_up.get('ms', 0):.0f} ms), TTFA first turn "
        f"{first_audios[0] * 1000:.0f} ms, second {first_audio_s * 1000:.0f} ms, turn {turn_s:.2f} s, "
        f"{done.usage.output_text_tokens} tokens, audio {audio_s:.2f} s (RTF {turn_s / audio_s:.2f}), {rms_dbfs:.0f} dBFS"
    )


def step(name: str, action: Callable[[], str], started: float) -> Row:
    if time.perf_counter() - started > BUDGET_S:
        return Row(name, "skipped", 0.0, f"the {BUDGET_S} s budget is spent")
    print(f"gpu-check: {name}", flush=True)
    began = time.perf_counter()
    try:
        figures, status = action(), "ok"
    except Exception as exc:  # every failure becomes a row of the table, and the exit status
        figures, status = f"{type(exc).__name__}: {exc}", "FAIL"
    return Row(name, status, time.perf_counter() - began, figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["full", "dev"], default=None, help="default: full on CUDA, dev on CPU")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                        help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--tokens", type=int, default=None,
                        help="forced answer length, spoken over 3 frames each (default: 24 on CUDA, 8 on CPU)")
    parser.add_argument("--out", type=Path, default=None, help="where the JSON result goes (default: a temp dir)")
    parser.add_argument("--model", type=Path, default=None,
                        help="a real checkpoint directory: its weights, tokenizer and processor (default: random weights)")
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    size = args.size or ("full" if on_gpu else "dev")
    dtype_name = args.dtype or ("bfloat16" if on_gpu else "float32")
    if on_gpu and not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible (torch.cuda.is_available() is false); "
              "use --device cpu for a dry run", file=sys.stderr)
        return 2
    if size == "full" and not on_gpu and args.model is None:
        print("gpu-check: --size full needs ~71 GB of device memory in bfloat16; on a CPU use --size dev", file=sys.stderr)
        return 2
    if not on_gpu:
        torch.set_num_threads(1)  # as the benches and the engine on a CPU: no spinning threads on a shared box
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)

    started = time.perf_counter()
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    weights = f"checkpoint {args.model}" if args.model is not None else f"{size} size"
    rows = [Row("device", "ok", 0.0,
                f"{device_name}, torch {torch.__version__}, transformers {transformers.__version__}, {weights}, {dtype_name}")]
    tokens = args.tokens or (24 if on_gpu else 8)
    check = Check(size, args.device, getattr(torch, dtype_name), tokens, args.model)
    rows.append(step("Qwen's files", lambda: qwen_files(args.model), started))
    rows.append(step("processor ids, 5 conversations", check.processor_ids, started))
    build = step("build", check.build, started)
    rows.append(build)
    if build.status == "ok":
        rows.append(step("generation config", check.generation_config, started))
    if size == "dev" and args.model is None:
        def turn() -> str:
            model_dir = ensure_dev_model(REPO / ".cache" / "gpu-check", progress=lambda m: print(f"gpu-check: {m}"))
            return asyncio.run(asyncio.wait_for(engine_turn(model_dir, args.device, dtype_name, tokens),
                                                ENGINE_TURN_TIMEOUT_S))
        rows.append(step("engine turn", turn, started))
    if build.status == "ok":
        rows.append(step(f"greedy stream vs generate(), {dtype_name}", check.stream_vs_generate, started))
        rows.append(step("ASR round trip", check.asr_round_trip, started))
        rows.append(step(f"thinker prefill, {PREFILL_AUDIO_S} s audio", check.prefill, started))
        rows.append(step("TTFA", check.ttfa, started))
        rows.append(step("per-frame cost", check.frame_cost, started))
        rows.append(step("streaming RTF, turns together", check.concurrent, started))
        rows.append(step("code2wav streaming", check.code2wav, started))

    total_s = time.perf_counter() - started
    width = max(len(row.step) for row in rows)
    print(f"\ngpu-check on {device_name} ({weights}, {dtype_name}), {total_s:.0f} s in all; JSON in {out}")
    print(f"{'step':<{width}}  {'result':<7} {'seconds':>7}  figures")
    for row in rows:
        print(f"{row.step:<{width}}  {row.status:<7} {row.seconds:>7.1f}  {row.figures}")
    (out / "gpu_check.json").write_text(json.dumps(
        {"size": size, "model": None if args.model is None else str(args.model), "device": device_name,
         "dtype": dtype_name, "seconds": total_s, "rows": [row.__dict__ for row in rows]},
        indent=2) + "\n")
    return 1 if any(row.status != "ok" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
