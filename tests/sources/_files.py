"""The file source tests' plan, and writing and reading a CSV or JSONL partition."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from _helpers import read_chunks

from sealstream.sources import FieldPlan, PartitionPosition
from sealstream.sources._parse import LineFileReader

PLAN = FieldPlan("user", "ts", {"amount": "numeric", "x": "any"})


@dataclass(frozen=True)
class LineFormat:
    """A line-based file format under test: its reader and the file name it is written as."""

    reader: type[LineFileReader]
    file_name: str

    def write(self, tmp_path: Path, text: str | bytes, name: str | None = None) -> Path:
        """``text`` (a str: as UTF-8) as ``tmp_path / name`` (default name: ``file_name``)."""
        p = tmp_path / (self.file_name if name is None else name)
        p.write_bytes(text.encode() if isinstance(text, str) else text)
        return p

    def read_all(
        self,
        path: Path,
        plan: FieldPlan = PLAN,
        chunk: int = 1000,
        position: PartitionPosition | None = None,
        block_bytes: int | None = None,
    ) -> tuple[pl.DataFrame, pl.DataFrame, list[Any]]:
        """Every chunk of a partition: (events, bad, chunks)."""
        kw = {} if block_bytes is None else {"block_bytes": block_bytes}
        return read_chunks(self.reader(str(path), path, plan, position, **kw), chunk)

    def read_both_ways(
        self, text: str, chunk: int, block_bytes: int
    ) -> tuple[pl.DataFrame, pl.DataFrame, list[Any], list[Any]]:
        """Read ``text`` as a partition whole, then in chunks of ``chunk`` records
        from blocks of ``block_bytes``; assert that both give the same events and
        bad records and end in one eof. (events, bad, whole chunks, chunks)."""
        with tempfile.TemporaryDirectory() as d:
            path = self.write(Path(d), text)
            whole_ev, whole_bad, whole_chunks = self.read_all(path, chunk=10_000)
            ev, bad, chunks = self.read_all(path, chunk=chunk, block_bytes=block_bytes)
        assert ev.equals(whole_ev)
        assert bad.equals(whole_bad)
        assert sum(c.eof for c in chunks) == 1 and chunks[-1].eof
        return ev, bad, whole_chunks, chunks
