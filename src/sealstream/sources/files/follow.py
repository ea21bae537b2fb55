"""Growing files as a live source (``follow = true``).

Each file is a partition named by its path as matched; positions are line offsets
(the same as a bounded run's). A followed file is read in whole lines only: a last
line without its newline is still being written and is left until it ends
(``read_unterminated=False``). Appended lines are read as they arrive; files that
start to match a glob are new partitions, appended to the partition order (sorted
among those discovered together). A file that shrinks, is replaced or rotated stops
the run with :class:`~sealstream.errors.SourceChangedError` (as in bounded runs);
a file that disappears stops it with :class:`~sealstream.errors.SourceError`.

Only line formats (JSONL, CSV) can be followed: a Parquet file is complete or
unreadable, never appended to.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import polars as pl

from ...errors import SourceError
from .._base import Chunk, FieldPlan, PartitionPosition, PartitionReader
from .._live import empty_chunk

#: how often a quiet file is looked at while a poll waits
_LOOK_S = 0.02


def _open_reader(kind: str, name: str, path: Path, plan: FieldPlan,
                 position: PartitionPosition | None) -> PartitionReader:
    if kind == "jsonl":
        from .jsonl import JsonlReader

        return JsonlReader(name, path, plan, position, read_unterminated=False)
    if kind == "csv":
        from .csv import CsvReader

        return CsvReader(name, path, plan, position, read_unterminated=False)
    raise SourceError(f"source kind {kind!r} cannot be followed (only jsonl and csv)")


class FollowedFile:
    """One growing file as a :class:`~sealstream.sources._live.LivePartition`.

    Besides the contract's integer positions it resumes from a full
    :class:`PartitionPosition` (byte offset and identity), so a restart checks that
    the file is still the one read and does not rescan it.
    """

    def __init__(self, kind: str, name: str, path: Path, plan: FieldPlan,
                 position: PartitionPosition | None = None) -> None:
        self.name = name
        self._kind = kind
        self._path = path
        self._plan = plan
        self._pos = position or PartitionPosition()
        self._skip_below = self._pos.offset
        self._reader: PartitionReader | None = None
        # a first open checks the position against the file now (identity)
        self._reader = _open_reader(kind, name, path, plan, self._pos)

    @property
    def position(self) -> PartitionPosition:
        return self._pos

    def _size(self) -> int:
        try:
            return os.stat(self._path).st_size
        except FileNotFoundError:
            raise SourceError(f"{self.name}: the followed file disappeared ({self._path})"
                              ) from None
        except OSError as exc:
            raise SourceError(f"cannot read {str(self._path)!r}: {exc.strerror or exc}"
                              ) from None

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            chunk = self._read(max_records)
            if chunk is not None:
                return chunk
            if time.monotonic() >= deadline:
                return empty_chunk(self._plan, self._pos.offset)
            time.sleep(min(_LOOK_S, max(0.0, deadline - time.monotonic())))

    def _read(self, max_records: int) -> Chunk | None:
        """A chunk with records or a moved position, else None (nothing new)."""
        if self._reader is None:
            if self._size() <= self._pos.byte_offset:
                return None
            self._reader = _open_reader(self._kind, self.name, self._path, self._plan,
                                        self._pos)
        while True:
            chunk = self._reader.next_chunk(max_records)
            if chunk is None or chunk.eof:
                self._reader.close()
                self._reader = None
            if chunk is None:
                return None
            if self._skip_below > self._pos.offset:
                chunk = _skip(chunk, self._skip_below)
            moved = chunk.position.offset != self._pos.offset
            self._pos = chunk.position
            chunk.eof = False
            if chunk.events.height or chunk.bad.height or moved:
                return chunk
            if self._reader is None:
                return None

    def seek(self, position: int) -> None:
        if self._reader is not None:
            self._reader.close()
        self._pos = PartitionPosition()
        self._skip_below = position
        self._reader = _open_reader(self._kind, self.name, self._path, self._plan, None)

    def tell(self) -> int:
        """The line offset of the next record to read."""
        return max(self._pos.offset, self._skip_below)

    def earliest(self) -> int | None:
        return 0

    def end(self) -> int | None:
        """The line offset after the last complete line now."""
        with open(self._path, "rb") as f:
            n = 0
            while block := f.read(8 << 20):
                n += int(np.count_nonzero(np.frombuffer(block, np.uint8) == 10))
        return n - (1 if self._kind == "csv" and n else 0)  # CSV: the header line

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _skip(chunk: Chunk, below: int) -> Chunk:
    chunk.events = chunk.events.filter(pl.col("__off") >= below)
    chunk.bad = chunk.bad.filter(pl.col("_offset") >= below)
    if chunk.last_offset is not None and chunk.last_offset < below:
        chunk.last_offset = None
    return chunk


class FollowedFiles:
    """The files of a :class:`~sealstream.pipeline.FileSource` with ``follow = true``,
    as a :class:`~sealstream.sources._live.LiveSource`."""

    def __init__(self, kind: str, listing: object, plan: FieldPlan) -> None:
        """``listing``: the FileSource (its ``partitions(allow_empty=True)`` lists the
        files matching now)."""
        if kind not in ("jsonl", "csv"):
            from ...errors import SpecError

            raise SpecError(f"source.follow: kind {kind!r} cannot be followed "
                            "(only jsonl and csv files grow by lines)")
        self._kind = kind
        self._listing = listing
        self._plan = plan
        self._paths: dict[str, Path] = {}
        self._order: list[str] = []

    def discover(self) -> list[str]:
        found = self._listing.partitions(allow_empty=True)  # type: ignore[attr-defined]
        new = [(n, p) for n, p in found if n not in self._paths]
        for n, p in new:
            self._paths[n] = p
            self._order.append(n)
        return list(self._order)

    def open(self, name: str, position: int | None, from_start: bool = False
             ) -> FollowedFile:
        """``name`` at line ``position`` (None: its first line; a file has no other
        start mode, so ``from_start`` changes nothing)."""
        part = FollowedFile(self._kind, name, self._paths[name], self._plan)
        if position:
            part.seek(position)
        return part

    def open_at(self, name: str, position: PartitionPosition) -> FollowedFile:
        """Open at a full file position (byte offset and identity checked)."""
        if name not in self._paths:
            self.discover()
        if name not in self._paths:
            raise SourceError(f"{name}: the followed file disappeared")
        return FollowedFile(self._kind, name, self._paths[name], self._plan, position)

    def commit_group(self, positions: dict[str, int]) -> None:
        """Files have no consumer group."""

    def close(self) -> None:
        """Nothing held: each partition closes its file."""


__all__ = ["FollowedFile", "FollowedFiles"]
