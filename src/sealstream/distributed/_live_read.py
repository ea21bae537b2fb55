"""A worker's side of a live source on the data plane: its own partitions, read by
its own client (one Kafka consumer for the worker's partitions, assigned, never
group-managed, see sources/_kafka_shared.py; a NATS connection), positioned where the
coordinator's recorded plan says.

The coordinator plans each step as a range ``[from, to)`` of positions per
partition (:mod:`.live`) from a few numbers per partition the owners report
(:meth:`LiveReader.poll`: the position after what they hold, the first and last
record held); it records the plan, then each owner takes exactly that range
(:meth:`LiveReader.read`, polling again when it holds less, as on a replay) and
publishes the step's rows the way a bounded slab is published (breakpoints and one
Arrow buffer per key worker in Ray's object store). Records polled beyond ``to``
stay held for the next step, so a replay of the recorded plan reads exactly the
same records.

**Read-ahead** (Kafka): each partition's next poll (the broker's fetch and the
parse) runs on a thread of the worker's own from the partition's open on and as soon
as the previous one was taken, while the coordinator plans and the key workers
aggregate the current step; when the client holds nothing yet it waits for the next
fetch (at most :data:`READ_AHEAD_WAIT_S`, until the partition's poll is wanted). It is
the same poll the owner would make next, only earlier: a report takes it as its
poll (when it delivered records; an empty one is polled again, fresh) topped up with
what the client received since (so the report covers what one poll at report time
would: up to ``max_records``, everything at hand), a read takes it as the next
records of its range, so what the owners report, and therefore the plans, are
decided as without it. At most one poll per partition is read ahead (a
partition holds at most the records it reported plus one poll of ``max_records``);
records read ahead are in no step, so a worker killed with them loses nothing: the
recovery re-reads from the checkpoint's positions.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from sealstream._runtime.engine import LIVE_SEQ_PARTITIONS, _transform_stage
from sealstream._runtime.live import REPLAY_WAIT_S, _cut
from sealstream.errors import SourceError, SourceExpiredError
from sealstream.pipeline import Pipeline
from sealstream.sources._base import BAD_SCHEMA, OFFSET, PARTITION, Chunk, RawSpan
from sealstream.sources._live import LivePartition, LiveSource

#: what the owner of a partition reports when polled: the position after the records
#: it holds (its next position when it holds none), the first and the last record
#: it holds (None: none)
Report = tuple[int, int | None, int | None]

#: source kinds whose partitions are read ahead: Kafka (the worker's partitions share
#: one consumer, whose polls take turns under its lock; a poll of one partition fills
#: the others' queues too); a NATS connection is shared by the worker's subjects
READ_AHEAD_KINDS = ("kafka",)
#: threads of a worker's read-ahead (its partitions' polls run side by side)
READ_AHEAD_THREADS = 4
#: how often a read-ahead that found nothing looks again (seconds): it waits for the
#: client's next fetch instead of handing back an empty poll, outside the client's
#: lock, until its partition's next report, read, seek or close asks for it
READ_AHEAD_RETRY_S = 0.02
#: for at most this long (seconds): a partition without records (an idle topic) does
#: not hold one of the read-ahead's threads, nor look again 50 times a second, for
#: ever; the next report polls it afresh and reads ahead again
READ_AHEAD_WAIT_S = 1.0


@dataclass
class _Held:
    """One partition on its owner: the next position to hand out, the position after
    everything polled, and what was polled at or after ``next`` but not handed out."""

    part: LivePartition
    next: int
    after: int
    pending: list[Chunk] = field(default_factory=list)
    #: the next poll, read ahead on the reader's threads (at most one)
    ahead: Future[Chunk | None] | None = None
    #: set when the partition's next poll is wanted: a read-ahead still waiting for
    #: records hands back what it has (nothing) instead of waiting on
    wanted: threading.Event = field(default_factory=threading.Event)
    #: set while the read-ahead waits for records, holding none
    waiting: threading.Event = field(default_factory=threading.Event)


def _records(chunk: Chunk) -> tuple[int | None, int | None]:
    """The first and the last record's position in ``chunk`` (None: it has none)."""
    firsts = [int(frame.get_column(col)[0]) for frame, col in
              ((chunk.events, OFFSET), (chunk.bad, "_offset")) if frame.height]
    return (min(firsts) if firsts else None), chunk.last_offset


