"""Windowed aggregates of several sources joined by key and window: the settings and
how they lower onto the one-source engine (docs/joins.md).

A several-source job (:class:`~sealstream.pipeline.source.Sources`) names each
aggregate after its source (``clicks.n = "count"``, ``views.spend = "sum(cost)"``).
It runs as one job over the union of the sources' events:

* each source's value fields are renamed ``SOURCE.FIELD`` as they are read, so an
  aggregate of a source reads only that source's events (the other rows carry a null
  there, and aggregates ignore nulls); a source's ``count`` counts the rows tagged
  with it;
* a source's own ``[sources.NAME.transform]`` (:func:`source_transform`) is compiled
  over that source's fields, before the renaming;
* a count per source says which sides a window saw: the user's own ``count`` of that
  source when there is one, else a hidden one (``?seen:SOURCE``);
* when a window fires, the join rule keeps or drops it and nulls the aggregates of a
  side that was not seen, then the derived fields (``[join.fields]``) are computed.

The window state, checkpoints, receipts and the guard are the one-source ones, so
they cover every side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from sealstream.aggspec import Aggregate, condition_field, field_kinds, parse_aggregate
from sealstream.errors import SpecError
from sealstream.pipeline.kafka import KafkaSourceSpec
from sealstream.pipeline.nats import NatsSourceSpec
from sealstream.pipeline.source import FileSource, Sources
from sealstream.sources._base import FieldKind, FieldPlan, int_col

if TYPE_CHECKING:
    from sealstream.pipeline.model import Pipeline
    from sealstream.transforms import CompiledTransform

KEEP = "__keep"
"""The filter's verdict column (as :data:`sealstream.transforms._compile.KEEP`)."""

JoinType = Literal["inner", "left"]
SEEN_PREFIX = "?seen:"
"""The hidden per-source count a window's join rule reads."""
IDENTITY = ("key", "window_start", "window_end")
_QUALIFIED = re.compile(r'(?<!["\w.])([A-Za-z][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_.\-]*)'
                        r'(?![\w"])')


@dataclass(frozen=True)
class Join:
    """How the sides of a several-source job combine per (key, window).

    ``type = "inner"``: a window is emitted when every source has at least one event
    in it. ``type = "left"``: when the ``left`` source (default: the source named
    first) has one; the aggregates of a source without events in the window are
    null (a count too, as in SQL's outer join). ``fields``: derived result fields,
    name -> SQL expression (or Polars expression) over the aggregates, the key and
    the window bounds, e.g. ``{"ctr": "clicks.n / views.n"}``; computed in order, after
    the join rule. A non-finite value (a division by zero) is written as null.
    """

    type: JoinType = "inner"
    left: str | None = None
    fields: Mapping[str, str | pl.Expr] = field(default_factory=dict)


def seen_name(source: str) -> str:
    return SEEN_PREFIX + source


def split_name(name: str, sources: Sources) -> tuple[str, str]:
    """``"clicks.n"`` -> ``("clicks", "n")``; SpecError naming the setting otherwise."""
    src, dot, rest = name.partition(".")
    if not dot or not rest:
        raise SpecError(f"aggregates.{name}: in a several-source job an aggregate is named "
                        f"SOURCE.NAME (e.g. {sources.names[0]}.n = \"count\")")
    if src not in sources.members:
        raise SpecError(f"aggregates.{name}: {src!r} is not a source; the sources are "
                        f"{', '.join(sources.names)}")
    return src, rest


def lowered_aggregates(aggregates: Mapping[str, str], sources: Sources) -> list[Aggregate]:
    """The engine's aggregates: each user aggregate reading its source's fields (a
    count counting its source's events), then one hidden count per source."""
    out: list[Aggregate] = []
    for name, text in aggregates.items():
        a = parse_aggregate(name, text)
        src, _ = split_name(name, sources)
        if a.func == "count_if":
            raise SpecError(f"aggregates.{name}: count_if is not supported yet in a "
                            "several-source job")
        if a.func == "count":
            out.append(Aggregate(name, "count_if", None, source=src))
        else:
            assert a.field is not None
            out.append(Aggregate(name, a.func, f"{src}.{a.field}", q=a.q, source=src))
    for src in sources.names:
        if seen_aggregate(out, src) == seen_name(src):  # no count of its own to read
            out.append(Aggregate(seen_name(src), "count_if", None, source=src))
    return out


def seen_aggregate(aggs: list[Aggregate], source: str) -> str:
    """The aggregate that counts ``source``'s events in a window: the user's first
    ``count`` of that source, else the hidden ``?seen:SOURCE``."""
    return next((a.name for a in aggs if a.source == source and a.func == "count_if"
                 and not a.name.startswith("?")), seen_name(source))


def own_aggregates(aggs: list[Aggregate], name: str) -> list[Aggregate]:
    """A source's aggregates reading its fields under their own names."""
    prefix = name + "."
    return [a if a.field is None else replace(a, field=a.field.removeprefix(prefix))
            for a in aggs if a.source == name]


