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

The lease (:mod:`sealstream.checkpoint.stores._lease`): ``LEASE`` holds the
holder, a generation and an expiry, renewed every third of its time to live and
before each manifest. Moving a checkpoint
aside copies its objects under ``rejected/`` and then deletes them, manifest first;
a deletion writes a ``.deleting/`` marker first, so a crash mid-way never leaves a
half-deleted checkpoint among the ids. A store that does not refuse a second create
of one key is refused at :meth:`ensure_root` (:meth:`Objects.probe`).

While it holds the lease, the store answers its own questions (the ids, a
checkpoint's names, the step plans, the bytes of what it created and of the manifests
it read) from what it knows (:mod:`sealstream.checkpoint.stores._known`) rather than
by listing and reading the prefix again at every checkpoint. Off the caller's thread
(docs/object-storage.md, "What runs concurrently"): the probe, beside the first reads
of ``STORE`` and ``LEASE`` (nothing is written before it passed); a checkpoint's claim,
files and lease renewal, concurrently, before its manifest; and, on a background
thread after the manifest that made them old, the deletions of old checkpoints and
step plans, which end before the lease is released.
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
from functools import partial
from pathlib import Path
from typing import Any

from sealstream._objects import (
    NoSuchBucketError,
    ObjectExistsError,
    Objects,
    ObjectStoreError,
)
from sealstream.checkpoint import crypto
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.stores._known import Known
from sealstream.checkpoint.stores._lease import (
    LEASE_KEY,
    LeaseHolder,
    lease_live,
    lease_seconds,
)
from sealstream.checkpoint.stores.base import (
    _PART_FILE,
    PREFIX,
    REJECTED,
    CheckpointStore,
    _parse_id,
    checkpoint_dirname,
)
from sealstream.errors import CheckpointError, LockHeldError

__all__ = ["CLAIM", "DELETING", "LEASE_KEY", "STORE_KEY", "ObjectCheckpointStore",
           "lease_live", "lease_seconds"]

STORE_KEY = "STORE"
CLAIM = ".claim"
DELETING = ".deleting/"


