"""Per-partition and global event-time watermarks, computed per event, columnar.

Contract (semantics section 2): before event ``i`` of partition ``p`` is
processed, ``W_p = max(event time of p's events before i) - max_delay_ms``,
or minus infinity before p's first event, or plus infinity once p is
exhausted (its last record has been processed). The global watermark
``W = min_p W_p`` never decreases.

Events are processed in the global read order ``(offset, partition index)``
(see ``sealstream._runtime.merge``). :func:`assign_watermarks` gives every
event of a batch the global watermark in force *before* it, using only the
events that precede it in that order: the result does not depend on where
batches begin or end.

Infinities are represented by the sentinels :data:`NEG_INF` and
:data:`POS_INF`, far from any real millisecond time, so that adding window
sizes and lateness to them cannot overflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from sealstream.sources._base import OFFSET, PARTITION, TIME

NEG_INF = -(2**62)
POS_INF = 2**62
WATERMARK = "__w"


def json_ms(ms: int | None) -> int | str | None:
    """A watermark for JSON output: the integer, or "-inf"/"+inf" for the sentinels."""
    if ms is None:
        return None
    if ms <= NEG_INF:
        return "-inf"
    if ms >= POS_INF:
        return "+inf"
    return ms


def clamp(value: int) -> int:
    return max(NEG_INF, min(POS_INF, value))


@dataclass
class WatermarkState:
    """What the watermark needs to continue: per-partition max time and exhaustion.

    ``max_time[p]`` is the largest event time processed in partition p (None
    before its first event); ``last_offset[p]`` is the offset of p's last record
    once the reader has reached its end (None while more may come);
    ``exhausted[p]`` is True once that last record has been processed.
    ``global_ms`` is the global watermark after everything processed so far.
    """

    max_delay_ms: int
    max_time: list[int | None]
    exhausted: list[bool]
    global_ms: int = NEG_INF
    last_offset: list[int | None] = field(default_factory=list)

    @classmethod
    def initial(cls, partitions: int, max_delay_ms: int) -> WatermarkState:
        return cls(
            max_delay_ms=max_delay_ms,
            max_time=[None] * partitions,
            exhausted=[False] * partitions,
            last_offset=[None] * partitions,
        )

    def partition_ms(self, p: int) -> int:
        if self.exhausted[p]:
            return POS_INF
        mt = self.max_time[p]
        return NEG_INF if mt is None else clamp(mt - self.max_delay_ms)

    def current(self) -> int:
        """The global watermark after everything processed so far."""
        if not self.max_time:
            return POS_INF
        return max(self.global_ms, min(self.partition_ms(p) for p in range(len(self.max_time))))

    def to_json(self) -> dict[str, Any]:
        return {
            "max_delay_ms": self.max_delay_ms,
            "max_time": self.max_time,
            "exhausted": self.exhausted,
            "global_ms": self.global_ms,
            "partition_ms": [self.partition_ms(p) for p in range(len(self.max_time))],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WatermarkState:
        n = len(data["max_time"])
        return cls(
            max_delay_ms=int(data["max_delay_ms"]),
            max_time=[None if v is None else int(v) for v in data["max_time"]],
            exhausted=[bool(v) for v in data["exhausted"]],
            global_ms=int(data["global_ms"]),
            last_offset=[None] * n,
        )


def assign_watermarks(
    events: pl.DataFrame, state: WatermarkState, batch_end: tuple[int, int] | None
) -> pl.DataFrame:
    """Add column ``__w`` (global watermark before each event) and advance ``state``.

    ``events`` holds the events grouped by partition, in partition order, each
    partition's events in offset order (not interleaved).
    ``batch_end`` is the read-order position ``(offset, partition)`` of the
    last record (good or bad) covered by this batch; partitions whose last
    record is at or before it are exhausted afterwards. ``state.last_offset``
    must already hold the last offsets of partitions whose reader reached the
    end.

    For event ``e`` of partition ``p`` at offset ``o`` and each partition
    ``q``, the events of q before e in read order are those with offset
    ``< o`` (``<= o`` when ``q < p``); their running maximum is found with a
    binary search over q's offsets, so no interleaved sort is needed.
    """
    n_parts = len(state.max_time)
    delay = state.max_delay_ms
    n = events.height
    if n == 0:
        out = events.with_columns(pl.lit(None, dtype=pl.Int64).alias(WATERMARK))
    else:
        part = events[PARTITION].to_numpy()
        if part.size > 1 and bool((part[1:] < part[:-1]).any()):
            raise ValueError("events must be grouped by partition, in partition order")
        off = events[OFFSET].to_numpy()
        times = events[TIME].to_numpy()
        bounds = np.searchsorted(part, np.arange(n_parts + 1), side="left")
        base_off = int(off.min())
        span = int(off.max()) - base_off + 1
        rel = off - base_off
        w = np.full(n, POS_INF, dtype=np.int64)
        for q in range(n_parts):
            if state.exhausted[q]:
                continue
            qs, qe = bounds[q], bounds[q + 1]
            prev = state.max_time[q]
            running = np.maximum.accumulate(times[qs:qe]) if qe > qs else times[qs:qe]
            if prev is not None and running.size:
                np.maximum(running, prev, out=running)
            base = NEG_INF if prev is None else clamp(prev - delay)
            # upto[k] = number of q's events with offset <= base_off + k - 1 (upto[0] = 0)
            marks = np.zeros(span + 1, dtype=np.int64)
            marks[rel[qs:qe] + 1] = 1
            upto = np.cumsum(marks)
            # W_q as seen by the events of each partition p, slice by slice
            for p in range(n_parts):
                ps, pe = bounds[p], bounds[p + 1]
                if pe == ps:
                    continue
                if p == q:
                    idx = np.arange(pe - ps)  # own earlier events only
                else:
                    # q's events before e: offset <= o when q < p, offset < o otherwise
                    idx = upto[rel[ps:pe] + (1 if q < p else 0)]
                wq = np.full(pe - ps, base, dtype=np.int64)
                has = idx > 0
                if running.size and has.any():
                    wq[has] = np.clip(running[idx[has] - 1] - delay, NEG_INF, POS_INF)
                lo = state.last_offset[q]
                if lo is not None:
                    o = off[ps:pe]
                    wq[(o > lo) | ((o == lo) & (p > q))] = POS_INF
                np.minimum(w[ps:pe], wq, out=w[ps:pe])
        np.maximum(w, state.global_ms, out=w)
        out = events.with_columns(pl.Series(WATERMARK, w, dtype=pl.Int64))

    # advance the state past this batch
    if n:
        maxes = events.group_by(PARTITION).agg(pl.col(TIME).max()).rows()
        for q, mt in maxes:
            cur = state.max_time[q]
            state.max_time[q] = mt if cur is None else max(cur, mt)
    if batch_end is not None:
        for q in range(n_parts):
            lo = state.last_offset[q]
            if lo is not None and (lo, q) <= batch_end:
                state.exhausted[q] = True
    state.global_ms = state.current()
    return out