def source_plan(aggs: list[Aggregate], sources: Sources, name: str) -> FieldPlan:
    """What one source's reader extracts: its key, its time, and the fields its
    aggregates and its transform read (under their own names; a field its transform
    derives is not read)."""
    member = sources.members[name]
    assert isinstance(member.key, str)
    own = own_aggregates(aggs, name)
    tf = source_transform(sources, aggs, name)
    if tf is not None:
        return tf.source_plan(member.key, member.time, own)
    kinds: dict[str, FieldKind] = dict(field_kinds([a for a in own if a.field is not None]))
    return FieldPlan(key=member.key, time=member.time, fields=kinds)


@dataclass(frozen=True)
class _SourceSettings:
    """One source's transform settings, as :func:`compile_transform` reads them."""

    where: str | pl.Expr | None
    fields: Mapping[str, str | pl.Expr]
    parsed_aggregates: list[Aggregate]
    map_batches: None = None
    key_fields: None = None


def source_transform(sources: Sources, aggs: list[Aggregate],
                     name: str) -> CompiledTransform | None:
    """The compiled ``[sources.NAME.transform]`` of one source (None without one);
    every setting (in errors and in bad records' reasons) is named
    ``sources.NAME.transform....``."""
    from sealstream.transforms import compile_transform

    st = sources.transforms.get(name)
    if st is None or (st.where is None and not st.fields):
        return None
    member = sources.members[name]
    pre = f"sources.{name}."
    try:
        tf = compile_transform(_SourceSettings(st.where, st.fields, own_aggregates(aggs, name)))
    except SpecError as exc:
        raise SpecError(pre + str(exc)) from None
    assert tf is not None
    for f in (member.key, member.time):
        if f in tf.derived:
            raise SpecError(f"{pre}transform.fields.{f}: deriving a source's key or time "
                            "field is not supported yet in a several-source job")
    steps = tuple(replace(s, setting=pre + s.setting) for s in tf.steps)
    where = next((s for s in steps if s.kind == "where"), None)
    return replace(tf, steps=steps, where=where)


def condition_names(aggs: list[Aggregate], name: str) -> list[str]:
    """The 0/1 condition fields a source's rows carry (its counts and its seen-count)."""
    return [condition_field(a.name) for a in aggs
            if a.source == name and a.func == "count_if"]


@dataclass(frozen=True)
class UnionPlan(FieldPlan):
    """A field plan whose events also carry the 0/1 condition columns (integers only)."""

    conditions: tuple[str, ...] = ()

    def _union_schema(self) -> dict[str, pl.DataType]:
        schema = super().event_schema()
        for c in self.conditions:
            schema[int_col(c)] = pl.Int64()
        return schema


    #: some source has a filter: events carry its verdict (the engine drops the
    #: events it rejects once the watermark has seen them, as for one source)
    keep: bool = False

    def event_schema(self) -> dict[str, pl.DataType]:
        schema = self._union_schema()
        if self.keep:
            schema[KEEP] = pl.Boolean()
        return schema


def union_plan(aggs: list[Aggregate], sources: Sources) -> FieldPlan:
    """The columns of the union's events: every source's renamed fields and every
    condition field, keyed and timed as the first source (names unused)."""
    conditions = tuple(c for name in sources.names for c in condition_names(aggs, name))
    keep = any(t.where is not None for t in sources.transforms.values())
    return UnionPlan(key=sources.key, time=sources.time, fields=dict(field_kinds(aggs)),
                     conditions=conditions, keep=keep)


def quote_names(text: str, names: set[str], setting: str) -> str:
    """Quote the aggregate names an SQL expression reads (``clicks.n`` -> ``"clicks.n"``);
    a qualified name that is no aggregate is a SpecError naming ``setting``."""

    def repl(m: re.Match[str]) -> str:
        whole = m.group(0)
        if whole not in names:
            raise SpecError(f"{setting} = {text!r}: {whole!r} is not an aggregate; the "
                            f"aggregates are {', '.join(sorted(names))}")
        return f'"{whole}"'

    return _QUALIFIED.sub(repl, text)