class ObjectCheckpointStore(LeaseHolder, CheckpointStore):
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
        self._renewed_at = 0.0
        self._known: Known | None = None  # while the lease is held (see _known)
        self._trash: dict[str, list[str]] | None = None  # deletions the listing found
        self._pool: ThreadPoolExecutor | None = None  # a checkpoint's files, concurrently
        # the probe at start, then deletions behind the caller (one thread, in order)
        self._bg: ThreadPoolExecutor | None = None
        self._behind: list[Future[None]] = []
        self._behind_failed: str | None = None

    def _on_fenced(self) -> None:
        self._known = None

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
        known = self._known
        if known is not None:  # the listing saw rejected copies and deletions too
            return known.max_ever()
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

    def _create_files(self, d: str, cid: int, files: dict[str, bytes], crash: Any,
                      claim: bool = False, renew: bool = False) -> None:
        """Create a checkpoint's files (not its manifest), several at a time, beside
        its claim (``claim``) and the lease's renewal (``renew``); each
        ``after_write_<name>`` crash point comes once that file (and the claim) is
        stored. The first failure (the renewal's first: a fenced run says so) is
        raised once every request has ended (none is left running)."""
        jobs: list[tuple[str | None, Callable[[], None]]] = []
        if renew:
            jobs.append((None, partial(self._renew, publishing=cid)))
        if claim:
            jobs.append((None, partial(self.claim, cid)))
        for name, data in files.items():
            rel = f"{d}/{name}"
            jobs.append((name, partial(self._create, rel, self._seal(rel, data), cid)))
        futures: list[Future[None]] = []
        if len(jobs) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(6, thread_name_prefix="sealstream-s3put")
            futures = [self._pool.submit(job) for _, job in jobs]
        else:
            for _, job in jobs:
                done: Future[None] = Future()
                try:
                    job()
                    done.set_result(None)
                except BaseException as exc:  # noqa: BLE001 - raised below, in order
                    done.set_exception(exc)
                futures.append(done)
        for (written, _), future in zip(jobs, futures, strict=True):
            if future.exception() is not None:
                for other in futures:
                    other.exception()  # wait: nothing of this checkpoint still going up
                future.result()
            if crash is not None and written is not None:
                crash(f"after_write_{written.split('.')[0]}")

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
        """Claim the id, create every file and renew the lease (fenced:
        LockHeldError), concurrently; then create the manifest, every create only if
        absent. The manifest is sent within a third of the lease's term after a
        renewal was sent (renewed again first if the files took longer): nobody can
        have taken the lease before it."""
        if in_publish is not None:
            raise TypeError("an object store has no transaction to publish in")
        self._raise_behind()
        self.check_lock()  # fenced by the heartbeat (the lease forgotten): publish nothing
        d = checkpoint_dirname(cid)
        held = self._lease is not None
        self._create_files(d, cid, files, crash, claim=not claimed, renew=held)
        sealed = self._seal(f"{d}/{MANIFEST_NAME}", manifest)
        if crash is not None:
            crash("before_manifest_publish")
        if held:
            self._renew_if_older(lease_seconds() / 3, cid)
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
        """Delete checkpoint ``cid``: its ``.deleting/`` marker, its objects, the
        marker. Under the lease, the ids forget it at once and the requests run behind
        the caller (:meth:`_later`), after every manifest published so far."""
        d = checkpoint_dirname(cid)
        what = f"cannot delete checkpoint {cid} in {self.location}"
        try:
            keys = self._keys_of(cid, d)
        except ObjectStoreError as exc:
            raise CheckpointError(f"{what}: {exc}") from None
        known = self._known
        if known is None:
            try:
                self._delete_now(d, keys)
            except ObjectStoreError as exc:
                raise CheckpointError(f"{what}: {exc}") from None
            return
        known.forget(cid, d)  # out of the ids now (as the listing says once it is marked)
        if keys:
            self._later(what, partial(self._delete_now, d, keys))

    def _delete_now(self, d: str, keys: list[str]) -> None:
        if not keys:
            return
        self.objects.create(f"{DELETING}{d}", b"")
        self._remove(keys, d)
        self.objects.delete(f"{DELETING}{d}")

    def clear_trash(self) -> None:
        try:
            trash, self._trash = self._trash, None
            if trash is None or self._known is None:  # not from this lease's listing
                trash = {m[len(DELETING):]: self.objects.keys(f"{m[len(DELETING):]}/")
                         for m in self.objects.keys(DELETING)}
            for d, keys in trash.items():
                self._remove(keys, d)
                self.objects.delete(f"{DELETING}{d}")
        except ObjectStoreError as exc:
            raise CheckpointError(f"cannot finish a deletion in {self.location}: "
                                  f"{exc}") from None

    # ------------------------------------------------------------ behind the caller
    def _background(self) -> ThreadPoolExecutor:
        if self._bg is None:
            self._bg = ThreadPoolExecutor(1, thread_name_prefix="sealstream-s3bg")
        return self._bg

    def _later(self, what: str, work: Callable[[], None]) -> None:
        """Run ``work`` (deletions) on the background thread, in the order asked. It
        runs only while this run holds the lease (a fenced run deletes nothing more);
        its failure is raised by the next write or deletion, or at the lease's end."""
        self._raise_behind()

        def run() -> None:
            if self._lost is not None or self._behind_failed is not None:
                return
            try:
                work()
            except (ObjectStoreError, CheckpointError) as exc:
                self._behind_failed = f"{what}: {exc}"
            except Exception as exc:  # noqa: BLE001 - a raw client error: never lost
                line = " ".join(str(exc).split())
                self._behind_failed = f"{what}: {type(exc).__name__}: {line}"

        self._behind = [f for f in self._behind if not f.done()]
        self._behind.append(self._background().submit(run))

    def _settle(self) -> None:
        """Wait for what runs behind the caller."""
        pending, self._behind = self._behind, []
        for future in pending:
            future.exception()

    def _raise_behind(self) -> None:
        if self._behind_failed is not None:
            raise CheckpointError(self._behind_failed)

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

        what = f"cannot delete plans in {self.location}"
        known = self._known
        if known is not None:  # behind the caller, as checkpoints are (see delete)
            for step in steps:
                known.drop_plan(step)
            if steps:
                self._later(what, partial(self.objects.delete_many,
                                          [plan_name(s) for s in steps]))
            return
        try:
            for step in steps:
                self.objects.delete(plan_name(step))
        except ObjectStoreError as exc:
            raise self._fail(what, exc) from None

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

    # ------------------------------------------------------------ the start
    def _start(self) -> None:
        """What :meth:`ensure_root` and taking the lease do, in fewer round trips: the
        probe runs beside the reads of ``STORE`` and ``LEASE``; only once it passed is
        anything written (``STORE`` when absent, beside the lease's compare-and-swap);
        then the one listing this run trusts (see _known)."""
        probing = None
        if self._probe and not self._probed:
            probing = self._background().submit(self.objects.probe)
        read: tuple[bool, tuple[dict[str, Any], str] | None] | None = None
        failed: BaseException | None = None
        try:
            there = self.objects.get(STORE_KEY, 0, 1) is not None
            read = there, self._read_lease()
        except ObjectStoreError as exc:
            failed = CheckpointError(str(exc))
        except CheckpointError as exc:
            failed = exc
        if probing is not None:
            try:
                probing.result()
            except ObjectStoreError as exc:
                raise CheckpointError(str(exc)) from None
            self._probed = True
        if failed is not None or read is None:
            raise failed or CheckpointError(f"cannot read {self.location}")
        making = None if read[0] else self._background().submit(self._make_store)
        try:
            with self._mutex:
                self._acquire(read[1], read=False)
        finally:
            if making is not None:
                making.exception()  # ended (it raises nothing: see _make_store)
        try:
            self._known = self._survey()
        except BaseException:
            self._release()
            raise

    def _make_store(self) -> None:
        body = json.dumps({"format": 1, "holds": "sealstream checkpoints",
                           "pipeline": self.pipeline}).encode()
        with contextlib.suppress(ObjectStoreError):  # a concurrent creator's (as before)
            self.objects.create(STORE_KEY, body)

    def _survey(self) -> Known:
        """The ids, names of published checkpoints, step plans, deletions under way and
        the largest id ever taken, from one listing of the prefix."""
        from sealstream.checkpoint.plans import PLANS_DIR, parse_plan_name

        keys = self._keys("")
        deleting = {k[len(DELETING):] for k in keys if k.startswith(DELETING)}
        ids: dict[int, list[str]] = {}
        plans: set[int] = set()
        most = 0
        trash: dict[str, list[str]] = {d: [] for d in deleting}
        for key in keys:
            head, slash, rest = key.partition("/")
            if not slash:
                continue
            cid = _parse_id(head)
            if cid is not None:
                most = max(most, cid)
                if head in deleting:
                    trash[head].append(key)
                else:
                    ids.setdefault(cid, []).append(key)
            elif head == REJECTED:
                most = max(most, _parse_id(rest[: len(PREFIX) + 12]) or 0)
            elif key.startswith(DELETING):
                most = max(most, _parse_id(rest) or 0)
            elif head == PLANS_DIR and (step := parse_plan_name(rest)) is not None:
                plans.add(step)
        known = Known(set(ids), plans, most)
        for cid, names in ids.items():
            if f"{checkpoint_dirname(cid)}/{MANIFEST_NAME}" in names:  # published
                known.set_names(cid, [k for k in names
                                      if not k.rsplit("/", 1)[-1].startswith(".")])
        self._trash = trash
        return known

    # ------------------------------------------------------------ the lease
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lease; LockHeldError naming the holder when a live run holds it."""
        try:
            self._start()
        except BaseException:
            self.close()  # a refused start leaves no thread (its probe's) behind
            raise
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name="sealstream-lease")
        self._thread.start()
        try:
            yield
            self._settle()  # the deletions behind end while the lease is held
            self._raise_behind()
        finally:
            self._settle()
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._release()

    def _release(self) -> None:
        self._known = None
        self._trash = None
        self._behind_failed = None
        self.close()
        self._release_lease()

    def close(self) -> None:
        self._settle()
        for pool in (self._pool, self._bg):
            if pool is not None:
                pool.shutdown(wait=True)
        self._pool = self._bg = None
