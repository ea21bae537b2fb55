"""Live runs: steps planned from what each partition delivered, recorded, replayable.

A live run (``follow = true`` files; brokers) is a sequence of *steps*. A step
polls every partition once (no waiting when some partition has records), and
takes what each delivered: partition ``p`` reads the positions ``[from_p, to_p)``.
Before the step's output is staged, its :class:`~sealstream.checkpoint.plans.StepPlan`
(the ranges, the partitions known, the idle partitions, a wall-clock advance of
``W``, whether the run ends after it) is written durably to the checkpoint store,
chained and signed (:mod:`sealstream.checkpoint.plans`). Checkpoints record the
last step they include. On recovery, the steps recorded after the restored
checkpoint are replayed exactly as planned (each partition re-read from ``from``
until its position reaches ``to``, the recorded decisions re-applied), then the run
continues live: the committed output equals one uninterrupted run of the same plan.

Read order inside a step (what watermarks and lateness see): the step's records
in ``(position, partition index)`` order, as a bounded run interleaves files;
steps follow each other. Partition indexes are the order of discovery (new
partitions are appended). This order depends on the plan only, never on how the
records were polled, so a replay is exact. A replay knows a partition from the
step whose record first lists it, never before, even if it exists at the restart:
a partition without an event holds ``W`` back, so knowing it early would change
which events of the earlier steps are late.

Processing-time decisions, taken only when planning a live step (never on
replay):

* ``[watermark] idle_ms``: a partition that delivered nothing for ``idle_ms``
  while another delivered is idle (it leaves W's minimum) until it delivers again;
  when every partition has been quiet for ``idle_ms``, ``W`` advances to
  ``now - max_delay_ms - idle_ms`` if higher (the last windows of a quiet stream
  fire).
* ``stop = "end"``: the end positions seen at start bound every partition; the
  step that reaches them all ends the run (``W = +inf``).

Where partitions start: the start mode (``start = "latest"``, a time) places only
the partitions of a job's first run; one a restored checkpoint does not know is
growth and opens at its beginning. The first step recorded after a partition opens
lists where it starts (an empty range when it reads nothing), so a replay starts it
there and a recovery never asks the start mode again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import polars as pl

from sealstream._runtime.merge import Batch, SourcePosition
from sealstream.archive._live import Archiver
from sealstream.checkpoint.plans import StepPlan, judge_plan
from sealstream.checkpoint.stores import CheckpointStore
from sealstream.errors import (
    CheckpointError,
    SealstreamError,
    SourceError,
    SourceExpiredError,
)
from sealstream.sources._base import (
    BAD_SCHEMA,
    OFFSET,
    PARTITION,
    Chunk,
    FieldPlan,
    PartitionPosition,
    RawSpan,
)
from sealstream.sources._live import LivePartition, LiveSource
from sealstream.watermark import POS_INF, WatermarkState

#: how long a replayed step waits for a partition to deliver its recorded range
REPLAY_WAIT_S = 60.0
#: how often partitions are discovered (growth), seconds
DISCOVER_EVERY_S = 1.0
#: how often lag (end positions) is asked of the source, seconds
LAG_EVERY_S = 2.0


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall_ms(self) -> int: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return int(time.time() * 1000)


_Took = tuple[Chunk, list[RawSpan]]
"""What a partition hands out in a step: its records and where their raw texts are."""


@dataclass
class _Cursor:
    """One partition's reading state: what was handed out and what is buffered."""

    part: LivePartition
    next: int  # position of the next record to hand out
    resume: PartitionPosition  # where a reopen resumes to find ``next`` (skipping below)
    pending: Chunk | None = None  # polled records at or after ``next``, not handed out
    after: PartitionPosition = field(default_factory=PartitionPosition)  # after all polled
    last_delivery: float = 0.0
    stop_at: int | None = None  # stop = "end": the end position seen at start
    #: where the partition starts is known to a recovery: a checkpoint's position, or
    #: a recorded step listing it (False until the first step recorded after its open)
    listed: bool = True

    def source_position(self) -> SourcePosition:
        if self.pending is not None:
            return SourcePosition(self.resume, self.next)
        return SourcePosition(self.after, self.next)

    def reached_stop(self) -> bool:
        """stop = "end": the end position is reached (records polled beyond it are
        left where they are: a later run reads them)."""
        return self.stop_at is not None and self.next >= self.stop_at


