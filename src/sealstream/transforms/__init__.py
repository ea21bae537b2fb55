"""Transforms: a filter, derived fields, a derived key or time, and count_if
conditions, written as SQL expressions (parsed by Polars) or Polars expressions,
applied to each batch on columns before the windows.

Where they sit (see docs/transforms.md): derived fields (and a derived key or
time) are computed first, on every record the source parsed; the watermark is
then computed from all those records; the filter (``where``) runs after the
watermark, so events it drops still advance event time, as a Flink SQL source
watermark is defined on the source's rows. Late output shows the original
record. A record whose values make an expression fail is a bad record.
"""

from sealstream.transforms._compile import (
    KEEP,
    CompiledTransform,
    MapBatches,
    Step,
    compile_transform,
)
from sealstream.transforms._expr import FUNCTIONS, IMPURE, check_polars, check_pure, parse_sql
from sealstream.transforms._stage import FAILED_SCHEMA, TransformStage

__all__ = [
    "FAILED_SCHEMA",
    "FUNCTIONS",
    "IMPURE",
    "KEEP",
    "CompiledTransform",
    "MapBatches",
    "Step",
    "TransformStage",
    "check_polars",
    "check_pure",
    "compile_transform",
    "parse_sql",
]
