"""Camera frames in a spoken turn: what they cost the time to first audio, and what one frame costs
the real vision tower.

Run: .venv/bin/python tests/bench/vision.py [--frames 0 1 4 5] [--probes 5] [--threads 1]
     [--encoder-frames 1 4] [--encoder-repeats 2] [--render-turns 9] [--skip-encoder] [--out tests/bench/results/vision.json]

sampling (media/video.py, one core): what keeping one camera frame costs the media worker:
``encode_frame`` (swscale to the session's default budget, JPEG at quality 90) of a decoded
640x480 and a 1280x720 YUV 4:2:0 frame, median of 20; it runs in a worker thread, never on the
event loop.

ttfa (dev model, CPU): one spoken turn (tests/fixtures/hello.wav after a short exchange) with N
camera frames before the audio, as a committed utterance holds them: 640x480 frames fitted to
the camera's default budget (352x256, 88 tokens each). Time to the first AudioChunk, *including*
the prompt rendering (the engine renders each turn: image decoding, Qwen's image processor,
the Whisper features), median of ``--probes`` turns cancelled right after their first audio,
interleaved across N so that load on the machine hits every N alike. N = 0 is the turn without
a camera; a default camera turn holds up to 5 (4 while speaking, 1 from before). Forced length
16 tokens, 3 codec frames per token, seeded sampling, as tests/bench/ttfa.py.

render (dev model's renderer, CPU): the engine renders every turn's prompt between decoding
steps, and past camera turns keep their frames, so turn 9 of a camera conversation holds 25
(the history keeps 5 turns: 4 past audio clips). Its render with no processed image kept, as
before pipeline/local/processed_cache.py, against its render after turn 8's (only turn 9's 5 frames
processed), median of ``--probes``.

encoder (real config, random weights, CPU, float32): Qwen3-Omni-30B-A3B-Instruct's vision tower
alone (``Qwen3OmniMoeVisionEncoder`` with the checkpoint's ``thinker_config.vision_config``,
``pipeline/local/qwen3_omni_config.py``:
27 blocks of width 1152, 16 heads, MLP 4304, 16 px patches merged 2x2, out 2048 = the Thinker's
width, deepstack after blocks 8/16/24; ~0.4 B parameters), fed 352x256 frames (352 patches, 88
tokens each) ``--encoder-frames`` at a time: seconds per call and per frame, median of
``--encoder-repeats``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import av
import numpy as np
import soundfile as sf
import torch
from harness import machine, write_report  # this folder: a script's is first on sys.path
from PIL import Image
from transformers import Qwen3OmniMoeForConditionalGeneration
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from media.video import encode_frame  # noqa: E402
from pipeline.contract import AudioChunk  # noqa: E402
from pipeline.conversation import AssistantText, Conversation, UserAudio, UserImage, UserText  # noqa: E402
from pipeline.images import fit as fit_image  # noqa: E402
from pipeline.images import fitted_size, probe  # noqa: E402
from pipeline.local.devmodel import ensure_dev_model  # noqa: E402
from pipeline.local.generation import stream_generation  # noqa: E402
from pipeline.local.params import GenerationParams  # noqa: E402
from pipeline.local.processed_cache import IMAGE_CACHE_BYTES, ProcessedCache  # noqa: E402
from pipeline.local.prompt import PromptRenderer  # noqa: E402
from pipeline.local.qwen3_omni_config import vision_encoder_config  # noqa: E402
from pipeline.local.tokenizer import load_tokenizer  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
CAMERA_PIXELS = 100_352  # the session's default camera budget (app/realtime/session_config.py)
TOKENS, FRAMES_PER_TOKEN = 16, 3


def camera_frame(seed: int) -> UserImage:
    """A 640x480 camera frame as the session keeps it: fitted to the default budget, JPEG."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(480, 640, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    data = out.getvalue()
    fitted, width, height = fit_image(data, probe(data), CAMERA_PIXELS)
    return UserImage(fitted, width, height, CAMERA_PIXELS)


def spoken_turn(frames: int) -> Conversation:
    pcm, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
    images = tuple(camera_frame(seed) for seed in range(frames))
    return Conversation(items=(UserText("hi there"), AssistantText("Hello! How can I help?"), *images, UserAudio(pcm)))