def derived_exprs(p: Pipeline) -> list[tuple[str, str, pl.Expr]]:
    """``(name, text, expression)`` of each derived result field, checked: it reads
    only aggregates, the key, the window bounds and earlier derived fields."""
    from sealstream.transforms import check_polars, parse_sql

    join = p.join or Join()
    known = set(p.aggregates)
    readable = known | set(IDENTITY)
    out: list[tuple[str, str, pl.Expr]] = []
    if not isinstance(join.fields, Mapping):
        raise SpecError(f"join.fields: expected a table of name = expression, got "
                        f"{join.fields!r:.60}")
    for name, value in join.fields.items():
        setting = f"join.fields.{name}"
        if not isinstance(name, str) or not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", name):
            raise SpecError(f"{setting}: {name!r} is not a valid field name")
        if name in readable:
            raise SpecError(f"{setting}: {name!r} already names a result field")
        if isinstance(value, pl.Expr):
            text, expr = str(value), check_polars(setting, value)
        elif isinstance(value, str):
            text, expr = value, parse_sql(setting, quote_names(value, known, setting))
        else:
            raise SpecError(f"{setting}: expected an expression (a string), got {value!r}")
        for root in expr.meta.root_names():
            if root not in readable:
                raise SpecError(f"{setting} = {text!r}: {root!r} is not an aggregate; the "
                                f"aggregates are {', '.join(sorted(known))}")
        out.append((name, text, expr))
        readable.add(name)
    return out


def check_join(p: Pipeline) -> None:
    """The settings of a several-source job; SpecError naming the first bad one."""
    assert isinstance(p.source, Sources)
    sources = p.source
    join = p.join or Join()
    if not isinstance(join, Join):
        raise SpecError(f"join: expected a Join, got {type(join).__name__} {join!r:.60}")
    if join.type not in ("inner", "left"):
        raise SpecError(f"join.type: {join.type!r} is not one of inner, left")
    if join.left is not None:
        if join.type != "left":
            raise SpecError("join.left: only a left join names its left source")
        if join.left not in sources.members:
            raise SpecError(f"join.left: {join.left!r} is not a source; the sources are "
                            f"{', '.join(sources.names)}")
    for name, member in sources.members.items():
        for setting, val in (("key", member.key), ("time", member.time)):
            if not isinstance(val, str) or not val:
                raise SpecError(f"sources.{name}.{setting}: must be a non-empty field name, "
                                f"got {val!r}")
        if member.key == member.time:
            raise SpecError(f"sources.{name}.key and sources.{name}.time are the same field "
                            f"{member.time!r}")
        if isinstance(member, FileSource) and not member.paths:
            raise SpecError(f"sources.{name}.paths: at least one input file is needed")
        if member.kind not in ("jsonl", "csv", "parquet", "kafka", "nats"):
            raise SpecError(f"sources.{name}.kind: {member.kind!r} is not one of jsonl, csv, "
                            "parquet, kafka, nats")
    aggs = lowered_aggregates(p.aggregates, sources)
    for a in aggs:
        if a.source is not None and a.field is not None:
            member = sources.members[a.source]
            if a.field.removeprefix(a.source + ".") == member.key:
                raise SpecError(f"aggregates.{a.name}: {a.expr} reads the key field")
    if p.types:
        raise SpecError("source.types: declared types are not supported yet in a "
                        "several-source job")
    if p.where is not None or p.fields or p.map_batches is not None:
        raise SpecError("transform: in a several-source job each source has its own "
                        "[sources.NAME.transform] (a [transform] of the union is not "
                        "supported yet)")
    for name in sources.names:
        source_transform(sources, aggs, name)
    if p.workers is not None:
        raise SpecError("pipeline.workers: a several-source job runs in one process for now")
    if p.enrich:
        raise SpecError("[[enrich]]: enrichment is not supported yet in a several-source job "
                        "(a job with one [source] can enrich)")
    if p.archive is not None:
        raise SpecError("[archive]: the raw-event archive is not supported yet in a "
                        "several-source job; it is for a job with one kafka or nats "
                        "[source] (remove the section)")
    derived_exprs(p)


def join_fingerprint(p: Pipeline) -> dict[str, Any]:
    """What a several-source job's state depends on, in place of ``source``."""
    assert isinstance(p.source, Sources)
    join = p.join or Join()
    left = join.left or p.source.first_named
    return {
        "sources": {
            name: {"kind": m.kind, "partitions": _partitions_print(m),
                   "key": m.key, "time": m.time, **_transform_print(p, name)}
            for name, m in sorted(p.source.members.items())
        },
        "join": {"type": join.type, **({"left": left} if join.type == "left" else {}),
                 "fields": {n: t for n, t, _ in derived_exprs(p)}},
    }


def _partitions_print(m: FileSource | KafkaSourceSpec | NatsSourceSpec) -> list[str]:
    """A source's partitions in the fingerprint, as for one source: a topic (its
    partitions may grow), NATS subjects, a followed source's paths as written, else
    the files."""
    if isinstance(m, KafkaSourceSpec):
        return [m.topic]
    if isinstance(m, NatsSourceSpec):
        return list(m.subjects)
    if m.follow:
        return list(m.paths)
    return [n for n, _ in m.partitions()]


def _transform_print(p: Pipeline, name: str) -> dict[str, Any]:
    """A source's transform in the fingerprint, only when it has one (so the
    fingerprint of a job without them is what it was)."""
    assert isinstance(p.source, Sources)
    tf = source_transform(p.source, p.parsed_aggregates, name)
    return {} if tf is None else {"transform": tf.fingerprint()}
