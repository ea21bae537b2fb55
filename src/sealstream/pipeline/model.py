"""The pipeline model: frozen dataclasses for every part of a pipeline, the
aggregate parser, the fingerprint of what saved state depends on, and the
readable diff of two fingerprinted definitions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

# the aggregate settings live in a low room (sealstream.aggspec); re-exported here
from sealstream.aggspec import AGGREGATE_FUNCTIONS as AGGREGATE_FUNCTIONS
from sealstream.aggspec import NUMERIC_FUNCTIONS as NUMERIC_FUNCTIONS
from sealstream.aggspec import RESERVED_OUTPUT_NAMES as RESERVED_OUTPUT_NAMES
from sealstream.aggspec import RESULT_KIND as RESULT_KIND
from sealstream.aggspec import Aggregate as Aggregate
from sealstream.aggspec import field_kinds as field_kinds
from sealstream.aggspec import parse_aggregate as parse_aggregate
from sealstream.archive import ArchiveSettings
from sealstream.errors import SpecError
from sealstream.pipeline import join as _join
from sealstream.pipeline.join import Join
from sealstream.pipeline.kafka import KafkaSourceSpec
from sealstream.pipeline.nats import NatsSourceSpec
from sealstream.pipeline.source import FileSource, Sources
from sealstream.sources._base import FieldPlan

if TYPE_CHECKING:
    from sealstream.enrich import Enrich
    from sealstream.transforms import MapBatches

STATE_FORMAT_VERSION = 1
# records per partition per step: memory and speed only, never the results
DEFAULT_BATCH_SIZE = 262_144
#: without a limit (``[pipeline] max_bad_ratio``, ``--max-bad-ratio``) a run fails
#: (exit 1, after committing) only when it had records and none was good, and warns
#: when more than this share of its records is bad
WARN_BAD_RATIO = 0.5

WindowKind = Literal["tumbling", "sliding", "session"]



@dataclass(frozen=True)
class Watermark:
    """Bounded out-of-orderness: ``W_p = max(event time seen in p) - max_delay_ms``."""

    max_delay_ms: int = 0
    #: live runs: a partition quiet this long (processing time) leaves the global
    #: minimum; when all are, W advances with the wall clock (docs/live.md)
    idle_ms: int | None = None


@dataclass(frozen=True)
class Tumbling:
    """Fixed windows ``[k*size, (k+1)*size)``."""

    size_ms: int
    allowed_lateness_ms: int = 0
    kind: Literal["tumbling"] = "tumbling"


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size_ms`` starting every ``slide_ms`` (``0 < slide <= size``)."""

    size_ms: int
    slide_ms: int
    allowed_lateness_ms: int = 0
    kind: Literal["sliding"] = "sliding"


@dataclass(frozen=True)
class Session:
    """Per-key sessions closed by ``gap_ms`` of inactivity (Flink semantics)."""

    gap_ms: int
    allowed_lateness_ms: int = 0
    kind: Literal["session"] = "session"


Window = Tumbling | Sliding | Session


@dataclass(frozen=True)
class Output:
    """A directory output (``jsonl`` or ``parquet``), ``stdout``, a database table
    (``sqlite`` or ``postgresql``: ``url`` and ``table``; results only), or a Kafka
    topic (``kafka``: ``bootstrap``, ``topic``, client ``settings``; ``path`` is then
    the optional local staging directory)."""

    kind: Literal["jsonl", "parquet", "stdout", "sqlite", "postgresql", "kafka"]
    path: str | None = None
    base_dir: Path = Path(".")
    url: str | None = None
    table: str | None = None
    bootstrap: str | None = None
    topic: str | None = None
    #: librdkafka settings of a kafka output, as (name, value) pairs
    settings: tuple[tuple[str, str], ...] = ()
    #: an ``s3://`` path's endpoint (else ``AWS_ENDPOINT_URL``, else AWS itself)
    endpoint_url: str | None = None

    @property
    def resolved(self) -> Path:
        if self.path is None:
            raise SpecError(f"an output of kind {self.kind!r} has no path")
        return self.base_dir / self.path


