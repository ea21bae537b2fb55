"""Live sources on the data plane: the coordinator plans, records and replays the
steps; each partition's worker reads its partition itself.

The coordinator is the single-process :class:`~sealstream._runtime.live.LiveMerger`
with its reading taken away (:class:`LivePlanner`): it discovers partitions
(metadata only), plans each step as a range ``[from, to)`` of positions per
partition, makes the plan durable (chained and signed, as on one process), and
replays the recorded plans after a restore. Partition ``q`` is read by worker
``q mod N`` (:mod:`._live_read`): its own client (a Kafka consumer of its own,
assigned the partition and positioned at the plan's ``from``, never group-managed;
a NATS connection of its own) polls the partition and reports three numbers (the
position after what it holds, its first and last record held); from those the
coordinator decides the ranges, the idle partitions and the end exactly as the
single-process planner decides from what it polled; then every owner takes exactly
its range and publishes the rows to the key workers through Ray's object store as
a bounded slab is published (watermark breakpoints, one Arrow buffer per key
worker). The rest is the bounded data plane (:mod:`._steps`): each key's worker
gives each row its exact single-process watermark for the step's read order
(``(position, partition)`` within a step, steps in order) and runs the window
operator.

So the output is the single-process output of the same recorded plan, and a
recovery replays the recorded ranges on the workers (each re-reads the same
positions). The Kafka consumer group's offsets are still committed by the
coordinator after each checkpoint (positions only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from sealstream._runtime.live import LiveMerger, _Cursor, _Took
from sealstream._runtime.merge import Batch, SourcePosition
from sealstream.checkpoint.plans import StepPlan
from sealstream.distributed._phases import Phases
from sealstream.distributed._plane import Breaks
from sealstream.distributed._shard import gather
from sealstream.distributed._steps import StepBatch, StepPlanner, _bytes
from sealstream.distributed._worker import from_ipc
from sealstream.pipeline import Pipeline
from sealstream.sources._base import BAD_SCHEMA, Chunk, PartitionPosition
from sealstream.sources._live import empty_chunk
from sealstream.watermark import POS_INF

#: live source kinds whose partitions the workers read themselves (and followed
#: files, ``follow = true``: :mod:`._follow_read`)
ON_WORKERS = ("kafka", "nats")
#: file kinds that can be followed, each file read by its owner worker
FOLLOWED_ON_WORKERS = ("jsonl", "csv")


def live_on_workers(pipeline: Pipeline) -> bool:
    src = pipeline.source
    return src.live and (src.kind in ON_WORKERS or (
        src.kind in FOLLOWED_ON_WORKERS and bool(getattr(src, "follow", False))))


class _Remote:
    """A partition as the coordinator sees it: it lives on its owner worker."""

    def __init__(self, owner: Any, q: int, name: str) -> None:
        self.owner, self.q, self.name = owner, q, name

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        raise RuntimeError("a partition on the data plane is read by its worker")

    def seek(self, position: int) -> None:
        gather([self.owner.live_seek.remote(self.q, position)], "seek")

    def tell(self) -> int:
        raise RuntimeError("a partition on the data plane is read by its worker")

    def earliest(self) -> int | None:
        return None

    def stop_at(self, position: int) -> None:
        gather([self.owner.live_stop_at.remote(self.q, position)], "stop position")

    def end(self) -> int | None:
        got: int | None = gather([self.owner.live_end.remote(self.q)], "end position")[0]
        return got

    def close(self) -> None:
        """Closed with the worker's reader (:meth:`LivePlanner.close`)."""


class _Outputs(StepPlanner):
    """The data plane's output side for live steps: what :class:`DistributedJob`
    gathers from a :class:`StepBatch` (the key workers' outputs; late events' raw
    text from the partitions' owners, :meth:`StepPlanner.raw_texts`), with the bytes
    the coordinator received. ``owner``: partition index -> its worker (grows with
    the partitions); ``step``: one more than the step being applied."""

    def __init__(self) -> None:  # noqa: D107 (no bounded planning here)
        self.owner: list[Any] = []
        self.step = 0
        self.step_bytes: list[int] = []
        self.output_bytes: list[int] = []
        self.phases = Phases()

    @property
    def n(self) -> int:  # type: ignore[override]
        """The partitions opened so far (whose owners stage their late events and bad
        records, :meth:`DistributedJob._stage_records`)."""
        return len(self.owner)


