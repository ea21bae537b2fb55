"""File identity for followed files: which file (device, inode) a partition reads,
where a renamed file went, and the one-line refusals of truncation and
copy-truncate rotation (docs/live.md, "Rotation and truncation").

A followed partition is a *sequence of files*: the file at its path when it was first
opened, then, after each rotation (the file renamed away and a new file created at
the path), the new one. Positions go on across the files: the new file's first line
has the position after the old file's last one (its ``base``). Each saved position
records, besides the reader's own identity (consumed bytes, hashes), the device and
inode of the file it belongs to, its ``base``, and the files the partition has read
to their end (``retired``), so that a restart knows which file a position belongs to
and never takes a rotated file that still matches the glob as a new partition.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import SourceChangedError, SourceError

FileId = tuple[int, int]
"""``(st_dev, st_ino)``."""

#: the identity keys a followed partition adds to its reader's position identity
OWN_KEYS = ("dev", "ino", "base", "retired", "plan")
#: at most this many files read to their end are remembered per partition
MAX_RETIRED = 256
#: the first bytes compared to recognise a file read before (inode numbers are reused)
HEAD_BYTES = 4096


def file_id(st: os.stat_result) -> FileId:
    return (st.st_dev, st.st_ino)


def head_digest(fd: int, n: int) -> str:
    """SHA-256 of the first ``n`` bytes of the open file ``fd``."""
    return hashlib.sha256(os.pread(fd, n, 0) if n > 0 else b"").hexdigest()


def head_digest_at(path: Path, n: int) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return head_digest(fd, n)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Retired:
    """A file a partition read to its end (then followed the rotation): its identity
    and the digest of its first ``n`` bytes (so a reused inode is not mistaken for it)."""

    dev: int
    ino: int
    n: int
    sha256: str

    def to_json(self) -> list[Any]:
        return [self.dev, self.ino, self.n, self.sha256]

    @classmethod
    def from_json(cls, name: str, data: Any) -> Retired:
        if (not isinstance(data, list) or len(data) != 4
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in data[:3])
                or not isinstance(data[3], str)):
            raise SourceError(f"partition {name!r}: the checkpoint's record of its rotated "
                              f"files is malformed ({str(data)[:80]!r})")
        return cls(data[0], data[1], data[2], data[3])


def own_identity(name: str, identity: dict[str, Any]
                 ) -> tuple[dict[str, Any], FileId | None, int, list[Retired]]:
    """Split a saved identity into the reader's part and the partition's own: the
    file's id (None: a position saved before files were tracked), ``base``, retired."""
    reader = {k: v for k, v in identity.items() if k not in OWN_KEYS}
    dev, ino, base = identity.get("dev"), identity.get("ino"), identity.get("base", 0)
    retired = identity.get("retired", [])
    ints = [x for x in (dev, ino, base) if x is not None]
    if (not all(isinstance(x, int) and not isinstance(x, bool) for x in ints)
            or (dev is None) != (ino is None) or not isinstance(retired, list)
            or not isinstance(base, int) or base < 0):
        raise SourceError(f"partition {name!r}: the checkpoint's file identity is malformed")
    fid = (dev, ino) if isinstance(dev, int) and isinstance(ino, int) else None
    return reader, fid, base, [Retired.from_json(name, r) for r in retired]


