"""``omni-rtc``: serve, build the dev model, or place calls from the command line.

argparse rather than typer: it is the standard library (typer is not a dependency of the
package), and three subcommands with repeatable flags need nothing more. Flags override
the OMNI_RTC_* environment, which overrides the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from app.config import Settings
from pipeline.local.devices import usable_cores

# Flag -> Settings field, for the flags `serve` passes on only when given.
SERVE_FLAGS = {
    "host": "host",
    "port": "port",
    "model": "model",
    "device": "device",
    "engines": "engines",
    "max_batch": "max_batch",
    "dtype": "dtype",
    "seed": "seed",
    "generation": "generation",
    "engine_threads": "engine_threads",
    "attn_implementation": "attn_implementation",
    "dev_replies": "dev_replies",
    "engine_url": "engine_urls",
    "engine_api_key": "engine_api_key",
    "cache_dir": "cache_dir",
    "turn_model": "turn_model",
    "turn_text_judge": "turn_text_judge",
    "ice_server": "ice_servers",
    "ice_loopback": "ice_loopback",
    "cors_origin": "cors_origins",
    "max_sessions": "max_sessions",
    "media_workers": "media_workers",
    "disconnect_timeout": "disconnect_timeout_s",
    "max_image_bytes": "max_image_bytes",
    "max_video_pixels": "max_video_pixels",
    "jitter_buffer": "jitter_buffer",
    "interrupt_response": "default_interrupt_response",
    "speculative_responses": "speculative_responses",
    "partial_transcripts": "partial_transcripts",
    "api_key": "api_key",
    "allow_unauthenticated_public": "allow_unauthenticated_public",
    "log_level": "log_level",
    # The edge: TLS, proxies, hosts, TURN credentials (docs/DEPLOY.md).
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "tls": "tls",
    "trusted_proxy": "trusted_proxies",
    "allowed_host": "allowed_hosts",
    "metrics_public": "metrics_public",
    "ice_username": "turn_username",
    "ice_credential": "turn_credential",
    "turn_secret": "turn_secret",
    "turn_ttl": "turn_ttl_s",
    # Bounds for every caller (docs/HARDENING.md).
    "history_max_tokens": "history_max_tokens",
    "instructions_max_tokens": "instructions_max_tokens",
    "max_prompt_tokens": "max_prompt_tokens",
    "connect_timeout": "connect_timeout_s",
    "max_connecting_per_client": "max_connecting_per_client",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-rtc", description="Talk to Qwen3-Omni over WebRTC or a WebSocket.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server (flags override OMNI_RTC_* variables)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--model", help="checkpoint directory or Hugging Face id (default: the built-in dev model)")
    serve.add_argument(
        "--device", help="torch device: auto, cpu, cuda, cuda:1 ...; a list (cuda:0,cuda:1) runs one engine per device (default auto)"
    )
    serve.add_argument("--engines", type=int, help="engine processes on the one device, e.g. several on CPU (default 1)")
    serve.add_argument("--max-batch", type=int, help="turns one engine decodes together; more wait in line (default 8)")
    serve.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    serve.add_argument("--seed", type=int, help="make turns reproducible")
    serve.add_argument(
        "--generation", type=json.loads, metavar="JSON", help='generation options for every turn, e.g. \'{"max_audio_frames": 250}\''
    )
    serve.add_argument("--engine-threads", type=int, help="torch CPU threads in the engine process")
    serve.add_argument(
        "--attn-implementation", choices=["sdpa", "eager", "flash_attention_2"], help="attention kernels (default: transformers' choice, sdpa)"
    )
    serve.add_argument(
        "--dev-replies", type=Path, metavar="FILE",
        help="a JSON list of answer texts the dev model says, one per response of each session, then its own",
    )
    serve.add_argument(
        "--engine-url", action="append", metavar="URL",
        help="run turns on this vLLM-Omni server (its API base, e.g. http://gpu-1:8091/v1) instead of the "
        "in-process engine; repeatable: each turn goes to the least loaded one",
    )
    serve.add_argument("--engine-api-key", metavar="KEY", help="the vLLM-Omni servers' API key (vllm serve --api-key)")
    serve.add_argument("--cache-dir", type=Path, help="where the dev model is built (default ~/.cache/omni-rtc)")
    serve.add_argument("--turn-model", type=Path, help="semantic_vad's end-of-turn model (default: the cache dir's)")
    serve.add_argument(
        "--turn-text-judge", choices=["off", "engine"],
        help="semantic_vad also judges the words, by Qwen3-Omni's ASR and its P(end of message) (default off)",
    )
    serve.add_argument(
        "--ice-server", action="append", metavar="URL", help="STUN/TURN server URL (stun:host:port, turn:host:port?transport=udp); repeatable"
    )
    serve.add_argument(
        "--ice-loopback",
        action="store_const",
        const=True,
        help="gather ICE candidates on 127.0.0.1 only (tests, clients on this machine)",
    )
    serve.add_argument("--cors-origin", action="append", metavar="ORIGIN", help="allow browser calls from ORIGIN; repeatable")
    serve.add_argument("--max-sessions", type=int, help="concurrent calls before 429 (default 16)")
    serve.add_argument(
        "--media-workers", type=int, metavar="N",
        help="processes that carry the calls, behind the one port (default: the usable cores, here "
        f"{usable_cores()}; 1: every call in the server process)",
    )
    serve.add_argument("--disconnect-timeout", type=float, metavar="SECONDS", help="end a call whose peer sent no media this long (default 10)")
    serve.add_argument(
        "--max-image-bytes", type=int, metavar="BYTES", help="the largest input_image a client may send (default 10 MiB)"
    )
    serve.add_argument(
        "--max-video-pixels", type=int, metavar="PIXELS",
        help="the largest camera frame decoded, in pixels (default 1920x1080 = 2073600); past it frames are dropped undecoded",
    )
    serve.add_argument(
        "--jitter-buffer", action=argparse.BooleanOptionalAction, default=None,
        help="inbound audio through omni-rtc's jitter buffer: playout deadline, FEC and PLC (default on); "
        "--no-jitter-buffer: aiortc's own receive path",
    )
    serve.add_argument(
        "--interrupt-response", action=argparse.BooleanOptionalAction, default=None,
        help="sessions barge in by default: the user's speech cancels the answer, as OpenAI's default (on); "
        "--no-interrupt-response: half-duplex unless a client asks for interrupt_response",
    )
    serve.add_argument(
        "--speculative-responses", action=argparse.BooleanOptionalAction, default=None,
        help="start each answer at the first sign of silence on spare engine capacity, held until the turn "
        "is committed (default on; a session may turn it off); --no-speculative-responses: at the commit",
    )
    serve.add_argument(
        "--partial-transcripts", action=argparse.BooleanOptionalAction, default=None,
        help="with input transcription on, transcribe the words while the user speaks too, about every second, "
        "on spare engine capacity (default on; a session may turn it off); --no-partial-transcripts: "
        "only after the commit",
    )
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (or an ek_ client secret) to place calls")
    serve.add_argument(
        "--allow-unauthenticated-public",
        action="store_const",
        const=True,
        help="allow a non-loopback --host without an API key",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    _add_edge_flags(serve)
    serve.add_argument(
        "--history-max-tokens", type=int, metavar="N",
        help="a conversation's prompt tokens after the system prompt, as estimated; past it the oldest items go (default 16000)",
    )
    serve.add_argument(
        "--instructions-max-tokens", type=int, metavar="N",
        help="a session's instructions and tools together, in tokens; past it session.update is refused (default 16000)",
    )
    serve.add_argument(
        "--max-prompt-tokens", type=int, metavar="N",
        help="the longest prompt the engine takes; a longer turn fails alone, prompt_too_long (default 32768)",
    )
    serve.add_argument("--connect-timeout", type=float, metavar="SECONDS", help="end a call whose peer never connects (default 10)")
    serve.add_argument(
        "--max-connecting-per-client", type=int, metavar="N", help="calls one client address may have still connecting (default 8)"
    )

    dev_model = commands.add_parser("dev-model", help="build the tiny random-weight Qwen3-Omni checkpoint")
    dev_model.add_argument("--out", type=Path, help="output directory (default: the cache the server uses)")
    dev_model.add_argument(
        "--layout",
        choices=["fused", "hub"],
        default="fused",
        help="fused: transformers' own (default); hub: the published checkpoint's shards and per-expert tensors",
    )

    call = commands.add_parser("call", help="call a server: say each WAV, save each answer")
    call.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    call.add_argument("--wav", type=Path, action="append", required=True, help="an utterance to say; repeatable, said in order")
    call.add_argument("--out", type=Path, required=True, help="directory for the received answers (WAV)")
    call.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    call.add_argument("--sessions", type=int, default=1, help="concurrent calls, each saying every WAV (default 1)")
    call.add_argument(
        "--video", type=Path, metavar="FILE",
        help="webrtc: send FILE as the camera, looped (a Y4M or other video, or a PNG/JPEG image)",
    )
    call.add_argument(
        "--transport", choices=["webrtc", "websocket"], default="webrtc",
        help="webrtc: POST /v1/realtime/calls and a media track (default); websocket: GET /v1/realtime, audio in events",
    )
    call.add_argument(
        "--playback-ack", action="store_true",
        help="websocket: acknowledge each answer as played (vllm-omni's playback.ack) before the next utterance",
    )
    call.add_argument("--model", help="websocket: the ?model= to ask for (the server reports the model it serves)")
    call.add_argument("--ice-loopback", action="store_true", help="gather ICE candidates on 127.0.0.1 only")
    call.add_argument(
        "--ice-server", action="append", metavar="URL",
        help="STUN server URL instead of the server's (GET /v1/realtime/ice_servers, TURN credentials included); repeatable",
    )
    call.add_argument("--session", type=json.loads, metavar="JSON", help='session config sent with the offer, e.g. \'{"max_output_tokens": 64}\'')
    call.add_argument("--api-key", help="bearer token: the server's API key or an ek_ client secret")
    call.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="for connecting and for each turn (default 120)")
    return parser


def _add_edge_flags(serve: argparse.ArgumentParser) -> None:
    """TLS, proxies, hosts and TURN credentials: how the server meets the internet (docs/DEPLOY.md)."""
    serve.add_argument("--ssl-certfile", type=Path, metavar="PEM", help="serve HTTPS/WSS with this certificate (chain)")
    serve.add_argument("--ssl-keyfile", type=Path, metavar="PEM", help="the certificate's private key")
    serve.add_argument(
        "--tls", choices=["self-signed"],
        help="self-signed: serve HTTPS with a certificate for this host's names and addresses, made once in the cache dir",
    )
    serve.add_argument(
        "--trusted-proxy", action="append", metavar="ADDR/CIDR",
        help="a reverse proxy whose X-Forwarded-For/-Proto are believed (needs an API key); repeatable",
    )
    serve.add_argument(
        "--allowed-host", action="append", metavar="NAME",
        help="a Host name to answer besides localhost and the bind address (*.example.org, or * for any); repeatable",
    )
    serve.add_argument(
        "--metrics-public", action="store_const", const=True,
        help="/metrics and /healthz's details without the API key",
    )
    serve.add_argument("--ice-username", help="username for the turn: URLs of --ice-server")
    serve.add_argument("--ice-credential", help="credential for the turn: URLs of --ice-server")
    serve.add_argument(
        "--turn-secret", help="coturn's static-auth-secret: mint time-limited TURN credentials per call instead"
    )
    serve.add_argument("--turn-ttl", type=int, metavar="SECONDS", help="how long minted TURN credentials last (default 300)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "dev-model":
        return _dev_model(args)
    return asyncio.run(_call(args))


def _settings(args: argparse.Namespace) -> Settings:
    given = {field: getattr(args, flag) for flag, field in SERVE_FLAGS.items() if getattr(args, flag, None) is not None}
    return Settings(**given)


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
    except ValidationError as exc:
        print(f"omni-rtc serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from app.web.server import create_app
    from app.web.tls import serving_tls
    from app.web.websocket import websocket_server_options

    tls = serving_tls(settings)
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
        # Forwarded headers are read by the app from --trusted-proxy peers only (app/web/edge.py);
        # uvicorn's own reading would believe any client on 127.0.0.1, a same-host proxy included.
        proxy_headers=False,
        ssl_certfile=tls.certfile if tls else None, ssl_keyfile=tls.keyfile if tls else None,
        **websocket_server_options(settings),
    )
    return 0


def _dev_model(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from pipeline.local.devmodel import build_dev_model, ensure_dev_model

    if args.out is not None:
        path = build_dev_model(args.out, layout=args.layout)
    else:
        path = ensure_dev_model(Settings().cache_dir, layout=args.layout)
    print(path)
    return 0


def read_utterance(path: Path) -> np.ndarray:
    """A WAV as float32 mono at 16 kHz (the rate the client speaks)."""
    import soundfile
    import soxr

    pcm, rate = soundfile.read(path, dtype="float32", always_2d=True)
    mono = pcm.mean(axis=1)
    return mono if rate == 16_000 else soxr.resample(mono, rate, 16_000).astype(np.float32)


async def _call(args: argparse.Namespace) -> int:
    if args.sessions < 1:
        print("omni-rtc call: --sessions must be at least 1", file=sys.stderr)
        return 2
    if args.video is not None and args.transport != "webrtc":
        print("omni-rtc call: --video needs --transport webrtc (a WebSocket carries no video)", file=sys.stderr)
        return 2
    if args.video is not None:
        import av

        from app.client.video_file import VideoFileTrack

        try:
            VideoFileTrack(args.video).stop()
        except (OSError, ValueError, av.FFmpegError) as exc:
            print(f"omni-rtc call: cannot read --video {args.video}: {exc}", file=sys.stderr)
            return 2
    try:
        utterances = [(path, read_utterance(path)) for path in args.wav]
    except (OSError, RuntimeError) as exc:  # soundfile raises RuntimeError subclasses for bad files
        print(f"omni-rtc call: cannot read a WAV: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = await asyncio.gather(*(_one_session(args, index, utterances) for index in range(1, args.sessions + 1)))
    ok = all(result["ok"] for result in results)
    if args.json:
        print(json.dumps({"ok": ok, "sessions": results}, indent=2))
    return 0 if ok else 1


async def _one_session(args: argparse.Namespace, index: int, utterances: list[tuple[Path, np.ndarray]]) -> dict[str, Any]:
    import httpx
    import soundfile
    from websockets.exceptions import WebSocketException

    from app.client.base import ClientError
    from app.client.webrtc import RealtimeClient
    from app.client.websocket import RealtimeSocketClient

    result: dict[str, Any] = {"session": index, "call": None, "turns": [], "ok": False, "error": None}
    out_dir = args.out / f"session-{index}" if args.sessions > 1 else args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    client: RealtimeClient | RealtimeSocketClient
    if args.transport == "websocket":
        client = RealtimeSocketClient(
            args.url, api_key=args.api_key, session=args.session, model=args.model,
            acknowledge_playback=args.playback_ack, timeout_s=args.timeout,
        )
    else:
        client = RealtimeClient(
            args.url,
            api_key=args.api_key,
            session=args.session,
            ice_loopback=args.ice_loopback,
            ice_servers=args.ice_server,
            timeout_s=args.timeout,
            video=args.video,
        )
    try:
        async with client:
            result["call"] = client.call_location
            route = ""
            if isinstance(client, RealtimeClient):  # which ICE candidates carry the media ("relay": via TURN)
                pair = client.candidate_pair
                result["candidate_pair"] = None if pair is None else {"local": pair.local, "remote": pair.remote}
                route = "" if pair is None else f" (candidates: ours {pair.local}, the server's {pair.remote})"
            if not args.json:
                print(f"session {index} connected: {client.call_location}{route}", flush=True)
            for number, (path, pcm) in enumerate(utterances, start=1):
                turn = await client.speak(pcm)
                saved = out_dir / f"turn-{number}.wav"
                soundfile.write(saved, turn.audio, turn.sample_rate, subtype="PCM_16")
                summary = {
                    "turn": number,
                    "input": str(path),
                    "status": turn.status,
                    "user_transcript": turn.user_transcript,
                    "transcript": turn.transcript,
                    "audio_seconds": round(turn.audio_seconds, 3),
                    "audible_seconds": round(turn.audible_seconds, 3),
                    "latency_s": None if turn.latency_s is None else round(turn.latency_s, 3),
                    "images": turn.images_shown,
                    "usage": turn.usage,
                    "output": str(saved),
                }
                result["turns"].append(summary)
                if not args.json:
                    latency = "-" if turn.latency_s is None else f"{turn.latency_s:.2f} s"
                    if turn.images_shown:
                        image_tokens = turn.usage.get("input_token_details", {}).get("image_tokens")
                        print(f"session {index} turn {number} camera: {turn.images_shown} frames, "
                              f"{image_tokens} image tokens", flush=True)
                    if turn.user_transcript is not None:
                        print(f"session {index} turn {number} user said: {turn.user_transcript!r}", flush=True)
                    print(
                        f"session {index} turn {number} [{turn.status}] {turn.audio_seconds:.2f} s audio "
                        f"({turn.audible_seconds:.2f} s audible), "
                        f"end of speech -> first audio {latency}: {turn.transcript!r}",
                        flush=True,
                    )
                if turn.status not in ("completed", "incomplete"):  # incomplete: max_output_tokens reached
                    raise ClientError(f"turn {number} ended {turn.status}: {turn.response.get('status_details')}")
        result["ok"] = True
    except (ClientError, OSError, TimeoutError, httpx.HTTPError, WebSocketException) as exc:
        result["error"] = str(exc)
        print(f"omni-rtc call: session {index}: {exc}", file=sys.stderr)
    return result


if __name__ == "__main__":
    sys.exit(main())
