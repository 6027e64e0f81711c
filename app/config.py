"""One typed settings object, read from flags and OMNI_RTC_* environment variables.

A setting is written once, as a ``Settings`` field: its ``description`` is its help, and its
``Flag`` names its concern (the group it is shown in) and what the field's name and type cannot
say. ``omni-rtc serve``'s flags (app/cli.py) and README's configuration tables follow from the
fields, and so does the environment variable (``OMNI_RTC_`` + the field name).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.realtime.gate import MAX_EVENT_BURST, MAX_EVENTS_PER_SECOND, EventRate
from app.realtime.shares import ENGINE_SHARE_BURST, ENGINE_SHARE_PER_SECOND, ShareSize
from pipeline.local.devices import usable_cores
from pipeline.local.engine_messages import DEFAULT_MAX_BATCH
from pipeline.token_count import ANSWER_OPENING_TOKENS, DEFAULT_MAX_PROMPT_TOKENS


class Concern(Enum):
    """What a setting configures: its group in ``omni-rtc serve --help`` and README, in this order."""

    SERVER = "Server"
    MODEL = "Model (either engine)"
    LOCAL_ENGINE = "In-process engine"
    VLLM_OMNI = "vLLM-Omni servers"
    SESSIONS = "Sessions"
    WEBRTC = "WebRTC"
    LIMITS = "Limits"
    EDGE = "Edge: auth, TLS, proxies, hosts"


@dataclass(frozen=True)
class Flag:
    """A setting's place on ``omni-rtc serve``, as ``Annotated`` metadata of its field.

    The flag is ``--`` and the field's name with dashes, less a trailing ``_s`` (the metavar then
    says SECONDS); ``name`` replaces that where it would mislead (``engine-url``: one of engine_urls).
    """

    concern: Concern
    name: str | None = None
    metavar: str | None = None  # the value's name in --help (default: the flag's name in capitals)
    default: str | None = None  # the default in words, where it is computed or None means something


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "omni-rtc"


def is_loopback_host(host: str) -> bool:
    """True when binding ``host`` exposes the server to this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # any other hostname may resolve to a public address
        return False


def load_dev_replies(path: Path | None) -> tuple[str, ...]:
    """The replies of a ``--dev-replies`` file: a JSON list of answer texts (``ValueError`` naming it)."""
    if path is None:
        return ()
    try:
        replies = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"dev_replies: cannot read {path} as JSON ({type(exc).__name__})") from None
    if not isinstance(replies, list) or not all(isinstance(reply, str) for reply in replies):
        raise ValueError(f"dev_replies: {path} must hold a JSON list of answer texts")
    return tuple(replies)


class LocalEngine(BaseModel):
    """The in-process transformers engine (``pipeline/local``): its settings, read off ``Settings``."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["local"] = "local"
    devices: tuple[str, ...]  # one engine process per entry
    max_batch: int
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    generation: dict[str, Any]
    threads: int | None
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None
    dev_replies: Path | None


class VllmOmniServers(BaseModel):
    """vLLM-Omni servers instead of the in-process engine (``pipeline/vllm_omni``)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["vllm_omni"] = "vllm_omni"
    urls: tuple[str, ...]
    api_key: SecretStr | None


