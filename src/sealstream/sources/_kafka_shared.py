"""One consumer for all of a Kafka source's partitions (the default reading path).

A :class:`SharedReader` owns one librdkafka consumer to which every partition of the
source that the run opened is assigned (``incremental_assign``: no group, no
rebalancing). A poll of one partition that has nothing buffered makes ONE
``consume()`` call, which returns the partitions' records interleaved; their values
are parsed in ONE call of the columnar parser (all partitions together), then split
by partition in one columnar pass and queued on each partition's
:class:`SharedPartition`. A partition's poll hands out its oldest queued chunk (cut at
``max_records``), so each partition still has a position of its own, exact: the
offset after the last record handed out. Records are never handed out twice or
skipped: a partition's records arrive from the client in offset order, and a
``seek`` (or a close) of one partition re-assigns it alone, dropping what was queued
for it (librdkafka drops what it had fetched before the seek).

Why: one consumer per partition costs a fetcher and its queues per partition, and a
parse per partition per step; measured in ``bench/results/speed.md`` sections 8
and 10 and ``bench/results/live.md``.

A partition whose queue holds :data:`PAUSE_AT` records or more is paused in the
client (nothing more fetched for it) until its queue is drained, so a partition the
run does not poll for a while (a backfill waiting for a slower one) does not grow
memory. Faults of another partition met in a fetch (out of range, deleted) are
raised at once, naming that partition and its offset. ``SEALSTREAM_KAFKA_CONSUMER=
per-partition`` (or read-ahead, ``SEALSTREAM_KAFKA_PREFETCH=1``) selects the old
path: a consumer per partition.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from itertools import compress, repeat
from operator import is_, is_not
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from ._base import OFFSET, Chunk, PartitionPosition, RawSpan
from ._live import ValueParser, empty_chunk

if TYPE_CHECKING:
    from .kafka import KafkaSettings, _Link

from .kafka import KafkaPartition, _consumer, message_times, parse_partition_name

#: a partition's queued records at which it is paused in the client
PAUSE_AT = 262_144
#: ``SEALSTREAM_KAFKA_CONSUMER``: "shared" (the default) or "per-partition"
ENV = "SEALSTREAM_KAFKA_CONSUMER"


def shared_wanted() -> bool:
    """Whether a source reads its partitions through one consumer (the default)."""
    v = os.environ.get(ENV, "shared").strip().lower()
    if v not in ("shared", "per-partition"):
        from ..errors import SpecError

        raise SpecError(f"{ENV}={v!r} is not one of shared, per-partition")
    return v == "shared"


class _Queued:
    """A parsed piece of one partition: its chunk, its records' offsets (ascending),
    its raw frame (when the archive taps the partition)."""

    __slots__ = ("chunk", "offsets", "raw")

    def __init__(self, chunk: Chunk, offsets: np.ndarray[Any, Any],
                 raw: pl.DataFrame | None) -> None:
        self.chunk = chunk
        self.offsets = offsets
        self.raw = raw


class SharedReader:
    """The one consumer of a source's partitions, and what it fetched for each."""

    def __init__(self, settings: KafkaSettings, parser: ValueParser, link: _Link,
                 query: Any) -> None:
        """``query``: a client of the source's that fetches nothing, for the offset
        queries (on the fetching consumer they would wait behind its fetches)."""
        self.settings = settings
        self.parser = parser
        self.link = link
        self.query = query
        self.consumer: Any = _consumer(settings.consumer_config(), link)
        self.views: dict[int, SharedPartition] = {}
        self.paused: set[int] = set()
        #: partition -> the position this run reads up to (``stop = "end"``): once
        #: fetched that far, the partition is paused for good (see :meth:`stop_at`)
        self.stops: dict[int, int] = {}
        #: held by every partition's poll, seek and close: a scale-out worker polls
        #: its partitions ahead on threads of its own (distributed/_live_read.py), and
        #: two fills at once would queue one partition's records out of order
        self.lock = threading.RLock()

    def has(self, num: int) -> bool:
        return num in self.views

    # -- assignment -------------------------------------------------------------
    def assign(self, view: SharedPartition, position: int) -> None:
        from confluent_kafka import TopicPartition

        self.consumer.incremental_assign([TopicPartition(view._topic, view._num, position)])
        self.views[view._num] = view

    def reassign(self, view: SharedPartition, position: int) -> None:
        """Read ``view`` from ``position`` on (its queue is dropped by the caller)."""
        from confluent_kafka import TopicPartition

        if view._num in self.paused:  # (a pause outlives the partition's re-assignment)
            self.paused.discard(view._num)
            self.consumer.resume([view._tp])
        self.consumer.incremental_unassign([view._tp])
        self.consumer.incremental_assign([TopicPartition(view._topic, view._num, position)])

    def release(self, view: SharedPartition) -> None:
        """``view`` closed: unassigned; the consumer closes with the last one."""
        if self.views.get(view._num) is view:
            del self.views[view._num]
            self.paused.discard(view._num)
            self.stops.pop(view._num, None)
            if self.views:
                with contextlib.suppress(Exception):  # (a client that is gone: nothing to do)
                    self.consumer.incremental_unassign([view._tp])
        if not self.views and self.consumer is not None:
            self.consumer.close()
            self.consumer = None

    # -- fetching ---------------------------------------------------------------
    def fill(self, asking: SharedPartition, max_records: int, timeout_ms: int) -> None:
        """One ``consume()`` for all partitions, parsed in one call, queued per
        partition. Waits at most ``timeout_ms`` for the first message only."""
        from confluent_kafka import KafkaError, Message

        c = self.consumer
        # up to max_records per partition, as a consumer each would take
        want = max(1, max_records) * max(1, len(self.views))
        msgs = c.consume(want, 0)
        if not msgs and timeout_ms > 0:
            msgs = c.consume(1, timeout_ms / 1000)
            if msgs and want > 1:
                msgs += c.consume(want - 1, 0)
        if not msgs:
            asking._probe()
            return
        errors = list(map(Message.error, msgs))
        eof: dict[int, int] = {}
        if any(map(is_not, errors, repeat(None))):
            errs = list(compress(msgs, map(is_not, errors, repeat(None))))
            msgs = list(compress(msgs, map(is_, errors, repeat(None))))
            for m in errs:
                view = self.views.get(m.partition())
                if view is None:
                    if m.partition() < 0:  # not a partition's: the link's, or fatal
                        asking._message_error(m)
                    continue  # (else a partition closed since)
                view._message_error(m)
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof[view._num] = max(eof.get(view._num, 0), int(m.offset()))
        self.link.ok()
        if msgs:
            self._split(msgs)
        for num, at in eof.items():
            view = self.views[num]
            if at > view._position:  # the end of what is readable: markers, aborted
                view._position = at
                if view._queue:  # after what is queued: an empty piece moves it there
                    view._queue.append(_Queued(empty_chunk(self.parser.plan, at),
                                               np.empty(0, np.int64), None))
            view._end_seen = max(view._end_seen or 0, view._position)
        self._pause_full()

    def _split(self, msgs: list[Any]) -> None:
        """The records of one ``consume()`` (all partitions) -> one parse -> a queued
        piece per partition."""
        from confluent_kafka import Message

        n = len(msgs)
        parts = np.fromiter(map(Message.partition, msgs), np.int64, count=n)
        offsets = np.fromiter(map(Message.offset, msgs), np.int64, count=n)
        # records of partitions not (or no longer) assigned here, or from before a
        # partition's position (cannot happen with librdkafka; never handed out)
        floor = np.full(int(parts.max()) + 1, np.iinfo(np.int64).max, np.int64)
        for num, view in self.views.items():
            if num < len(floor):
                floor[num] = view._position
        keep = offsets >= floor[parts]
        if not keep.all():
            msgs = list(compress(msgs, keep.tolist()))
            parts, offsets = parts[keep], offsets[keep]
            n = len(msgs)
            if n == 0:
                return
        values = list(map(Message.value, msgs))
        p = self.parser
        keys = list(map(Message.key, msgs)) if p.key_from_message else None
        taps = any(v.raw_tap is not None for v in self.views.values())
        stamps = None
        if p.time_from_message or taps:
            stamps = message_times(msgs)
        rows = np.arange(n, dtype=np.int64)
        # one parse of all partitions' values: positions are the rows; OFFSET/_offset
        # are mapped back to each partition's offsets below
        whole = p.parse(values, rows, n, keys, stamps)
        ev_rows = whole.events[OFFSET].to_numpy()
        bad_rows = whole.bad["_offset"].to_numpy() if whole.bad.height else None
        events = whole.events.with_columns(
            pl.Series(OFFSET, offsets[ev_rows], dtype=pl.Int64),
            pl.Series("_q", parts[ev_rows], dtype=pl.Int64))
        bad = whole.bad
        if bad_rows is not None:
            at = pl.Series("_offset", offsets[bad_rows], dtype=pl.Int64)
            bad = bad.with_columns(at, at.alias("_line"),
                                   pl.Series("_q", parts[bad_rows], dtype=pl.Int64))
        span = whole.raw
        tapped: tuple[pl.Series, pl.Series] | None = None
        if taps:  # the archive's raw columns, built once for every partition (in Rust)
            tapped = (pl.Series("key", keys if keys is not None
                                else list(map(Message.key, msgs)), dtype=pl.Binary),
                      pl.Series("value", values, dtype=pl.Binary))
        nums = np.unique(parts).tolist()
        for num in nums:
            view = self.views[num]
            sel = np.flatnonzero(parts == num)
            offs = offsets[sel]
            view._check_gap(int(offs[0]))
            view._position = int(offs[-1]) + 1
            one = len(nums) == 1
            ev = events.drop("_q") if one else events.filter(pl.col("_q") == num).drop("_q")
            bd = bad
            if bad_rows is not None:
                bd = bad.drop("_q") if one else bad.filter(pl.col("_q") == num).drop("_q")
            raw_span = None
            if span is not None and ev.height:
                raw_span = RawSpan(int(ev[OFFSET][0]), int(ev[OFFSET][-1]),
                                   _texts_of(span, offs, sel))
            chunk = Chunk(events=ev, bad=bd, last_offset=int(offs[-1]),
                          position=PartitionPosition(offset=view._position), eof=False,
                          raw=raw_span)
            raw = None
            if view.raw_tap is not None:
                assert stamps is not None and tapped is not None
                key_col, value_col = tapped if one else (tapped[0].gather(sel),
                                                         tapped[1].gather(sel))
                raw = pl.DataFrame({"position": offs, "key": key_col,
                                    "timestamp_ms": stamps[sel], "value": value_col})
            view._queue.append(_Queued(chunk, offs, raw))
            view._queued += len(offs)

    def _done(self, view: SharedPartition) -> bool:
        """Whether ``view`` was fetched up to the position the run stops at."""
        stop = self.stops.get(view._num)
        return stop is not None and view._position >= stop

    def _pause_full(self) -> None:
        from confluent_kafka import TopicPartition

        full = [v for num, v in self.views.items() if num not in self.paused
                and (v._queued >= PAUSE_AT or self._done(v))]
        if full:
            self.consumer.pause([TopicPartition(v._topic, v._num) for v in full])
            self.paused.update(v._num for v in full)

    def drained(self, view: SharedPartition) -> None:
        from confluent_kafka import TopicPartition

        if view._num in self.paused and not self._done(view):
            self.paused.discard(view._num)
            self.consumer.resume([TopicPartition(view._topic, view._num)])


