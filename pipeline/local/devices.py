"""Where an engine process runs: its device, its dtype, its CPU threads and its niceness.

torch is imported inside the functions that need it: the settings read ``usable_cores`` (the
media workers' default count) in processes that never load torch (~6 s and ~500 MB).
"""

from __future__ import annotations

import os


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def resolve_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        # bfloat16 is what the checkpoint ships in and what GPUs run fast; on CPU float32
        # matmuls are several times faster than bfloat16 ones.
        return torch.float32 if device == "cpu" else torch.bfloat16
    return getattr(torch, dtype)


# On a CPU-only box the model's threads compete with the server for cores; the server paces
# audio every 20 ms and must win, while a turn finishing a few ms later goes unnoticed.
ENGINE_NICENESS = 5
