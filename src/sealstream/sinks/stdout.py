"""Print committed lines to standard output: for quick looks, not for production.

:class:`StdoutSink` buffers each epoch's ``__json`` lines in memory and prints
them when the epoch is committed, so uncommitted rows are never shown.

**Not exactly-once across crashes.** Standard output cannot be read back or
un-printed: ``committed()`` is always empty and ``read_ids`` returns no rows,
so after a crash and restart the replay may print again lines that were
already printed (at-least-once), and a crash between the checkpoint and the
print loses them from the screen (they are not re-printed, since the restored
checkpoint says they were committed). Use a directory output (jsonl, parquet)
when the output must be exactly once.
"""

from __future__ import annotations

import sys
from typing import TextIO

import polars as pl

from sealstream.errors import SinkError
from sealstream.sinks._base import CommittedFile, Sink, SinkRole
from sealstream.sinks._files import check_epoch, check_role, id_schema, os_reason
from sealstream.sinks.jsonl import json_lines_bytes

__all__ = ["StdoutSink"]


class StdoutSink(Sink):
    """Two-phase sink whose commit prints the epoch's lines to ``stream`` (stdout).

    ``prepare`` returns ``["stdout-{epoch:012d}"]`` when the epoch has rows,
    else ``[]``; ``commit`` prints what is buffered for the epoch (tokens are
    not checked) and forgets it, so a second commit prints nothing;
    ``recover`` forgets every buffer. An :class:`OSError` while printing (a
    closed pipe) becomes a :class:`SinkError`.
    """

    def __init__(self, role: SinkRole, stream: TextIO | None = None) -> None:
        self.role = check_role(role)
        self._stream = stream
        self._buffers: dict[int, list[str]] = {}

    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        check_epoch(epoch)
        if frame.height == 0:
            return
        self._buffers.setdefault(epoch, []).append(json_lines_bytes(frame).decode("utf-8"))

    def prepare(self, epoch: int) -> list[str]:
        check_epoch(epoch)
        return [f"stdout-{epoch:012d}"] if self._buffers.get(epoch) else []

    def commit(self, epoch: int, tokens: list[str]) -> None:
        check_epoch(epoch)
        chunks = self._buffers.pop(epoch, None)
        if not chunks:
            return
        stream = self._stream if self._stream is not None else sys.stdout
        try:
            stream.write("".join(chunks))
            stream.flush()
        except OSError as exc:
            raise SinkError(
                f"cannot print {self.role} to standard output: {os_reason(exc)}"
            ) from None

    def recover(self, prepared: dict[int, list[str]]) -> None:
        """Forget all buffered lines; nothing that was staged survives a restart."""
        self._buffers.clear()

    def committed(self) -> list[CommittedFile]:
        return []

    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        return pl.DataFrame(schema=id_schema(self.role))

    def close(self) -> None:
        self._buffers.clear()
