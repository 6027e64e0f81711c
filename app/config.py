"""One typed settings object, read from flags and OMNI_RTC_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "omni-rtc"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OMNI_RTC_", extra="forbid")

    # Server
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: str = "info"

    # Model: a checkpoint directory or a Hugging Face id; None builds and uses the dev model.
    model: str | None = None
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    device: str = "auto"  # "auto" picks cuda when present, else cpu
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    seed: int | None = None  # makes turns reproducible

    # WebRTC
    ice_servers: list[str] = Field(default_factory=list)  # stun:/turn: URLs
    ice_loopback: bool = False  # gather on 127.0.0.1 only (tests, same-host clients)
    cors_origins: list[str] = Field(default_factory=list)

    # Limits
    max_sessions: int = Field(16, ge=1)
