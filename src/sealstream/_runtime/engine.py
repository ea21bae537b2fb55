"""The job: recovery, the batch loop, and the checkpoint/commit protocol.

This module holds recovery and the loop; writing checkpoints (steps 2-6
below) is :mod:`sealstream._runtime.persist`, the refusal of another
definition's state :mod:`sealstream._runtime.fit`, and the run's figures
:mod:`sealstream._runtime.summary`.

Commit protocol, per epoch (an epoch is the output between two checkpoints):

1. Batches are applied: events get their watermark, windows aggregate, closed
   windows fire. Results, late events and bad records are *staged* in their
   sinks under the current epoch (invisible to readers).
2. ``prepare``: every sink flushes and fsyncs its staged files and returns the
   names it will publish (commit tokens). A sink may hand the fsyncs to the
   checkpoint's writer thread (``prepare_deferred``), which runs them before
   step 3.
3. The checkpoint's files are written create-if-absent and fsynced: the
   window state with its watermark, the emission receipts, and (only after a
   fall-back) the outputs still to suppress.
4. The manifest — positions, watermark epoch, file hashes, receipts summary,
   sink tokens, pipeline fingerprint — is signed and published by one atomic
   rename, then the directory is fsynced. This is the commit point.
5. ``commit``: each sink publishes the epoch's tokens (atomic renames).
6. Retention: the new checkpoint is read back and verified; only then are
   checkpoints older than the ``keep`` newest verified ones deleted.

Recovery (at start):

a. Take the directory lock (one run per checkpoint directory).
b. Judge checkpoints newest first; resume from the first ``ATOMIC_CHECKPOINT``.
   Newer ones that failed (including a crashed writer's partial directory)
   are moved aside under ``rejected/``, never deleted. If checkpoints exist but
   none verifies, refuse to start (``--start-over`` moves them all aside).
c. Sinks ``recover``: re-commit the tokens the restored checkpoint prepared
   (a crash between 4 and 5), delete every other staged file (no checkpoint
   refers to it; the replay produces it again).
d. Output committed after the restored checkpoint (it was newer and got
   rejected) is read back and suppressed during the replay, so no window,
   late event or bad record is emitted twice; what is still pending is carried
   in later checkpoints until the replay has passed it.
e. Readers reopen at the saved positions (checking the files' identity).

Without a ``[checkpoint]`` section the whole run is one epoch committed at the
end, and whatever the sinks already hold is suppressed (a rerun changes
nothing).

Fit between saved state and the deployed definition: when the newest
checkpoints were written by a different pipeline definition (their
fingerprint, or pipeline name, differs from the spec's), ``run`` refuses with
:class:`DefinitionMismatchError`: a diff of the recorded definition against the
spec (``window.size_ms: 60000 -> 30000``) and the ways forward (``sealstream
replay`` into a new destination, or ``--start-over``). It never falls back past
such a checkpoint to an older one. **choice:** every change of what the state
depends on is refused, including *adding an aggregate*: a window that is
already open has not kept the new aggregate for the events it has seen, so
resuming would emit wrong values for it. Replaying (``--from start``) computes
it correctly. Changes that the state does not depend on (output paths and
kinds, checkpoint interval, ``keep``, batch size) are not in the fingerprint
and resume normally.

A job can also start from a given :class:`StartPoint` (positions, window state,
watermark) when its own checkpoint directory holds nothing to resume: this is
how ``sealstream replay`` re-runs an interval into an isolated destination
(see :mod:`sealstream._runtime.replay`).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from sealstream import sources
from sealstream._runtime.crash import CrashPoints
from sealstream._runtime.fit import DefinitionMismatchError, definition_mismatch, table_mismatch
from sealstream._runtime.merge import Batch, PartitionMerger, SourcePosition
from sealstream._runtime.output import OutputStage
from sealstream._runtime.persist import ROLES, Checkpointing
from sealstream._runtime.summary import CheckpointStats, Counters, RunSummary
from sealstream.checkpoint import guard
from sealstream.checkpoint.manifest import (
    checkpoint_key,
    load_json,
)
from sealstream.checkpoint.stores import CheckpointStore
from sealstream.errors import (
    BadRecordError,
    CheckpointError,
    LockHeldError,
    NoValidCheckpointError,
    SealstreamError,
    SpecError,
)
from sealstream.pipeline import Pipeline, Session
from sealstream.pipeline.source import Sources
from sealstream.sinks import open_sink
from sealstream.sinks._base import JSON_LINE
from sealstream.sinks._kinds import is_database_sink, is_kafka_sink
from sealstream.sinks.jsonl import JsonlDirSink
from sealstream.sinks.parquet import ParquetDirSink
from sealstream.sources._base import (
    OFFSET,
    PARTITION,
    RAW,
    FieldPlan,
    dec_col,
    float_col,
    int_col,
    json_col,
)
from sealstream.state import incremental
from sealstream.state.codec import WATERMARK_META, decode_table
from sealstream.transforms import TransformStage, compile_transform
from sealstream.watermark import POS_INF, WATERMARK, WatermarkState, assign_watermarks
from sealstream.windows.aggregates import SEQ
from sealstream.windows.operator import WindowOperator

if TYPE_CHECKING:  # [[enrich]] is imported by the jobs that have tables to join
    from sealstream.enrich import EnrichStage

#: the manifest's member for the [[enrich]] tables' versions (sealstream.enrich)
ENRICH_FIELD = "enrich"
DEFINITION_REASONS = ("FINGERPRINT_MISMATCH", "OTHER_PIPELINE")
#: the smallest batch (records per partition per step) pacing by ``every_ms`` goes to
MIN_PACED_BATCH = 4096
#: live runs: an event's sequence is offset * this + partition index
LIVE_SEQ_PARTITIONS = 1 << 16


@dataclass(frozen=True)
class StartPoint:
    """Where a job starts when its own checkpoint directory has nothing to resume.

    ``positions`` has one entry per partition; ``state`` is the window state
    (None: no open window) and ``watermark`` a :class:`WatermarkState` as JSON
    (None: the initial watermark). ``description`` is shown in summaries.
    ``names``: a live source's partitions that ``positions`` belong to (one each);
    the source's other partitions open where its ``start`` says.
    """

    positions: tuple[SourcePosition, ...]
    state: pl.DataFrame | None = None
    watermark: dict[str, Any] | None = None
    description: str = "start"
    names: tuple[str, ...] | None = None


ProgressFn = Callable[["Job"], None]

__all__ = [
    "CheckpointStats",
    "Counters",
    "DefinitionMismatchError",
    "Job",
    "ProgressFn",
    "RunSummary",
    "StartPoint",
    "definition_mismatch",
]


def _transform_stage(p: Pipeline, plan: FieldPlan) -> TransformStage | None:
    """The pipeline's transform as a stage (None without one)."""
    tf = compile_transform(p)
    if tf is None:
        return None
    numeric = frozenset(f for f, k in p.event_plan().fields.items()
                        if k == "numeric" and f in tf.derived)
    return TransformStage(tf, plan, numeric, p.source.key, p.source.time)


