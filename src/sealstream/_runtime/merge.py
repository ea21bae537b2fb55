"""Deterministic interleaving of partitions into one read order.

The read order is ``(offset, partition index)``: line 0 of every partition in
the order of ``source.paths``, then line 1 of every partition, and so on; a
partition that has ended drops out. It is a total order fixed by the input
alone, so the per-event watermark, lateness and firing do not depend on batch
size, checkpoint interval or crashes.

:class:`PartitionMerger` keeps a buffer per partition and emits batches that
are prefixes of the remaining read order: every buffered record whose offset
is below the smallest "next unread offset" of the partitions that have not
reached their end.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from sealstream.sources._base import (
    BAD_SCHEMA,
    OFFSET,
    PARTITION,
    RAW,
    Chunk,
    FieldPlan,
    PartitionPosition,
    PartitionReader,
    RawSpan,
)

_INF = 2**62


@dataclass(frozen=True)
class SourcePosition:
    """Where a partition resumes: reopen the reader at ``resume`` and skip records
    whose offset is below ``next_offset`` (they were processed already).

    ``next_offset`` is the partition's position in the contract's sense: the
    offset of the next record to process. It can exceed ``resume.offset`` when
    the batch ended inside a chunk the reader had already returned.
    """

    resume: PartitionPosition
    next_offset: int

    def to_json(self) -> dict[str, object]:
        return {"next_offset": self.next_offset, "resume": self.resume.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourcePosition:
        return cls(PartitionPosition.from_json(data["resume"]), int(data["next_offset"]))

    @classmethod
    def start(cls) -> SourcePosition:
        return cls(PartitionPosition(), 0)


@dataclass
class Batch:
    """A prefix of the remaining read order.

    ``events`` hold each partition's events in offset order, partition after
    partition (the read order is ``(__off, __p)``; :mod:`sealstream.watermark`
    works from that without an interleaving sort); ``bad`` holds bad records with
    ``_p`` (partition index) and the bad-record columns. ``end`` is the last
    read-order position covered, ``positions`` where each partition resumes
    after this batch.
    """

    events: pl.DataFrame
    bad: pl.DataFrame
    end: tuple[int, int]
    positions: list[SourcePosition]
    last_offsets: list[int | None]
    finished: bool
    empty_and_done: list[bool]
    """Partitions that reached their end without a record left to read."""
    raw: list[list[RawSpan]] = field(default_factory=list)
    """Per partition, where the raw text of this batch's events comes from."""
    step: int | None = None
    """Live runs: the recorded step this batch is (None: bounded, or no step)."""

    def raw_texts(
        self, partitions: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64]
    ) -> pl.Series:
        """The raw JSON text of this batch's events ``(partition, offset)``, in order."""
        n = len(offsets)
        if n == 0:
            return pl.Series(RAW, [], dtype=pl.String)
        order: list[npt.NDArray[np.int64]] = []
        parts: list[pl.Series] = []
        found = np.zeros(n, np.bool_)
        for q, spans in enumerate(self.raw):
            in_q = partitions == q
            if not in_q.any():
                continue
            for span in spans:
                sel = np.flatnonzero(in_q & (offsets >= span.first) & (offsets <= span.last))
                if len(sel):
                    order.append(sel)
                    parts.append(span.texts(offsets[sel]))
                    found[sel] = True
        if not found.all():
            miss = int(np.flatnonzero(~found)[0])
            raise KeyError(
                f"no raw text for partition {int(partitions[miss])} offset {int(offsets[miss])}"
            )
        idx = np.concatenate(order)
        texts = pl.concat(parts, how="vertical", rechunk=False).rename(RAW)
        return texts.gather(pl.Series(np.argsort(idx, kind="stable"), dtype=pl.Int64))


class _Buffer:
    def __init__(self, reader: PartitionReader, start: SourcePosition) -> None:
        self.reader = reader
        self.events: list[pl.DataFrame] = []
        self.bad: list[pl.DataFrame] = []
        self.skip_below = start.next_offset  # records below were processed before
        self.next_offset = start.resume.offset  # next offset the reader will produce
        self.position = start.resume  # reader position after everything buffered
        # (reader position before a buffered chunk, offset after it), oldest first:
        # the chunks that may still hold records not taken into a batch
        self.chunks: deque[tuple[PartitionPosition, int]] = deque()
        self.eof = False
        self.last_offset: int | None = None
        self.emitted = start
        self.spans: list[RawSpan] = []  # of the chunks with buffered events

    def records(self) -> int:
        """How many records (events and bad ones) are buffered."""
        return sum(f.height for f in self.events) + sum(f.height for f in self.bad)

    def first_offset(self) -> int | None:
        """The offset of the first buffered record, None when none is buffered."""
        heads = [int(f[OFFSET][0]) for f in self.events[:1]]
        heads += [int(f["_offset"][0]) for f in self.bad[:1]]
        return min(heads) if heads else None

    def fill(self, max_records: int) -> None:
        chunk: Chunk | None = self.reader.next_chunk(max_records)
        if chunk is None:
            self.eof = True
            return
        before = self.position
        self.chunks.append((before, chunk.position.offset))
        ev, bad = chunk.events, chunk.bad
        if self.skip_below > before.offset:
            ev = ev.filter(pl.col(OFFSET) >= self.skip_below)
            bad = bad.filter(pl.col("_offset") >= self.skip_below)
        if ev.height:
            self.events.append(ev)
            if chunk.raw is not None:
                self.spans.append(chunk.raw)
        if bad.height:
            self.bad.append(bad)
        if chunk.last_offset is not None:
            self.last_offset = chunk.last_offset
        self.position = chunk.position
        self.next_offset = max(self.next_offset, chunk.position.offset)
        if chunk.eof:
            self.eof = True


