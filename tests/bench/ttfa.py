"""Time to first audio: streaming stream_generation vs. the plain generate() it replaces.

Run: .venv/bin/python tests/bench/ttfa.py [--tokens 16 64 256] [--frames-per-token 3]
     [--probes 5] [--threads 1] [--model DIR] [--device cpu] [--dtype float32]
     [--out tests/bench/results/ttfa.json]

One spoken user turn (tests/fixtures/hello.wav after a short text exchange), rendered by the
real PromptRenderer, answered with forced lengths of N Thinker tokens, both ways in the same
process, side by side:

- stream: ``stream_generation``; time to the first AudioChunk (median of ``--probes`` turns that are
  cancelled right after it, interleaved across lengths), and from one full turn: time to
  first text, to the GenerationDone, and the real-time factor (turn time / seconds of audio).
- generate: ``model.generate()``; its audio exists only when it returns, so its time to first
  audio is its total time.

Forced lengths: random weights almost never sample ``<|im_end|>``, nor codec EOS. The Thinker's
EOS is suppressed until N tokens and N is also the limit (stream: ``force_output_tokens=N,
max_output_tokens=N``; generate: ``thinker_min_new_tokens=N, thinker_max_new_tokens=N``). The
Talker's codec EOS is suppressed until it has consumed the whole text (stream: implied by
``force_output_tokens``; generate: ``talker_min_new_tokens=N-1``), and both are capped at
``frames_per_token * N`` codec frames (stream: ``max_audio_frames``; generate:
``talker_max_new_tokens`` one higher, as its last sampled code never becomes a frame). Three
frames per token is roughly speech: 12.5 frames/s against ~4 text tokens/s. Sampling is each
path's default (Thinker temperature 0.8 with the checkpoint's top-k/top-p/repetition penalty,
Talker as generate()), same seed for both. Default is the dev model on CPU, one thread.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from harness import machine, read_wav, write_report  # this folder: a script's is first on sys.path
from transformers import PreTrainedTokenizerBase, Qwen3OmniMoeForConditionalGeneration

import pipeline.local.devmodel
import pipeline.local.tokenizer
from media.rates import VOICE_RATE
from pipeline.contract import AudioChunk, GenerationDone, TextDelta
from pipeline.conversation import AssistantText, Conversation, UserAudio, UserText
from pipeline.local.devmodel import ensure_dev_model
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import PromptRenderer, ThinkerInputs
from pipeline.local.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
TEMPERATURE = 0.8
SEED = 0


def dev_model_fingerprint() -> str:
    """Changes with what the dev model is built from, so a stale build is never measured."""
    digest = hashlib.sha256(transformers.__version__.encode())
    for module in (pipeline.local.devmodel, pipeline.local.tokenizer):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:12]


def add_model_options(parser: argparse.ArgumentParser, out: str) -> None:
    """The options of each bench that runs the model in this process: ``--threads``, ``--model``,
    ``--device``, and ``--out`` (default: ``out`` under tests/bench/results)."""
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: the dev model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "results" / out)


def checkpoint(args: argparse.Namespace) -> Path:
    """``--model``, or the dev model (built once per :func:`dev_model_fingerprint`)."""
    return args.model or ensure_dev_model(REPO / ".cache" / "bench" / dev_model_fingerprint(), progress=print)


def model_name(args: argparse.Namespace) -> str:
    """The checkpoint as a result file names it: the dev model's version, or ``--model``."""
    return f"dev model v{pipeline.local.devmodel.DEV_MODEL_VERSION}" if args.model is None else str(args.model)


def loaded_model(
    args: argparse.Namespace,
) -> tuple[Qwen3OmniMoeForConditionalGeneration, PreTrainedTokenizerBase, ThinkerInputs]:
    """The model (``--dtype``, on ``--device``, ``--threads`` torch threads), its tokenizer, and
    :func:`spoken_turn` rendered for it."""
    torch.set_num_threads(args.threads)
    model_dir = checkpoint(args)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    model = model.to(args.device).eval()
    return model, load_tokenizer(model_dir), spoken_turn(PromptRenderer.from_pretrained(model_dir))


