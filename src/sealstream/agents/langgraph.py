"""A LangGraph checkpoint saver on sealstream's signed, verified agent store.

Install with ``pip install 'sealstream[langgraph]'``; this module imports
``langgraph`` only when it is imported itself (``import sealstream.agents`` does
not need the extra).

What it adds to LangGraph's contract:

* **Every row is authenticated** against its thread, namespace and checkpoint id:
  checkpoint manifests, channel blobs (hashed by the manifest), pending writes and
  the per-checkpoint writes index are sealed rows (:mod:`sealstream.agents._seal`);
  a row altered, truncated, deleted or moved is refused with the guard's verdict
  (:class:`~sealstream.agents.checkpoint.AgentCheckpointError`). Reads fail closed.
* **A fixed commit order.** A checkpoint, its channel blobs, its (empty) writes
  index and the history head commit in one transaction. A task's pending writes
  commit in one transaction *together with the signed writes index of the
  checkpoint they belong to*, and only once that checkpoint is committed (a write
  that arrives first waits for it, up to ``writes_wait_s``): no write ever exists
  without its checkpoint, no index without its writes, and a crash leaves either
  all of a task's writes or none.
* **No pickle, fail-closed encryption.** The serializer is LangGraph's
  ``JsonPlusSerializer`` without pickle fallback and with msgpack limited to its
  safe types; typed ``(type, bytes)`` pairs are stored as-is and authenticated. A
  serializer with pickle fallback is refused. With ``SEALSTREAM_ENCRYPTION_KEY``
  every row, metadata included, is an AES-256-GCM envelope and plaintext rows are
  refused.

Capabilities: ``put``, ``put_writes``, ``get_tuple``, ``list``, ``delete_thread``,
``delete_for_runs``, ``copy_thread`` and ``prune`` (sync and async). Deleting and
pruning leave the effect ledger alone: it records what happened in the world.

Channel blobs are content-addressed (channel, version, SHA-256 prefix): a
checkpoint always reads back exactly the values it was given.

Example::

    from langgraph.graph import StateGraph
    from sealstream.agents.langgraph import SealstreamSaver

    saver = SealstreamSaver("agents.db")          # or "postgresql://..."
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "order-17"}})
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import concurrent.futures
import dataclasses
import functools
import hashlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from sealstream.agents import judge as _judge
from sealstream.agents._seal import FROM_ENV, seal_plain, wrap
from sealstream.agents.checkpoint import (
    KIND_LANGGRAPH,
    AgentCheckpointError,
    AgentCheckpointStore,
    Loaded,
    canonical_json,
    now_ms,
    other_kind,
    write_name,
    writes_prefix,
)
from sealstream.agents.judge import AgentVerdict
from sealstream.agents.store import RowStore, RowTx
from sealstream.errors import CheckpointError, SpecError

__all__ = ["SealstreamSaver"]

_T = TypeVar("_T")
_log = logging.getLogger("sealstream.agents")


class _WaitForCheckpoint(Exception):
    pass


def _safe_serde() -> JsonPlusSerializer:
    try:
        return JsonPlusSerializer(pickle_fallback=False, allowed_msgpack_modules=None)
    except TypeError:  # a langgraph-checkpoint without msgpack allow-lists
        raise SpecError(
            "SealstreamSaver needs a langgraph-checkpoint whose JsonPlusSerializer takes "
            "allowed_msgpack_modules (upgrade: pip install -U 'sealstream[langgraph]')"
        ) from None


_blocked = threading.local()


def _on_serde_event(event: Any) -> None:
    """Collects, for the thread reading, the types LangGraph's serializer refused to
    rebuild (it would otherwise hand back a plain dict in their place)."""
    found = getattr(_blocked, "types", None)
    if found is not None and str(event.get("kind", "")).endswith("blocked"):
        found.append(f"{event.get('module')}.{event.get('name')}")


register_serde_event_listener(_on_serde_event)

_PLAIN = (str, int, float, bool, type(None), bytes)


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON-like (checked two levels deep): no custom type in it."""
    if isinstance(value, _PLAIN):
        return True
    if type(value) in (list, tuple):
        return all(isinstance(v, _PLAIN) or (type(v) in (list, dict) and not v)
                   for v in value)
    if type(value) is dict:
        return all(isinstance(v, _PLAIN) or (type(v) in (list, dict) and not v)
                   for v in value.values())
    return False