class PartitionMerger:
    """Turns partition readers into batches in the global read order."""

    def __init__(
        self,
        readers: list[PartitionReader],
        positions: list[SourcePosition],
        plan: FieldPlan,
        batch_size: int,
    ) -> None:
        self.buffers = [_Buffer(r, pos) for r, pos in zip(readers, positions, strict=True)]
        self.schema = plan.event_schema()
        self.batch_size = batch_size

    def next_batch(self) -> Batch | None:
        """The next batch, or None when every partition is exhausted and drained."""
        while True:
            batch = self._try_batch()
            if batch is not None:
                return batch

    def _try_batch(self) -> Batch | None:
        """A batch, or None when nothing below the bound was read yet (read on)."""
        # a buffer with only a few records left would hold the bound, and so the
        # batch, down to them: top it up first (it stays below 1.5 batches)
        low = max(1, self.batch_size // 2)
        for buf in self.buffers:
            if not buf.eof and buf.records() < low:
                buf.fill(self.batch_size)
        live = [b.next_offset for b in self.buffers if not b.eof]
        bound = min(live) if live else _INF
        # and at most batch_size offsets of any partition (its buffer may hold more)
        firsts = [f for f in (b.first_offset() for b in self.buffers) if f is not None]
        if firsts:
            bound = min(bound, min(firsts) + self.batch_size)
        ev_parts: list[pl.DataFrame] = []
        bad_parts: list[pl.DataFrame] = []
        raw: list[list[RawSpan]] = []
        for q, buf in enumerate(self.buffers):
            raw.append([s for s in buf.spans if s.first < bound])
            buf.spans = [s for s in buf.spans if s.last >= bound]
            taken, buf.events = _split(buf.events, bound)
            taken_bad, buf.bad = _split(buf.bad, bound, column="_offset")
            if taken is not None:
                ev_parts.append(_with_partition(taken, PARTITION, q))
            if taken_bad is not None:
                bad_parts.append(_with_partition(taken_bad, "_p", q))
            while buf.chunks and buf.chunks[0][1] <= bound:
                buf.chunks.popleft()  # every record of that chunk is taken (or was skipped)
            if not buf.events and not buf.bad:
                buf.emitted = SourcePosition(buf.position, max(buf.position.offset, buf.skip_below))
            elif bound != _INF:
                # resume before the oldest chunk with records left, skipping the taken ones
                buf.emitted = SourcePosition(buf.chunks[0][0], max(bound, buf.skip_below))
        finished = all(b.eof and not b.events and not b.bad for b in self.buffers)
        if not ev_parts and not bad_parts and not finished and bound != _INF:
            return None  # nothing below the bound yet (e.g. only skipped lines): read on
        schema = dict(self.schema)
        schema[PARTITION] = pl.Int32()
        events = (
            pl.concat(ev_parts, how="vertical", rechunk=False)
            if ev_parts
            else pl.DataFrame(schema=schema)
        )
        if ev_parts:
            events = events.select(list(schema))
        bad_schema = dict(BAD_SCHEMA)
        bad_schema["_p"] = pl.Int32()
        bad = (
            pl.concat(bad_parts, how="vertical").sort(["_offset", "_p"])
            if bad_parts
            else pl.DataFrame(schema=bad_schema)
        )
        end = (bound - 1, len(self.buffers) - 1) if bound != _INF else (_INF, _INF)
        return Batch(
            events=events,
            bad=bad,
            end=end,
            positions=[b.emitted for b in self.buffers],
            last_offsets=[b.last_offset if b.eof else None for b in self.buffers],
            finished=finished,
            empty_and_done=[b.eof and b.last_offset is None for b in self.buffers],
            raw=raw,
        )

    def size_hint(self) -> tuple[int, int] | None:
        done = total = 0
        for b in self.buffers:
            hint = b.reader.size_hint()
            if hint is None:
                return None
            done += hint[0]
            total += hint[1]
        return done, total

    def close(self) -> None:
        for b in self.buffers:
            b.reader.close()


def _with_partition(frame: pl.DataFrame, name: str, q: int) -> pl.DataFrame:
    """``frame`` with the Int32 column ``name`` = ``q`` appended: one eager column
    (``with_columns(pl.lit(q))`` runs the lazy engine, which rechunks the frame)."""
    return frame.hstack([pl.Series(name, np.full(frame.height, q, np.int32))])


def _split(
    frames: list[pl.DataFrame], bound: int, column: str = OFFSET
) -> tuple[pl.DataFrame | None, list[pl.DataFrame]]:
    """Split buffered frames into (rows with offset < bound, the rest)."""
    if not frames:
        return None, []
    taken: list[pl.DataFrame] = []
    rest: list[pl.DataFrame] = []
    for f in frames:
        if rest:
            rest.append(f)
            continue
        last = f[column][-1]
        if last < bound:
            taken.append(f)
            continue
        first = f[column][0]
        if first >= bound:
            rest.append(f)
            continue
        cut = f[column].search_sorted(bound)
        taken.append(f.slice(0, cut))
        rest.append(f.slice(cut))
    return (pl.concat(taken, how="vertical") if taken else None), rest
