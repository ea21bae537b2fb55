"""The worker actor: one shard of the keyed window state, on one Ray worker process.

A worker runs the single-process :class:`~sealstream.windows.operator.WindowOperator`
on the keys that hash to it. Batches arrive as Arrow IPC buffers through Ray's
object store (never a Python object per event) and leave the same way. A worker
holds no durable state: the checkpoint has it, and a lost worker is replaced by
restoring every worker from the newest atomic checkpoint.

At a checkpoint a worker encodes its part of the state (:meth:`ShardWorker.stage_part`,
at the step boundary) and then writes it itself into the job's checkpoint store
(:meth:`ShardWorker.write_part`: a directory every node reaches, or PostgreSQL),
opened from the pipeline's ``[checkpoint]`` configuration with the coordinator's
encryption key and fencing token; only the part's name, SHA-256 and size go back to
the coordinator, which signs and publishes the manifest. For a store without
direct parts (SQLite) the coordinator takes the bytes (:meth:`ShardWorker.take_part`).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import polars as pl

from sealstream.checkpoint.manifest import part_name
from sealstream.checkpoint.stores import CheckpointStore
from sealstream.pipeline import Pipeline
from sealstream.sources import open_partition
from sealstream.sources._base import Chunk, FieldPlan, PartitionPosition, PartitionReader
from sealstream.state import incremental
from sealstream.state.codec import encode_table, sha256_hex
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
        self.pipeline: Pipeline | None = None
        self.staged: bytes | None = None
        self.store: CheckpointStore | None = None

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
        self.staged = None
        if self.store is not None:
            self.store.close()
        self.pipeline, self.store = pipeline, None
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

    def stage_part(self, metadata: dict[str, Any]) -> int:
        """Encode this worker's part of a checkpoint's state at the step boundary: the
        checkpoint file itself (Arrow IPC, key-ordered, with ``metadata``), kept here
        until :meth:`write_part` or :meth:`take_part`. Returns its row count."""
        frame = incremental.key_ordered(self._op().snapshot())
        self.staged = encode_table(frame, metadata)
        return frame.height

    def take_part(self) -> bytes:
        """The staged part's bytes (for the coordinator to write)."""
        data, self.staged = self.staged, None
        assert data is not None, "stage_part() first"
        return data

    def write_part(self, cid: int, fence: Any, encryption_key: bytes | None
                   ) -> tuple[str, str, int]:
        """Write the staged part into checkpoint ``cid`` of the job's store (claimed by
        the coordinator), create-if-absent and durable, under the coordinator's
        fencing token ``fence``; return its name, SHA-256 and size (plaintext)."""
        data = self.take_part()
        name = part_name(self.index)
        self._store(encryption_key).write_part(cid, name, data, fence)
        return name, sha256_hex(data), len(data)

    def _store(self, encryption_key: bytes | None) -> CheckpointStore:
        if self.store is None:
            assert self.pipeline is not None and self.pipeline.checkpoint is not None
            self.store = self.pipeline.checkpoint.open_store(self.pipeline.name)
        # the coordinator's key, so that every file of the checkpoint is sealed alike
        self.store._init_key(encryption_key)
        return self.store

    def open_windows(self) -> int:
        return self._op().open_windows