@dataclass(frozen=True)
class Checkpoints:
    """Where and how often to checkpoint; ``keep`` verified checkpoints are retained."""

    path: str = ""
    every_events: int | None = None
    every_ms: int | None = None
    keep: int = 3
    base_dir: Path = Path(".")
    #: write deltas (only the keys whose windows changed) between full snapshots
    incremental: bool = False
    #: with ``incremental``: a full snapshot every this many checkpoints
    full_every: int = 10
    #: encode, write and publish checkpoints on a writer thread while processing
    #: continues (sinks commit after the publish either way)
    asynchronous: bool = True
    #: instead of ``path``: a store URL, ``sqlite:///ckpt.db`` (relative to ``base_dir``)
    url: str | None = None
    #: freshness: a checkpoint older than this many seconds is STALE (not resumed
    #: from); None: any age
    max_age_s: float | None = None
    #: resume only from checkpoints whose manifest signs their epoch's Merkle receipt
    #: root (older ones are PARTIAL_CHECKPOINT_REJECT, reason NO_RECEIPT_ROOTS)
    require_receipts: bool = False
    #: an ``s3://`` store's endpoint (else ``AWS_ENDPOINT_URL``, else AWS itself)
    endpoint_url: str | None = None

    @property
    def resolved(self) -> Path:
        return self.base_dir / self.path

    def open_store(self, pipeline: str) -> Any:
        """The checkpoint store this section names (a CheckpointStore)."""
        from sealstream.checkpoint.stores import open_store

        return open_store(self.url if self.url else self.resolved, pipeline, self.base_dir,
                          self.endpoint_url)


class _Required:
    """The default of a required setting that ``sources=`` makes optional to write."""

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()

SourcesArg = Mapping[str, FileSource | KafkaSourceSpec | NatsSourceSpec] | Sources
"""``Pipeline(sources=...)``: source name -> source, or a :class:`Sources`."""


