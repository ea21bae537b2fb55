"""The archive on the live path: the tap, the segment of each step, recovery, retention.

:class:`Archiver` is what :class:`~sealstream._runtime.live.LiveMerger` talks to:

* :meth:`Archiver.attach` gives a broker partition a tap (its ``raw_tap``): each poll
  hands over its raw messages as one frame, kept until a step takes them;
* :meth:`Archiver.write` takes the records of a step being planned; its segment is
  encoded and created on the archive's writer thread while the step is applied in
  memory, and :meth:`Archiver.settle` waits for it and gives the entry the plan
  records, before the plan is recorded (a recorded plan's segment is always durable);
* :meth:`Archiver.discard` drops what a replayed step re-read (its segment exists);
* :meth:`Archiver.recover` opens an :class:`ArchivedPartition` where the broker no
  longer holds a position that recorded steps read;
* :meth:`Archiver.prune` deletes the segments no retained checkpoint needs.
"""

from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import polars as pl

from sealstream._objects import Objects, ObjectStoreError, is_object_url, open_objects
from sealstream.archive import ArchiveSettings
from sealstream.archive._segments import (
    ArchiveDamagedError,
    SegmentEntry,
    decode_segment,
    encode_segment,
    segment_step,
)
from sealstream.errors import SourceError, SourceExpiredError
from sealstream.sources._base import Chunk, FieldPlan
from sealstream.sources._live import LivePartition, LiveSource, ValueParser, empty_chunk

#: segments kept decoded while a recovery reads them (a segment holds every partition)
_CACHE = 4


class _Plan(Protocol):
    """What the archive reads of a recorded step plan."""

    @property
    def ranges(self) -> dict[str, tuple[int, int]]: ...
    @property
    def archive(self) -> dict[str, Any] | None: ...


def _chain(name: str, at: int, plans: Sequence[_Plan]
           ) -> list[tuple[int, int, SegmentEntry]]:
    """The archived ranges of ``name`` from position ``at`` on: the recorded range
    holding ``at`` (read from ``at``), then the ones that follow it without a gap,
    while each has a segment."""
    out: list[tuple[int, int, SegmentEntry]] = []
    for plan in plans:
        rng = plan.ranges.get(name)
        if rng is None or rng[1] <= rng[0]:
            continue
        if not out and not rng[0] <= at < rng[1]:
            continue
        if (out and rng[0] != out[-1][1]) or plan.archive is None:
            break
        out.append((max(rng[0], at), rng[1], SegmentEntry.from_json(plan.archive)))
    return out


def _empty_rows() -> pl.DataFrame:
    return pl.DataFrame(schema={"position": pl.Int64(), "key": pl.Binary(),
                                "timestamp_ms": pl.Int64(), "value": pl.Binary()})


