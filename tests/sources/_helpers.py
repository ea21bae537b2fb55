"""Reading a whole partition in the source tests (one helper for every format)."""

from __future__ import annotations

from typing import Any

import polars as pl

from sealstream.sources import OFFSET, RAW, Chunk, PartitionReader


def with_raw(chunk: Chunk) -> pl.DataFrame:
    """The chunk's events plus ``__raw``: each event's text, looked up through
    ``chunk.raw`` as the engine does for late events."""
    events = chunk.events
    if events.height == 0:
        return events.with_columns(pl.lit(None, dtype=pl.String).alias(RAW))
    assert chunk.raw is not None
    offsets = events[OFFSET].to_numpy()
    assert chunk.raw.first <= offsets.min() and offsets.max() <= chunk.raw.last
    texts = chunk.raw.texts(offsets)
    assert texts.len() == events.height and texts.null_count() == 0
    return events.with_columns(texts.alias(RAW))


def read_chunks(
    reader: PartitionReader, chunk: int
) -> tuple[pl.DataFrame, pl.DataFrame, list[Any]]:
    """Every chunk of ``reader`` (then closed): (events with ``__raw``, bad, chunks)."""
    chunks: list[Chunk] = []
    events: list[pl.DataFrame] = []
    try:
        while (c := reader.next_chunk(chunk)) is not None:
            assert c.events.height + c.bad.height <= chunk
            chunks.append(c)
            events.append(with_raw(c))
            assert len(chunks) < 100_000
    finally:
        reader.close()
    if not chunks:
        return pl.DataFrame(), pl.DataFrame(), chunks
    return pl.concat(events), pl.concat([c.bad for c in chunks]), chunks
