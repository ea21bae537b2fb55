"""Running a several-source job (docs/joins.md): each source's partitions read with
its own fields and tagged, and the join rule applied to windows as they fire.

The settings and their lowering are :mod:`sealstream.pipeline.join`; this module
is the columnar part:

* :class:`TaggedReader` wraps a partition reader of one source. A source with a
  ``[sources.NAME.transform]`` runs it first, on the chunk's columns (the one-source
  :class:`~sealstream.transforms.TransformStage`): derived fields, and the filter's
  verdict as ``__keep``, which the engine applies after the watermark has seen the
  events; records an expression fails on become the chunk's bad records. Each
  chunk's value fields are renamed ``SOURCE.FIELD`` and the source's 0/1 condition
  columns (its counts, its seen-count) are set, then the chunk takes the union's
  columns (the other sources' fields null). One column operation per chunk, never per event.
* :class:`JoinRule` filters fired windows (inner: every source seen; left: the left
  source seen), nulls the aggregates of unseen sides and adds the derived fields.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from sealstream import sources as _sources
from sealstream.aggspec import Aggregate, condition_field, field_kinds
from sealstream.pipeline import Pipeline
from sealstream.pipeline.join import (
    KEEP,
    Join,
    condition_names,
    derived_exprs,
    own_aggregates,
    seen_aggregate,
    source_plan,
    source_transform,
)
from sealstream.pipeline.source import Sources
from sealstream.sources._base import (
    BAD_SCHEMA,
    PARTITION,
    Chunk,
    FieldPlan,
    PartitionPosition,
    PartitionReader,
    float_col,
    int_col,
    json_col,
)
from sealstream.transforms import TransformStage
from sealstream.windows.aggregates import Accumulators, _float_json, _json_string

__all__ = ["JoinRule", "TaggedReader", "Tagger", "open_readers", "tagger"]


class Tagger:
    """What a chunk of one source becomes in the union: its transform run, its fields
    renamed ``SOURCE.FIELD``, its condition columns set, the union's columns.
    ``line_base``: a record's line is its position plus this (a file: 1, plus 1 for a
    CSV header; a topic: 0, its bad records are named by offset)."""

    def __init__(self, source: str, own: FieldPlan, conditions: list[str], union: FieldPlan,
                 stage: TransformStage | None = None, line_base: int = 1) -> None:
        self.source = source
        self._stage = stage
        self._line_base = line_base
        renames: dict[str, str] = {}
        fields = set(own.fields) | (set(stage.tf.derived) if stage is not None else set())
        for f in sorted(fields):
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
        missing = [pl.lit(True if c == KEEP else None, dtype=t).alias(c)
                   for c, t in self._schema.items() if c not in have]
        if missing:
            events = events.with_columns(missing)
        return events.select(list(self._schema))

    def tag(self, chunk: Chunk) -> Chunk:
        """The chunk with the union's columns (its transform run first)."""
        if self._stage is not None and (chunk.events.height or chunk.bad.height):
            chunk = self._transform(chunk)
        return replace(chunk, events=self._conform(chunk.events))

    def _transform(self, chunk: Chunk) -> Chunk:
        """The source's own derived fields and filter verdict, on the chunk's columns;
        records an expression fails on become the chunk's bad records (file, line)."""
        assert self._stage is not None
        events = chunk.events.with_columns(pl.lit(0, dtype=pl.Int32).alias(PARTITION))
        events, failed = self._stage.apply(events)
        events = events.drop(PARTITION)
        if not failed.height:
            return replace(chunk, events=events)
        offs = failed.get_column("_offset").to_numpy().astype(np.int64, copy=False)
        raw = (chunk.raw.texts(offs) if chunk.raw is not None
               else pl.Series([None] * len(offs), dtype=pl.String))
        bad = failed.select(
            pl.col("_offset"),
            (pl.col("_offset") + self._line_base).alias("_line"),
            pl.col("_reason"),
            raw.alias("_raw"),
        )
        bad = bad.select(pl.col(c).cast(t) for c, t in BAD_SCHEMA.items())
        bad = pl.concat([chunk.bad.select(list(BAD_SCHEMA)), bad])
        return replace(chunk, events=events, bad=bad.sort("_offset"))


class TaggedReader:
    """A partition reader of one source whose chunks carry the union's columns."""

    def __init__(self, reader: PartitionReader, tagger: Tagger) -> None:
        self.reader = reader
        self.name = reader.name
        self.tagger = tagger

    def next_chunk(self, max_records: int) -> Chunk | None:
        chunk = self.reader.next_chunk(max_records)
        return None if chunk is None else self.tagger.tag(chunk)

    def size_hint(self) -> tuple[int, int] | None:
        return self.reader.size_hint()

    def close(self) -> None:
        self.reader.close()


def open_readers(p: Pipeline, partitions: list[tuple[str, Path]],
                 resume: list[PartitionPosition]) -> list[PartitionReader]:
    """One tagged reader per partition of the union, in the read order."""
    assert isinstance(p.source, Sources)
    aggs = p.parsed_aggregates
    out: list[PartitionReader] = []
    owners = p.source.partition_sources()
    taggers = {src: tagger(p, src) for src in p.source.names}
    for (name, path), pos, src in zip(partitions, resume, owners, strict=True):
        member = p.source.members[src]
        own = source_plan(aggs, p.source, src)
        reader = _sources.open_partition(member.kind, name, path, own, pos)
        out.append(TaggedReader(reader, taggers[src]))
    return out


def tagger(p: Pipeline, src: str) -> Tagger:
    """The :class:`Tagger` of source ``src`` of the several-source pipeline ``p``."""
    assert isinstance(p.source, Sources)
    aggs = p.parsed_aggregates
    member = p.source.members[src]
    base = 0 if member.kind in ("kafka", "nats") else 2 if member.kind == "csv" else 1
    return Tagger(src, source_plan(aggs, p.source, src), condition_names(aggs, src),
                  p.field_plan(), _stage(aggs, p.source, src), base)


def _stage(aggs: list[Aggregate], sources: Sources, name: str) -> TransformStage | None:
    """One source's ``[sources.NAME.transform]`` as a stage over its own columns."""
    tf = source_transform(sources, aggs, name)
    if tf is None:
        return None
    member = sources.members[name]
    plan = source_plan(aggs, sources, name)
    numeric = frozenset(f for f, k in field_kinds(own_aggregates(aggs, name)).items()
                        if k == "numeric" and f in tf.derived)
    return TransformStage(tf, plan, numeric, member.key, member.time)


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