def _cut(chunk: Chunk, below: int) -> tuple[Chunk, Chunk | None]:
    """Split a chunk at position ``below``: (records < below, records >= below)."""
    ev, bad = chunk.events, chunk.bad
    take_ev = ev.filter(pl.col(OFFSET) < below)
    take_bad = bad.filter(pl.col("_offset") < below)
    rest_ev = ev.filter(pl.col(OFFSET) >= below)
    rest_bad = bad.filter(pl.col("_offset") >= below)
    lasts: list[int] = []
    if take_ev.height:
        lasts.append(int(take_ev[OFFSET][-1]))
    if take_bad.height:
        lasts.append(int(take_bad["_offset"][-1]))
    taken = Chunk(take_ev, take_bad, max(lasts) if lasts else None,
                  PartitionPosition(offset=below), False, chunk.raw)
    if not rest_ev.height and not rest_bad.height:
        return taken, None
    rest = Chunk(rest_ev, rest_bad, chunk.last_offset, chunk.position, False, chunk.raw)
    return taken, rest


class LiveMerger:
    """Plans, records and replays steps; hands the engine one :class:`Batch` per step.

    The engine drives it like the bounded merger (``next_batch``), and gives it the
    checkpoint store to record plans in. ``names`` grows as partitions appear.
    """

    def __init__(
        self,
        source: LiveSource,
        plan: FieldPlan,
        names: list[str],
        positions: list[SourcePosition],
        batch_size: int,
        *,
        store: CheckpointStore | None,
        key: bytes | None,
        wm: WatermarkState,
        max_delay_ms: int,
        idle_ms: int | None,
        stop_end: bool,
        poll_ms: int,
        plan_mark: dict[str, Any] | None,
        clock: Clock | None = None,
        fresh: bool = False,
        resumed: bool = False,
        archive: Archiver | None = None,
    ) -> None:
        """``fresh``: no checkpoint was restored (``names`` are the partitions listed
        now, at their start, and ``wm`` knows nothing yet). ``resumed``: ``names``
        and ``positions`` are a checkpoint's: a partition it does not know was created
        after the job began and is read from its beginning, never per the start mode
        (which places only the partitions of a job's very first run)."""
        self.source = source
        self.plan = plan
        self.schema = plan.event_schema()
        self.batch_size = batch_size
        self.store = store
        self.key = key
        self.wm = wm
        self.max_delay_ms = max_delay_ms
        self.idle_ms = idle_ms
        self.stop_end = stop_end
        self.poll_ms = poll_ms
        self.clock = clock or SystemClock()
        self.resumed = resumed
        #: ``[archive]``: each step's raw records, and recovery of expired positions
        self.archive = archive
        self.names: list[str] = []
        self.cursors: list[_Cursor] = []
        self.step = int(plan_mark["step"]) if plan_mark else 0
        self.prev = str(plan_mark["digest"]) if plan_mark else ""
        self.replay: list[StepPlan] = []
        self.rejected_plans: list[dict[str, Any]] = []
        self.finished = False
        self.stop_requested = False
        self._last_discover = -1e18
        self._lag_at = -1e18
        self._lags: list[int | None] = []
        try:  # a refused start closes the partitions it opened (a followed file's fd)
            now = self.clock.monotonic()
            listed = source.discover()
            for n in names:
                if n not in listed:
                    raise SourceError(f"partition {n!r} of the checkpoint is gone from the source")
            if store is not None:
                self._load_replay(store)
            if fresh and self.replay:
                # recorded steps replayed from the beginning: the partitions join as the
                # plan discovered them (below), not all at once
                names, positions = [], []
                wm.max_time, wm.exhausted, wm.last_offset = [], [], []
                wm.idle = []
            for n, pos in zip(names, positions, strict=True):
                self._open(n, pos, now)
            if not self.replay:
                # partitions not in the checkpoint join now (per the start mode). With
                # recorded steps to replay, they join where the plan says they were
                # discovered (``_replay_step``), never earlier: a partition known before
                # its recorded discovery would hold W back (it has no event yet) during
                # steps that ran without it, and the replay would not be the plan's run
                for n in listed:
                    if n not in self.names:
                        self._open(n, None, now, from_start=resumed)
            #: stop = "end": the end positions seen at start of the partitions that join
            #: later (after the replay of the steps before their recorded discovery)
            self._stop_ends: dict[str, int | None] = {}
            if stop_end:
                for c in self.cursors:
                    self._stop_at(c, c.part.end())
                for n in listed:
                    if n not in self.names:
                        probe = self.source.open(n, None)
                        try:
                            self._stop_ends[n] = probe.end()
                        finally:
                            probe.close()
        except BaseException:
            for c in self.cursors:
                c.part.close()
            raise

    # ------------------------------------------------------------ partitions
    @staticmethod
    def _stop_at(c: _Cursor, at: int | None) -> None:
        """``stop = "end"``: the run reads ``c``'s partition up to ``at`` (its end at
        start); a source that can stop fetching it there is told (Kafka pauses it)."""
        c.stop_at = at
        tell = getattr(c.part, "stop_at", None)
        if at is not None and tell is not None:
            tell(at)

    def _open(self, name: str, pos: SourcePosition | None, now: float,
              from_start: bool = False, file: tuple[int, int] | None = None) -> None:
        """Open partition ``name`` at ``pos``; None: at its beginning when
        ``from_start`` (growth), else where the start mode says. Such a partition's
        start is recorded in the next step (an empty range when it reads nothing), so
        a recovery replays and continues from there, never from the start mode again
        ("latest" now would skip what was written since)."""
        open_at = getattr(self.source, "open_at", None)
        if pos is None:
            if file is not None and open_at is not None:
                # a followed file's first recorded file (it may have been rotated since)
                part = open_at(name, PartitionPosition(identity={
                    "dev": file[0], "ino": file[1], "plan": True}))
            else:
                part = self.source.open(name, None, from_start)
            at = part.tell()
            full = getattr(part, "position", None)  # a followed file's, with its identity
            start = SourcePosition(full if isinstance(full, PartitionPosition)
                                   and full.offset == at else PartitionPosition(offset=at), at)
        elif open_at is not None and (pos.resume.byte_offset or pos.resume.identity):
            try:
                part = open_at(name, pos.resume)
            except SourceExpiredError as exc:  # a followed file rotated away and gone
                part = self._from_archive(name, pos.next_offset, exc)
            start = pos
        else:  # an integer position (brokers; replay --from p=OFFSET): seek to it
            try:
                part = self.source.open(name, pos.next_offset)
            except SourceExpiredError as exc:  # the archive may still hold them
                part = self._from_archive(name, pos.next_offset, exc)
            start = SourcePosition(PartitionPosition(offset=pos.next_offset), pos.next_offset)
        if self.archive is not None:
            self.archive.attach(part)
        earliest = part.earliest()
        if earliest is not None and pos is not None and pos.next_offset < earliest:
            part.close()
            raise SourceExpiredError(
                f"partition {name!r}: the saved position {pos.next_offset} is below the "
                f"earliest position still retained ({earliest}): records "
                f"{pos.next_offset}..{earliest - 1} were deleted before they were read. "
                "Ways forward: replay from the earliest position into a new destination "
                f"(sealstream replay SPEC --from {name}={earliest} --to ...), or run with "
                "--start-over; nothing was skipped")
        self.names.append(name)
        self.cursors.append(_Cursor(part, start.next_offset, start.resume,
                                    after=start.resume, last_delivery=now,
                                    listed=pos is not None))
        self.wm.grow(len(self.names))

    def _discover(self, now: float) -> None:
        if now - self._last_discover < DISCOVER_EVERY_S:
            return
        self._last_discover = now
        for n in self.source.discover():
            if n not in self.names:
                if self.stop_end and n not in self._stop_ends:
                    # stop = "end" is a backfill of what existed at start: a partition
                    # that appeared since is not read (as Flink's bounded Kafka source
                    # does not discover partitions); the next run reads it
                    continue
                self._open(n, None, now, from_start=True)  # growth: from its beginning
                if self.stop_end:  # listed at start (its replay was pending): its end then
                    self._stop_at(self.cursors[-1], self._stop_ends.get(n))

    # ------------------------------------------------------------ plans
    def _load_replay(self, store: CheckpointStore) -> None:
        """The recorded steps after the restored one that verify and chain; the first
        that does not, and every one after it, is moved aside (like checkpoint damage);
        records at or before the restored step are left to retention."""
        steps = [s for s in store.plan_steps() if s > self.step]
        prev, expect = self.prev, self.step + 1
        broken: str | None = None
        for s in steps:
            if broken is None and s == expect:
                v = judge_plan(store.read_plan(s), s, prev, self.key)
                if v.ok:
                    assert v.plan is not None
                    self.replay.append(v.plan)
                    prev, expect = v.plan.digest(), s + 1
                    continue
                broken = v.reason
            reason = broken or "CHAIN_BROKEN"
            store.move_plan_aside(s, reason)
            self.rejected_plans.append({"step": s, "verdict": "MOVED_ASIDE", "reason": reason})
            broken = reason

    def _seek_to_recorded(self, q: int, plans: list[StepPlan] | None = None) -> None:
        """A partition opened per the start mode (``latest``, a time) would start
        elsewhere on a replay than in the run that recorded it: start it where its
        first recorded range starts."""
        name = self.names[q]
        for plan in self.replay if plans is None else plans:
            rng = plan.ranges.get(name)
            if rng is None:
                continue
            c = self.cursors[q]
            if rng[0] != c.next:
                try:
                    c.part.seek(rng[0])
                except SourceExpiredError as exc:  # the archive may still hold them
                    c.part.close()
                    c.part = self._from_archive(name, rng[0], exc, plans)
                c.next = rng[0]
                c.resume = c.after = PartitionPosition(offset=rng[0])
            return

    def _from_archive(self, name: str, at: int, exc: SourceExpiredError,
                      plans: list[StepPlan] | None = None) -> LivePartition:
        """Partition ``name`` from position ``at`` out of the archive segments of the
        recorded steps (then from the broker); without an archive, the refusal."""
        if self.archive is None:
            raise exc
        return self.archive.recover(name, at, self.replay if plans is None else plans,
                                    self.source, exc)

    def prune_archive(self, store: CheckpointStore) -> None:
        """Retention, after the checkpoints' and the plans': the segments of steps at or
        before the oldest retained checkpoint's step go (no recovery reads them)."""
        ids = store.ids() if self.archive is not None else []
        mark = store.read_manifest(ids[0]) if ids else None
        plan = mark.get("plan") if isinstance(mark, dict) else None
        step = plan.get("step") if isinstance(plan, dict) else None
        if self.archive is not None and isinstance(step, int):
            self.archive.prune(step)

    def plan_mark(self) -> dict[str, Any]:
        """What a checkpoint taken now records: the last step it includes."""
        return {"step": self.step, "digest": self.prev}

    # ------------------------------------------------------------ steps
    def next_batch(self) -> Batch | None:
        if self.finished:
            return None
        if self.replay:
            return self._replay_step(self.replay.pop(0))
        return self._live_step()

    def _live_step(self) -> Batch:
        now = self.clock.monotonic()
        self._discover(now)
        took: list[_Took | None] = []
        if self.stop_end:
            limit = self._aligned_limit()
            for c in self.cursors:
                took.append(self._take_live(c, 0, limit))
        else:
            for c in self.cursors:
                took.append(self._take_live(c, 0))
            if not any(t is not None for t in took) and self.poll_ms > 0 \
                    and not self.stop_requested:
                # nothing anywhere: wait on the first partition that can still deliver
                for q, c in enumerate(self.cursors):
                    if not c.reached_stop():
                        took[q] = self._take_live(c, self.poll_ms)
                        break
        now = self.clock.monotonic()
        ranges: dict[str, tuple[int, int]] = {}
        for q, (c, t) in enumerate(zip(self.cursors, took, strict=True)):
            if t is not None:
                ranges[self.names[q]] = (c.next, t[0].position.offset)
                if t[0].last_offset is not None:
                    c.last_delivery = now
        if self.stop_end:  # records at hand, held back for a partition behind: not quiet
            for c in self.cursors:
                if c.pending is not None and (c.pending.events.height or c.pending.bad.height):
                    c.last_delivery = now
        files: dict[str, tuple[int, int]] = {}
        for q, c in enumerate(self.cursors):
            if not c.listed:  # where a newly opened partition starts
                ranges.setdefault(self.names[q], (c.next, c.next))
            first = getattr(c.part, "first_file", None)
            if first is not None and (not c.listed or self.step == 0):
                files[self.names[q]] = first  # a followed file: which file it starts in
        idle, advance = self._idleness(ranges, now)
        end = self.stop_end and all(
            c.stop_at is not None
            and (t[0].position.offset if t is not None else c.next) >= c.stop_at
            for c, t in zip(self.cursors, took, strict=True))
        if not ranges and advance is None and not end and \
                tuple(idle) == tuple(n for q, n in enumerate(self.names) if self.wm.is_idle(q)):
            return self._batch([], None, False)  # nothing happened: no step
        plan = StepPlan(step=self.step + 1, prev=self.prev, partitions=tuple(self.names),
                        ranges=ranges, idle=tuple(idle), advance_ms=advance,
                        now_ms=self.clock.wall_ms(), end=end, files=files)
        if self.archive is not None:  # the records are archived before the plan names them
            self.archive.write(plan.step, ranges)  # encoded and created on its thread...
            batch = self._apply_plan(plan, took)  # ...while the step is applied in memory
            plan = replace(plan, archive=self.archive.settle())  # (only .step is in batch)
            self._record(plan)
            return batch
        self._record(plan)
        return self._apply_plan(plan, took)

    def _take_live(self, c: _Cursor, timeout_ms: int, limit: int | None = None
                   ) -> _Took | None:
        """What the cursor hands out in a live step (None: nothing): records below
        its stop position and below ``limit`` (the rest stays pending)."""
        if c.reached_stop() or (limit is not None and c.next >= limit):
            return None
        if c.pending is not None:
            chunk, c.pending = c.pending, None
            chunk = Chunk(chunk.events, chunk.bad, chunk.last_offset, c.after, False, chunk.raw)
        else:
            got = c.part.poll(self.batch_size, timeout_ms)
            if got is None:
                return None
            if got.position.offset == c.next and got.last_offset is None:
                return None  # nothing yet
            chunk = self._skip_below(c, got)
            c.resume = c.after
            c.after = got.position
        bound = min((b for b in (c.stop_at, limit) if b is not None), default=None)
        if bound is not None and chunk.position.offset > bound:
            taken, rest = _cut(chunk, bound)
            c.pending = rest
            chunk = taken
        if c.pending is None:
            c.resume = c.after
        return chunk, [chunk.raw] if chunk.raw is not None else []

    def _fill(self, c: _Cursor, timeout_ms: int) -> None:
        """Poll a cursor with nothing pending and keep what it delivers pending."""
        if c.reached_stop() or c.pending is not None:
            return
        got = c.part.poll(self.batch_size, timeout_ms)
        if got is None or (got.position.offset == c.next and got.last_offset is None):
            return
        chunk = self._skip_below(c, got)
        c.resume = c.after
        c.after = got.position
        if chunk.events.height or chunk.bad.height or chunk.position.offset > c.next:
            c.pending = chunk
        else:
            c.resume = c.after

    def _aligned_limit(self) -> int | None:
        """stop = "end" (a backfill): the position below which every partition that
        has not reached its end has its records at hand, so that a step hands out one
        slab of positions from all of them and the records are read in
        ``(position, partition)`` order across the whole run, as a bounded run reads
        its files, however the partitions' deliveries were timed. A partition that is
        behind is waited for (up to ``poll_ms``); one at its end no longer counts."""
        def at_hand(c: _Cursor) -> int:
            return c.pending.position.offset if c.pending is not None else c.next

        def behind() -> list[_Cursor]:
            return [c for c in self.cursors if c.stop_at is not None
                    and not c.reached_stop() and at_hand(c) < c.stop_at]

        for c in behind():
            self._fill(c, 0)
        lagging = behind()
        if not lagging:
            return None
        laggard = min(lagging, key=at_hand)
        if laggard.pending is None and self.poll_ms > 0 and not self.stop_requested:
            self._fill(laggard, self.poll_ms)
            lagging = behind()
        return min((at_hand(c) for c in lagging), default=None)

    @staticmethod
    def _skip_below(c: _Cursor, chunk: Chunk) -> Chunk:
        if c.after.offset >= c.next:
            return chunk
        ev = chunk.events.filter(pl.col(OFFSET) >= c.next)
        bad = chunk.bad.filter(pl.col("_offset") >= c.next)
        last = chunk.last_offset if chunk.last_offset is not None and \
            chunk.last_offset >= c.next else None
        return Chunk(ev, bad, last, chunk.position, False, chunk.raw)

    def _idleness(self, ranges: dict[str, tuple[int, int]], now: float
                  ) -> tuple[list[str], int | None]:
        if self.idle_ms is None:
            return [], None
        limit = self.idle_ms / 1000
        delivered = {n for n, c in zip(self.names, self.cursors, strict=True)
                     if c.last_delivery == now and n in ranges}
        quiet = {n for n, c in zip(self.names, self.cursors, strict=True)
                 if now - c.last_delivery >= limit}
        idle: list[str] = []
        for q, n in enumerate(self.names):
            if n in delivered:
                continue
            if self.wm.is_idle(q) or (n in quiet and delivered):
                idle.append(n)
        advance = None
        if len(quiet) == len(self.names) and self.names:
            idle = list(self.names)
            target = self.clock.wall_ms() - self.max_delay_ms - self.idle_ms
            if target > self.wm.current():
                advance = target
        return idle, advance

    def _record(self, plan: StepPlan) -> None:
        if self.store is not None:
            self.store.write_plan(plan.step, plan.encode(self.key))
        self.step, self.prev = plan.step, plan.digest()

    def _replay_step(self, plan: StepPlan) -> Batch:
        now = self.clock.monotonic()
        for n in plan.partitions:
            if n not in self.names:
                self.source.discover()
                self._open(n, None, now, from_start=self.resumed or plan.step > 1,
                           file=plan.files.get(n))
                self._seek_to_recorded(len(self.names) - 1, [plan, *self.replay])
                if self.stop_end:
                    self._stop_at(self.cursors[-1], self._stop_ends.get(n))
        if tuple(self.names[:len(plan.partitions)]) != plan.partitions:
            raise CheckpointError(
                f"the recorded plan of step {plan.step} knows the partitions "
                f"{list(plan.partitions)}, but the run knows {self.names}: the plan does "
                "not continue the restored checkpoint")
        took: list[_Took | None] = [None] * len(self.cursors)
        for q, n in enumerate(self.names):
            rng = plan.ranges.get(n)
            if rng is None:
                continue
            c = self.cursors[q]
            if rng[0] != c.next:
                raise CheckpointError(
                    f"the recorded plan of step {plan.step} reads partition {n!r} from "
                    f"{rng[0]}, but the run is at {c.next}: the plan does not continue the "
                    "restored checkpoint")
            took[q] = self._take_range(c, n, rng[1])
            c.last_delivery = now
        self.step, self.prev = plan.step, plan.digest()
        if self.archive is not None:  # archived when it was planned
            self.archive.discard(plan.ranges)
        return self._apply_plan(plan, took)

    def _take_range(self, c: _Cursor, name: str, to: int) -> _Took:
        """Records of ``[c.next, to)``, polling as needed; later ones stay pending."""
        parts: list[Chunk] = []
        deadline = time.monotonic() + REPLAY_WAIT_S
        while True:
            if c.pending is not None:
                chunk, c.pending = c.pending, None
                reader_after = c.after
            else:
                if c.after.offset >= to:
                    break
                got = c.part.poll(self.batch_size, self.poll_ms or 100)
                if got is None:
                    raise SourceError(
                        f"partition {name!r} ended at position {c.after.offset}, before the "
                        f"position {to} a recorded step reads up to")
                if got.position.offset == c.after.offset and got.last_offset is None:
                    if time.monotonic() > deadline:
                        raise SourceError(
                            f"partition {name!r}: a recorded step reads up to position {to}, "
                            f"but the source delivers nothing after {c.after.offset}")
                    continue
                chunk = self._skip_below(c, got)
                c.resume = c.after
                c.after = got.position
                reader_after = got.position
            if reader_after.offset > to:
                taken, rest = _cut(chunk, to)
                c.pending = rest
                parts.append(taken)
                break
            parts.append(chunk)
        c_pos = PartitionPosition(offset=to)
        if c.pending is None:
            c.resume = c.after
        events = [p.events for p in parts if p.events.height]
        bad = [p.bad for p in parts if p.bad.height]
        raws = [p.raw for p in parts if p.raw is not None]
        lasts = [p.last_offset for p in parts if p.last_offset is not None]
        merged = Chunk(
            pl.concat(events) if events else pl.DataFrame(schema=self.schema),
            pl.concat(bad) if bad else pl.DataFrame(schema=BAD_SCHEMA),
            max(lasts) if lasts else None, c_pos, False, None)
        return merged, raws

    # ------------------------------------------------------------ batches
    def _apply_plan(self, plan: StepPlan, took: list[_Took | None]) -> Batch:
        for c in self.cursors[:len(plan.partitions)]:
            c.listed = True
        idle = set(plan.idle)
        if self.idle_ms is not None or idle or any(self.wm.idle):
            self.wm.idle = [n in idle for n in self.names]
        spans: list[list[RawSpan]] = []
        ev_parts: list[pl.DataFrame] = []
        bad_parts: list[pl.DataFrame] = []
        for q, (c, t) in enumerate(zip(self.cursors, took, strict=True)):
            rng = plan.ranges.get(self.names[q])
            q_spans: list[RawSpan] = []
            if t is not None and rng is not None:
                chunk, q_spans = t
                if chunk.events.height:
                    ev_parts.append(chunk.events.with_columns(
                        pl.lit(q, dtype=pl.Int32).alias(PARTITION)))
                if chunk.bad.height:
                    bad_parts.append(
                        chunk.bad.with_columns(pl.lit(q, dtype=pl.Int32).alias("_p")))
                c.next = rng[1]
            spans.append(q_spans)
        if plan.advance_ms is not None:
            self.wm.global_ms = max(self.wm.global_ms, plan.advance_ms)
        if plan.end:
            self.finished = True
        return self._batch(ev_parts, bad_parts, plan.end, spans, plan)

    def _batch(self, ev_parts: list[pl.DataFrame],
               bad_parts: list[pl.DataFrame] | None, finished: bool,
               spans: list[list[RawSpan]] | None = None,
               plan: StepPlan | None = None) -> Batch:
        schema = dict(self.schema)
        schema[PARTITION] = pl.Int32()
        events = (pl.concat(ev_parts, how="vertical", rechunk=False).select(list(schema))
                  if ev_parts else pl.DataFrame(schema=schema))
        bad_schema = dict(BAD_SCHEMA)
        bad_schema["_p"] = pl.Int32()
        bad = (pl.concat(bad_parts, how="vertical").sort(["_offset", "_p"])
               if bad_parts else pl.DataFrame(schema=bad_schema))
        n = len(self.cursors)
        end = (POS_INF, POS_INF) if finished else (-1, n - 1)
        return Batch(
            events=events,
            bad=bad,
            end=end,
            positions=[c.source_position() for c in self.cursors],
            last_offsets=[None] * n,
            finished=finished,
            empty_and_done=[False] * n,
            raw=spans if spans is not None else [[] for _ in range(n)],
            step=plan.step if plan is not None else None,
        )

    def size_hint(self) -> tuple[int, int] | None:
        return None

    # ------------------------------------------------------------ status
    def connected(self) -> bool | None:
        """Whether the source's broker answers now (None: a source without one)."""
        flag = getattr(self.source, "connected", None)
        return bool(flag) if isinstance(flag, bool) else None

    def lags(self) -> list[int | None]:
        """Records behind each partition's end (broker end offsets), refreshed at
        most every :data:`LAG_EVERY_S`; None where unknown (files: not measured, a
        whole-file scan would cost more than it tells)."""
        from sealstream.sources.files.follow import FollowedFiles

        now = time.monotonic()
        if isinstance(self.source, FollowedFiles):
            return [None] * len(self.cursors)
        if now - self._lag_at >= LAG_EVERY_S or len(self._lags) != len(self.cursors):
            self._lag_at = now
            out: list[int | None] = []
            for c in self.cursors:
                try:
                    end = c.part.end()
                except SealstreamError:
                    end = None
                out.append(None if end is None else max(0, end - c.next))
            self._lags = out
        return list(self._lags)

    def close(self) -> None:
        if self.archive is not None:
            self.archive.close()
        for c in self.cursors:
            c.part.close()
        self.source.close()


