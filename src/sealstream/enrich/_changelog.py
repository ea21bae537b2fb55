"""A compacted Kafka topic read as a changelog table.

Each record is a version of its key's row: the message key is the ``on`` field's
value, the value a JSON object of the other columns, and the record's timestamp
the time the version is valid from. A record with no value (a tombstone) deletes
the key from its timestamp on. Of two records of one key with the same timestamp,
the later one (by offset) is the version.

At the start of a run the topic is read from its start up to its end offsets seen
then; those positions are the table's version, with a hash of what was read. A
resumed run reads up to the positions its checkpoint recorded (not to the new
end), so it joins the same versions as the run that wrote the checkpoint.
"""

from __future__ import annotations

import time
from itertools import repeat
from operator import is_, itemgetter
from typing import Any

import polars as pl

from sealstream.enrich._settings import Enrich
from sealstream.enrich._tables import PRESENT, VALID_FROM, Table, snapshot_hash
from sealstream.errors import SourceError, SourceUnavailableError

_BATCH = 10_000


def _fail(e: Enrich, what: str) -> SourceUnavailableError:
    return SourceUnavailableError(f"enrich.{e.name}: the kafka broker {e.bootstrap} cannot be "
                                  f"reached ({what}); gave up after {e.fail_after_ms} ms")


def load_changelog(e: Enrich, pinned: dict[str, Any] | None = None) -> Table:
    """Read ``e``'s topic up to its end (or up to ``pinned``: partition -> offset)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from sealstream.sources._kafka_log import CLIENT_LOG, RECEIVE_MAX_BYTES

    assert e.topic is not None and e.bootstrap is not None
    consumer = Consumer({"bootstrap.servers": e.bootstrap, "group.id": f"sealstream-{e.name}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.partition.eof": False,
                         "receive.message.max.bytes": RECEIVE_MAX_BYTES, "logger": CLIENT_LOG})
    deadline = time.monotonic() + e.fail_after_ms / 1000
    try:
        while True:
            try:
                md = consumer.list_topics(e.topic, timeout=max(0.5, min(
                    5.0, deadline - time.monotonic())))
                break
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise _fail(e, str(exc)) from None
        tmd = md.topics.get(e.topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            raise SourceError(f"enrich.{e.name}: changelog topic {e.topic!r} does not exist on "
                              f"{e.bootstrap} (deleted?); the table cannot be read")
        parts = sorted(tmd.partitions)
        ranges: dict[int, tuple[int, int]] = {}
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(e.topic, p),
                                                       timeout=10.0)
            if pinned is not None:
                want = pinned.get(str(p))
                if not isinstance(want, int) or want > high:
                    raise SourceError(
                        f"enrich.{e.name}: changelog topic {e.topic!r} partition {p} ends at "
                        f"offset {high}, below the position {want} the checkpoint read it to "
                        "(the topic was deleted or re-created)")
                high = want
            ranges[p] = (int(low), int(high))
        batches: list[pl.DataFrame] = []
        todo = {p for p, (lo, hi) in ranges.items() if hi > lo}
        if todo:
            consumer.assign([TopicPartition(e.topic, p, ranges[p][0]) for p in sorted(todo)])
        ends = pl.DataFrame({"__p": sorted(ranges), "__end": [ranges[p][1] for p in
                                                              sorted(ranges)]},
                            schema={"__p": pl.Int64, "__end": pl.Int64})
        while todo:
            if time.monotonic() >= deadline + 60:
                raise _fail(e, f"reading topic {e.topic!r}")
            msgs = consumer.consume(_BATCH, timeout=1.0)
            if not msgs:
                continue
            # per message only C-level calls (map over the method descriptors), then the
            # range checks in columns: no Python frame per record
            batch = _columns(msgs).join(ends, on="__p").filter(
                pl.col("__ok") & (pl.col("__o") < pl.col("__end")))
            batches.append(batch.drop("__ok", "__end"))
            done = batch.group_by("__p").agg((pl.col("__o").max() + 1 >= pl.col("__end")
                                              .first()).alias("done")).filter("done")
            todo -= set(done.get_column("__p").to_list())
    finally:
        consumer.close()
    frame = _frame(e, pl.concat(batches) if batches else _columns([]).drop("__ok"))
    positions = {str(p): hi for p, (_, hi) in sorted(ranges.items())}
    return Table(e, frame, {"sha256": snapshot_hash(frame), "rows": frame.height,
                            "positions": positions}, versioned=True)


def _columns(msgs: list[Any]) -> pl.DataFrame:
    """The messages as columns: partition, offset, key, value, timestamp and whether
    the message is a record (not an error or end-of-partition event)."""
    from confluent_kafka import Message

    return pl.DataFrame({
        "__p": pl.Series(list(map(Message.partition, msgs)), dtype=pl.Int64),
        "__o": pl.Series(list(map(Message.offset, msgs)), dtype=pl.Int64),
        "__k": pl.Series(list(map(Message.key, msgs)), dtype=pl.Binary),
        "__v": pl.Series(list(map(Message.value, msgs)), dtype=pl.Binary),
        VALID_FROM: pl.Series(list(map(itemgetter(1), map(Message.timestamp, msgs))),
                              dtype=pl.Int64),
        "__ok": pl.Series(list(map(is_, map(Message.error, msgs), repeat(None))),
                          dtype=pl.Boolean),
    })


def _not_utf8(records: pl.DataFrame) -> str:
    """Where the first key or value that is not UTF-8 is (the error path only)."""
    for p, o, k, v in records.select("__p", "__o", "__k", "__v").iter_rows():
        for what, data in (("key", k), ("value", v)):
            try:
                if data is not None:
                    data.decode("utf-8")
            except UnicodeDecodeError:
                return f"partition {p} offset {o}: its {what}"
    return "a record"  # pragma: no cover - polars and Python disagree on UTF-8


def _frame(e: Enrich, records: pl.DataFrame) -> pl.DataFrame:
    """The records as rows: the key column, the value's columns, ``__vf`` and
    ``__present``; one row per key and timestamp (the last by offset)."""
    field = e.on[0]
    try:
        raw = records.select(
            pl.col("__k").cast(pl.String).alias(field),
            pl.col("__v").cast(pl.String), VALID_FROM, "__o",
        ).filter(pl.col(field).is_not_null())
    except pl.exceptions.ComputeError:
        raise SourceError(f"enrich.{e.name}: changelog topic {e.topic!r} {_not_utf8(records)} "
                          "is not UTF-8 text") from None
    raw = raw.sort([VALID_FROM, "__o"]).unique([field, VALID_FROM], keep="last",
                                               maintain_order=True)
    present = raw.get_column("__v").is_not_null()
    body = raw.filter(present)
    decoded: pl.DataFrame
    try:
        decoded = (body.get_column("__v").str.json_decode(infer_schema_length=None)
                   .struct.unnest() if body.height else pl.DataFrame())
    except Exception as exc:  # noqa: BLE001 - a value that is not a JSON object
        raise SourceError(f"enrich.{e.name}: changelog topic {e.topic!r} holds a value that "
                          f"is not a JSON object ({str(exc).splitlines()[0]})") from None
    rows = pl.concat([body.select(field, VALID_FROM).hstack(
        decoded.drop([c for c in decoded.columns if c in (field, VALID_FROM)])),
        raw.filter(~present).select(field, VALID_FROM)], how="diagonal_relaxed")
    flags = pl.Series(PRESENT, [True] * body.height + [False] * (raw.height - body.height))
    return rows.with_columns(flags).sort(VALID_FROM, maintain_order=True)
