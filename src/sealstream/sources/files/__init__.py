"""File sources: JSONL, CSV and Parquet files, each file one partition.

:func:`open_partition` opens one file as a bounded
:class:`~sealstream.sources._base.PartitionReader`.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import SpecError
from .._base import FieldPlan, PartitionPosition, PartitionReader

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
    if name.lower().startswith("s3://"):  # a cached object: positions carry its ETag
        from .s3 import S3Partition

        return S3Partition(lambda pos: _open_file(kind, name, path, plan, pos),
                           name, path, position)
    return _open_file(kind, name, path, plan, position)


def _open_file(kind: str, name: str, path: Path, plan: FieldPlan,
               position: PartitionPosition | None) -> PartitionReader:
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


__all__ = ["KINDS", "open_partition"]
