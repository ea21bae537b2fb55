"""File-system primitives shared by the checkpoint stores and the sinks.

This module sits below everything else in the package (it imports nothing from
sealstream): durable writes, and opening files that a run trusts without being
fooled by what someone else planted there.

Guarantees, on a POSIX filesystem that honours ``fsync``:

* :func:`fsync_file` / :func:`fsync_dir` return only once the file's data, or
  the directory's entries (names created, renamed or removed in it), are on
  stable storage.
* :func:`open_no_follow` never follows a symbolic link in the last component of
  the name (``O_NOFOLLOW``): a link planted where a lock or checkpoint file
  belongs makes it fail with ``ELOOP`` instead of writing through the link.
  Directory components may be links (a store reached through a linked directory
  is the same store).
* :func:`read_regular` reads only a regular file (never a FIFO, a device or a
  link: a FIFO is opened without blocking and refused), and at most ``limit + 1``
  bytes, so a caller that knows the recorded size sees "longer than recorded"
  without reading an unbounded file.
* :func:`private_dir_problem` says why a directory is not private to the user
  running (owned by another user, or writable by group or others), as ssh does
  with its key directory.

These helpers raise :class:`OSError` unchanged; callers turn it into their own
error with :func:`os_reason` (``"[Errno 28] No space left on device"``).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

__all__ = [
    "NotRegularFileError",
    "fsync_dir",
    "fsync_file",
    "open_no_follow",
    "os_reason",
    "private_dir_problem",
    "read_regular",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class NotRegularFileError(OSError):
    """A name that should hold a regular file holds something else (a FIFO, a
    device, a directory, a symbolic link)."""


def os_reason(exc: OSError) -> str:
    """The OS reason of ``exc`` without the file name, e.g. ``[Errno 13] Permission denied``."""
    if isinstance(exc, NotRegularFileError):
        return str(exc.strerror or "not a regular file")
    if exc.errno == errno.ELOOP:
        return "it is a symbolic link (refused: a link there could point anywhere)"
    if exc.errno is not None and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return str(exc) or type(exc).__name__


def fsync_file(f: BinaryIO | int) -> None:
    """Flush ``f`` (a binary file object or a raw descriptor) and fsync it."""
    if isinstance(f, int):
        os.fsync(f)
        return
    f.flush()
    os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Fsync the directory ``path`` so that entries created/renamed/removed in it persist.

    Platforms that cannot open a directory (Windows) are skipped silently.
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (IsADirectoryError, PermissionError):  # pragma: no cover - not POSIX
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_no_follow(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symbolic link as the last component (``ELOOP``)
    and, for an existing name, anything but a regular file
    (:class:`NotRegularFileError`). Add ``os.O_CREAT | os.O_EXCL`` to create only."""
    fd = os.open(os.fspath(path), flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", os.fspath(path))
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path``: all of them, or at most ``limit + 1``
    (one more than a caller expects, so that a longer file is visible as longer).

    Raises FileNotFoundError, :class:`NotRegularFileError` (FIFO, device, directory),
    ``OSError(ELOOP)`` for a symbolic link, or whatever reading raises."""
    fd = open_no_follow(path, os.O_RDONLY)
    try:
        if limit is None:
            limit = os.fstat(fd).st_size
        want = max(0, limit) + 1
        parts: list[bytes] = []
        while want > 0:
            chunk = os.read(fd, min(want, 1 << 24))
            if not chunk:
                break
            parts.append(chunk)
            want -= len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def private_dir_problem(path: str | os.PathLike[str]) -> str | None:
    """Why directory ``path`` is not private to this user, or None when it is: it
    must be owned by the effective user and not writable by its group or others.
    (A directory that does not exist is no problem here.)"""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return (f"is owned by another user (uid {st.st_uid}, not {os.geteuid()}); "
                "use a directory of your own, or chown it to yourself")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); run chmod go-w on it")
    return None