class LivePlanner(LiveMerger):
    """The live merger of a run with workers: plans from the owners' reports,
    records, replays; the owners read (see the module docstring)."""

    def __init__(self, *args: Any, actors: list[Any], pipeline: Pipeline,
                 unseen: Any, job: Any = None, **kwargs: Any) -> None:
        """``job``: the :class:`DistributedJob`, which says who stages a step's
        outputs (the workers, :mod:`._sinks` and :mod:`._records`, or itself)."""
        self.actors = actors
        self.p = pipeline
        self._unseen = unseen  # the fields no event carried yet (the job's, live)
        self._job = job
        self.outputs = _Outputs()
        super().__init__(*args, **kwargs)

    def _owner(self, q: int) -> Any:
        return self.actors[q % len(self.actors)]

    @property
    def step_bytes(self) -> list[int]:
        """Bytes the coordinator received per step (reports, summaries, outputs)."""
        return self.outputs.step_bytes

    @property
    def phases(self) -> Phases:
        """Where the coordinator's time goes (for the benchmark)."""
        return self.outputs.phases

    @property
    def output_bytes(self) -> list[int]:
        """Of which output rows (fired windows, late events and their text, bad
        records): 0 when the workers stage every output (directories,
        :mod:`._sinks`, :mod:`._records`)."""
        return self.outputs.output_bytes

    # ------------------------------------------------------------ partitions
    def _open(self, name: str, pos: SourcePosition | None, now: float,
              from_start: bool = False, file: tuple[int, int] | None = None) -> None:
        q = len(self.names)
        owner = self._owner(q)
        at = int(gather([owner.live_open.remote(
            self.p, q, name, None if pos is None else pos.next_offset, from_start)],
            "open partitions")[0])
        start = PartitionPosition(offset=at)
        self.names.append(name)
        self.outputs.owner.append(owner)
        self.cursors.append(_Cursor(_Remote(owner, q, name), at, start, after=start,
                                    last_delivery=now, listed=pos is not None))
        self.wm.grow(len(self.names))

    # ------------------------------------------------------------ live steps
    def _poll(self, qs: list[int], timeout_ms: int,
              reports: dict[int, tuple[int, int | None, int | None]]) -> None:
        got = gather([self._owner(q).live_poll.remote(q, self.batch_size, timeout_ms)
                      for q in qs], "poll")
        self._received(got)
        for q, r in zip(qs, got, strict=True):
            reports[q] = (int(r[0]), r[1], r[2])

    def _live_step(self) -> Batch:
        """The single-process live step, from the owners' reports instead of chunks."""
        now = self.clock.monotonic()
        self._discover(now)
        self._new_step()
        reports: dict[int, tuple[int, int | None, int | None]] = {}
        self._poll([q for q, c in enumerate(self.cursors) if not c.reached_stop()], 0, reports)

        def has(q: int) -> bool:
            r = reports.get(q)
            return r is not None and (r[0] > self.cursors[q].next or r[1] is not None)

        limit: int | None = None
        if self.stop_end:
            def behind() -> list[int]:
                return [q for q, c in enumerate(self.cursors) if c.stop_at is not None
                        and not c.reached_stop() and q in reports
                        and reports[q][0] < c.stop_at]

            lagging = behind()
            if lagging:
                laggard = min(lagging, key=lambda q: reports[q][0])
                if not has(laggard) and self.poll_ms > 0 and not self.stop_requested:
                    self._poll([laggard], self.poll_ms, reports)
                    lagging = behind()
                limit = min((reports[q][0] for q in lagging), default=None)
        elif not any(has(q) for q in reports) and self.poll_ms > 0 \
                and not self.stop_requested and reports:
            # nothing anywhere: wait on the first partition that can still deliver
            self._poll([min(reports)], self.poll_ms, reports)
        now = self.clock.monotonic()
        ranges: dict[str, tuple[int, int]] = {}
        tos: dict[int, int] = {}
        for q, c in enumerate(self.cursors):
            r = reports.get(q)
            if r is None or c.reached_stop() or (limit is not None and c.next >= limit):
                taken = False
            else:
                taken = has(q)
            if taken:
                assert r is not None
                bound = min((b for b in (c.stop_at, limit) if b is not None), default=None)
                to = r[0] if bound is None or r[0] <= bound else bound
                ranges[self.names[q]] = (c.next, to)
                tos[q] = to
                if r[1] is not None and r[1] < to:
                    c.last_delivery = now
            if self.stop_end and r is not None and r[2] is not None and \
                    (not taken or r[2] >= tos[q]):
                c.last_delivery = now  # records at hand, held back: not quiet
        for q, c in enumerate(self.cursors):
            if not c.listed:  # where a newly opened partition starts
                ranges.setdefault(self.names[q], (c.next, c.next))
        idle, advance = self._idleness(ranges, now)
        end = self.stop_end and all(
            c.stop_at is not None and tos.get(q, c.next) >= c.stop_at
            for q, c in enumerate(self.cursors))
        if not ranges and advance is None and not end and \
                tuple(idle) == tuple(n for q, n in enumerate(self.names) if self.wm.is_idle(q)):
            return self._step_batch(None, [], [])  # nothing happened: no step
        plan = StepPlan(step=self.step + 1, prev=self.prev, partitions=tuple(self.names),
                        ranges=ranges, idle=tuple(idle), advance_ms=advance,
                        now_ms=self.clock.wall_ms(), end=end, files={})
        self._record(plan)
        return self._apply_plan(plan, [])

    def _replay_step(self, plan: StepPlan) -> Batch:
        self._new_step()
        return super()._replay_step(plan)

    def _new_step(self) -> None:
        """A new entry of the bytes received (the last few thousand steps are kept:
        a live run polls for ever)."""
        for seq in (self.outputs.step_bytes, self.outputs.output_bytes):
            if len(seq) >= 4096:
                del seq[:2048]
            seq.append(0)

    def _take_range(self, c: _Cursor, name: str, to: int) -> _Took:
        """Read by the owner in :meth:`_apply_plan`, not here."""
        return empty_chunk(self.plan, to), []

    def _apply_plan(self, plan: StepPlan, took: list[_Took | None]) -> Batch:
        """Every partition's owner takes the plan's range (an empty one when the plan
        reads nothing there) and publishes it; the key workers are asked to apply it."""
        for c in self.cursors[:len(plan.partitions)]:
            c.listed = True
        idle = set(plan.idle)
        if self.idle_ms is not None or idle or any(self.wm.idle):
            self.wm.idle = [n in idle for n in self.names]
        step = self.outputs.step  # numbers the owners' raw text of the step
        self.outputs.step += 1
        unseen = list(self._unseen())
        keep_bad = self._job is not None and self._job.records_on_workers("errors")
        refs = []
        for q, (name, c) in enumerate(zip(self.names, self.cursors, strict=True)):
            frm, to = plan.ranges.get(name, (c.next, c.next))
            refs.append(self._owner(q).live_read.remote(
                q, name, frm, to, self.batch_size, self.poll_ms, len(self.actors), unseen,
                step, plan.end, keep_bad))
            c.next = to
            c.resume = c.after = PartitionPosition(offset=to)
        got = gather(refs, "read")
        self._received(got)
        if plan.advance_ms is not None:
            self.wm.global_ms = max(self.wm.global_ms, plan.advance_ms)
        if plan.end:
            self.finished = True
        return self._step_batch(plan, got, refs)

    def _step_batch(self, plan: StepPlan | None, got: list[Any], refs: list[Any]) -> Batch:
        end = plan is not None and plan.end
        sums = [s for s, _, _ in got]
        pending = []
        job = self._job
        stage = job.results_stage_epoch() if job is not None and plan is not None else None
        late_refs = job is not None and plan is not None and job.records_on_workers("late")
        if plan is not None:
            wm, last = self.wm.to_json(), [None] * len(self.cursors)
            breaks = [ref for _, ref, _ in got]
            pending = [a.process_step.remote(wm, last, 0, breaks,
                                             [shards[i] for _, _, shards in got], stage,
                                             late_refs)
                       for i, a in enumerate(self.actors)]
        empty = np.zeros(0, np.int64)
        infos = [Breaks(q, empty, empty, s["max_time"], None, False, end)
                 for q, s in enumerate(sums)]
        if not infos:  # (a step without partitions: the input is not over)
            infos = [Breaks(0, empty, empty, None, None, False, end)]
        bad = [from_ipc(s["bad"]).with_columns(pl.lit(q, dtype=pl.Int32).alias("_p"))
               for q, s in enumerate(sums) if s["bad"] is not None]
        failed = [from_ipc(s["failed"]).with_columns(pl.lit(q, dtype=pl.Int32).alias("_p"))
                  for q, s in enumerate(sums) if s["failed"] is not None]
        self.outputs.output_bytes[-1] += sum(_bytes(s["bad"]) + _bytes(s["failed"])
                                             for s in sums)
        bad_schema = dict(BAD_SCHEMA)
        bad_schema["_p"] = pl.Int32()
        n = len(self.cursors)
        return StepBatch(
            events=pl.DataFrame(),
            bad=(pl.concat(bad, how="vertical").sort(["_offset", "_p"]) if bad
                 else pl.DataFrame(schema=bad_schema)),
            end=(POS_INF, POS_INF) if end else (-1, n - 1),
            positions=[c.source_position() for c in self.cursors],
            last_offsets=[None] * n,
            finished=end,
            empty_and_done=[False] * n,
            step=plan.step if plan is not None else None,
            pending=pending,
            bound=0,
            read=sum(int(s["read"]) for s in sums),
            seen={f for s in sums for f in s["seen"]},
            failed=pl.concat(failed, how="vertical") if failed else None,
            infos=infos,
            planner=self.outputs,
            staged=stage is not None,
            plane_step=self.outputs.step - 1,
            kept_bad=sum(int(s.get("n_bad", 0)) for s in sums if s["bad"] is None
                         and s["failed"] is None),
            late_refs=late_refs,
        )

    def _received(self, got: Any) -> None:
        if self.outputs.step_bytes:
            self.outputs.step_bytes[-1] += _bytes(got)

    def close(self) -> None:
        try:
            super().close()
        finally:
            import ray

            try:  # best effort: a lost worker has nothing left to close
                ray.get([a.live_close.remote() for a in self.actors], timeout=30)
            except Exception:  # noqa: BLE001
                pass