def camera_conversation(turns: int, frames: int) -> Conversation:
    """``turns`` spoken camera turns, each ``frames`` new frames then hello.wav, all but the last answered."""
    pcm, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
    items: list = []
    for turn in range(turns):
        items += [camera_frame(1_000 + turn * frames + index) for index in range(frames)]
        items.append(UserAudio(pcm))
        if turn < turns - 1:
            items.append(AssistantText("Sure, I can see that."))
    return Conversation(items=tuple(items))


def measure_render(turns: int, frames: int, repeats: int) -> dict:
    """The engine's render of a camera turn after ``turns - 1`` camera turns: with no image kept
    (every past frame processed again, as before pipeline/local/processed_cache.py), and after the turn
    before was rendered (only the new turn's frames processed). Median of ``repeats``."""
    model_dir = ensure_dev_model(Path.home() / ".cache" / "omni-rtc")
    renderer = PromptRenderer.from_pretrained(model_dir)
    previous, current = camera_conversation(turns - 1, frames), camera_conversation(turns, frames)
    cold, warm = [], []
    for _ in range(repeats):
        renderer.processed_images = ProcessedCache(max_bytes=0)
        started = time.perf_counter()
        inputs = renderer.render(current)
        cold.append(time.perf_counter() - started)
        renderer.processed_images = ProcessedCache(IMAGE_CACHE_BYTES)
        renderer.render(previous)
        processed_before = renderer.processed_images.misses
        started = time.perf_counter()
        renderer.render(current)
        warm.append(time.perf_counter() - started)
        processed = renderer.processed_images.misses - processed_before
    assert inputs.image_grid_thw is not None
    return {
        "turns": turns,
        "frames_per_turn": frames,
        "frames_in_prompt": len(inputs.image_grid_thw),
        "image_tokens": inputs.image_tokens,
        "nothing_kept_ms": round(statistics.median(cold) * 1000, 1),
        "past_frames_kept_ms": round(statistics.median(warm) * 1000, 1),
        "frames_processed_when_kept": processed,
    }


def first_audio_seconds(model, tokenizer, renderer: PromptRenderer, conversation: Conversation) -> tuple[float, int]:
    """Wall seconds from rendering the prompt to the first AudioChunk, and the prompt's image tokens."""
    params = GenerationParams(
        seed=0, force_output_tokens=TOKENS, max_output_tokens=TOKENS, max_audio_frames=FRAMES_PER_TOKEN * TOKENS
    )
    heard = False
    started = time.perf_counter()
    inputs = renderer.render(conversation)
    for event in stream_generation(model, tokenizer, inputs, params, lambda: heard):
        if isinstance(event, AudioChunk) and not heard:
            first_audio = time.perf_counter() - started
            heard = True
    return first_audio, inputs.image_tokens


def measure_ttfa(frame_counts: list[int], probes: int) -> list[dict]:
    model_dir = ensure_dev_model(Path.home() / ".cache" / "omni-rtc")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(model_dir)
    renderer = PromptRenderer.from_pretrained(model_dir, tokenizer=tokenizer)
    renderer.processed_images = ProcessedCache(max_bytes=0)  # every probe's frames are new, as a new turn's
    turns = {count: spoken_turn(count) for count in frame_counts}
    for count in frame_counts:  # warm-up: first calls pay for lazy initialisation
        first_audio_seconds(model, tokenizer, renderer, turns[count])
    seconds: dict[int, list[float]] = {count: [] for count in frame_counts}
    tokens: dict[int, int] = {}
    for _ in range(probes):
        for count in frame_counts:
            elapsed, tokens[count] = first_audio_seconds(model, tokenizer, renderer, turns[count])
            seconds[count].append(elapsed)
    base = statistics.median(seconds[frame_counts[0]])
    return [
        {
            "frames": count,
            "image_tokens": tokens[count],
            "first_audio_s": round(statistics.median(seconds[count]), 4),
            "probes_s": [round(value, 4) for value in seconds[count]],
            "vs_first": round(statistics.median(seconds[count]) / base, 3),
        }
        for count in frame_counts
    ]