def open_live(job: Any, positions: list[SourcePosition],
              merger: Callable[..., LiveMerger] = LiveMerger) -> LiveMerger:
    """The live merger of ``job`` (a :class:`~sealstream._runtime.engine.Job`) from
    ``positions`` (one per name in ``job.names``); ``merger``: its class (a run with
    workers plans here and reads on the workers: ``distributed.live``)."""
    from sealstream.sources.files.follow import FollowedFiles

    p = job.p
    spec = p.source
    if spec.kind == "kafka" and getattr(spec, "group", "") is None:
        # the consumer group told the positions after each checkpoint, for lag tools:
        # by default the pipeline's name (group = "" turns it off)
        spec = replace(spec, group=p.name)
    known = {n: sp.resume for n, sp in zip(job.names, positions, strict=True)}
    source: LiveSource
    if spec.kind == "sources":  # several sources as one (docs/joins.md)
        from sealstream.windows.join_live import open_union

        source = open_union(p, known)
    else:
        source = (spec.open_live(job.plan) if spec.kind in ("kafka", "nats")
                  else FollowedFiles(spec.kind, spec, job.plan, known=known))
    archive: Archiver | None = None
    try:  # a refused start closes what it opened (the archive's client, its gc.freeze)
        archive = None if p.archive is None else Archiver(p.archive, job.plan, job.key)
        return merger(
            source, job.plan, list(job.names), positions, p.batch_size,
            store=job.store, key=job.key, wm=job.wm,
            max_delay_ms=p.watermark.max_delay_ms, idle_ms=p.watermark.idle_ms,
            stop_end=p.source.stop_mode == "end", poll_ms=p.source.poll_ms,
            plan_mark=job._plan_mark,
            fresh=job._plan_mark is None and job.start is None,
            archive=archive,
            # a checkpoint restored: the run's own, or one of `replay --from ID` (a start
            # point from explicit offsets carries no watermark)
            resumed=job._plan_mark is not None
            or (job.start is not None and job.start.watermark is not None),
        )
    except BaseException:
        if archive is not None:
            archive.close()
        source.close()
        raise


__all__ = ["LiveMerger", "SystemClock", "open_live"]
