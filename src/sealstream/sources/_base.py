"""The contract between file sources and the runtime.

A source is a list of partitions. Each partition is an ordered, replayable
sequence of records; a record's identity is ``(partition, offset)`` where the
offset is the 0-based index of its line (JSONL; CSV not counting the header)
or row (Parquet). Blank lines are not records but still count as lines, so
offsets may have gaps.

A :class:`PartitionReader` turns a partition into :class:`Chunk` objects, each
holding consecutive records, already parsed into typed columns (never a Python
loop per record on the good path) and split into good events and bad records.

Event columns (``Chunk.events``), in this order:

=================  =========  ==================================================
``__off``          Int64      offset of the record
``__key``          String     the key's text (JSON strings unquoted, numbers as
                              written, CSV text as is)
``__kint``         Boolean    True when the key was a JSON/Parquet integer (the
                              result then shows it as a number); False otherwise
``__t``            Int64      event time, ms since the epoch (ISO-8601 converted)
``__i:<f>``        Int64      for each value field ``f``: the value if it is an
                              integer, else null
``__f:<f>``        Float64    the value if it is a non-integer number
                              (JSON ``2.0`` is a float), else null
``__s:<f>``        String     only for fields of kind ``"any"``: the value as
                              JSON text when it is not a number (``"abc"`` with
                              its quotes, ``true``, ``{"a":1}``), else null
``__d:<f>``        Int128     instead of ``__i``/``__f``, for a field declared
                              ``decimal(P, S)`` (``FieldPlan.decimals``): the
                              exact value in units of ``10**-S`` (``12.50`` with
                              S = 2 is 1250), null when missing or null
=================  =========  ==================================================

The record as one JSON object text (JSONL: the line as written, no newline;
CSV: header -> text; Parquet: the row encoded as JSON) is not a column: it
is looked up on demand through ``Chunk.raw`` (:class:`RawSpan`), for the few
events that are written out as they were read (late events).

Bad records (``Chunk.bad``): ``_offset`` Int64, ``_line`` Int64 (1-based line
in the file, or 1-based row for Parquet), ``_reason`` String (one readable
sentence naming the field), ``_raw`` String (the line as written, or the row
as JSON).

A record is bad when it cannot be parsed, is not an object, lacks the key or
time field (missing or null), has a time that is neither an integer nor an
ISO-8601 string, or has a non-numeric, non-null value in a field of kind
``"numeric"``, or a value of a decimal field that is not a decimal number
(a JSON number or string, or CSV text, ``-?digits[.digits]``) or does not fit
its ``decimal(P, S)`` (more than ``P - S`` integer digits, or more than ``S``
fraction digits other than trailing zeros: never rounded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import polars as pl

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

FieldKind = Literal["numeric", "any"]

OFFSET = "__off"
KEY = "__key"
KEY_IS_INT = "__kint"
TIME = "__t"
MAX_TIME_MS = 2**61
"""Event times beyond +-MAX_TIME_MS (about 73 million years) are bad records: the
engine's infinities (``watermark.POS_INF``, 2**62) must stay above every window end
plus lateness."""
RAW = "__raw"
"""The column a record's raw JSON text takes where it is written out."""
PARTITION = "__p"  # added by the runtime, not by sources


def int_col(field_name: str) -> str:
    return f"__i:{field_name}"


def float_col(field_name: str) -> str:
    return f"__f:{field_name}"


def json_col(field_name: str) -> str:
    return f"__s:{field_name}"


def dec_col(field_name: str) -> str:
    """The column of a decimal field's exact value (Int128, units of 10**-scale)."""
    return f"__d:{field_name}"


BAD_SCHEMA: dict[str, pl.DataType] = {
    "_offset": pl.Int64(),
    "_line": pl.Int64(),
    "_reason": pl.String(),
    "_raw": pl.String(),
}


@dataclass(frozen=True)
class FieldPlan:
    """Which fields a source must extract, and how strictly."""

    key: str
    time: str
    fields: dict[str, FieldKind] = field(default_factory=dict)
    #: the key (time) is a field the pipeline's transform derives: the source leaves
    #: ``__key`` (``__t``) null and a record lacking that field is not bad for it
    derived_key: bool = False
    derived_time: bool = False
    #: value fields declared ``decimal(P, S)``: field -> (P, S); their events carry
    #: ``__d:<f>`` instead of ``__i:<f>``/``__f:<f>``
    decimals: dict[str, tuple[int, int]] = field(default_factory=dict)

    def event_schema(self) -> dict[str, pl.DataType]:
        schema: dict[str, pl.DataType] = {
            OFFSET: pl.Int64(),
            KEY: pl.String(),
            KEY_IS_INT: pl.Boolean(),
            TIME: pl.Int64(),
        }
        for name in sorted(self.fields):
            if name in self.decimals:
                schema[dec_col(name)] = pl.Int128()
                continue
            schema[int_col(name)] = pl.Int64()
            schema[float_col(name)] = pl.Float64()
            if self.fields[name] == "any":
                schema[json_col(name)] = pl.String()
        return schema


@dataclass(frozen=True)
class PartitionPosition:
    """Where a partition's reading resumes, and what the consumed prefix was.

    ``offset`` is the offset the next record would have (records before it are
    consumed). ``byte_offset`` is where reading resumes in the file (the row
    index for Parquet). ``identity`` lets a restart detect that the file
    shrank or was replaced: JSON-serialisable, compared for equality by the
    reader when it reopens at this position.
    """

    offset: int = 0
    byte_offset: int = 0
    identity: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "byte_offset": self.byte_offset, "identity": self.identity}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionPosition:
        return cls(int(data["offset"]), int(data["byte_offset"]), dict(data.get("identity", {})))


RawTexts = Callable[["npt.NDArray[np.int64]"], pl.Series]
"""Offsets of records -> their raw JSON text (a String Series in that order)."""


@dataclass(frozen=True)
class RawSpan:
    """Where the raw text of the events with offsets ``first..last`` of one
    partition comes from. Events do not carry their text (building it for
    every event costs more than the rest of typing); the few that need it
    (late events) are looked up while their batch is handled."""

    first: int
    last: int
    texts: RawTexts


@dataclass
class Chunk:
    """Consecutive records of one partition.

    ``last_offset`` is the offset of the last record (good or bad) in the chunk,
    or None when it holds none. ``eof`` is True when no record follows: the
    reader must know this when it returns the chunk holding the last record
    (read ahead if needed), because the partition's watermark becomes +inf
    right after that record. ``position`` is where reading resumes after it.
    """

    events: pl.DataFrame
    bad: pl.DataFrame
    last_offset: int | None
    position: PartitionPosition
    eof: bool
    raw: RawSpan | None = None
    """The raw text of the chunk's events (None when it has none)."""


class PartitionReader(Protocol):
    """Reads one partition from a position, chunk by chunk."""

    name: str
    """The partition's name: its path as written in the spec."""

    def next_chunk(self, max_records: int) -> Chunk | None:
        """The next chunk of at most ``max_records`` lines/rows, or None once at end.

        Raises :class:`~sealstream.errors.SourceChangedError` when the file changed
        since it was opened (checked before every chunk, the last one included)."""
        ...

    def size_hint(self) -> tuple[int, int] | None:
        """``(consumed_bytes, total_bytes)`` for progress, or None when unknown."""
        ...

    def close(self) -> None: ...