def measure_encoder(frame_counts: list[int], repeats: int) -> list[dict]:
    config = vision_encoder_config()
    torch.manual_seed(0)
    encoder = Qwen3OmniMoeVisionEncoder._from_config(config, dtype=torch.float32).eval()
    parameters = sum(p.numel() for p in encoder.parameters())
    width, height = fitted_size(640, 480, max_pixels=CAMERA_PIXELS)
    patches_per_frame = (height // 16) * (width // 16)
    patch_values = 3 * 2 * 16 * 16
    rows = []
    for count in frame_counts:
        pixel_values = torch.randn(count * patches_per_frame, patch_values)
        grid = torch.tensor([[1, height // 16, width // 16]] * count)
        times = []
        with torch.inference_mode():
            encoder(pixel_values, grid_thw=grid)  # warm-up
            for _ in range(repeats):
                started = time.perf_counter()
                output = encoder(pixel_values, grid_thw=grid)
                times.append(time.perf_counter() - started)
        call_s = statistics.median(times)
        rows.append({
            "frames": count,
            "frame_size": f"{width}x{height}",
            "tokens_per_frame": patches_per_frame // 4,
            "output_shape": list(output.pooler_output.shape),
            "call_s": round(call_s, 3),
            "per_frame_s": round(call_s / count, 3),
            "parameters": parameters,
        })
    return rows


def measure_sampling(repeats: int = 20) -> list[dict]:
    rows = []
    for width, height in ((640, 480), (1280, 720)):
        pixels = np.random.default_rng(0).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuv420p")
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            sampled = encode_frame(frame, lambda w, h: fitted_size(w, h, max_pixels=CAMERA_PIXELS))
            times.append(time.perf_counter() - started)
        rows.append({
            "frame": f"{width}x{height}",
            "kept_as": f"{sampled.width}x{sampled.height}",
            "jpeg_bytes": len(sampled.data),
            "encode_ms": round(statistics.median(times) * 1000, 2),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, nargs="+", default=[0, 1, 4, 5])
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--encoder-frames", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--encoder-repeats", type=int, default=2)
    parser.add_argument("--render-turns", type=int, default=9, help="camera turns in the render figure (default 9)")
    parser.add_argument("--skip-encoder", action="store_true", help="only the dev-model figures")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "results" / "vision.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    sampling = measure_sampling()
    print("keeping one camera frame (scale + JPEG, media/video.py encode_frame), median of 20")
    for row in sampling:
        print(f"  {row['frame']:>9} -> {row['kept_as']:>7}: {row['encode_ms']:.2f} ms, {row['jpeg_bytes']} bytes")
    ttfa = measure_ttfa(args.frames, args.probes)
    print("dev model, one spoken turn, time to first audio (rendering included), median of", args.probes)
    print(f"{'frames':>6} {'image tokens':>12} {'first audio s':>14} {'vs ' + str(args.frames[0]) + ' frames':>12}")
    for row in ttfa:
        print(f"{row['frames']:>6} {row['image_tokens']:>12} {row['first_audio_s']:>14.3f} {row['vs_first']:>12.2f}x")
    render = measure_render(args.render_turns, 5, args.probes)
    print(f"\ndev model, the render of camera turn {render['turns']} ({render['frames_in_prompt']} frames in the prompt, "
          f"{render['image_tokens']} image tokens), median of {args.probes}: nothing kept "
          f"{render['nothing_kept_ms']:.1f} ms; past frames kept {render['past_frames_kept_ms']:.1f} ms "
          f"({render['frames_processed_when_kept']} frames processed)")
    encoder = [] if args.skip_encoder else measure_encoder(args.encoder_frames, args.encoder_repeats)
    if encoder:
        print(f"\nreal vision tower ({encoder[0]['parameters'] / 1e6:.0f} M parameters), CPU float32, "
              f"{args.threads} thread(s), {encoder[0]['frame_size']} frames")
        print(f"{'frames':>6} {'call s':>8} {'per frame s':>12}")
        for row in encoder:
            print(f"{row['frames']:>6} {row['call_s']:>8.3f} {row['per_frame_s']:>12.3f}")
    report = {"machine": machine(threads=args.threads), "sampling": sampling, "ttfa": ttfa, "render": render,
              "encoder": encoder}
    write_report(args.out, report)


if __name__ == "__main__":
    main()
