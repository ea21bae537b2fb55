"""The data plane's pure pieces: a partition's slab per step, its watermark
breakpoints, and the exact per-event watermark rebuilt on a key's worker.

A step covers, in every partition, the records with offset below the step's
``bound`` that were not covered before (the single-process read order is
``(offset, partition)``, so a step is a prefix of the remaining read order, as a
single-process batch is). The partition's worker reads and parses its slab and
computes, from its events alone, the **breakpoints** of its partition watermark
within the slab: the offsets where ``W_q`` (the running maximum of its event
times minus ``max_delay``) rises, with the value it rises to. For tumbling and
sliding windows the values are first rounded down to the grid of window ends
plus lateness (:class:`Grid`): every judgement the window operator makes compares
a grid value with the watermark, so the rounded watermark gives the same
judgements, and a partition's watermark crosses only a few grid points per step
(about the step's time span divided by the slide). Sessions take every rise.

A key's worker receives its rows of the step from every partition's worker, and
every partition's breakpoints, and gives each row the global watermark before it
exactly as :func:`sealstream.watermark.assign_watermarks` does: for each
partition ``q``, the events of ``q`` before row ``(o, p)`` in read order are those
with offset ``< o`` (``<= o`` when ``q < p``); ``q``'s watermark there is the value
of the last breakpoint below that, or the one carried in from earlier steps.
See docs/scale-out.md for the proof that the judgements are the single-process ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from sealstream._runtime.merge import SourcePosition, _Buffer, _split
from sealstream.sources._base import OFFSET, PARTITION, RAW, TIME, PartitionReader, RawSpan
from sealstream.watermark import NEG_INF, POS_INF, WATERMARK, WatermarkState, clamp

I64 = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class Grid:
    """Watermark values that matter for tumbling/sliding windows: ``k * slide + c``
    (window ends plus allowed lateness). ``None`` (sessions): every value matters."""

    slide: int
    c: int

    @classmethod
    def of(cls, size_ms: int, slide_ms: int, lateness_ms: int) -> Grid:
        return cls(slide_ms, (size_ms + lateness_ms) % slide_ms)

    def floor(self, w: I64) -> I64:
        """The largest grid value ``<= w`` (the infinities stay)."""
        out = (w - self.c) // self.slide * self.slide + self.c
        return np.where((w <= NEG_INF) | (w >= POS_INF), w, out)


def rounded(w: I64, grid: Grid | None) -> I64:
    return w if grid is None else grid.floor(w)


@dataclass
class Breaks:
    """Partition ``q``'s watermark within one step: after the event at ``offsets[i]``
    its watermark is at least ``values[i]`` (rounded to the grid); ``max_time`` is the
    slab's largest event time; ``last_offset`` the partition's last record once its
    reader reached the end; ``empty_done`` a partition that ended without a record."""

    q: int
    offsets: I64
    values: I64
    max_time: int | None
    last_offset: int | None
    empty_done: bool
    drained: bool


def breakpoints(q: int, events: pl.DataFrame, delay_ms: int, grid: Grid | None,
                last_offset: int | None, empty_done: bool, drained: bool) -> Breaks:
    """The breakpoints of partition ``q``'s slab (events in offset order)."""
    if not events.height:
        e = np.zeros(0, dtype=np.int64)
        return Breaks(q, e, e, None, last_offset, empty_done, drained)
    times = events.get_column(TIME).to_numpy().astype(np.int64, copy=False)
    run = np.maximum.accumulate(times)
    vals = rounded(np.clip(run - delay_ms, NEG_INF, POS_INF), grid)
    rise = np.empty(vals.size, dtype=np.bool_)
    rise[0] = True
    np.greater(vals[1:], vals[:-1], out=rise[1:])
    idx = np.flatnonzero(rise)
    offs = events.get_column(OFFSET).to_numpy().astype(np.int64, copy=False)
    return Breaks(q, offs[idx].copy(), vals[idx].copy(), int(run[-1]), last_offset,
                  empty_done, drained)


def prepare(state: WatermarkState, breaks: list[Breaks]) -> None:
    """Before a step's rows get their watermark (the single-process ``_apply``): the
    last offsets the readers found, and partitions that ended without a record."""
    for b in breaks:
        if b.last_offset is not None:
            state.last_offset[b.q] = b.last_offset
        elif b.empty_done:
            state.exhausted[b.q] = True


def advance(state: WatermarkState, breaks: list[Breaks], bound: int) -> bool:
    """After the step (records with offset ``< bound``): the new maxima, the
    partitions exhausted, the global watermark. Returns whether the input is done."""
    for b in breaks:
        if b.max_time is not None:
            cur = state.max_time[b.q]
            state.max_time[b.q] = b.max_time if cur is None else max(cur, b.max_time)
    for q, lo in enumerate(state.last_offset):
        if lo is not None and lo < bound:
            state.exhausted[q] = True
    finished = all(b.drained for b in breaks)
    if finished:
        state.exhausted = [True] * len(state.exhausted)
        state.global_ms = POS_INF
    state.global_ms = state.current()
    return finished


