"""Window state and suppression tables as bytes: Arrow IPC, zstd, no pickle.

The state file is an Arrow IPC stream whose schema metadata carries the
watermark epoch (``sealstream.watermark``, JSON) so that the guard can check it
against the manifest. Decoding only parses Arrow buffers: nothing is executed.
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
        table = reader.read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
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