def _typed(pair: tuple[str, bytes]) -> list[str]:
    return [pair[0], base64.b64encode(pair[1]).decode("ascii")]


def _blob_name(channel: str, version: Any, blob: bytes) -> str:
    """Content-addressed: two values under one version never collide."""
    return canonical_json([channel, str(version), hashlib.sha256(blob).hexdigest()[:32]])


class SealstreamSaver(BaseCheckpointSaver[Any]):
    """LangGraph checkpoints in a sealstream agent store (SQLite path or URL, a
    :class:`~sealstream.agents.store.RowStore`, or an
    :class:`~sealstream.agents.checkpoint.AgentCheckpointStore` to share)."""

    def __init__(self, store: AgentCheckpointStore | RowStore | str | Path, *,
                 serde: SerializerProtocol | None = None, key: bytes | None | object = FROM_ENV,
                 encryption_key: bytes | None | object = FROM_ENV,
                 writes_wait_s: float = 10.0, fallback: str = "refuse",
                 allowed_types: Sequence[type] = ()) -> None:
        if getattr(serde, "pickle_fallback", False):
            raise SpecError("SealstreamSaver refuses a serializer with pickle fallback: "
                            "loading a checkpoint must never execute code")
        if isinstance(allowed_types, type | str) or not all(
                isinstance(t, type) for t in allowed_types):
            raise SpecError("allowed_types: expected a list of classes (dataclasses, "
                            f"pydantic models), got {allowed_types!r}")
        chosen = serde or _safe_serde()
        if allowed_types:
            if not isinstance(chosen, JsonPlusSerializer):
                raise SpecError("allowed_types needs LangGraph's JsonPlusSerializer; "
                                "configure your own serializer's allow-list instead")
            chosen = chosen.with_msgpack_allowlist(list(allowed_types))
        super().__init__(serde=chosen)
        self.store = store if isinstance(store, AgentCheckpointStore) else AgentCheckpointStore(
            store, key=key, encryption_key=encryption_key, fallback=fallback)
        self.writes_wait_s = writes_wait_s
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._workers_lock = threading.Lock()
        # checkpoints committed by this saver (recent ones) and async writers waiting
        # for one: a pending write waits for its checkpoint's save without asking the
        # database again and again (it still asks now and then: another process may
        # be the one that saves it)
        self._committed: dict[tuple[str, str, str], None] = {}
        self._waiting: dict[tuple[str, str, str], list[asyncio.Future[None]]] = {}
        # checkpoints this saver's async ``aput`` is saving right now, and their
        # histories (a count per (thread, ns, id) and per (thread, ns))
        self._inflight: dict[tuple[str, ...], int] = {}
        # when this saver last committed a checkpoint of a thread: a write keeps
        # waiting while its thread's earlier checkpoints are still being saved
        self._progress: dict[tuple[str, str], float] = {}

    def close(self) -> None:
        with self._workers_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
        self.store.close()

    # ------------------------------------------------------------ helpers
    def _dumps(self, value: Any) -> tuple[str, bytes]:
        typed = self.serde.dumps_typed(value)
        if not _plain(value):  # a custom type must come back as itself after a restart
            self._checked_loads(typed, "refusing to store")
        return typed

    def _checked_loads(self, typed: tuple[str, bytes], doing: str) -> Any:
        _blocked.types = []
        try:
            value = self.serde.loads_typed(typed)
            found = list(_blocked.types)
        finally:
            _blocked.types = None
        if found:
            raise CheckpointError(
                f"{doing} a value of type {', '.join(sorted(set(found)))}: it is not an "
                "allowed type and would come back as a plain dict; register it: "
                "SealstreamSaver(..., allowed_types=[...]) (no pickle)")
        return value

    def _loads(self, typed: Sequence[str]) -> Any:
        kind, data = str(typed[0]), base64.b64decode(typed[1])
        if kind == "pickle":
            raise CheckpointError("a stored value is a pickle; refused (no code execution)")
        return self._checked_loads((kind, data), "cannot read back")

    def _blob_value(self, data: bytes) -> tuple[bool, Any]:
        kind, _, raw = data.partition(b"\n")
        if kind == b"empty":
            return False, None
        if kind == b"pickle":
            raise CheckpointError("a stored value is a pickle; refused (no code execution)")
        return True, self._checked_loads((kind.decode(), raw), "cannot read back")

    def _tuple(self, loaded: Loaded) -> CheckpointTuple:
        doc = loaded.manifest
        if doc.get("kind") != KIND_LANGGRAPH:
            raise AgentCheckpointError(other_kind(doc, KIND_LANGGRAPH))
        body = doc["body"]
        checkpoint: Checkpoint = self._loads(body["checkpoint"])
        values = {}
        for channel, name in body["channels"].items():
            if name not in loaded.blobs:
                raise CheckpointError(f"checkpoint {doc['id']!r}: channel {channel!r} names a "
                                      "blob its manifest does not list")
            present, value = self._blob_value(loaded.blobs[name])
            if present:
                values[channel] = value
        checkpoint["channel_values"] = values
        thread, ns, cid = doc["execution"], doc["ns"], doc["id"]
        writes = [(w["task_id"], w["channel"], self._loads(w["value"])) for w in loaded.writes]
        parent = None
        if doc["parent"]:
            parent = {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                       "checkpoint_id": doc["parent"]}}
        metadata = self._loads(body["metadata"])
        if loaded.fell_back_past:
            metadata = {**metadata, "sealstream_fell_back_past": [
                v.to_json() for v in loaded.fell_back_past]}
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                     "checkpoint_id": cid}},
            checkpoint=checkpoint, metadata=metadata,
            parent_config=parent,  # type: ignore[arg-type]
            pending_writes=writes,
        )

    def _latest(self, tx: RowTx, thread: str, ns: str) -> Loaded | None:
        """The thread's head checkpoint (constant-time in its history's length); when
        it is gone or does not verify, the saver's ``fallback`` policy decides."""
        guess = self.store.head_hint(thread, ns)
        ahead: Loaded | AgentVerdict | None = None
        if guess is not None:  # the marker and the guessed head's rows: one statement
            rows, marker = self.store._load_group(tx, thread, ns, [guess], meta=True)
            cid, problem = self.store.head(tx, thread, ns, rows_checked=False,
                                           stored_meta=marker)
            ahead = rows[guess]
        else:
            cid, problem = self.store.head(tx, thread, ns, rows_checked=False)
        if cid is None and problem is None:
            return None
        if cid is not None:
            got = ahead if cid == guess else self.store._load_many(
                tx, [(cid, thread, ns)])[(cid, thread, ns)]
            if isinstance(got, Loaded):
                return got
            problem = got if got is not None else self.store.head_gone(thread, ns, cid)
        assert problem is not None
        if self.store.fallback == "refuse":
            raise AgentCheckpointError(replace(problem, message=(
                f"{problem.message}; refusing to fall back silently (repair with "
                "`sealstream agents repair`, or SealstreamSaver(..., fallback='verified'))")))
        skipped = [problem]
        for name, _, _ in tx.keys("cp", thread, ns):
            if name == cid:
                continue
            verdict = _judge.judge(self.store._evidence(tx, thread, ns, name),
                                   self.store.keys.sign)
            if verdict.ok:
                _log.warning("thread %r/%r: falling back to checkpoint %r past %s", thread,
                             ns, name, "; ".join(f"{v.checkpoint_id}: {v.verdict} "
                                                 f"({v.reason})" for v in skipped))
                loaded = self.store._load(tx, thread, ns, name)
                assert loaded is not None
                return _replace_loaded(loaded, fell_back_past=tuple(skipped))
            skipped.append(verdict)
        raise AgentCheckpointError(skipped[0])

    # ------------------------------------------------------------ sync API
    def _reading(self, work: Callable[[RowTx], _T], failed: Callable[[_T], bool]) -> _T:
        """``work`` in a read-only unit of work; where that has no snapshot across
        statements (PostgreSQL) and something did not verify (``failed``), read again
        in a transaction before reporting it: a checkpoint pruned between two
        statements is never reported as damaged."""
        rows = self.store.rows
        try:
            with rows.reading() as tx:
                result = work(tx)
        except AgentCheckpointError:
            if not rows.reads_without_snapshot:
                raise
        else:
            if not rows.reads_without_snapshot or not failed(result):
                return result
        with rows.transaction() as tx:
            return work(tx)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        cid = get_checkpoint_id(config)

        def work(tx: RowTx) -> Loaded | AgentVerdict | None:
            if cid is None:
                return self._latest(tx, thread, ns)
            return self.store._load_many(tx, [(cid, thread, ns)])[(cid, thread, ns)]

        loaded = self._reading(work, lambda got: isinstance(got, AgentVerdict))
        if isinstance(loaded, AgentVerdict):
            raise AgentCheckpointError(loaded)
        return None if loaded is None else self._tuple(loaded)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first. A checkpoint that does not verify is skipped and
        reported (log warning ``sealstream.agents``; :meth:`problems`), never fatal:
        one damaged checkpoint or thread never hides the others. ``limit`` without a
        ``filter`` reads only ``limit`` checkpoints. Checkpoints are read in batches
        (a few round trips per batch, not per checkpoint)."""
        conf = (config or {}).get("configurable", {})
        thread = conf.get("thread_id")
        ns = conf.get("checkpoint_ns")
        only = conf.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        th = None if thread is None else str(thread)
        cns = None if ns is None else str(ns)

        def work(tx: RowTx) -> tuple[builtins.list[CheckpointTuple],
                                     builtins.list[tuple[tuple[str, str, str], AgentVerdict]]]:
            out: builtins.list[CheckpointTuple] = []
            skipped: builtins.list[tuple[tuple[str, str, str], AgentVerdict]] = []
            # with a limit, read that many keys first; only when some of them are
            # skipped (damaged, filtered out) read all keys (names only, no data)
            keys = tx.keys("cp", th, cns, before=before_id,
                           limit=None if (limit is None or filter or only) else limit)
            if only is not None:
                keys = [k for k in keys if k[0] == str(only)]
            done = 0
            while True:
                pending = keys[done:]
                while pending:
                    want = len(pending) if limit is None else max(limit - len(out), 1)
                    batch, pending = pending[:max(want, 16)], pending[max(want, 16):]
                    got = self.store._load_many(tx, batch)
                    for key in batch:
                        if limit is not None and len(out) >= limit:
                            break
                        loaded = got[key]
                        if loaded is None:
                            continue
                        if isinstance(loaded, AgentVerdict):
                            skipped.append((key, loaded))
                            continue
                        tup = self._tuple(loaded)
                        if filter and any(tup.metadata.get(k) != v
                                          for k, v in filter.items()):
                            continue
                        out.append(tup)
                    if limit is not None and len(out) >= limit:
                        break
                if limit is None or len(out) >= limit or len(keys) < limit or done:
                    break
                done = len(keys)
                keys = tx.keys("cp", th, cns, before=before_id)
            return out, skipped

        out, skipped = self._reading(work, lambda got: bool(got[1]))
        for (cid, ex, c_ns), verdict in skipped:
            _log.warning("list: skipping checkpoint %r of %r/%r: %s", cid, ex, c_ns,
                         AgentCheckpointError(verdict))
        yield from out

    def problems(self, thread_id: str, checkpoint_ns: str = "") -> builtins.list[AgentVerdict]:
        """Every verdict of the thread's history that is not ``ATOMIC_CHECKPOINT``
        (damaged or missing checkpoints, a missing or damaged head marker)."""
        return [v for v in self.store.history(str(thread_id), checkpoint_ns) if not v.ok]

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        conf = config["configurable"]
        thread, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        parent = conf.get("checkpoint_id")
        skeleton = dict(checkpoint)
        values: dict[str, Any] = dict(checkpoint.get("channel_values") or {})
        skeleton.pop("channel_values", None)
        versions: Mapping[str, Any] = checkpoint.get("channel_versions", {})
        channels: dict[str, str] = {}
        blobs: dict[str, bytes] = {}
        missing: list[str] = []
        for channel, version in versions.items():
            if channel in values:
                kind, data = self._dumps(values[channel])
                blob = kind.encode() + b"\n" + data
            elif channel in new_versions:
                blob = b"empty\n"
            else:
                missing.append(channel)  # unchanged and not given: the parent's blob
                continue
            name = _blob_name(channel, version, blob)
            channels[channel], blobs[name] = name, blob
        with self.store.rows.transaction() as tx:
            tx.lock_history(thread, ns)
            # one round trip: the head marker, the head (as this store last saw it),
            # the parent with its rows when some of its blobs are reused, and whether
            # the blobs about to be written exist already
            guess = self.store.head_hint(thread, ns)
            reusing = bool(missing and parent)
            manifests = [str(parent)] if reusing else []
            if guess and guess not in manifests:
                manifests.append(guess)
            hinted = self.store.blob_hint(thread, ns, str(parent)) if reusing else []
            tx.prefetch(thread, ns, manifests, [*blobs, *hinted])
            self.store.check_kind(tx, thread, ns,
                                  self.store._meta(tx, thread, ns).get("head") or "",
                                  KIND_LANGGRAPH)
            reuse: list[str] = []
            if reusing:
                reuse = self._reused(tx, thread, ns, str(parent), missing, versions, channels)
            body = {
                "checkpoint": _typed(self._dumps(skeleton)),
                "metadata": _typed(self._dumps(
                    get_serializable_checkpoint_metadata(config, metadata))),
                "channels": channels,
            }
            self.store._commit(tx, thread, ns, str(checkpoint["id"]), kind=KIND_LANGGRAPH,
                               parent=str(parent) if parent else None, body=body, blobs=blobs,
                               reuse=reuse, writes=True, created_ms=now_ms(), overwrite=True)
        self._saved((thread, ns, str(checkpoint["id"])))
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def _reused(self, tx: RowTx, thread: str, ns: str, parent: str, missing: Sequence[str],
                versions: Mapping[str, Any], channels: dict[str, str]) -> builtins.list[str]:
        """The parent's blobs of the unchanged channels ``missing`` (set in
        ``channels``). The parent's manifest must verify and each reused blob must
        match the hash it records, before a new signed manifest names them: a
        tampered value is never laundered into a new checkpoint (raises
        :class:`AgentCheckpointError` with the verdict). The parent's other rows
        (its other blobs, its pending writes) are not this checkpoint's concern."""
        addr = ("cp", thread, ns, parent)
        raw = tx.get(*addr)
        if raw is None:  # a parent LangGraph never saved here: nothing to reuse
            return []
        bad, pdoc = self.store.judged_row(self.store._opened(addr, raw), missing="NO_MANIFEST")
        if bad is not None or pdoc is None:
            assert bad is not None
            raise AgentCheckpointError(bad)
        if pdoc.get("kind") != KIND_LANGGRAPH:
            raise AgentCheckpointError(other_kind(pdoc, KIND_LANGGRAPH))
        try:
            pchannels: dict[str, str] = dict(pdoc["body"]["channels"])
            listed: dict[str, Any] = dict(pdoc["blobs"])
            pversions = self._loads(pdoc["body"]["checkpoint"]).get("channel_versions", {})
        except (KeyError, TypeError, ValueError, IndexError):
            raise AgentCheckpointError(AgentVerdict(
                thread, ns, parent, _judge.INCONSISTENT, "MANIFEST_MALFORMED",
                f"checkpoint {parent!r} of {thread!r}/{ns!r}: its manifest is signed but "
                "malformed")) from None
        reuse = []
        for channel in missing:
            if channel not in pchannels or pversions.get(channel) != versions[channel]:
                continue
            name = str(pchannels[channel])
            row = self.store._read(tx, ("blob", thread, ns, name))
            entry = listed.get(name)
            want: dict[str, Any] = entry if isinstance(entry, dict) else {}
            if row.problem is None and row.data is not None and (
                    hashlib.sha256(row.data).hexdigest() != want.get("sha256")):
                raise AgentCheckpointError(AgentVerdict(
                    thread, ns, parent, _judge.INCONSISTENT, "HASH_MISMATCH",
                    f"checkpoint {parent!r} of {thread!r}/{ns!r}: channel blob {name!r}, "
                    "which the new checkpoint reuses, differs from its recorded SHA-256"))
            channels[channel] = name
            reuse.append(name)  # missing or unreadable: refused by _commit
        return reuse

    def _saved(self, key: tuple[str, str, str]) -> None:
        with self._workers_lock:
            self._committed[key] = None
            self._progress[key[:2]] = time.monotonic()
            if len(self._progress) > 4096:
                del self._progress[next(iter(self._progress))]
            if len(self._committed) > 4096:
                del self._committed[next(iter(self._committed))]
            waiters = self._waiting.pop(key, [])
        for fut in waiters:
            fut.get_loop().call_soon_threadsafe(_resolve, fut)

    def _write_rows(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                    task_id: str, task_path: str
                    ) -> tuple[str, str, str, builtins.list[tuple[str, bool, dict[str, Any]]]]:
        conf = config["configurable"]
        thread, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        cid = str(conf["checkpoint_id"])
        rows = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            rows.append((write_name(cid, task_id, idx), channel in WRITES_IDX_MAP,
                         {"checkpoint": cid, "task_id": task_id, "task_path": task_path,
                          "idx": idx, "channel": channel, "value": _typed(self._dumps(value))}))
        return thread, ns, cid, rows

    def _try_put_writes(self, thread: str, ns: str, cid: str,
                        rows: Sequence[tuple[str, bool, dict[str, Any]]]) -> bool:
        """One attempt: True when committed, False when the checkpoint is not yet."""
        try:
            with self.store.rows.transaction() as tx:
                self._put_writes(tx, thread, ns, cid, rows)
            return True
        except _WaitForCheckpoint:
            return False

    def _overdue(self, thread: str, ns: str, start: float) -> bool:
        """Whether a write has waited ``writes_wait_s`` since it began or since this
        saver last committed a checkpoint of its thread, whichever is later. Never
        while this saver is still saving checkpoints of the thread: on a busy machine
        a save can wait in the queue longer than ``writes_wait_s``, and the checkpoint
        the write belongs to is then coming, not lost."""
        with self._workers_lock:
            if (thread, ns) in self._inflight:
                return False
            last = max(start, self._progress.get((thread, ns), start))
        return time.monotonic() > last + self.writes_wait_s

    def _not_committed(self, thread: str, ns: str, cid: str) -> CheckpointError:
        return CheckpointError(
            f"pending writes for checkpoint {cid!r} of {thread!r}/{ns!r}: that checkpoint "
            f"was not committed within {self.writes_wait_s} s; writes are never stored "
            "without their checkpoint")

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        thread, ns, cid, rows = self._write_rows(config, writes, task_id, task_path)
        start = time.monotonic()
        pause = 0.001
        while not self._try_put_writes(thread, ns, cid, rows):
            if self._overdue(thread, ns, start):
                raise self._not_committed(thread, ns, cid)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _put_writes(self, tx: RowTx, thread: str, ns: str, cid: str,
                    rows: Sequence[tuple[str, bool, dict[str, Any]]]) -> None:
        keys = self.store.keys
        iaddr = ("wi", thread, ns, cid)
        tx.lock_history(thread, ns)  # every writer of the index holds it
        # one round trip: the writes index and the writes already stored
        _, raw, stored = tx.checkpoints_rows(thread, ns, [cid], [writes_prefix(cid)])[cid]
        if raw is None:
            raise _WaitForCheckpoint
        present = {r.name for r in stored}
        row = self.store._opened(iaddr, raw)
        bad, index = self.store.judged_row(row, missing="NO_WRITES_INDEX")
        if bad is not None or index is None:
            assert bad is not None
            raise AgentCheckpointError(bad)
        listed = dict(index["writes"])
        plains = {name: seal_plain(keys, ("w", thread, ns, name), doc)
                  for name, _, doc in rows}
        for name, overwrite, _ in rows:
            if overwrite:
                addr = ("w", thread, ns, name)
                tx.upsert(*addr, wrap(keys, addr, plains[name]))
                listed[name] = _judge_digest(plains[name])
        # the others create-if-absent, in one statement: a retried task keeps the first
        # (which exist is known: read above, under the history's lock)
        fresh = {name: wrap(keys, ("w", thread, ns, name), plains[name])
                 for name, overwrite, _ in rows if not overwrite and name not in present}
        tx.add_many("w", thread, ns, fresh)
        for name in fresh:
            listed[name] = _judge_digest(plains[name])
        self.store.crash("inside_writes_commit")
        tx.upsert(*iaddr, self.store.seal_row(iaddr, {"checkpoint": cid, "writes": listed}))

    def delete_thread(self, thread_id: str) -> None:
        self.store.delete_execution(str(thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r} (keep_latest or delete)")
        for thread in thread_ids:
            if strategy == "delete":
                self.store.delete_execution(str(thread))
                continue
            for ns in self.store.namespaces(str(thread)):
                self.store.prune(str(thread), ns, keep_last=1)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint whose metadata ``run_id`` is listed, with its
        writes, in one transaction; the history records them as dropped (signed)."""
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        with self.store.rows.transaction() as tx:
            doomed: dict[tuple[str, str], list[str]] = {}
            for row in tx.scan("cp", None):
                try:
                    loaded = self.store._load(tx, row.execution, row.ns, row.name)
                except AgentCheckpointError as err:  # its run id cannot be trusted
                    _log.warning("delete_for_runs: checkpoint %r of %r/%r left alone: %s",
                                 row.name, row.execution, row.ns, err)
                    continue
                assert loaded is not None
                metadata = self._loads(loaded.manifest["body"]["metadata"])
                if str(metadata.get("run_id")) in wanted:
                    doomed.setdefault((row.execution, row.ns), []).append(row.name)
            for (thread, ns), ids in sorted(doomed.items()):  # locks taken in one order
                self.store._drop(tx, thread, ns, ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (all namespaces) and its writes to another thread in
        one transaction, re-sealed for their new address. The source must verify."""
        src, dst = str(source_thread_id), str(target_thread_id)
        with self.store.rows.transaction() as tx:
            rows = tx.scan("cp", src)
            for ns in sorted({row.ns for row in rows}):  # the target's histories, first
                tx.lock_history(dst, ns)
            for row in rows:
                try:
                    loaded = self.store._load(tx, src, row.ns, row.name)
                except AgentCheckpointError as err:  # never re-signed into the copy
                    _log.warning("copy_thread: checkpoint %r of %r/%r not copied: %s",
                                 row.name, src, row.ns, err)
                    continue
                assert loaded is not None
                doc = loaded.manifest
                names = [n for n in doc["blobs"]]
                self.store._commit(
                    tx, dst, row.ns, row.name, kind=doc["kind"], parent=doc["parent"],
                    body=doc["body"], blobs={n: loaded.blobs[n] for n in names}, reuse=(),
                    writes=bool(doc["writes"]), created_ms=int(doc["created_ms"]),
                    overwrite=True)
                writes = []
                for w in loaded.writes:
                    body = {k: v for k, v in w.items() if k not in ("row", "signature")}
                    writes.append((write_name(row.name, str(w["task_id"]), int(w["idx"])),
                                   True, body))
                if writes:
                    self._put_writes(tx, dst, row.ns, row.name, writes)

    # ------------------------------------------------------------ async API
    # Every async method runs its transactions on the saver's own workers (one for
    # SQLite, whose transactions are serialized anyway; the pool size for
    # PostgreSQL), never on the event loop's default executor, and nothing ever
    # waits on a worker: a pending write whose checkpoint is not committed yet gives
    # its worker back and waits in the event loop, so the save it waits for always
    # finds a worker (LangGraph's durability="async" saves in the background while
    # the next step's writes arrive).
    def _workers(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._workers_lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=max(1, self.store.rows.parallelism),
                    thread_name_prefix="sealstream-saver")
            return self._executor

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._workers(),
                                          functools.partial(fn, *args, **kwargs))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._call(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        items = await self._call(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        conf = config["configurable"]
        key = (str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")),
               str(checkpoint["id"]))
        with self._workers_lock:  # writes for it wait for this save, not the database
            for k in (key, key[:2]):
                self._inflight[k] = self._inflight.get(k, 0) + 1
        try:
            return await self._call(self.put, config, checkpoint, metadata, new_versions)
        finally:
            with self._workers_lock:
                for k in (key, key[:2]):
                    self._inflight[k] -= 1
                    if not self._inflight[k]:
                        del self._inflight[k]
                waiters = [] if key in self._inflight else self._waiting.pop(key, [])
            for fut in waiters:  # a failed save: they look in the database themselves
                _resolve(fut)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        thread, ns, cid, rows = self._write_rows(config, writes, task_id, task_path)
        key = (thread, ns, cid)
        start = time.monotonic()
        # A save by this saver wakes the write at once (its future). The database is
        # asked at once when this saver has not been saving the thread lately (the
        # checkpoint may be stored already: saved by another process, or before a
        # restart), then now and then; while this saver is saving the thread's
        # checkpoints (a run ahead of its saves) it is asked only once the write is
        # overdue: each look is a transaction on a worker the saves need.
        pause = 0.25
        looked = False
        while True:
            with self._workers_lock:
                fut: asyncio.Future[None] | None = None
                saving = key in self._inflight
                ours = (thread, ns) in self._inflight or (
                    self._progress.get((thread, ns), float("-inf"))
                    > time.monotonic() - self.writes_wait_s)
                if key not in self._committed and (ours or looked):
                    fut = asyncio.get_running_loop().create_future()
                    self._waiting.setdefault(key, []).append(fut)
            if fut is not None:  # wait in the event loop, holding no worker
                limit = max(0.0, start + self.writes_wait_s - time.monotonic()) + 0.01
                woken = True
                try:
                    await asyncio.wait_for(fut, timeout=limit if saving else pause)
                except TimeoutError:
                    woken = False
                finally:
                    with self._workers_lock:
                        waiters = self._waiting.get(key, [])
                        if fut in waiters:
                            waiters.remove(fut)
                            if not waiters:
                                del self._waiting[key]
                pause = min(pause * 2, 1.0)
                if not woken and ours and not self._overdue(thread, ns, start):
                    continue
            looked = True
            if await self._call(self._try_put_writes, thread, ns, cid, rows):
                return
            if self._overdue(thread, ns, start):
                raise self._not_committed(thread, ns, cid)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._call(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._call(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._call(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._call(self.prune, thread_ids, strategy=strategy)


def _replace_loaded(loaded: Loaded, *, fell_back_past: tuple[AgentVerdict, ...]) -> Loaded:
    return dataclasses.replace(loaded, fell_back_past=fell_back_past)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _judge_digest(plain: bytes) -> str:
    return hashlib.sha256(plain).hexdigest()
