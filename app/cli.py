"""``omni-rtc``: serve, build the dev model, or place calls from the command line.

argparse rather than typer: it is the standard library (typer is not a dependency of the
package), and three subcommands with repeatable flags need nothing more. ``serve``'s flags
follow from the Settings fields (``serve_flags``): one each, grouped by concern, its help the
field's description; a flag given overrides the OMNI_RTC_* environment, which overrides the
defaults. README's configuration tables are made from the same (``configuration_tables``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import numpy as np
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo

from app.config import Concern, Settings, setting_flag


class _WholeWordsHelp(argparse.HelpFormatter):
    """Help wrapped at spaces only: argparse's default also breaks at hyphens, which split flag
    names, paths and words such as "comma-separated" across lines of ``serve --help``."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-rtc", description="Talk to Qwen3-Omni over WebRTC or a WebSocket.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        formatter_class=_WholeWordsHelp,
        help="run the server (flags override OMNI_RTC_* variables)",
        description="Every flag is a setting of app/config.py and an OMNI_RTC_* environment variable (the "
        "setting's name in capitals); a flag given overrides the environment, which overrides the default.",
    )
    groups = {concern: serve.add_argument_group(concern.value) for concern in Concern}
    for flag in serve_flags():
        groups[flag.concern].add_argument(flag.option, **flag.keywords)

    dev_model = commands.add_parser("dev-model", help="build the tiny random-weight Qwen3-Omni checkpoint")
    dev_model.add_argument("--out", type=Path, help="output directory (default: the cache the server uses)")
    dev_model.add_argument(
        "--layout",
        choices=["fused", "hub"],
        default="fused",
        help="fused: transformers' own (default); hub: the published checkpoint's shards and per-expert tensors",
    )
    dev_model.add_argument(
        "--depth",
        choices=["tiny", "real"],
        default="tiny",
        help="tiny: one or two layers per stage (default); real: Qwen3-Omni's layer and expert counts, tiny widths",
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


@dataclass(frozen=True)
class ServeFlag:
    """One Settings field as a ``serve`` flag: what ``add_argument`` is given for it."""

    setting: str  # the Settings field's name
    concern: Concern
    option: str  # e.g. --engine-url
    keywords: dict[str, Any]  # add_argument's: dest, help, and type, choices or action; metavar


def serve_flags() -> list[ServeFlag]:
    """A flag for every Settings field, in the fields' order; how each follows is Flag's docstring."""
    return [_serve_flag(name, field) for name, field in Settings.model_fields.items()]


def _serve_flag(name: str, field: FieldInfo) -> ServeFlag:
    flag = setting_flag(name)
    if not field.description:
        raise TypeError(f"Settings.{name} has no description: it is the flag's help")
    option = "--" + (flag.name or name.removesuffix("_s").replace("_", "-"))
    value_type = _without_none(field.annotation)
    repeatable = "repeatable; " if get_origin(value_type) is list else ""
    help_text = f"{field.description} ({repeatable}default: {default_in_words(name)})"
    # No argparse default: a flag left out is None and not passed on, so the environment or the
    # field's default applies (_settings). argparse formats help with %.
    keywords: dict[str, Any] = {"dest": name, "help": help_text.replace("%", "%%")}
    if value_type is bool:
        keywords["action"] = argparse.BooleanOptionalAction
        return ServeFlag(name, flag.concern, option, keywords)
    named = "SECONDS" if name.endswith("_s") else option.removeprefix("--").replace("-", "_").upper()
    metavar: str | None = flag.metavar or named
    if get_origin(value_type) is Literal:
        keywords["choices"] = list(get_args(value_type))
        metavar = flag.metavar  # None: argparse shows the choices
    elif get_origin(value_type) is list:
        [item_type] = get_args(value_type)
        keywords.update(action="append", type=item_type)
    elif get_origin(value_type) is dict:
        keywords["type"] = _json_value
    elif value_type is SecretStr:
        keywords["type"] = str
    elif value_type in (str, int, float, Path):
        keywords["type"] = value_type
    else:
        raise TypeError(f"Settings.{name}: no flag for a {value_type} (app/cli.py _serve_flag)")
    if metavar is not None:
        keywords["metavar"] = metavar
    return ServeFlag(name, flag.concern, option, keywords)


def _without_none(annotation: Any) -> Any:
    """``X`` of ``X | None``; any other annotation as it is."""
    if get_origin(annotation) in (Union, UnionType):
        [value_type] = [arg for arg in get_args(annotation) if arg is not type(None)]
        return value_type
    return annotation


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def default_in_words(name: str) -> str:
    """A setting's default as --help and README say it: its Flag's words, else the value."""
    flag = setting_flag(name)
    if flag.default is not None:
        return flag.default
    value = Settings.model_fields[name].get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == []:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(value) if isinstance(value, dict) else str(value)


def configuration_tables() -> str:
    """README's configuration tables: a table of the settings of each concern, generated from the fields."""
    flags = serve_flags()
    sections = []
    for concern in Concern:
        rows = [
            f"| `{flag.setting.upper()}` | {_flag_in_words(flag)} | {_cell(default_in_words(flag.setting))} "
            f"| {_cell(Settings.model_fields[flag.setting].description or '')} |"
            for flag in flags
            if flag.concern is concern
        ]
        header = ["| env `OMNI_RTC_…` | flag | default | meaning |", "|---|---|---|---|"]
        sections.append("\n".join([f"### {concern.value}", "", *header, *rows]))
    return "\n\n".join(sections) + "\n"


_README_SETTINGS_START = "<!-- settings: generated from app/config.py by scripts/settings_table.py -->\n"
_README_SETTINGS_END = "<!-- /settings -->"


def readme_with_configuration_tables(readme: str) -> str:
    """``readme`` with its text between the settings markers replaced by ``configuration_tables()``."""
    before, start, rest = readme.partition(_README_SETTINGS_START)
    _, end, after = rest.partition(_README_SETTINGS_END)
    if not start or not end:
        raise ValueError(f"README has no {_README_SETTINGS_START.strip()} ... {_README_SETTINGS_END} section")
    return before + start + "\n" + configuration_tables() + "\n" + end + after


def _flag_in_words(flag: ServeFlag) -> str:
    if flag.keywords.get("action") is argparse.BooleanOptionalAction:
        return f"`{flag.option}` / `--no-{flag.option.removeprefix('--')}`"
    value = flag.keywords.get("metavar") or "{" + ",".join(flag.keywords["choices"]) + "}"
    repeatable = " (repeatable)" if flag.keywords.get("action") == "append" else ""
    return f"`{flag.option} {value}`{repeatable}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "dev-model":
        return _dev_model(args)
    return asyncio.run(_call(args))


def _settings(args: argparse.Namespace) -> Settings:
    given = {name: value for name in Settings.model_fields if (value := getattr(args, name, None)) is not None}
    return Settings(**given)


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
    except ValidationError as exc:
        print(f"omni-rtc serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from app.http.header_deadline import header_deadline_protocol
    from app.http.server import create_app
    from app.http.socket_route import websocket_server_options
    from app.http.tls import serving_tls

    tls = serving_tls(settings)
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
        # Forwarded headers are read by the app from --trusted-proxy peers only (app/http/edge.py);
        # uvicorn's own reading would believe any client on 127.0.0.1, a same-host proxy included.
        proxy_headers=False,
        http=header_deadline_protocol(settings.header_timeout_s), limit_concurrency=settings.max_connections,
        ssl_certfile=tls.certfile if tls else None, ssl_keyfile=tls.keyfile if tls else None,
        **websocket_server_options(settings),
    )
    return 0


def _dev_model(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from pipeline.local.devmodel import build_dev_model, ensure_dev_model

    if args.out is not None:
        path = build_dev_model(args.out, layout=args.layout, depth=args.depth)
    else:
        path = ensure_dev_model(Settings().cache_dir, layout=args.layout, depth=args.depth)
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
