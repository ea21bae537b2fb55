"""Aggregate settings: the parsed form of ``name = "func(field)"``.

A low room: it imports only :mod:`sealstream.errors` and the source field kinds,
so that the pipeline model (which holds these settings) and the compilers that
read them (:mod:`sealstream.transforms`, :mod:`sealstream.windows`) can all use
it without importing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sealstream.errors import SpecError
from sealstream.sources._base import FieldKind

AGGREGATE_FUNCTIONS = (
    "count", "sum", "min", "max", "mean", "first", "last",
    "count_distinct", "approx_count_distinct", "median", "quantile", "stddev", "variance",
    "count_if",
)
NUMERIC_FUNCTIONS = frozenset({"sum", "min", "max", "mean", "median", "quantile", "stddev",
                               "variance"})
_AGG_RE = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)
_FIELD_RE = re.compile(r"^[^()\s,]+$")
#: the result type family of each function, for typed outputs (database columns)
RESULT_KIND = {"count_distinct": "count", "approx_count_distinct": "count",
               "count_if": "count", "median": "mean", "quantile": "mean",
               "stddev": "mean", "variance": "mean"}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
RESERVED_OUTPUT_NAMES = frozenset({"key", "window_start", "window_end"})

CONDITION_PREFIX = "?if:"
"""count_if's condition is a derived 0/1 field ``?if:<output name>`` (see transforms)."""


def condition_field(name: str) -> str:
    """The derived field holding count_if ``name``'s condition (1 or 0)."""
    return CONDITION_PREFIX + name


@dataclass(frozen=True)
class Aggregate:
    """One output column: ``name = func(field)``; ``field`` is None for count."""

    name: str
    func: str
    field: str | None
    #: quantile: the fraction q (0 <= q <= 1); median is quantile 0.5
    q: float | None = None
    #: count_if: the condition, an SQL expression over the record
    condition: str | None = None
    #: a several-source job (docs/joins.md): the source whose events this aggregate
    #: reads; a count_if with a source and no condition counts that source's events
    source: str | None = None

    @property
    def expr(self) -> str:
        if self.func == "count_if" and self.condition is None:
            return f"count(source {self.source})"
        if self.func == "count_if":
            return f"count_if({self.condition})"
        if self.func == "quantile":
            return f"quantile({self.field}, {self.q!r})"
        return self.func if self.field is None else f"{self.func}({self.field})"

    @property
    def result_kind(self) -> str:
        """``count``/``mean`` for the newer functions (their typed output is an
        integer count or a float), else the function itself."""
        return RESULT_KIND.get(self.func, self.func)


def field_kinds(aggs: list[Aggregate]) -> dict[str, FieldKind]:
    """The value fields aggregates read, each ``numeric`` when a numeric function reads
    it, else ``any``."""
    kinds: dict[str, FieldKind] = {}
    for agg in aggs:
        if agg.field is None:
            continue
        numeric = agg.func in NUMERIC_FUNCTIONS
        if numeric or agg.field not in kinds:
            kinds[agg.field] = "numeric" if numeric else "any"
    return kinds


_USAGE = ("count, sum(f), min(f), max(f), mean(f), first(f), last(f), count_distinct(f), "
          "approx_count_distinct(f), median(f), quantile(f, q), stddev(f), variance(f), "
          "count_if(condition)")


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
    func = m.group(1).lower() if m else ""
    if not m or func not in AGGREGATE_FUNCTIONS:
        raise SpecError(f"{setting} = {expr!r}: unknown aggregate; use one of {_USAGE}")
    arg = None if m.group(2) is None else m.group(2).strip()
    if func == "count":
        if arg:
            raise SpecError(f"{setting} = {expr!r}: count takes no field (it counts records)")
        return Aggregate(name, "count", None)
    if not arg:
        example = {"quantile": "quantile(latency_ms, 0.99)",
                   "count_if": "count_if(level = 'error')"}.get(func, f"{func}(amount)")
        raise SpecError(f"{setting} = {expr!r}: {func} needs a field, e.g. {example}")
    if func == "count_if":
        return Aggregate(name, func, None, condition=arg)
    q: float | None = None
    if func == "quantile":
        fld, _, q_text = arg.rpartition(",")
        fld = fld.strip()
        try:
            q = float(q_text)
        except ValueError:
            q = None
        if not fld or q is None or not 0.0 <= q <= 1.0:
            raise SpecError(f"{setting} = {expr!r}: quantile takes a field and a fraction "
                            "q from 0 to 1, e.g. quantile(latency_ms, 0.99)")
        arg = fld
    elif func == "median":
        q = 0.5
    if "," in arg:
        raise SpecError(f"{setting} = {expr!r}: {func} takes one field")
    if not _FIELD_RE.match(arg):
        raise SpecError(f"{setting} = {expr!r}: {arg!r} is not a field name")
    return Aggregate(name, func, arg, q=q)
