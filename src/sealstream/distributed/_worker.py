"""The worker actor: one shard of the keyed window state, on one Ray worker process.

A worker runs the single-process :class:`~sealstream.windows.operator.WindowOperator`
on the keys that hash to it. Batches arrive as Arrow IPC buffers through Ray's
object store (never a Python object per event) and leave the same way. A worker
holds no durable state: the coordinator's checkpoint has it, and a lost worker is
replaced by restoring every worker from the newest atomic checkpoint.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import polars as pl

from sealstream.pipeline import Pipeline
from sealstream.sources import open_partition
from sealstream.sources._base import Chunk, FieldPlan, PartitionPosition, PartitionReader
from sealstream.state import incremental
from sealstream.state.codec import encode_table
from sealstream.windows.operator import WindowOperator


def to_ipc(frame: pl.DataFrame) -> bytes:
    """``frame`` as an Arrow IPC stream (types kept exactly, Int128 and Decimal too)."""
    buf = io.BytesIO()
    frame.write_ipc_stream(buf, compression="uncompressed")
    return buf.getvalue()


def from_ipc(data: bytes) -> pl.DataFrame:
    return pl.read_ipc_stream(io.BytesIO(data))


class ShardWorker:
    """Keys whose hash is ``index`` modulo the worker count (see :mod:`._shard`)."""

    def __init__(self) -> None:
        self.index = -1
        self.op: WindowOperator | None = None
        self.readers: dict[str, PartitionReader] = {}

    # ---------------------------------------------------------------- reading
    def open_reader(self, kind: str, name: str, path: str, plan: FieldPlan,
                    position: PartitionPosition) -> None:
        """Open source partition ``name`` here (its file must be reachable from this
        node): reading and parsing happen on the workers."""
        old = self.readers.pop(name, None)
        if old is not None:
            old.close()
        self.readers[name] = open_partition(kind, name, Path(path), plan, position)

    def next_chunk(self, name: str, max_records: int
                   ) -> tuple[Chunk | None, tuple[int, int] | None]:
        """The partition's next chunk (parsed columns, sent as Arrow) and its
        progress hint."""
        reader = self.readers[name]
        chunk = reader.next_chunk(max_records)
        return chunk, reader.size_hint()

    def close_reader(self, name: str) -> None:
        reader = self.readers.pop(name, None)
        if reader is not None:
            reader.close()

    # ---------------------------------------------------------------- windows

    def load(self, pipeline: Pipeline, index: int, state: bytes) -> int:
        """Become shard ``index`` of ``pipeline`` with ``state`` (whatever this worker
        held before is dropped: a worker process serves one job at a time, and the
        next job of the same driver reuses it). Returns the process id."""
        self.index = index
        self.op = WindowOperator(pipeline, from_ipc(state))
        return os.getpid()

    def _op(self) -> WindowOperator:
        assert self.op is not None, "load() first"
        return self.op

    def process(self, events: bytes, w_end: int) -> tuple[bytes, bytes, int]:
        """Apply this shard's events (in read order, with their watermark) and fire
        the windows ``w_end`` closes; return the fired windows, the late events and
        the number of events applied."""
        frame = from_ipc(events)
        out = self._op().process(frame, w_end)
        return to_ipc(out.fired), to_ipc(out.late), frame.height

    def snapshot(self) -> bytes:
        return to_ipc(self._op().snapshot())

    def encode_part(self, metadata: dict[str, Any]) -> bytes:
        """This worker's part of a checkpoint's state: the checkpoint file itself
        (Arrow IPC, key-ordered, with ``metadata``), encoded here, beside the state."""
        return encode_table(incremental.key_ordered(self._op().snapshot()), metadata)

    def open_windows(self) -> int:
        return self._op().open_windows