class Archiver:
    """The archive of one live run (see the module docstring)."""

    def __init__(self, settings: ArchiveSettings, plan: FieldPlan,
                 key: bytes | None = None) -> None:
        self.settings = settings
        self.key = key  # the step plans' signing key (a replay verifies the live ones)
        self._plans: list[_Plan] | None = None
        self._froze = False  # whether this archive froze the collector's objects
        try:
            self.objects: Objects = open_objects(settings.location(), settings.endpoint_url)
            if not settings.read_only:
                self.objects.probe()
        except ObjectStoreError as exc:
            raise SourceError(f"[archive] {exc}") from None
        if is_object_url(self.settings.url):
            # An S3 client's import leaves ~50,000 long-lived objects (botocore's
            # service models) that every full garbage collection walked again while the
            # source allocates a message object per record: twice the collector's time
            # on the Kafka path. What exists now lives as long as the run: out of its
            # walks (docs/object-storage.md, "Its cost"); given back at close().
            gc.freeze()
            self._froze = True
        self.location = self.objects.location
        self.parser = ValueParser(plan)
        self._buf: dict[str, list[pl.DataFrame]] = {}
        self._cache: OrderedDict[str, pl.DataFrame] = OrderedDict()
        self.written = 0  # segments created by this run (for tests and the summary)
        self.pruned = 0  # segments deleted by retention
        #: the writer thread (started with the first segment) and what it was given
        #: that :meth:`settle` has not yet waited for
        self._pool: ThreadPoolExecutor | None = None
        self._creating: Future[dict[str, Any]] | None = None
        self._pruning: Future[None] | None = None
        self._lock = threading.Lock()
        #: retention: whether a pruning listed the archive's segments (once a run, and
        #: again after a failure), and the segments this run created since, by step
        self._listed = False
        self._mine: list[tuple[int, str]] = []

    # ------------------------------------------------------------ writing
    def attach(self, part: Any) -> None:
        """Tap ``part``'s polls (a partition without a tap is refused at spec time)."""
        if isinstance(part, ArchivedPartition) or getattr(part, "archived", False) \
                or self.settings.read_only:
            return  # it taps the broker partition it hands over to; a replay writes none
        name = str(part.name)
        self._buf[name] = []
        part.raw_tap = self._buf[name].append

    def _take(self, name: str, lo: int, hi: int) -> pl.DataFrame:
        """The tapped rows of ``name`` in ``[lo, hi)``; rows below ``hi`` leave the buffer.

        Per tapped frame (one a poll), never per record: a frame wholly in the range is
        taken as it is and one wholly above it stays, without a copy; only a frame
        astride ``lo`` or ``hi`` is filtered (the encoding makes the taken rows
        contiguous, the one copy of them a step makes)."""
        frames = self._buf.get(name)
        if not frames:
            return _empty_rows()
        taken: list[pl.DataFrame] = []
        rest: list[pl.DataFrame] = []
        for frame in frames:
            if not frame.height:
                continue
            pos = frame["position"]
            first, last = pos.min(), pos.max()
            assert isinstance(first, int) and isinstance(last, int)
            if first >= hi:
                rest.append(frame)
            elif last < hi and first >= lo:
                taken.append(frame)
            elif last >= lo:  # astride a bound
                taken.append(frame.filter((pl.col("position") >= lo)
                                          & (pl.col("position") < hi)))
                if last >= hi:
                    rest.append(frame.filter(pl.col("position") >= hi))
        frames[:] = rest
        if not taken:
            return _empty_rows()
        return pl.concat(taken, how="vertical", rechunk=False) if len(taken) > 1 \
            else taken[0]

    def _rows(self, ranges: dict[str, tuple[int, int]]) -> pl.DataFrame | None:
        """The tapped rows of ``ranges`` in the segment's order (partitions by name,
        each in position order as polled); None: no position read."""
        parts = [self._take(n, a, b).with_columns(pl.lit(n, pl.String).alias("partition"))
                 for n, (a, b) in sorted(ranges.items()) if b > a]
        return pl.concat(parts, how="vertical") if parts else None

    def write(self, step: int, ranges: dict[str, tuple[int, int]]) -> None:
        """Start the segment of step ``step``: the records of ``ranges`` are taken now,
        then encoded (Parquet, SHA-256) and created on the writer thread while the
        caller applies the step in memory; :meth:`settle` waits for it and gives the
        entry the plan records, before the plan is recorded."""
        if self.settings.read_only:
            return
        self.settle()
        rows = self._rows(ranges)
        if rows is None:
            return
        self._creating = self._submit(self._encode_create, step, rows)

    def _encode_create(self, step: int, rows: pl.DataFrame) -> dict[str, Any]:
        data, entry = encode_segment(step, rows, ordered=True)
        self._create(entry.name, data)
        return entry.to_json()

    def _create(self, name: str, data: bytes) -> None:
        try:
            self.objects.create(name, data)
        except ObjectStoreError as exc:
            raise SourceError(f"[archive] cannot write {name}: {exc}") from None
        step = segment_step(name)
        with self._lock:
            self.written += 1
            if step is not None:
                self._mine.append((step, name))

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        with self._lock:
            if self._pool is None:
                # one segment being created and one pruning at most (see prune)
                self._pool = ThreadPoolExecutor(2, thread_name_prefix="sealstream-archive")
            return self._pool.submit(fn, *args)

    def settle(self) -> dict[str, Any] | None:
        """Wait until the segment being created is durable (SourceError: it cannot be);
        the entry for its step's plan (None: the step reads no position, nothing to
        archive)."""
        creating, self._creating = self._creating, None
        return None if creating is None else creating.result()

    def close(self) -> None:
        """Wait for the writer thread, then stop it. A failure is not raised here: the
        step that wrote a segment settled it before its plan was recorded, so what is
        left is a pruning (retried by the next run's retention) or the segment of a
        step never recorded, and the run's own outcome stands."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._froze:  # a run in a long-lived process keeps nothing out of reach
            self._froze = False
            gc.unfreeze()

    def discard(self, ranges: dict[str, tuple[int, int]]) -> None:
        """A replayed step re-read ``ranges`` (its segment was written when it was
        planned): drop what the taps kept of them."""
        for n, (_a, b) in ranges.items():
            self._take(n, b, b)

    # ------------------------------------------------------------ reading
    def rows(self, entry: SegmentEntry) -> pl.DataFrame:
        """The verified rows of a segment (cached for the partitions that share it)."""
        got = self._cache.get(entry.name)
        if got is not None:
            self._cache.move_to_end(entry.name)
            return got
        try:
            data = self.objects.get(entry.name)
        except ObjectStoreError as exc:
            raise ArchiveDamagedError(
                f"archive segment {self.location}/{entry.name} cannot be read: {exc}; "
                "nothing was skipped or committed") from None
        frame = decode_segment(data, entry, self.location)
        self._cache[entry.name] = frame
        while len(self._cache) > _CACHE:
            self._cache.popitem(last=False)
        return frame

    def recover(self, name: str, at: int, plans: Sequence[_Plan], source: LiveSource,
                expired: SourceExpiredError) -> LivePartition:
        """Partition ``name`` read from position ``at`` out of the segments of the
        recorded ``plans`` (verified, in order; a replay's: the live job's), then from
        ``source``. The broker's refusal ``expired`` stands, with the archive named,
        when no recorded step read ``at`` (records the job never read are in no
        archive)."""
        ranges = _chain(name, at, plans)
        if not ranges and self.settings.read_only:
            plans = self._live_plans()
            ranges = _chain(name, at, plans)
        if callable(getattr(source, "open_successor", None)):  # followed files
            from sealstream.archive._files import recover_file

            return recover_file(self, name, at, ranges, plans, source, expired)
        if not ranges:
            raise SourceExpiredError(
                f"{expired} The archive {self.location} cannot help: no recorded step read "
                f"{name!r} at position {at} (the archive holds what the job read; these "
                "records were deleted before the job read them)") from None
        return ArchivedPartition(self, name, ranges, source)

    def _live_plans(self) -> list[_Plan]:
        """A replay's view: the live job's step plans after the origin checkpoint's
        step, as far as they verify and chain (signed with ``key``)."""
        from sealstream.checkpoint.plans import judge_plan

        anchor, opener = self.settings.anchor, self.settings.live_store
        if self._plans is not None:
            return self._plans
        self._plans = []
        if not isinstance(anchor, dict) or opener is None:
            return self._plans
        store = opener()
        step, prev = int(anchor["step"]), str(anchor["digest"])
        for s in store.plan_steps():
            if s <= step:
                continue
            v = judge_plan(store.read_plan(s), s, prev, self.key)
            if s != step + 1 or not v.ok or v.plan is None:
                break
            self._plans.append(v.plan)
            step, prev = s, v.plan.digest()
        return self._plans

    # ------------------------------------------------------------ retention
    def prune(self, oldest_step: int) -> None:
        """Delete the segments of steps at or before ``oldest_step`` (the step of the
        oldest retained checkpoint: no recovery reads them), on the writer thread, off
        the run's path; skipped while the previous pruning is still at it (this one's
        segments go with the next); the previous pruning's failure is raised here."""
        if self.settings.read_only:
            return
        if self._pruning is not None:
            if not self._pruning.done():
                return  # still at it: the next checkpoint's pruning takes this one's too
            self._pruning.result()
        self._pruning = self._submit(self._prune, oldest_step)

    def _prune(self, oldest_step: int) -> None:
        """Delete the segments of steps at or before ``oldest_step``: the first pruning
        of a run lists the archive (segments of earlier runs, a failed pruning's); the
        next ones delete what this run created, without listing again (one listing a
        checkpoint was most of an S3 archive's retention cost)."""
        try:
            with self._lock:
                due = [n for s, n in self._mine if s <= oldest_step]
                listed = self._listed
            if not listed:
                due = sorted(set(due) | {
                    k for k in self.objects.keys("seg-")
                    if (s := segment_step(k)) is not None and s <= oldest_step})
            if due:
                self.objects.delete_many(due)
        except ObjectStoreError as exc:  # raised by the next prune(): one clear line
            with self._lock:
                self._listed = False  # the next pruning lists again
            raise SourceError(f"[archive] cannot delete old segments: {exc}") from None
        gone = set(due)
        with self._lock:
            self._listed = True
            self._mine = [(s, n) for s, n in self._mine if n not in gone]
            self.pruned += len(gone)


