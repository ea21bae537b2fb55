"""Agent rows in S3-compatible object storage (``s3://bucket/prefix``).

S3 has no transactions, so this store makes them (docs/object-storage.md, *Agent
checkpoints*). Layout under the prefix::

    LEASE                       the single writer's lease: holder, generation, expiry,
                                and ``seq``/``by``, the last committed transaction
    journal/<seq>-<run>         one transaction's writes, immutable (create-if-absent)
    rows/x<space>/x<execution>/x<namespace>/x<name>    one row (hex of UTF-8 after
                                each "x": bytewise order and prefixes survive, no "/")

One writer process per store: :meth:`S3RowStore.transaction` takes ``LEASE`` (a
compare-and-swap with ``If-Match``; taken when absent, released, expired, or held by
a process of this host that is gone) and keeps it until the store is closed. Another
process is refused with one line (:class:`~sealstream.errors.LockHeldError`); threads
and stores of one process share the lease and take turns.

A transaction's writes are kept in memory (reads inside it see them) and committed
as one step:

1. ``journal/<seq>-<run>`` is created (only if absent) with every write;
2. ``LEASE`` is replaced (``If-Match`` its ETag) with ``seq``/``by`` naming that
   journal: the commit point. A writer fenced meanwhile (its lease taken over after
   expiry) fails here with one line, and its journal is an orphan, never applied;
3. the writes are applied to the row objects (a created row only if absent: the same
   bytes there are a retry, other bytes an error; an index or marker replaced under
   the lease; deletions), then the journal is deleted.

A SIGKILL before step 2 leaves the transaction absent; after it, whole: whoever takes
the lease next applies the journal ``LEASE`` names (redo) before anything else, and
deletes orphan journals. Readers that do not hold the lease (:meth:`reading`) read
``LEASE``, lay the journal it names (if not yet applied) over the rows, and read
``LEASE`` again: a statement that saw it change is read again, so each statement sees
whole transactions. The correctness of a read never rests on a listing showing more
than S3's strong read-after-write gives (the journal is read by its name). Rows are
opaque sealed bytes; nothing read is trusted before the agent layer's seal checks.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sealstream._objects import (
    ObjectExistsError,
    Objects,
    ObjectStoreError,
    VersionConflictError,
    open_objects,
)
from sealstream._runtime.crash import CrashPoints
from sealstream.agents.store import Row, RowStore, RowTx, _fetched
from sealstream.checkpoint.stores.objects import lease_live as _live
from sealstream.checkpoint.stores.objects import lease_seconds
from sealstream.errors import CheckpointError, LockHeldError

__all__ = ["S3RowReader", "S3RowStore", "is_agent_prefix"]

LEASE = "LEASE"
JOURNAL = "journal/"
ROWS = "rows/"
_RUN = uuid.uuid4().hex  # this process's run id (one lease holder per process)
_T = TypeVar("_T")
Key = tuple[str, str, str, str]
#: a write: ("ins" create-if-absent, known absent | "add" create-if-absent, whatever
#: is there | "put" replace | "del", bytes or None)
Op = tuple[str, bytes | None]


def _part(text: str) -> str:
    return "x" + text.encode("utf-8", "surrogateescape").hex()


def row_key(key: Key) -> str:
    return ROWS + "/".join(_part(c) for c in key)


def _parse(obj: str) -> Key | None:
    parts = obj[len(ROWS):].split("/")
    if not obj.startswith(ROWS) or len(parts) != 4 or any(p[:1] != "x" for p in parts):
        return None
    try:
        s, e, n, m = (bytes.fromhex(p[1:]).decode("utf-8", "surrogateescape") for p in parts)
    except ValueError:
        return None
    return s, e, n, m


class _Lease:
    """The lease of one store location, shared by every S3RowStore of this process."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.doc: dict[str, Any] | None = None
        self.etag = ""
        self.renewed = 0.0
        self.users = 0
        self.dirty = False  # a committed journal may be unapplied: redo before reading
        self.probed = False
        self.executions: set[tuple[str, str]] = set()


