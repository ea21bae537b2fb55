"""The data plane's rows travel through Ray's object store as Arrow tables (no IPC
encoding and decoding): every type comes back as it was, 128-bit integers included
(those travel as an IPC stream)."""

from __future__ import annotations

import decimal
from typing import Any

import polars as pl


def test_every_type_comes_back_as_it_was(ray_cluster: Any) -> None:
    import ray

    from sealstream.distributed._worker import from_wire, to_wire

    frame = pl.DataFrame({
        "wide": pl.Series([1 << 100, None], dtype=pl.Int128),
        "dec": pl.Series([decimal.Decimal("1.25"), None], dtype=pl.Decimal(10, 2)),
        "s": ["x", None], "none": pl.Series([None, None], dtype=pl.Null),
        "u8": pl.Series([1, 2], dtype=pl.UInt8), "b": [True, None], "l": [[1, 2], [3]],
        "st": [{"x": 1}, {"x": 2}], "dt": pl.Series([1, 2]).cast(pl.Datetime("ms")),
        "cat": pl.Series(["a", "b"], dtype=pl.Categorical), "bin": [b"a", None],
        "f32": pl.Series([1.5, None], dtype=pl.Float32),
    })
    narrow = frame.drop("wide")
    assert isinstance(to_wire(frame), bytes)  # 128-bit integers: an IPC stream
    assert not isinstance(to_wire(narrow), bytes)
    for f in (frame, narrow, narrow.clear(), narrow.slice(1, 1), frame.clear()):
        got = from_wire(ray.get(ray.put(to_wire(f))))
        assert got.schema == f.schema
        assert got.equals(f)
