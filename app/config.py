"""One typed settings object, read from flags and OMNI_RTC_* environment variables."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from pipeline.local.devices import usable_cores
from pipeline.token_count import ANSWER_OPENING_TOKENS, DEFAULT_MAX_PROMPT_TOKENS

# Settings of the in-process engine, which do nothing when turns run on vLLM-Omni servers (engine_urls).
LOCAL_ENGINE_SETTINGS = frozenset(
    {"device", "engines", "max_batch", "dtype", "generation", "engine_threads", "attn_implementation", "dev_replies"}
)


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


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OMNI_RTC_", extra="forbid")

    # Server
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: str = "info"

    # Auth: with an API key, placing a call takes `Authorization: Bearer <key or ek_ client secret>`.
    api_key: SecretStr | None = None
    # Binding to a non-loopback host without an API key is refused unless this is set.
    allow_unauthenticated_public: bool = False

    # Model: a checkpoint directory or a Hugging Face id; None builds and uses the dev model.
    model: str | None = None
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    # The end-of-turn model for semantic_vad (installed by `make`); None: cache_dir's copy.
    # Missing, the server starts and sessions asking for semantic_vad get an error and server VAD.
    turn_model: Path | None = None
    # semantic_vad's second opinion from the words (app/realtime/semantic_vad.py): "engine" has
    # Qwen3-Omni transcribe the utterance at each candidate silence and score whether its text is
    # a complete turn (two short engine turns per check). Off by default: the dev model's words
    # are noise, and on a CPU a check costs as much as a turn. Turn it on with real weights.
    turn_text_judge: Literal["off", "engine"] = "off"
    # "auto" picks cuda when present, else cpu; a comma-separated list ("cuda:0,cuda:1") runs
    # one engine process per device, each turn going to the least loaded one.
    device: str = "auto"
    engines: int = Field(1, ge=1)  # engine processes on a single device (e.g. several on CPU)
    # Turns one engine process decodes together; more wait first in, first out (queue_wait_ms).
    max_batch: int = Field(8, ge=1)
    # Answers start at a candidate end of turn (the silence's first quiet window) on spare engine
    # capacity and are held until the commit (app/realtime/speculation.py); the default of each
    # session's turn_detection.speculative_response. Off: every answer starts at the commit.
    speculative_responses: bool = True
    # With input transcription on, the words are also transcribed while the user speaks, about
    # every second, on spare engine capacity (app/realtime/partial_transcripts.py); the default of
    # each session's audio.input.transcription.partials. Off: only after the commit.
    partial_transcripts: bool = True
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    seed: int | None = None  # makes turns reproducible
    # pipeline.local.params.GenerationParams fields for every turn (JSON in the environment), e.g.
    # {"max_audio_frames": 250} caps an answer at 20 s of speech (12.5 codec frames per second).
    generation: dict[str, Any] = Field(default_factory=dict)
    engine_threads: int | None = Field(None, ge=1)  # torch CPU threads in the engine process
    # from_pretrained's attention kernels; None: transformers' default (sdpa). docs/MODEL.md.
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = None
    # A JSON list of answer texts the model says, one per response of each session, then its own:
    # for the dev model in tests and demos (make it call a tool); it scripts any checkpoint.
    dev_replies: Path | None = None
    # vLLM-Omni servers to run turns on instead of the in-process engine (pipeline/vllm_omni/vllm_omni_engine.py): their
    # API base URLs, e.g. http://gpu-1:8091/v1; each turn goes to the least loaded reachable one.
    # With them, `model` is the served model name sent with each turn (None: the server's own).
    engine_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    engine_api_key: SecretStr | None = None  # sent as `Authorization: Bearer` (vllm serve --api-key)

    # WebRTC. List settings read from the environment as comma-separated values (or JSON lists).
    ice_servers: Annotated[list[str], NoDecode] = Field(default_factory=list)  # stun:/turn: URLs
    # TURN credentials for the turn:/turns: URLs in ice_servers, for the server's own peers and for
    # the page (GET /v1/realtime/ice_servers): a static username and credential, or coturn's
    # shared secret (time-limited REST credentials minted per call, valid turn_ttl_s).
    turn_username: str | None = None
    turn_credential: SecretStr | None = None
    turn_secret: SecretStr | None = None
    # Credentials are used within seconds (gathering); coturn checks the expiry only when an
    # allocation authenticates, so a call outlives them (docs/DEPLOY.md).
    turn_ttl_s: int = Field(300, ge=30, le=86_400)
    ice_loopback: bool = False  # gather on 127.0.0.1 only (tests, same-host clients)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # A call whose peer was never connected after this long is dropped (an offer posted, then gone).
    # ICE and DTLS take well under a second on a LAN and a few seconds through TURN; an offer
    # that never connects holds a session slot this long (it was 30 s: issue 23).
    connect_timeout_s: float = Field(10.0, gt=0)
    # A connected peer that sends no media for this long counts as disconnected and its call
    # ends. Browsers send a 20 ms frame even when muted; aiortc alone notices a vanished
    # peer only when ICE consent expires (6 missed checks x 5 s = ~30 s).
    disconnect_timeout_s: float = Field(10.0, gt=0)
    # Inbound audio through omni-rtc's jitter buffer (media/jitter_buffer.py: a playout deadline,
    # FEC and PLC concealment). False: aiortc's own receive path, which stalls on every lost packet;
    # the fallback should an aiortc upgrade refuse the receiver tap, and the "before" of the network bench.
    jitter_buffer: bool = True

    # Sessions: what a client's turn detection gets when it leaves interrupt_response out (and the
    # session's turn detection before any session.update). True is OpenAI's default, which the
    # frameworks rely on (pipecat sends no turn detection); False makes API clients half-duplex
    # unless they ask for barge-in (the page sends its own toggle either way). docs/SESSION.md.
    default_interrupt_response: bool = True

    # Limits. Past each one the client gets a clear error (HTTP status, or an `error` event
    # while the session goes on).
    max_sessions: int = Field(16, ge=1)  # concurrent calls; the next offer gets 429 + Retry-After
    # Media worker processes; by default one per usable core, since one process carries one
    # core's worth of calls (aiortc runs on the GIL). 1: every call in the server process itself;
    # N > 1: calls spread over N processes behind the one port (app/web/workers.py).
    media_workers: int = Field(default_factory=usable_cores, ge=1)
    max_sdp_bytes: int = Field(65_536, ge=1_024)  # offer body; browsers send 3-8 KB; past it 413
    # One data-channel event. 256 KiB carries ~5 s of base64 PCM16 audio in conversation.item.create.
    max_event_bytes: int = Field(262_144, ge=1_024)
    max_events_per_second: float = Field(50.0, gt=0)  # sustained client event rate per session
    max_event_burst: int = Field(100, ge=1)  # events accepted at once before the rate applies
    # One input_image's bytes; the event carrying it may be that much (as base64) over max_event_bytes.
    # 10 MiB holds any phone photo; over WebRTC the data channel takes 256 KiB messages at most.
    max_image_bytes: int = Field(10_485_760, ge=1_024, le=16_777_216)
    # Pixels of a camera frame the server decodes (media/video_gate.py: read from the key frame's
    # header, before decoding); a stream past it is dropped undecoded and the call goes on. A
    # 1080p frame is ~3 MB decoded; a peer may declare 16383x16383 (~400 MB).
    max_video_pixels: int = Field(1920 * 1080, ge=64 * 64, le=7680 * 4320)
    # Characters in one text field of a client event (input_text, instructions); ~4k tokens.
    max_text_chars: int = Field(16_000, ge=1)
    # The conversation's prompt tokens after the system prompt, as its items estimate them (an
    # upper bound: text counts a token per UTF-8 byte, audio 13 per second exactly); past it
    # the oldest items go, each announced with conversation.item.deleted. OpenAI's token-based
    # truncation (token_limits.post_instructions) does the same.
    history_max_tokens: int = Field(16_000, ge=1_000)
    # A session's system message: its instructions and tools together, in Qwen tokens (counted
    # exactly once their bytes pass it); past it session.update (an offer's or a client secret's
    # session, response.create's own) is refused with invalid_value (app/realtime/prompt_budget.py).
    instructions_max_tokens: int = Field(16_000, ge=1_000)
    # The longest prompt the engine takes (in-process: counted by its tokenizer; vLLM-Omni: by
    # pipeline/token_count.py before it is sent): longer, the turn alone fails prompt_too_long
    # before it joins a batch. Must hold the two budgets above (the Thinker has 65,536 positions).
    max_prompt_tokens: int = Field(DEFAULT_MAX_PROMPT_TOKENS, ge=2_048)
    # Calls one client address may have still connecting (offered, ICE/DTLS not yet up); the next
    # offer gets 429. A page connects one call at a time; a load tool on one host may open a few.
    max_connecting_per_client: int = Field(8, ge=1)
    max_session_s: float = Field(3_600.0, gt=0)  # a call ends after this long, as OpenAI's do at 60 min
    # A response whose engine yields nothing for this long ends `failed` and the session serves the
    # next turn. Queue wait counts: 16 sessions x ~2 s CPU dev-model turns stay well under.
    turn_stall_timeout_s: float = Field(60.0, gt=0)

    # The edge (docs/DEPLOY.md): TLS, proxies whose forwarded headers are believed, the Host names
    # answered, who may read /metrics. Kept together so that trust decisions read in one place.
    ssl_certfile: Path | None = None  # PEM certificate (chain); serves HTTPS and WSS
    ssl_keyfile: Path | None = None  # its private key, when not in ssl_certfile
    # "self-signed": a certificate for this host's names and addresses, made once in cache_dir/tls.
    tls: Literal["self-signed"] | None = None
    # Peers (addresses or CIDR networks) whose X-Forwarded-For/-Proto are believed; none by default.
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Host names (or *.suffix patterns, or "*") answered besides localhost and the bind address.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    metrics_public: bool = False  # /metrics and /healthz's details without the API key

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
    def engine_devices(self) -> list[str]:
        """One device per engine process."""
        devices = [device.strip() for device in self.device.split(",") if device.strip()]
        return devices * self.engines if len(devices) == 1 else devices

    @model_validator(mode="after")
    def _one_engine_per_listed_device(self) -> Settings:
        devices = [device.strip() for device in self.device.split(",") if device.strip()]
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
    def _jitter_buffer_needs_a_known_aiortc(self) -> Settings:
        if self.jitter_buffer:
            from media.aiortc_version import UnsupportedAiortc
            from media.receiver_tap import check_receiver_tap

            try:
                check_receiver_tap()
            except UnsupportedAiortc as exc:
                raise ValueError(f"jitter_buffer: {exc}") from None
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
    def _check_turn_credentials(self) -> Settings:
        turn_urls = [url for url in self.ice_servers if url.lower().startswith(("turn:", "turns:"))]
        static = self.turn_username is not None or self.turn_credential is not None
        if self.turn_secret is not None:
            if static:
                raise ValueError("turn_secret and turn_username/turn_credential both set: give one kind of credentials")
            if not self.turn_secret.get_secret_value():
                raise ValueError("turn_secret is empty")
            if not turn_urls:
                raise ValueError("turn_secret is set but ice_servers names no turn:/turns: URL")
        elif static and (self.turn_username is None or self.turn_credential is None):
            raise ValueError("turn_username and turn_credential go together: give both")
        elif turn_urls and not static:
            # Browsers refuse a TURN server without credentials (RTCPeerConnection throws).
            raise ValueError(
                f"ice_servers {turn_urls} need credentials: set turn_username and turn_credential "
                "(--ice-username/--ice-credential) or turn_secret (--turn-secret, coturn's static-auth-secret)"
            )
        return self
