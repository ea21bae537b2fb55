"""The raw-event archive (``[archive] url = ...``): every record a live step reads,
kept in object storage (or a directory), so that a recovery still finds the records a
stream's retention deleted.

How it is written (:class:`Archiver`, driven by the live runtime,
:mod:`sealstream._runtime.live`):

1. While the archive is on, each broker partition hands a copy of the raw messages it
   polls to the archiver (a columnar frame per poll: position, key, broker timestamp,
   value; never a Python loop per record).
2. When a live step is planned, the records of its ranges ``[from, to)`` of every
   partition become one Parquet *segment* (columns ``partition``, ``position``,
   ``key``, ``timestamp_ms``, ``value``), created if absent under
   ``seg-<step>-<sha256 prefix>.parquet``.
3. Only then is the step's plan recorded (:mod:`sealstream.checkpoint.plans`), naming
   the segment, its size and its SHA-256. Plans are chained and signed, and each
   checkpoint's manifest names the digest of the last step it includes: the manifest
   binds every segment of the steps before it, through the chain. A checkpoint that
   moves past a position is published after the step that read it, so the archive
   covers every position read after the oldest retained checkpoint.

How it is read (:class:`ArchivedPartition`): when a resume, a fallback or the replay
of recorded steps needs positions the broker no longer holds, the partition serves the
recorded ranges from their segments - each segment's size and SHA-256 checked against
the verified plan before a byte of it is parsed, its shape checked after - through the
same parser as the broker's messages (so the records are typed identically), then
hands over to the broker where the archive ends.

Retention: the segments of steps at or before the oldest retained checkpoint's step go
with the plans of those steps (:meth:`Archiver.prune`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sealstream.archive._segments import (
    SEGMENT_SCHEMA,
    ArchiveDamagedError,
    SegmentEntry,
    decode_segment,
    encode_segment,
    segment_name,
    segment_step,
)

__all__ = [
    "SEGMENT_SCHEMA",
    "ArchiveDamagedError",
    "ArchiveSettings",
    "SegmentEntry",
    "decode_segment",
    "encode_segment",
    "segment_name",
    "segment_step",
]


@dataclass(frozen=True)
class ArchiveSettings:
    """``[archive]``: where the segments go (``s3://bucket/prefix`` or a directory,
    relative to the spec file) and the S3 endpoint (else ``AWS_ENDPOINT_URL``)."""

    url: str
    endpoint_url: str | None = None
    base_dir: Path = Path(".")
    #: ``sealstream replay``: the archive is only read (never written or pruned: it is
    #: the live job's), through the live job's step plans recorded after ``anchor``
    #: (the origin checkpoint's ``plan`` mark: its step and digest), read from
    #: ``live_store`` (a function opening the live checkpoint store)
    read_only: bool = False
    anchor: dict[str, Any] | None = None
    live_store: Any = None

    def location(self) -> str:
        """The URL, or the directory resolved against the spec's directory."""
        from sealstream._objects import is_object_url

        if is_object_url(self.url):
            return self.url
        return str(self.base_dir / self.url)
