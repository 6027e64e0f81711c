"""The device check: Qwen3-Omni at its real size (random weights) or the dev model, measured on one device.

Run: scripts/gpu-check.sh [--size full|dev] [--device cuda] [--dtype bfloat16] [--tokens 24] [--out DIR]

For the day a GPU is lent (15 minutes, a bare image): it runs unattended, offline, in under 8
minutes, with only this working tree and the wheels scripts/device-wheels.sh gathered, and
prints one table (exit status 1 if a step failed). docs/GPU.md has the command and the results.

``--size full`` (the default on CUDA) builds, directly in device memory, a model with
Qwen3-Omni-30B-A3B-Instruct's exact configuration (pipeline/local/qwen3_omni_config.py) and random
weights, with the dev tokenizer: a decoding step costs what it costs with the real weights.
``--size dev`` (the default on CPU) is the tiny dev model, and adds one full turn through the
engine process. Steps, each a row of the table:

1. build: the model on the device (parameters, device memory, seconds);
2. engine turn (dev only): one spoken turn through ``TransformersEngine``, as the server runs it;
3. Thinker prefill of a spoken turn holding 10 s of audio (median of 3, after a warm-up);
4. TTFA: time to the first ``AudioChunk`` of a streamed turn (median of 3);
5. per-frame cost of a turn of ``--tokens`` answer tokens spoken over 3 frames each (a trained
   Talker's pace): Thinker token, Talker step, the code predictor's 15 passes, Code2Wav, per frame;
6. streaming RTF with 1, 4 and 8 turns decoded together (the same forced lengths): wall time
   over one turn's audio seconds (below 1: every listener's audio comes faster than it plays);
7. Code2Wav streaming: 300 random frames in chunks of 4 then 25, against one whole decode
   (relative error at this dtype) and its cost per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from transformers import Qwen3OmniMoeForConditionalGeneration  # noqa: E402

from media.rates import SPEECH_RATE, VOICE_RATE  # noqa: E402
from pipeline.contract import AudioChunk, GenerationDone, GenerationRequest, TextDelta  # noqa: E402
from pipeline.conversation import AssistantText, Conversation, UserAudio, UserText  # noqa: E402
from pipeline.local.code2wav import StreamingCode2Wav  # noqa: E402
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.devmodel import (  # noqa: E402
    dev_feature_extractor,
    dev_generation_config,
    dev_model,
    ensure_dev_model,
    initialise_talker_experts,
)
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams  # noqa: E402
from pipeline.local.prompt import PromptRenderer  # noqa: E402
from pipeline.local.qwen3_omni_config import instruct_config  # noqa: E402
from pipeline.local.tokenizer import build_tokenizer  # noqa: E402
from pipeline.local.transformers_engine import TransformersEngine  # noqa: E402

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


@dataclass
class Row:
    step: str
    status: str  # "ok", "FAIL", "skipped"
    seconds: float
    figures: str


class Check:
    """The model on the device and what every step needs: prompts, params, the clock to sync on."""

    def __init__(self, size: str, device: str, dtype: torch.dtype, tokens: int) -> None:
        self.size, self.device, self.dtype, self.tokens = size, device, dtype, tokens
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.model: Qwen3OmniMoeForConditionalGeneration | None = None
        self.tokenizer = build_tokenizer()
        self.renderer = PromptRenderer(self.tokenizer, dev_feature_extractor(), n_window=50)
        hello = read_wav(FIXTURES / "hello.wav")
        self.spoken = self.renderer.render(
            Conversation(items=(UserText("hi there"), AssistantText("Hello! How can I help?"), UserAudio(hello)))
        )
        ten_seconds = np.resize(hello, PREFILL_AUDIO_S * SPEECH_RATE)
        self.long_audio = self.renderer.render(Conversation(items=(UserAudio(ten_seconds),)))

    def build(self) -> str:
        started = time.perf_counter()
        if self.size == "full":
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
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    size = args.size or ("full" if on_gpu else "dev")
    dtype_name = args.dtype or ("bfloat16" if on_gpu else "float32")
    if on_gpu and not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible (torch.cuda.is_available() is false); "
              "use --device cpu for a dry run", file=sys.stderr)
        return 2
    if size == "full" and not on_gpu:
        print("gpu-check: --size full needs ~71 GB of device memory in bfloat16; on a CPU use --size dev", file=sys.stderr)
        return 2
    if not on_gpu:
        torch.set_num_threads(1)  # as the benches and the engine on a CPU: no spinning threads on a shared box
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)

    started = time.perf_counter()
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    rows = [Row("device", "ok", 0.0,
                f"{device_name}, torch {torch.__version__}, transformers {transformers.__version__}, {size} size, {dtype_name}")]
    tokens = args.tokens or (24 if on_gpu else 8)
    check = Check(size, args.device, getattr(torch, dtype_name), tokens)
    rows.append(step("build", check.build, started))
    if size == "dev":
        def turn() -> str:
            model_dir = ensure_dev_model(REPO / ".cache" / "gpu-check", progress=lambda m: print(f"gpu-check: {m}"))
            return asyncio.run(asyncio.wait_for(engine_turn(model_dir, args.device, dtype_name, tokens),
                                                ENGINE_TURN_TIMEOUT_S))
        rows.append(step("engine turn", turn, started))
    if rows[1].status == "ok":
        rows.append(step(f"thinker prefill, {PREFILL_AUDIO_S} s audio", check.prefill, started))
        rows.append(step("TTFA", check.ttfa, started))
        rows.append(step("per-frame cost", check.frame_cost, started))
        rows.append(step("streaming RTF, turns together", check.concurrent, started))
        rows.append(step("code2wav streaming", check.code2wav, started))

    total_s = time.perf_counter() - started
    width = max(len(row.step) for row in rows)
    print(f"\ngpu-check on {device_name} ({size} size, {dtype_name}), {total_s:.0f} s in all; JSON in {out}")
    print(f"{'step':<{width}}  {'result':<7} {'seconds':>7}  figures")
    for row in rows:
        print(f"{row.step:<{width}}  {row.status:<7} {row.seconds:>7.1f}  {row.figures}")
    (out / "gpu_check.json").write_text(json.dumps(
        {"size": size, "device": device_name, "dtype": dtype_name, "seconds": total_s, "rows": [row.__dict__ for row in rows]},
        indent=2) + "\n")
    return 1 if any(row.status != "ok" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
