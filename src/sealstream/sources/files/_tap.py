"""What a followed file hands the raw-event archive (``[archive]``, docs/object-storage.md).

A followed partition's records are the lines of its files. When the archive taps a
partition, each chunk the partition reads hands over, as one frame, every physical
line the chunk moved over (blank lines and the lines of a multi-line CSV record
included, so that the archived lines of a range are its bytes, in order):

================  ==========================================================
``position``      the line's position in the partition (as the chunk's positions)
``key``           the line's file as the follow source's checkpoint records it:
                  JSON ``{"dev", "ino", "base"}`` (the file's device and inode, the
                  position of its first line) and, for CSV, ``"header"``: the hex
                  of the file's header bytes (a recovery re-reads the lines under
                  that header); the same for every line of a file (Parquet stores
                  it once per page, dictionary-encoded)
``timestamp_ms``  the byte the line starts at in its file (a file line has no
                  broker timestamp; with the key, the line's place as a
                  checkpoint records a position)
``value``         the line's bytes, its line ending included (the last line of a
                  file rotated away may have none)
================  ==========================================================

The frame is built with numpy and Arrow over the bytes read (one ``pread`` of the
range the reader just consumed, from the page cache): no Python loop per line.
A recovery (:mod:`sealstream.archive._files`) parses these lines with the same
reader as the file's, so the records are typed identically.
"""

from __future__ import annotations

import json
import os

import numpy as np
import polars as pl
import pyarrow as pa

from ...errors import SourceError


def pread_all(fd: int, n: int, at: int) -> bytes:
    """``n`` bytes of ``fd`` from ``at`` (a short read is completed; fewer at EOF)."""
    parts: list[bytes] = []
    while n > 0:
        got = os.pread(fd, n, at)
        if not got:
            break
        parts.append(got)
        n -= len(got)
        at += len(got)
    return b"".join(parts)


def raw_lines(data: bytes, first: int, byte0: int, fid: tuple[int, int], base: int,
              header: bytes | None) -> pl.DataFrame:
    """The archive frame of the whole lines ``data`` (starting at byte ``byte0`` of the
    file ``fid``, whose first line has position ``base``); the first is at position
    ``first``."""
    a = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(a == 10).astype(np.int64) + 1
    if len(data) and (not len(ends) or int(ends[-1]) != len(data)):
        ends = np.append(ends, np.int64(len(data)))  # a last line without its newline
    offsets = np.concatenate([np.zeros(1, np.int64), ends])
    n = len(ends)
    values = pa.Array.from_buffers(pa.large_binary(), n,
                                   [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    head = {"dev": fid[0], "ino": fid[1], "base": base}
    if header is not None:
        head["header"] = header.hex()  # type: ignore[assignment]
    key = json.dumps(head, separators=(",", ":")).encode()
    return pl.DataFrame({
        "position": pl.Series(first + np.arange(n, dtype=np.int64), dtype=pl.Int64),
        "key": pl.repeat(key, n, dtype=pl.Binary, eager=True),
        "timestamp_ms": pl.Series(byte0 + offsets[:-1], dtype=pl.Int64),
        "value": pl.Series(pl.from_arrow(values)).cast(pl.Binary),
    })


def chunk_lines(fd: int, line0: int, b0: int, line1: int, b1: int, base: int,
                fid: tuple[int, int], header: bytes | None, name: str) -> pl.DataFrame:
    """The archive frame of what a chunk moved over: local lines ``line0..line1`` at
    bytes ``b0..b1`` of the file open as ``fd``."""
    data = pread_all(fd, b1 - b0, b0)
    if b0 > 0 and data.startswith((b"\n", b"\r\n")) and os.pread(fd, 1, b0 - 1) != b"\n":
        # the newline of a final line read before it had one (its record was read
        # then): it belongs to that line, not to a line of its own
        cut = data.index(b"\n") + 1
        data, b0 = data[cut:], b0 + cut
    frame = raw_lines(data, base + line0, b0, fid, base, header)
    if frame.height != line1 - line0:
        raise SourceError(
            f"partition {name!r}: [archive] the bytes {b0}..{b1} read hold "
            f"{frame.height} lines, but the reader moved {line1 - line0} positions; "
            "nothing was archived or committed for them")
    return frame


__all__ = ["chunk_lines", "pread_all", "raw_lines"]
