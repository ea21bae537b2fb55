"""The archive of followed files: a rotated file that is gone, read from its segments.

A followed partition (``follow = true``) is a sequence of files at one path; its
archived rows are the lines of those files, each with the file's identity and the
line's byte offset (:mod:`sealstream.sources.files._tap`). When a resume or a replay
needs positions of a file that was rotated away and deleted, :func:`recover_file`
opens an :class:`ArchivedFile`:

1. The ranges the recorded steps read from that position on (their segments
   verified against the signed step plans, as for a broker) are served from the
   archive: the lines of each file are put back together (under the file's CSV
   header) and parsed by the file's own reader, so records, bad records and their
   positions are those of the original read.
2. Where the archive ends, reading goes on from the file: the last archived file
   found by its identity when it still exists (under any name beside the path),
   else the file now at the path - the rotation's successor - whose first line gets
   the position after the archive's last.

When recorded steps read positions of the gone file that the archive does not hold
(steps recorded without an ``[archive]``), the expiry refusal stands, naming the
archive and what it holds. Lines appended to the rotated file after the job last
read it (while it was stopped) were never read, so no archive holds them: a resume
cannot know of them and goes on with the successor (docs/live.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from sealstream.archive._segments import ArchiveDamagedError, SegmentEntry
from sealstream.errors import SourceError, SourceExpiredError
from sealstream.sources._base import Chunk, PartitionPosition
from sealstream.sources._live import LivePartition, empty_chunk

if TYPE_CHECKING:
    from sealstream.archive._live import Archiver, _Plan

#: the key column of a followed file's archived line (``_tap.py``)
_KEY = pl.Struct({"dev": pl.Int64(), "ino": pl.Int64(), "base": pl.Int64(),
                  "header": pl.String()})
#: records per chunk when an archived range is parsed again
_CHUNK = 1 << 16


def _coverage(name: str, plans: Sequence[_Plan]) -> str:
    """What the archive holds of ``name`` through ``plans``: its position spans."""
    spans: list[list[int]] = []
    for plan in plans:
        rng = plan.ranges.get(name)
        if rng is None or rng[1] <= rng[0] or plan.archive is None:
            continue
        if spans and spans[-1][1] == rng[0]:
            spans[-1][1] = rng[1]
        else:
            spans.append([rng[0], rng[1]])
    if not spans:
        return f"it holds none of {name!r}'s positions the recorded steps read"
    return "it holds " + ", ".join(f"positions {a}..{b - 1}" for a, b in spans) + \
        f" of {name!r}"


def recover_file(archiver: Archiver, name: str, at: int,
                 ranges: list[tuple[int, int, SegmentEntry]], plans: Sequence[_Plan],
                 source: Any, expired: SourceExpiredError) -> ArchivedFile:
    """Followed partition ``name`` from position ``at`` (in a file gone since): the
    archived ``ranges`` of the recorded ``plans`` from ``at``, then the files."""
    recorded = max((rng[1] for p in plans if (rng := p.ranges.get(name)) is not None),
                   default=at)
    if not ranges and recorded > at:
        raise SourceExpiredError(
            f"{expired} The archive {archiver.location} does not cover them: the steps "
            f"recorded after that position read {name!r} up to position {recorded}, "
            f"but {_coverage(name, plans)}") from None
    return ArchivedFile(archiver, name, at, ranges, source, recorded, expired)


class ArchivedFile:
    """A followed partition read from archived lines, then from its files (see the
    module docstring). A :class:`~sealstream.sources._live.LivePartition`."""

    #: the archiver taps the partition it hands over to, not this one
    archived = True

    def __init__(self, archiver: Archiver, name: str, at: int,
                 ranges: list[tuple[int, int, SegmentEntry]], source: Any,
                 recorded: int, expired: SourceExpiredError) -> None:
        self.name = name
        self._archiver = archiver
        self._ranges = list(ranges)
        self._last = ranges[-1] if ranges else None
        self._source = source
        self._recorded = recorded
        self._expired = expired
        self._pos = at
        self._queue: list[Chunk] = []
        self._real: LivePartition | None = None
        self._on_file = False

    # ------------------------------------------------------------ archived lines
    def _rows(self, lo: int, hi: int, entry: SegmentEntry) -> pl.DataFrame:
        try:
            frame = self._archiver.rows(entry)
        except ArchiveDamagedError as exc:
            raise ArchiveDamagedError(f"partition {self.name!r}, positions {lo}..{hi - 1}: "
                                      f"{exc}") from None
        rows = frame.filter((pl.col("partition") == self.name) & (pl.col("position") >= lo)
                            & (pl.col("position") < hi)).sort("position")
        try:
            keys = rows["key"].cast(pl.String).str.json_decode(_KEY)
        except Exception:  # noqa: BLE001 - not a followed file's rows
            keys = None
        if keys is None or rows.height != hi - lo or keys.struct.field("dev").null_count() \
                or (rows.height and (int(rows["position"][-1]) != hi - 1
                                     or bool((rows["timestamp_ms"] < 0).any()))):
            raise ArchiveDamagedError(
                f"partition {self.name!r}, positions {lo}..{hi - 1}: archive segment "
                f"{self._archiver.location}/{entry.name} does not hold a followed file's "
                "lines for every position of that range; nothing was read from it, "
                "skipped or committed")
        # a followed file's line: its file in the key, its byte in timestamp_ms
        return rows.with_columns(*keys.struct.unnest().get_columns(),
                                 pl.col("timestamp_ms").alias("byte")).drop("key")

    def _parse(self, lo: int, hi: int, entry: SegmentEntry) -> list[Chunk]:
        """The chunks of positions ``lo..hi-1``, one file's lines at a time."""
        rows = self._rows(lo, hi, entry)
        out: list[Chunk] = []
        runs = rows.with_columns(pl.struct("dev", "ino").rle_id().alias("_run"))
        for run in runs.partition_by("_run", maintain_order=True):
            out += self._parse_run(run)
        if not out or out[-1].position.offset != hi:
            out.append(empty_chunk(self._archiver.parser.plan, hi))
        return out

    def _parse_run(self, run: pl.DataFrame) -> list[Chunk]:
        """Consecutive archived lines of one file, parsed by the file's reader from a
        temporary copy of them (under the file's CSV header)."""
        from sealstream.sources.files.follow import _open_reader

        first = run.row(0, named=True)
        kind = "csv" if first["header"] is not None else "jsonl"
        data = b"".join(run["value"].to_list())
        # a JSONL line away from the file's start is not read as if it were its first
        # (a byte-order mark is skipped only there): a blank line before it
        prefix = bytes.fromhex(first["header"]) if kind == "csv" else \
            (b"" if first["byte"] == 0 else b"\n")
        ident = {"dev": first["dev"], "ino": first["ino"], "base": first["base"]}
        out: list[Chunk] = []
        with tempfile.TemporaryDirectory(prefix="sealstream-archived-") as tmp:
            path = Path(tmp) / "lines"
            path.write_bytes(prefix + data)
            reader = _open_reader(kind, self.name, path, self._archiver.parser.plan, None,
                                  final=True)
            try:
                delta = int(first["position"]) - int(getattr(reader, "_start_line", 0)) \
                    - (1 if kind == "jsonl" and prefix else 0)
                while (chunk := reader.next_chunk(_CHUNK)) is not None:
                    out.append(_shifted(chunk, delta, PartitionPosition(
                        chunk.position.offset + delta,
                        int(first["byte"]) + chunk.position.byte_offset - len(prefix),
                        dict(ident))))
                    if chunk.eof:
                        break
            finally:
                reader.close()
        end = int(run["position"][-1]) + 1
        if not out or out[-1].position.offset != end:
            raise ArchiveDamagedError(
                f"partition {self.name!r}: the archived lines of positions "
                f"{int(first['position'])}..{end - 1} do not read back as whole records; "
                "nothing was skipped or committed")
        return out

    def _end_position(self) -> tuple[PartitionPosition, int, bytes] | None:
        """Where the archive ends, in the file of its last line, with that line's byte
        offset and bytes (None: nothing archived from the position asked)."""
        if self._last is None:
            return None
        lo, hi, entry = self._last
        tail = self._rows(hi - 1, hi, entry).row(0, named=True)
        value = bytes(tail["value"])
        return PartitionPosition(hi, int(tail["byte"]) + len(value), {
            "dev": tail["dev"], "ino": tail["ino"], "base": tail["base"]}), \
            int(tail["byte"]), value

    # ------------------------------------------------------------ the files
    def _file(self) -> LivePartition:
        """The partition's files from where the archive ends."""
        if self._real is not None:
            return self._real
        last = self._end_position()
        at = last[0].offset if last is not None else self._pos
        real: LivePartition | None = None
        if last is not None:
            end, byte, value = last
            try:  # the file of the last archived line, if it still exists
                real = self._source.open_at(self.name, end)
            except SourceExpiredError:
                real = None
            # found by (device, inode) alone: a file that took a deleted one's inode (the
            # rotation's new file, often) is not it unless it holds the last archived line
            from sealstream.sources.files.follow import FollowedFile

            if isinstance(real, FollowedFile) and not real.holds(byte, value):
                real.close()
                real = None
        if real is None:
            if at < self._recorded:
                raise SourceExpiredError(
                    f"{self._expired} (the archive {self._archiver.location} holds "
                    f"{self.name!r} only up to position {at}; the recorded steps read it "
                    f"up to {self._recorded})") from None
            real = self._source.open_successor(self.name, at)
        assert real is not None
        self._archiver.attach(real)
        self._real = real
        return real

    def _hand_over(self) -> LivePartition:
        real = self._file()
        if not self._on_file:
            if real.tell() != self._pos:
                real.seek(self._pos)
            self._on_file = True
        return real

    # ------------------------------------------------------------ LivePartition
    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        if not self._queue and self._ranges:
            lo, hi, entry = self._ranges.pop(0)
            self._queue = self._parse(lo, hi, entry)
        if self._queue:
            chunk = self._queue.pop(0)
            self._pos = chunk.position.offset
            return chunk
        return self._hand_over().poll(max_records, timeout_ms)

    def seek(self, position: int) -> None:
        self._queue = []
        if self._on_file or not self._ranges or position >= self._ranges[-1][1]:
            self._ranges = []
            self._pos = position
            self._on_file = False
            self._hand_over()
            return
        while self._ranges and self._ranges[0][1] <= position:
            self._ranges.pop(0)
        lo, hi, entry = self._ranges[0]
        if position < lo:
            raise SourceError(f"partition {self.name!r}: position {position} lies before "
                              "what the archive holds of it")
        self._ranges[0] = (position, hi, entry)
        self._pos = position

    def tell(self) -> int:
        return self._real.tell() if self._on_file and self._real is not None else self._pos

    def earliest(self) -> int | None:
        return self._real.earliest() if self._on_file and self._real is not None else None

    def end(self) -> int | None:
        return self._file().end()

    def close(self) -> None:
        if self._real is not None:
            self._real.close()


def _shifted(chunk: Chunk, delta: int, position: PartitionPosition) -> Chunk:
    """A chunk of the temporary copy in the partition's positions (``+ delta``)."""
    from sealstream.sources.files.follow import shift_lines

    shift_lines(chunk, delta)
    chunk.position = position
    chunk.eof = False
    return chunk


__all__ = ["ArchivedFile", "recover_file"]
