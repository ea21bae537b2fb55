"""A source partition read on a worker: the coordinator's merger sees an ordinary
:class:`~sealstream.sources._base.PartitionReader`.

The worker opens the partition (any reader of the source contract: files today, a
live partition reader alike), reads and parses it; each chunk comes back as
columns (Arrow through Ray's object store). The next chunk is requested as soon as
one is returned, so every partition's worker reads ahead while the coordinator
merges, watermarks and routes. Chunk boundaries never change results (the merger's
read order is fixed by offsets), so a chunk read ahead with the previous size
limit is used as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sealstream.distributed._shard import gather
from sealstream.sources._base import Chunk, FieldPlan, PartitionPosition


class RemoteReader:
    """Partition ``name`` read by worker ``actor``."""

    def __init__(self, actor: Any, kind: str, name: str, path: Path, plan: FieldPlan,
                 position: PartitionPosition | None) -> None:
        self.name = name
        self.actor = actor
        gather([actor.open_reader.remote(kind, name, str(path), plan,
                                         position or PartitionPosition())], f"open {name}")
        self._ahead: Any = None
        self._hint: tuple[int, int] | None = None

    def next_chunk(self, max_records: int) -> Chunk | None:
        ref = self._ahead
        if ref is None:
            ref = self.actor.next_chunk.remote(self.name, max_records)
        self._ahead = None
        chunk, self._hint = gather([ref], f"read {self.name}")[0]
        if chunk is not None and not chunk.eof:
            self._ahead = self.actor.next_chunk.remote(self.name, max_records)
        return chunk  # type: ignore[no-any-return]

    def size_hint(self) -> tuple[int, int] | None:
        return self._hint

    def close(self) -> None:
        self._ahead = None
        try:
            self.actor.close_reader.remote(self.name)
        except Exception:  # noqa: BLE001,S110 - the worker is gone: nothing to close
            pass
