"""Window state and suppression tables as bytes: Arrow IPC, zstd, no pickle.

The state file is an Arrow IPC stream whose schema metadata carries the
watermark epoch (``sealstream.watermark``, JSON) so that the guard can check it
against the manifest. Decoding only parses Arrow buffers: nothing is executed.

Only the column types a state, a delta or a suppression table is made of are
accepted (:func:`schema_problem`): integers, floats, decimals, booleans, strings,
binaries, nulls, and lists or structs of those. An Arrow extension type
(registered or not) or any other type is refused before any row is decoded:
the guard judges such a file INCONSISTENT_STATE, and :func:`decode_table` raises
ValueError instead of handing it to Polars.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

WATERMARK_META = b"sealstream.watermark"
_EXTENSION_META = b"ARROW:extension:name"


def _type_problem(name: str, field: pa.Field) -> str | None:
    if field.metadata and _EXTENSION_META in field.metadata:
        ext = field.metadata[_EXTENSION_META].decode(errors="replace")[:80]
        return f"column {name!r} has the Arrow extension type {ext!r}"
    t = field.type
    if isinstance(t, pa.ExtensionType):
        return f"column {name!r} has the Arrow extension type {t.extension_name!r}"
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
            or pa.types.is_boolean(t) or pa.types.is_null(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        return None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _type_problem(f"{name}[]", t.value_field)
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            problem = _type_problem(f"{name}.{t.field(i).name}", t.field(i))
            if problem is not None:
                return problem
        return None
    return f"column {name!r} has the type {t}, which no state holds"


def _schema_problem(schema: pa.Schema) -> str | None:
    for field in schema:
        problem = _type_problem(field.name, field)
        if problem is not None:
            return problem
    return None


def schema_problem(data: bytes) -> str | None:
    """Why the Arrow stream ``data`` is not a table this module writes (a column of
    an extension type or of a type no state holds), or None. An unreadable stream
    is no schema problem (reading it says why)."""
    try:
        schema = ipc.open_stream(pa.BufferReader(data)).schema
    except (pa.ArrowException, OSError, ValueError):
        return None
    return _schema_problem(schema)


def encode_table(frame: pl.DataFrame, metadata: dict[str, Any] | None = None) -> bytes:
    """Serialise a frame to compressed Arrow IPC, with JSON metadata values."""
    wide = [c for c, t in frame.schema.items() if t == pl.Int128]
    if wide:  # Arrow IPC has no 128-bit integer: store exact decimals
        frame = frame.with_columns(pl.col(wide).cast(pl.Decimal(38, 0)))
    table = frame.to_arrow()
    if metadata:
        meta = {k.encode(): json.dumps(v, sort_keys=True).encode() for k, v in metadata.items()}
        table = table.replace_schema_metadata(meta)
    sink = io.BytesIO()
    opts = ipc.IpcWriteOptions(compression="zstd")
    with ipc.new_stream(sink, table.schema, options=opts) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    return sink.getvalue()


def decode_table(data: bytes) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Parse bytes written by :func:`encode_table`; raises ValueError when unreadable."""
    try:
        reader = ipc.open_stream(pa.BufferReader(data))
        problem = _schema_problem(reader.schema)
        if problem is not None:
            raise ValueError(f"unexpected schema: {problem}")
        table = reader.read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"not a readable Arrow IPC stream: {exc}") from None
    meta: dict[str, Any] = {}
    for k, v in (table.schema.metadata or {}).items():
        try:
            meta[k.decode()] = json.loads(v)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"state metadata {k!r} is not JSON: {exc}") from None
    frame = pl.from_arrow(table.replace_schema_metadata(None))
    assert isinstance(frame, pl.DataFrame)
    return frame, meta


def read_metadata(data: bytes) -> dict[str, Any]:
    """Only the JSON metadata of a table written by :func:`encode_table` (no row data)."""
    try:
        schema = ipc.open_stream(pa.BufferReader(data)).schema
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ValueError(f"not a readable Arrow IPC stream: {exc}") from None
    meta: dict[str, Any] = {}
    for k, v in (schema.metadata or {}).items():
        try:
            meta[k.decode()] = json.loads(v)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"state metadata {k!r} is not JSON: {exc}") from None
    return meta


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
