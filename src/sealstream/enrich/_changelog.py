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

    from sealstream.sources._kafka_log import CLIENT_LOG

    assert e.topic is not None and e.bootstrap is not None
    consumer = Consumer({"bootstrap.servers": e.bootstrap, "group.id": f"sealstream-{e.name}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.partition.eof": False,
                         "logger": CLIENT_LOG})
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
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        stamps: list[int] = []
        offsets: list[int] = []
        todo = {p for p, (lo, hi) in ranges.items() if hi > lo}
        if todo:
            consumer.assign([TopicPartition(e.topic, p, ranges[p][0]) for p in sorted(todo)])
        while todo:
            if time.monotonic() >= deadline + 60:
                raise _fail(e, f"reading topic {e.topic!r}")
            for msg in consumer.consume(_BATCH, timeout=1.0):
                if msg.error() is not None:
                    continue
                p, off = msg.partition(), msg.offset()
                if p is None or off is None or p not in todo or off >= ranges[p][1]:
                    continue
                keys.append(msg.key())
                values.append(msg.value())
                stamps.append(msg.timestamp()[1])
                offsets.append(off)
                if off + 1 >= ranges[p][1]:
                    todo.discard(p)
    finally:
        consumer.close()
    frame = _frame(e, keys, values, stamps, offsets)
    positions = {str(p): hi for p, (_, hi) in sorted(ranges.items())}
    return Table(e, frame, {"sha256": snapshot_hash(frame), "rows": frame.height,
                            "positions": positions}, versioned=True)


def _frame(e: Enrich, keys: list[bytes | None], values: list[bytes | None],
           stamps: list[int], offsets: list[int]) -> pl.DataFrame:
    """The records as rows: the key column, the value's columns, ``__vf`` and
    ``__present``; one row per key and timestamp (the last by offset)."""
    field = e.on[0]
    raw = pl.DataFrame({
        field: pl.Series([k.decode("utf-8", "replace") if k is not None else None
                          for k in keys], dtype=pl.String),
        "__v": pl.Series([v.decode("utf-8", "replace") if v is not None else None
                          for v in values], dtype=pl.String),
        VALID_FROM: pl.Series(stamps, dtype=pl.Int64),
        "__o": pl.Series(offsets, dtype=pl.Int64),
    }).filter(pl.col(field).is_not_null())
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
