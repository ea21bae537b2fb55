"""The worker actor: one shard of the keyed window state, on one Ray worker process.

It also reads and parses source partitions step by step (the data plane, see
:mod:`._steps`): each step it puts each worker's rows and its partition's watermark
breakpoints in Ray's object store for the key workers, and returns a few numbers.

A worker runs the single-process :class:`~sealstream.windows.operator.WindowOperator`
on the keys that hash to it. Batches arrive as Arrow IPC buffers through Ray's
object store (never a Python object per event) and leave the same way. A worker
holds no durable state: the checkpoint has it, and a lost worker is replaced by
restoring every worker from the newest atomic checkpoint.

At a checkpoint a worker encodes its part of the state (:meth:`ShardWorker.stage_part`,
at the step boundary) and then writes it itself into the job's checkpoint store
(:meth:`ShardWorker.write_part`: a directory every node reaches, or PostgreSQL),
opened from the pipeline's ``[checkpoint]`` configuration with the coordinator's
encryption key and fencing token; only the part's name, SHA-256 and size go back to
the coordinator, which signs and publishes the manifest. For a store without
direct parts (SQLite) the coordinator takes the bytes (:meth:`ShardWorker.take_part`).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from sealstream._runtime.engine import _transform_stage
from sealstream._runtime.merge import SourcePosition
from sealstream.checkpoint.manifest import RECEIPT_IDS_NAME, part_name
from sealstream.checkpoint.stores import CheckpointStore
from sealstream.distributed._kafka_sinks import (
    WorkerProducer,
    open_on_worker,
    open_worker_kafka,
)
from sealstream.distributed._live_read import LiveReader, Report, publish
from sealstream.distributed._phases import Phases
from sealstream.distributed._plane import (
    Breaks,
    SlabReader,
    advance,
    breakpoints,
    grid_of,
    prepare,
    raw_texts,
    row_watermarks,
)
from sealstream.distributed._receipts import Built
from sealstream.distributed._receipts import build as build_receipt
from sealstream.distributed._records import (
    WorkerRecords,
    bad_frame,
    late_frame,
    late_of,
    records_digest,
)
from sealstream.distributed._sinks import WorkerResults
from sealstream.pipeline import Pipeline
from sealstream.sources import open_partition
from sealstream.sources._base import OFFSET, PARTITION
from sealstream.state import incremental
from sealstream.state.codec import encode_table, sha256_hex
from sealstream.watermark import WatermarkState
from sealstream.windows.aggregates import SEQ
from sealstream.windows.operator import WindowOperator

if TYPE_CHECKING:
    from sealstream.distributed._follow_read import Opened


def to_ipc(frame: pl.DataFrame) -> bytes:
    """``frame`` as an Arrow IPC stream (types kept exactly, Int128 and Decimal too)."""
    buf = io.BytesIO()
    frame.write_ipc_stream(buf, compression="uncompressed")
    return buf.getvalue()


def from_ipc(data: bytes) -> pl.DataFrame:
    return pl.read_ipc_stream(io.BytesIO(data))


def to_wire(frame: pl.DataFrame) -> Any:
    """``frame`` as the data plane puts it in Ray's object store: an Arrow table
    (Polars' buffers handed to Arrow, strings as Arrow's large strings, which Ray's
    serializer takes: it stores the buffers out of band and a key worker maps them
    without a copy; about 4x less CPU than an IPC stream's encoding and decoding).
    Arrow has no 128-bit integers: a frame with one travels as an IPC stream
    (:func:`to_ipc`, which keeps them). The same types come back (:func:`from_wire`)."""
    if "Int128" in repr(frame.schema):  # (UInt128 too, and nested in lists or structs)
        return to_ipc(frame)
    return frame.to_arrow()


def from_wire(data: Any) -> pl.DataFrame:
    """A frame :func:`to_wire` made."""
    if isinstance(data, bytes):
        return from_ipc(data)
    out = pl.from_arrow(data)
    assert isinstance(out, pl.DataFrame)
    return out


def slim(frame: pl.DataFrame) -> pl.DataFrame:
    """A bounded slab's rows for another worker without the columns it rebuilds
    (:func:`unslim`): the partition (the same for every row of a slab) and the
    sequence number (``offset * partitions + partition``): 12 of about 40 bytes a
    row of the standard workload. Only when they are the frame's last two columns
    (as :meth:`ShardWorker.read_step` makes them), so the order comes back as it was."""
    if frame.columns[-2:] != [PARTITION, SEQ]:
        return frame
    return frame.drop(PARTITION, SEQ)


def unslim(frame: pl.DataFrame, q: int, n_parts: int) -> pl.DataFrame:
    """The rows of partition ``q`` as :func:`slim` had them (a step of ``n_parts``
    partitions); a frame that kept its columns (a live slab's) as it is."""
    if PARTITION in frame.columns:
        return frame
    return frame.with_columns(pl.lit(q, dtype=pl.Int32).alias(PARTITION),
                              (pl.col(OFFSET) * n_parts + q).alias(SEQ))


class ShardWorker:
    """Keys whose hash is ``index`` modulo the worker count (see :mod:`._shard`)."""

    def __init__(self) -> None:
        self.index = -1
        self.op: WindowOperator | None = None
        #: the key routing of the job (None: hash mod workers; :mod:`._routing`)
        self.table: tuple[int, ...] | None = None
        self.pipeline: Pipeline | None = None
        #: a checkpoint's part of the state, kept at the step boundary until written
        self.staged: tuple[pl.DataFrame, dict[str, Any]] | None = None
        self.store: CheckpointStore | None = None
        #: the data plane: partition index -> its slab reader; (partition, step) -> the
        #: raw text spans of the step's slab (the last two steps: one may be read
        #: ahead while the late events of the one before are written)
        self.slabs: dict[int, SlabReader] = {}
        #: the rows of this worker's own keys from the slabs it read, handed to its own
        #: :meth:`process_step` as they are (no copy, no object store): (partition,
        #: step) -> rows; the coordinator passes an :func:`own_marker` in their place
        self.own: dict[tuple[int, int], pl.DataFrame] = {}
        #: rows of the slabs read here: kept for this worker's own keys, put for others
        self.rows_kept = 0
        self.rows_put = 0
        self.rows_processed = 0
        self.spans: dict[tuple[int, int], list[Any]] = {}
        #: this worker's own results sink (a part file per epoch), see :mod:`._sinks`
        self.results: WorkerResults | None = None
        #: the live partitions this worker reads itself (see :mod:`._live_read`)
        self.live: LiveReader | None = None
        #: the last receipt this worker built as its epoch's receipt worker
        self.receipt: Built | None = None
        #: this worker's own [late] / [errors] sinks (:mod:`._records`), and the bad
        #: records of its partitions' slabs kept until their epoch is known:
        #: (partition, step) -> (parse failures, transform failures)
        self.records: dict[str, WorkerRecords] = {}
        self.bad_rows: dict[tuple[int, int], tuple[pl.DataFrame | None,
                                                   pl.DataFrame | None]] = {}
        #: where this worker's time goes (for the benchmark)
        self.phases = Phases()

    # ------------------------------------------------------------- results sink
    def open_results(self, pipeline: Pipeline, run_token: str, sort: bool,
                     keep_ids: bool = True, kafka: WorkerProducer | None = None) -> None:
        """Stage results in part files of this worker's own (``run_token``);
        ``keep_ids``: keep their identities for the receipts; ``kafka``: produce them
        into Kafka through a transactional producer of this worker's own
        (:mod:`._kafka_sinks`)."""
        if self.results is not None:
            self.results.close()
        self.results = (WorkerResults(pipeline, run_token, sort, keep_ids) if kafka is None
                        else open_on_worker(pipeline, run_token, sort, keep_ids, kafka))

    def prepare_results(self, epoch: int, role: str = "results") -> list[str]:
        """Make this worker's staged ``role`` output of ``epoch`` durable; its tokens."""
        if role != "results":
            rec = self.records.get(role)
            return rec.sink.prepare(epoch) if rec is not None else []
        return self.results.prepare(epoch) if self.results is not None else []

    def commit_results(self, epoch: int, tokens: list[str], role: str = "results") -> None:
        """Publish this worker's prepared ``tokens`` of ``epoch`` (idempotent)."""
        if role != "results":
            if role not in self.records:
                raise RuntimeError(f"this worker has no {role} sink to commit")
            self.records[role].sink.commit(epoch, tokens)
            return
        if self.results is None:
            raise RuntimeError("this worker has no results sink to commit")
        self.results.commit(epoch, tokens)

    def open_records(self, pipeline: Pipeline, role: str, run_token: str, names: list[str],
                     keep_ids: bool, kafka: WorkerProducer | None = None) -> None:
        """Stage ``role`` (late events or bad records) in part files of this worker's
        own (:mod:`._records`), or (``kafka``) produce them through a transactional
        producer of its own (:mod:`._kafka_sinks`)."""
        old = self.records.pop(role, None)
        if old is not None:
            old.close()
        sink = None if kafka is None else open_worker_kafka(pipeline, role, run_token, kafka)
        self.records[role] = WorkerRecords(pipeline, role, run_token, names, keep_ids, sink)

    def stage_records(self, mine: list[int], step: int, late_epoch: int | None,
                      errors_epoch: int | None, late: list[Any],
                      names: list[str] | None = None) -> None:
        """Stage the bad records and late events of the partitions ``mine``, which this
        worker read in ``step``: its kept bad records in ``errors_epoch``; the late rows of its
        partitions among ``late`` (references from the key workers), with the raw text
        it holds, in ``late_epoch``. ``names``: the partitions' names now (a live
        source's grow as partitions appear)."""
        import ray

        for rec in self.records.values():
            if names is not None and len(names) > len(rec.names):
                rec.names = list(names)

        if errors_epoch is not None and "errors" in self.records:
            rec = self.records["errors"]
            kept = [self.bad_rows.pop((q, step), (None, None)) for q in mine]
            parsed = [b for b, _ in kept if b is not None]
            failed = [f for _, f in kept if f is not None]
            if parsed:
                rec.stage(errors_epoch, bad_frame(rec.names, pl.concat(parsed, how="vertical")
                                                  .sort(["_offset", "_p"])))
            if failed:
                rec.stage(errors_epoch, bad_frame(rec.names, pl.concat(failed, how="vertical")))
        if late_epoch is not None and late and "late" in self.records:
            rec = self.records["late"]
            rows = late_of([from_ipc(b) for b in ray.get(late)], set(mine))
            if rows is not None:
                rec.stage(late_epoch, late_frame(rec.names, rows,
                                                 {q: self.spans[(q, step)] for q in mine}))

    # ------------------------------------------------------------- receipts
    def take_receipt_ids(self, epoch: int, role: str = "results") -> list[Any]:
        """This worker's result identities of ``epoch`` (:mod:`._receipts`), put in
        Ray's object store by this worker: a reference (in a list, so that the caller
        passes it on unresolved), or nothing when it staged no result in ``epoch``."""
        import ray

        if role != "results":
            rec = self.records.get(role)
            ids = rec.ids.take(epoch) if rec is not None else None
        else:
            ids = self.results.ids.take(epoch) if self.results is not None else None
        return [] if ids is None else [ray.put(to_ipc(ids))]

    def build_records_receipt(self, shares: list[Any], own: bytes | None) -> dict[str, Any]:
        """The count and digest of an epoch's late events or bad records from every
        worker's ids (``shares``, as :meth:`build_receipt`) and the coordinator's own."""
        import ray

        refs = [r for share in ray.get(shares) for r in share]
        frames = [from_ipc(b) for b in ray.get(refs)] if refs else []
        if own is not None:
            frames.append(from_ipc(own))
        return records_digest(frames)

    def build_receipt(self, shares: list[Any], own: bytes | None) -> dict[str, Any]:
        """Build an epoch's receipt from every worker's ids (``shares``: references to
        what :meth:`take_receipt_ids` returned on each worker, asked for before this
        call, so this worker's own is done; fetched from their workers here) and the
        coordinator's own (``own``); keep the ids file for :meth:`write_receipt_ids`.
        Returns the count, digest and root."""
        import ray

        refs = [r for share in ray.get(shares) for r in share]
        frames = [from_ipc(b) for b in ray.get(refs)] if refs else []
        if own is not None:
            frames.append(from_ipc(own))
        self.receipt = build_receipt(frames)
        return self.receipt.summary()

    def write_receipt_ids(self, cid: int, fence: Any, encryption_key: bytes | None
                          ) -> tuple[str, str, int]:
        """Write the built receipt's ids file into checkpoint ``cid`` (as
        :meth:`write_part` writes a part); its name, SHA-256 and size."""
        data = self.take_receipt_file()
        self._store(encryption_key).write_part(cid, RECEIPT_IDS_NAME, data, fence)
        return RECEIPT_IDS_NAME, sha256_hex(data), len(data)

    def take_receipt_file(self) -> bytes:
        """The built receipt's ids file (for the coordinator to write: SQLite store)."""
        built, self.receipt = self.receipt, None
        assert built is not None and built.data is not None, "build_receipt() first"
        return built.data

    # ------------------------------------------------------------- data plane
    def open_slab(self, pipeline: Pipeline, q: int, name: str, path: str,
                  start: dict[str, Any]) -> int:
        """Read partition ``q`` (``name`` at ``path``, reachable from this node) from
        ``start`` (a :class:`SourcePosition` as JSON), step by step. Returns the first
        offset the run processes there."""
        old = self.slabs.pop(q, None)
        if old is not None:
            old.close()
        pos = SourcePosition.from_json(start)
        plan = pipeline.field_plan()
        reader = open_partition(pipeline.source.kind, name, Path(path), plan, pos.resume)
        self.slabs[q] = SlabReader(reader, pos)
        self.spans = {k: v for k, v in self.spans.items() if k[0] != q}
        self.bad_rows = {k: v for k, v in self.bad_rows.items() if k[0] != q}
        self.own = {k: v for k, v in self.own.items() if k[0] != q}
        return self.slabs[q].start_offset()

    def read_step(self, pipeline: Pipeline, q: int, n_parts: int, bound: int,
                  chunk_records: int, workers: int, unseen: list[str], step: int,
                  keep_bad: bool = False) -> tuple[dict[str, Any], Any, list[Any]]:
        """Partition ``q``'s records with offset below ``bound``: parsed (and
        transformed) here, their watermark breakpoints and each worker's rows put in
        Ray's object store by this worker. Returns a summary of a few numbers per
        partition (bad records' rows when there are any), the breakpoints' reference
        and one reference per worker: no event row goes back to the coordinator.
        ``keep_bad``: bad records are kept here (their number goes back) until
        :meth:`stage_records` stages them."""
        import ray

        from sealstream.distributed._shard import split

        plan = pipeline.field_plan()
        with self.phases("read: take and parse"):
            slab = self.slabs[q].take(bound, chunk_records)
        self.spans.pop((q, step - 2), None)
        self.bad_rows.pop((q, step - 2), None)
        self.bad_rows.pop((q, step), None)
        self.spans[(q, step)] = slab.raw
        schema = dict(plan.event_schema())
        schema[PARTITION] = pl.Int32()
        events = (slab.events.with_columns(pl.lit(q, dtype=pl.Int32).alias(PARTITION))
                  if slab.events.height else pl.DataFrame(schema=schema))
        events = events.select(list(schema))
        bad, failed_rows = slab.bad, None
        transform = _transform_stage(pipeline, plan)
        if transform is not None:
            with self.phases("read: transform"):
                events, failed = transform.apply(events)
                if failed.height:
                    failed_rows = _failed(pipeline, failed, slab.raw)
        read = events.height
        with self.phases("read: breakpoints"):
            events = events.with_columns((pl.col(OFFSET) * n_parts + q).alias(SEQ))
            op = self._grid_op(pipeline)
            breaks = breakpoints(q, events, pipeline.watermark.max_delay_ms, grid_of(op),
                                 slab.last_offset, slab.empty_done, slab.drained)
        if transform is not None:
            events = transform.keep(events)
        seen = _seen(events, unseen) if unseen and events.height else []
        with self.phases("read: key split"):
            parts = split(events, workers, self.table)
        with self.phases("read: IPC encode + put"):
            # this worker's own keys stay here; the other workers' go to the store
            shards: list[Any] = []
            for i, part in enumerate(parts):
                if i == self.index:
                    self.own[(q, step)] = part
                    shards.append(own_marker(q, step))
                    self.rows_kept += part.height
                else:
                    shards.append(ray.put(to_wire(slim(part))))
                    self.rows_put += part.height
        n_bad = (bad.height if bad is not None else 0) + (
            failed_rows.height if failed_rows is not None else 0)
        if keep_bad and n_bad:
            self.bad_rows[(q, step)] = (_with_p(bad, q), _with_p(failed_rows, q))
            bad, failed_rows = None, None
        summary = {
            "read": read,
            "max_time": breaks.max_time,
            "last_offset": slab.last_offset,
            "empty_done": slab.empty_done,
            "drained": slab.drained,
            "next_first": slab.next_first,
            "emitted": slab.emitted.to_json(),
            "bad": to_ipc(bad) if bad is not None and bad.height else None,
            "failed": to_ipc(failed_rows) if failed_rows is not None else None,
            "seen": seen,
            "hint": self.slabs[q].size_hint(),
            "n_bad": n_bad,
        }
        return summary, ray.put(breaks), shards

    def _grid_op(self, pipeline: Pipeline) -> WindowOperator:
        if self.op is None or self.pipeline is None:
            return WindowOperator(pipeline)
        return self.op

    def raw_texts(self, q: int, step: int, offsets: list[int]) -> bytes:
        """The raw text of partition ``q``'s records at ``offsets`` in step ``step``."""
        import numpy as np

        texts = raw_texts(self.spans[(q, step)], np.asarray(offsets, dtype=np.int64))
        return to_ipc(texts.to_frame())

    def process_step(self, wm: dict[str, Any], last_offsets: list[int | None], bound: int,
                     breaks: list[Any], shards: list[Any], stage: int | None = None,
                     late_refs: bool = False
                     ) -> tuple[bytes | dict[str, int] | None, bytes | dict[str, Any] | None,
                                int]:
        """Apply this shard's rows of a step: ``breaks`` (one reference per partition
        read in the step) and ``shards`` (this worker's rows from each partition, in
        partition order) come from the partitions' workers through the
        object store (those of the partitions this worker read itself stay in its
        memory: an :func:`own_marker` in their place); ``wm`` is the watermark state
        before the step (a few numbers per partition). Fires the windows the step's end closes.

        With ``stage`` (an epoch) and a results sink of this worker's own
        (:meth:`open_results`), the fired windows become result rows here and are
        staged in that epoch of this worker's part file, their identities kept here
        for the epoch's receipt (:mod:`._receipts`); only their number and largest
        window end go back, in place of the fired windows.

        ``late_refs``: the late events are put in Ray's object store here; their
        number and the reference go back (for the partitions' readers to stage them,
        :meth:`stage_records`), not the rows."""
        import ray

        with self.phases("process: fetch + decode"):
            got: list[Breaks] = list(ray.get(breaks))
            fetched = iter(ray.get([s for s in shards if not _is_own(s)]))
            frames = [self.own.pop((int(s[1]), int(s[2]))) if _is_own(s)
                      else unslim(from_wire(next(fetched)), q, len(shards))
                      for q, s in enumerate(shards)]
        state = WatermarkState.from_json(wm)
        state.last_offset = list(last_offsets)
        prepare(state, got)
        op = self._op()
        grid = grid_of(op)
        with self.phases("process: watermarks"):
            events = pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]
            events = row_watermarks(events, state, got, grid)
        advance(state, got, bound)
        self.rows_processed += events.height
        with self.phases("process: aggregate + fire"):
            out = op.process(events, state.current())
        fired = out.fired
        late: bytes | dict[str, Any] | None = None
        if out.late.height:
            late = ({"n": out.late.height, "ref": [ray.put(to_ipc(out.late))]} if late_refs
                    else to_ipc(out.late))
        if stage is not None and fired.height and self.results is not None:
            # staged here: their number and largest window end go back, nothing else
            with self.phases("process: stage results"):
                return self.results.stage(stage, fired), late, events.height
        # nothing fired or late (most steps): nothing but None goes back
        return (to_ipc(fired) if fired.height else None, late, events.height)

    # ------------------------------------------------------------- live sources
    def live_open(self, pipeline: Pipeline, q: int, name: str, position: int | None,
                  from_start: bool) -> int:
        """Read live partition ``q`` (``name``) here from ``position``; where it starts."""
        if self.live is None:  # (a job's end closes it: live_close)
            self.live = LiveReader(pipeline)
        return self.live.open(q, name, position, from_start)

    def follow_open(self, pipeline: Pipeline, q: int, name: str,
                    resume: dict[str, Any] | None, nxt: int | None,
                    file: tuple[int, int] | None, from_start: bool) -> Opened:
        """Follow the file of partition ``q`` here (:mod:`._follow_read`)."""
        from sealstream.distributed._follow_read import FollowReader

        if self.live is None:
            self.live = FollowReader(pipeline)
        assert isinstance(self.live, FollowReader)
        return self.live.open_follow(q, name, resume, nxt, file, from_start)

    def live_poll(self, q: int, max_records: int, timeout_ms: int) -> Report:
        assert self.live is not None
        return self.live.poll(q, max_records, timeout_ms)

    def live_end(self, q: int) -> int | None:
        assert self.live is not None
        return self.live.end(q)

    def live_stop_at(self, q: int, position: int) -> None:
        assert self.live is not None
        self.live.stop_at(q, position)

    def live_seek(self, q: int, position: int) -> None:
        assert self.live is not None
        self.live.seek(q, position)

    def live_read(self, q: int, name: str, frm: int, to: int, max_records: int,
                  poll_ms: int, workers: int, unseen: list[str], step: int, end: bool,
                  keep_bad: bool = False) -> tuple[dict[str, Any], Any, list[Any]]:
        """Live partition ``q``'s records ``[frm, to)`` of a planned step, published
        as a bounded slab is (:func:`._live_read.publish`). ``keep_bad``: the bad
        records are kept here, as :meth:`read_step` keeps them, until
        :meth:`stage_records` stages them; only their number goes back."""
        assert self.live is not None
        events, bad, spans = self.live.take(q, name, frm, to, max_records, poll_ms)
        self.spans.pop((q, step - 2), None)
        self.spans[(q, step)] = spans
        got = publish(self.live.p, q, events, bad, spans, workers, unseen, end,
                      self._grid_op(self.live.p), self.table)
        full = getattr(self.live, "position", None)
        if full is not None:  # a followed file's full position (its identity)
            got[0]["position"] = full(q)
            got[0]["reading"] = self.live.reading(q)  # type: ignore[attr-defined]
        return self._keep_live_bad(q, step, got[0], keep_bad), got[1], got[2]

    def _keep_live_bad(self, q: int, step: int, summary: dict[str, Any], keep: bool
                       ) -> dict[str, Any]:
        """A live slab's summary with its bad records kept here (``keep``) in place of
        their rows: ``n_bad`` says how many."""
        self.bad_rows.pop((q, step - 2), None)
        self.bad_rows.pop((q, step), None)
        parsed = from_ipc(summary["bad"]) if summary["bad"] is not None else None
        failed = from_ipc(summary["failed"]) if summary["failed"] is not None else None
        n_bad = sum(f.height for f in (parsed, failed) if f is not None)
        if keep and n_bad:
            self.bad_rows[(q, step)] = (_with_p(parsed, q), _with_p(failed, q))
            summary = dict(summary, bad=None, failed=None)
        return dict(summary, n_bad=n_bad)

    def live_held(self) -> dict[int, tuple[int, int | None]]:
        """The records this worker holds per live partition: for the next step, and
        read ahead (None: a poll in flight). For tests and the benchmark."""
        return {} if self.live is None else self.live.held_records()

    def live_close(self) -> None:
        if self.live is not None:
            live, self.live = self.live, None
            live.close()

    # ---------------------------------------------------------------- windows

    def load(self, pipeline: Pipeline, index: int, state: bytes,
             table: tuple[int, ...] | None = None) -> int:
        """Become shard ``index`` of ``pipeline`` with ``state`` (whatever this worker
        held before is dropped: a worker process serves one job at a time, and the
        next job of the same driver reuses it). Returns the process id."""
        self.index = index
        self.table = table
        self.own = {}
        self.rows_kept = self.rows_put = self.rows_processed = 0
        self.op = WindowOperator(pipeline, from_ipc(state))
        self.staged = None
        if self.store is not None:
            self.store.close()
        self.pipeline, self.store = pipeline, None
        _warm(pipeline)
        return os.getpid()

    def route(self, table: tuple[int, ...] | None) -> None:
        """The job's key routing, decided after :meth:`load` (a fresh live run, once
        its partitions are known): only while this worker holds no state."""
        if self._op().open_windows:
            raise RuntimeError("the key routing changes only before the first step")
        self.table = table

    def _op(self) -> WindowOperator:
        assert self.op is not None, "load() first"
        return self.op

    def process(self, events: bytes, w_end: int) -> tuple[bytes, bytes, int]:
        """Apply this shard's events (in read order, with their watermark) and fire
        the windows ``w_end`` closes; return the fired windows, the late events and
        the number of events applied."""
        frame = from_ipc(events)
        out = self._op().process(frame, w_end)
        return to_ipc(out.fired), to_ipc(out.late), frame.height

    def snapshot(self) -> bytes:
        return to_ipc(self._op().snapshot())

    def stage_part(self, metadata: dict[str, Any]) -> tuple[int, int]:
        """Keep this worker's part of a checkpoint's state at the step boundary: the
        state as it is now (an immutable frame) with ``metadata``, encoded later by
        :meth:`write_part` or :meth:`take_part` (on the checkpoint thread, while the
        next steps run). Returns its row count and open windows."""
        op = self._op()
        with self.phases("checkpoint: take state"):
            frame = op.snapshot()
            self.staged = (frame, metadata)
            return frame.height, op.open_windows

    def take_part(self) -> bytes:
        """The staged part encoded as the checkpoint file (Arrow IPC, key-ordered)."""
        staged, self.staged = self.staged, None
        assert staged is not None, "stage_part() first"
        frame, metadata = staged
        with self.phases("checkpoint: encode"):
            return encode_table(incremental.key_ordered(frame), metadata)

    def write_part(self, cid: int, fence: Any, encryption_key: bytes | None
                   ) -> tuple[str, str, int]:
        """Write the staged part into checkpoint ``cid`` of the job's store (claimed by
        the coordinator), create-if-absent and durable, under the coordinator's
        fencing token ``fence``; return its name, SHA-256 and size (plaintext)."""
        data = self.take_part()
        name = part_name(self.index)
        with self.phases("checkpoint: write"):
            self._store(encryption_key).write_part(cid, name, data, fence)
        return name, sha256_hex(data), len(data)

    def _store(self, encryption_key: bytes | None) -> CheckpointStore:
        if self.store is None:
            assert self.pipeline is not None and self.pipeline.checkpoint is not None
            self.store = self.pipeline.checkpoint.open_store(self.pipeline.name)
        # the coordinator's key, so that every file of the checkpoint is sealed alike
        self.store._init_key(encryption_key)
        return self.store

    def open_windows(self) -> int:
        return self._op().open_windows

    def phase_times(self) -> dict[str, tuple[int, float, float]]:
        """Calls, wall and CPU seconds per phase since the last call (the benchmark's
        profile, :mod:`._phases`)."""
        return self.phases.take()

    def plane_rows(self) -> dict[str, int]:
        """Rows of the slabs read here since the last call: ``kept`` for this worker's
        own keys, ``put`` in the object store for the others; ``held``: own rows not
        yet processed; ``processed``: rows of this worker's keys it processed (for tests
        and the benchmark)."""
        out = {"kept": self.rows_kept, "put": self.rows_put, "held": len(self.own),
               "processed": self.rows_processed}
        self.rows_kept = self.rows_put = self.rows_processed = 0
        return out

    def cpu_s(self) -> float:
        """CPU seconds this worker process used so far (for the benchmark)."""
        import time

        return time.process_time()


#: what stands for a worker's own rows of a slab in :meth:`ShardWorker.process_step`
OWN = "own"


def _warm(pipeline: Pipeline) -> None:
    """Import, while the worker starts, what its first steps would otherwise import
    on the job's clock: the source's client library (confluent-kafka about 75 ms of
    CPU, nats-py) and ``pyarrow.compute``, which Ray's Arrow serializer imports on a
    process's first ``ray.put`` of a table with strings (about 40 ms). A worker that
    reads two partitions of three is the one a step waits for, and it paid both at
    its first step (docs/scale-out.md, "A Kafka source")."""
    import importlib

    wanted = ["pyarrow.compute"]
    kind = getattr(pipeline.source, "kind", None)
    if kind == "kafka":
        wanted += ["confluent_kafka", "sealstream.sources._kafka_shared"]
    elif kind == "nats":
        wanted += ["nats", "sealstream.sources.nats"]
    for name in wanted:
        try:
            importlib.import_module(name)
        except ImportError:  # (a missing extra is reported where it is used)
            pass


def own_marker(q: int, step: int) -> tuple[str, int, int]:
    """The coordinator's stand-in for the rows of partition ``q`` in ``step`` that its
    reader keeps for its own keys (a few bytes, in place of an object reference)."""
    return (OWN, q, step)


def _is_own(shard: Any) -> bool:
    return isinstance(shard, tuple | list) and len(shard) == 3 and shard[0] == OWN


def _failed(pipeline: Pipeline, failed: pl.DataFrame, spans: list[Any]) -> pl.DataFrame:
    """Records a transform failed on, as bad records (as the single-process engine
    makes them, without the partition column: the coordinator adds it)."""
    import numpy as np

    delta = 2 if pipeline.source.kind == "csv" else 1  # CSV: the header is line 1
    offs = failed.get_column("_offset").to_numpy().astype(np.int64, copy=False)
    return failed.select(
        pl.col("_offset"),
        (pl.col("_offset") + delta).alias("_line"),
        pl.col("_reason"),
        raw_texts(spans, offs).alias("_raw"),
    )


def _with_p(frame: pl.DataFrame | None, q: int) -> pl.DataFrame | None:
    """Bad records of partition ``q`` as a worker keeps them (None: none)."""
    if frame is None or not frame.height:
        return None
    return frame.select("_offset", "_line", "_reason", "_raw").with_columns(
        pl.lit(q, dtype=pl.Int32).alias("_p"))


def _seen(events: pl.DataFrame, unseen: list[str]) -> list[str]:
    """The fields of ``unseen`` that some event of ``events`` carries."""
    from sealstream.sources._base import float_col, int_col, json_col

    have = set(events.columns)
    checks = {}
    for f in unseen:
        cols = [c for c in (int_col(f), float_col(f), json_col(f)) if c in have]
        if cols:
            checks[f] = pl.any_horizontal([pl.col(c).is_not_null() for c in cols]).any()
    if not checks:
        return []
    row = events.select(**checks).row(0, named=True)
    return [f for f in unseen if row.get(f, False)]