class ArchivedPartition:
    """A partition served from archive segments over ``ranges`` (consecutive
    ``(from, to, segment)``), then from the broker where they end.

    Each poll delivers the records of one archived range, parsed by the same
    :class:`~sealstream.sources._live.ValueParser` as the broker's messages, with
    ``position`` = the range's end (so gaps such as transaction markers are crossed
    exactly as the recorded step crossed them). After the last range, the broker's
    partition is opened (from its start) and sought to where the archive ends; when
    the broker no longer holds that either, its refusal names the archive's end.
    """

    def __init__(self, archiver: Archiver, name: str,
                 ranges: list[tuple[int, int, SegmentEntry]], source: LiveSource) -> None:
        self.name = name
        self._archiver = archiver
        self._ranges = list(ranges)
        self._source = source
        self._pos = ranges[0][0]
        self._real: LivePartition | None = None
        self._on_broker = False

    def _broker(self) -> LivePartition:
        if self._real is None:
            self._real = self._source.open(self.name, None, True)
            self._archiver.attach(self._real)
        return self._real

    def _hand_over(self) -> LivePartition:
        real = self._broker()
        if not self._on_broker:
            try:
                real.seek(self._pos)
            except SourceExpiredError as exc:
                raise SourceExpiredError(
                    f"{exc} (the archive {self._archiver.location} holds {self.name!r} "
                    f"only up to position {self._pos})") from None
            self._on_broker = True
        return real

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        if not self._ranges:
            return self._hand_over().poll(max_records, timeout_ms)
        lo, hi, entry = self._ranges.pop(0)
        try:
            frame = self._archiver.rows(entry)
        except ArchiveDamagedError as exc:
            raise ArchiveDamagedError(f"partition {self.name!r}, positions {lo}..{hi - 1}: "
                                      f"{exc}") from None
        rows = frame.filter(
            (pl.col("partition") == self.name) & (pl.col("position") >= lo)
            & (pl.col("position") < hi)).sort("position")
        self._pos = hi
        if not rows.height:
            return empty_chunk(self._archiver.parser.plan, hi)
        parser = self._archiver.parser
        return parser.parse(
            rows["value"].to_list(), rows["position"].to_numpy(), hi,
            rows["key"].to_list() if parser.key_from_message else None,
            rows["timestamp_ms"].to_numpy() if parser.time_from_message else None)

    def seek(self, position: int) -> None:
        if self._on_broker or not self._ranges or position >= self._ranges[-1][1]:
            self._ranges = []
            self._pos = position
            self._on_broker = False
            self._hand_over()
            return
        while self._ranges and self._ranges[0][1] <= position:
            self._ranges.pop(0)
        if not self._ranges or self._ranges[0][0] != position:
            raise SourceError(f"partition {self.name!r}: position {position} is not where "
                              "an archived step starts")
        self._pos = position

    def tell(self) -> int:
        return self._real.tell() if self._on_broker and self._real is not None else self._pos

    def earliest(self) -> int | None:
        return self._real.earliest() if self._on_broker and self._real is not None else None

    def end(self) -> int | None:
        return self._broker().end()

    def close(self) -> None:
        if self._real is not None:
            self._real.close()


__all__ = ["ArchivedPartition", "Archiver"]
