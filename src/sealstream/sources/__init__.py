"""File sources: each file is one partition, read chunk by chunk.

>>> from pathlib import Path
>>> import tempfile
>>> d = Path(tempfile.mkdtemp())
>>> _ = (d / "p.jsonl").write_text('{"user": "a", "ts": 1000, "amount": 2.5}\\n')
>>> plan = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})
>>> reader = open_partition("jsonl", "p.jsonl", d / "p.jsonl", plan)
>>> chunk = reader.next_chunk(100)
>>> chunk.events["__f:amount"].to_list(), chunk.eof
([2.5], True)
>>> reader.close()
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecError
from ._base import (
    BAD_SCHEMA,
    KEY,
    KEY_IS_INT,
    OFFSET,
    PARTITION,
    RAW,
    TIME,
    Chunk,
    FieldKind,
    FieldPlan,
    PartitionPosition,
    PartitionReader,
    float_col,
    int_col,
    json_col,
)
from ._live import (
    MESSAGE_KEY,
    MESSAGE_TIMESTAMP,
    LivePartition,
    LiveSource,
    ValueParser,
    empty_chunk,
    is_nothing_yet,
)

KINDS = ("csv", "jsonl", "parquet")


def open_partition(
    kind: str,
    name: str,
    path: Path,
    plan: FieldPlan,
    position: PartitionPosition | None = None,
) -> PartitionReader:
    """Open one file as a partition, from its start or from ``position``.

    ``kind`` is ``"jsonl"``, ``"csv"`` or ``"parquet"``; ``name`` is the path as
    written in the spec (it names the partition in messages). Raises
    :class:`~sealstream.errors.SourceError` when the file cannot be read and
    :class:`~sealstream.errors.SourceChangedError` when ``position`` no longer
    matches the file (it shrank, was replaced or rotated). The reader's
    ``next_chunk`` raises :class:`~sealstream.errors.SourceChangedError` when the
    file changes while it is read (truncated, rewritten or replaced; growing is
    not a change), before it serves any record read after the change.
    """
    if kind == "jsonl":
        from .jsonl import JsonlReader

        return JsonlReader(name, Path(path), plan, position)
    if kind == "csv":
        from .csv import CsvReader

        return CsvReader(name, Path(path), plan, position)
    if kind == "parquet":
        from .parquet import ParquetReader

        return ParquetReader(name, Path(path), plan, position)
    raise SpecError(f"source kind {kind!r} is not supported: use one of {', '.join(KINDS)}")


__all__ = [
    "BAD_SCHEMA",
    "Chunk",
    "FieldKind",
    "FieldPlan",
    "KEY",
    "KEY_IS_INT",
    "KINDS",
    "LivePartition",
    "LiveSource",
    "MESSAGE_KEY",
    "MESSAGE_TIMESTAMP",
    "OFFSET",
    "PARTITION",
    "PartitionPosition",
    "PartitionReader",
    "RAW",
    "TIME",
    "ValueParser",
    "empty_chunk",
    "float_col",
    "int_col",
    "is_nothing_yet",
    "json_col",
    "open_partition",
]
