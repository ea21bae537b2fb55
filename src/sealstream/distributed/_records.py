"""Late events and bad records staged by the workers (bounded sources; Kafka and NATS).

With a JSON Lines or Parquet directory for ``[late]`` or ``[errors]``, these rows are
staged as results are (:mod:`._sinks`): a part file per worker and epoch
(``part-<epoch>-<run>w<i>``), made durable at a checkpoint, named by the manifest and
committed by each worker when the coordinator tells it to after the manifest.

Who stages a row: the worker that **reads its partition** (partition ``q`` is read by
worker ``q mod N``). Bad records are found there (parse and ``[transform]``
failures) and kept there until the coordinator, at the step's apply, tells the worker
the epoch; a late event is found by its key's worker, which puts the step's late rows
(partition, offset and the window columns, no text) in Ray's object store and returns
only their number and a reference; the coordinator passes the references on,
unresolved, to the partitions' readers, which hold the raw text of the step's records
and stage the late lines. The coordinator receives counts and references only.

Each stager keeps the identities (partition, offset) of what it staged per epoch; at a
checkpoint one worker (``epoch mod N``) fetches every worker's and computes the
receipt's count and digest (the single-process digest over the sorted ids).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import polars as pl

from sealstream._runtime.engine import Job
from sealstream._runtime.merge import Batch
from sealstream.checkpoint import receipts as trees
from sealstream.distributed._plane import raw_texts
from sealstream.distributed._receipts import EpochIds
from sealstream.distributed._sinks import stages_on_workers
from sealstream.pipeline import Pipeline
from sealstream.sinks import open_sink
from sealstream.sinks._base import JSON_LINE, Sink
from sealstream.sources._base import OFFSET, PARTITION

ROLES = ("late", "errors")


def bad_frame(names: list[str], bad: pl.DataFrame) -> pl.DataFrame:
    """Bad records (with their partition ``_p``) as the ``[errors]`` output's rows, as
    the single-process engine makes them."""
    frame = bad.select(
        pl.lit(pl.Series(names, dtype=pl.String)).gather(pl.col("_p")).alias("_partition"),
        pl.col("_offset"), pl.col("_line"), pl.col("_reason"), pl.col("_raw"),
    )
    return frame.with_columns(
        pl.struct(["_partition", "_offset", "_line", "_reason", "_raw"])
        .struct.json_encode().alias(JSON_LINE))


def late_frame(names: list[str], late: pl.DataFrame, spans: dict[int, list[Any]]
               ) -> pl.DataFrame:
    """Late events (sorted in read order) as the ``[late]`` output's rows, their raw
    text from ``spans`` (partition -> the step's raw text spans): the single-process
    :meth:`Job._late_frame` itself, given the text this worker holds."""
    def texts(partitions: Any, offsets: Any) -> pl.Series:
        out = pl.Series("_raw", [], dtype=pl.String)
        parts = []
        idx = []
        for q in sorted({int(v) for v in np.unique(partitions)}):
            sel = np.flatnonzero(partitions == q)
            parts.append(raw_texts(spans[q], offsets[sel]))
            idx.append(sel)
        if not parts:
            return out
        got = pl.concat(parts, how="vertical")
        order = np.argsort(np.concatenate(idx), kind="stable")
        return got.gather(pl.Series(order, dtype=pl.Int64))

    shim = SimpleNamespace(names=names)
    batch = SimpleNamespace(raw_texts=texts)
    return Job._late_frame(cast(Job, shim), late, cast(Batch, batch))


class WorkerRecords:
    """A worker's own ``[late]`` or ``[errors]`` sink: a part file per epoch, and the
    identities of what it staged (for the epoch's receipt)."""

    def __init__(self, pipeline: Pipeline, role: str, run_token: str, names: list[str],
                 keep_ids: bool, sink: Sink | None = None) -> None:
        """``sink``: the worker's own Kafka producer (:mod:`._kafka_sinks`) instead of
        a part file."""
        config = pipeline.late if role == "late" else pipeline.errors
        assert config is not None
        self.sink = sink if sink is not None else open_sink(config, "records", run_token)
        if sink is None and not stages_on_workers(self.sink):
            raise RuntimeError(f"{config.kind} {role} outputs are not staged per worker")
        self.names = names
        self.ids = EpochIds()
        self.keep_ids = keep_ids

    def stage(self, epoch: int, frame: pl.DataFrame) -> None:
        if not frame.height:
            return
        self.sink.write(epoch, frame)
        if self.keep_ids:
            self.ids.add(epoch, frame.select("_partition", "_offset"))

    def close(self) -> None:
        self.sink.close()


def records_digest(frames: list[pl.DataFrame]) -> dict[str, Any]:
    """The receipt of an epoch's late events or bad records (every stager's ids): the
    single-process digest over the sorted ``partition|offset`` texts."""
    if not frames:
        return {"count": 0, "digest": trees.joined_digest(pl.Series("id", [], pl.String))}
    ids = pl.concat(frames, how="vertical").select(Job._ids("late")).sort("id")["id"]
    return {"count": ids.len(), "digest": trees.joined_digest(ids)}


def late_of(frames: list[pl.DataFrame], mine: set[int]) -> pl.DataFrame | None:
    """The late rows of the partitions in ``mine``, in read order."""
    if not frames:
        return None
    late = pl.concat(frames, how="vertical")
    late = late.filter(pl.col(PARTITION).is_in(sorted(mine)))
    return late.sort([OFFSET, PARTITION]) if late.height else None
