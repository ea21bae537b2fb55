"""A job run by N Ray workers: the single-process job with its keyed state sharded.

The coordinator (this process) is the single-process :class:`~sealstream.Job`
as the control plane: it plans steps, keeps the watermark state, stages output
in the sinks and writes the checkpoints, as on one process (except results in a
JSON Lines or Parquet directory or in a PostgreSQL table, of a bounded run or of a
live run read by the workers (Kafka, NATS, followed files), which each worker stages
and commits itself: :mod:`._sinks`, :mod:`._db_sinks`; and of outputs into Kafka,
which each worker produces itself: :mod:`._kafka_sinks`;
late events and bad records in such directories are staged by the partitions'
readers: :mod:`._records`). For bounded sources
the data plane runs on the workers (:mod:`._steps`, :mod:`._plane`): partition
``i`` is read and parsed by worker ``i mod N``, which sends each key's worker its
rows and its partition's watermark breakpoints through Ray's object store; each
key's worker (see :mod:`._shard`) gives every row its exact single-process
watermark and runs the window operator. A live source's steps are planned,
recorded and replayed here; Kafka partitions, NATS subjects and followed files are
read by their workers (:mod:`.live`, :mod:`._follow_read`). Hence the output
with N workers is the single-process output, and every guarantee of the
checkpoint protocol (the guard, fallback, refusal, exactly-once sinks) is the
single-process one.

Checkpoint at a step boundary: every worker encodes its part of the state (its
keys' open windows, a checkpoint file of its own: ``state.part-<i>.arrow``); the
coordinator claims the checkpoint id in the job's checkpoint store, each worker
writes its own part into it (directory or PostgreSQL store: create-if-absent,
durable, fenced by the coordinator's lock token; an SQLite store gets the parts
through the coordinator), the coordinator writes the receipts and the suppression
list and publishes one signed manifest last, which names every part with the
SHA-256 its worker reported beside the positions, the watermark and the receipts. Its
``distributed`` entry records the worker count, each part's rows and the key
routing. The guard judges the whole: a part missing or damaged makes the whole
checkpoint PARTIAL or INCONSISTENT, and recovery falls back.

Failure: a lost worker process or node makes the step fail with
:class:`WorkerLostError`; the job then stops every worker, and restarts all of
them from the newest atomic checkpoint (re-splitting its state), replaying the
input after it with the single-process recovery (output committed after that
checkpoint is suppressed, never written twice).
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import polars as pl

from sealstream._runtime.engine import Job
from sealstream._runtime.merge import Batch, SourcePosition
from sealstream._runtime.summary import RunSummary
from sealstream.checkpoint import receipts as trees
from sealstream.checkpoint.manifest import (
    RECEIPT_IDS_NAME,
    RECEIPTS_NAME,
    STATE_NAME,
    SUPPRESS_NAME,
    part_name,
    seal,
)
from sealstream.checkpoint.stores import CheckpointStore, checkpoint_dirname
from sealstream.distributed._cluster import connect
from sealstream.distributed._kafka_sinks import KafkaWorkersSink
from sealstream.distributed._plane import advance, prepare
from sealstream.distributed._records import ROLES as RECORD_ROLES
from sealstream.distributed._routing import (
    Table,
    describe,
    partition_shares,
    read_shares,
    weighted,
)
from sealstream.distributed._shard import (
    ROUTING,
    ShardedOperator,
    WorkerLostError,
    acquire,
    gather,
    on_ckpt,
    release,
)
from sealstream.distributed._sinks import (
    WorkerPartsSink,
    stages_on_workers,
    worker_run_token,
)
from sealstream.distributed._steps import StepBatch, StepPlanner
from sealstream.distributed._worker import from_ipc, to_ipc
from sealstream.distributed.live import LivePlanner, live_on_workers
from sealstream.errors import CheckpointError, SpecError
from sealstream.pipeline import Pipeline
from sealstream.sinks.kafka import KafkaSink
from sealstream.sources._base import KEY, KEY_IS_INT, OFFSET, PARTITION
from sealstream.state import incremental
from sealstream.state.codec import WATERMARK_META, encode_table, sha256_hex
from sealstream.windows.aggregates import WEND, WSTART

#: restarts after a lost worker before the run fails (Flink's fixed-delay default is
#: unbounded; a bounded default keeps a broken cluster from looping for ever)
DEFAULT_MAX_RESTARTS = 3


class DistributedJob(Job):
    """Runs ``pipeline`` as ``workers`` Ray workers, exactly once across restarts.

    >>> # DistributedJob(load_spec("spec.toml"), workers=3).run()
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        workers: int | None = None,
        address: str | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        quiet: bool = False,
        **kwargs: Any,
    ) -> None:
        """``quiet``: Ray's start-up lines are not printed."""
        n = workers if workers is not None else pipeline.workers
        if n is None or n < 1:
            raise ValueError(f"workers must be a positive integer, got {n!r}")
        if pipeline.archive is not None:  # before Ray starts: nothing is touched
            raise SpecError(
                "[archive] is not supported with --workers yet (the workers read the "
                "source, and no worker writes archive segments): run the job on one "
                "process, or remove [archive]")
        self.workers = n
        self.address = address
        self.max_restarts = max_restarts
        self.restarts = 0
        self.quiet = quiet
        #: seconds to start (or reach) Ray, and to start and load the workers
        self.ray_start_s = 0.0
        self.worker_start_s = 0.0
        self._job_args = (pipeline, kwargs)
        self._init_job()

    def _init_job(self) -> None:
        pipeline, kwargs = self._job_args
        self._actors: list[Any] = []
        #: the worker holding the receipt ids of the checkpoint being written
        self._receipt_builder: Any = None
        #: the workers' staging calls of late events and bad records (:mod:`._records`)
        self._record_calls: list[Any] = []
        Job.__init__(self, pipeline, **kwargs)
        # each checkpoint holds the whole state as parts, never a delta chain
        self._incremental = False

    # the operator becomes sharded once recovery has built it (fresh or restored)
    def _fresh_start(self) -> list[SourcePosition]:
        positions = super()._fresh_start()
        self._shard()
        #: a live source's partitions are known once it is opened: the routing is
        #: decided then, the workers' state still empty (:meth:`_route_live`)
        assert isinstance(self.operator, ShardedOperator)
        self._route_when_open = self.live and self.operator.table is None
        return positions

    def _restore(
        self, store: CheckpointStore, cid: int, doc: dict[str, Any]
    ) -> list[SourcePosition]:
        positions = super()._restore(store, cid, doc)
        self._shard()
        return positions

    def _shard(self) -> None:
        assert self.operator is not None
        if isinstance(self.operator, ShardedOperator):
            return
        started = time.monotonic()
        self.operator = ShardedOperator(self.p, self.operator.snapshot(), self._workers(),
                                        self._routing())
        self.worker_start_s += time.monotonic() - started

    def _routing(self) -> Table | None:
        """An input read in unequal shares by the workers (3 partitions on 2 workers):
        fewer keys for the workers that read more (:mod:`._routing`). Bounded files by
        their sizes; a live source read on the workers by its partitions' number:
        those of the checkpoint resumed from (a fresh start decides once the source
        is open, :meth:`_route_live`)."""
        if self.workers < 2:
            return None
        if self.live:
            if not live_on_workers(self.p) or not self.names:
                return None
            return weighted(partition_shares(len(self.names), self.workers))
        return weighted(read_shares([path for _, path in self.partitions], self.workers))

    def _route_live(self, partitions: int) -> None:
        """A fresh live run: the routing for the ``partitions`` the source opened at
        start, given to the workers before the first step (their state is empty)."""
        if not getattr(self, "_route_when_open", False):
            return
        self._route_when_open = False
        table = weighted(partition_shares(partitions, self.workers)) \
            if self.workers > 1 else None
        if table is not None:
            assert isinstance(self.operator, ShardedOperator)
            self.operator.route(table)

    def _workers(self) -> list[Any]:
        if not self._actors:
            self._actors = acquire(self.workers)
        return self._actors

    def _start_sources(self, positions: list[SourcePosition]) -> None:
        """Bounded sources: the data plane (:class:`StepPlanner`), partition ``i``
        read and parsed by worker ``i mod N``, rows sent worker to worker. A live
        source (a broker, or files followed as they grow) is planned by the
        coordinator through the live runtime's recorded steps (its order and plans
        are the single-process ones) and read by the partitions' workers; a
        several-source union is still read here (only its window state sharded)."""
        actors = self._workers()
        if self.live and live_on_workers(self.p):  # each partition's worker reads it
            from functools import partial

            from sealstream._runtime.live import open_live
            from sealstream.distributed._follow_read import FollowPlanner, following

            planner = FollowPlanner if following(self.p) else LivePlanner
            merger = open_live(self, positions, partial(
                planner, actors=actors, pipeline=self.p,
                unseen=lambda: self.unseen_fields, job=self))
            self.merger = merger  # type: ignore[assignment]
            self.names = merger.names  # grows as partitions appear
            self._route_live(len(merger.names))
            self.rejected += merger.rejected_plans
            self._open_worker_results()
            return
        if self.live:
            super()._start_sources(positions)
            return
        batch = self.p.batch_size
        if self.p.checkpoint and self.p.checkpoint.every_events:
            per_partition = -(-self.p.checkpoint.every_events // max(1, len(self.partitions)))
            batch = max(1, min(batch, per_partition))
        self._batch_cap = batch
        self.merger = StepPlanner(  # type: ignore[assignment]
            self, self.p, list(self.partitions), positions, actors, batch)
        self._open_worker_results()

    def _apply(self, batch: Batch) -> int:
        """A data-plane step (:class:`StepBatch`): the workers read, watermark and
        aggregate; the coordinator advances its watermark state from the per-partition
        summaries (the same arithmetic as every worker) and stages the output."""
        if not isinstance(batch, StepBatch):
            return super()._apply(batch)
        assert batch.planner is not None
        self._handle_bad(batch.bad)
        prepare(self.wm, batch.infos)
        if batch.failed is not None and batch.failed.height:
            self._handle_bad(batch.failed)
        w_before = self.wm.global_ms
        advance(self.wm, batch.infos, batch.bound)
        got = batch.planner.gather_outputs(batch)
        if batch.late_refs or batch.kept_bad:
            got = self._stage_records(batch, got)
        if batch.finished:  # every window fired: keep the watermark the data reached
            self.wm.end_of_input(self._reach_ms(), w_before)
        if batch.staged:  # the workers staged their results: a count and an end came back
            counts = [f for f, _, _ in got if isinstance(f, dict)]
            if counts:
                n_staged = sum(int(c["results"]) for c in counts)
                end = max(int(c["max_window_end"]) for c in counts)
                self.output.submit(lambda: self._count_staged(n_staged, end))
            got = [(None, lt, n) for _, lt, n in got]
        fires = [from_ipc(f) for f, _, _ in got if isinstance(f, bytes)]
        lates = [from_ipc(lt) for _, lt, _ in got if isinstance(lt, bytes)]
        fired = pl.concat(fires, how="vertical") if fires else pl.DataFrame()
        late = pl.concat(lates, how="vertical") if lates else pl.DataFrame()
        if self.workers > 1:
            if fired.height:
                fired = fired.sort([KEY, KEY_IS_INT, WSTART, WEND])
            if late.height:
                late = late.sort([OFFSET, PARTITION])
        read = batch.read
        self.counters.events += read
        if self.unseen_fields and batch.seen:
            self.unseen_fields = [f for f in self.unseen_fields if f not in batch.seen]
        if fired.height:
            epoch = self.epoch
            self.output.submit(lambda: self._emit_results(fired, epoch))
        if late.height:
            self.counters.late_events += late.height
            frame = self._late_frame(late, batch)
            frame = self._suppressed("late", frame, ["_partition", "_offset"])
            if "late" in self.sinks and frame.height:
                self.sinks["late"].write(self.epoch, frame)
                self._receipt("late", frame)
        if self.crash.targets:
            self.output.drain()
            self._drain_records()
        self.crash("after_stage")
        # bad records kept on the workers count towards the checkpoint interval, as the
        # ones the batch carries do (the loop adds ``batch.bad.height``)
        return read + batch.kept_bad

    # ------------------------------------------------------------ results sinks
    def _open_sinks(self) -> None:
        """Bounded sources, and live sources whose partitions the workers read (Kafka,
        NATS), with a JSON Lines or Parquet results directory: every worker stages its
        own results (:mod:`._sinks`); other outputs stay here."""
        super()._open_sinks()
        results = self.sinks["results"]
        on_workers = not self.live or live_on_workers(self.p)
        if on_workers and stages_on_workers(results):
            self.sinks["results"] = WorkerPartsSink(results, self._workers, self.crash)
        elif on_workers and isinstance(results, KafkaSink):  # a producer per worker
            self.sinks["results"] = KafkaWorkersSink(results, self._workers, self.crash,
                                                     self.run_token, self.workers)
        for role in RECORD_ROLES:  # late events, bad records: staged by the readers
            sink = self.sinks.get(role)
            if sink is not None and on_workers and stages_on_workers(sink):
                self.sinks[role] = WorkerPartsSink(sink, self._workers, self.crash, role,
                                                   self._drain_records)
            elif on_workers and isinstance(sink, KafkaSink):  # the readers' producers
                self.sinks[role] = KafkaWorkersSink(sink, self._workers, self.crash,
                                                    self.run_token, self.workers, role,
                                                    self._drain_records)

    def _open_worker_results(self) -> None:
        kafka = self.sinks.get("results")
        if isinstance(kafka, KafkaWorkersSink):
            gather([a.open_results.remote(self.p, worker_run_token(self.run_token, i),
                                          self.workers > 1, self.store is not None,
                                          kafka.producer(i))
                    for i, a in enumerate(self._workers())], "open results")
        elif isinstance(self.sinks.get("results"), WorkerPartsSink):
            gather([a.open_results.remote(self.p, worker_run_token(self.run_token, i),
                                          self.workers > 1, self.store is not None)
                    for i, a in enumerate(self._workers())], "open results")
        for role in RECORD_ROLES:
            sink = self.sinks.get(role)
            if isinstance(sink, WorkerPartsSink):
                gather([a.open_records.remote(self.p, role,
                                              worker_run_token(self.run_token, i),
                                              list(self.names), self.store is not None,
                                              sink.producer(i) if isinstance(
                                                  sink, KafkaWorkersSink) else None)
                        for i, a in enumerate(self._workers())], f"open {role}")

    def records_on_workers(self, role: str) -> bool:
        """Whether the workers stage this step's ``role`` (late events, bad records):
        a directory output staged per worker, with no suppression list left for it
        (a list only shrinks: once empty, it stays so for the run)."""
        if not isinstance(self.sinks.get(role), WorkerPartsSink):
            return False
        sup = self.suppress.get(role)
        return sup is None or not sup.height

    def _stage_records(self, batch: StepBatch, got: list[Any]) -> list[Any]:
        """Ask the step's readers to stage its late events (references from the key
        workers, passed on unresolved) and the bad records they kept, in this epoch;
        count them. Returns ``got`` without the late references."""
        assert batch.planner is not None
        refs = [r for _, lt, _ in got if isinstance(lt, dict) for r in lt["ref"]]
        n_late = sum(int(lt["n"]) for _, lt, _ in got if isinstance(lt, dict))
        if refs or batch.kept_bad:
            actors = self._workers()
            owners = sorted({q % len(actors) for q in range(batch.planner.n)})
            late_epoch = self.epoch if refs else None
            errors_epoch = self.epoch if batch.kept_bad else None
            parts = range(batch.planner.n)
            names = list(self.names)  # (a live source's grow)
            self._record_calls += [actors[i].stage_records.remote(
                [q for q in parts if q % len(actors) == i], batch.plane_step, late_epoch,
                errors_epoch, refs, names) for i in owners]
        if n_late:
            self.counters.late_events += n_late
            self._count_records("late", n_late)
        if batch.kept_bad:
            self.counters.bad_records += batch.kept_bad
            self._count_records("errors", batch.kept_bad)
        return [(f, None if isinstance(lt, dict) else lt, n) for f, lt, n in got]

    def _drain_records(self) -> None:
        """Wait for the workers' staging calls (raising what they raised)."""
        calls, self._record_calls = self._record_calls, []
        if calls:
            gather(calls, "stage records")

    def _count_records(self, role: str, count: int) -> None:
        """Late events or bad records the workers staged, in the epoch's receipt (their
        ids stay on the workers)."""
        if self.store is None:
            return
        rec = self._receipts_now.setdefault(role, {"count": 0, "ids": []})
        rec["count"] += count
        rec["on_workers"] = int(rec.get("on_workers", 0)) + count

    def results_stage_epoch(self) -> int | None:
        """The epoch the workers stage this step's results in, or None when the
        coordinator stages them (another sink kind, or results to suppress)."""
        if not isinstance(self.sinks.get("results"), WorkerPartsSink):
            return None
        sup = self.suppress.get("results")
        if sup is not None and sup.height:
            return None
        return self.epoch

    def _count_staged(self, count: int, max_window_end: int) -> None:
        """The results the workers staged (on the output stage, like
        :meth:`_emit_results`): counted, and noted in the epoch's receipt, whose ids
        stay on the workers (:mod:`._receipts`)."""
        self.counters.windows_fired += count
        self.counters.results_written += count
        if self.store is None:
            return
        rec = self._receipts_now.setdefault("results", {"count": 0, "ids": []})
        rec["count"] += count
        rec["on_workers"] = int(rec.get("on_workers", 0)) + count
        prev = rec.get("max_window_end")
        rec["max_window_end"] = max_window_end if prev is None else max(prev, max_window_end)

    # ------------------------------------------------------------ receipts
    def _close_receipts(self, tokens: dict[str, list[str]]) -> Callable[[], dict[str, Any]]:
        """When workers staged results in the closing epoch, ask each for its ids now
        (in order after the epoch's steps on it; references only, resolved by the
        epoch's receipt worker, never here)."""
        rec = self._receipts_now.get("results")
        if rec is not None and rec.get("on_workers"):
            actors = list(self._workers())
            shares = [a.take_receipt_ids.remote(self.epoch) for a in actors]
            own = rec["ids"]
            own_ipc = to_ipc(pl.concat(own, how="vertical")) if own else None
            rec["builder"] = actors[self.epoch % len(actors)]
            # asked for now, waited for on the writer thread: built meanwhile
            rec["built"] = rec["builder"].build_receipt.remote(shares, own_ipc)
        for role in RECORD_ROLES:
            rec = self._receipts_now.get(role)
            if rec is None or not rec.get("on_workers"):
                continue
            self._drain_records()
            actors = list(self._workers())
            shares = [a.take_receipt_ids.remote(self.epoch, role) for a in actors]
            own = rec["ids"]
            own_ipc = to_ipc(pl.concat(own, how="vertical")) if own else None
            rec["built_records"] = actors[self.epoch % len(actors)].build_records_receipt \
                .remote(shares, own_ipc)
        return super()._close_receipts(tokens)

    def _role_digest(self, role: str, rec: dict[str, Any]) -> str:
        """The digest of late events or bad records the workers staged comes from the
        worker that built it (its count checked against the staged one); ids the
        coordinator gathered itself are digested as in a single process."""
        if "built_records" not in rec:
            return super()._role_digest(role, rec)
        built = gather([rec["built_records"]], "receipt")[0]
        if int(built["count"]) != int(rec["count"]):
            raise CheckpointError(f"epoch receipt: the workers hold {built['count']} "
                                  f"{role} ids, {rec['count']} were staged")
        return str(built["digest"])

    def _results_digest(self, rec: dict[str, Any]) -> tuple[str, str]:
        """On the writer thread: the epoch's receipt built by its receipt worker from
        every worker's ids and the coordinator's own (steps it staged itself); only
        the count, digest and root come back. The worker keeps the ids file until
        :meth:`_write_checkpoint` has it written."""
        if "builder" not in rec:
            return super()._results_digest(rec)
        built = gather([rec["built"]], "receipt")[0]
        if int(built["count"]) != int(rec["count"]):
            raise CheckpointError(f"epoch receipt: the workers hold {built['count']} result "
                                  f"ids, {rec['count']} results were staged")
        self._receipt_builder = rec["builder"]
        return str(built["digest"]), str(built["root"])

    def _close_shards(self, healthy: bool = False) -> None:
        """Let the workers go: back to this driver's pool when ``healthy`` (the job
        ended normally), else stopped (one was lost: none is trusted)."""
        if isinstance(self.operator, ShardedOperator):
            self.operator.close()
        actors, self._actors = self._actors, []
        release(actors, healthy)

    # ------------------------------------------------------------ checkpoints
    def _checkpoint(self, store: CheckpointStore) -> None:
        op = self.operator
        if isinstance(op, ShardedOperator):
            # the state's parts are encoded by their workers, with the watermark the
            # coordinator's checkpoint records at this same point
            op.part_metadata = {WATERMARK_META.decode(): copy.deepcopy(self.wm.to_json())}
        super()._checkpoint(store)

    def _write_checkpoint(
        self, store: CheckpointStore, cid: int, snap: pl.DataFrame, wm_json: Any,
        chain: dict[str, dict[str, Any]] | None, touched: pl.DataFrame | None,
        last_state: pl.DataFrame | None, receipts: bytes, pending: bytes | None,
        body: dict[str, Any], together: list[Callable[[Any], None]],
    ) -> tuple[dict[str, Any], int]:
        """The single-process writer, with the state as one part per worker: the
        ``state`` file keeps the schema and the watermark (no rows), ``part:<i>``
        files hold worker ``i``'s rows; the signed manifest names every file with its
        SHA-256 and is published last (one atomic step, as on one process).

        With a store that takes direct parts (directory, PostgreSQL) the coordinator
        claims the checkpoint id, each worker writes its own part into it (fenced by
        the coordinator's lock token) and returns its name, SHA-256 and size; the
        coordinator then writes the small files and publishes the manifest. Otherwise
        (SQLite) the coordinator takes the parts' bytes and writes them itself."""
        op = self.operator
        if not isinstance(op, ShardedOperator) or chain is not None:
            if self._receipt_builder is not None:
                builder, self._receipt_builder = self._receipt_builder, None
                self._receipt_ids = trees.decode_ids(gather(
                    [on_ckpt(builder.take_receipt_file).remote()], "receipt ids")[0])
            return super()._write_checkpoint(store, cid, snap, wm_json, chain, touched,
                                             last_state, receipts, pending, body, together)
        meta = {WATERMARK_META.decode(): wm_json}
        files: dict[str, tuple[str, bytes]] = {
            "state": (STATE_NAME, encode_table(snap.clear(), meta)),
            "receipts": (RECEIPTS_NAME, receipts),
        }
        if pending is not None:
            files["suppress"] = (SUPPRESS_NAME, pending)
        if self._receipt_ids is not None:  # the leaves of the epoch's Merkle receipt
            files["receipt_ids"] = (RECEIPT_IDS_NAME, trees.encode_ids(self._receipt_ids))
            self._receipt_ids = None
        dirname = checkpoint_dirname(cid)
        direct = store.direct_parts
        builder, self._receipt_builder = self._receipt_builder, None
        if builder is not None and not direct:  # SQLite: the ids file through here
            files["receipt_ids"] = (RECEIPT_IDS_NAME, gather(
                [on_ckpt(builder.take_receipt_file).remote()], "receipt ids")[0])
        written: dict[str, dict[str, Any]] = {}
        if direct:
            store.claim(cid)
            for i, (name, digest, size) in enumerate(
                    op.write_parts(cid, store.fence(), store.encryption_key)):
                if name != part_name(i):
                    raise CheckpointError(f"checkpoint {cid}: worker {i} wrote {name!r}, "
                                          f"expected {part_name(i)!r}")
                written[f"{incremental.PART_ROLE}{i}"] = {
                    "path": f"{dirname}/{name}", "sha256": digest, "bytes": size}
            if builder is not None:  # the epoch's receipt worker writes its ids file
                name, digest, size = gather([on_ckpt(builder.write_receipt_ids).remote(
                    cid, store.fence(), store.encryption_key)], "write receipt ids")[0]
                written["receipt_ids"] = {"path": f"{dirname}/{name}", "sha256": digest,
                                          "bytes": size}
            self.crash("after_write_parts")
        else:
            for i, data in enumerate(op.take_parts()):
                files[f"{incremental.PART_ROLE}{i}"] = (part_name(i), data)
        entries = {role: {"path": f"{dirname}/{name}", "sha256": sha256_hex(data),
                          "bytes": len(data)} for role, (name, data) in files.items()}
        entries.update(written)
        body["state"]["sha256"] = entries["state"]["sha256"]
        body["files"] = entries
        manifest = seal(body, self.key)
        blobs = dict(files.values())
        in_publish: Callable[[Any], None] | None = None
        if together:
            def in_publish(conn: Any) -> None:
                for commit in together:
                    commit(conn)
        if direct:
            store.write_checkpoint(cid, blobs, manifest, crash=self.crash,
                                   in_publish=in_publish, claimed=True)
        elif in_publish is not None:
            store.write_checkpoint(cid, blobs, manifest, crash=self.crash,
                                   in_publish=in_publish)
        else:
            store.write_checkpoint(cid, blobs, manifest, crash=self.crash)
        self.crash("after_manifest_publish")
        size = sum(len(b) for b in blobs.values()) + len(manifest)
        return entries, size + sum(int(e["bytes"]) for e in written.values())

    def manifest_extra(self) -> dict[str, Any]:
        op = self.operator
        rows = op.part_rows if isinstance(op, ShardedOperator) else []
        return {"distributed": {
            "workers": self.workers,
            "routing": {**ROUTING, **describe(
                op.table if isinstance(op, ShardedOperator) else None, self.workers)},
            "parts": [{"worker": i, "state_rows": n} for i, n in enumerate(rows)],
        }}

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the current workers (empty before they start)."""
        op = self.operator
        return list(op.pids) if isinstance(op, ShardedOperator) else []

    def summary(self) -> RunSummary:
        out = super().summary()
        out.distributed = {
            "workers": self.workers,
            "ray_start_s": round(self.ray_start_s, 6),
            "worker_start_s": round(self.worker_start_s, 6),
            "engine_s": round(max(0.0, out.seconds - self.worker_start_s), 6),
            "restarts": self.restarts,
        }
        return out

    def run(self) -> Any:
        started = time.monotonic()
        leave = connect(self.address, self.workers, quiet=self.quiet)
        self.ray_start_s = time.monotonic() - started
        try:
            while True:
                try:
                    summary = super().run()
                    self._close_shards(healthy=True)
                    return summary
                except WorkerLostError as exc:
                    if self.restarts >= self.max_restarts:
                        raise WorkerLostError(
                            f"{exc} (after {self.restarts} restart(s); the next run "
                            "resumes from the newest atomic checkpoint)"
                        ) from None
                    restarts = self.restarts + 1
                    print(f"sealstream: {exc}; restarting every worker from the newest "
                          f"atomic checkpoint (restart {restarts})", file=sys.stderr)
                    self._close_shards()
                    self._init_job()
                    self.restarts = restarts
                finally:
                    self._close_shards()
        finally:
            leave()