def _texts_of(span: RawSpan, offs: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
              ) -> Any:
    """A partition's raw-text lookup (by its offsets) over the whole parse's (by rows)."""
    whole = span.texts

    def texts(at: Any) -> pl.Series:
        idx = np.searchsorted(offs, np.asarray(at, dtype=np.int64))
        return whole(rows[idx].astype(np.int64, copy=False))

    return texts


class SharedPartition(KafkaPartition):
    """One topic partition read through its source's :class:`SharedReader`."""

    def __init__(self, reader: SharedReader, name: str, position: int | None,
                 from_start: bool = False) -> None:
        from confluent_kafka import TopicPartition

        self.name = name
        self._reader = reader
        self._settings = reader.settings
        self._topic, self._num = parse_partition_name(name)
        self._parser = reader.parser
        self._want_keys = self._parser.key_from_message
        self._want_ts = self._parser.time_from_message
        self._link = reader.link
        self._consumer = reader.consumer
        self._queries = reader.query  # (on the fetching consumer: behind its fetches)
        self._tp = TopicPartition(self._topic, self._num)
        low, high = self._watermarks()
        if position is None:
            position = self._start_position(low, high, from_start)
        elif position < low:
            raise self._expired(position, low)
        self._position = position
        self._handed = position
        self._end_seen: int | None = high
        self._depth = 0
        self._ahead = None
        self._marks_at_open: tuple[int, int] | None = (low, high)
        self.closed = False
        self.raw_tap = None
        self._queue: deque[_Queued] = deque()
        self._queued = 0
        with reader.lock:
            reader.assign(self, position)

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        with self._reader.lock:
            return self._poll(max_records, timeout_ms)

    def _poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        self._marks_at_open = None
        if not self._queue:
            self._reader.fill(self, max_records, timeout_ms)
        if not self._queue:
            self._handed = self._position
            return empty_chunk(self._parser.plan, self._position)
        piece = self._queue[0]
        want = max(1, max_records)
        if len(piece.offsets) > want:  # the rest stays queued
            taken, self._queue[0] = _cut(piece, want)
        else:
            self._queue.popleft()
            taken = piece
        self._queued -= len(taken.offsets)
        if not self._queue:
            self._reader.drained(self)
        if taken.raw is not None and self.raw_tap is not None:
            self.raw_tap(taken.raw)
        self._handed = taken.chunk.position.offset
        return taken.chunk

    def _check_gap(self, first: int) -> None:
        if first > self._position:  # a gap: markers, or records deleted unread?
            low = self.earliest()
            if low is not None and low > self._position:
                raise self._expired(self._position, low)

    def stop_at(self, position: int) -> None:
        """The run reads nothing at or after ``position`` (``stop = "end"``): once
        fetched that far the partition is paused in the client, so the consumer
        stops fetching it (at a partition's end a client fetches again and again;
        a broker that answers an empty fetch at once, as noida-db does, makes that
        a busy loop on both sides for as long as the other partitions are read)."""
        with self._reader.lock:
            self._reader.stops[self._num] = position
            self._reader._pause_full()

    def seek(self, position: int) -> None:
        self._marks_at_open = None
        low = self.earliest()
        if low is not None and position < low:
            raise self._expired(position, low)
        with self._reader.lock:
            self._queue.clear()
            self._queued = 0
            self._reader.reassign(self, position)
            self._position = self._handed = position
            self._reader._pause_full()  # (sought to where the run stops)

    def close(self) -> None:
        with self._reader.lock:
            if not self.closed:
                self.closed = True
                self._queue.clear()
                self._reader.release(self)


def _cut(piece: _Queued, n: int) -> tuple[_Queued, _Queued]:
    """The first ``n`` records of ``piece``, and the rest."""
    c = piece.chunk
    bound = int(piece.offsets[n])
    ev_lo = c.events.filter(pl.col(OFFSET) < bound)
    ev_hi = c.events.filter(pl.col(OFFSET) >= bound)
    bad_lo = c.bad.filter(pl.col("_offset") < bound)
    bad_hi = c.bad.filter(pl.col("_offset") >= bound)
    raw_lo = raw_hi = None
    if piece.raw is not None:
        raw_lo = piece.raw.filter(pl.col("position") < bound)
        raw_hi = piece.raw.filter(pl.col("position") >= bound)
    lo = _Queued(Chunk(ev_lo, bad_lo, int(piece.offsets[n - 1]),
                       PartitionPosition(offset=bound), False, c.raw if ev_lo.height else None),
                 piece.offsets[:n], raw_lo)
    hi = _Queued(Chunk(ev_hi, bad_hi, c.last_offset, c.position, False,
                       c.raw if ev_hi.height else None), piece.offsets[n:], raw_hi)
    return lo, hi
