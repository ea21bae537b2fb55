"""Growing files as a live source (``follow = true``).

Each file is a partition named by its path as matched; positions are line offsets
(the same as a bounded run's). A followed file is read in whole lines only: a last
line without its newline is still being written and is left until it ends
(``read_unterminated=False``). Appended lines are read as they arrive; files that
start to match a glob are new partitions, appended to the partition order (sorted
among those discovered together).

Rotation and truncation (docs/live.md). A partition follows its file by identity
(device and inode, saved with its position): when the file is renamed (``app.log``
-> ``app.log.1``) and a new file at the path holds bytes, the renamed file is read to
its very end under the same partition, then the new file is read as its continuation
(its first line has the position after the old file's last). A renamed file is never
a new partition, even when its new name matches the glob. A file cut short (or cut
and written again, as ``copytruncate`` does) stops the run with one line
(:class:`~sealstream.errors.SourceChangedError`); a file deleted with no new one stops
it with :class:`~sealstream.errors.SourceError`.

Only line formats (JSONL, CSV) can be followed: a Parquet file is complete or
unreadable, never appended to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import polars as pl

from ...errors import SourceChangedError, SourceError, SourceExpiredError, SpecError
from .._base import OFFSET, Chunk, FieldPlan, PartitionPosition, PartitionReader, RawSpan
from .._live import empty_chunk
from ._rotation import (
    HEAD_BYTES,
    MAX_RETIRED,
    FileId,
    FileRegistry,
    Retired,
    copy_error,
    file_id,
    head_digest,
    locate,
    own_identity,
    truncated_error,
)

#: how often a quiet file is looked at while a poll waits
_LOOK_S = 0.02


def _open_reader(kind: str, name: str, path: Path, plan: FieldPlan,
                 position: PartitionPosition | None, final: bool = False
                 ) -> PartitionReader:
    """``final``: the file was rotated away and its writer moved on: a last line
    without its newline is a record (the file is finished, as in a bounded run)."""
    if kind == "jsonl":
        from .jsonl import JsonlReader

        return JsonlReader(name, path, plan, position, read_unterminated=final)
    if kind == "csv":
        from .csv import CsvReader

        return CsvReader(name, path, plan, position, read_unterminated=final)
    raise SourceError(f"source kind {kind!r} cannot be followed (only jsonl and csv)")


def shift_lines(chunk: Chunk, delta: int) -> Chunk:
    """``chunk``'s line positions moved by ``delta`` (events, bad records, last offset
    and raw texts): a file's lines in its partition's positions."""
    chunk.events = chunk.events.with_columns(pl.col(OFFSET) + delta)
    chunk.bad = chunk.bad.with_columns(pl.col("_offset") + delta, pl.col("_line") + delta)
    if chunk.last_offset is not None:
        chunk.last_offset += delta
    if chunk.raw is not None:
        texts = chunk.raw.texts
        chunk.raw = RawSpan(chunk.raw.first + delta, chunk.raw.last + delta,
                            lambda offs: texts(offs - delta))
    return chunk


class FollowedFile:
    """One growing file, and the files that follow it at its path after rotations, as
    a :class:`~sealstream.sources._live.LivePartition`.

    Besides the contract's integer positions it resumes from a full
    :class:`PartitionPosition` (byte offset and identity, device and inode of the
    file included), so a restart finds the file the position belongs to (also under
    its rotated name), checks it is still the one read and does not rescan it.
    """

    def __init__(self, kind: str, name: str, path: Path, plan: FieldPlan,
                 position: PartitionPosition | None = None,
                 files: FileRegistry | None = None) -> None:
        self.name = name
        self._kind = kind
        self._path = path
        self._plan = plan
        self._files = files if files is not None else FileRegistry()
        pos = position or PartitionPosition()
        reader_id, fid, self._base, self._retired = own_identity(name, pos.identity)
        if pos.offset < self._base:
            raise SourceError(f"partition {name!r}: the checkpoint's position {pos.offset} "
                              f"is below its file's first position {self._base}")
        for r in self._retired:
            self._files.retire(r)
        #: the reader's position in the current file (line offsets from its first line)
        self._local = PartitionPosition(pos.offset - self._base, pos.byte_offset, reader_id)
        self._skip_below = pos.offset
        #: the current file was rotated away and a new one holds lines: read it to its end
        self._final = False
        #: the file rotated away last (fd, size when left, path): it must not grow
        self._old: tuple[int, int, Path] | None = None
        #: (size, mtime, n) when the first n bytes read were last found unchanged
        self._looked: tuple[int, int, int] | None = None
        self._fd, self._fid, self._at = self._open_file(fid, pos)
        self._files.read_by(self._fid, name)
        #: the file it started in (recorded in the step plan that first lists it)
        self.first_file: tuple[int, int] = self._fid
        self._pos = self._exposed(self._local)
        self._reader: PartitionReader | None = None
        #: ``[archive]``: called with the lines each chunk moved over (``_tap.py``)
        self.raw_tap: Callable[[pl.DataFrame], None] | None = None
        #: (local line, byte) where the reader's next chunk starts (what the tap reads)
        self._tap_at = (self._local.offset, self._local.byte_offset)
        self._header: tuple[FileId, bytes] | None = None
        try:  # a first open checks the position against the file now (identity)
            self._open_current()
        except BaseException:
            self.close()
            raise

    @property
    def position(self) -> PartitionPosition:
        return self._pos

    # ------------------------------------------------------------ files
    def _open_fd(self, path: Path) -> tuple[int, FileId]:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SourceError(f"{self.name}: the followed file disappeared ({path})") from None
        except OSError as exc:
            raise SourceError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
        return fd, file_id(os.fstat(fd))

    def _open_file(self, fid: FileId | None, pos: PartitionPosition
                   ) -> tuple[int, FileId, Path]:
        """The file a saved position belongs to: the one at the path, or (rotated since)
        the one with its identity beside it; gone: the expired-data refusal."""
        fd, at_path = self._open_fd(self._path) if fid is None or self._names(self._path, fid) \
            else (-1, fid)
        if fd >= 0 and (fid is None or at_path == fid):
            return fd, at_path, self._path
        if fd >= 0:
            os.close(fd)
        assert fid is not None
        found = locate(self._path.parent, fid)
        if found is not None:
            fd, got = self._open_fd(found)
            if got == fid:
                return fd, fid, found
            os.close(fd)
        if pos.identity.get("plan") is True:
            # a step plan's record of the file a partition starts in, not found: the
            # plan is re-run over copies of its inputs (an audit), or the file was
            # rotated away and deleted; the file at the path is what there is
            fd, at_path = self._open_fd(self._path)
            return fd, at_path, self._path
        raise SourceExpiredError(
            f"partition {self.name!r}: the saved position {pos.offset} (byte "
            f"{pos.byte_offset}) belongs to a file (device {fid[0]}, inode {fid[1]}) that "
            f"was rotated away from {str(self._path)!r} and is gone from "
            f"{str(self._path.parent)!r} (deleted, compressed or moved): lines it held "
            "after that position, if any, cannot be read. Ways forward: run with "
            "--start-over, or replay the file now at the path into a new destination "
            f"(sealstream replay SPEC --from {self.name}=0 --to ...); nothing was skipped. "
            "An [archive] section keeps the lines a job reads, so that a later resume "
            "finds them when their file is gone")

    @staticmethod
    def _names(path: Path, fid: FileId) -> bool:
        try:
            return file_id(os.stat(path)) == fid
        except OSError:
            return False

    def _size(self) -> int:
        return os.fstat(self._fd).st_size

    def _open_current(self) -> None:
        """Open the reader on the current file at the local position; the path it is
        opened by must still name the file (else the file moved: look again)."""
        for _ in range(8):
            try:
                reader = _open_reader(self._kind, self.name, self._at, self._plan,
                                      self._local, self._final)
            except SourceError:
                if self._names(self._at, self._fid):
                    raise
                self._relocate()  # renamed (rotated) meanwhile: open it by its new name
                continue
            if self._names(self._at, self._fid):
                self._reader = reader
                self._tap_at = (getattr(reader, "_start_line", self._local.offset),
                                getattr(reader, "_start_byte", self._local.byte_offset))
                return
            reader.close()
            self._relocate()
        raise SourceChangedError(f"partition {self.name!r}: its file keeps moving "
                                 f"({str(self._at)!r}); it cannot be opened")

    def _relocate(self) -> None:
        """Point ``_at`` at the current file's path now (renamed by a rotation)."""
        if self._names(self._at, self._fid):
            return
        found = locate(self._path.parent, self._fid) or locate(self._at.parent, self._fid)
        if found is None:
            proc = Path(f"/proc/self/fd/{self._fd}")
            if not proc.exists():
                raise SourceChangedError(
                    f"partition {self.name!r}: its file was deleted or moved out of "
                    f"{str(self._path.parent)!r} before it was read to its end")
            found = proc
        self._at = found

    def _head(self) -> tuple[int, str] | None:
        return self._head_of(self._local)

    @staticmethod
    def _head_of(local: PartitionPosition) -> tuple[int, str] | None:
        """(n, digest of the file's first n bytes), n = the bytes read, at most 4 KiB."""
        sha = local.identity.get("head_sha256")
        n = min(HEAD_BYTES, local.byte_offset)
        return (n, sha) if isinstance(sha, str) and n > 0 else None

    def _changed_in_place(self, size: int) -> bool:
        """Cut below the read position, or its consumed first bytes rewritten (looked
        at only when the file was written since the last look: size or mtime)."""
        if size < self._local.byte_offset:
            return True
        head = self._head()
        if head is None:
            return False
        st = os.fstat(self._fd)
        seen = (st.st_size, st.st_mtime_ns, head[0])
        if seen == self._looked:
            return False
        if head_digest(self._fd, head[0]) != head[1]:
            return True
        self._looked = seen
        return False

    def _truncated(self, size: int) -> SourceChangedError:
        return truncated_error(self.name, self._at, self._fid, self._pos.offset,
                               self._local.byte_offset, size, self._head(),
                               rewritten=size >= self._local.byte_offset)

    def _check_old(self) -> None:
        if self._old is None:
            return
        fd, size, path = self._old
        if os.fstat(fd).st_size > size:
            raise SourceChangedError(
                f"partition {self.name!r}: {str(path)!r}, the file rotated away from "
                f"{str(self._path)!r}, grew after the partition moved on to the new file at "
                f"position {self._base}; those lines cannot be read in order - the writer "
                "must move to the new file before writing to it (reopen at rotation, as "
                "logrotate's postrotate signal asks); what was committed stays committed")

    def _next_file(self) -> bool:
        """Whether the path names another file that holds bytes and that no other
        partition reads or read: the current file was rotated away."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            if os.fstat(self._fd).st_nlink == 0:
                raise SourceError(f"{self.name}: the followed file disappeared "
                                  f"({self._path})") from None
            return False  # renamed, no new file yet
        except OSError as exc:
            raise SourceError(f"cannot read {str(self._path)!r}: {exc.strerror or exc}"
                              ) from None
        if file_id(st) == self._fid or st.st_size == 0:
            return False  # the same file; or a new one its writer has not written to yet
        return self._files.owner(self._path, st) is None

    def _switch(self) -> None:
        """The current file is read to its end: go on with the file at the path."""
        size = self._size()
        n = min(HEAD_BYTES, size)
        r = Retired(self._fid[0], self._fid[1], n, head_digest(self._fd, n))
        self._retired = [*self._retired, r][-MAX_RETIRED:]
        self._files.retire(r)
        fd, fid = self._open_fd(self._path)
        if self._files.owner(self._path, os.fstat(fd)) is not None:
            os.close(fd)  # the path changed again meanwhile: look later
            return
        if self._old is not None:
            os.close(self._old[0])
        self._old = (self._fd, size, self._at)
        self._fd, self._fid, self._at = fd, fid, self._path
        self._files.read_by(fid, self.name)
        self._base = self._pos.offset
        self._local = PartitionPosition()
        self._final = False
        self._looked = None
        self._pos = self._exposed(self._local)

    def _exposed(self, local: PartitionPosition) -> PartitionPosition:
        head = self._head_of(local)
        if head is not None and local.offset > 0:
            self._files.heads[self.name] = (self._at, *head)
        identity = dict(local.identity)
        identity.update(dev=self._fid[0], ino=self._fid[1], base=self._base,
                        retired=[r.to_json() for r in self._retired])
        return PartitionPosition(local.offset + self._base, local.byte_offset, identity)

    # ------------------------------------------------------------ reading
    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            chunk = self._read(max_records)
            if chunk is not None:
                return chunk
            if time.monotonic() >= deadline:
                return empty_chunk(self._plan, self._pos.offset)
            time.sleep(min(_LOOK_S, max(0.0, deadline - time.monotonic())))

    def _rotate(self) -> bool:
        """Nothing more in the current file now: True when reading goes on (the file
        was rotated away: read it to its very end; read to its end: the new file)."""
        if self._final:
            self._switch()
            return not self._final
        if not self._next_file():
            return False
        self._final = True
        self._relocate()
        return True

    def _read(self, max_records: int) -> Chunk | None:
        """A chunk with records or a moved position, else None (nothing new)."""
        while True:
            if self._reader is None:
                self._check_old()
            try:
                chunk = self._next(max_records)
            except SourceChangedError:
                self.close_reader()
                size = self._size()
                if self._changed_in_place(size):
                    raise self._truncated(size) from None
                if self._names(self._at, self._fid):
                    raise  # another change, in the reader's own words
                self._relocate()  # renamed while read: read on under its new name
                continue
            if chunk is None:
                if self._reader is None and self._rotate():
                    continue
                return None
            return chunk

    def _next(self, max_records: int) -> Chunk | None:
        if self._reader is None:
            size = self._size()
            if self._changed_in_place(size):
                raise self._truncated(size)
            if size <= self._local.byte_offset:
                return None
            self._open_current()
        assert self._reader is not None
        while True:
            chunk = self._reader.next_chunk(max_records)
            if chunk is None or chunk.eof:
                self.close_reader()
            if chunk is None:
                return None
            self._tap(chunk.position)
            before = self._pos.offset
            moved = chunk.position.offset != self._local.offset
            self._local = chunk.position
            chunk = self._shift(chunk)
            if self._skip_below > before:
                chunk = _skip(chunk, self._skip_below)
            self._pos = chunk.position
            chunk.eof = False
            if chunk.events.height or chunk.bad.height or moved:
                return chunk
            if self._reader is None:
                return None

    def holds(self, byte: int, data: bytes) -> bool:
        """Whether the current file has ``data`` at ``byte`` (``[archive]``: the file of
        the archive's last line, found by device and inode, is that file only if it
        still holds that line; another file may have taken a deleted one's inode)."""
        try:
            return os.pread(self._fd, len(data), byte) == data
        except OSError:
            return False

    def _tap(self, local: PartitionPosition) -> None:
        """``[archive]``: hand the lines the reader just moved over to the tap."""
        (line0, b0), self._tap_at = self._tap_at, (local.offset, local.byte_offset)
        if self.raw_tap is None or local.byte_offset <= b0:
            return
        from ._tap import chunk_lines

        self.raw_tap(chunk_lines(self._fd, line0, b0, local.offset, local.byte_offset,
                                 self._base, self._fid, self._csv_header(), self.name))

    def _csv_header(self) -> bytes | None:
        """The current CSV file's bytes up to its first record (None: JSONL)."""
        if self._kind != "csv":
            return None
        if self._header is None or self._header[0] != self._fid:
            reader = _open_reader(self._kind, self.name, self._at, self._plan, None)
            try:
                end = int(getattr(reader, "_start_byte", 0))
            finally:
                reader.close()
            from ._tap import pread_all

            self._header = (self._fid, pread_all(self._fd, end, 0))
        return self._header[1]

    def _shift(self, chunk: Chunk) -> Chunk:
        """A chunk of the current file in the partition's positions (``+ base``)."""
        b = self._base
        chunk.position = self._exposed(chunk.position)
        return shift_lines(chunk, b) if b else chunk

    def seek(self, position: int) -> None:
        if position < self._base:
            raise SourceError(
                f"partition {self.name!r}: position {position} lies in a file rotated away "
                f"before the one read now (which starts at position {self._base})")
        self.close_reader()
        self._local = PartitionPosition()
        self._pos = self._exposed(self._local)
        self._skip_below = position
        self._final = False
        self._open_current()

    def tell(self) -> int:
        """The line offset of the next record to read."""
        return max(self._pos.offset, self._skip_below)

    def earliest(self) -> int | None:
        return self._base

    def end(self) -> int | None:
        """The position after the last complete line now: of the current file, or,
        when it was rotated away and a new file holds lines, after the new file's."""
        end = self._base + self._lines(self._fd)
        if not self._final and not self._next_file():
            return end
        size = self._size()
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            end += 1  # its last line, read as a record once the file is left
        try:
            fd, _ = self._open_fd(self._path)
        except SourceError:
            return end
        try:
            return end + self._lines(fd)
        finally:
            os.close(fd)

    def _lines(self, fd: int) -> int:
        """Positions of the complete lines of a file (CSV: its header is none)."""
        n, at = 0, 0
        while block := os.pread(fd, 8 << 20, at):
            n += int(np.count_nonzero(np.frombuffer(block, np.uint8) == 10))
            at += len(block)
        return n - (1 if self._kind == "csv" and n else 0)

    def close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close(self) -> None:
        self.close_reader()
        for fd in (getattr(self, "_fd", -1), self._old[0] if self._old else -1):
            if fd >= 0:
                os.close(fd)
        self._fd, self._old = -1, None


def _skip(chunk: Chunk, below: int) -> Chunk:
    chunk.events = chunk.events.filter(pl.col(OFFSET) >= below)
    chunk.bad = chunk.bad.filter(pl.col("_offset") >= below)
    if chunk.last_offset is not None and chunk.last_offset < below:
        chunk.last_offset = None
    return chunk


class FollowedFiles:
    """The files of a :class:`~sealstream.pipeline.FileSource` with ``follow = true``,
    as a :class:`~sealstream.sources._live.LiveSource`."""

    def __init__(self, kind: str, listing: object, plan: FieldPlan,
                 known: Mapping[str, PartitionPosition] | None = None) -> None:
        """``listing``: the FileSource (its ``partitions(allow_empty=True)`` lists the
        files matching now). ``known``: a restored checkpoint's positions: the files
        its partitions read (rotated ones included) are not new partitions."""
        if kind not in ("jsonl", "csv"):
            raise SpecError(f"source.follow: kind {kind!r} cannot be followed "
                            "(only jsonl and csv files grow by lines)")
        self._kind = kind
        self._listing = listing
        self._plan = plan
        self._paths: dict[str, Path] = {}
        self._order: list[str] = []
        #: partitions opened by their identity (a checkpoint's, a step plan's): the
        #: others may still turn out to be a rotated file, once a replay opens the
        #: partition that reads it by its recorded identity
        self._opened: set[str] = set()
        self._files = FileRegistry()
        base = Path(getattr(listing, "base_dir", "."))
        for name, pos in (known or {}).items():
            _, fid, _, retired = own_identity(name, pos.identity)
            if fid is not None:
                self._files.read_by(fid, name)
                # a partition of the checkpoint whose file is tracked stays one while
                # its path is missing (renamed by a rotation, the new file not yet made)
                self._paths[name] = base / name
                self._order.append(name)
                self._opened.add(name)
            for r in retired:
                self._files.retire(r)

    def discover(self) -> list[str]:
        """The partitions: the files matching now, in order of discovery, but a file
        that a partition reads or has read (renamed by a rotation) is none."""
        try:
            found = self._listing.partitions(allow_empty=True)  # type: ignore[attr-defined]
        except SpecError:
            if not self._order:
                raise
            return list(self._order)  # a path named as such, renamed by a rotation
        for n in [n for n in self._order if n not in self._opened]:
            try:
                owner = self._files.owner(self._paths[n], os.stat(self._paths[n]))
            except OSError:
                continue
            if owner is not None and owner != n:  # found to be a rotated file since
                self._order.remove(n)
                del self._paths[n]
        for n, p in found:
            if n in self._paths:
                continue
            try:
                st = os.stat(p)
            except OSError:
                continue
            owner = self._files.owner(p, st)
            if owner is not None and owner != n:
                continue
            copy = self._files.copy_of(p, st) if owner is None else None
            if copy is not None:
                raise copy_error(copy[0], copy[1], p)
            self._paths[n] = p
            self._order.append(n)
        return list(self._order)

    def open(self, name: str, position: int | None, from_start: bool = False
             ) -> FollowedFile:
        """``name`` at line ``position`` (None: its first line; a file has no other
        start mode, so ``from_start`` changes nothing)."""
        part = FollowedFile(self._kind, name, self._paths[name], self._plan,
                            files=self._files)
        if position:
            part.seek(position)
        return part

    def open_at(self, name: str, position: PartitionPosition) -> FollowedFile:
        """Open at a full file position (the file found by its identity, byte offset
        and consumed bytes checked)."""
        if name not in self._paths:
            self.discover()
        if name not in self._paths:
            raise SourceError(f"{name}: the followed file disappeared")
        part = FollowedFile(self._kind, name, self._paths[name], self._plan, position,
                            files=self._files)
        self._opened.add(name)
        return part

    def open_successor(self, name: str, position: int) -> FollowedFile:
        """``[archive]``: the file now at ``name``'s path, read from its first line as
        position ``position`` (the continuation of a file rotated away and gone, whose
        lines up to ``position`` came from the archive)."""
        if name not in self._paths:
            self.discover()
        path = self._paths.get(name)
        try:
            st = os.stat(path) if path is not None else None
        except OSError:
            st = None
        if path is None or st is None:
            raise SourceError(
                f"partition {name!r}: the archive holds its lines up to position {position}, "
                f"but no file is at its path to go on with (the rotation's new file); "
                "start the run again once the writer has created it")
        part = FollowedFile(self._kind, name, path, self._plan, PartitionPosition(
            position, 0, {"dev": st.st_dev, "ino": st.st_ino, "base": position}),
            files=self._files)
        self._opened.add(name)
        return part

    def commit_group(self, positions: dict[str, int]) -> None:
        """Files have no consumer group."""

    def close(self) -> None:
        """Nothing held: each partition closes its file."""


__all__ = ["FollowedFile", "FollowedFiles"]
