"""Objects as files under a directory (see :mod:`sealstream._objects`).

A key ``a/b`` is the file ``ROOT/a/b`` (directories 0700, files 0600). An object is
written to a hidden temporary file, fsynced, and published by ``os.link`` (which
fails when the name exists: create-if-absent) and an fsync of its directory, so a
reader sees it whole or not at all. A compare-and-swap holds an ``flock`` on a
side file while it compares and renames. A version is the SHA-256 of the bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from sealstream._fs import fsync_dir, fsync_file, open_no_follow, os_reason, read_regular
from sealstream._objects import (
    ObjectExistsError,
    Objects,
    ObjectStoreError,
    VersionConflictError,
)


class LocalObjects(Objects):
    """Objects under directory ``root`` (created on the first write)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ObjectStoreError(f"{self.location}: {key!r} is not an object name")
        return self.root.joinpath(*parts)

    def _fail(self, what: str, key: str, exc: OSError) -> ObjectStoreError:
        return ObjectStoreError(f"cannot {what} {self._path(key)}: {os_reason(exc)}")

    def _write_tmp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            fsync_file(f)
        return tmp

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        try:
            tmp = self._write_tmp(path, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                if self.get(key) == data:
                    return False
                raise ObjectExistsError(f"{path} exists with other bytes") from None
            finally:
                os.unlink(tmp)
            fsync_dir(path.parent)
        except ObjectStoreError:
            raise
        except OSError as exc:
            raise self._fail("create", key, exc) from None
        return True

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes | None:
        path = self._path(key)
        try:
            data = read_regular(path, None if length is None else start + length - 1)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._fail("read", key, exc) from None
        return data[start:] if length is None else data[start:start + length]

    def head(self, key: str) -> tuple[int, str] | None:
        """Size and ``<mtime ns>-<size>-<inode>`` of the file (a regular file only)."""
        path = self._path(key)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._fail("read", key, exc) from None
        if not stat.S_ISREG(st.st_mode):
            return None
        return st.st_size, f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}"

    def keys(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in files:
                if name.startswith(".") and name.endswith(".tmp") or name == ".cas-lock":
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._fail("delete", key, exc) from None
        fsync_dir(path.parent)

    @contextlib.contextmanager
    def _cas_lock(self, path: Path) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = open_no_follow(path.parent / ".cas-lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        data = self.get(key)
        return None if data is None else (data, hashlib.sha256(data).hexdigest())

    def replace(self, key: str, data: bytes, version: str | None) -> str:
        path = self._path(key)
        try:
            with self._cas_lock(path):
                now = self.read_versioned(key)
                if (now[1] if now is not None else None) != version:
                    raise VersionConflictError(f"{path} changed (another writer replaced it)")
                tmp = self._write_tmp(path, data)
                os.rename(tmp, path)
                fsync_dir(path.parent)
        except ObjectStoreError:
            raise
        except OSError as exc:
            raise self._fail("replace", key, exc) from None
        return hashlib.sha256(data).hexdigest()
