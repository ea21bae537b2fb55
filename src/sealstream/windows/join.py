"""Running a several-source job (docs/joins.md): each source's partitions read with
its own fields and tagged, and the join rule applied to windows as they fire.

The settings and their lowering are :mod:`sealstream.pipeline.join`; this module
is the columnar part:

* :class:`TaggedReader` wraps a partition reader of one source. Each chunk's value
  fields are renamed ``SOURCE.FIELD`` and the source's 0/1 condition columns (its
  counts, its seen-count) are set, then the chunk takes the union's columns (the
  other sources' fields null). One column operation per chunk, never per event.
* :class:`JoinRule` filters fired windows (inner: every source seen; left: the left
  source seen), nulls the aggregates of unseen sides and adds the derived fields.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from sealstream import sources as _sources
from sealstream.aggspec import Aggregate, condition_field
from sealstream.pipeline import Pipeline
from sealstream.pipeline.join import (
    Join,
    condition_names,
    derived_exprs,
    seen_aggregate,
    source_plan,
)
from sealstream.pipeline.source import Sources
from sealstream.sources._base import (
    Chunk,
    FieldPlan,
    PartitionPosition,
    PartitionReader,
    float_col,
    int_col,
    json_col,
)
from sealstream.windows.aggregates import Accumulators, _float_json, _json_string

__all__ = ["JoinRule", "TaggedReader", "open_readers"]


class TaggedReader:
    """A partition reader of one source whose chunks carry the union's columns."""

    def __init__(self, reader: PartitionReader, source: str, own: FieldPlan,
                 conditions: list[str], union: FieldPlan) -> None:
        self.reader = reader
        self.name = reader.name
        renames: dict[str, str] = {}
        for f in own.fields:
            for col in (int_col, float_col, json_col):
                renames[col(f)] = col(f"{source}.{f}")
        self._renames = renames
        self._conditions = [pl.lit(1, dtype=pl.Int64).alias(int_col(c)) for c in conditions]
        self._schema = union.event_schema()

    def _conform(self, events: pl.DataFrame) -> pl.DataFrame:
        events = events.rename({k: v for k, v in self._renames.items() if k in events.columns})
        if self._conditions:
            events = events.with_columns(self._conditions)
        have = set(events.columns)
        missing = [pl.lit(None, dtype=t).alias(c) for c, t in self._schema.items()
                   if c not in have]
        if missing:
            events = events.with_columns(missing)
        return events.select(list(self._schema))

    def next_chunk(self, max_records: int) -> Chunk | None:
        chunk = self.reader.next_chunk(max_records)
        if chunk is None:
            return None
        return replace(chunk, events=self._conform(chunk.events))

    def size_hint(self) -> tuple[int, int] | None:
        return self.reader.size_hint()

    def close(self) -> None:
        self.reader.close()


def open_readers(p: Pipeline, partitions: list[tuple[str, Path]],
                 resume: list[PartitionPosition]) -> list[PartitionReader]:
    """One tagged reader per partition of the union, in the read order."""
    assert isinstance(p.source, Sources)
    aggs = p.parsed_aggregates
    union = p.field_plan()
    out: list[PartitionReader] = []
    owners = p.source.partition_sources()
    for (name, path), pos, src in zip(partitions, resume, owners, strict=True):
        member = p.source.members[src]
        own = source_plan(aggs, p.source, src)
        reader = _sources.open_partition(member.kind, name, path, own, pos)
        out.append(TaggedReader(reader, src, own, condition_names(aggs, src), union))
    return out


def _json_of(col: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """The JSON text of a derived field's values (null: ``null``)."""
    if dtype.is_integer():
        return col.cast(pl.String)
    if dtype.is_float():
        return _float_json(col.cast(pl.Float64))
    if dtype == pl.Boolean:
        return pl.when(col).then(pl.lit("true")).otherwise(pl.lit("false"))
    if dtype == pl.String:
        return _json_string(col)
    return pl.struct(col.alias("v")).struct.json_encode().str.strip_prefix('{"v":') \
        .str.strip_suffix("}")


@dataclass(frozen=True)
class JoinRule:
    """The join of a several-source job, applied to fired windows."""

    type: str
    left: str
    sources: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]
    derived: tuple[tuple[str, pl.Expr], ...]

    @classmethod
    def of(cls, p: Pipeline) -> JoinRule | None:
        """The pipeline's join rule (None for a one-source pipeline)."""
        if not isinstance(p.source, Sources):
            return None
        join = p.join or Join()
        return cls(type=join.type, left=join.left or p.source.first_named,
                   sources=p.source.names, aggregates=tuple(p.parsed_aggregates),
                   derived=tuple((n, e) for n, _, e in derived_exprs(p)))

    def finalize(self, acc: Accumulators, fired: pl.DataFrame) -> pl.DataFrame:
        """Result rows of the fired windows the rule keeps, with the derived fields."""
        aggs = list(self.aggregates)
        seen = {s: pl.col(f"#ci:{condition_field(seen_aggregate(aggs, s))}").fill_null(0) > 0
                for s in self.sources}
        keep = pl.all_horizontal(list(seen.values())) if self.type == "inner" \
            else seen[self.left]
        fired = fired.filter(keep)
        present = {a.name: seen[a.source] for a in self.aggregates if a.source is not None}
        res = acc.finalize(fired, present)
        if not self.derived:
            return res
        tail: list[pl.Expr] = []
        for name, expr in self.derived:
            value = res.select(expr.alias(name)).to_series()
            if value.dtype.is_float():
                value = res.select(pl.when(expr.is_finite()).then(expr).alias(name)) \
                    .to_series()
            res = res.with_columns(value)
            tail += [pl.lit(f',"{name}":'),
                     _json_of(pl.col(name), value.dtype).fill_null(pl.lit("null"))]
        line = pl.concat_str([pl.col("__json").str.strip_suffix("}"), *tail, pl.lit("}")])
        cols = [c for c in res.columns if c != "__json"]
        return res.select(*cols, line.alias("__json"))