def row_watermarks(events: pl.DataFrame, state: WatermarkState, breaks: list[Breaks],
                   grid: Grid | None) -> pl.DataFrame:
    """``events`` (one key shard's rows of the step, grouped by partition in
    partition order) with ``__w``: the global watermark before each (rounded to the
    grid), from ``state`` before the step (after :func:`prepare`) and the breaks."""
    if not events.height:
        return events.with_columns(pl.lit(None, dtype=pl.Int64).alias(WATERMARK))
    o = events.get_column(OFFSET).to_numpy().astype(np.int64, copy=False)
    p = events.get_column(PARTITION).to_numpy().astype(np.int64, copy=False)
    w = np.full(o.size, POS_INF, dtype=np.int64)
    delay = state.max_delay_ms
    by_q = {b.q: b for b in breaks}
    for q in range(len(state.max_time)):
        if state.exhausted[q] or state.is_idle(q):
            continue
        prev = state.max_time[q]
        start = np.array([NEG_INF if prev is None else clamp(prev - delay)], dtype=np.int64)
        start = rounded(start, grid)
        b = by_q.get(q)
        if b is None or not b.offsets.size:
            wq = np.full(o.size, start[0], dtype=np.int64)
        else:
            table = np.concatenate([start, np.maximum(b.values, start[0])])
            wq = table[np.searchsorted(b.offsets, o + (p > q), side="left")]
        lo = state.last_offset[q]
        if lo is not None:
            wq[(o > lo) | ((o == lo) & (p > q))] = POS_INF
        np.minimum(w, wq, out=w)
    np.maximum(w, state.global_ms, out=w)
    w = rounded(w, grid)
    if state.closed_ms is not None:  # windows an earlier end-of-input flush closed
        np.maximum(w, state.closed_ms, out=w)  # (WatermarkState.judged, per row)
    return events.with_columns(pl.Series(WATERMARK, w, dtype=pl.Int64))


@dataclass
class Slab:
    """One partition's records of a step, as its worker took them."""

    events: pl.DataFrame
    bad: pl.DataFrame | None
    raw: list[RawSpan]
    emitted: SourcePosition
    last_offset: int | None
    empty_done: bool
    drained: bool
    next_first: int | None
    """The offset of the first record still buffered (None: none buffered)."""


class SlabReader:
    """A partition read by its worker step by step (the merger's buffer, one
    partition): :meth:`take` returns every record with offset below ``bound``."""

    def __init__(self, reader: PartitionReader, start: SourcePosition) -> None:
        self.buf = _Buffer(reader, start)

    def take(self, bound: int, chunk_records: int) -> Slab:
        buf = self.buf
        while not buf.eof and buf.next_offset < bound:
            buf.fill(chunk_records)
        raw = [s for s in buf.spans if s.first < bound]
        buf.spans = [s for s in buf.spans if s.last >= bound]
        taken, buf.events = _split(buf.events, bound)
        taken_bad, buf.bad = _split(buf.bad, bound, column="_offset")
        while buf.chunks and buf.chunks[0][1] <= bound:
            buf.chunks.popleft()
        if not buf.events and not buf.bad:
            buf.emitted = SourcePosition(buf.position, max(buf.position.offset, buf.skip_below))
        else:
            buf.emitted = SourcePosition(buf.chunks[0][0], max(bound, buf.skip_below))
        drained = buf.eof and not buf.events and not buf.bad
        return Slab(
            events=taken if taken is not None else pl.DataFrame(),
            bad=taken_bad,
            raw=raw,
            emitted=buf.emitted,
            last_offset=buf.last_offset if buf.eof else None,
            empty_done=buf.eof and buf.last_offset is None,
            drained=drained,
            next_first=buf.first_offset() if not drained else None,
        )

    def start_offset(self) -> int:
        return self.buf.skip_below

    def size_hint(self) -> tuple[int, int] | None:
        return self.buf.reader.size_hint()

    def close(self) -> None:
        self.buf.reader.close()


def raw_texts(spans: list[RawSpan], offsets: I64) -> pl.Series:
    """The raw text of the records at ``offsets`` (in that order) from ``spans``."""
    if not offsets.size:
        return pl.Series(RAW, [], dtype=pl.String)
    order: list[I64] = []
    parts: list[pl.Series] = []
    found = np.zeros(offsets.size, np.bool_)
    for span in spans:
        sel = np.flatnonzero((offsets >= span.first) & (offsets <= span.last) & ~found)
        if sel.size:
            order.append(sel)
            parts.append(span.texts(offsets[sel]))
            found[sel] = True
    if not found.all():
        raise KeyError(f"no raw text for offset {int(offsets[np.flatnonzero(~found)[0]])}")
    idx = np.concatenate(order)
    texts = pl.concat(parts, how="vertical", rechunk=False).rename(RAW)
    return texts.gather(pl.Series(np.argsort(idx, kind="stable"), dtype=pl.Int64))


def grid_of(op: Any) -> Grid | None:
    """The grid of a :class:`~sealstream.windows.operator.WindowOperator`'s judgements
    (None for sessions, whose judgements take the exact watermark)."""
    if op.watermark_threshold(pl.DataFrame({TIME: pl.Series([], dtype=pl.Int64)})) is None:
        return None
    return Grid.of(int(op.size_ms), int(op.slide_ms), int(op.lateness))
