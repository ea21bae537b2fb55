"""The checkpoint store contract, and what every store shares: reading, decryption
and the guard's evidence (:class:`CheckpointStore`), the names of checkpoints.

A store lays a checkpoint out as blobs named ``cp-<12 digits>/<file>``, the same
names whatever holds them (directory, database, object store), so manifests and
the encryption's associated data do not depend on the store.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sealstream._fs import os_reason
from sealstream.checkpoint import crypto, log_segments
from sealstream.checkpoint.emission_log import LEAVES_KEY
from sealstream.checkpoint.guard import UNCHECKED, Evidence, FileFact
from sealstream.checkpoint.manifest import (
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    RECEIPTS_NAME,
    load_json,
    path_problem,
    signature_ok,
)
from sealstream.errors import CheckpointError
from sealstream.state.codec import WATERMARK_META, read_metadata, schema_problem

PREFIX = "cp-"
REJECTED = "rejected"
TRASH = ".deleting-"


def checkpoint_dirname(cid: int) -> str:
    return f"{PREFIX}{cid:012d}"


def _parse_id(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    digits = name[len(PREFIX):]
    return int(digits) if digits.isdigit() else None




class CheckpointStore(abc.ABC):
    """What the engine, the CLI and the guard need of a checkpoint store.

    A checkpoint ``cid`` is a set of named blobs: ``cp-<cid>/state.arrow``,
    ``cp-<cid>/receipts.json``, maybe ``cp-<cid>/suppress.arrow`` and, published
    last and atomically, ``cp-<cid>/MANIFEST.json``. For the local-directory
    store the names are paths under ``root``; for other stores they are opaque
    relative names (the same strings, so manifests and the encryption's
    associated data do not depend on the store). Blobs are created only if absent
    and never overwritten; a checkpoint without its manifest is partial.
    Checkpoints moved aside are kept as evidence, never deleted.

    Subclasses implement the primitives (``exists``, ``ids``, ``max_id_ever``,
    ``_raw``, ``_names``, the writing methods and the lock); reading, decryption
    and the guard's evidence are shared.
    """

    #: where the store lives, for messages (a directory, or a database file)
    root: Path
    encryption_key: bytes | None

    def _init_key(self, encryption_key: bytes | None | object) -> None:
        if encryption_key is crypto.FROM_ENV:
            self.encryption_key = crypto.encryption_key()
        elif encryption_key is None or isinstance(encryption_key, bytes):
            if encryption_key is not None and len(encryption_key) != crypto.KEY_BYTES:
                raise ValueError("the encryption key must be 32 bytes")
            self.encryption_key = encryption_key
        else:
            raise TypeError("encryption_key must be bytes or None")

    @property
    def location(self) -> str:
        """The store's location for messages and reports (never a password)."""
        return str(self.root)

    @property
    def encrypted(self) -> bool:
        """Whether this store writes (and requires) encrypted checkpoints."""
        return self.encryption_key is not None

    def _open(self, rel: str, data: bytes) -> bytes:
        """The plaintext of the blob ``rel``; raises crypto.EnvelopeError."""
        if self.encryption_key is None and not crypto.is_envelope(data):
            return data
        return crypto.decrypt(self.encryption_key, data, rel)

    def _seal(self, rel: str, data: bytes) -> bytes:
        if self.encryption_key is None:
            return data
        return crypto.encrypt(self.encryption_key, data, rel)

    # ------------------------------------------------------------ step plans
    # The write-ahead records of live runs (sealstream.checkpoint.plans): blobs named
    # ``plans/step-N.json``, outside every checkpoint, sealed like checkpoint blobs.
    def write_plan(self, step: int, data: bytes) -> None:
        """Write step ``step``'s record durably (create-if-absent) before returning;
        CheckpointError when it cannot (a record already there is an error too)."""
        raise CheckpointError(f"{self.location}: this checkpoint store cannot hold step plans")

    def plan_steps(self) -> list[int]:
        """The steps whose records are stored, ascending."""
        return []

    def read_plan(self, step: int) -> bytes | None:
        """Step ``step``'s record (plaintext), None when absent or unreadable."""
        from sealstream.checkpoint.plans import plan_name

        try:
            return self.read(plan_name(step))
        except (OSError, CheckpointError):
            return None

    def delete_plans(self, steps: list[int]) -> None:  # noqa: B027 - no plans: nothing
        """Remove the records of ``steps`` (retention only)."""

    def move_plan_aside(self, step: int, reason: str) -> None:  # noqa: B027 - as above
        """Keep a rejected record as evidence, out of :meth:`plan_steps`."""

    # ------------------------------------------------------------ shared blobs
    # Immutable blobs outside every checkpoint, named by their content's SHA-256 (the
    # emission log's segments, sealstream.checkpoint.log_segments): many checkpoints
    # name one, none owns it, retention never deletes it. Read with :meth:`read`.
    def write_shared(self, rel: str, data: bytes) -> None:
        """Write blob ``rel`` durably, create-if-absent, before returning. One already
        there is left as it is: its name is its content's hash, and every reader checks
        that hash. CheckpointError when it cannot be written."""
        raise CheckpointError(f"{self.location}: this checkpoint store cannot hold shared "
                              "blobs (emission log segments)")

    # ------------------------------------------------------------ primitives
    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the store has been created."""

    @abc.abstractmethod
    def ids(self) -> list[int]:
        """Checkpoint ids present (complete or partial), oldest first."""

    @abc.abstractmethod
    def max_id_ever(self) -> int:
        """The largest id used, including checkpoints moved aside."""

    @abc.abstractmethod
    def _raw(self, rel: str) -> bytes | None:
        """The stored bytes of blob ``rel``, None when absent; CheckpointError when
        the store cannot be read."""

    @abc.abstractmethod
    def _names(self, cid: int) -> list[str]:
        """The names of the blobs stored for checkpoint ``cid`` (manifest included)."""

    @abc.abstractmethod
    def ensure_root(self) -> None:
        """Create the store if needed."""

    #: whether :meth:`write_checkpoint` can run ``in_publish`` in its publishing
    #: transaction (database stores)
    transactional: bool = False

    @abc.abstractmethod
    def write_checkpoint(self, cid: int, files: dict[str, bytes], manifest: bytes,
                         crash: Any = None,
                         in_publish: Callable[[Any], None] | None = None,
                         claimed: bool = False) -> None:
        """Write ``files`` of checkpoint ``cid`` (create-if-absent), then publish the
        manifest atomically; CheckpointError when it cannot (the previous checkpoints
        are intact). ``crash`` is called with a point name between steps.

        ``in_publish(connection)``, only for a :attr:`transactional` store, runs inside
        the transaction that publishes the manifest, so what it writes in the same
        database becomes durable exactly when the checkpoint does.

        ``claimed``: the id was taken by :meth:`claim` (and other files of it may have
        been written by :meth:`write_part`); otherwise it is claimed here."""

    # ------------------------------------------------------------ direct parts
    #: whether other processes (scale-out workers) may write files of a claimed
    #: checkpoint themselves (:meth:`claim`, :meth:`fence`, :meth:`write_part`)
    direct_parts: bool = False

    def claim(self, cid: int) -> None:
        """Take checkpoint id ``cid`` (create-if-absent, durable, fenced like every
        write of a locked store) so that :meth:`write_part` may add files to it;
        CheckpointError when it cannot."""
        raise NotImplementedError(f"{type(self).__name__} has no direct parts")

    def fence(self) -> Any:
        """What a worker needs to check that this run still holds the job's lock
        (JSON-like, no secret): given back to :meth:`write_part`."""
        return None

    def write_part(self, cid: int, name: str, data: bytes, fence: Any) -> None:
        """Add file ``name`` (a state part: ``state.part-NNNN.arrow``, or the epoch's
        result ids ``receipt-ids.arrow`` built by a worker) to checkpoint
        ``cid``, claimed and not yet published, from another process: create-if-absent,
        durable before it returns, and only while the run whose :meth:`fence` this is
        still holds the job's lock (LockHeldError otherwise, nothing written);
        CheckpointError when the checkpoint is not one being written."""
        raise NotImplementedError(f"{type(self).__name__} has no direct parts")

    @abc.abstractmethod
    def move_aside(self, cid: int, reason: str) -> object | None:
        """Keep checkpoint ``cid`` as rejected evidence, out of ``ids()``; return where
        it went, or None when it was already gone."""

    @abc.abstractmethod
    def delete(self, cid: int) -> None:
        """Remove a verified-and-superseded checkpoint atomically (retention only)."""

    @abc.abstractmethod
    def clear_trash(self) -> None:
        """Finish deletions a crash interrupted."""

    @abc.abstractmethod
    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the run lock; raise LockHeldError naming the holder."""

    @abc.abstractmethod
    def is_locked(self) -> str | None:
        """The holder's description if a run holds the lock now, else None."""

    def close(self) -> None:  # noqa: B027 - a no-op for stores without connections
        """Release connections (the store can still be used: they reopen)."""

    def check_lock(self) -> None:  # noqa: B027 - a no-op where a lock cannot be lost
        """LockHeldError when this store, locked for a run, no longer holds the job's
        lock. A kernel lock (directory, SQLite) lasts as long as the process; a
        PostgreSQL session lock can be lost while the run goes on."""

    # ------------------------------------------------------------ shared reading
    def _bounded(self, rel: str, limit: int) -> bytes | None:
        """At most ``limit + 1`` stored bytes of blob ``rel`` (None when absent), so
        that a blob longer than ``limit`` shows as longer without being read whole.
        Raises NotRegularFileError / OSError for a name that holds no regular file
        (directory stores); CheckpointError when the store cannot be read."""
        raw = self._raw(rel)
        return None if raw is None else raw[: limit + 1]

    def has_manifest(self, cid: int) -> bool:
        """Whether checkpoint ``cid``'s manifest is stored (readable or not)."""
        return self._raw(f"{checkpoint_dirname(cid)}/{MANIFEST_NAME}") is not None

    def read_manifest_bytes(self, cid: int) -> bytes:
        """The manifest's (decrypted) bytes. Raises OSError (FileNotFoundError when
        absent, EFBIG when over the size bound) or crypto.EnvelopeError (a
        CheckpointError naming the reason)."""
        rel = f"{checkpoint_dirname(cid)}/{MANIFEST_NAME}"
        raw = self._bounded(rel, _MANIFEST_LIMIT)
        if raw is None:
            raise FileNotFoundError(2, "No such checkpoint manifest", rel)
        if len(raw) > _MANIFEST_LIMIT:
            raise OSError(errno.EFBIG, f"manifest is larger than {MAX_JSON_BYTES} bytes", rel)
        return self._open(rel, raw)

    def read_manifest(self, cid: int) -> dict[str, Any] | None:
        """The parsed manifest, unverified, or None when missing, unreadable, over
        the size or nesting bounds, or not decryptable (the guard's verdict says why)."""
        try:
            doc = load_json(self.read_manifest_bytes(cid), "manifest")
        except (OSError, ValueError, crypto.EnvelopeError):
            return None
        return doc if isinstance(doc, dict) else None

    def verified_parent(self, cid: int, key: bytes | None) -> dict[str, Any] | None:
        """The yardstick for ``cid``'s coherence (watermark and positions must not go
        back): its parent's manifest when that one's signature verifies; else, when
        the parent is damaged or gone, the newest older checkpoint whose manifest
        verifies (an ancestor: recovery moves rejected checkpoints aside, so the
        checkpoints kept form one chain); when ``cid`` names no parent, that newest
        older checkpoint too. None when there is none.

        Only an authentic manifest is a yardstick: a tampered parent must not make
        an intact child look inconsistent, nor spare a child that went back.
        """
        doc = self.read_manifest(cid)
        if doc is None:
            return None
        named: int | None = None
        if doc.get("parent") is not None:
            if isinstance(doc.get("parent"), bool) or not isinstance(doc.get("parent"), int):
                return None  # the guard rejects such a parent itself
            named = int(doc["parent"])
        # no parent: only a chain's first checkpoint has none, and then no older one is
        # kept (--start-over moves them aside); one that is kept is its yardstick still,
        # so dropping the parent does not hide positions or a watermark that went back
        older = sorted((i for i in self.ids() if i < cid and i != named), reverse=True)
        for pid in ([named] if named is not None else []) + older:
            parent = self.read_manifest(pid)
            if parent is not None and signature_ok(parent, key)[0]:
                return parent
        return None

    def read(self, relpath: str) -> bytes:
        """A checkpoint blob's plaintext. Raises OSError (FileNotFoundError when
        absent), or crypto.EnvelopeError (a CheckpointError)."""
        raw = self._raw(relpath)
        if raw is None:
            raise FileNotFoundError(2, "No such checkpoint file", relpath)
        return self._open(relpath, raw)

    def files_of(self, cid: int) -> list[str]:
        """Names of every blob the checkpoint's validity depends on (a name its
        manifest gives that no writer produces is not one of them)."""
        rel: set[str] = set(self._names(cid))
        doc = self.read_manifest(cid)
        if doc is not None and isinstance(doc.get("files"), dict):
            for role, entry in doc["files"].items():
                if isinstance(entry, dict) and isinstance(entry.get("path"), str) \
                        and path_problem(cid, str(role), entry["path"]) is None:
                    rel.add(entry["path"])
        return sorted(rel)

    def shared_files_of(self, cid: int) -> list[str]:
        """The shared blobs checkpoint ``cid``'s validity depends on besides
        :meth:`files_of`: the emission log segments its receipts name (when its receipts
        file matches the manifest's hash)."""
        doc = self.read_manifest(cid)
        if doc is None or not isinstance(doc.get("files"), dict):
            return []
        entry = doc["files"].get("receipts")
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) \
                or path_problem(cid, "receipts", entry["path"]) is not None:
            return []
        try:
            data = self.read(entry["path"])
        except (OSError, CheckpointError):
            return []
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            return []
        try:
            return log_segments.names_in(load_json(data, "receipts"))
        except ValueError:
            return []

    def evidence(self, cid: int, key: bytes | None | object = UNCHECKED) -> Evidence:
        """Read everything the guard needs about checkpoint ``cid``.

        Nothing the manifest names is read before the manifest itself passed: it is
        bounded in size and nesting, and with ``key`` given (the key the guard will
        check with; None for "no key"), its signature must verify under it, or no
        file it names is read at all (``Evidence.unread`` says why). Only names a
        writer produces are read (:func:`~sealstream.checkpoint.manifest.path_problem`),
        only regular files, and at most the recorded size (plus the encryption's
        overhead and one byte, so a longer file shows as longer).
        """
        mrel = f"{checkpoint_dirname(cid)}/{MANIFEST_NAME}"
        manifest_problem: tuple[str, str] | None = None
        try:
            manifest = self._bounded(mrel, _MANIFEST_LIMIT)
        except OSError as exc:
            return Evidence(cid, None, manifest_problem=(
                "NOT_A_REGULAR_FILE", f"{mrel} cannot be opened: {os_reason(exc)}"))
        if manifest is not None and len(manifest) <= _MANIFEST_LIMIT:
            try:
                manifest = self._open(mrel, manifest)
            except crypto.EnvelopeError as exc:
                manifest_problem = (exc.reason, str(exc))
                manifest = None
        return self._evidence_from(cid, manifest, manifest_problem, key)

    def _evidence_from(self, cid: int, manifest: bytes | None,
                       manifest_problem: tuple[str, str] | None,
                       key: bytes | None | object = UNCHECKED) -> Evidence:
        facts: dict[str, FileFact] = {}
        state_meta: dict[str, Any] | None = None
        state_error: str | None = None
        schema_error: str | None = None
        receipts: dict[str, Any] | None = None
        doc = None
        if manifest is not None:
            try:
                doc = load_json(manifest, "manifest")
            except ValueError:
                doc = None
        if isinstance(doc, dict) and key is not UNCHECKED:
            assert key is None or isinstance(key, bytes)
            ok, code = signature_ok(doc, key)
            if not ok:  # a manifest that is not authentic: read nothing it names
                return Evidence(cid, manifest, manifest_problem=manifest_problem,
                                unread=code)
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict):
            for role, entry in doc["files"].items():
                if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                    continue
                rel = entry["path"]
                size = entry.get("bytes")
                if path_problem(cid, str(role), rel) is not None \
                        or isinstance(size, bool) or not isinstance(size, int) or size < 0:
                    continue  # the guard rejects the entry; never read what it names
                try:
                    raw = self._bounded(rel, size + crypto.OVERHEAD)
                except OSError as exc:
                    facts[rel] = FileFact(True, 0, "", (
                        "NOT_A_REGULAR_FILE", f"{rel} cannot be opened: {os_reason(exc)}"))
                    continue
                if raw is None:
                    facts[rel] = FileFact(False)
                    continue
                try:
                    data = self._open(rel, raw)
                except crypto.EnvelopeError as exc:
                    got = len(raw)
                    if crypto.is_envelope(raw):  # the plaintext size it would hold
                        got = max(0, got - crypto.OVERHEAD)
                    facts[rel] = FileFact(True, got, "", (exc.reason, str(exc)))
                    continue
                digest = hashlib.sha256(data).hexdigest()
                short = len(data) < size
                facts[rel] = FileFact(True, len(data), digest,
                                      whole=short and _whole(rel, data))
                if digest != entry.get("sha256"):
                    continue  # the guard reports the mismatch; never parse unverified bytes
                if rel.endswith(".arrow"):
                    problem = schema_problem(data)
                    if problem is not None and schema_error is None:
                        schema_error = f"{rel}: {problem}"
                if role == "state":
                    try:
                        meta = read_metadata(data)
                        state_meta = {"watermark": meta.get(WATERMARK_META.decode())}
                    except ValueError as exc:
                        state_error = str(exc)
                elif rel.endswith(RECEIPTS_NAME):
                    try:
                        parsed = load_json(data, "receipts")
                        receipts = parsed if isinstance(parsed, dict) else None
                    except ValueError:
                        receipts = None
        log_problem = None
        if receipts is not None and log_segments.SEGMENTS_KEY in receipts:
            try:  # the whole log: its shared segments, then the tail
                receipts = {**receipts, LEAVES_KEY: log_segments.resolve(
                    receipts, self.read_shared)[0]}
            except log_segments.SegmentError as exc:
                log_problem = (exc.code, str(exc))
        return Evidence(cid, manifest, facts, state_meta, state_error, receipts,
                        manifest_problem, schema_error=schema_error, log_problem=log_problem)

    def read_shared(self, rel: str) -> bytes | None:
        """A shared blob's plaintext (:meth:`write_shared`), None when absent or not
        readable (CheckpointError when the store cannot be read)."""
        try:
            raw = self._bounded(rel, MAX_JSON_BYTES + crypto.OVERHEAD)
        except OSError:
            return None
        if raw is None:
            return None
        try:
            return self._open(rel, raw)
        except crypto.EnvelopeError:
            return b""  # not its hash: the reader says it was altered

    def read_log(self, receipts: dict[str, Any]) -> tuple[list[Any], list[tuple[str, int]]]:
        """The whole emission log of a checkpoint whose ``receipts.json`` (already
        verified) is ``receipts``, and its segments (hash, leaf count); SegmentError
        when a segment is missing or altered."""
        return log_segments.resolve(receipts, self.read_shared)


_ARROW_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
#: the only files a worker may add to a checkpoint (:meth:`CheckpointStore.write_part`)
_PART_FILE = re.compile(r"state\.part-[0-9]{4,}\.arrow|receipt-ids\.arrow")


#: the most bytes of a manifest read (an encrypted one carries the envelope's overhead)
_MANIFEST_LIMIT = MAX_JSON_BYTES + crypto.OVERHEAD


def _whole(rel: str, data: bytes) -> bool:
    """Whether ``data`` is a complete file of the kind its name says (an Arrow IPC
    stream ends with its end-of-stream marker; JSON parses) - only looked at, never
    decoded into anything used."""
    if rel.endswith(".arrow"):
        return data.endswith(_ARROW_EOS)
    if rel.endswith(".json"):
        try:
            load_json(data)
        except ValueError:
            return False
        return True
    return False

