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

import contextlib
import errno
import fcntl
import json
import os
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
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.stores.base import (
    _PART_FILE,
    PREFIX,
    REJECTED,
    TRASH,
    CheckpointStore,
    _parse_id,
    checkpoint_dirname,
)
from sealstream.errors import CheckpointError, LockHeldError

LOCK_NAME = "LOCK"


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


def _exists_at(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


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

    # ------------------------------------------------------------ shared blobs
    def write_shared(self, rel: str, data: bytes) -> None:
        target = self._path(rel)
        if target is None or len(Path(rel).parts) != 2:
            raise CheckpointError(f"{rel!r} is not a shared blob name")
        d = target.parent
        try:
            if target.exists():
                return  # content-addressed: already written
            if not d.is_dir():
                d.mkdir(mode=0o700, exist_ok=True)
                fsync_dir(self.root)
            tmp = d / f".{target.name}.{os.getpid()}.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a crashed writer's
            fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            with os.fdopen(fd, "wb") as f:
                f.write(self._seal(rel, data))
                fsync_file(f)
            try:
                os.link(tmp, target)  # never overwritten
            except FileExistsError:
                pass  # another writer's: the same content
            os.unlink(tmp)
            fsync_dir(d)
        except OSError as exc:
            raise CheckpointError(f"cannot write {rel} in {self.root}: {os_reason(exc)}"
                                  ) from None

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