_LEASES: dict[str, _Lease] = {}
_LEASES_LOCK = threading.Lock()


class _S3Tx(RowTx):
    """Reads of the store (``pending``: a committed, unapplied journal laid over the
    rows) under this transaction's own writes (``ops``)."""

    def __init__(self, store: S3RowStore, holder: bool) -> None:
        self._s = store
        self._holder = holder
        self.ops: dict[Key, Op] = {}
        self._pending: dict[Key, Op] = {}
        self.seen = {}

    def _read(self, fn: Callable[[], _T]) -> _T:
        if self._holder:
            return fn()
        for _ in range(50):
            etag, self._pending = self._s._committed_view()
            out = fn()
            if self._s._lease_etag() == etag:
                return out
        raise CheckpointError(f"agent store {self._s.location}: the writer keeps committing "
                              "while this read runs; try again")

    def _view(self, key: Key) -> Op | None:
        return self.ops.get(key) or self._pending.get(key)

    def _lookup_many(self, keys: Sequence[Key]) -> dict[Key, bytes]:
        out: dict[Key, bytes] = {}
        stored = []
        added: dict[Key, bytes] = {}
        for key in keys:
            op = self._view(key)
            if op is None or op[0] == "add":
                stored.append(key)
                if op is not None and op[1] is not None:
                    added[key] = op[1]  # unless a row is there already
            elif op[1] is not None:
                out[key] = op[1]
        found = self._s._get_rows(stored)
        return {**added, **found, **out}

    def _list(self, space: str, execution: str | None, ns: str | None,
              prefix: str | None) -> list[Key]:
        found = set(self._s._list_rows(space, execution, ns, prefix))
        for layer in (self._pending, self.ops):
            for key, (_, data) in layer.items():
                if key[0] == space and (execution is None or key[1] == execution) and (
                        ns is None or key[2] == ns) and key[3].startswith(prefix or ""):
                    if data is None:
                        found.discard(key)
                    else:
                        found.add(key)
        return sorted(found, key=lambda k: (k[1].encode(), k[2].encode(), k[3].encode()))

    # ------------------------------------------------------------ reads
    def get(self, space: str, execution: str, ns: str, name: str,
            *, lock: bool = False) -> bytes | None:
        key = (space, execution, ns, name)
        return self._read(lambda: self._lookup_many([key]).get(key))

    def get_many(self, space: str, execution: str, ns: str, names: Sequence[str]
                 ) -> dict[str, bytes]:
        keys = [(space, execution, ns, n) for n in names]
        return {k[3]: v for k, v in self._read(lambda: self._lookup_many(keys)).items()}

    def scan(self, space: str, execution: str | None, ns: str | None = None,
             prefix: str | None = None) -> list[Row]:
        def run() -> list[Row]:
            keys = self._list(space, execution, ns, prefix)
            data = self._lookup_many(keys)
            return [Row(*k, data[k]) for k in keys if k in data]
        return self._read(run)

    def keys(self, space: str, execution: str | None, ns: str | None = None, *,
             before: str | None = None, limit: int | None = None,
             newest_first: bool = True) -> list[tuple[str, str, str]]:
        found = self._read(lambda: self._list(space, execution, ns, None))
        out = sorted(((k[3], k[1], k[2]) for k in found if before is None or k[3] < before),
                     key=lambda t: (t[0].encode(), t[1].encode(), t[2].encode()),
                     reverse=newest_first)
        return out if limit is None else out[:limit]

    def fetch(self, execution: str, ns: str, cids: Sequence[str],
              writes_prefixes: Sequence[str], blobs: Sequence[str], meta: bool
              ) -> tuple[dict[str, tuple[bytes | None, bytes | None, list[Row]]],
                         dict[str, bytes], bytes | None]:
        def run() -> list[tuple[str, str, bytes]]:
            keys = [(s, execution, ns, c) for c in cids for s in ("cp", "wi")]
            keys += [("blob", execution, ns, b) for b in blobs]
            if meta:
                keys.append(("meta", execution, ns, "history"))
            for prefix in writes_prefixes:
                keys += self._list("w", execution, ns, prefix)
            return [(k[0], k[3], v) for k, v in self._lookup_many(keys).items()]
        return _fetched(self._read(run), execution, ns, cids, writes_prefixes)

    # ------------------------------------------------------------ writes
    def _write(self, key: Key, op: Op) -> None:
        if not self._holder:
            raise CheckpointError(f"agent store {self._s.location}: a write in a read-only "
                                  "unit of work (use transaction())")
        self.seen.pop(key, None)
        before = self.ops.get(key)
        if op[0] in ("ins", "add") and before is not None:
            if before[0] != "del":
                return  # there already (created or replaced in this transaction)
            op = ("put", op[1])  # deleted then created in one transaction
        self.ops[key] = op

    def insert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> bool:
        key = (space, execution, ns, name)
        if self.get(space, execution, ns, name) is not None:
            return False
        self._write(key, ("ins", bytes(data)))
        return True

    def insert_many(self, space: str, execution: str, ns: str, rows: dict[str, bytes]
                    ) -> set[str]:
        keys = [(space, execution, ns, n) for n in rows]
        there = self._read(lambda: self._lookup_many(keys))  # in parallel
        for key in keys:
            if key not in there:
                self._write(key, ("ins", bytes(rows[key[3]])))
        return {k[3] for k in keys if k not in there}

    def add(self, space: str, execution: str, ns: str, name: str, data: bytes) -> None:
        """Create-if-absent without reading first: applied with ``If-None-Match: *``,
        a row already there (whatever its bytes) stays."""
        self._write((space, execution, ns, name), ("add", bytes(data)))

    def add_many(self, space: str, execution: str, ns: str, rows: dict[str, bytes]) -> None:
        for name, data in rows.items():
            self.add(space, execution, ns, name, data)

    def upsert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CheckpointError(f"agent store {self._s.location}: row {space}/{name} "
                                  "has no bytes")
        self._write((space, execution, ns, name), ("put", bytes(data)))

    def delete(self, space: str, execution: str, ns: str | None = None,
               names: Sequence[str] | None = None) -> int:
        if names is not None and not names:
            return 0
        self.seen.clear()
        if names is not None and ns is not None:
            keys = list(self._lookup_many([(space, execution, ns, n) for n in names]))
        else:
            wanted = None if names is None else set(names)
            keys = [k for k in self._list(space, execution, ns, None)
                    if wanted is None or k[3] in wanted]
        for key in keys:
            self._write(key, ("del", None))
        return len(keys)


