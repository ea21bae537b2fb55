"""Writing checkpoints: receipts, capture at a consistent point, the writer
thread, publishing, committing the epoch's output, retention.

:class:`Checkpointing` is mixed into :class:`sealstream._runtime.engine.Job`:
the job owns the state (operator, watermark, positions, sinks, epoch) and the
loop; this module owns steps 2-6 of the commit protocol described there.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import polars as pl

from sealstream._runtime.crash import CrashPoints
from sealstream._runtime.merge import SourcePosition
from sealstream._runtime.output import OutputStage
from sealstream._runtime.summary import CheckpointStats, Counters
from sealstream.checkpoint import emission_log, guard, log_segments, proofs
from sealstream.checkpoint import receipts as trees
from sealstream.checkpoint.manifest import (
    DELTA_NAME,
    FORMAT_VERSION,
    RECEIPT_IDS_NAME,
    RECEIPTS_NAME,
    STATE_NAME,
    SUPPRESS_NAME,
    seal,
)
from sealstream.checkpoint.stores import CheckpointStore, checkpoint_dirname
from sealstream.pipeline import Pipeline
from sealstream.sinks._base import Sink
from sealstream.sinks._kinds import is_database_sink
from sealstream.state import incremental
from sealstream.state.codec import WATERMARK_META, encode_table, sha256_hex
from sealstream.watermark import WatermarkState
from sealstream.windows.operator import WindowOperator

ROLES = ("results", "late", "errors")

_RECEIPT_POOL: ThreadPoolExecutor | None = None
_RECEIPT_POOL_LOCK = threading.Lock()


def _receipt_pool() -> ThreadPoolExecutor:
    """The thread that builds epochs' result receipts beside the checkpoint writer
    (polars and the hashing release the GIL while they work)."""
    global _RECEIPT_POOL
    with _RECEIPT_POOL_LOCK:
        if _RECEIPT_POOL is None:
            _RECEIPT_POOL = ThreadPoolExecutor(1, thread_name_prefix="sealstream-receipts")
        return _RECEIPT_POOL
#: set (to anything) to keep every step plan of live runs instead of pruning them
#: with their checkpoints: for audits, and to re-run a recorded plan from its start
KEEP_PLANS_ENV = "SEALSTREAM_KEEP_PLANS"


@dataclass
class _InFlight:
    """A checkpoint captured at a consistent point, being written."""

    cid: int
    epoch: int
    tokens: dict[str, list[str]]
    started: float
    blocked_s: float  # processing-thread time spent capturing it
    future: Future[tuple[dict[str, Any], int]]
    #: a live run: the checkpoint's positions, for the source's consumer group
    positions: dict[str, int] | None = None


class Checkpointing:
    """The checkpoint half of a job (see the module docstring)."""

    # owned by the job
    p: Pipeline
    store: CheckpointStore | None
    key: bytes | None
    fingerprint: str
    names: list[str]
    crash: CrashPoints
    output: OutputStage
    sinks: dict[str, Sink]
    operator: WindowOperator | None
    wm: WatermarkState
    positions: list[SourcePosition]
    merger: Any
    counters: Counters
    ck_stats: CheckpointStats
    stop_when: Callable[[Any], bool] | None
    suppress: dict[str, pl.DataFrame]
    epoch: int
    parent: int | None
    next_id: int
    receipts_total: dict[str, Any]
    #: the emission log's leaves, ``[epoch, count, root]`` (checkpoint.emission_log)
    emission_log: list[list[Any]]
    #: the hashes of the log's full segments already in the store (a prefix of
    #: ``emission_log``, cut by checkpoint.log_segments)
    _log_segments: list[tuple[str, int]]
    # owned here
    _receipts_now: dict[str, dict[str, Any]]
    _incremental: bool
    _touched: list[pl.DataFrame]
    _last_state: pl.DataFrame | None
    _chain: dict[str, dict[str, Any]] | None
    _writer: ThreadPoolExecutor | None
    _inflight: _InFlight | None
    _verified: set[int]
    _receipt_ids: pl.Series | None = None  # the last closed epoch's sorted result ids

    def manifest_extra(self) -> dict[str, Any]:
        """More entries for the manifest (signed with it): a distributed job's workers."""
        return {}

    @staticmethod
    def _judge(store: CheckpointStore, cid: int, policy: guard.Policy) -> guard.Verdict:
        return guard.judge_resumable(store.evidence(cid, policy.key),
                                     store.verified_parent(cid, policy.key), policy)

    # ================================================================ receipts
    def _receipt(self, role: str, frame: pl.DataFrame) -> None:
        """Remember the identities of output staged in this epoch (for its checkpoint's
        receipts; a run without checkpoints keeps none). Only the identity columns
        are kept here; their text is built when the checkpoint closes the epoch."""
        if self.store is None:
            return
        rec = self._receipts_now.setdefault(role, {"count": 0, "ids": []})
        rec["count"] += frame.height
        if role == "results":
            cols = ["key", "__kint", "window_start", "window_end"]
            end = int(frame.select(pl.col("window_end").max()).item())
            prev = rec.get("max_window_end")
            rec["max_window_end"] = end if prev is None else max(prev, end)
            # each result's id text and leaf hash now (results are staged on the output
            # thread, beside processing): closing the epoch then only sorts and builds
            # the tree's upper levels
            leaves = frame.select(self._ids("results")).with_columns(
                trees.leaf_hashes(pl.col("id")).alias("h"))
            rec.setdefault("leaves", []).append(leaves)
        else:
            cols = ["_partition", "_offset"]
        rec["ids"].append(frame.select(cols))

    @staticmethod
    def _ids(role: str) -> pl.Expr:
        """The text of an output's identity, as the receipts' digest hashes it."""
        if role == "results":
            return pl.concat_str(
                [pl.col("key"), pl.col("__kint").cast(pl.String), pl.col("window_start")
                 .cast(pl.String), pl.col("window_end").cast(pl.String)], separator="|"
            ).alias("id")
        return pl.concat_str(
            [pl.col("_partition"), pl.col("_offset").cast(pl.String)], separator="|"
        ).alias("id")

    def _close_receipts(self, tokens: dict[str, list[str]]) -> Callable[[], dict[str, Any]]:
        """Close the epoch's receipts (the next epoch collects its own from now on).
        Returns the digesting, for the writer thread: it builds and sorts the
        identity texts, which costs a few tenths of a second for a million results,
        and chains the running summary (checkpoints are written one at a time, in
        order, and the processing thread reads the summary only after the
        checkpoint in flight is finished)."""
        epoch, now = self.epoch, self._receipts_now
        self._receipts_now = {}
        rec = now.get("results")
        if rec is not None and rec["ids"] and "builder" not in rec and not rec.get("on_workers"):
            # the results' sorted ids, digest and Merkle root (pure, the bulk of the
            # receipts' work) start now on their own thread: the writer thread makes
            # the epoch's output durable (fsyncs) meanwhile and picks them up in
            # _results_digest; the final checkpoint of a bounded run waits for less
            ids = list(rec["ids"])
            leaves = list(rec.get("leaves", []))
            rec["prebuilt"] = _receipt_pool().submit(self._build_results, ids, leaves)
        return lambda: self._digest_receipts(epoch, now, tokens)

    def _digest_receipts(
        self, epoch: int, now: dict[str, dict[str, Any]], tokens: dict[str, list[str]]
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"epoch": epoch}
        self._receipt_ids = None
        for role in ROLES:
            rec = now.get(role)
            if rec is None:
                entry[role] = {"count": 0, "digest": hashlib.sha256(b"").hexdigest(),
                               "tokens": tokens.get(role, [])}
                if role == "results":
                    entry[role]["root"] = trees.EMPTY_ROOT
                continue
            if role == "results":  # the Merkle root the manifest signs (receipts.py)
                digest, root = self._results_digest(rec)
                entry[role] = {"count": rec["count"], "digest": digest,
                               "tokens": tokens.get(role, []), "root": root}
            else:
                entry[role] = {"count": rec["count"], "digest": self._role_digest(role, rec),
                               "tokens": tokens.get(role, [])}
            if "max_window_end" in rec:
                entry[role]["max_window_end"] = rec["max_window_end"]
            self.receipts_total[role] = int(self.receipts_total.get(role, 0)) + rec["count"]
        self.receipts_total["digest"] = hashlib.sha256(
            (str(self.receipts_total.get("digest", "")) + json.dumps(entry, sort_keys=True))
            .encode()
        ).hexdigest()
        self.receipts_total["last_epoch"] = epoch
        return entry

    def _role_digest(self, role: str, rec: dict[str, Any]) -> str:
        """The digest of an epoch's ids of ``role`` (late events or bad records;
        ``rec`` as :meth:`_receipt` gathered it). A distributed job takes the one its
        workers built instead."""
        sorted_ids = pl.concat(rec["ids"]).select(self._ids(role)).sort("id")["id"]
        return trees.joined_digest(sorted_ids)

    def _results_digest(self, rec: dict[str, Any]) -> tuple[str, str]:
        """The digest and Merkle root of an epoch's result ids (``rec`` as
        :meth:`_receipt` gathered it); keeps the sorted ids, the leaves the checkpoint
        writes. A distributed job builds them on a worker instead."""
        pre: Future[tuple[pl.Series, str, str]] | None = rec.get("prebuilt")
        sorted_ids, digest, root = (pre.result() if pre is not None
                                    else self._build_results(rec["ids"],
                                                             rec.get("leaves", [])))
        self._receipt_ids = sorted_ids
        return digest, root

    @classmethod
    def _build_results(cls, ids: list[pl.DataFrame], leaves: list[pl.DataFrame]
                       ) -> tuple[pl.Series, str, str]:
        """The sorted result ids of an epoch (identity frames as :meth:`_receipt`
        gathered them, with their id texts and leaf hashes ``leaves`` when it built
        them for every frame), their digest and their Merkle root: pure, any thread."""
        if leaves and len(leaves) == len(ids):
            both = pl.concat(leaves).sort("id")
            sorted_ids = both["id"]
            return (sorted_ids, trees.joined_digest(sorted_ids),
                    trees.root_of_leaves(both["h"]))
        sorted_ids = pl.concat(ids).select(cls._ids("results")).sort("id")["id"]
        return sorted_ids, trees.joined_digest(sorted_ids), trees.root(sorted_ids)

    def _log_committed(self, newer_than: int | None) -> None:
        """Append to the emission log the epochs (newer than ``newer_than``) whose
        results are committed in the output but whose checkpoints were rejected or moved
        aside (a fall-back, ``--start-over``): their results are suppressed, never emitted
        again, so the log records them as committed, each epoch's root rebuilt from its
        committed output. Every committed result keeps a proof."""
        sink = self.sinks.get("results")
        if sink is None or self.store is None:
            return
        logged = {int(e[0]) for e in self.emission_log}
        by_epoch: dict[int, dict[str, Any]] = {}
        for f in sink.committed():  # a file may be listed at the path it was staged at too
            if (newer_than is None or f.epoch > newer_than) and f.epoch not in logged:
                by_epoch.setdefault(int(f.epoch), {}).setdefault(f.token, f)
        for epoch in sorted(by_epoch):
            ids = proofs.result_ids(sink.read_ids(list(by_epoch[epoch].values())))
            if ids.len():
                self.emission_log.append([epoch, ids.len(), trees.root(ids)])

    # ================================================================ checkpoint
    def _checkpoint(self, store: CheckpointStore) -> None:
        """Take a checkpoint at this consistent point (between two batches).

        What the checkpoint records is captured here, on the processing thread: sink
        tokens (staged output fsynced), the window state (an immutable frame),
        watermark, positions, receipts and counters; then the next epoch starts.
        Encoding the state, writing the files and publishing the manifest happen on a
        writer thread while processing continues (``asynchronous = true``, the
        default); sinks commit the epoch only after the manifest is published
        (:meth:`_await_checkpoint`). At most one checkpoint is in flight.
        """
        self.output.drain()  # the epoch's output is staged in full before its tokens
        self._await_checkpoint(store)
        assert self.operator is not None
        t0 = time.monotonic()
        epoch = self.epoch
        # the epoch's output takes no more rows; making it durable (fsyncs) may wait
        # for the writer thread, which does it before anything refers to the tokens
        tokens: dict[str, list[str]] = {}
        durable: list[Callable[[], None]] = []
        for role, sink in self.sinks.items():
            tokens[role], done = sink.prepare_deferred(epoch)
            durable.append(done)
        cid = self.next_id
        # deep copies: processing goes on mutating the watermark and positions while
        # the writer thread encodes what was true at this point
        wm_json = copy.deepcopy(self.wm.to_json())
        snap = self.operator.snapshot()
        chain = self._next_chain()
        touched = None
        if chain is not None:
            touched = (pl.concat(self._touched) if self._touched
                       else snap.select(incremental.KEYS).clear())
        last_state = self._last_state
        close_receipts = self._close_receipts(tokens)
        pending = self._pending_suppression()
        body: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "id": cid,
            "parent": self.parent,
            "pipeline": self.p.name,
            "fingerprint": self.fingerprint,
            "definition": self.p.fingerprint_fields(),
            # the definition's aggregates are a JSON object (sorted when sealed): the
            # results' column order, for exports of the open windows
            "aggregate_order": [a.name for a in self.p.parsed_aggregates],
            "created_ms": int(time.time() * 1000),
            "epoch": epoch,
            "lateness_ms": self.p.window.allowed_lateness_ms,
            "watermark": wm_json,
            "positions": [
                {"partition": n, **pos.to_json()}
                for n, pos in zip(self.names, self.positions, strict=True)
            ],
            "files": {},
            "state": {"open_windows": self.operator.open_windows,
                      "incremental": chain is not None},
            "receipts": {},  # the writer thread digests them
            "sinks": self._sink_entries(epoch, tokens),
            "counters": self.counters.to_json(),
            **self.manifest_extra(),
        }
        mark = self._plan_mark_now()
        if mark is not None:  # a live run: the last recorded step this checkpoint includes
            body["plan"] = mark
        where = self._source_address()
        if where is not None:  # a broker: where `checkpoints inspect` asks for lag
            body["source"] = where
        body = copy.deepcopy(body)
        body["watermark"] = wm_json
        # a sink in the store's database commits in the transaction that publishes
        together = [s.in_publish(epoch, tokens[role]) for role, s in self.sinks.items()
                    if is_database_sink(s) and s.transactional and tokens[role]]
        # the consistent point is behind us: the next epoch starts now
        self._touched.clear()
        if self._incremental:
            self._last_state = snap
        self.parent = cid
        self.next_id = cid + 1
        self.epoch += 1

        def write() -> tuple[dict[str, Any], int]:
            for done in durable:
                done()
            self.crash("after_sink_prepare")
            receipt = close_receipts()
            # the emission log: the receipt root of every epoch that committed results,
            # carried forward (emission_log); an epoch without results has nothing to
            # prove, and quiet live checkpoints would otherwise fill the log
            res = receipt["results"]
            if int(res["count"]):
                self.emission_log.append([int(receipt["epoch"]), int(res["count"]),
                                          res["root"]])
            # its leaves: full segments shared between checkpoints (each written once,
            # before the manifest naming it), then the tail (log_segments)
            names, new, tail = log_segments.split(self.emission_log, self._log_segments)
            for sha, data in new:
                store.write_shared(log_segments.segment_name(sha), data)
            self._log_segments = names
            receipts_doc = json.dumps(
                {"summary": self.receipts_total, "epochs": [receipt],
                 log_segments.SEGMENTS_KEY: [sha for sha, _ in names],
                 emission_log.LEAVES_KEY: tail},
                sort_keys=True, indent=1
            ).encode()
            body["receipts"] = dict(self.receipts_total)
            # the epoch's Merkle root over its result ids, signed with the manifest
            body[trees.ROOTS_FIELD] = trees.roots_entry(receipt)
            body[emission_log.LOG_FIELD] = emission_log.head(self.emission_log)
            return self._write_checkpoint(store, cid, snap, wm_json, chain, touched,
                                          last_state, receipts_doc, pending, body, together)

        cfg = self.p.checkpoint
        if cfg is not None and cfg.asynchronous:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="sealstream-ckpt")
            future = self._writer.submit(write)
        else:
            future = Future()
            try:
                future.set_result(write())
            except BaseException as exc:  # noqa: BLE001 - re-raised by _await_checkpoint
                future.set_exception(exc)
        group_positions = ({n: p.next_offset for n, p in zip(self.names, self.positions,
                                                             strict=True)}
                           if getattr(self, "live", False) else None)
        self._inflight = _InFlight(cid, epoch, tokens, t0, time.monotonic() - t0, future,
                                   group_positions)
        if cfg is None or not cfg.asynchronous or self.stop_when is not None:
            self._await_checkpoint(store)

    def _sink_entries(self, epoch: int, tokens: dict[str, list[str]]) -> dict[str, Any]:
        """The manifest's ``sinks``: per output, the epoch's commit tokens and where they
        are staged (``path``, when the sink has a location), so that a restart after the
        output's path changed commits them there (:meth:`Sink.recover_at`)."""
        out: dict[str, Any] = {}
        for role, t in tokens.items():
            entry: dict[str, Any] = {"epoch": epoch, "tokens": t}
            where = self.sinks[role].location()
            if where is not None:
                entry["path"] = where
            out[role] = entry
        return out

    def _write_checkpoint(
        self, store: CheckpointStore, cid: int, snap: pl.DataFrame, wm_json: Any,
        chain: dict[str, dict[str, Any]] | None, touched: pl.DataFrame | None,
        last_state: pl.DataFrame | None, receipts: bytes, pending: bytes | None,
        body: dict[str, Any], together: list[Callable[[Any], None]],
    ) -> tuple[dict[str, Any], int]:
        """Encode, write and publish checkpoint ``cid`` (on the writer thread): the
        manifest is published only after its files are durable."""
        meta = {WATERMARK_META.decode(): wm_json}
        snap = incremental.key_ordered(snap)
        if chain is not None:
            assert last_state is not None and touched is not None
            keys = incremental.changed_keys(last_state, snap, touched)
            state, state_name = incremental.encode_delta(snap, keys, meta), DELTA_NAME
        else:
            state, state_name = encode_table(snap, meta), STATE_NAME
        files: dict[str, bytes] = {state_name: state, RECEIPTS_NAME: receipts}
        if pending is not None:
            files[SUPPRESS_NAME] = pending
        if self._receipt_ids is not None:  # the leaves, for inclusion proofs
            files[RECEIPT_IDS_NAME] = trees.encode_ids(self._receipt_ids)
            self._receipt_ids = None
        dirname = checkpoint_dirname(cid)
        entries: dict[str, Any] = {}
        for role, name in (("state", state_name), ("receipts", RECEIPTS_NAME),
                           ("suppress", SUPPRESS_NAME), ("receipt_ids", RECEIPT_IDS_NAME)):
            if name in files:
                entries[role] = {"path": f"{dirname}/{name}", "sha256": sha256_hex(files[name]),
                                 "bytes": len(files[name])}
        body["state"]["sha256"] = entries["state"]["sha256"]
        if chain is not None:
            entries.update(chain)  # the base snapshot and the deltas since: verified too
        body["files"] = entries
        manifest = seal(body, self.key)
        if together:
            def in_publish(conn: Any) -> None:
                for commit in together:
                    commit(conn)
            store.write_checkpoint(cid, files, manifest, crash=self.crash,
                                   in_publish=in_publish)
        else:
            store.write_checkpoint(cid, files, manifest, crash=self.crash)
        self.crash("after_manifest_publish")
        return entries, sum(len(b) for b in files.values()) + len(manifest)

    def _await_checkpoint(self, store: CheckpointStore) -> None:
        """Finish the checkpoint in flight: wait until it is published, then commit the
        sinks' output of its epoch and apply retention (on the processing thread)."""
        job = self._inflight
        if job is None:
            return
        self._inflight = None
        waited = time.monotonic()
        entries, size = job.future.result()
        blocked = job.blocked_s + (time.monotonic() - waited)
        self._remember_chain(job.cid, entries)
        self.output.drain()  # no sink method runs beside a write
        store.check_lock()  # a run that lost its lock commits no more output
        for role, sink in self.sinks.items():
            sink.commit(job.epoch, job.tokens[role])
            self.crash(f"after_commit_{role}")
        self._retain(store, job.cid)
        self.crash("after_retention")
        commit_group = getattr(getattr(self.merger, "source", None), "commit_group", None)
        if job.positions and callable(commit_group):
            commit_group(job.positions)  # best effort, for lag tools; never read back
        dt = (time.monotonic() - job.started) * 1000
        st = self.ck_stats
        st.count += 1
        st.total_ms += dt
        st.blocked_ms += blocked * 1000
        st.total_bytes += size
        st.last_id, st.last_at, st.last_ms, st.last_bytes = job.cid, time.monotonic(), dt, size
        st.recent.append((job.cid, dt, size))

    def _drain_checkpoint(self) -> None:
        """After a failure: let the writer finish (its files are durable and harmless;
        recovery commits or discards its epoch), never leave it writing unlocked."""
        job, self._inflight = self._inflight, None
        if job is not None:
            with contextlib.suppress(BaseException):
                job.future.result()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def _next_chain(self) -> dict[str, dict[str, Any]] | None:
        """The files the next checkpoint's delta builds on, or None when it must be a
        full snapshot (not incremental, nothing to build on, or ``full_every`` reached)."""
        cfg = self.p.checkpoint
        if not self._incremental or cfg is None or self._chain is None:
            return None
        if self._last_state is None or len(self._chain) >= cfg.full_every:
            return None
        return dict(self._chain)

    def _remember_chain(self, cid: int, files: dict[str, Any]) -> None:
        """After checkpoint ``cid`` is published or restored: the files a delta builds
        on next (its base snapshot and the deltas since)."""
        if not self._incremental:
            return
        if incremental.part_roles(files):  # a state in parts (a distributed run's):
            self._chain = None  # the next checkpoint is a full snapshot
            return
        base, deltas = incremental.chain_roles(files)
        if base is None:  # a full snapshot: the new base
            self._chain = {incremental.BASE_ROLE: dict(files["state"])}
        else:
            chain = {r: dict(files[r]) for r in (base, *deltas)}
            chain[f"{incremental.DELTA_ROLE}{cid:012d}"] = dict(files["state"])
            self._chain = chain

    def _pending_suppression(self) -> bytes | None:
        frames = []
        for role, sup in self.suppress.items():
            if sup.height:
                frames.append(sup.with_columns(pl.lit(role).alias("__role")))
        if not frames:
            return None
        return encode_table(pl.concat(frames, how="diagonal_relaxed"))

    def _plan_mark_now(self) -> dict[str, Any] | None:
        """A live run's ``plan`` entry for a checkpoint taken now (None: not live)."""
        mark = getattr(self.merger, "plan_mark", None)
        return dict(mark()) if callable(mark) else None

    def _source_address(self) -> dict[str, Any] | None:
        """``{"kind": "kafka", "bootstrap": ..., "topic": ...}`` for a Kafka source
        (never client settings: they may hold credentials); None otherwise."""
        settings = getattr(getattr(self.merger, "source", None), "settings", None)
        bootstrap = getattr(settings, "bootstrap", None)
        topic = getattr(settings, "topic", None)
        if isinstance(bootstrap, str) and isinstance(topic, str):
            return {"kind": "kafka", "bootstrap": bootstrap, "topic": topic}
        return None

    @staticmethod
    def _prune_plans(store: CheckpointStore) -> None:
        """Step plans go with the checkpoints they belong to: the records of steps at
        or before the oldest checkpoint kept are no longer needed by any recovery."""
        if os.environ.get(KEEP_PLANS_ENV):  # audits and tests: keep the whole plan
            return
        steps = store.plan_steps()
        if not steps:
            return
        ids = store.ids()
        if not ids:
            return
        oldest = store.read_manifest(ids[0])
        mark = oldest.get("plan") if oldest else None
        if not isinstance(mark, dict) or not isinstance(mark.get("step"), int):
            return
        store.delete_plans([s for s in steps if s <= mark["step"]])

    @staticmethod
    def _needed_by(store: CheckpointStore, kept: list[int]) -> set[int]:
        """The checkpoints holding files that the ``kept`` checkpoints reference."""
        needed: set[int] = set()
        for cid in kept:
            for rel in store.files_of(cid):
                head = rel.split("/", 1)[0]
                if head.startswith("cp-") and head[3:].isdigit():
                    needed.add(int(head[3:]))
        return needed

    def _retain(self, store: CheckpointStore, newest: int) -> None:
        """Verify the newest checkpoint, then delete verified ones beyond ``keep``.

        With incremental checkpoints, a kept checkpoint's base snapshot and deltas are
        kept too, and so is one restore point that does not depend on the newest
        checkpoint's base (with its own chain): damage to that base then still leaves a
        checkpoint to fall back to."""
        assert self.p.checkpoint is not None
        policy = guard.Policy(key=self.key, pipeline=self.p.name, fingerprint=self.fingerprint)
        if not self._judge(store, newest, policy).ok:
            return
        keep = self.p.checkpoint.keep
        verified = [newest]
        self._verified.add(newest)
        needed = self._needed_by(store, [newest])
        base = min(needed | {newest})
        fallback_found = base == newest and keep > 1
        for cid in reversed(store.ids()):
            if cid >= newest:
                continue
            ok = cid in self._verified or self._judge(store, cid, policy).ok
            if ok:
                self._verified.add(cid)
            if ok and not fallback_found and cid < base:
                fallback_found = True  # the restore point that survives a damaged base
                verified.append(cid)
                needed |= self._needed_by(store, [cid])
                continue
            if len(verified) < keep:
                if ok:
                    verified.append(cid)
                    needed |= self._needed_by(store, [cid])
                continue
            if cid in needed:
                continue  # holds the base snapshot or a delta a kept checkpoint builds on
            if ok:
                store.delete(cid)
                self._verified.discard(cid)
            else:
                store.move_aside(cid, "superseded-invalid")
        self._prune_plans(store)
        prune_archive = getattr(self.merger, "prune_archive", None)  # [archive] segments
        if callable(prune_archive) and not os.environ.get(KEEP_PLANS_ENV):
            prune_archive(store)