@dataclass(frozen=True)
class Pipeline:
    """A complete, validated pipeline definition. See the module docstring.

    ``source``, ``window``, ``aggregates`` and ``sink`` are required; several
    sources are given either as ``source=Sources({...})`` or, the same, as
    ``sources={"clicks": ..., "impressions": ...}`` (a mapping of source name to
    source, or a :class:`Sources`; docs/joins.md), never both.
    """

    name: str
    #: one source, or several (:class:`Sources`, joined: see ``join`` and docs/joins.md)
    source: FileSource | KafkaSourceSpec | NatsSourceSpec | Sources = _REQUIRED
    window: Window = _REQUIRED
    aggregates: Mapping[str, str] = _REQUIRED
    sink: Output = _REQUIRED
    watermark: Watermark = field(default_factory=Watermark)
    late: Output | None = None
    errors: Output | None = None
    checkpoint: Checkpoints | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    max_bad_ratio: float | None = None
    #: run as this many Ray workers (docs/scale-out.md); None: one process. Not part
    #: of the fingerprint: a checkpoint restores with any worker count
    workers: int | None = None
    #: keep only the events for which this is true (an SQL expression, or a Polars
    #: expression); see docs/transforms.md
    where: str | pl.Expr | None = None
    #: derived fields, in order: name -> SQL expression (or Polars expression); a
    #: later one may read an earlier one, the key and the time may be derived
    fields: Mapping[str, str | pl.Expr] = field(default_factory=dict)
    #: a batch function (:class:`sealstream.transforms.MapBatches`) after the derived
    #: fields, for what an expression cannot say; fingerprinted by its version
    map_batches: MapBatches | None = None
    #: declared field types (``[source] types``): field -> ``"decimal(P, S)"``; see
    #: docs/types.md
    types: Mapping[str, str] = field(default_factory=dict)
    #: several sources: how their windowed aggregates join (default: inner)
    join: Join | None = None
    #: reference tables joined to each event as of its time, before the transform
    #: (``[[enrich]]``, :class:`sealstream.enrich.Enrich`); see docs/enrich.md
    enrich: Sequence[Enrich] = ()
    #: ``[archive]``: the raw-event archive of a live source (docs/object-storage.md);
    #: not part of the fingerprint (it holds no state)
    archive: ArchiveSettings | None = None
    #: several sources, by name (``source=Sources(sources)``); not kept as a field
    sources: InitVar[SourcesArg | None] = None

    def __post_init__(self, sources: SourcesArg | None) -> None:
        from sealstream.pipeline.validate import validate

        if sources is not None:
            if self.source is not _REQUIRED:
                raise SpecError("source= and sources=: give one source, or several, not both")
            object.__setattr__(self, "source", sources if isinstance(sources, Sources)
                               else Sources(sources))
        for setting in ("source", "window", "aggregates", "sink"):
            if getattr(self, setting) is _REQUIRED:
                raise SpecError(f"{setting}: required setting is missing"
                                + (" (source= or sources=)" if setting == "source" else ""))

        validate(self)

    @property
    def key_fields(self) -> tuple[str, ...] | None:
        """A compound key's fields (None for a key written as one name)."""
        return self.source.key_fields

    @property
    def parsed_aggregates(self) -> list[Aggregate]:
        """The aggregates the windows keep (several sources: per source, see
        :mod:`sealstream.pipeline.join`)."""
        if isinstance(self.source, Sources):
            return _join.lowered_aggregates(self.aggregates, self.source)
        return [parse_aggregate(n, e) for n, e in self.aggregates.items()]

    def field_plan(self) -> FieldPlan:
        """What the source extracts: the key, the time and every field an aggregate or a
        transform reads (a field that a transform derives is not read from the source)."""
        from sealstream.transforms import compile_transform

        if isinstance(self.source, Sources):
            return _join.union_plan(self.parsed_aggregates, self.source)
        tf = compile_transform(self)
        if tf is None:
            assert isinstance(self.source.key, str)  # a compound key is a transform's
            return FieldPlan(key=self.source.key, time=self.source.time,
                             fields=field_kinds(self.parsed_aggregates),
                             decimals=self.decimals())
        return tf.source_plan(self.source.key, self.source.time, self.parsed_aggregates)

    def event_plan(self) -> FieldPlan:
        """The value fields events carry into the windows (after the transform): every
        field an aggregate reads, derived or not."""
        key = self.source.key if isinstance(self.source.key, str) else ",".join(self.source.key)
        return FieldPlan(key=key, time=self.source.time,
                         fields=field_kinds(self.parsed_aggregates), decimals=self.decimals())

    def decimals(self) -> dict[str, tuple[int, int]]:
        """The aggregated fields declared ``decimal(P, S)``: field -> (P, S)."""
        from sealstream.pipeline.types import decimal_types

        read = {a.field for a in self.parsed_aggregates}
        return {f: ps for f, ps in decimal_types(self.types).items() if f in read}

    def result_kinds(self) -> dict[str, str]:
        """Output name -> the kind of its typed value for typed outputs (database
        columns): the function's (:attr:`Aggregate.result_kind`), or ``decimal`` for
        sum, min, max and mean of a decimal field."""
        if isinstance(self.source, Sources):  # counts, functions, derived fields: floats
            kinds = {n: parse_aggregate(n, e).result_kind for n, e in self.aggregates.items()}
            return kinds | {n: "mean" for n, _, _ in _join.derived_exprs(self)}
        decimals = self.decimals()
        return {a.name: "decimal" if a.field in decimals else a.result_kind
                for a in self.parsed_aggregates}

    def fingerprint_fields(self) -> dict[str, Any]:
        """What the saved state depends on; changing any of these changes the fingerprint."""
        if isinstance(self.source, Sources):
            return {
                "format": STATE_FORMAT_VERSION,
                "pipeline": self.name,
                **_join.join_fingerprint(self),
                "watermark": {"max_delay_ms": self.watermark.max_delay_ms},
                "window": _window_dict(self.window),
                "aggregates": {a.name: a.expr for a in self.parsed_aggregates},
            }
        return {
            "format": STATE_FORMAT_VERSION,
            "pipeline": self.name,
            "source": {
                "kind": self.source.kind,
                "partitions": (list(self.source.paths) if self.source.follow
                               else [self.source.topic]
                               if isinstance(self.source, KafkaSourceSpec)
                               else list(self.source.subjects)
                               if isinstance(self.source, NatsSourceSpec)
                               else [n for n, _ in self.source.partitions()]),
                "key": (self.source.key if isinstance(self.source.key, str)
                        else list(self.source.key)),
                "time": self.source.time,
            },
            "watermark": {"max_delay_ms": self.watermark.max_delay_ms},
            "window": _window_dict(self.window),
            "aggregates": {a.name: a.expr for a in self.parsed_aggregates},
            **self._transform_fingerprint(),
            # declared types, only when some (older fingerprints stay what they were)
            **({"types": {f: list(ps) for f, ps in sorted(self.decimals().items())}}
               if self.decimals() else {}),
            # reference tables, only when some (their content is bound per checkpoint)
            **({"enrich": {e.name: e.describe() for e in self.enrich}} if self.enrich else {}),
        }

    def _transform_fingerprint(self) -> dict[str, Any]:
        """The transform and the sketch hash, only when used (so the fingerprint of a
        pipeline without them is what it was before transforms existed)."""
        from sealstream.transforms import compile_transform

        out: dict[str, Any] = {}
        tf = compile_transform(self)
        if tf is not None:
            out["transform"] = tf.fingerprint()
        if any(a.func == "approx_count_distinct" for a in self.parsed_aggregates):
            out["sketch"] = sketch_fingerprint()
        return out

    def fingerprint(self) -> str:
        blob = json.dumps(self.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _window_dict(w: Window) -> dict[str, Any]:
    if isinstance(w, Tumbling):
        return {"kind": "tumbling", "size_ms": w.size_ms, "lateness_ms": w.allowed_lateness_ms}
    if isinstance(w, Sliding):
        return {
            "kind": "sliding",
            "size_ms": w.size_ms,
            "slide_ms": w.slide_ms,
            "lateness_ms": w.allowed_lateness_ms,
        }
    return {"kind": "session", "gap_ms": w.gap_ms, "lateness_ms": w.allowed_lateness_ms}


def sketch_fingerprint() -> dict[str, Any]:
    """What approx_count_distinct's registers depend on: the HyperLogLog precision and
    the hash (Polars' ``hash``, stable within a Polars version only)."""
    import polars

    from sealstream.windows.sketches import HLL_PRECISION

    return {"hll_precision": HLL_PRECISION, "hash": f"polars-{polars.__version__}"}


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


ABSENT = "(absent)"


def definition_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[
    tuple[str, Any, Any]
]:
    """``(setting, old value, new value)`` for every setting of
    :meth:`Pipeline.fingerprint_fields` that differs, in a stable order.

    A setting present on one side only has :data:`ABSENT` on the other.
    """
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten("", old, a)
    _flatten("", new, b)
    out = []
    for k in list(a) + [k for k in b if k not in a]:
        va, vb = a.get(k, ABSENT), b.get(k, ABSENT)
        if va != vb:
            out.append((k, va, vb))
    return out


def definition_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Readable lines ``window.size_ms: 60000 -> 30000``, one per changed setting."""

    def fmt(v: Any) -> str:
        return v if v is ABSENT else json.dumps(v)

    return [f"{k}: {fmt(va)} -> {fmt(vb)}" for k, va, vb in definition_changes(old, new)]