def _below(chunk: Chunk, first: int) -> Chunk:
    """``chunk`` without records before ``first`` (already handed out)."""
    lo = _records(chunk)[0]
    if lo is None or lo >= first:
        return chunk
    taken, rest = _cut(chunk, first)
    if rest is None:
        return Chunk(chunk.events.clear(), chunk.bad.clear(), None, chunk.position, False,
                     chunk.raw)
    return Chunk(rest.events, rest.bad, rest.last_offset, chunk.position, False, chunk.raw)


def _stale(chunk: Chunk, after: int) -> bool:
    """Whether a poll of a partition whose records end before ``after`` delivered
    nothing: no record, the position not moved."""
    return chunk.position.offset == after and chunk.last_offset is None


def count(chunk: Chunk | None) -> int:
    """The records (events and bad ones) of ``chunk``."""
    return 0 if chunk is None else chunk.events.height + chunk.bad.height


class LiveReader:
    """The live partitions a worker owns (partition index -> its held records)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline
        self.plan = pipeline.field_plan()
        self.source: LiveSource | None = None
        self.held: dict[int, _Held] = {}
        self.read_ahead = pipeline.source.kind in READ_AHEAD_KINDS
        self._pool: ThreadPoolExecutor | None = None
        self._max_records = max(1, pipeline.batch_size)

    def _source(self) -> LiveSource:
        if self.source is None:
            self.source = self.p.source.open_live(self.plan)  # type: ignore[union-attr]
            if hasattr(self.source, "prefetch"):
                # a worker reads ahead by itself (read_ahead, above): the single-process
                # option SEALSTREAM_KAFKA_PREFETCH would add a second thread per partition
                self.source.prefetch = 0
        assert self.source is not None
        return self.source

    def open(self, q: int, name: str, position: int | None, from_start: bool) -> int:
        """Partition ``q`` (``name``) from ``position`` (None: its beginning when
        ``from_start``, else the start mode). Returns the position it starts at."""
        self.drop(q)
        part = self._source().open(name, position, from_start)
        earliest = part.earliest()
        if position is not None and earliest is not None and position < earliest:
            part.close()
            raise SourceExpiredError(
                f"partition {name!r}: the saved position {position} is below the earliest "
                f"position still retained ({earliest}): records {position}..{earliest - 1} "
                "were deleted before they were read; nothing was skipped")
        at = part.tell() if position is None else position
        self.held[q] = h = _Held(part, at, at)
        self._start_ahead(h)  # its first fetch and parse, while the others open
        return at

    def drop(self, q: int) -> None:
        old = self.held.pop(q, None)
        if old is not None:
            self._drop_ahead(old)
            old.part.close()

    def seek(self, q: int, position: int) -> None:
        h = self.held[q]
        self._drop_ahead(h)
        h.part.seek(position)
        h.next = h.after = position
        h.pending = []

    def stop_at(self, q: int, position: int) -> None:
        """The run reads partition ``q`` up to ``position`` (``stop = "end"``)."""
        tell = getattr(self.held[q].part, "stop_at", None)
        if tell is not None:
            tell(position)

    def end(self, q: int) -> int | None:
        h = self.held[q]
        self._settle(h)
        return h.part.end()

    # ------------------------------------------------------------ read-ahead
    def _start_ahead(self, h: _Held) -> None:
        """Poll ``h``'s partition ahead, on the reader's threads (see the module
        docstring); nothing when a poll is read ahead already."""
        if not self.read_ahead or h.ahead is not None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(READ_AHEAD_THREADS, "sealstream-read-ahead")
        h.wanted, h.waiting = threading.Event(), threading.Event()
        h.ahead = self._pool.submit(self._poll_ahead, h.part, h.after, h.wanted,
                                    h.waiting, self._max_records)

    @staticmethod
    def _poll_ahead(part: LivePartition, after: int, wanted: threading.Event,
                    waiting: threading.Event, max_records: int) -> Chunk | None:
        """The read-ahead: polls (without waiting in the client, so the client's lock
        is free between its tries) until the partition delivers records or moves, or
        until its next poll is wanted (then what it has: nothing, which that poll
        takes as stale and polls again). Waiting here is what lets the next step's
        fetch and parse run while the current step is processed: a read-ahead that
        gave up at once, the client's next fetch not yet in, left the next report to
        fetch and parse on the actor's thread while the other workers waited. It
        waits at most :data:`READ_AHEAD_WAIT_S`."""
        deadline = time.monotonic() + READ_AHEAD_WAIT_S
        while True:
            waiting.clear()
            got = part.poll(max_records, 0)
            if got is None or not _stale(got, after):
                return got
            waiting.set()
            if wanted.wait(READ_AHEAD_RETRY_S) or time.monotonic() > deadline:
                return got

    @staticmethod
    def _want(h: _Held) -> Future[Chunk | None] | None:
        """``h``'s read-ahead poll, now wanted (a wait for records ends), or None when
        there is none or it had not started yet (then it never will: the caller
        polls itself instead of waiting behind other partitions' read-aheads)."""
        fut = h.ahead
        if fut is None:
            return None
        h.wanted.set()
        if fut.cancel():
            h.ahead = None
            return None
        return fut

    @staticmethod
    def _settle(h: _Held) -> None:
        """Wait for ``h``'s read-ahead poll (its result kept): the client is then
        this thread's alone."""
        fut = LiveReader._want(h)
        if fut is not None:
            wait_for([fut])

    @staticmethod
    def _drop_ahead(h: _Held) -> None:
        """Forget ``h``'s read-ahead poll (a seek, a close): its records were in no step."""
        fut = LiveReader._want(h)
        h.ahead = None
        if fut is not None:
            wait_for([fut])
            fut.exception()  # (retrieved: it was never this partition's next poll)

    def _next_poll(self, h: _Held, max_records: int, timeout_ms: int
                   ) -> tuple[Chunk | None, bool]:
        """The partition's next poll: the one read ahead when it delivered records
        (or moved the position), else a poll now (an empty one read ahead is stale);
        and whether it was read ahead."""
        fut = self._want(h)
        h.ahead = None
        if fut is not None:
            got = fut.result()  # its error is this poll's error
            if got is not None and not _stale(got, h.after):
                return got, True
        return h.part.poll(max(1, max_records), timeout_ms), False

    def held_records(self) -> dict[int, tuple[int, int | None]]:
        """Per partition: the records it holds for the next step (reported or not)
        and those of its read-ahead poll (None: still in flight; 0 while it waits
        for records, holding none)."""
        out: dict[int, tuple[int, int | None]] = {}
        for q, h in self.held.items():
            ahead = h.ahead
            done = ahead is not None and ahead.done() and ahead.exception() is None
            out[q] = (sum(count(c) for c in h.pending),
                      count(ahead.result()) if done and ahead is not None
                      else (0 if ahead is None or h.waiting.is_set() else None))
        return out

    def poll(self, q: int, max_records: int, timeout_ms: int) -> Report:
        """Poll partition ``q`` once unless it holds records already; report."""
        h = self.held[q]
        self._max_records = max(1, max_records)
        if not h.pending:
            got, early = self._next_poll(h, max_records, timeout_ms)
            if got is not None and not (got.position.offset == h.next
                                        and got.last_offset is None):
                chunk = _below(got, h.next)
                h.after = got.position.offset
                if chunk.last_offset is not None or chunk.position.offset > h.next:
                    h.pending = [chunk]
                more = max_records - count(got)
                if early and count(got) and more > 0:
                    # read ahead, it took what the client held then: what came since
                    # is taken now, so that the report covers what one poll now
                    # would (up to max_records)
                    top = h.part.poll(more, 0)
                    if top is not None and top.last_offset is not None:
                        h.pending.append(top)
                        h.after = top.position.offset
        self._start_ahead(h)
        if not h.pending:
            return h.next, None, None
        spans = [_records(c) for c in h.pending]
        return (h.pending[-1].position.offset,
                min((f for f, _ in spans if f is not None), default=None),
                max((lt for _, lt in spans if lt is not None), default=None))

    def take(self, q: int, name: str, frm: int, to: int, max_records: int, poll_ms: int
             ) -> tuple[pl.DataFrame, pl.DataFrame, list[RawSpan]]:
        """Exactly the records of ``[frm, to)``: the held ones, then polled (a replay,
        or records the broker delivered in several polls) until the position
        reaches ``to``; records at or after ``to`` stay held."""
        h = self.held[q]
        self._max_records = max(1, max_records)
        if h.next != frm:
            self.seek(q, frm)
        parts: list[Chunk] = []
        deadline = time.monotonic() + REPLAY_WAIT_S
        while True:
            if h.pending:
                chunk = h.pending.pop(0)
            else:
                if h.after >= to:
                    break
                got, _ = self._next_poll(h, max_records, poll_ms or 100)
                if got is None:
                    raise SourceError(f"partition {name!r} ended at position {h.after}, "
                                      f"before the position {to} a recorded step reads up to")
                if got.position.offset == h.after and got.last_offset is None:
                    if time.monotonic() > deadline:
                        raise SourceError(
                            f"partition {name!r}: a recorded step reads up to position "
                            f"{to}, but the source delivers nothing after {h.after}")
                    continue
                chunk = _below(got, h.next)
                h.after = got.position.offset
            if chunk.position.offset > to:
                taken, rest = _cut(chunk, to)
                parts.append(taken)
                h.pending[:0] = [] if rest is None else [rest]
                break
            parts.append(chunk)
            if chunk.position.offset >= to:
                break
        h.next = to
        self._start_ahead(h)
        schema = self.plan.event_schema()
        events = [c.events for c in parts if c.events.height]
        bad = [c.bad for c in parts if c.bad.height]
        return (pl.concat(events) if events else pl.DataFrame(schema=schema),
                pl.concat(bad) if bad else pl.DataFrame(schema=BAD_SCHEMA),
                [c.raw for c in parts if c.raw is not None])

    def close(self) -> None:
        for q in list(self.held):
            self.drop(q)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.source is not None:
            self.source.close()
            self.source = None


def publish(pipeline: Pipeline, q: int, events: pl.DataFrame, bad: pl.DataFrame,
            spans: list[RawSpan], workers: int, unseen: list[str], end: bool,
            grid_op: Any, table: tuple[int, ...] | None = None
            ) -> tuple[dict[str, Any], Any, list[Any]]:
    """A live step's rows of partition ``q`` (offset order): transformed here, their
    watermark breakpoints and each key worker's rows put in Ray's object store; a
    summary of a few numbers back (bad records' rows when there are any)."""
    import ray

    from sealstream.distributed._plane import breakpoints, grid_of
    from sealstream.distributed._shard import split
    from sealstream.distributed._worker import _failed, _seen, to_ipc, to_wire
    from sealstream.windows.aggregates import SEQ

    plan = pipeline.field_plan()
    schema = dict(plan.event_schema())
    schema[PARTITION] = pl.Int32()
    events = (events.with_columns(pl.lit(q, dtype=pl.Int32).alias(PARTITION))
              if events.height else pl.DataFrame(schema=schema)).select(list(schema))
    failed_rows = None
    transform = _transform_stage(pipeline, plan)
    if transform is not None:
        events, failed = transform.apply(events)
        if failed.height:
            failed_rows = _failed(pipeline, failed, spans)
    read = events.height
    events = events.with_columns((pl.col(OFFSET) * LIVE_SEQ_PARTITIONS + q).alias(SEQ))
    breaks = breakpoints(q, events, pipeline.watermark.max_delay_ms, grid_of(grid_op),
                         None, False, end)
    if transform is not None:
        events = transform.keep(events)
    summary = {
        "read": read,
        "max_time": breaks.max_time,
        "bad": to_ipc(bad) if bad.height else None,
        "failed": to_ipc(failed_rows) if failed_rows is not None else None,
        "seen": _seen(events, unseen) if unseen and events.height else [],
    }
    return summary, ray.put(breaks), [ray.put(to_wire(part))
                                  for part in split(events, workers, table)]