def spoken_turn(renderer: PromptRenderer) -> ThinkerInputs:
    pcm = read_wav(FIXTURES / "hello.wav")
    conversation = Conversation(items=(UserText("hi there"), AssistantText("Hello! How can I help?"), UserAudio(pcm)))
    return renderer.render(conversation)


class Clock:
    """Wall time and this process's CPU time since creation.

    The development machine is shared: wall time includes waiting for a core, CPU time (one
    thread) is the compute itself. Both are reported.
    """

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self._wall, time.process_time() - self._cpu


def stream_params(tokens: int, frames: int) -> GenerationParams:
    return GenerationParams(
        temperature=TEMPERATURE,
        seed=SEED,
        force_output_tokens=tokens,
        max_output_tokens=tokens,
        max_audio_frames=frames,
    )


def probe_first_audio(model, tokenizer, inputs: ThinkerInputs, tokens: int, frames: int) -> tuple[float, float]:
    """(wall, cpu) seconds to the first AudioChunk; the turn is cancelled right after it."""
    heard = False
    clock = Clock()
    for event in stream_generation(model, tokenizer, inputs, stream_params(tokens, frames), lambda: heard):
        if isinstance(event, AudioChunk):
            first_audio = clock.read()
            heard = True
    return first_audio


def measure_stream(model, tokenizer, inputs: ThinkerInputs, tokens: int, frames: int) -> dict:
    first_text = first_audio = None
    samples = 0
    clock = Clock()
    for event in stream_generation(model, tokenizer, inputs, stream_params(tokens, frames), lambda: False):
        if isinstance(event, TextDelta) and first_text is None:
            first_text = clock.read()
        elif isinstance(event, AudioChunk):
            first_audio = first_audio or clock.read()
            samples += len(event.pcm)
        elif isinstance(event, GenerationDone):
            done = event
    usage = done.usage
    return result(first_text, first_audio, clock.read(), samples, usage.output_text_tokens, usage.output_audio_tokens)


