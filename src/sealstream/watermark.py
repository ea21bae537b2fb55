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
batches begin or end. Given the caller's per-event thresholds (the lowest
watermark at which its judgement of the event could change), it may give an
event an upper bound of that value instead, when the bound stays below the
threshold: the judgements are the same, and the exact value is only computed
for the events near a window's end.

End of a bounded input (semantics section 10): every open window fires at
``W = +inf``, and then :meth:`WatermarkState.end_of_input` puts back the
watermark the data reached (no partition is taken as ended for good: a later run
may find more data) and remembers what the flush closed in ``closed_ms``: every
window that starts at or before the newest event time read (a session: every
event at or before it). An (event, window) pair is judged against
``max(W, closed_ms)``: a later event for a window the flush emitted is late, and
windows past the data are computed normally.

Infinities are represented by the sentinels :data:`NEG_INF` and
:data:`POS_INF`, far from any real millisecond time, so that adding window
sizes and lateness to them cannot overflow.
"""

from __future__ import annotations

from collections.abc import Callable
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
    #: live runs with ``idle_ms``: partitions that are idle leave the global minimum
    #: (docs/live.md); empty when no partition ever was
    idle: list[bool] = field(default_factory=list)
    #: a live run's partitions can appear later: without any yet, W is what it was
    #: (a bounded run without partitions has ended: +inf)
    open_ended: bool = False
    #: windows an end-of-input flush closed: an (event, window) pair is late when
    #: ``end + lateness <= max(W, closed_ms)`` (see :meth:`end_of_input`); None
    #: before any flush
    closed_ms: int | None = None

    def is_idle(self, p: int) -> bool:
        return bool(self.idle) and self.idle[p]

    def grow(self, partitions: int) -> None:
        """Add partitions (discovered while running) up to ``partitions``."""
        extra = partitions - len(self.max_time)
        if extra > 0:
            self.max_time += [None] * extra
            self.exhausted += [False] * extra
            self.last_offset += [None] * extra
            if self.idle:
                self.idle += [False] * extra

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
            return self.global_ms if self.open_ended else POS_INF
        active = [p for p in range(len(self.max_time)) if not self.is_idle(p)]
        if not active:
            return self.global_ms
        return max(self.global_ms, min(self.partition_ms(p) for p in active))

    def holder(self) -> int | None:
        """The partition holding ``W`` back: the one whose watermark is the minimum
        (the lowest index on a tie), None when ``W`` is not held by any (infinite, an
        advance above every partition, every partition idle or exhausted)."""
        active = [p for p in range(len(self.max_time))
                  if not self.is_idle(p) and not self.exhausted[p]]
        if not active:
            return None
        low = min(active, key=lambda p: (self.partition_ms(p), p))
        if self.partition_ms(low) < self.global_ms or self.partition_ms(low) >= POS_INF:
            return None
        return low

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_delay_ms": self.max_delay_ms,
            "max_time": self.max_time,
            "exhausted": self.exhausted,
            "global_ms": self.global_ms,
            "partition_ms": [self.partition_ms(p) for p in range(len(self.max_time))],
        }
        if any(self.idle):
            out["idle"] = list(self.idle)
        if self.closed_ms is not None:
            out["closed_ms"] = self.closed_ms
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WatermarkState:
        n = len(data["max_time"])
        return cls(
            max_delay_ms=int(data["max_delay_ms"]),
            max_time=[None if v is None else int(v) for v in data["max_time"]],
            exhausted=[bool(v) for v in data["exhausted"]],
            global_ms=int(data["global_ms"]),
            last_offset=[None] * n,
            idle=[bool(v) for v in data.get("idle", [])],
            closed_ms=None if data.get("closed_ms") is None else int(data["closed_ms"]),
        )

    def end_of_input(self, reach_ms: int, before_ms: int = NEG_INF) -> None:
        """After the end-of-input flush (every open window fired at ``W = +inf``):
        keep the watermark the data reached, not +inf, so that a later run over more
        data continues from it.

        - No partition stays exhausted: ``W_p = newest event time - max_delay``
          again (a partition that delivered nothing stays at minus infinity and
          holds nothing: ``W`` is at least ``global_ms``).
        - ``global_ms`` = the minimum of those over the partitions that delivered
          events: section 2's ``W`` as if no partition had ended (minus infinity
          when none did). It does not depend on batch boundaries.
        - ``closed_ms`` = ``newest event time + reach_ms`` (``reach_ms``: the window
          size, or the session gap, plus the allowed lateness): the lowest watermark
          at which every window the data reached has fired, i.e. every window that
          starts at or before the newest event time read. Those stay emitted: an
          event for one of them is late. ``before_ms`` (the global watermark before
          the last batch) raises it when higher (a live run's idle advance above the
          data): whatever fired before the flush stays closed too.
        """
        seen = [t for t in self.max_time if t is not None]
        closed = NEG_INF if self.closed_ms is None else self.closed_ms
        if seen:
            closed = max(closed, clamp(max(seen) + reach_ms))
        self.exhausted = [False] * len(self.max_time)
        self.last_offset = [None] * len(self.max_time)
        if before_ms < POS_INF:
            closed = max(closed, before_ms)
        self.global_ms = min((clamp(t - self.max_delay_ms) for t in seen), default=NEG_INF)
        self.closed_ms = max(closed, self.global_ms)

    def judged(self, w: pl.Expr) -> pl.Expr:
        """The watermark an event is judged against: ``w`` (its global watermark)
        raised to ``closed_ms``."""
        return w if self.closed_ms is None else pl.max_horizontal(w, pl.lit(self.closed_ms))


def assign_watermarks(
    events: pl.DataFrame,
    state: WatermarkState,
    batch_end: tuple[int, int] | None,
    threshold: np.ndarray[Any, np.dtype[np.int64]] | None = None,
) -> pl.DataFrame:
    """Add column ``__w`` (global watermark before each event) and advance ``state``.

    ``events`` holds the events grouped by partition, in partition order, each
    partition's events in offset order (not interleaved).
    ``batch_end`` is the read-order position ``(offset, partition)`` of the
    last record (good or bad) covered by this batch; partitions whose last
    record is at or before it are exhausted afterwards. ``state.last_offset``
    must already hold the last offsets of partitions whose reader reached the
    end.

    ``threshold`` (one per event, optional) is the lowest watermark at which
    the caller's decisions about the event could change (for windows: the
    event's oldest window would be closed). An event whose threshold lies above
    an upper bound of its watermark — the global watermark before the batch, or
    its own partition's, whichever is higher — gets that bound instead of the
    exact value: every decision comes out the same, and it is much cheaper.
    Without ``threshold`` every event gets the exact value.

    The exact value: for each partition ``q``, the events of q before event
    ``e`` (partition p, offset o) in read order are those with offset ``< o``
    (``<= o`` when ``q < p``), a prefix of q's events; their running maximum is
    found with a binary search over q's offsets, so no interleaved sort is needed.
    """
    n_parts = len(state.max_time)
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
        if threshold is None:
            w = _exact(state, part, off, times, bounds, np.arange(n))
        else:
            w = _own_bound(state, times, bounds)
            rows = np.flatnonzero(threshold <= w)
            if rows.size:
                w[rows] = _exact(state, part, off, times, bounds, rows)
        out = events.with_columns(pl.Series(WATERMARK, w, dtype=pl.Int64))

    # advance the state past this batch
    if n:
        for q in range(n_parts):
            if bounds[q + 1] > bounds[q]:
                mt = int(times[bounds[q] : bounds[q + 1]].max())
                cur = state.max_time[q]
                state.max_time[q] = mt if cur is None else max(cur, mt)
    if batch_end is not None:
        for q in range(n_parts):
            lo = state.last_offset[q]
            if lo is not None and (lo, q) <= batch_end:
                state.exhausted[q] = True
    state.global_ms = state.current()
    return out


I64 = np.ndarray[Any, np.dtype[np.int64]]


def _own_bound(state: WatermarkState, times: I64, bounds: I64) -> I64:
    """An upper bound of each event's watermark: the global watermark before the
    batch or the event's own partition's (its earlier events), whichever is higher."""
    delay = state.max_delay_ms
    w = np.full(times.size, state.global_ms, dtype=np.int64)
    for p in range(len(bounds) - 1):
        ps, pe = int(bounds[p]), int(bounds[p + 1])
        if pe - ps < 1:
            continue
        prev = state.max_time[p]
        run = np.maximum.accumulate(times[ps : pe - 1])
        if prev is not None:
            np.maximum(run, prev, out=run)
            w[ps] = max(state.global_ms, clamp(prev - delay))
        np.maximum(w[ps + 1 : pe], np.clip(run - delay, NEG_INF, POS_INF), out=w[ps + 1 : pe])
    return w


def _exact(
    state: WatermarkState, part: I64, off: I64, times: I64, bounds: I64, rows: I64
) -> I64:
    """The global watermark before each of the events ``rows``."""
    delay = state.max_delay_ms
    o, p = off[rows], part[rows]
    w = np.full(rows.size, POS_INF, dtype=np.int64)
    for q in range(len(bounds) - 1):
        if state.exhausted[q] or state.is_idle(q):
            continue
        qs, qe = int(bounds[q]), int(bounds[q + 1])
        before = _counter(off[qs:qe], rows.size)
        prev = state.max_time[q]
        # seen[k] = the largest time of q's first k events (and before the batch)
        seen = np.empty(qe - qs + 1, dtype=np.int64)
        seen[0] = NEG_INF if prev is None else prev
        np.maximum.accumulate(times[qs:qe], out=seen[1:])
        if prev is not None:
            np.maximum(seen, prev, out=seen)
        # q's events before e: offset <= o when q < p, offset < o otherwise
        idx = before(o + (p > q))
        wq = np.clip(seen[idx] - delay, NEG_INF, POS_INF)
        lo = state.last_offset[q]
        if lo is not None:
            wq[(o > lo) | ((o == lo) & (p > q))] = POS_INF
        np.minimum(w, wq, out=w)
    np.maximum(w, state.global_ms, out=w)
    return w


def _counter(offsets: I64, queries: int) -> Callable[[I64], I64]:
    """``f(x)``: how many of the sorted ``offsets`` are below each ``x``. A binary
    search for a few queries; for many, a prefix count over the offsets' span
    (the offsets of one batch are close together)."""
    if queries < 64 or offsets.size == 0:
        return lambda x: np.searchsorted(offsets, x, side="left")
    lo = int(offsets[0])
    span = int(offsets[-1]) - lo + 2
    marks = np.zeros(span + 1, dtype=np.int64)
    marks[offsets - lo + 1] = 1
    upto = np.cumsum(marks)  # upto[k] = how many offsets are below lo + k

    def count(x: I64) -> I64:
        return upto[np.clip(x - lo, 0, span)]

    return count
