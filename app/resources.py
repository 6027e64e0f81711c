"""What one server process holds right now (RSS, threads, fds, asyncio tasks, child processes).

``GET /debug/resources`` (``app.http.debug``) reports it for the front process, and each media
worker (``app.serving.media_worker``) measures itself with the same function when the front asks.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from typing import Any

import psutil

_THREAD_NUMBER = re.compile(r"[_-]?\d+(?: \(.*\))?$")  # "Thread-3 (worker)" -> "Thread"


def process_resources() -> dict[str, Any]:
    """RSS, threads, open file descriptors and asyncio tasks of this process, right now."""
    process = psutil.Process()
    children = process.children(recursive=True)
    return {
        "rss_bytes": process.memory_info().rss,
        "threads": threading.active_count(),
        # Python threads by name without their number ("asyncio_3" -> "asyncio"): the default
        # executor's pool grows on demand up to its size, so a leak shows as another kind growing.
        "thread_kinds": dict(Counter(_THREAD_NUMBER.sub("", thread.name) for thread in threading.enumerate())),
        "os_threads": process.num_threads(),  # includes native pools (torch, onnxruntime, av)
        "fds": process.num_fds(),
        "asyncio_tasks": len(asyncio.all_tasks()),
        # The engine process, the media workers (and multiprocessing's helpers): where the
        # model's memory lives.
        "child_processes": len(children),
        "children_rss_bytes": sum(_rss(child) for child in children),
    }


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.NoSuchProcess:  # ended between listing and reading (an engine restart)
        return 0