def measure_generate(model, inputs: ThinkerInputs, tokens: int, frames: int) -> dict:
    config = model.generation_config
    torch.manual_seed(SEED)
    clock = Clock()
    # generate() takes its inputs where the model is (stream_generation moves them itself).
    sequences, waveform = model.generate(
        input_ids=inputs.input_ids.to(model.device),
        attention_mask=inputs.attention_mask.to(model.device),
        input_features=inputs.input_features.to(model.device, model.dtype),
        feature_attention_mask=inputs.feature_attention_mask.to(model.device),
        speaker="ethan",
        thinker_do_sample=True,
        thinker_temperature=TEMPERATURE,
        thinker_top_k=config.top_k,
        thinker_top_p=config.top_p,
        thinker_repetition_penalty=config.repetition_penalty,
        thinker_min_new_tokens=tokens,
        thinker_max_new_tokens=tokens,
        # force_output_tokens=N holds codec EOS for the Talker's first N - 1 codes.
        talker_min_new_tokens=tokens - 1,
        talker_max_new_tokens=frames + 1,
    )
    total = clock.read()
    samples = waveform.shape[-1]
    text_tokens = sequences.shape[1] - inputs.input_ids.shape[1]
    # Code2Wav's output is frames * 1920 samples less a fixed tail of under one frame.
    audio_frames = -(-samples // int(model.code2wav.total_upsample))
    # Text and audio both exist only when generate() returns.
    return result(total, total, total, samples, text_tokens, audio_frames)


def result(first_text, first_audio, total, samples, text_tokens, audio_frames) -> dict:
    """Times are (wall, cpu) pairs."""
    audio_seconds = samples / VOICE_RATE
    return {
        "first_text_s": {"wall": first_text[0], "cpu": first_text[1]},
        "first_audio_s": {"wall": first_audio[0], "cpu": first_audio[1]},
        "total_s": {"wall": total[0], "cpu": total[1]},
        "audio_s": audio_seconds,
        "rtf": {"wall": total[0] / audio_seconds, "cpu": total[1] / audio_seconds},
        "text_tokens": text_tokens,
        "audio_frames": audio_frames,
    }


def pair(value: dict, digits: int) -> str:
    return f"{value['wall']:.{digits}f} ({value['cpu']:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--frames-per-token", type=int, default=3)
    parser.add_argument("--probes", type=int, default=5, help="cancelled turns per length for stream TTFA")
    add_model_options(parser, "ttfa.json")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()

    model, tokenizer, inputs = loaded_model(args)

    # Warm-up: first calls pay one-off allocation and dispatch costs.
    measure_stream(model, tokenizer, inputs, tokens=4, frames=8)
    measure_generate(model, inputs, tokens=4, frames=8)

    # Stream TTFA: median of --probes cancelled turns per length, lengths interleaved so that
    # load from other jobs on the machine falls on all of them alike.
    probes = {tokens: [] for tokens in args.tokens}
    for _ in range(args.probes):
        for tokens in args.tokens:
            probes[tokens].append(
                probe_first_audio(model, tokenizer, inputs, tokens, args.frames_per_token * tokens)
            )
    rows = []
    for tokens in args.tokens:
        frames = args.frames_per_token * tokens
        stream = measure_stream(model, tokenizer, inputs, tokens, frames)
        stream["first_audio_median_s"] = {
            "wall": statistics.median(wall for wall, _ in probes[tokens]),
            "cpu": statistics.median(cpu for _, cpu in probes[tokens]),
            "probes": len(probes[tokens]),
        }
        generate = measure_generate(model, inputs, tokens, frames)
        rows.append({"tokens": tokens, "frames_cap": frames, "stream": stream, "generate": generate})

    by_tokens = {row["tokens"]: row for row in rows}
    ratios = {}
    if 16 in by_tokens and 256 in by_tokens:
        for clock in ("wall", "cpu"):
            short, long = by_tokens[16]["stream"], by_tokens[256]["stream"]
            ratios[f"stream_ttfa_256_over_16_{clock}"] = (
                long["first_audio_median_s"][clock] / short["first_audio_median_s"][clock]
            )
            ratios[f"stream_over_generate_ttfa_256_{clock}"] = (
                long["first_audio_median_s"][clock] / by_tokens[256]["generate"]["first_audio_s"][clock]
            )

    print(
        f"\nprompt: {inputs.text_tokens} text + {inputs.audio_tokens} audio tokens; {args.device}, "
        f"{args.threads} thread(s); wall seconds (cpu seconds); stream TTFA = median of {args.probes} probes"
    )
    header = (
        f"{'tokens':>6} {'path':>8} {'TTFT s':>14} {'TTFA s':>14} {'total s':>14} {'audio s':>7} "
        f"{'RTF':>11} {'frames':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        for path in ("stream", "generate"):
            r = row[path]
            ttfa = r.get("first_audio_median_s", r["first_audio_s"])
            print(
                f"{row['tokens']:>6} {path:>8} {pair(r['first_text_s'], 3):>14} {pair(ttfa, 3):>14} "
                f"{pair(r['total_s'], 2):>14} {r['audio_s']:>7.2f} {pair(r['rtf'], 2):>11} {r['audio_frames']:>6.0f}"
            )
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")

    report = {
        "benchmark": "ttfa",
        "command": " ".join([".venv/bin/python", "tests/bench/ttfa.py", *sys.argv[1:]]),
        "model": model_name(args),
        "machine": machine(torch=torch.__version__, threads=args.threads, device=args.device, dtype=args.dtype),
        "prompt": {"text_tokens": inputs.text_tokens, "audio_tokens": inputs.audio_tokens},
        "settings": {
            "temperature": TEMPERATURE,
            "seed": SEED,
            "frames_per_token": args.frames_per_token,
            "probes": args.probes,
        },
        "rows": rows,
        "ratios": ratios,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
