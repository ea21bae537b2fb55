"""Archive segments: one Parquet object per live step, and its binding entry.

A segment holds the raw records one step read, every partition's, sorted by
``(partition, position)``:

================  =======  ==================================================
``partition``     String   the partition's name (``topic/0``, a subject)
``position``      Int64    the record's position (Kafka offset, stream sequence)
``key``           Binary   the message key (null: none)
``timestamp_ms``  Int64    the broker's timestamp (-1: none)
``value``         Binary   the message value as the broker held it
================  =======  ==================================================

Its entry in the step's plan (``{"name", "bytes", "sha256"}``) is what a reader
trusts: the bytes are hashed before they are parsed, and the frame's columns and
types are checked after. No code is ever loaded from a segment (Parquet is data only).
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any, Literal

import polars as pl
import pyarrow.parquet as pq

from sealstream.errors import SourceExpiredError

SEGMENT_SCHEMA: dict[str, pl.DataType] = {
    "partition": pl.String(),
    "position": pl.Int64(),
    "key": pl.Binary(),
    "timestamp_ms": pl.Int64(),
    "value": pl.Binary(),
}
#: the segments' Parquet compression (see docs/object-storage.md: measured against size)
COMPRESSION: Literal["zstd"] = "zstd"
COMPRESSION_LEVEL = 1
#: what each column is written as: the partition as a dictionary (one name a run of
#: rows), positions and broker timestamps as deltas (consecutive, or nearly), keys and
#: values plain then zstd (docs/object-storage.md, "Its cost": measured)
_ENCODINGS = {"position": "DELTA_BINARY_PACKED", "timestamp_ms": "DELTA_BINARY_PACKED",
              "key": "PLAIN", "value": "PLAIN"}
_NAME = re.compile(r"seg-(\d{12})-([0-9a-f]{16})\.parquet")


class ArchiveDamagedError(SourceExpiredError):
    """An archive segment that a recovery needs is missing or does not match the
    size and SHA-256 its signed step plan recorded (or is not a segment). The records
    are neither on the broker nor trustworthy in the archive: exit 1, as for expired
    data; nothing committed is touched."""


@dataclass(frozen=True)
class SegmentEntry:
    """What a step plan records of its segment."""

    name: str
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SegmentEntry:
        name, size, digest = doc["name"], doc["bytes"], doc["sha256"]
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise ValueError(f"not a segment name: {name!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"not a size: {size!r}")
        if not isinstance(digest, str) or re.fullmatch(r"[0-9a-f]{64}", digest) is None:
            raise ValueError(f"not a SHA-256: {digest!r}")
        return cls(name, size, digest)


def segment_name(step: int, digest: str) -> str:
    """The object name of step ``step``'s segment whose SHA-256 is ``digest``."""
    return f"seg-{step:012d}-{digest[:16]}.parquet"


def segment_step(name: str) -> int | None:
    """The step of a segment's object name (None: not a segment's name)."""
    m = _NAME.fullmatch(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def encode_segment(step: int, rows: pl.DataFrame, *, ordered: bool = False
                   ) -> tuple[bytes, SegmentEntry]:
    """The Parquet bytes of ``rows`` (in :data:`SEGMENT_SCHEMA`) and their entry.
    ``ordered``: the rows are already sorted by ``(partition, position)`` (the
    archiver's are: partitions by name, each as polled), so they are not sorted again.
    The bytes depend on the rows only (not on how they were chunked), so the same
    records encode to the same segment (a replayed step re-creates a lost one)."""
    rows = rows.select(list(SEGMENT_SCHEMA))
    if rows.schema != pl.Schema(SEGMENT_SCHEMA):
        rows = rows.cast(pl.Schema(SEGMENT_SCHEMA))
    rows = rows.rechunk() if ordered else rows.sort(["partition", "position"])
    buf = io.BytesIO()
    pq.write_table(rows.to_arrow(), buf, compression=COMPRESSION,
                   compression_level=COMPRESSION_LEVEL, write_statistics=False,
                   use_dictionary=["partition"], column_encoding=_ENCODINGS)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    return data, SegmentEntry(segment_name(step, digest), len(data), digest)


def decode_segment(data: bytes | None, entry: SegmentEntry, where: str) -> pl.DataFrame:
    """The rows of segment ``entry`` read from ``where`` as ``data`` (None: absent),
    after its size and hash are checked; ArchiveDamagedError otherwise."""
    at = f"archive segment {where}/{entry.name}"
    if data is None:
        raise ArchiveDamagedError(
            f"{at} is missing: the records it holds are needed (the broker no longer "
            "has them); nothing was skipped or committed. Restore the object, or "
            "replay from a later position into a new destination")
    if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise ArchiveDamagedError(
            f"{at} is damaged: {len(data)} bytes, SHA-256 "
            f"{hashlib.sha256(data).hexdigest()[:16]}..., but its signed step plan "
            f"recorded {entry.bytes} bytes, {entry.sha256[:16]}...; nothing was read "
            "from it, skipped or committed")
    try:
        frame = pl.read_parquet(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - any decoding failure is damage
        raise ArchiveDamagedError(f"{at} is not a readable segment ({exc})") from None
    if dict(frame.schema) != SEGMENT_SCHEMA:
        raise ArchiveDamagedError(f"{at} has columns {dict(frame.schema)}, not a segment's")
    return frame


__all__ = [
    "SEGMENT_SCHEMA",
    "ArchiveDamagedError",
    "SegmentEntry",
    "decode_segment",
    "encode_segment",
    "segment_name",
    "segment_step",
]