@dataclass
class FileRegistry:
    """The files the partitions of one source read now or have read to their end: a
    file found by discovery that is one of them is not a new partition (a rotated
    ``app.log.1`` still matching ``*.log*``), and a partition never moves on to a
    file another partition reads."""

    reading: dict[FileId, str] = field(default_factory=dict)
    retired: dict[FileId, Retired] = field(default_factory=dict)
    #: partition -> (its file's path, n, digest of the first n bytes it has read),
    #: once it has read a line of that file: a new file starting so is a copy
    heads: dict[str, tuple[Path, int, str]] = field(default_factory=dict)

    def read_by(self, fid: FileId, name: str) -> None:
        for k in [k for k, v in self.reading.items() if v == name]:
            del self.reading[k]
        self.reading[fid] = name

    def retire(self, r: Retired) -> None:
        self.retired[(r.dev, r.ino)] = r

    def owner(self, path: Path, st: os.stat_result) -> str | None:
        """The partition that reads or read the file at ``path`` (None: no one)."""
        fid = file_id(st)
        if fid in self.reading:
            return self.reading[fid]
        r = self.retired.get(fid)
        if r is not None and st.st_size >= r.n and head_digest_at(path, r.n) == r.sha256:
            return "(rotated)"
        return None


    def copy_of(self, path: Path, st: os.stat_result) -> tuple[str, Path] | None:
        """The partition (and its file) whose read bytes the new file ``path`` starts
        with: a copy of it (``copytruncate``, or a backup inside the glob)."""
        for name, (at, n, sha) in self.heads.items():
            if st.st_size >= n and head_digest_at(path, n) == sha:
                return name, at
        return None


def copy_error(name: str, at: Path, copy: Path) -> SourceChangedError:
    return SourceChangedError(
        f"partition {name!r}: {str(copy)!r} appeared as a copy of its file {str(at)!r} (it "
        "starts with the bytes the run read first); reading it would count those lines "
        "twice. A copy-truncate rotation cannot be followed exactly: lines written "
        "between the copy and the truncation may be lost to everyone - use create-mode "
        "rotation (logrotate 'create', not 'copytruncate'); otherwise keep copies out of "
        "the source's paths. What was committed stays committed")


def locate(directory: Path, fid: FileId) -> Path | None:
    """The path in ``directory`` naming the file ``fid`` (a rotated file's new name)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    for e in sorted(entries, key=lambda e: e.name):
        try:
            if e.inode() == fid[1] and e.is_file(follow_symlinks=False) \
                    and e.stat(follow_symlinks=False).st_dev == fid[0]:
                return Path(e.path)
        except OSError:
            continue
    return None


def truncated_error(name: str, path: Path, fid: FileId, offset: int, byte: int,
                    size: int, head: tuple[int, str] | None, rewritten: bool
                    ) -> SourceChangedError:
    """The one line of a followed file cut short (or cut and written again) while the
    run reads it: the partition, its file, the read position and the new size; a
    copy-truncate rotation when a copy of the consumed bytes sits beside it."""
    where = "" if name == str(path) else f" ({str(path)!r})"
    copy = _find_copy(path, fid, head)
    what = ("was truncated and written again" if rewritten else "was truncated")
    if copy is not None:
        return SourceChangedError(
            f"partition {name!r}{where}: copy-truncate rotation ({str(path)!r} copied to "
            f"{str(copy)!r}, then truncated to {size} bytes) while the run had read it to "
            f"line offset {offset} (byte {byte}); it cannot be followed exactly: lines "
            "written between the copy and the truncation may be lost to everyone - use "
            "create-mode rotation (logrotate 'create', not 'copytruncate'); what was "
            "committed stays committed")
    return SourceChangedError(
        f"partition {name!r}{where} {what} while the run read it: now {size} bytes, but "
        f"the run had read it to line offset {offset} (byte {byte}); the lines it held are "
        "gone (a copytruncate rotation cannot be followed exactly: use create-mode "
        "rotation); what was committed stays committed - restore the file, or replay "
        "into an isolated destination")


def _find_copy(path: Path, fid: FileId, head: tuple[int, str] | None) -> Path | None:
    """Another file beside ``path`` starting with the bytes the run consumed first."""
    if head is None or head[0] <= 0:
        return None
    n, sha = head
    try:
        entries = sorted(os.scandir(path.parent), key=lambda e: e.name)
    except OSError:
        return None
    for e in entries:
        try:
            if not e.is_file(follow_symlinks=False) or e.inode() == fid[1]:
                continue
            if e.stat(follow_symlinks=False).st_size < n:
                continue
        except OSError:
            continue
        if head_digest_at(Path(e.path), n) == sha:
            return Path(e.path)
    return None


__all__ = ["FileId", "FileRegistry", "Retired", "copy_error", "file_id", "locate",
           "own_identity", "truncated_error"]
