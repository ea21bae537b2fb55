"""The single writer's lease of an object checkpoint store (``LEASE`` under the
prefix), taken and renewed by compare-and-swap; see
:mod:`sealstream.checkpoint.stores.objects` for the protocol it is part of.

``LEASE`` holds the holder (pid, host, start time, a run id), a generation and an
expiry. A run takes it when absent, released, expired, or held by a process of this
host that is gone (a SIGKILLed run); it renews it every third of its time to live
(``SEALSTREAM_S3_LEASE_S``, default 30 s) and before each manifest. A renewal refused
because another run took the lease *fences* this run: it publishes nothing more and
stops with one line (:class:`LockHeldError`).

:attr:`LeaseHolder._renewed_at` is when the last successful renewal was *sent* (the
monotonic clock): the lease is this run's for a whole term from that instant, which is
what lets the checkpoint writer renew concurrently with a checkpoint's files and still
publish its manifest inside the term (it renews again first when the files took more
than a third of it: :meth:`LeaseHolder._renew_if_older`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Any

from sealstream._objects import Objects, ObjectStoreError, VersionConflictError
from sealstream.errors import CheckpointError, LockHeldError

__all__ = ["LEASE_KEY", "LeaseHolder", "lease_live", "lease_seconds"]

LEASE_KEY = "LEASE"


def lease_seconds() -> float:
    raw = os.environ.get("SEALSTREAM_S3_LEASE_S", "").strip()
    try:
        return max(1.0, float(raw)) if raw else 30.0
    except ValueError:
        return 30.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_live(doc: dict[str, Any]) -> bool:
    """Whether the lease ``doc`` is held now by a run that may still write (also the
    agent row store's lease, :mod:`sealstream.agents._s3store`)."""
    if doc.get("released") or not isinstance(doc.get("expires_ms"), int):
        return False
    if doc["expires_ms"] <= int(time.time() * 1000):
        return False
    holder = doc.get("holder")
    if isinstance(holder, dict) and holder.get("host") == socket.gethostname() \
            and isinstance(holder.get("pid"), int) and not _pid_alive(holder["pid"]):
        return False  # its process is gone (killed): nobody renews it
    return True


class LeaseHolder:
    """The lease half of :class:`~sealstream.checkpoint.stores.objects.
    ObjectCheckpointStore` (a mixin: the store owns the attributes below)."""

    objects: Objects
    _holder: dict[str, Any]
    _lease: tuple[dict[str, Any], str] | None  # (doc, etag) while held
    _lost: str | None
    _mutex: threading.Lock
    _stop: threading.Event
    _renewed_at: float

    @property
    def location(self) -> str:
        return self.objects.location

    def _fail(self, what: str, exc: Exception) -> CheckpointError:
        return CheckpointError(f"{what}: {exc}")

    def _on_fenced(self) -> None:
        """What the store forgets when it learns it was fenced."""

    def _read_lease(self) -> tuple[dict[str, Any], str] | None:
        try:
            got = self.objects.read_versioned(LEASE_KEY)
        except ObjectStoreError as exc:
            raise self._fail(f"cannot read the lease of {self.location}", exc) from None
        if got is None:
            return None
        try:
            doc = json.loads(got[0])
        except ValueError:
            doc = None
        return (doc if isinstance(doc, dict) else {"released": True}), got[1]

    _live = staticmethod(lease_live)

    def _doc(self, generation: int) -> dict[str, Any]:
        return {"holder": self._holder, "generation": generation,
                "expires_ms": int((time.time() + lease_seconds()) * 1000), "released": False}

    def _acquire(self, first: tuple[dict[str, Any], str] | None = None,
                 read: bool = True) -> None:
        """Take the lease (under ``_mutex``); ``read=False``: ``first`` is the lease as
        just read (None: absent), the first attempt does not read it again."""
        for attempt in range(20):
            now = first if attempt == 0 and not read else self._read_lease()
            if now is not None and self._live(now[0]):
                raise LockHeldError(f"checkpoint store {self.location} is locked by another "
                                    f"run ({json.dumps(now[0].get('holder'))})")
            gen = int(now[0].get("generation", 0) or 0) + 1 if now is not None else 1
            doc = self._doc(gen)
            sent = time.monotonic()
            try:
                etag = self.objects.replace(LEASE_KEY, json.dumps(doc).encode(),
                                            None if now is None else now[1])
            except VersionConflictError:
                continue  # another run moved first: look again
            except ObjectStoreError as exc:
                raise self._fail(f"cannot take the lease of {self.location}", exc) from None
            self._lease = (doc, etag)
            self._renewed_at = sent
            self._lost = None
            return
        raise LockHeldError(f"checkpoint store {self.location}: the lease keeps changing "
                            "hands; another run is starting on the same prefix")

    def _renew(self, publishing: int | None = None) -> None:
        with self._mutex:
            if self._lost is not None:
                raise LockHeldError(self._lost)
            if self._lease is None:
                return
            doc = self._doc(int(self._lease[0]["generation"]))
            sent = time.monotonic()
            try:
                etag = self.objects.replace(LEASE_KEY, json.dumps(doc).encode(),
                                            self._lease[1])
            except VersionConflictError:
                taker = self._read_lease()
                who = json.dumps(taker[0].get("holder")) if taker else "nobody"
                self._lost = (f"checkpoint store {self.location}: this run was fenced (the "
                              f"lease was taken by {who})"
                              + (f"; checkpoint {publishing} was not published"
                                 if publishing is not None else "") + "; stopping")
                self._lease = None
                self._on_fenced()
                raise LockHeldError(self._lost) from None
            except ObjectStoreError as exc:
                raise self._fail(f"cannot renew the lease of {self.location}", exc) from None
            except Exception as exc:  # noqa: BLE001 - a raw client error: one line too
                raise CheckpointError(f"cannot renew the lease of {self.location}: "
                                      f"{type(exc).__name__}: {exc}") from None
            self._lease = (doc, etag)
            self._renewed_at = sent

    def _renew_if_older(self, seconds: float, publishing: int) -> None:
        """Renew unless a renewal sent less than ``seconds`` ago succeeded (the lease
        then still has two thirds of its term, or more, before anyone can take it)."""
        with self._mutex:
            fresh = self._lease is not None and self._lost is None \
                and time.monotonic() - self._renewed_at < seconds
        if not fresh:
            self._renew(publishing=publishing)

    def _heartbeat(self) -> None:
        period = lease_seconds() / 3
        while not self._stop.wait(period):
            try:
                self._renew()
            except LockHeldError:
                return
            except Exception:  # noqa: BLE001 - a server fault, or a raw client error
                continue  # the next beat tries again before expiry (the thread lives on)

    def _release_lease(self) -> None:
        with self._mutex:
            held, self._lease = self._lease, None
            if held is not None:
                doc = {**held[0], "released": True}
                with contextlib.suppress(ObjectStoreError):
                    self.objects.replace(LEASE_KEY, json.dumps(doc).encode(), held[1])

    def check_lock(self) -> None:
        with self._mutex:
            if self._lost is not None:
                raise LockHeldError(self._lost)

    def is_locked(self) -> str | None:
        now = self._read_lease()
        if now is None or not self._live(now[0]):
            return None
        holder = now[0].get("holder")
        return json.dumps(holder if isinstance(holder, dict) else {"pid": None})
