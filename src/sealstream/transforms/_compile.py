"""A pipeline's transform, compiled: the steps in the order they run, the source
fields they read, and what the fingerprint records."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import polars as pl

from sealstream.aggspec import Aggregate, condition_field, field_kinds
from sealstream.errors import SpecError
from sealstream.sources._base import FieldKind, FieldPlan
from sealstream.transforms._expr import check_polars, parse_sql

KEEP = "__keep"
"""The column the filter's verdict takes until the engine applies it."""

BatchFn = Callable[[pl.DataFrame], pl.DataFrame]


@dataclass(frozen=True)
class Step:
    """One expression: its result becomes field ``name`` (or the filter's verdict)."""

    name: str
    setting: str
    text: str
    expr: pl.Expr | None
    kind: str  # "field" | "where" | "condition" | "batch" | "output"
    fn: BatchFn | None = None
    #: a batch function's input and result columns (each result is also an "output"
    #: step after it)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MapBatches:
    """A batch function for what an expression cannot say: ``fn`` takes a Polars
    DataFrame (the fields named in ``reads``, and the derived fields before it, in
    their natural types) and returns a DataFrame of the same rows in the same
    order; its columns named in ``writes`` become derived fields.

    Determinism is the user's responsibility: ``fn`` must give the same output for
    the same rows, whatever else is in its batch, on every run. sealstream cannot
    look inside it, so the fingerprint records ``version`` (change it whenever
    ``fn``'s behaviour changes: a resume from state written by another version is
    refused with the diff)."""

    fn: BatchFn
    version: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


@dataclass(frozen=True)
class CompiledTransform:
    """Derived fields in the order given, count_if conditions, then the filter."""

    steps: tuple[Step, ...]
    inputs: tuple[str, ...]
    """Source fields the expressions read (not derived before they are read)."""
    derived: frozenset[str]
    where: Step | None
    key_fields: tuple[str, ...] | None = None
    """A compound key's fields (the stage builds ``__key`` from them)."""

    def fingerprint(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        fields = {s.name: s.text for s in self.steps if s.kind == "field"}
        if fields:
            out["fields"] = fields
        for s in self.steps:
            if s.kind == "batch":
                out["map_batches"] = {"version": s.text, "reads": list(s.reads),
                                      "writes": list(s.writes)}
        if self.where is not None:
            out["where"] = self.where.text
        return out

    def source_plan(self, key: str | tuple[str, ...], time: str,
                    aggs: list[Aggregate]) -> FieldPlan:
        """What the source extracts: aggregated fields that are not derived, and the
        fields the expressions read (kind ``any`` unless a numeric aggregate reads it)."""
        kinds: dict[str, FieldKind] = {
            f: k for f, k in field_kinds(aggs).items() if f not in self.derived
        }
        for f in self.inputs:
            kinds.setdefault(f, "any")
        if not isinstance(key, str):  # compound: built by the stage from its fields
            return FieldPlan(key=key[0], time=time, fields=kinds, derived_key=True,
                             derived_time=time in self.derived)
        return FieldPlan(key=key, time=time, fields=kinds,
                         derived_key=key in self.derived, derived_time=time in self.derived)


def _expr(setting: str, value: object) -> tuple[str, pl.Expr]:
    if isinstance(value, pl.Expr):
        return str(value), check_polars(setting, value)
    return str(value), parse_sql(setting, value)


def _check_name(setting: str, name: object) -> None:
    if not isinstance(name, str) or not name or name.startswith(("_", "?", "#")):
        raise SpecError(f"{setting}: {name!r} is not a valid field name (names starting "
                        "with _ are reserved)")


class TransformSettings(Protocol):
    """What compiling a transform reads: the settings of a pipeline (or of one of its
    sources). :class:`sealstream.pipeline.Pipeline` is one; this module never imports
    the model."""

    @property
    def where(self) -> str | pl.Expr | None: ...
    @property
    def fields(self) -> Mapping[str, str | pl.Expr]: ...
    @property
    def map_batches(self) -> MapBatches | None: ...
    @property
    def parsed_aggregates(self) -> list[Aggregate]: ...
    @property
    def key_fields(self) -> tuple[str, ...] | None: ...


def compile_transform(p: TransformSettings) -> CompiledTransform | None:
    """The transform of ``p`` (None when it has no filter, derived field or count_if).

    Raises SpecError naming the setting of the first bad expression."""
    conditions = [a for a in p.parsed_aggregates
                  if a.func == "count_if" and a.condition is not None]
    key_fields = p.key_fields
    if (p.where is None and not p.fields and not conditions and key_fields is None
            and p.map_batches is None):
        return None
    if not isinstance(p.fields, Mapping):
        raise SpecError(f"transform.fields: expected a table of name = expression, got "
                        f"{p.fields!r:.60}")
    steps: list[Step] = []
    inputs: list[str] = []
    derived: set[str] = set()

    def add(name: str, setting: str, value: object, kind: str) -> Step:
        text, expr = _expr(setting, value)
        for root in expr.meta.root_names():
            if root not in derived and root not in inputs:
                inputs.append(root)
        step = Step(name, setting, text, expr, kind)
        steps.append(step)
        return step

    for name, value in p.fields.items():
        _check_name("transform.fields", name)
        add(name, f"transform.fields.{name}", value, "field")
        derived.add(name)
    if p.map_batches is not None:
        mb = p.map_batches
        if not isinstance(mb, MapBatches) or not callable(mb.fn):
            raise SpecError("map_batches: expected MapBatches(fn, version=..., reads=(...), "
                            f"writes=(...)), got {mb!r:.60}")
        if not isinstance(mb.version, str) or not mb.version.strip():
            raise SpecError("map_batches.version: a non-empty version string is needed (the "
                            "fingerprint records it in place of the function)")
        for group, names in (("reads", mb.reads), ("writes", mb.writes)):
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise SpecError(f"map_batches.{group}: expected a tuple of field names, "
                                f"got {names!r}")
        if not mb.writes:
            raise SpecError("map_batches.writes: name at least one column it returns")
        for root in mb.reads:
            if root not in derived and root not in inputs:
                inputs.append(root)
        steps.append(Step("map_batches", "map_batches", mb.version, None, "batch", mb.fn,
                          tuple(mb.reads), tuple(mb.writes)))
        for name in mb.writes:
            _check_name("map_batches.writes", name)
            steps.append(Step(name, "map_batches", mb.version, None, "output"))
            derived.add(name)
    for a in conditions:
        add(condition_field(a.name), f"aggregates.{a.name}", a.condition, "condition")
    where = None if p.where is None else add(KEEP, "transform.where", p.where, "where")
    for f in key_fields or ():
        if f not in derived and f not in inputs:
            inputs.append(f)
    return CompiledTransform(tuple(steps), tuple(inputs), frozenset(derived), where,
                             key_fields)