EngineSettings = Annotated[LocalEngine | VllmOmniServers, Field(discriminator="kind")]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OMNI_RTC_", extra="forbid")

    # ``engine``: built from the fields below once they are validated (``_build_engine``).
    _engine: LocalEngine | VllmOmniServers = PrivateAttr()

    # -- server
    host: Annotated[str, Flag(Concern.SERVER)] = Field(
        "127.0.0.1",
        description="bind address; one that other machines can reach needs an API key "
        "(or --allow-unauthenticated-public)",
    )
    port: Annotated[int, Flag(Concern.SERVER)] = Field(8000, ge=0, le=65535, description="port to listen on")
    log_level: Annotated[Literal["debug", "info", "warning", "error", "critical"], Flag(Concern.SERVER)] = Field(
        "info", description="logging level of the server, its media workers and its engine processes"
    )
    cache_dir: Annotated[Path, Flag(Concern.SERVER, default="~/.cache/omni-rtc")] = Field(
        default_factory=_default_cache_dir,
        description="where the dev model is built, semantic_vad's end-of-turn model is installed (by `make`) "
        "and a self-signed certificate is kept (tls/)",
    )
    # One process carries one core's worth of calls: aiortc runs on the GIL.
    media_workers: Annotated[
        int, Flag(Concern.SERVER, metavar="N", default="the usable cores (CPU affinity), at least 1")
    ] = Field(
        default_factory=usable_cores,
        ge=1,
        description="processes that carry the WebRTC calls behind the one port, one core's worth of calls each "
        '(app/serving/media_workers.py); 1 keeps every call in the server process (docs/ARCHITECTURE.md "Processes")',
    )

    # Off by default: a recording keeps what people said. 200 sessions, 7 days and 5 GiB bound it
    # three ways; a 10-minute call is about 25 MB of FLAC (16 kHz in, 24 kHz out), so 5 GiB holds
    # ~200 of them and the bounds agree; a week covers a demo's "what did it hear yesterday".
    record_dir: Annotated[Path | None, Flag(Concern.SERVER, metavar="DIR")] = Field(
        None,
        description="keep each session's audio (both sides, FLAC), events and transcript in a folder of its own "
        'here; a session may ask not to be (session.recording.enabled false; docs/OPERATING.md "Recordings")',
    )
    record_max_sessions: Annotated[int, Flag(Concern.SERVER, metavar="N")] = Field(
        200, ge=1, description="recordings kept; the oldest go when a new one starts"
    )
    record_max_age_s: Annotated[float, Flag(Concern.SERVER)] = Field(
        7 * 86_400.0, gt=0, description="recordings older than this go when a new one starts"
    )
    record_max_bytes: Annotated[int, Flag(Concern.SERVER, metavar="BYTES")] = Field(
        5 * 2**30, ge=2**20, description="the recordings' total size; past it the oldest go when a new one starts"
    )

    # -- the model, on either engine
    model: Annotated[str | None, Flag(Concern.MODEL, default="the built-in dev model")] = Field(
        None,
        description="checkpoint directory or Hugging Face id; with --engine-url, the served model name sent with "
        "each turn (unset: the server's own)",
    )
    seed: Annotated[int | None, Flag(Concern.MODEL)] = Field(None, description="makes turns reproducible")

    # -- the in-process engine: each of these set with engine_urls is refused (LOCAL_ENGINE_SETTINGS)
    device: Annotated[str, Flag(Concern.LOCAL_ENGINE)] = Field(
        "auto",
        description="torch device: auto (cuda when present, else cpu), cpu, cuda, cuda:1 ...; a comma-separated "
        "list (cuda:0,cuda:1) runs one engine process per device, each turn going to the least loaded one",
    )
    engines: Annotated[int, Flag(Concern.LOCAL_ENGINE)] = Field(
        1, ge=1, description="engine processes on a single device (several on a big CPU box)"
    )
    max_batch: Annotated[int, Flag(Concern.LOCAL_ENGINE)] = Field(
        DEFAULT_MAX_BATCH, ge=1, description="turns one engine process decodes together; more wait first in, first out (queue_wait_ms)"
    )
    dtype: Annotated[Literal["auto", "float32", "bfloat16", "float16"], Flag(Concern.LOCAL_ENGINE)] = Field(
        "auto", description="the weights' dtype; auto: bfloat16 on a GPU, float32 on a CPU"
    )
    # 12.5 codec frames per second: max_audio_frames 250 is 20 s of speech.
    generation: Annotated[dict[str, Any], Flag(Concern.LOCAL_ENGINE, metavar="JSON")] = Field(
        default_factory=dict,
        description="GenerationParams fields for every turn (pipeline/local/params.py: chunk sizes, "
        'max_audio_frames, ...), e.g. {"max_audio_frames": 250} caps an answer at 20 s of speech; benchmarks '
        'only: {"emulate": {"first_audio_ms": 400, "frame_ms": 30}} makes the engine as slow as a stated real '
        "model (pipeline/local/emulation.py; logged as a warning, shown in /healthz)",
    )
    engine_threads: Annotated[
        int | None, Flag(Concern.LOCAL_ENGINE, default="torch's; with --engines N on a CPU, the usable cores / N")
    ] = Field(None, ge=1, description="torch CPU threads of each engine process (/healthz shows each engine's)")
    attn_implementation: Annotated[
        Literal["sdpa", "eager", "flash_attention_2"] | None, Flag(Concern.LOCAL_ENGINE, default="transformers' (sdpa)")
    ] = Field(None, description="from_pretrained's attention kernels (docs/MODEL.md)")
    dev_replies: Annotated[Path | None, Flag(Concern.LOCAL_ENGINE, metavar="FILE")] = Field(
        None,
        description="a JSON list of answer texts the model says instead of its own, one per response, in order, "
        "in every session (each starts at the first), then its own; forced through the real tokenizer, Talker "
        "and Code2Wav (docs/MODEL.md \"Forced replies\"). For tests and demos with the dev model: a "
        '`<tool_call>\\n{"name": "get_local_time", "arguments": {}}\\n</tool_call>` reply makes it call the '
        "page's tool; it scripts any checkpoint",
    )

    # -- vLLM-Omni servers instead of the in-process engine (pipeline/vllm_omni/vllm_omni_engine.py)
    engine_urls: Annotated[list[str], NoDecode, Flag(Concern.VLLM_OMNI, name="engine-url", metavar="URL")] = Field(
        default_factory=list,
        description="run turns on this vLLM-Omni server (its API base, e.g. http://gpu-1:8091/v1) instead of the "
        "in-process engine; each turn goes to the least loaded reachable one",
    )
    engine_api_key: Annotated[SecretStr | None, Flag(Concern.VLLM_OMNI, metavar="KEY")] = Field(
        None, description="the vLLM-Omni servers' API key (vllm serve --api-key), sent as `Authorization: Bearer`"
    )

    # -- what each session gets unless it asks otherwise
    turn_model: Annotated[Path | None, Flag(Concern.SESSIONS, default="cache_dir's smart-turn-v3.2-cpu.onnx")] = Field(
        None,
        description="semantic_vad's end-of-turn model; missing, the server starts and sessions asking for "
        "semantic_vad get an error and server VAD",
    )
    # Off by default: the dev model's words are noise, and on a CPU a check costs as much as a turn.
    turn_text_judge: Annotated[Literal["off", "engine"], Flag(Concern.SESSIONS)] = Field(
        "off",
        description="engine: semantic_vad also judges the words said: Qwen3-Omni transcribes the utterance at each "
        "candidate silence and scores whether its text is a complete turn (two short engine turns a check; "
        'docs/SESSION.md "semantic_vad"); for real weights (the dev model\'s words are noise); needs an engine that '
        "scores the end of a turn, the in-process one (with engine_urls the server refuses to start)",
    )
    speculative_responses: Annotated[bool, Flag(Concern.SESSIONS)] = Field(
        True,
        description="start each answer at the first quiet VAD window after speech, on spare engine capacity, and "
        'hold it until the turn is committed (app/realtime/speculation.py, docs/SESSION.md "Speculative answers"); '
        "each session's turn_detection.speculative_response defaults to it. Off: answers start at the commit",
    )
    partial_transcripts: Annotated[bool, Flag(Concern.SESSIONS)] = Field(
        True,
        description="with input transcription on, also transcribe the words while the user speaks, about every "
        'second, on spare engine capacity (docs/SESSION.md "Partial transcripts"); each session\'s '
        "audio.input.transcription.partials defaults to it. Off: the words come after the commit",
    )
    # On, as OpenAI's default, because the frameworks rely on it (pipecat sends no turn detection).
    noise_reduction: Annotated[Literal["off", "near_field", "far_field"], Flag(Concern.SESSIONS)] = Field(
        "off",
        description="noise suppression for sessions that do not say (audio.input.noise_reduction left out): WebRTC's "
        "noise suppressor on the input before the VAD and the model hear it; near_field 12 dB, far_field 18 dB; off "
        'is OpenAI\'s default (docs/SESSION.md "Noise reduction"). The page sends its own choice',
    )
    echo_cancellation: Annotated[bool, Flag(Concern.SESSIONS)] = Field(
        True,
        description="for WebRTC calls whose session does not say (audio.input.echo_cancellation left out): take "
        "the answer's own echo out of the caller's microphone with WebRTC's echo canceller, fed with what the call "
        'played (media/echo_canceller.py, docs/SESSION.md "Echo"); a speakerphone then does not interrupt its own '
        "answer. About 0.7% of a core per call",
    )
    default_interrupt_response: Annotated[bool, Flag(Concern.SESSIONS, name="interrupt-response")] = Field(
        True,
        description="barge-in for API clients that do not say (interrupt_response left out, or no turn detection "
        "sent, as pipecat): the user's speech cancels the answer, OpenAI's default; off: half-duplex unless the "
        "client asks "
        '(docs/SESSION.md "Turn detection"). The page sends its own Barge-in toggle',
    )

    # -- WebRTC. List settings read from the environment as comma-separated values (or JSON lists).
    ice_servers: Annotated[list[str], NoDecode, Flag(Concern.WEBRTC, name="ice-server", metavar="URL")] = Field(
        default_factory=list,
        description="a STUN/TURN server URL (stun:host:port, turn:host:port?transport=udp), for the server's own "
        "peers and for clients (GET /v1/realtime/ice_servers)",
    )
    ice_username: Annotated[str | None, Flag(Concern.WEBRTC)] = Field(
        None, description="static TURN username for the turn:/turns: URLs of --ice-server (with --ice-credential)"
    )
    ice_credential: Annotated[SecretStr | None, Flag(Concern.WEBRTC)] = Field(
        None, description="static TURN credential for the turn:/turns: URLs of --ice-server (with --ice-username)"
    )
    ice_auth_secret: Annotated[SecretStr | None, Flag(Concern.WEBRTC)] = Field(
        None,
        description="coturn's static-auth-secret: time-limited TURN REST credentials minted per call instead, "
        "valid --ice-credential-ttl (docs/DEPLOY.md)",
    )
    # Credentials are used within seconds (gathering); coturn checks the expiry only when an
    # allocation authenticates, so a call outlives them (docs/DEPLOY.md).
    ice_credential_ttl_s: Annotated[int, Flag(Concern.WEBRTC)] = Field(
        300, ge=30, le=86_400, description="how long minted TURN credentials last"
    )
    ice_loopback: Annotated[bool, Flag(Concern.WEBRTC)] = Field(
        False, description="gather ICE candidates on 127.0.0.1 only (tests, clients on this machine)"
    )
    # ICE and DTLS take well under a second on a LAN and a few seconds through TURN; an offer
    # that never connects holds a session slot this long.
    connect_timeout_s: Annotated[float, Flag(Concern.WEBRTC)] = Field(
        10.0,
        gt=0,
        description="a call whose peer never connected after this long is dropped (an offer posted, then gone)",
    )
    # Browsers send a 20 ms frame even when muted; aiortc alone notices a vanished peer only
    # when ICE consent expires (6 missed checks x 5 s = ~30 s).
    disconnect_timeout_s: Annotated[float, Flag(Concern.WEBRTC)] = Field(
        10.0, gt=0, description="a connected peer that sends no media for this long counts as gone and its call ends"
    )
    jitter_buffer: Annotated[bool, Flag(Concern.WEBRTC)] = Field(
        True,
        description="inbound audio through omni-rtc's jitter buffer (media/jitter_buffer.py: a playout deadline, "
        "Opus FEC and PLC; docs/NETWORK.md); off: aiortc's own receive path, which stalls on every lost packet "
        "(the fallback should an aiortc upgrade refuse the receiver tap, and the network bench's \"before\")",
    )

    # -- limits: past each one the client gets a clear error (an HTTP status, or an `error` event
    # while the session goes on); docs/HARDENING.md lists every bound.
    max_sessions: Annotated[int, Flag(Concern.LIMITS)] = Field(
        16, ge=1, description="concurrent sessions, WebRTC and WebSocket together; the next gets 429 + Retry-After"
    )
    # A page connects one call at a time; a load tool on one host may open a few.
    max_connecting_per_client: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        8,
        ge=1,
        description="calls one client address may have still connecting (offered, ICE/DTLS not yet up); "
        "the next gets 429",
    )
    # A page holds one session; a visitor's tabs a few. Clients of this machine (no proxy between)
    # and holders of the API key (a server-side program speaking for many users) are not held to it.
    max_sessions_per_client: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        4,
        ge=1,
        description="sessions (WebRTC and WebSocket together) one client address may hold open, as the trusted "
        "proxies name it; the next gets 429. Not for clients on this machine or with the API key",
    )
    engine_share_tokens: Annotated[int, Flag(Concern.LIMITS, metavar="TOKENS")] = Field(
        ENGINE_SHARE_BURST,
        ge=1,
        description="a session's share of the engine: prompt tokens (prefilled, and steps decoded) its work may "
        "cost at once; past it response.create is refused (engine_share_exceeded) and speculation waits. A "
        "client held to max_sessions_per_client shares one such bucket across its sessions (docs/SESSION.md)",
    )
    engine_share_tokens_per_second: Annotated[float, Flag(Concern.LIMITS, metavar="TOKENS")] = Field(
        ENGINE_SHARE_PER_SECOND,
        gt=0,
        description="the rate a session's share refills at; a client's refills twice as fast",
    )
    # Browsers send 3-8 KB.
    max_sdp_bytes: Annotated[int, Flag(Concern.LIMITS, metavar="BYTES")] = Field(
        65_536, ge=1_024, description="an offer's body; past it 413"
    )
    # 256 KiB carries ~5 s of base64 PCM16 audio in conversation.item.create.
    max_event_bytes: Annotated[int, Flag(Concern.LIMITS, metavar="BYTES")] = Field(
        262_144, ge=1_024, description="one client event; past it the error event_too_large"
    )
    max_events_per_second: Annotated[float, Flag(Concern.LIMITS, metavar="N")] = Field(
        MAX_EVENTS_PER_SECOND, gt=0,
        description="a session's sustained client event rate (a client held to max_sessions_per_client: twice it, "
        "and twice max_event_burst, across its sessions); past it the error rate_limit_exceeded"
    )
    max_event_burst: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        MAX_EVENT_BURST, ge=1, description="client events accepted at once before max_events_per_second applies"
    )
    # 10 MiB holds any phone photo; over WebRTC the data channel takes 256 KiB messages at most.
    max_image_bytes: Annotated[int, Flag(Concern.LIMITS, metavar="BYTES")] = Field(
        10_485_760,
        ge=1_024,
        le=16_777_216,
        description="the largest input_image (image_too_large past it); its event may be that much, as base64, "
        "over max_event_bytes",
    )
    # A 1080p frame is ~3 MB decoded; a peer may declare 16383x16383 (~400 MB).
    max_video_pixels: Annotated[int, Flag(Concern.LIMITS, metavar="PIXELS")] = Field(
        1920 * 1080,
        ge=64 * 64,
        le=7680 * 4320,
        description="the largest camera frame decoded (media/video_gate.py), read from its key frame's header "
        "before decoding; a larger stream's frames are dropped undecoded (logged) and the call goes on",
    )
    # ~4k tokens.
    max_text_chars: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        16_000, ge=1, description="characters in one text field of a client event (input_text, instructions)"
    )
    # An upper bound: text counts a token per UTF-8 byte, audio 13 per second exactly. OpenAI's
    # token-based truncation (token_limits.post_instructions) does the same.
    history_max_tokens: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        16_000,
        ge=1_000,
        description="a conversation's prompt tokens after the system prompt, as its items estimate them (an "
        "upper bound); past it "
        "the oldest items go, each announced with conversation.item.deleted (docs/SESSION.md)",
    )
    instructions_max_tokens: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        16_000,
        ge=1_000,
        description="a session's system message, its instructions and tools together, in Qwen tokens (counted "
        "exactly once their bytes pass it); past it session.update, response.create or the offer's / client "
        "secret's session is refused with invalid_value naming the budget (app/realtime/session_config.py)",
    )
    # The Thinker has 65,536 positions.
    max_prompt_tokens: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        DEFAULT_MAX_PROMPT_TOKENS,
        ge=2_048,
        description="the longest prompt the engine takes (in-process: counted by its tokenizer; vLLM-Omni: by "
        "pipeline/token_count.py before it is sent); a longer turn fails alone with prompt_too_long before it "
        "joins a batch; must hold the two budgets above",
    )
    # OpenAI's calls end at 60 min.
    max_session_s: Annotated[float, Flag(Concern.LIMITS)] = Field(
        3_600.0, gt=0, description="a session ends after this long (the error session_expired)"
    )
    # A person who stepped away: ten minutes with no client event, no speech and no answer frees
    # the slot (16 idle WebSockets of one client held every slot for the hour of max_session_s).
    session_idle_timeout_s: Annotated[float, Flag(Concern.LIMITS)] = Field(
        600.0, gt=0, description="a session with no client event, no speech and no answer for this long ends "
        "(the error session_idle_timeout)"
    )
    # nginx's client_header_timeout is 60 s; a browser or a Realtime client sends its headers in one
    # packet. 300 connections that sent half a request line were all kept without it.
    header_timeout_s: Annotated[float, Flag(Concern.LIMITS)] = Field(
        10.0, gt=0, description="a connection that has not sent a request's complete headers this "
        "long after it opened (or after its last response) is closed (app/http/header_deadline.py)"
    )
    # A session holds one connection (a WebSocket) or none past its offer (WebRTC); a systemd unit's
    # default of 1,024 open files must also hold each call's UDP sockets and the engine's pipes.
    max_connections: Annotated[int, Flag(Concern.LIMITS, metavar="N")] = Field(
        512, ge=16, description="open HTTP and WebSocket connections (uvicorn's limit_concurrency); past it a "
        "request gets 503"
    )
    # Queue wait counts: 16 sessions x ~2 s CPU dev-model turns stay well under.
    turn_stall_timeout_s: Annotated[float, Flag(Concern.LIMITS)] = Field(
        60.0,
        gt=0,
        description="a response whose engine yields nothing for this long ends failed (engine_timeout) and the "
        "session serves the next turn",
    )
    # The media workers' own bound is 5 s (a call's audio); the front's loop also parses every
    # WebSocket session's events, so a loaded box may hold it a few seconds without being stuck.
    loop_watchdog_s: Annotated[float, Flag(Concern.LIMITS)] = Field(
        30.0,
        ge=0,
        description="the server process ends (status 70, for its supervisor to restart) when its event loop "
        "has not answered for this long (app/serving/loop_watchdog.py); 0: never",
    )

    # -- the edge (docs/DEPLOY.md): who may call, TLS, proxies whose forwarded headers are believed,
    # the Host names answered. Kept together so that trust decisions read in one place.
    api_key: Annotated[SecretStr | None, Flag(Concern.EDGE)] = Field(
        None, description="require `Authorization: Bearer <key or ek_ client secret>` to place calls"
    )
    allow_unauthenticated_public: Annotated[bool, Flag(Concern.EDGE)] = Field(
        False, description="allow a non-loopback host (or a trusted proxy) without an API key"
    )
    cors_origins: Annotated[list[str], NoDecode, Flag(Concern.EDGE, name="cors-origin", metavar="ORIGIN")] = Field(
        default_factory=list,
        description="a browser origin allowed to call /v1/realtime/calls and open /v1/realtime",
    )
    ssl_certfile: Annotated[Path | None, Flag(Concern.EDGE, metavar="PEM")] = Field(
        None, description="serve HTTPS and WSS with this certificate (chain)"
    )
    ssl_keyfile: Annotated[Path | None, Flag(Concern.EDGE, metavar="PEM")] = Field(
        None, description="the certificate's private key, when not in --ssl-certfile"
    )
    tls: Annotated[Literal["self-signed"] | None, Flag(Concern.EDGE)] = Field(
        None,
        description="self-signed: serve HTTPS with a certificate for this host's names and addresses, made once "
        "in cache_dir/tls",
    )
    trusted_proxies: Annotated[list[str], NoDecode, Flag(Concern.EDGE, name="trusted-proxy", metavar="ADDR/CIDR")] = (
        Field(
            default_factory=list,
            description="a reverse proxy (address or CIDR network) whose X-Forwarded-For/-Proto are believed "
            "(needs an API key); nobody else's are",
        )
    )
    allowed_hosts: Annotated[
        list[str],
        NoDecode,
        Flag(
            Concern.EDGE,
            name="allowed-host",
            metavar="NAME",
            default="localhost and the bind address (a wildcard bind: this machine's names and addresses)",
        ),
    ] = Field(
        default_factory=list,
        description="a Host name to answer besides the default ones (`*.example.org`, or `*` for any); others get "
        "421 (DNS rebinding)",
    )
    metrics_public: Annotated[bool, Flag(Concern.EDGE)] = Field(
        False, description="with an API key: /metrics and /healthz's details without it"
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value  # OMNI_RTC_LOG_LEVEL=INFO as well

    @field_validator("ice_servers", "cors_origins", "engine_urls", "trusted_proxies", "allowed_hosts", mode="before")
    @classmethod
    def _split_comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            if value.startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("engine_urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"engine_urls: {url!r} is not an http:// or https:// URL (e.g. http://gpu-1:8091/v1)")
        return [url.rstrip("/") for url in urls]

    @property
    def engine_share_size(self) -> ShareSize:
        """A session's share of the engine (``ShareSize.for_client``: its client's)."""
        return ShareSize(self.engine_share_tokens, self.engine_share_tokens_per_second)

    @property
    def event_rate(self) -> EventRate:
        """A session's client event rate (``EventRate.for_client``: its client's)."""
        return EventRate(self.max_events_per_second, self.max_event_burst)

    @property
    def engine(self) -> EngineSettings:
        """The engine the turns run on, as one of its two kinds: what the code that builds or serves
        an engine reads, so that it cannot read a setting of the other kind (the flat fields stay the
        flags' and the environment's surface; ``_no_local_engine_options_with_engine_urls`` refuses a mix).
        Built once, when the settings are validated (and again for a ``model_copy``)."""
        return self._engine

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; its ``engine`` built from the copy's own fields (pydantic
        copies private attributes as they are, which would keep the original's engine)."""
        copy = super().model_copy(update=update, deep=deep)
        copy._engine = copy._engine_of_fields()
        return copy

    def _engine_of_fields(self) -> EngineSettings:
        if self.engine_urls:
            return VllmOmniServers(urls=tuple(self.engine_urls), api_key=self.engine_api_key)
        devices = self._listed_devices()
        return LocalEngine(
            devices=tuple(devices * self.engines if len(devices) == 1 else devices),
            max_batch=self.max_batch,
            dtype=self.dtype,
            generation=self.generation,
            threads=self.engine_threads,
            attn_implementation=self.attn_implementation,
            dev_replies=self.dev_replies,
        )

    def _listed_devices(self) -> list[str]:
        return [device.strip() for device in self.device.split(",") if device.strip()]

    @model_validator(mode="after")
    def _one_engine_per_listed_device(self) -> Settings:
        devices = self._listed_devices()
        if not devices:
            raise ValueError(f"device {self.device!r} names no device")
        if len(devices) > 1 and self.engines != 1:
            raise ValueError(
                f"engines={self.engines} with device={self.device!r}: a device list runs one engine per "
                "device; give either a list or engines"
            )
        return self

    @model_validator(mode="after")
    def _readable_dev_replies(self) -> Settings:
        load_dev_replies(self.dev_replies)  # read again where it is used: checked here, at start
        return self

    @model_validator(mode="after")
    def _no_local_engine_options_with_engine_urls(self) -> Settings:
        local = sorted(LOCAL_ENGINE_SETTINGS & self.model_fields_set)
        if self.engine_urls and local:
            raise ValueError(
                f"{', '.join(local)} set with engine_urls: they configure the in-process engine, and turns run on "
                "the vLLM-Omni servers of engine_urls; configure those servers instead (vllm serve ...)"
            )
        if self.engine_api_key is not None and not self.engine_urls:
            raise ValueError("engine_api_key is set without engine_urls: it is sent to vLLM-Omni servers only")
        return self

    @model_validator(mode="after")
    def _prompt_holds_the_session_budgets(self) -> Settings:
        needed = self.instructions_max_tokens + self.history_max_tokens + ANSWER_OPENING_TOKENS
        if self.max_prompt_tokens < needed:
            raise ValueError(
                f"max_prompt_tokens {self.max_prompt_tokens} cannot hold a session's instructions_max_tokens "
                f"({self.instructions_max_tokens}) and history_max_tokens ({self.history_max_tokens}) with the "
                f"answer's opening ({ANSWER_OPENING_TOKENS}): sessions within their budgets would have turns "
                f"refused; set it to at least {needed}"
            )
        return self

    @model_validator(mode="after")
    def _refuse_open_public_bind(self) -> Settings:
        if self.api_key is not None and not self.api_key.get_secret_value():
            raise ValueError("api_key is empty: unset OMNI_RTC_API_KEY to run without auth, or give a key")
        if self.api_key is None and not self.allow_unauthenticated_public and not is_loopback_host(self.host):
            raise ValueError(
                f"host {self.host!r} is reachable from other machines and no API key is set: "
                "set OMNI_RTC_API_KEY (or --api-key), or pass --allow-unauthenticated-public "
                "to let anyone who can reach the port place calls"
            )
        # A proxy on this host connects from 127.0.0.1: behind one, a loopback bind says nothing
        # about who the clients are.
        if self.api_key is None and not self.allow_unauthenticated_public and self.trusted_proxies:
            raise ValueError(
                f"trusted_proxies {self.trusted_proxies} put this server behind a proxy, which lets other "
                "machines reach it, and no API key is set: set OMNI_RTC_API_KEY (or --api-key), or pass "
                "--allow-unauthenticated-public to let anyone who reaches the proxy place calls"
            )
        return self

    @model_validator(mode="after")
    def _check_edge(self) -> Settings:
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"trusted_proxies: {proxy!r} is not an IP address or CIDR network") from None
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile is set without ssl_certfile")
        if self.tls is not None and self.ssl_certfile is not None:
            raise ValueError("tls='self-signed' and ssl_certfile both name a certificate: give one")
        for name in ("ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {str(path)!r} is not a readable file")
        return self

    @model_validator(mode="after")
    def _check_ice_credentials(self) -> Settings:
        turn_urls = [url for url in self.ice_servers if url.lower().startswith(("turn:", "turns:"))]
        static = self.ice_username is not None or self.ice_credential is not None
        if self.ice_auth_secret is not None:
            if static:
                raise ValueError("ice_auth_secret and ice_username/ice_credential both set: give one kind of credentials")
            if not self.ice_auth_secret.get_secret_value():
                raise ValueError("ice_auth_secret is empty")
            if not turn_urls:
                raise ValueError("ice_auth_secret is set but ice_servers names no turn:/turns: URL")
        elif static and (self.ice_username is None or self.ice_credential is None):
            raise ValueError("ice_username and ice_credential go together: give both")
        elif turn_urls and not static:
            # Browsers refuse a TURN server without credentials (RTCPeerConnection throws).
            raise ValueError(
                f"ice_servers {turn_urls} need credentials: set ice_username and ice_credential "
                "(--ice-username/--ice-credential) or ice_auth_secret (--ice-auth-secret, coturn's static-auth-secret)"
            )
        return self

    @model_validator(mode="after")
    def _build_engine(self) -> Settings:
        """Last, once every other check passed: ``engine`` reads fields they vouch for."""
        self._engine = self._engine_of_fields()
        return self



def dev_replies_file(settings: Settings) -> Path | None:
    """The ``--dev-replies`` file: scripted answers are the in-process engine's (forced through its
    tokenizer and Talker), so none with vLLM-Omni servers."""
    engine = settings.engine
    return engine.dev_replies if isinstance(engine, LocalEngine) else None


def setting_flag(name: str) -> Flag:
    """The ``Flag`` of the Settings field ``name`` (every field has one)."""
    [flag] = [item for item in Settings.model_fields[name].metadata if isinstance(item, Flag)]
    return flag


# The in-process engine's settings, which do nothing when turns run on vLLM-Omni servers (engine_urls).
LOCAL_ENGINE_SETTINGS = frozenset(
    name for name in Settings.model_fields if setting_flag(name).concern is Concern.LOCAL_ENGINE
)