class S3RowStore(RowStore):
    """Agent rows under ``s3://bucket/prefix``; see the module docstring.

    ``objects`` replaces the S3 client (any :class:`~sealstream._objects.Objects`);
    the endpoint is ``AWS_ENDPOINT_URL`` (else AWS), credentials the AWS chain.
    """

    reads_without_snapshot = True

    def __init__(self, url: str, *, objects: Objects | None = None) -> None:
        try:
            self.objects = objects if objects is not None else open_objects(url)
        except ObjectStoreError as exc:
            raise CheckpointError(f"cannot open agent store: {exc}") from None
        self.location = self.objects.location
        ident = f"{self.location} {getattr(self.objects, 'endpoint_url', '')}"
        with _LEASES_LOCK:
            self._lease = _LEASES.setdefault(ident, _Lease())
        self._lock = self._lease.lock
        self._open = False
        self._pool: ThreadPoolExecutor | None = None
        #: crash points for tests (``SEALSTREAM_CRASH_AT``): ``s3_rows_journal_written``
        #: (before the commit point), ``s3_rows_committed`` (after it, nothing
        #: applied), ``s3_rows_row_applied`` (after each row applied)
        self.crash = CrashPoints()

    def _fail(self, exc: ObjectStoreError) -> CheckpointError:
        return CheckpointError(f"agent store {self.location}: {exc}")

    # ------------------------------------------------------------ rows
    def _each(self, fn: Callable[[Any], _T], items: Sequence[Any]) -> list[_T]:
        if len(items) <= 1:
            return [fn(i) for i in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(8, thread_name_prefix="sealstream-s3rows")
        return list(self._pool.map(fn, items))

    def _get_rows(self, keys: Sequence[Key]) -> dict[Key, bytes]:
        try:
            got = self._each(lambda k: self.objects.get(row_key(k)), keys)
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        return {k: v for k, v in zip(keys, got, strict=True) if v is not None}

    def _list_rows(self, space: str, execution: str | None, ns: str | None,
                   prefix: str | None) -> list[Key]:
        at = ROWS + _part(space) + "/"
        if execution is not None:
            at += _part(execution) + "/"
            if ns is not None:
                at += _part(ns) + "/" + (_part(prefix) if prefix else "")
        try:
            listed = self.objects.keys(at)
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        keys = [k for k in map(_parse, listed) if k is not None]
        return [k for k in keys if (ns is None or k[2] == ns)
                and (not prefix or k[3].startswith(prefix))]

    # ------------------------------------------------------------ the lease
    def _read_lease(self) -> tuple[dict[str, Any], str] | None:
        try:
            got = self.objects.read_versioned(LEASE)
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        if got is None:
            return None
        try:
            doc = json.loads(got[0])
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("seq", 0), int):
            raise CheckpointError(f"agent store {self.location}: {LEASE} is not a lease "
                                  "(damaged or written by something else); refusing the store")
        return doc, got[1]

    def _lease_etag(self) -> str:
        try:
            got = self.objects.read_versioned(LEASE)  # its version as replace() sees it
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        return "" if got is None else got[1]

    @staticmethod
    def _journal_key(doc: dict[str, Any]) -> str | None:
        seq, by = doc.get("seq"), doc.get("by")
        if isinstance(seq, int) and seq > 0 and isinstance(by, str):
            return f"{JOURNAL}{seq:016d}-{by}"
        return None

    def _journal(self, key: str) -> dict[Key, Op] | None:
        """The writes of journal ``key`` (None when it was applied and deleted)."""
        try:
            body = self.objects.get(key)
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        if body is None:
            return None
        try:
            doc = json.loads(body)
            ops: dict[Key, Op] = {}
            for kind, s, e, n, m, data in doc["ops"]:
                if kind not in ("ins", "add", "put", "del") or not all(
                        isinstance(c, str) for c in (s, e, n, m)):
                    raise ValueError(kind)
                ops[(s, e, n, m)] = (kind, None if data is None else base64.b64decode(
                    data, validate=True))
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"agent store {self.location}: {key} is not a journal "
                                  f"(damaged: {type(exc).__name__}); refusing the store"
                                  ) from None
        return ops

    def _committed_view(self) -> tuple[str, dict[Key, Op]]:
        """For a reader without the lease: the lease's ETag and the writes of the
        committed journal it names, if not yet applied."""
        got = self._read_lease()
        if got is None:
            return "", {}
        key = self._journal_key(got[0])
        return got[1], (self._journal(key) or {}) if key else {}

    def _doc(self, base: dict[str, Any], **changes: Any) -> dict[str, Any]:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "run": _RUN}
        return {**base, "holder": holder, "released": False,
                "expires_ms": int((time.time() + lease_seconds()) * 1000), **changes}

    def _cas(self, doc: dict[str, Any]) -> None:
        lease = self._lease
        try:
            etag = self.objects.replace(LEASE, json.dumps(doc).encode(), lease.etag or None)
        except VersionConflictError:
            lease.doc = None
            raise LockHeldError(f"agent store {self.location}: this process lost the lease "
                                "to another writer (fenced); nothing more was committed"
                                ) from None
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        lease.doc, lease.etag, lease.renewed = doc, etag, time.monotonic()

    def _ensure(self) -> None:
        """Hold the lease (taking it redoes the committed journal), renewed when a
        third of its time has passed; apply a journal left unapplied by a failure."""
        lease = self._lease
        if not self._open:
            lease.users += 1
            self._open = True
        try:
            if not lease.probed:
                self.objects.probe()
                lease.probed = True
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        if lease.doc is None:
            now = self._read_lease()
            if now is not None and _live(now[0]) and now[0].get("holder", {}).get(
                    "run") != _RUN:
                raise LockHeldError(
                    f"agent store {self.location} is locked by another process "
                    f"({json.dumps(now[0].get('holder'))}); one writer per store: wait for "
                    "it to end, or make sure it is dead")
            base = now[0] if now is not None else {"seq": 0}
            lease.etag = "" if now is None else now[1]
            self._cas(self._doc(base, generation=int(base.get("generation", 0) or 0) + 1))
            lease.dirty = True
        elif time.monotonic() - lease.renewed > lease_seconds() / 3:
            assert lease.doc is not None
            self._cas(self._doc(lease.doc))
        if lease.dirty:
            self._redo()

    def _redo(self) -> None:
        lease = self._lease
        assert lease.doc is not None
        key = self._journal_key(lease.doc)
        if key is not None:
            ops = self._journal(key)
            if ops is not None:
                self._apply(key, ops)
        try:
            for orphan in self.objects.keys(JOURNAL):
                if orphan != key:  # never committed: a killed or fenced writer's
                    self.objects.delete(orphan)
        except ObjectStoreError as exc:
            raise self._fail(exc) from None
        lease.dirty = False

    def _apply(self, journal: str, ops: dict[Key, Op]) -> None:
        def one(item: tuple[Key, Op]) -> None:
            (key, (kind, data)), obj = item, row_key(item[0])
            if kind == "del":
                self.objects.delete(obj)
            elif kind in ("ins", "add"):
                assert data is not None
                try:
                    self.objects.create(obj, data)
                except ObjectExistsError:
                    if kind == "add":
                        return  # it was there: "add" leaves it
                    raise CheckpointError(
                        f"agent store {self.location}: row {key[0]}/{key[3]} of "
                        f"{key[1]!r} exists with other bytes (changed behind the store's "
                        "back); refusing to overwrite it") from None
            else:
                assert data is not None
                now = self.objects.read_versioned(obj)  # the version replace() compares
                self.objects.replace(obj, data, None if now is None else now[1])
            self.crash("s3_rows_row_applied")
        try:
            self._each(one, list(ops.items()))
            self.objects.delete(journal)
        except ObjectStoreError as exc:
            raise CheckpointError(f"agent store {self.location}: transaction {journal} is "
                                  f"committed but not yet applied ({exc}); it is applied at "
                                  "the next use") from None

    def _commit(self, ops: dict[Key, Op]) -> None:
        lease = self._lease
        assert lease.doc is not None
        seq = int(lease.doc.get("seq", 0)) + 1
        key = f"{JOURNAL}{seq:016d}-{_RUN}"
        body = json.dumps({"format": 1, "seq": seq, "ops": [
            [kind, *k, None if data is None else base64.b64encode(data).decode()]
            for k, (kind, data) in ops.items()]}).encode()
        try:
            self.objects.create(key, body)
        except ObjectStoreError as exc:
            raise CheckpointError(f"agent store {self.location}: {exc}; nothing of the "
                                  "transaction was committed") from None
        self.crash("s3_rows_journal_written")
        self._cas(self._doc(lease.doc, seq=seq, by=_RUN))
        lease.dirty = True
        self.crash("s3_rows_committed")
        self._apply(key, ops)
        lease.dirty = False

    # ------------------------------------------------------------ RowStore
    @contextlib.contextmanager
    def transaction(self) -> Iterator[RowTx]:
        with self._lease.lock:
            self._ensure()
            tx = _S3Tx(self, holder=True)
            yield tx
            if tx.ops:
                self._commit(tx.ops)

    @contextlib.contextmanager
    def reading(self) -> Iterator[RowTx]:
        """Reads without the lease (each statement sees whole transactions); in the
        process holding it, a :meth:`transaction`."""
        if self._lease.doc is not None:
            with self.transaction() as tx:
                yield tx
            return
        yield _S3Tx(self, holder=False)

    def get(self, space: str, execution: str, ns: str, name: str) -> bytes | None:
        with self.reading() as tx:
            return tx.get(space, execution, ns, name)

    def scan(self, space: str, execution: str | None, ns: str | None = None,
             prefix: str | None = None) -> list[Row]:
        with self.reading() as tx:
            return tx.scan(space, execution, ns, prefix)

    @contextlib.contextmanager
    def execution_lock(self, execution: str, ns: str, *, timeout: float = 0.0
                       ) -> Iterator[None]:
        """The store's lease (one writer process per store) and, within this process,
        one holder of ``(execution, ns)`` at a time."""
        lease = self._lease
        what = f"execution {execution!r}/{ns!r} of {self.location}"
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with lease.lock:
                self._ensure()
                if (execution, ns) not in lease.executions:
                    lease.executions.add((execution, ns))
                    break
            if time.monotonic() >= deadline:
                raise LockHeldError(f"{what} is held by another runner (one writer per "
                                    "execution: wait for it, or make sure it is dead)")
            time.sleep(0.01)
        try:
            yield
        finally:
            with lease.lock:
                lease.executions.discard((execution, ns))

    def close(self) -> None:
        """Release the lease when this is the process's last open store of the prefix."""
        lease = self._lease
        with lease.lock:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            if not self._open:
                return
            self._open = False
            lease.users -= 1
            if lease.users > 0 or lease.doc is None or lease.executions:
                return
            with contextlib.suppress(CheckpointError, LockHeldError):
                self._cas({**lease.doc, "released": True})
            lease.doc = None


