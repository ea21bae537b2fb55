"""Sources: one contract (``_live``: partitions, positions, "nothing yet" vs "ended")
with the file kinds (``files/``: jsonl, csv, parquet) as one implementation of it,
beside the brokers (``kafka``, ``nats``).

Files: each file is one partition, read chunk by chunk.

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
from .files import KINDS, open_partition

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