def _raise_if_lock_lost(store: CheckpointStore, failure: SealstreamError) -> None:
    """When a run that failed had lost its lock, say that: it is the cause (another
    run that took the lock over clears this run's staging, so its next write fails)."""
    if isinstance(failure, LockHeldError):
        return
    try:
        store.check_lock()
    except LockHeldError as lost:
        raise LockHeldError(f"{lost} (this run then failed: {failure})") from None
    except SealstreamError:
        return  # the lock cannot be checked now: the original failure stands


class Job(Checkpointing):
    """Runs a pipeline to the end of its input, exactly once across restarts.

    >>> # job = Job(load_spec("spec.toml")); summary = job.run()
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        start_over: bool = False,
        progress: ProgressFn | None = None,
        crash: CrashPoints | None = None,
        start: StartPoint | None = None,
        stop_when: Callable[[Job], bool] | None = None,
        accept_table_change: bool = False,
    ) -> None:
        """``start``: where to begin when the checkpoint directory holds nothing to
        resume (default: the beginning of every partition, no state).
        ``stop_when``: asked after each checkpoint; True ends the run there (the
        input is not finished; a later run resumes from that checkpoint).
        ``accept_table_change``: resume even when an ``[[enrich]]`` table is not the
        version the checkpoint bound (later events join the table as it is now)."""
        self.p = pipeline
        self.start_over = start_over
        self.start = start
        self.stop_when = stop_when
        self.stopped_early = False
        self.progress = progress
        self.crash = crash or CrashPoints()
        self.output = OutputStage(concurrent=False)  # run() picks the real one
        self._suppressed_lock = threading.Lock()
        self.key = checkpoint_key()
        #: a live run (docs/live.md): planned, recorded steps (sealstream._runtime.live)
        self.live = pipeline.source.live
        self.partitions = pipeline.source.partitions(allow_empty=self.live)
        self.names = [n for n, _ in self.partitions]
        #: a signal asked a live run to stop: finish the step, checkpoint, end (exit 0)
        self.stop_requested: int | None = None
        self._plan_mark: dict[str, Any] | None = None  # the restored checkpoint's plan
        self.plan = pipeline.field_plan()
        self.transform = _transform_stage(pipeline, self.plan)
        #: [[enrich]] tables (docs/enrich.md): loaded when the sources start
        self.enricher: EnrichStage | None = None
        self.accept_table_change = accept_table_change
        if pipeline.enrich and pipeline.workers is not None:
            raise SpecError("[[enrich]]: a job with reference tables runs on one process; "
                            "--workers is not supported with [[enrich]] yet")
        self._enrich_bound: dict[str, Any] | None = None  # the resumed checkpoint's
        self.fingerprint = pipeline.fingerprint()
        self.run_token = secrets.token_hex(6)
        self.counters = Counters()  # the job's totals: restored on resume
        self.run_base = Counters()  # the totals this run started from
        #: output found already committed by an earlier run, per role (this run)
        self.not_repeated = {"results": 0, "late": 0, "errors": 0}
        #: aggregated fields no good event of this run has carried yet
        self.unseen_fields = sorted(set(self.plan.fields) & set(pipeline.event_plan().fields))
        self.ck_stats = CheckpointStats()
        self.store: CheckpointStore | None = (
            pipeline.checkpoint.open_store(pipeline.name) if pipeline.checkpoint else None
        )
        self.sinks = {}
        self.resumed_from: int | None = None
        #: why resume_point() could not list the store (None: it could, or it was not asked)
        self.resume_point_unlisted: str | None = None
        self.rejected: list[dict[str, Any]] = []
        self.rebuilt: list[str] = []  # rebuildable components the resume rebuilt
        self.started = time.monotonic()
        self.merger: PartitionMerger | None = None
        self._batch_cap = self.p.batch_size
        self.operator = None
        self.wm = WatermarkState.initial(len(self.partitions), pipeline.watermark.max_delay_ms)
        self._verified = set()
        # incremental checkpoints: keys touched since the last checkpoint, the state it
        # saved, and the files its state depends on (role -> manifest entry)
        self._incremental = bool(pipeline.checkpoint and pipeline.checkpoint.incremental)
        self._touched = []
        self._last_state = None
        self._chain = None
        # asynchronous checkpoints: the writer thread and the checkpoint in flight
        self._writer = None
        self._inflight = None
        self._receipts_now = {}  # this epoch's, per output
        want = len(self.partitions) if start is None or start.names is None else len(start.names)
        if start is not None and len(start.positions) != want:
            raise ValueError(
                f"start point has {len(start.positions)} positions for "
                f"{want} partitions"
            )

    # ================================================================ public
    def run(self) -> RunSummary:
        self.started = time.monotonic()
        self._open_sinks()
        self.output = OutputStage(
            concurrent=not any(is_database_sink(s) for s in self.sinks.values())
        )
        try:
            if self.store is None:
                self._run_unchecked()
            else:
                with self.store.locked():
                    for sink in self.sinks.values():
                        if is_database_sink(sink):
                            from sealstream.sinks.database import same_database

                            sink.transactional = same_database(sink, self.store)
                    self._run_checked(self.store)
        finally:
            self.output.close()
            for s in self.sinks.values():
                s.close()
            if self.merger is not None:
                self.merger.close()
            if self.store is not None:
                self.store.close()
        return self.summary()

    def summary(self) -> RunSummary:
        return RunSummary(
            pipeline=self.p.name,
            counters=self.counters,
            run_counters=self._this_run(),
            not_repeated=dict(self.not_repeated),
            # only a run that read events can say a field never appeared
            fields_never_seen=list(self.unseen_fields)
            if self.counters.events > self.run_base.events else [],
            checkpoints=self.ck_stats,
            seconds=time.monotonic() - self.started,
            resumed_from=self.resumed_from,
            rejected=self.rejected,
            open_windows=self.operator.open_windows if self.operator else 0,
            watermark_ms=self.wm.current() if self.operator else None,
            stopped_early=self.stopped_early,
        )

    # ================================================================ setup
    def _open_sinks(self) -> None:
        funcs = self.p.result_kinds()
        self.sinks["results"] = open_sink(self.p.sink, "results", self.run_token, funcs)
        if self.p.late is not None:
            self.sinks["late"] = open_sink(self.p.late, "records", self.run_token)
        if self.p.errors is not None:
            self.sinks["errors"] = open_sink(self.p.errors, "records", self.run_token)
        results = self.sinks["results"]
        # a compound key: each field under its own name (a line's field, a column)
        if (isinstance(results, (JsonlDirSink, ParquetDirSink)) or is_database_sink(results)
                or is_kafka_sink(results)):
            results.key_fields = self.p.source.key_fields
        for role, sink in self.sinks.items():
            if is_database_sink(sink):
                sink.pipeline = self.p.name  # its staged rows and its table are its own
            elif is_kafka_sink(sink):
                # its transactional.id (one per job and output), its staging (the store's)
                sink.set_job(self.p.name, role, self.store.location if self.store else None)

    def manifest_extra(self) -> dict[str, Any]:
        """The versions of the ``[[enrich]]`` tables this run joins (signed with the
        manifest): a resumed run must find the same ones."""
        if self.enricher is None:
            return {}
        return {ENRICH_FIELD: self.enricher.versions}

    def _open_enrich(self) -> None:
        """Load the ``[[enrich]]`` tables (before any source or output is touched);
        a resumed run refuses a table whose version is not the checkpoint's."""
        if not self.p.enrich or self.enricher is not None:
            return
        from sealstream.enrich import changed_tables, open_stage

        pinned = None if self.accept_table_change else self._enrich_bound
        full = self.plan
        self.enricher = open_stage(tuple(self.p.enrich), full, pinned)
        self.plan = self.enricher.source_plan
        self.transform = _transform_stage(self.p, full)
        if self._enrich_bound is not None and not self.accept_table_change:
            changed = changed_tables(self._enrich_bound, self.enricher.versions)
            if changed:
                assert self.store is not None and self.resumed_from is not None
                raise table_mismatch(self.store.location, self.resumed_from, changed)

    def _start_sources(self, positions: list[SourcePosition]) -> None:
        self._open_enrich()
        if self.live:
            from sealstream._runtime.live import open_live

            merger = open_live(self, positions)
            self.merger = merger  # type: ignore[assignment]
            self.names = merger.names  # grows as partitions appear
            self.rejected += merger.rejected_plans
            return
        if isinstance(self.p.source, Sources):  # several sources, tagged (docs/joins.md)
            from sealstream.windows.join import open_readers

            readers = open_readers(self.p, self.partitions, [p.resume for p in positions])
        else:
            readers = [
                sources.open_partition(self.p.source.kind, name, path, self.plan, pos.resume)
                for (name, path), pos in zip(self.partitions, positions, strict=True)
            ]
        batch = self.p.batch_size
        if self.p.checkpoint and self.p.checkpoint.every_events:
            # a step of full batches reaches every_events (rounding down took two steps)
            per_partition = -(-self.p.checkpoint.every_events // max(1, len(self.partitions)))
            batch = max(1, min(batch, per_partition))
        self._batch_cap = batch
        self.merger = PartitionMerger(readers, positions, self.plan, batch)

    def _committed_ids(self, newer_than: int | None) -> dict[str, pl.DataFrame]:
        """Identities of committed output newer than epoch ``newer_than`` (all if None)."""
        out: dict[str, pl.DataFrame] = {}
        for role, sink in self.sinks.items():
            files = [f for f in sink.committed() if newer_than is None or f.epoch > newer_than]
            if files:
                ids = sink.read_ids(files)
                if ids.height:
                    out[role] = ids
        return out

    def _max_committed_epoch(self) -> int:
        return max(
            (f.epoch for s in self.sinks.values() for f in s.committed()), default=0
        )

    # ================================================================ no checkpoints
    def _run_unchecked(self) -> None:
        # sources first: a partition that cannot be read stops the run before any
        # output is touched
        self.positions = self._fresh_start()
        self._start_sources(self.positions)
        for sink in self.sinks.values():
            sink.recover({})
        self.suppress = self._committed_ids(None)
        self.epoch = self._max_committed_epoch() + 1
        self._loop(checkpoint=None)
        self.output.drain()
        tokens = {role: s.prepare(self.epoch) for role, s in self.sinks.items()}
        for role, s in self.sinks.items():
            s.commit(self.epoch, tokens[role])

    # ================================================================ checkpoints
    def _run_checked(self, store: CheckpointStore) -> None:
        resume = self._recover(store)
        if resume is None:
            positions = self._fresh_start()
            self._start_sources(positions)  # before any output is touched
            for sink in self.sinks.values():
                sink.recover({})
            self.suppress = self._committed_ids(None)
            self.epoch = self._max_committed_epoch() + 1
            self.parent = None
            self.receipts_total = {
                "results": 0, "late": 0, "errors": 0, "digest": ""
            }
            self.emission_log = []
            self._log_segments = []
            self._log_committed(None)
        else:
            cid, doc = resume
            positions = self._restore(store, cid, doc)
        self.next_id = store.max_id_ever() + 1
        self.positions = positions
        try:
            self._loop(checkpoint=store)
            self._await_checkpoint(store)  # the last one is published before the run ends
        except SealstreamError as exc:
            # processing failed while a checkpoint was being written: when that write
            # failed too, report it - it is the earlier failure (a synchronous run would
            # have stopped there, before processing the next epoch)
            job, self._inflight = self._inflight, None
            if job is not None:
                try:
                    job.future.result()
                except SealstreamError as first:
                    raise first from None
            _raise_if_lock_lost(store, exc)
            raise
        finally:
            self._drain_checkpoint()

    def _this_run(self) -> Counters:
        """What this run did: the totals less where it started, and less the output
        it found already committed (counted in the totals, not written again)."""
        c = self.counters.minus(self.run_base)
        c.results_written -= self.not_repeated["results"]
        c.late_events -= self.not_repeated["late"]
        c.bad_records -= self.not_repeated["errors"]
        return c

    def resume_point(self) -> int | None:
        """The checkpoint a run started now would resume from, as far as the job's
        store tells (the newest with a published manifest: a checkpoint being written
        when the job stopped may have been published after its last report), else
        the newest this job finished or resumed from; None: the beginning."""
        if self.p.checkpoint is not None:
            try:
                store = self.p.checkpoint.open_store(self.p.name)
                try:
                    return max((c for c in store.ids() if store.has_manifest(c)),
                               default=None)
                finally:
                    store.close()
            except (SealstreamError, OSError) as exc:
                # said in the stop line: the number below is only what this run knows
                self.resume_point_unlisted = str(exc) or type(exc).__name__
        ids = [i for i in (self.ck_stats.last_id, self.resumed_from) if i is not None]
        return max(ids) if ids else None

    def _fresh_start(self) -> list[SourcePosition]:
        """Operator, watermark and positions when there is no checkpoint to resume."""
        if self.start is None:
            self.operator = WindowOperator(self.p)
            return [SourcePosition.start() for _ in self.partitions]
        self.operator = WindowOperator(self.p, self.start.state)
        if self.start.names is not None:  # a live source's partitions, by name
            self.names = list(self.start.names)
        if self.start.watermark is not None:
            self.wm = WatermarkState.from_json(self.start.watermark)
        return list(self.start.positions)

    def _recover(self, store: CheckpointStore) -> tuple[int, dict[str, Any]] | None:
        store.clear_trash()
        ids = store.ids()
        if not ids:
            return None
        if self.start_over:
            for cid in ids:
                store.move_aside(cid, "start-over")
                self.rejected.append({"id": cid, "verdict": "MOVED_ASIDE", "reason": "START_OVER",
                                      "message": "--start-over"})
            return None
        cfg = self.p.checkpoint
        max_age_s = cfg.max_age_s if cfg is not None else None
        policy = guard.Policy(
            key=self.key, pipeline=self.p.name, fingerprint=self.fingerprint,
            max_age_ms=None if max_age_s is None else round(max_age_s * 1000),
            now_ms=None if max_age_s is None else int(time.time() * 1000),
            require_receipt_roots=cfg is not None and cfg.require_receipts,
        )
        verdicts: list[guard.Verdict] = []
        for cid in reversed(ids):
            v = self._judge(store, cid, policy)
            verdicts.append(v)
            if v.resumable:  # ATOMIC, or only rebuildable components damaged
                assert v.manifest is not None
                self.rebuilt = list(v.rebuild)
                for bad in verdicts[:-1]:
                    store.move_aside(bad.checkpoint_id, bad.reason)
                    self.rejected.append(bad.to_json())
                self.resumed_from = cid
                return cid, dict(v.manifest)
            if v.reason in DEFINITION_REASONS and v.manifest is not None:
                # never fall back past a checkpoint of another definition: the state
                # (and output committed after older checkpoints) belongs to that one
                raise definition_mismatch(
                    store.location, cid, v.manifest.get("definition"), self.p
                )
        if all(v.reason == "NO_MANIFEST" for v in verdicts):
            # only directories of writers that crashed before publishing their first
            # manifest: no checkpoint was written, and none of their output was committed
            for v in verdicts:
                store.move_aside(v.checkpoint_id, v.reason)
                self.rejected.append(v.to_json())
            return None
        found = "; ".join(f"{v.checkpoint_id}: {v.verdict} ({v.reason})" for v in verdicts[:5])
        raise NoValidCheckpointError(
            f"{store.location}: {len(ids)} checkpoint(s) found but none is ATOMIC_CHECKPOINT "
            f"[{found}]; nothing was deleted. Inspect with 'sealstream checkpoints verify "
            f"{store.location}', or run again with --start-over to move them aside and start fresh"
        )

    def _restore(
        self, store: CheckpointStore, cid: int, doc: dict[str, Any]
    ) -> list[SourcePosition]:
        try:
            state, meta = incremental.load_chain(doc["files"], store.read)
        except ValueError as exc:  # the guard verified these bytes a moment ago
            raise CheckpointError(
                f"checkpoint {cid} in {store.location} changed while it was restored: {exc}"
            ) from None
        self.operator = WindowOperator(self.p, state)
        self._touched.clear()
        if self._incremental:
            self._last_state = self.operator.snapshot()
        self._remember_chain(cid, doc["files"])
        self.wm = WatermarkState.from_json(meta[WATERMARK_META.decode()])
        if self.wm.current() >= POS_INF:  # saved after a flush by an older version
            self.wm.end_of_input(self._reach_ms())
        by_name = {p["partition"]: SourcePosition.from_json(p) for p in doc["positions"]}
        if self.live:  # partitions keep the indexes of the run that saved them
            self.names = [p["partition"] for p in doc["positions"]]
            self._plan_mark = doc.get("plan")
        positions = [by_name.get(n, SourcePosition.start()) for n in self.names]
        # a partition that changed since the checkpoint stops the run here, before
        # any output is touched (its prepared output stays prepared for a later run)
        self._enrich_bound = doc.get(ENRICH_FIELD, {}) if self.p.enrich else None
        self._start_sources(positions)
        c = doc.get("counters", {})
        for k in Counters().to_json():
            setattr(self.counters, k, int(c.get(k, 0)))
        self.run_base = self.counters.minus(Counters())
        receipts = load_json(store.read(doc["files"]["receipts"]["path"]), "receipts")
        self.receipts_total = dict(receipts["summary"])
        # verified by the guard: its shared segments, then the tail
        log, self._log_segments = store.read_log(receipts)
        self.emission_log = list(log)
        # sinks: finish what the checkpoint prepared, drop unreferenced staging
        restored_epoch = int(doc["epoch"])
        for role, sink in self.sinks.items():
            entry = doc["sinks"].get(role)
            prepared = {int(entry["epoch"]): list(entry["tokens"])} if entry else {}
            sink.recover_at(entry.get("path") if entry else None, prepared)
        self.suppress = self._committed_ids(restored_epoch)
        self._log_committed(restored_epoch)
        if "suppress" in self.rebuilt:  # rebuilt: every committed output is suppressed
            self.suppress = self._committed_ids(None)
        elif "suppress" in doc["files"]:
            pending, _ = decode_table(store.read(doc["files"]["suppress"]["path"]))
            self._add_pending(pending)
        self.epoch = max(restored_epoch, self._max_committed_epoch()) + 1
        self.parent = cid
        return positions

    def _add_pending(self, pending: pl.DataFrame) -> None:
        for role in ROLES:
            part = pending.filter(pl.col("__role") == role).drop("__role")
            if not part.height:
                continue
            cols = (
                ["key", "__kint", "window_start", "window_end"]
                if role == "results"
                else ["_partition", "_offset"]
            )
            part = part.select(cols).drop_nulls()
            prev = self.suppress.get(role)
            self.suppress[role] = part if prev is None else pl.concat([prev, part]).unique()

    # ================================================================ the loop
    def _loop(self, checkpoint: CheckpointStore | None) -> None:
        assert self.merger is not None and self.operator is not None
        if self.live:
            self.wm.open_ended = True
        cfg = self.p.checkpoint
        since_events = 0
        last_ck = time.monotonic()
        dirty = False
        step_started = time.monotonic()
        while True:
            batch = self.merger.next_batch()
            if batch is None:
                break
            n = self._apply(batch)
            since_events += n + batch.bad.height
            dirty = (dirty or n > 0 or batch.bad.height > 0 or batch.step is not None
                     or self._positions_moved(batch))
            self.positions = batch.positions
            if self.crash.targets:
                self.output.drain()
            self.crash("batch")
            if (checkpoint is not None and self._inflight is not None
                    and self._inflight.future.done()):
                self._await_checkpoint(checkpoint)  # published: commit its epoch's output
            if self.progress is not None:
                self.progress(self)
            if cfg is not None and cfg.every_ms is not None:
                self._pace(time.monotonic() - step_started, cfg.every_ms)
            step_started = time.monotonic()
            if checkpoint is None or cfg is None:
                if batch.finished:
                    break
                continue
            timed = (cfg.every_ms is not None
                     and (time.monotonic() - last_ck) * 1000 >= cfg.every_ms)
            due = batch.finished or timed or (
                cfg.every_events is not None and since_events >= cfg.every_events)
            # a live run checkpoints on its interval while no input arrives too (as
            # Flink does): the checkpoint's time and the group's offsets stay fresh
            if due and (dirty or (self.live and timed and not batch.finished)):
                # every_ms counts from the start of the previous checkpoint, as Flink's
                # interval does: the time a checkpoint takes does not stretch the cycle
                # (at least one step always runs between two checkpoints)
                began = time.monotonic()
                self._checkpoint(checkpoint)
                since_events, last_ck, dirty = 0, began, False
                if (
                    not batch.finished
                    and self.stop_when is not None
                    and self.stop_when(self)
                ):
                    self.stopped_early = True
                    break
            if batch.finished:
                break
            if self.stop_requested is not None:  # a live run told to stop: open windows
                if checkpoint is not None and cfg is not None and dirty:  # stay open
                    self._checkpoint(checkpoint)
                self.stopped_early = True
                break
        self.output.drain()

    def _pace(self, took_s: float, every_ms: int) -> None:
        """Keep steps shorter than the checkpoint interval: checkpoints (and progress)
        happen between steps, so a step that outlasts ``every_ms`` halves the batch
        size, and one under a quarter of it doubles it back, up to the configured
        size. Results do not depend on the batch size."""
        assert self.merger is not None
        size = self.merger.batch_size
        if took_s * 1000 > every_ms and size > MIN_PACED_BATCH:
            self.merger.batch_size = max(MIN_PACED_BATCH, size // 2)
        elif took_s * 1000 < every_ms / 4 and size < self._batch_cap:
            self.merger.batch_size = min(self._batch_cap, size * 2)

    def _positions_moved(self, batch: Batch) -> bool:
        if len(self.positions) != len(batch.positions):
            return True
        return [p.next_offset for p in self.positions] != [
            p.next_offset for p in batch.positions
        ]

    def _apply(self, batch: Batch) -> int:
        assert self.operator is not None
        self._handle_bad(batch.bad)
        # the sequence of an event (ties in first/last): a live run's partitions grow
        n_parts = LIVE_SEQ_PARTITIONS if self.live else len(self.partitions)
        for q, lo in enumerate(batch.last_offsets):
            if lo is not None:
                self.wm.last_offset[q] = lo
            elif batch.empty_and_done[q]:
                self.wm.exhausted[q] = True  # nothing (left) to read: W_q = +inf
        events = batch.events
        # ---- [[enrich]] (docs/enrich.md): the tables' rows as of each event's time,
        # before the transform, which reads their columns like the source's
        if self.enricher is not None:
            events = self.enricher.apply(events, self.names)
        # ---- transforms (docs/transforms.md): derived fields, key and time first, on
        # every parsed record; the filter waits until the watermark has seen them all
        if self.transform is not None:
            enriched = events
            events, failed = self.transform.apply(events)
            if self.enricher is not None:
                failed = self.enricher.not_dropped(failed, enriched)
            if failed.height:
                self._handle_bad(self._failed_records(failed, batch))
        if events.height:  # one numpy column (the lazy engine would rechunk the batch)
            seq = (events.get_column(OFFSET).to_numpy().astype(np.int64, copy=False) * n_parts
                   + events.get_column(PARTITION).to_numpy())
            events = events.drop(SEQ, strict=False).hstack([pl.Series(SEQ, seq, pl.Int64)])
        w_before = self.wm.global_ms
        events = assign_watermarks(
            events, self.wm, batch.end, self.operator.watermark_threshold(events)
        )
        if self.wm.closed_ms is not None:  # windows an earlier end-of-input flush closed
            events = events.with_columns(self.wm.judged(pl.col(WATERMARK)).alias(WATERMARK))
        read = events.height
        if self.transform is not None or isinstance(self.p.source, Sources):
            events = TransformStage.keep(events)  # several sources: each one's filter
        if self.enricher is not None:
            events = self.enricher.keep(events)
        if batch.finished:
            self.wm.exhausted = [True] * len(self.wm.exhausted)
            self.wm.global_ms = POS_INF
        w_end = self.wm.current()
        if self._incremental and events.height:
            self._touched.append(incremental.batch_keys(events))
        out = self.operator.process(events, w_end)
        if batch.finished:  # every window fired: keep the watermark the data reached
            self.wm.end_of_input(self._reach_ms(), w_before)
        if self._incremental and out.fired.height:
            # firing may rewrite a key's rows without an event of it (sliding windows'
            # fragments narrow as their windows fire): those keys changed too
            self._touched.append(incremental.batch_keys(out.fired))
        self.counters.events += read
        if self.unseen_fields and events.height:
            self._note_fields(events)
        if out.fired.height:
            fired, epoch = out.fired, self.epoch
            self.output.submit(lambda: self._emit_results(fired, epoch))
        if out.late.height:
            self.counters.late_events += out.late.height
            late = self._late_frame(out.late, batch)
            late = self._suppressed("late", late, ["_partition", "_offset"])
            if "late" in self.sinks and late.height:
                self.sinks["late"].write(self.epoch, late)
                self._receipt("late", late)
        if self.crash.targets:
            self.output.drain()  # an armed crash point sees the batch's output staged
        self.crash("after_stage")
        return read

    def _reach_ms(self) -> int:
        """How far past an event's time its windows can end, lateness included."""
        w = self.p.window
        return (w.gap_ms if isinstance(w, Session) else w.size_ms) + w.allowed_lateness_ms

    def _failed_records(self, failed: pl.DataFrame, batch: Batch) -> pl.DataFrame:
        """Records a transform failed on, as bad records (line and text looked up)."""
        parts = failed.get_column(PARTITION).to_numpy().astype(np.int32, copy=False)
        offs = failed.get_column("_offset").to_numpy().astype(np.int64, copy=False)
        delta = 2 if self.p.source.kind == "csv" else 1  # CSV: the header is line 1
        return failed.select(
            pl.col(PARTITION).alias("_p"),
            pl.col("_offset"),
            (pl.col("_offset") + delta).alias("_line"),
            pl.col("_reason"),
            batch.raw_texts(parts, offs).alias("_raw"),
        )

    def _note_fields(self, events: pl.DataFrame) -> None:
        """Forget the aggregated fields that some event of ``events`` carries (a
        non-null value in any of the field's typed columns); one column test each."""
        have = set(events.columns)
        checks = {}
        for f in self.unseen_fields:
            cols = [c for c in (int_col(f), float_col(f), json_col(f), dec_col(f)) if c in have]
            if cols:
                checks[f] = pl.any_horizontal([pl.col(c).is_not_null() for c in cols]).any()
        if not checks:
            return
        seen = events.select(**checks).row(0, named=True)
        self.unseen_fields = [f for f in self.unseen_fields if not seen.get(f, False)]

    def _emit_results(self, fired: pl.DataFrame, epoch: int) -> None:
        """Fired windows -> result rows, staged in ``epoch`` (on the output stage)."""
        assert self.operator is not None
        results = self.operator.finalize(fired)
        self.counters.windows_fired += results.height
        # the job's total counts a result found already committed (by the run that
        # crashed) once, like late events and bad records; this run's figure leaves
        # it out (``not_repeated``)
        self.counters.results_written += results.height
        results = self._suppressed("results", results, ["key", "__kint", "window_start",
                                                         "window_end"])
        if results.height:
            self.sinks["results"].write(epoch, results)
            self._receipt("results", results)

    def _suppressed(self, role: str, frame: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
        sup = self.suppress.get(role)
        if sup is None or not sup.height or not frame.height:
            return frame
        sup = sup.select(cols)
        hit = frame.join(sup, on=cols, how="semi", nulls_equal=True)
        if not hit.height:
            return frame
        with self._suppressed_lock:  # results are counted on the output stage
            self.counters.suppressed += hit.height
            self.not_repeated[role] += hit.height
        self.suppress[role] = sup.join(hit.select(cols), on=cols, how="anti", nulls_equal=True)
        return frame.join(sup, on=cols, how="anti", nulls_equal=True)

    def _late_frame(self, late: pl.DataFrame, batch: Batch) -> pl.DataFrame:
        late = late.with_columns(
            batch.raw_texts(
                late[PARTITION].to_numpy().astype(np.int32, copy=False),
                late[OFFSET].to_numpy().astype(np.int64, copy=False),
            ).alias(RAW)
        )
        names = pl.Series("__pname", [json.dumps(n) for n in self.names], dtype=pl.String)
        pname = pl.lit(names).gather(pl.col(PARTITION))
        raw = pl.col(RAW).str.strip_chars()
        body = raw.str.strip_suffix("}").str.strip_chars_end()
        sep = pl.when(body.str.ends_with("{")).then(pl.lit("")).otherwise(pl.lit(","))
        line = pl.concat_str(
            [body, sep, pl.lit('"_partition":'), pname, pl.lit(',"_offset":'),
             pl.col(OFFSET).cast(pl.String), pl.lit("}")]
        )
        return late.select(
            pl.lit(pl.Series(self.names, dtype=pl.String)).gather(pl.col(PARTITION)).alias(
                "_partition"
            ),
            pl.col(OFFSET).alias("_offset"),
            line.alias(JSON_LINE),
        )

    def _handle_bad(self, bad: pl.DataFrame) -> None:
        if not bad.height:
            return
        if "errors" not in self.sinks:
            first = bad.row(0, named=True)
            name = self.names[first["_p"]]
            by_offset = self.p.source.kind == "kafka" or (
                isinstance(self.p.source, Sources) and self.p.source.is_topic_partition(name))
            where = f"offset {first['_offset']}" if by_offset else f"line {first['_line']}"
            raise BadRecordError(
                f"{name}: {where}: {first['_reason']} "
                "(add an [errors] output to divert bad records instead of stopping)"
            )
        self.counters.bad_records += bad.height
        frame = bad.select(
            pl.lit(pl.Series(self.names, dtype=pl.String)).gather(pl.col("_p")).alias("_partition"),
            pl.col("_offset"),
            pl.col("_line"),
            pl.col("_reason"),
            pl.col("_raw"),
        )
        frame = frame.with_columns(
            pl.struct(["_partition", "_offset", "_line", "_reason", "_raw"])
            .struct.json_encode()
            .alias(JSON_LINE)
        )
        frame = self._suppressed("errors", frame, ["_partition", "_offset"])
        if frame.height:
            self.sinks["errors"].write(self.epoch, frame)
            self._receipt("errors", frame)
