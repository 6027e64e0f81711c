"""Session-wide fixtures shared by every test package."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import transformers
from hypothesis import settings

import pipeline.local.devmodel
import pipeline.local.tokenizer
from pipeline.local.devmodel import Depth, ensure_dev_model
from pipeline.local.transformers_engine import TransformersEngine

REPO_ROOT = Path(__file__).resolve().parent.parent

logger = logging.getLogger(__name__)

# CI explores the same examples every run, so a red build always names a reproducible case;
# local runs keep exploring new ones (that is how the turn buffer's forced-cut case was found).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def _dev_model_fingerprint() -> str:
    """Changes whenever what the dev model is built from changes, so a stale build is never reused."""
    digest = hashlib.sha256(transformers.__version__.encode())
    for module in (pipeline.local.devmodel, pipeline.local.tokenizer):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    """Where tests keep built artefacts between runs: ``$OMNI_RTC_TEST_CACHE`` or ``<repo>/.cache``."""
    configured = os.environ.get("OMNI_RTC_TEST_CACHE")
    return Path(configured) if configured else REPO_ROOT / ".cache"


def built_dev_model(depth: Depth) -> Path:
    """The dev checkpoint of ``depth``, built once and reused across runs.

    The test processes of one run (``make test`` starts two) wait for whichever builds it
    first instead of each building their own: on a fresh clone that was a build in each at once
    on two cores."""
    cache = cache_root() / "test-dev-model" / _dev_model_fingerprint()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return ensure_dev_model(cache, depth=depth, progress=logger.info)


@pytest.fixture(scope="session")
def dev_model_dir() -> Path:
    """The tiny Qwen3-Omni dev checkpoint (about 15 s to build)."""
    return built_dev_model("tiny")


@pytest.fixture(scope="session")
def real_depth_model_dir() -> Path:
    """The dev checkpoint at the real model's layer and expert counts, tiny widths (docs/MODEL.md)."""
    return built_dev_model("real")


@contextlib.asynccontextmanager
async def started_dev_engine(model_dir: Path, **options: Any) -> AsyncIterator[TransformersEngine]:
    """A ``TransformersEngine`` of ``model_dir`` (the dev model) on the CPU, one thread, seed 0
    (``options``: its other arguments), started; closed after."""
    engine = TransformersEngine(model_dir, device="cpu", seed=0, threads=1, **options)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
