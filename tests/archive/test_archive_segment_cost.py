"""The archive's cheaper writing path (docs/object-storage.md, "Its cost"): tapped
frames are taken per frame (only a frame astride a step's bound is filtered), a
segment's bytes do not depend on how the polls chunked its rows, and retention lists
the archive once a run, then deletes the segments the run created without listing.

A directory archive, through the archiver's own API (a tapped partition hands it its
polls' frames as a broker partition does).
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from sealstream.archive import ArchiveSettings, SegmentEntry, decode_segment, encode_segment
from sealstream.archive._live import Archiver
from sealstream.sources._base import FieldPlan

PLAN = FieldPlan(key="@key", time="@timestamp", fields={"amount": "numeric"})


def frame(lo: int, hi: int) -> pl.DataFrame:
    """The raw frame of one poll: positions ``[lo, hi)``."""
    n = hi - lo
    return pl.DataFrame({
        "position": np.arange(lo, hi, dtype=np.int64),
        "key": pl.Series([f"k{i % 3}".encode() if i % 2 else None for i in range(lo, hi)],
                         dtype=pl.Binary),
        "timestamp_ms": np.arange(lo, hi, dtype=np.int64) * 10,
        "value": pl.Series([f'{{"amount": {i}}}'.encode() for i in range(lo, hi)],
                           dtype=pl.Binary),
    }) if n else pl.DataFrame()


def tapped(archiver: Archiver, name: str) -> Any:
    part = SimpleNamespace(name=name, raw_tap=None)
    archiver.attach(part)
    return part


def test_take_returns_the_range_and_keeps_what_follows(tmp_path: Path) -> None:
    archiver = Archiver(ArchiveSettings(url="archive", base_dir=tmp_path), PLAN)
    try:
        part = tapped(archiver, "t/0")
        for lo, hi in [(0, 7), (7, 12), (12, 30), (30, 31), (31, 45)]:
            part.raw_tap(frame(lo, hi))
        got = archiver._take("t/0", 3, 20)  # astride both bounds, one frame wholly in
        assert got["position"].to_list() == list(range(3, 20))
        assert got.equals(frame(3, 20))
        # rows below 20 left the buffer; the rest stays, in order
        rest = archiver._take("t/0", 20, 45)
        assert rest["position"].to_list() == list(range(20, 45))
        assert archiver._take("t/0", 45, 50).height == 0
        # frames out of order are still cut by position (each kept in arrival order)
        part.raw_tap(frame(60, 70))
        part.raw_tap(frame(50, 60))
        assert archiver._take("t/0", 55, 65)["position"].to_list() == [
            *range(60, 65), *range(55, 60)]
        assert archiver._take("t/0", 0, 100)["position"].to_list() == list(range(65, 70))
    finally:
        archiver.close()


def test_a_segments_bytes_do_not_depend_on_the_polls_chunking() -> None:
    def rows(cuts: list[int]) -> pl.DataFrame:
        parts = [frame(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
        return pl.concat(parts, rechunk=False).with_columns(
            pl.lit("t/0", pl.String).alias("partition"))

    one, entry = encode_segment(4, rows([0, 5000]), ordered=True)
    many, entry2 = encode_segment(4, rows([0, 1, 700, 701, 3000, 4999, 5000]), ordered=True)
    assert one == many and entry == entry2
    back = decode_segment(one, SegmentEntry.from_json(entry.to_json()), "here")
    assert back.equals(rows([0, 5000]).select(back.columns))
    # positions and timestamps as deltas, the partition as a dictionary (measured
    # smaller than plain + zstd at no more CPU)
    meta = pq.ParquetFile(io.BytesIO(one)).metadata.row_group(0)
    enc = {meta.column(i).path_in_schema: set(meta.column(i).encodings)
           for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in enc["position"]
    assert "DELTA_BINARY_PACKED" in enc["timestamp_ms"]


def _wait(archiver: Archiver) -> None:
    pruning = archiver._pruning
    if pruning is not None:
        pruning.result(timeout=300)


def test_retention_lists_once_then_deletes_what_the_run_created(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    archiver = Archiver(ArchiveSettings(url="archive", base_dir=tmp_path), PLAN)
    try:
        # a segment an earlier run left (its step at or before the oldest checkpoint's)
        earlier = "seg-000000000001-0123456789abcdef.parquet"
        archiver.objects.create(earlier, b"earlier run")
        part = tapped(archiver, "t/0")
        names = []
        for step in range(2, 7):
            part.raw_tap(frame(step * 10, step * 10 + 10))
            archiver.write(step, {"t/0": (step * 10, step * 10 + 10)})
            doc = archiver.settle()  # the entry, once the segment is durable
            assert doc is not None and (root / doc["name"]).is_file()
            names.append(doc["name"])
        assert all((root / n).is_file() for n in names)
        archiver.prune(3)  # the first pruning lists: the earlier run's segment goes too
        _wait(archiver)
        assert not (root / earlier).exists()
        assert [(root / n).exists() for n in names] == [False, False, True, True, True]
        # a segment that is not this run's, appearing after the listing, is left for
        # the next run's listing; this run's own go as the checkpoints move on
        stray = "seg-000000000004-fedcba9876543210.parquet"
        archiver.objects.create(stray, b"not this run's")
        archiver.prune(5)
        _wait(archiver)
        assert [(root / n).exists() for n in names] == [False, False, False, False, True]
        assert (root / stray).exists()
        assert archiver.pruned == 5
    finally:
        archiver.close()
    # the next run lists again: the stray segment goes with its first pruning
    again = Archiver(ArchiveSettings(url="archive", base_dir=tmp_path), PLAN)
    try:
        again.prune(5)
        _wait(again)
        assert not (root / stray).exists() and (root / names[-1]).exists()
    finally:
        again.close()
