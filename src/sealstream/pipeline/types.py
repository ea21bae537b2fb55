"""Declared field types: ``[source] types = {amount = "decimal(18, 2)"}``.

A field declared ``decimal(P, S)`` is read exactly (never through a binary float)
and its ``sum``, ``min``, ``max`` and ``mean`` are exact; see docs/types.md.
Supported today: ``decimal(P, S)`` with ``1 <= P <= 18`` and ``0 <= S <= P``
(values, sums and means are kept as 128-bit integers of units of ``10**-S``), read
by ``count``, ``sum``, ``min``, ``max`` and ``mean``, in a pipeline without a
``[transform]`` or a compound key. Anything else is refused with one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sealstream.errors import SpecError

if TYPE_CHECKING:
    from sealstream.pipeline.model import Pipeline

__all__ = ["DECIMAL_FUNCTIONS", "MAX_PRECISION", "MEAN_MIN_SCALE", "check_types",
           "decimal_types", "mean_scale", "parse_decimal"]

MAX_PRECISION = 18
#: a decimal mean has scale max(S, 6), as Flink's AVG over DECIMAL
MEAN_MIN_SCALE = 6
DECIMAL_FUNCTIONS = frozenset({"sum", "min", "max", "mean"})
_DECIMAL_RE = re.compile(r"^\s*decimal\s*\(\s*([0-9]+)\s*,\s*([0-9]+)\s*\)\s*$", re.IGNORECASE)


def parse_decimal(setting: str, text: object) -> tuple[int, int]:
    """``"decimal(18, 2)"`` -> ``(18, 2)``; SpecError naming ``setting`` otherwise."""
    m = _DECIMAL_RE.match(text) if isinstance(text, str) else None
    if m is None:
        raise SpecError(f'{setting}: expected "decimal(P, S)" (the only declared type so '
                        f"far), got {text!r}")
    precision, scale = int(m.group(1)), int(m.group(2))
    if not 1 <= precision <= MAX_PRECISION or not 0 <= scale <= precision:
        raise SpecError(f"{setting}: decimal({precision}, {scale}) is not supported: "
                        f"1 <= P <= {MAX_PRECISION} and 0 <= S <= P")
    return precision, scale


def mean_scale(scale: int) -> int:
    """The scale of a decimal mean: ``max(S, 6)``."""
    return max(scale, MEAN_MIN_SCALE)


def decimal_types(types: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """Field -> (precision, scale) of every ``decimal(P, S)`` in ``types``."""
    return {f: parse_decimal(f"source.types.{f}", t) for f, t in types.items()}


def check_types(p: Pipeline) -> None:
    """Refuse a declared type the pipeline cannot use yet, naming the setting."""
    if not isinstance(p.types, Mapping):
        raise SpecError(f'source.types: expected a table of field = "decimal(P, S)", '
                        f"got {p.types!r:.60}")
    decimals = decimal_types(p.types)
    if not decimals:
        return
    keys = p.source.key_fields or (p.source.key,)
    for f in decimals:
        if f in keys or f == p.source.time:
            raise SpecError(f"source.types.{f}: the key and the time cannot be decimals")
    if p.source.key_fields is not None or p.where is not None or p.fields \
            or p.map_batches is not None:
        raise SpecError("source.types: decimal fields with a [transform] or a compound key "
                        "are not supported yet")
    for a in p.parsed_aggregates:
        if a.field in decimals and a.func not in DECIMAL_FUNCTIONS:
            raise SpecError(f"aggregates.{a.name}: {a.expr} over the decimal field "
                            f"{a.field!r} is not supported yet (sum, min, max and mean are)")
        if a.func == "count_if":
            raise SpecError("source.types: decimal fields with count_if are not supported yet")
