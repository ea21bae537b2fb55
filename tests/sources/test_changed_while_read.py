"""A partition file that changes while it is read stops the reading with
SourceChangedError naming the file, on every read path: JSONL and CSV through the
reading thread, the direct blocks the parse threads read themselves, or blocks
already parsed ahead, and Parquet. Each story reads some chunks, changes the file,
and asks for the next chunk (no timing: the change happens between two calls)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sealstream._runtime.merge import PartitionMerger, SourcePosition
from sealstream.errors import SourceChangedError
from sealstream.sources import FieldPlan, PartitionReader
from sealstream.sources.files.csv import CsvReader
from sealstream.sources.files.jsonl import JsonlReader
from sealstream.sources.files.parquet import ParquetReader

PLAN = FieldPlan("user", "ts", {"amount": "numeric"})
N = 3000


def jsonl_text(n: int = N, user: str = "u") -> bytes:
    return "".join(
        json.dumps({"user": f"{user}{i % 7}", "ts": i, "amount": i}) + "\n" for i in range(n)
    ).encode()


def csv_text(n: int = N, user: str = "u") -> bytes:
    return ("user,ts,amount\n" + "".join(f"{user}{i % 7},{i},{i}\n" for i in range(n))).encode()


def truncated(path: Path, data: bytes) -> None:
    with path.open("r+b") as f:  # in place: same file, shorter (a line cut in half)
        f.truncate(len(data) * 2 // 5 + 3)


def copytruncated(path: Path, data: bytes) -> None:
    # logrotate's copytruncate: cut to nothing in place, then the writer goes on
    # (here with more than there was, so no read comes up short)
    with path.open("r+b") as f:
        f.truncate(0)
        f.write(data.replace(b"u", b"w") * 2)


def replaced(path: Path, data: bytes) -> None:
    other = path.with_name("new-" + path.name)
    other.write_bytes(data)  # even the same bytes: another file
    os.replace(other, path)


CHANGES: dict[str, tuple[Callable[[Path, bytes], None], str]] = {
    "truncated": (truncated, "truncated"),
    "copytruncated": (copytruncated, "first bytes differ"),
    "replaced": (replaced, "names another file"),
}


def open_text_reader(kind: str, path: Path, block_bytes: int) -> PartitionReader:
    cls = JsonlReader if kind == "jsonl" else CsvReader
    return cls(str(path), path, PLAN, block_bytes=block_bytes)


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("kind", ["jsonl", "csv"])
# 1000: blocks cut by the reading thread; 16 KiB: blocks the parse threads read
# themselves; default: the whole file already read and parsed ahead
@pytest.mark.parametrize("block_bytes", [1000, 16 << 10, None])
@pytest.mark.parametrize("after_chunks", [1, 5])
def test_a_change_between_chunks_stops_the_next_one(
    tmp_path: Path, kind: str, change: str, block_bytes: int | None, after_chunks: int
) -> None:
    data = jsonl_text() if kind == "jsonl" else csv_text()
    path = tmp_path / f"p.{kind}"
    path.write_bytes(data)
    reader = open_text_reader(kind, path, block_bytes or 8 << 20)
    try:
        for _ in range(after_chunks):
            chunk = reader.next_chunk(100)
            assert chunk is not None and not chunk.eof
        do, what = CHANGES[change]
        do(path, data)
        with pytest.raises(SourceChangedError) as err:
            reader.next_chunk(100)  # not one record after the change
        msg = str(err.value)
        assert f"partition {str(path)!r} changed while it was read" in msg
        assert what in msg and "\n" not in msg
    finally:
        reader.close()


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_change_before_the_last_chunk_is_seen_at_the_end(tmp_path: Path, kind: str) -> None:
    """The whole file is read and parsed at the first chunk; cut before the chunk
    that holds the end, the end is refused too (it would declare the partition
    complete)."""
    data = jsonl_text(50) if kind == "jsonl" else csv_text(50)
    path = tmp_path / f"p.{kind}"
    path.write_bytes(data)
    reader = open_text_reader(kind, path, 8 << 20)
    try:
        first = reader.next_chunk(49)
        assert first is not None and not first.eof
        truncated(path, data)
        with pytest.raises(SourceChangedError, match="truncated"):
            reader.next_chunk(100)
    finally:
        reader.close()


def test_growing_while_read_is_not_a_change(tmp_path: Path) -> None:
    data = jsonl_text(500)
    path = tmp_path / "p.jsonl"
    path.write_bytes(data)
    reader = open_text_reader("jsonl", path, 1000)
    try:
        total = 0
        while (chunk := reader.next_chunk(50)) is not None:
            total += chunk.events.height
            with path.open("ab") as f:
                f.write(b'{"user": "late", "ts": 1, "amount": 1}\n')
        assert total == 500  # what was appended after the file was opened waits
    finally:
        reader.close()


def write_parquet(path: Path, n: int = N, user: str = "u") -> None:
    table = pa.table({"user": [f"{user}{i % 7}" for i in range(n)], "ts": list(range(n)),
                      "amount": list(range(n))})
    pq.write_table(table, path, row_group_size=500)


def parquet_rewritten(path: Path) -> None:
    with path.open("r+b") as f:  # in place, same inode, other rows
        f.truncate(0)
    write_parquet(path, user="w")


def parquet_replaced(path: Path) -> None:
    other = path.with_name("new.parquet")
    write_parquet(other)  # the same rows, another file
    os.replace(other, path)


def parquet_truncated(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize(("change", "what"), [
    (parquet_rewritten, "when opened"),
    (parquet_replaced, "names another file"),
    (parquet_truncated, "when opened"),
])
@pytest.mark.parametrize("batch_rows", [100, 65_536])
def test_a_parquet_change_between_chunks_stops_the_next_one(
    tmp_path: Path, change: Callable[[Path], None], what: str, batch_rows: int
) -> None:
    path = tmp_path / "p.parquet"
    write_parquet(path)
    reader = ParquetReader(str(path), path, PLAN, batch_rows=batch_rows)
    try:
        chunk = reader.next_chunk(100)
        assert chunk is not None and chunk.events.height == 100
        change(path)
        with pytest.raises(SourceChangedError) as err:
            while reader.next_chunk(100) is not None:
                pass
        msg = str(err.value)
        assert f"partition {str(path)!r} changed while it was read" in msg and what in msg
    finally:
        reader.close()


def test_a_partition_cut_between_batches_stops_the_merger(tmp_path: Path) -> None:
    """Two partitions through the runtime's merger: one cut between two batches."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(jsonl_text())
    b.write_bytes(jsonl_text(user="v"))
    starts = [SourcePosition.start(), SourcePosition.start()]
    readers: list[PartitionReader] = [JsonlReader("in/a.jsonl", a, PLAN, block_bytes=4000),
                                      JsonlReader("in/b.jsonl", b, PLAN, block_bytes=4000)]
    merger = PartitionMerger(readers, starts, PLAN, 200)
    try:
        first = merger.next_batch()
        assert first is not None and not first.finished
        truncated(b, b.read_bytes())
        with pytest.raises(SourceChangedError, match=r"partition 'in/b\.jsonl' \(.*b\.jsonl'\)"):
            while (batch := merger.next_batch()) is not None and not batch.finished:
                pass
    finally:
        merger.close()
