"""The pipeline model: frozen dataclasses for every part of a pipeline, the
aggregate parser, the fingerprint of what saved state depends on, and the
readable diff of two fingerprinted definitions."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sealstream.errors import SpecError
from sealstream.pipeline.source import FileSource
from sealstream.sources._base import FieldKind, FieldPlan

STATE_FORMAT_VERSION = 1
# records per partition per step: memory and speed only, never the results
DEFAULT_BATCH_SIZE = 262_144
#: without a limit (``[pipeline] max_bad_ratio``, ``--max-bad-ratio``) a run fails
#: (exit 1, after committing) only when it had records and none was good, and warns
#: when more than this share of its records is bad
WARN_BAD_RATIO = 0.5
AGGREGATE_FUNCTIONS = ("count", "sum", "min", "max", "mean", "first", "last")
NUMERIC_FUNCTIONS = frozenset({"sum", "min", "max", "mean"})
_AGG_RE = re.compile(r"^\s*(count|sum|min|max|mean|first|last)\s*(?:\(\s*([^()\s]*)\s*\))?\s*$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
RESERVED_OUTPUT_NAMES = frozenset({"key", "window_start", "window_end"})

WindowKind = Literal["tumbling", "sliding", "session"]



@dataclass(frozen=True)
class Watermark:
    """Bounded out-of-orderness: ``W_p = max(event time seen in p) - max_delay_ms``."""

    max_delay_ms: int = 0


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
class Aggregate:
    """One output column: ``name = func(field)``; ``field`` is None for count."""

    name: str
    func: str
    field: str | None

    @property
    def expr(self) -> str:
        return self.func if self.field is None else f"{self.func}({self.field})"


@dataclass(frozen=True)
class Output:
    """A directory output (``jsonl`` or ``parquet``), ``stdout``, or a database table
    (``sqlite`` or ``postgresql``: ``url`` and ``table``; results only)."""

    kind: Literal["jsonl", "parquet", "stdout", "sqlite", "postgresql"]
    path: str | None = None
    base_dir: Path = Path(".")
    url: str | None = None
    table: str | None = None

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

    @property
    def resolved(self) -> Path:
        return self.base_dir / self.path

    def open_store(self, pipeline: str) -> Any:
        """The checkpoint store this section names (a CheckpointStore)."""
        from sealstream.checkpoint.stores import open_store

        return open_store(self.url if self.url else self.resolved, pipeline, self.base_dir)


@dataclass(frozen=True)
class Pipeline:
    """A complete, validated pipeline definition. See the module docstring."""

    name: str
    source: FileSource
    window: Window
    aggregates: Mapping[str, str]
    sink: Output
    watermark: Watermark = field(default_factory=Watermark)
    late: Output | None = None
    errors: Output | None = None
    checkpoint: Checkpoints | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    max_bad_ratio: float | None = None

    def __post_init__(self) -> None:
        from sealstream.pipeline.validate import validate

        validate(self)

    @property
    def parsed_aggregates(self) -> list[Aggregate]:
        return [parse_aggregate(n, e) for n, e in self.aggregates.items()]

    def field_plan(self) -> FieldPlan:
        kinds: dict[str, FieldKind] = {}
        for agg in self.parsed_aggregates:
            if agg.field is None:
                continue
            numeric = agg.func in NUMERIC_FUNCTIONS
            if numeric or agg.field not in kinds:
                kinds[agg.field] = "numeric" if numeric else "any"
        return FieldPlan(key=self.source.key, time=self.source.time, fields=kinds)

    def fingerprint_fields(self) -> dict[str, Any]:
        """What the saved state depends on; changing any of these changes the fingerprint."""
        return {
            "format": STATE_FORMAT_VERSION,
            "pipeline": self.name,
            "source": {
                "kind": self.source.kind,
                "partitions": [n for n, _ in self.source.partitions()],
                "key": self.source.key,
                "time": self.source.time,
            },
            "watermark": {"max_delay_ms": self.watermark.max_delay_ms},
            "window": _window_dict(self.window),
            "aggregates": {a.name: a.expr for a in self.parsed_aggregates},
        }

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


def parse_aggregate(name: str, expr: object) -> Aggregate:
    """Parse ``"sum(amount)"`` into an :class:`Aggregate`, or raise SpecError."""
    setting = f"aggregates.{name}"
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SpecError(f"aggregates: output name {name!r} is not a valid name")
    if name in RESERVED_OUTPUT_NAMES:
        raise SpecError(f"{setting}: {name!r} is reserved for the result's identity")
    if not isinstance(expr, str):
        raise SpecError(f"{setting}: expected a string like \"sum(amount)\", got {expr!r}")
    m = _AGG_RE.match(expr)
    if not m:
        raise SpecError(
            f"{setting} = {expr!r}: unknown aggregate; use one of "
            "count, sum(f), min(f), max(f), mean(f), first(f), last(f)"
        )
    func, fld = m.group(1), m.group(2)
    if func == "count":
        if fld:
            raise SpecError(f"{setting} = {expr!r}: count takes no field (it counts records)")
        return Aggregate(name, "count", None)
    if not fld:
        raise SpecError(f"{setting} = {expr!r}: {func} needs a field, e.g. {func}(amount)")
    if "," in fld:
        raise SpecError(f"{setting} = {expr!r}: {func} takes one field")
    return Aggregate(name, func, fld)



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
