"""Checkpoints in object storage (``[checkpoint] url = "s3://bucket/prefix"``), on
any :class:`~sealstream._objects.Objects` (S3, or a local directory of objects).

Layout under the prefix (the blob names of every store)::

    STORE                                  created once: the prefix holds checkpoints
    LEASE                                  the single writer's lease (compare-and-swap)
    cp-000000000012/.claim                 the id taken (create-if-absent)
    cp-000000000012/state.arrow            immutable blobs, create-if-absent
    cp-000000000012/receipts.json
    cp-000000000012/MANIFEST.json          created last, create-if-absent
    rejected/cp-000000000013-<reason>-<time>/...   copies kept as evidence
    .deleting/cp-000000000010              a deletion under way (finished at start)
    plans/step-000000000007.json           live runs' step plans

Commit protocol, without rename:

1. ``cp-N/.claim`` is created only if absent: two writers never share an id, and ids
   are never reused (rejected copies keep theirs, :meth:`max_id_ever`).
2. Every file is created only if absent (``If-None-Match: *``); a large one in a
   multipart upload completed only when whole. A create refused because the same
   bytes are there is an idempotent retry; other bytes are a conflict.
3. The lease is renewed by compare-and-swap (``If-Match`` its ETag): a run that lost
   it is *fenced* and stops with one line (LockHeldError), publishing nothing.
4. ``cp-N/MANIFEST.json`` is created last, only if absent. A checkpoint without it
   is partial, judged and moved aside as on a directory.

The lease: ``LEASE`` holds the holder (pid, host, start time, a run id), a
generation and an expiry. A run takes it when absent, released, expired, or held by
a process of this host that is gone (a SIGKILLed run); it renews it every third of
its time to live (``SEALSTREAM_S3_LEASE_S``, default 30 s). Moving a checkpoint
aside copies its objects under ``rejected/`` and then deletes them, manifest first;
a deletion writes a ``.deleting/`` marker first, so a crash mid-way never leaves a
half-deleted checkpoint among the ids. A store that does not refuse a second create
of one key is refused at :meth:`ensure_root` (:meth:`Objects.probe`).

While it holds the lease, the store answers its own questions (the ids, a
checkpoint's names, the step plans, the bytes of what it created and of the manifests
it read) from what it knows (:mod:`sealstream.checkpoint.stores._known`) rather than
by listing and reading the prefix again at every checkpoint; a checkpoint's files go
up concurrently, a few at a time, before its manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sealstream._objects import (
    NoSuchBucketError,
    ObjectExistsError,
    Objects,
    ObjectStoreError,
    VersionConflictError,
)
from sealstream.checkpoint import crypto
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.stores._known import Known
from sealstream.checkpoint.stores.base import (
    _PART_FILE,
    PREFIX,
    REJECTED,
    CheckpointStore,
    _parse_id,
    checkpoint_dirname,
)
from sealstream.errors import CheckpointError, LockHeldError

STORE_KEY = "STORE"
LEASE_KEY = "LEASE"
CLAIM = ".claim"
DELETING = ".deleting/"


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


class ObjectCheckpointStore(CheckpointStore):
    """Checkpoints as objects; see the module docstring."""

    direct_parts = True

    def __init__(self, objects: Objects, pipeline: str | None = None,
                 encryption_key: bytes | None | object = crypto.FROM_ENV, *,
                 probe: bool = True) -> None:
        """``encryption_key`` as for the directory store; ``probe``: check the
        server's conditional writes at :meth:`ensure_root`."""
        self.objects = objects
        self.pipeline = pipeline
        self.root = Path(objects.location)  # only ever used in messages
        self._probe = probe
        self._probed = False
        self._init_key(encryption_key)
        self._run = uuid.uuid4().hex
        self._holder = {"pid": os.getpid(), "host": socket.gethostname(), "run": self._run,
                        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._lease: tuple[dict[str, Any], str] | None = None  # (doc, etag) while held
        self._lost: str | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._known: Known | None = None  # while the lease is held (see _known)
        self._pool: ThreadPoolExecutor | None = None  # a checkpoint's files, concurrently

    @property
    def location(self) -> str:
        return self.objects.location

    def _fail(self, what: str, exc: Exception) -> CheckpointError:
        return CheckpointError(f"{what}: {exc}")

    # ------------------------------------------------------------ reading
    def exists(self) -> bool:
        try:
            return self.objects.get(STORE_KEY, 0, 1) is not None
        except NoSuchBucketError:
            return False  # no bucket: no store in it either
        except ObjectStoreError as exc:
            raise self._fail(f"cannot read {self.location}", exc) from None

    def _keys(self, prefix: str) -> list[str]:
        try:
            return self.objects.keys(prefix)
        except ObjectStoreError as exc:
            raise self._fail(f"cannot list {self.location}", exc) from None

    def ids(self) -> list[int]:
        known = self._known
        if known is not None:
            return known.ids()
        return self._listed_ids()

    def _listed_ids(self) -> list[int]:
        deleting = {k[len(DELETING):] for k in self._keys(DELETING)}
        out = set()
        for key in self._keys(PREFIX):
            head = key.split("/", 1)[0]
            cid = _parse_id(head)
            if cid is not None and "/" in key and head not in deleting:
                out.add(cid)
        return sorted(out)

    def max_id_ever(self) -> int:
        ids = self.ids()
        for key in self._keys(f"{REJECTED}/"):
            cid = _parse_id(key[len(REJECTED) + 1:][: len(PREFIX) + 12])
            if cid is not None:
                ids.append(cid)
        for key in self._keys(DELETING):
            cid = _parse_id(key[len(DELETING):])
            if cid is not None:
                ids.append(cid)
        return max(ids, default=0)

    @staticmethod
    def _valid(rel: str) -> bool:
        return bool(rel) and not rel.startswith("/") and all(
            p not in ("", ".", "..") for p in rel.split("/"))

    def _raw(self, rel: str) -> bytes | None:
        if not self._valid(rel):
            return None
        known = self._known
        if known is not None and (kept := known.blob(rel)) is not None:
            return kept
        try:
            got = self.objects.get(rel)
        except ObjectStoreError as exc:
            raise self._fail(f"cannot read {rel}", exc) from None
        self._remember_manifest(rel, got)
        return got

    def _bounded(self, rel: str, limit: int) -> bytes | None:
        if not self._valid(rel):
            return None
        known = self._known
        if known is not None and (kept := known.blob(rel)) is not None:
            return kept[: limit + 1]
        try:
            got = self.objects.get(rel, 0, limit + 1)
        except ObjectStoreError as exc:
            raise self._fail(f"cannot read {rel}", exc) from None
        if got is not None and len(got) <= limit:  # whole: the object, not a prefix of it
            self._remember_manifest(rel, got)
        return got

    def _remember_manifest(self, rel: str, got: bytes | None) -> None:
        """Keep a manifest read under the lease: immutable until this writer deletes
        it (a checkpoint's other files are read once, by the guard, and not kept)."""
        known = self._known
        if known is not None and got is not None and rel.endswith(f"/{MANIFEST_NAME}") \
                and _parse_id(rel.split("/", 1)[0]) is not None:
            known.keep_blob(rel, got)

    def _names(self, cid: int) -> list[str]:
        known = self._known
        if known is not None and (names := known.names(cid)) is not None:
            return names
        d = checkpoint_dirname(cid)
        names = sorted(k for k in self._keys(f"{d}/")
                       if not k.rsplit("/", 1)[-1].startswith("."))
        if known is not None and f"{d}/{MANIFEST_NAME}" in names:
            known.set_names(cid, names)  # published: no file is added any more
        return names

    # ------------------------------------------------------------ writing
    def ensure_root(self) -> None:
        """Probe the store (once), then create ``STORE`` if absent."""
        try:
            if self._probe and not self._probed:
                self.objects.probe()
                self._probed = True
            body = json.dumps({"format": 1, "holds": "sealstream checkpoints",
                               "pipeline": self.pipeline}).encode()
            if self.objects.get(STORE_KEY, 0, 1) is None:
                with contextlib.suppress(ObjectStoreError):  # a concurrent creator's
                    self.objects.create(STORE_KEY, body)
        except ObjectStoreError as exc:
            raise CheckpointError(str(exc)) from None

    def _create(self, rel: str, data: bytes, cid: int | None = None) -> None:
        try:
            self.objects.create(rel, data)
        except ObjectStoreError as exc:
            what = f"cannot write checkpoint {cid}" if cid is not None else f"cannot write {rel}"
            raise CheckpointError(f"{what} in {self.location}: {exc}; "
                                  "the previous checkpoints are intact") from None
        known = self._known
        if known is not None and cid is not None:
            known.keep_blob(rel, data)  # stored as sent: the server checked its checksum

    def _create_files(self, d: str, cid: int, files: dict[str, bytes], crash: Any) -> None:
        """Create a checkpoint's files (not its manifest), several at a time; each
        ``after_write_<name>`` crash point comes once that file is stored. The first
        failure is raised once every create has ended (none is left running)."""
        sealed = [(name, f"{d}/{name}", self._seal(f"{d}/{name}", data))
                  for name, data in files.items()]
        if len(sealed) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(4, thread_name_prefix="sealstream-s3put")
            futures = [self._pool.submit(self._create, rel, raw, cid) for _, rel, raw in sealed]
        else:
            futures = []
            for _, rel, raw in sealed:
                done: Future[None] = Future()
                try:
                    self._create(rel, raw, cid)
                    done.set_result(None)
                except BaseException as exc:  # noqa: BLE001 - raised below, in order
                    done.set_exception(exc)
                futures.append(done)
        for (name, _, _), future in zip(sealed, futures, strict=True):
            if future.exception() is not None:
                for other in futures:
                    other.exception()  # wait: nothing of this checkpoint still going up
                future.result()
            if crash is not None:
                crash(f"after_write_{name.split('.')[0]}")

    def claim(self, cid: int) -> None:
        self._create(f"{checkpoint_dirname(cid)}/{CLAIM}", self._run.encode(), cid)
        if self._known is not None:
            self._known.add_id(cid)

    def fence(self) -> Any:
        with self._mutex:
            return None if self._lease is None else int(self._lease[0]["generation"])

    def write_part(self, cid: int, name: str, data: bytes, fence: Any) -> None:
        if not _PART_FILE.fullmatch(name):
            raise CheckpointError(f"checkpoint {cid}: {name!r} is not a state part's name")
        d = checkpoint_dirname(cid)
        if fence is not None:
            doc = self._read_lease()
            if doc is None or doc[0].get("generation") != fence or doc[0].get("released"):
                raise LockHeldError(
                    f"{self.location}: the run that asked for part {name} of checkpoint "
                    f"{cid} no longer holds the lease; nothing was written")
        if self._raw(f"{d}/{CLAIM}") is None:
            raise CheckpointError(f"cannot write {d}/{name} in {self.location}: checkpoint "
                                  f"{cid} is not being written")
        if self._raw(f"{d}/{MANIFEST_NAME}") is not None:
            raise CheckpointError(f"cannot write {d}/{name} in {self.location}: checkpoint "
                                  f"{cid} is already published")
        self._create(f"{d}/{name}", self._seal(f"{d}/{name}", data), cid)

    def write_checkpoint(self, cid: int, files: dict[str, bytes], manifest: bytes,
                         crash: Any = None,
                         in_publish: Callable[[Any], None] | None = None,
                         claimed: bool = False) -> None:
        """Claim the id, create every file, renew the lease (fenced: LockHeldError),
        then create the manifest; every create only if absent."""
        if in_publish is not None:
            raise TypeError("an object store has no transaction to publish in")
        d = checkpoint_dirname(cid)
        if not claimed:
            self.claim(cid)
        self._create_files(d, cid, files, crash)
        sealed = self._seal(f"{d}/{MANIFEST_NAME}", manifest)
        if crash is not None:
            crash("before_manifest_publish")
        if self._lease is not None:
            self._renew(publishing=cid)
        self._create(f"{d}/{MANIFEST_NAME}", sealed, cid)
        known = self._known
        if known is not None and not claimed:  # claimed: workers may have added parts
            known.set_names(cid, [f"{d}/{n}" for n in (*files, MANIFEST_NAME)])

    def _copy_aside(self, keys: list[str], src: str, dest: str) -> None:
        for key in keys:
            self.objects.copy(key, f"{dest}/{key[len(src) + 1:]}")

    def _remove(self, keys: list[str], d: str) -> None:
        """Delete ``keys`` of ``d``: the manifest first (the checkpoint stops being one
        the moment it goes), the claim last (the id stays taken until the end)."""
        first = [k for k in keys if k.endswith(f"/{MANIFEST_NAME}")]
        last = [k for k in keys if k.endswith(f"/{CLAIM}")]
        for key in first:
            self.objects.delete(key)
        self.objects.delete_many([k for k in keys if k not in first and k not in last])
        for key in last:
            self.objects.delete(key)

    def _keys_of(self, cid: int, d: str) -> list[str]:
        """Every key under ``d/``: what this writer knows it holds (its names and the
        claim), else a listing."""
        known = self._known
        names = known.names(cid) if known is not None else None
        if names is not None:
            return sorted([*names, f"{d}/{CLAIM}"])
        return self.objects.keys(f"{d}/")

    def move_aside(self, cid: int, reason: str) -> str | None:
        d = checkpoint_dirname(cid)
        try:
            keys = self._keys_of(cid, d)
            if self._known is not None:
                self._known.forget(cid, d)
            if not keys:
                return None
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            dest = f"{REJECTED}/{d}-{reason}-{stamp}"
            n = 1
            while self.objects.keys(f"{dest}/"):
                n += 1
                dest = f"{REJECTED}/{d}-{reason}-{stamp}-{n}"
            self._copy_aside(keys, d, dest)
            self._remove(keys, d)
        except ObjectStoreError as exc:
            raise CheckpointError(f"cannot move checkpoint {cid} aside in {self.location}: "
                                  f"{exc}") from None
        return f"{self.location}/{dest}"

    def delete(self, cid: int) -> None:
        d = checkpoint_dirname(cid)
        try:
            keys = self._keys_of(cid, d)
            if keys:
                self.objects.create(f"{DELETING}{d}", b"")
            if self._known is not None:  # marked: out of the ids (as the listing says)
                self._known.forget(cid, d)
            if not keys:
                return
            self._remove(keys, d)
            self.objects.delete(f"{DELETING}{d}")
        except ObjectStoreError as exc:
            raise CheckpointError(f"cannot delete checkpoint {cid} in {self.location}: "
                                  f"{exc}") from None

    def clear_trash(self) -> None:
        try:
            for marker in self.objects.keys(DELETING):
                d = marker[len(DELETING):]
                self._remove(self.objects.keys(f"{d}/"), d)
                self.objects.delete(marker)
        except ObjectStoreError as exc:
            raise CheckpointError(f"cannot finish a deletion in {self.location}: "
                                  f"{exc}") from None

    # ------------------------------------------------------------ step plans
    def write_shared(self, rel: str, data: bytes) -> None:
        if not self._valid(rel):
            raise CheckpointError(f"{rel!r} is not a shared blob name")
        try:
            self.objects.create(rel, self._seal(rel, data))
        except ObjectExistsError:
            pass  # content-addressed: the same plaintext (sealed with another nonce)
        except ObjectStoreError as exc:
            raise self._fail(f"cannot write {rel}", exc) from None

    def write_plan(self, step: int, data: bytes) -> None:
        from sealstream.checkpoint.plans import plan_name

        rel = plan_name(step)
        try:
            created = self.objects.create(rel, self._seal(rel, data))
        except ObjectStoreError as exc:
            raise CheckpointError(f"cannot write the plan of step {step} in {self.location}: "
                                  f"{exc}") from None
        if not created:
            raise CheckpointError(f"cannot write the plan of step {step} in {self.location}: "
                                  "it is there already (plans are never rewritten)")
        if self._known is not None:
            self._known.add_plan(step)

    def plan_steps(self) -> list[int]:
        known = self._known
        if known is not None:
            return known.plans()
        return self._listed_plans()

    def _listed_plans(self) -> list[int]:
        from sealstream.checkpoint.plans import PLANS_DIR, parse_plan_name

        steps = [parse_plan_name(k.rsplit("/", 1)[-1]) for k in self._keys(f"{PLANS_DIR}/")]
        return sorted(s for s in steps if s is not None)

    def delete_plans(self, steps: list[int]) -> None:
        from sealstream.checkpoint.plans import plan_name

        try:
            for step in steps:
                if self._known is not None:
                    self._known.drop_plan(step)
                self.objects.delete(plan_name(step))
        except ObjectStoreError as exc:
            raise self._fail(f"cannot delete plans in {self.location}", exc) from None

    def move_plan_aside(self, step: int, reason: str) -> None:
        from sealstream.checkpoint.plans import plan_name

        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        if self._known is not None:
            self._known.drop_plan(step)
        try:
            if self.objects.copy(plan_name(step),
                                 f"{REJECTED}/plan-step-{step:012d}-{reason}-{stamp}.json"):
                self.objects.delete(plan_name(step))
        except ObjectStoreError as exc:
            raise self._fail(f"cannot move a plan aside in {self.location}", exc) from None

    # ------------------------------------------------------------ the lease
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

    def _acquire(self) -> None:
        for _ in range(20):
            now = self._read_lease()
            if now is not None and self._live(now[0]):
                raise LockHeldError(f"checkpoint store {self.location} is locked by another "
                                    f"run ({json.dumps(now[0].get('holder'))})")
            gen = int(now[0].get("generation", 0) or 0) + 1 if now is not None else 1
            doc = self._doc(gen)
            try:
                etag = self.objects.replace(LEASE_KEY, json.dumps(doc).encode(),
                                            None if now is None else now[1])
            except VersionConflictError:
                continue  # another run moved first: look again
            except ObjectStoreError as exc:
                raise self._fail(f"cannot take the lease of {self.location}", exc) from None
            self._lease = (doc, etag)
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
                self._known = None
                raise LockHeldError(self._lost) from None
            except ObjectStoreError as exc:
                raise self._fail(f"cannot renew the lease of {self.location}", exc) from None
            self._lease = (doc, etag)

    def _heartbeat(self) -> None:
        period = lease_seconds() / 3
        while not self._stop.wait(period):
            try:
                self._renew()
            except LockHeldError:
                return
            except CheckpointError:
                continue  # a server fault: the next beat tries again before expiry

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lease; LockHeldError naming the holder when a live run holds it."""
        self.ensure_root()
        with self._mutex:
            self._acquire()
        try:  # the one listing this run trusts for its ids and plans (see _known)
            self._known = Known(set(self._listed_ids()), set(self._listed_plans()))
        except BaseException:
            self._release()
            raise
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name="sealstream-lease")
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._release()

    def _release(self) -> None:
        self._known = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._mutex:
            held, self._lease = self._lease, None
            if held is not None:
                doc = {**held[0], "released": True}
                with contextlib.suppress(ObjectStoreError):
                    self.objects.replace(LEASE_KEY, json.dumps(doc).encode(), held[1])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

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
