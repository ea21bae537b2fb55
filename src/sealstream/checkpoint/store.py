"""The local-directory checkpoint store.

Layout of a checkpoint directory ``DIR``::

    DIR/LOCK                          the run lock (holder's pid, host, start time)
    DIR/cp-000000000012/state.arrow   window state + watermark (Arrow IPC, zstd)
    DIR/cp-000000000012/receipts.json emission receipts
    DIR/cp-000000000012/suppress.arrow (only when needed) outputs not to repeat
    DIR/cp-000000000012/MANIFEST.json written last, published by one rename
    DIR/rejected/cp-000000000013-<reason>-<time>/  checkpoints moved aside

Files are created only if absent (never overwritten in place), fsynced, and the
manifest is published last by renaming a fully written, fsynced temporary
file, followed by an fsync of the directory. A checkpoint directory without
``MANIFEST.json`` is a partial checkpoint (its writer crashed). Directories
are created 0700 and files 0600.

Nothing planted is followed or trusted: ``LOCK`` and every checkpoint file are
opened ``O_NOFOLLOW`` (created ``O_EXCL``), only regular files are read, and at most
their recorded size (:mod:`sealstream._fs`); a run refuses a checkpoint directory
owned by another user or writable by group or others. Reading a checkpoint's
evidence, nothing its manifest names is opened before the manifest passed: bounded
in size and depth, signature verified when the key is given, every name one the
writer produces (:func:`~sealstream.checkpoint.manifest.path_problem`).

Encryption at rest: when ``SEALSTREAM_ENCRYPTION_KEY`` (or ``_KEY_FILE``) is set,
every file of a checkpoint, the manifest included, is written as an AES-256-GCM
envelope (:mod:`sealstream.checkpoint.crypto`) bound to its path, and decrypted
on read: :meth:`read`, :meth:`read_manifest` and :meth:`evidence` return and
judge plaintext, so the engine and the guard are unchanged. The SHA-256 and
sizes in the manifest are those of the plaintext (GCM authenticates the
ciphertext). With a key set, a plaintext checkpoint is refused (fail closed).
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sealstream._fs import (
    fsync_dir,
    fsync_file,
    open_no_follow,
    os_reason,
    private_dir_problem,
    read_regular,
)
from sealstream.checkpoint import crypto
from sealstream.checkpoint.guard import UNCHECKED, Evidence, FileFact
from sealstream.checkpoint.manifest import (
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    RECEIPTS_NAME,
    load_json,
    path_problem,
    signature_ok,
)
from sealstream.errors import CheckpointError, LockHeldError
from sealstream.state.codec import WATERMARK_META, read_metadata, schema_problem

PREFIX = "cp-"
LOCK_NAME = "LOCK"
REJECTED = "rejected"
TRASH = ".deleting-"


def checkpoint_dirname(cid: int) -> str:
    return f"{PREFIX}{cid:012d}"


def _parse_id(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    digits = name[len(PREFIX):]
    return int(digits) if digits.isdigit() else None


@contextlib.contextmanager
def hold_file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600) for a run; the holder's
    pid, host and start time are written into it. The kernel releases the lock when
    the process dies, however it dies. Raises LockHeldError naming the holder, or
    CheckpointError when the file cannot be opened: among others when ``path`` is a
    symbolic link (never followed: its target would be truncated), not a regular
    file, or a file with other hard links. ``what`` names the lock."""
    try:
        fd = open_no_follow(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise CheckpointError(f"cannot lock {what}: {path} {_refusal(exc)}") from None
    if os.fstat(fd).st_nlink > 1:
        os.close(fd)
        raise CheckpointError(f"cannot lock {what}: {path} has other hard links (it is "
                              "someone else's file too); remove it and run again")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockHeldError(f"{what} is locked by another run ({holder})") from None
    info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _refusal(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (refused: remove it and run again)"
    return f"cannot be opened: {os_reason(exc)}"


def file_lock_holder(path: Path) -> str | None:
    """The holder written by :func:`hold_file_lock` while it holds ``path``, else None
    (also when ``path`` is not a regular file: no run could hold it)."""
    try:
        fd = open_no_follow(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def check_private_dir(path: Path, what: str) -> None:
    """CheckpointError unless directory ``path`` is owned by this user and writable by
    nobody else (anyone who can write there can plant links or forge checkpoints)."""
    problem = private_dir_problem(path)
    if problem is not None:
        raise CheckpointError(f"refusing {what} {path}: it {problem}")


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
        """Add file ``name`` (a state part: ``state.part-NNNN.arrow``) to checkpoint
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
        return Evidence(cid, manifest, facts, state_meta, state_error, receipts,
                        manifest_problem, schema_error=schema_error)


_ARROW_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
#: the only files a worker may add to a checkpoint (:meth:`CheckpointStore.write_part`)
_PART_FILE = re.compile(r"state\.part-[0-9]{4,}\.arrow")


def _exists_at(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
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


class LocalCheckpointStore(CheckpointStore):
    """Checkpoints as directories under ``root``."""

    def __init__(self, root: Path, encryption_key: bytes | None | object = crypto.FROM_ENV
                 ) -> None:
        """``encryption_key``: 32 bytes, None for plaintext checkpoints, or by default
        the key configured in the environment (SpecError when it is malformed)."""
        self.root = Path(root)
        self._init_key(encryption_key)

    # ------------------------------------------------------------ reading
    def exists(self) -> bool:
        return self.root.is_dir()

    def ids(self) -> list[int]:
        """Checkpoint ids present (complete or partial), oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for entry in self.root.iterdir():
            cid = _parse_id(entry.name)
            if cid is not None and entry.is_dir():
                out.append(cid)
        return sorted(out)

    def max_id_ever(self) -> int:
        """The largest id used, including checkpoints moved aside."""
        ids = self.ids()
        rej = self.root / REJECTED
        if rej.is_dir():
            for entry in rej.iterdir():
                cid = _parse_id(entry.name[: len(PREFIX) + 12])
                if cid is not None:
                    ids.append(cid)
        return max(ids, default=0)

    def path_of(self, cid: int) -> Path:
        return self.root / checkpoint_dirname(cid)

    def _path(self, rel: str) -> Path | None:
        """The file of blob ``rel``, or None for a name outside the store (absolute,
        with ``..``): never opened."""
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            return None
        return self.root / rel

    def _raw(self, rel: str) -> bytes | None:
        return self._read(rel, None)

    def _bounded(self, rel: str, limit: int) -> bytes | None:
        return self._read(rel, limit)

    def _read(self, rel: str, limit: int | None) -> bytes | None:
        path = self._path(rel)
        if path is None:
            return None
        try:
            return read_regular(path, limit)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if limit is not None:
                raise  # the evidence records it (a FIFO, a link, a device)
            raise CheckpointError(f"cannot read {path}: {_refusal(exc)}") from None

    def _names(self, cid: int) -> list[str]:
        d = self.path_of(cid)
        if not d.is_dir():
            return []
        return sorted(f"{d.name}/{f.name}" for f in d.iterdir()
                      if f.is_file() and not f.name.startswith("."))

    def has_manifest(self, cid: int) -> bool:
        return (self.path_of(cid) / MANIFEST_NAME).exists()

    # ------------------------------------------------------------ writing
    def ensure_root(self) -> None:
        """Create the directory (0700) if needed; CheckpointError when it cannot be
        created, or exists but is owned by another user or writable by group or
        others (see :func:`check_private_dir`)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create checkpoint directory {self.root}: {os_reason(exc)}"
            ) from None
        check_private_dir(self.root, "checkpoint directory")

    direct_parts = True

    def claim(self, cid: int) -> None:
        """Create ``cp-<cid>/`` (only if absent, fsynced): workers may add parts to it."""
        try:
            self.path_of(cid).mkdir(mode=0o700)
            fsync_dir(self.root)
        except OSError as exc:
            raise CheckpointError(
                f"cannot write checkpoint {cid} in {self.root}: {os_reason(exc)}; "
                "the previous checkpoints are intact"
            ) from None

    def fence(self) -> str | None:
        """The holder recorded in ``LOCK`` while this process holds it (pid, host and
        start time), else None."""
        return file_lock_holder(self.root / LOCK_NAME)

    def write_part(self, cid: int, name: str, data: bytes, fence: Any) -> None:
        """See :meth:`CheckpointStore.write_part`. The worker never creates a
        checkpoint directory: it only adds an ``O_EXCL`` file to ``cp-<cid>/`` as the
        coordinator claimed it, and checkpoint ids are never reused (a partial
        checkpoint is moved aside, and ``max_id_ever`` counts it), so a worker of a
        run that lost the lock can at most add a file to its own run's partial
        checkpoint, which is judged like any crashed writer's directory. The ``LOCK``
        holder is checked first as well (the coordinator's kernel lock)."""
        if not _PART_FILE.fullmatch(name):
            raise CheckpointError(f"checkpoint {cid}: {name!r} is not a state part's name")
        if fence is not None and file_lock_holder(self.root / LOCK_NAME) != fence:
            raise LockHeldError(
                f"checkpoint directory {self.root}: the run that asked for part {name} of "
                f"checkpoint {cid} no longer holds the lock; nothing was written")
        d = self.path_of(cid)
        rel = f"{d.name}/{name}"
        try:
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise CheckpointError(
                f"cannot write {rel} in {self.root}: checkpoint {cid} is not being written "
                f"({os_reason(exc)})") from None
        try:
            if _exists_at(dfd, MANIFEST_NAME):
                raise CheckpointError(f"cannot write {rel} in {self.root}: checkpoint {cid} "
                                      "is already published")
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            with os.fdopen(fd, "wb") as f:
                f.write(self._seal(rel, data))
                fsync_file(f)
            os.fsync(dfd)
        except OSError as exc:
            raise CheckpointError(
                f"cannot write {rel} in {self.root}: {os_reason(exc)}") from None
        finally:
            os.close(dfd)

    def write_checkpoint(self, cid: int, files: dict[str, bytes], manifest: bytes,
                         crash: Any = None,
                         in_publish: Callable[[Any], None] | None = None,
                         claimed: bool = False) -> None:
        """Write ``files`` into ``cp-<cid>/`` (create-if-absent, fsynced), then publish
        the manifest atomically. ``crash`` is called with a point name between steps.
        ``claimed``: :meth:`claim` created the directory already."""
        if in_publish is not None:
            raise TypeError("a checkpoint directory has no transaction to publish in")
        d = self.path_of(cid)
        try:
            if not claimed:
                d.mkdir(mode=0o700)
                fsync_dir(self.root)
            for name, data in files.items():
                fd = open_no_follow(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                with os.fdopen(fd, "wb") as f:
                    f.write(self._seal(f"{d.name}/{name}", data))
                    fsync_file(f)
                if crash is not None:
                    crash(f"after_write_{name.split('.')[0]}")
            fsync_dir(d)
            tmp = d / f".{MANIFEST_NAME}.tmp"
            fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            with os.fdopen(fd, "wb") as f:
                f.write(self._seal(f"{d.name}/{MANIFEST_NAME}", manifest))
                fsync_file(f)
            if crash is not None:
                crash("before_manifest_publish")
            if (d / MANIFEST_NAME).exists():
                raise FileExistsError(17, "File exists", str(d / MANIFEST_NAME))
            os.rename(tmp, d / MANIFEST_NAME)
            fsync_dir(d)
        except OSError as exc:
            # our own half-written directory: nothing refers to it, and on a full disk
            # removing it gives the space back
            if not (d / MANIFEST_NAME).exists():
                shutil.rmtree(d, ignore_errors=True)
            raise CheckpointError(
                f"cannot write checkpoint {cid} in {self.root}: {os_reason(exc)}; "
                "the previous checkpoints are intact"
            ) from None

    def move_aside(self, cid: int, reason: str) -> Path | None:
        """Move checkpoint ``cid`` under ``rejected/`` (evidence is never deleted).

        Returns where it went, or None when it was already gone (a concurrent
        ``checkpoints prune`` or the job's retention moved or deleted it first).
        """
        rej = self.root / REJECTED
        if rej.exists() and not rej.is_dir():
            raise CheckpointError(f"cannot move checkpoint {cid} aside: {rej} is a file, "
                                  "not a directory (move it away and run again)")
        rej.mkdir(exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        dest = rej / f"{checkpoint_dirname(cid)}-{reason}-{stamp}"
        n = 1
        while dest.exists():
            n += 1
            dest = rej / f"{checkpoint_dirname(cid)}-{reason}-{stamp}-{n}"
        try:
            os.rename(self.path_of(cid), dest)
        except FileNotFoundError:
            return None
        fsync_dir(rej)
        fsync_dir(self.root)
        return dest

    def delete(self, cid: int) -> None:
        """Remove a verified-and-superseded checkpoint (retention only).

        The directory is first renamed out of the ``cp-*`` namespace in one atomic
        step, so a crash mid-deletion never leaves a half-deleted checkpoint.
        """
        trash = self.root / f"{TRASH}{checkpoint_dirname(cid)}"
        try:
            os.rename(self.path_of(cid), trash)
        except FileNotFoundError:
            return  # already removed (e.g. by a concurrent `checkpoints prune`)
        fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def clear_trash(self) -> None:
        """Finish deletions a crash interrupted."""
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith(TRASH) and entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)

    # ------------------------------------------------------------ step plans
    def write_plan(self, step: int, data: bytes) -> None:
        from sealstream.checkpoint.plans import PLANS_DIR, plan_name

        rel = plan_name(step)
        d = self.root / PLANS_DIR
        try:
            if not d.is_dir():
                d.mkdir(mode=0o700, exist_ok=True)
                fsync_dir(self.root)
            tmp = d / f".step-{step:012d}.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a crashed writer's
            fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            with os.fdopen(fd, "wb") as f:
                f.write(self._seal(rel, data))
                fsync_file(f)
            os.link(tmp, self.root / rel)  # fails when present: never overwritten
            os.unlink(tmp)
            fsync_dir(d)
        except OSError as exc:
            raise CheckpointError(
                f"cannot write the plan of step {step} in {self.root}: {os_reason(exc)}"
            ) from None

    def plan_steps(self) -> list[int]:
        from sealstream.checkpoint.plans import PLANS_DIR, parse_plan_name

        d = self.root / PLANS_DIR
        if not d.is_dir():
            return []
        steps = [parse_plan_name(e.name) for e in d.iterdir() if not e.name.startswith(".")]
        return sorted(s for s in steps if s is not None)

    def delete_plans(self, steps: list[int]) -> None:
        from sealstream.checkpoint.plans import PLANS_DIR, plan_name

        for step in steps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / plan_name(step))
        if steps and (self.root / PLANS_DIR).is_dir():
            fsync_dir(self.root / PLANS_DIR)

    def move_plan_aside(self, step: int, reason: str) -> None:
        from sealstream.checkpoint.plans import plan_name

        rej = self.root / REJECTED
        rej.mkdir(exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        try:
            os.rename(self.root / plan_name(step),
                      rej / f"plan-step-{step:012d}-{reason}-{stamp}.json")
        except FileNotFoundError:
            return
        fsync_dir(rej)

    # ------------------------------------------------------------ lock
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's run lock; raise LockHeldError naming the holder."""
        self.ensure_root()
        with hold_file_lock(self.root / LOCK_NAME, f"checkpoint directory {self.root}"):
            yield

    def is_locked(self) -> str | None:
        """The holder's description if a run holds the lock now, else None."""
        return file_lock_holder(self.root / LOCK_NAME)
