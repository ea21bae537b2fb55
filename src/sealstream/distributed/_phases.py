"""Where a worker's time goes: wall and CPU seconds per phase of the data plane.

A few clock reads per step and phase (never per event), kept in the worker and read
by the benchmark (``bench/scaleout.py``, its profile table) through
:meth:`ShardWorker.phase_times`. The CPU is the process's (Polars' threads
included), so a phase that runs beside another (a checkpoint's encoding on its own
thread) shares it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Phases:
    """Accumulated ``(calls, wall s, CPU s)`` per phase name."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            t = self.totals.setdefault(name, [0.0, 0.0, 0.0])
            t[0] += 1
            t[1] += time.perf_counter() - w0
            t[2] += time.process_time() - c0

    def take(self) -> dict[str, tuple[int, float, float]]:
        """The totals so far (and start again)."""
        out = {k: (int(v[0]), v[1], v[2]) for k, v in self.totals.items()}
        self.totals = {}
        return out
