"""What the single writer of an object prefix knows without asking the server.

While a run holds an object store's lease (:class:`~sealstream.checkpoint.stores.
objects.ObjectCheckpointStore`), it is the only process that creates or deletes
checkpoints and step plans under the prefix: another run is refused, or fenced
before its manifest. So, from one listing taken *after* the lease was taken (strong
read-after-write: every object created or deleted before it is, or is not, in it),
the writer keeps the checkpoint ids and step plans itself, adding what it creates and
removing what it deletes, instead of listing the prefix again at every checkpoint.

It also keeps the stored bytes of the immutable objects it created (every one is
created with ``If-None-Match: *`` and acknowledged by the server, which checked the
request's checksum) and of the manifests it read: the retention's verification of the
newest checkpoint and its reading of the manifests it keeps are then answered from
memory. Immutable objects change only by being deleted, which this writer does itself
(and forgets them). A restart, a fallback and ``sealstream checkpoints verify`` read
everything from the bucket again: nothing here outlives the lease.

Not kept: the names of a checkpoint whose files other processes add (scale-out
workers' state parts, :meth:`write_part`); those are listed as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["Known"]

#: the largest object kept in memory, and the most bytes kept in all
BLOB_LIMIT = 32 * 1024 * 1024
TOTAL_LIMIT = 128 * 1024 * 1024


class Known:
    """The lease holder's view of its prefix (thread-safe: the engine's thread and
    the checkpoint writer's both use it)."""

    def __init__(self, ids: set[int], plans: set[int], max_ever: int = 0) -> None:
        """``max_ever``: the largest id the listing showed anywhere (rejected copies and
        deletions under way too): ids are never reused."""
        self._lock = threading.Lock()
        self._ids = set(ids)
        self._plans = set(plans)
        self._max_ever = max([max_ever, *ids], default=0)
        self._names: dict[int, list[str]] = {}
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    # ids and plans
    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._ids)

    def add_id(self, cid: int) -> None:
        with self._lock:
            self._ids.add(cid)
            self._max_ever = max(self._max_ever, cid)

    def max_ever(self) -> int:
        """The largest id ever taken on the prefix (a deleted or moved one too)."""
        with self._lock:
            return self._max_ever

    def plans(self) -> list[int]:
        with self._lock:
            return sorted(self._plans)

    def add_plan(self, step: int) -> None:
        with self._lock:
            self._plans.add(step)

    def drop_plan(self, step: int) -> None:
        with self._lock:
            self._plans.discard(step)

    # a checkpoint's names and bytes
    def names(self, cid: int) -> list[str] | None:
        with self._lock:
            got = self._names.get(cid)
            return None if got is None else list(got)

    def set_names(self, cid: int, names: list[str]) -> None:
        """``names``: the keys of checkpoint ``cid`` but its claim (``cp-N/state.arrow``),
        as :meth:`~sealstream.checkpoint.stores.base.CheckpointStore._names` gives them."""
        with self._lock:
            if cid in self._ids:
                self._names[cid] = sorted(names)

    def blob(self, rel: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(rel)

    def keep_blob(self, rel: str, raw: bytes) -> None:
        if len(raw) > BLOB_LIMIT:
            return
        with self._lock:
            if rel in self._blobs:
                return
            while self._blobs and self._bytes + len(raw) > TOTAL_LIMIT:
                _, old = self._blobs.popitem(last=False)  # the oldest first
                self._bytes -= len(old)
            self._blobs[rel] = raw
            self._bytes += len(raw)

    def forget(self, cid: int, dirname: str) -> None:
        """Checkpoint ``cid`` (its objects under ``dirname/``) is being deleted or
        moved aside: no longer an id, nothing of it kept."""
        with self._lock:
            self._ids.discard(cid)
            self._names.pop(cid, None)
            for rel in [r for r in self._blobs if r.startswith(f"{dirname}/")]:
                self._bytes -= len(self._blobs.pop(rel))
