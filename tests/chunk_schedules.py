"""Code2Wav chunk schedules for the streaming-exactness test and bench."""

from __future__ import annotations


def schedules_covering(sizes: range, *, frames: int, first: int) -> list[list[int]]:
    """Chunk schedules of ``frames`` frames, each starting with ``first``, that together hold
    every size in ``sizes`` once (largest first, packed), the rest of each run in one last chunk."""
    pending = sorted(sizes, reverse=True)
    runs = []
    while pending:
        run, room = [first], frames - first
        for size in list(pending):
            if size <= room:
                run.append(size)
                room -= size
                pending.remove(size)
        if room:
            run.append(room)
        runs.append(run)
    return runs