def is_agent_prefix(url: str, objects: Objects | None = None) -> bool:
    """Whether ``s3://bucket/prefix`` holds an agent store: its ``LEASE`` is an agent
    lease (it carries ``seq``; a stream checkpoint store's lease does not). One GET,
    nothing written, no lease taken; False when it cannot be read (the caller's other
    path reports why). ``objects``: the prefix's client, when the caller keeps one
    (the console)."""
    try:
        got = (objects if objects is not None else open_objects(url)).get(LEASE)
    except ObjectStoreError:
        return False
    try:
        doc = json.loads(got) if got is not None else None
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("seq"), int)


class S3RowReader(RowStore):
    """An S3 agent store opened read-only (``checkpoints list/verify/inspect``, the
    console): every transaction is a :meth:`S3RowStore.reading`, so no lease is taken,
    no probe object written, and a crashed writer's committed journal is seen; a
    write is refused with one line."""

    reads_without_snapshot = True

    def __init__(self, url: str) -> None:
        self.inner = S3RowStore(url)
        self.location = self.inner.location
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[RowTx]:
        with self.inner.reading() as tx:
            yield tx
            if isinstance(tx, _S3Tx) and tx.ops:
                raise CheckpointError(f"agent store {self.location} is open read-only; "
                                      "nothing was written")

    def reading(self) -> contextlib.AbstractContextManager[RowTx]:
        return self.transaction()

    def execution_lock(self, execution: str, ns: str, *, timeout: float = 0.0
                       ) -> contextlib.AbstractContextManager[None]:
        raise CheckpointError(f"agent store {self.location} is open read-only")

    def close(self) -> None:
        self.inner.close()
