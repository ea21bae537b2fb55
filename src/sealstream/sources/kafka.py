"""Kafka topics as live partitions (``kind = "kafka"``, confluent-kafka).

A partition is one topic partition, named ``"<topic>/<n>"``; its position is a
Kafka offset: the offset of the next record to read. Positions are saved in the
signed checkpoint manifest; the consumer ``group`` only receives them after each
checkpoint, for lag tools, and is never read back.

Reading:

- Each partition has its own consumer, ``assign()``-ed to it (no group
  rebalancing), with ``isolation.level = read_committed`` (records of aborted or
  open transactions are never read) and ``auto.offset.reset = error`` (a
  position that no longer exists is an error, never a silent jump).
- :meth:`KafkaPartition.poll` takes up to ``max_records`` messages with one
  ``consume()`` call and parses their values in one go with the shared columnar
  parser (:mod:`sealstream.sources._values`). With
  ``SEALSTREAM_KAFKA_PREFETCH=1`` each partition does this one chunk ahead on a
  thread of its own while the run works on the previous chunk
  (:mod:`._kafka_prefetch`; off by default: slower, and more CPU, where measured);
  positions are those of what was handed out. Offsets may have gaps
  (transaction markers, aborted records): when the consumer reaches the end of
  what is readable it learns the end offset and the position moves there.
- Start modes (when a partition has no saved position): ``earliest`` (the log
  start offset), ``latest`` (the end offset when the run opens the partition)
  and ``time`` (the first offset whose timestamp is at or after
  ``start_time_ms``). Partitions that appear while the job runs (the topic
  grew) are read from their start, whatever the start mode.
- ``end()`` is the last stable offset (the high watermark for a consumer that
  reads committed records): with ``stop = "end"`` the run reads up to the end
  positions seen at start. ``earliest()`` is the log start offset.

Faults:

- A saved position below the log start offset (before or during a run) raises
  :class:`~sealstream.errors.SourceExpiredError` naming partition, saved and
  earliest offsets and the ways forward.
- A broker that cannot be reached at start raises
  :class:`~sealstream.errors.SourceUnavailableError` naming the address after
  ``fail_after_ms``; one lost during a run is retried (the client reconnects with
  back-off; the partition reports ``connected = False``) and fails the same way
  once it has been unreachable for ``fail_after_ms``.
- A topic that disappears or has fewer partitions than before is a
  :class:`~sealstream.errors.SourceError` (Kafka cannot shrink a topic: it was
  deleted and re-created, and positions no longer mean the same records).

>>> # source = KafkaSource(KafkaSettings("127.0.0.1:9092", "orders"), plan)
>>> # names = source.discover()             # ["orders/0", "orders/1"]
>>> # part = source.open(names[0], None)   # from the start mode
>>> # chunk = part.poll(10_000, 100)       # a Chunk, empty when nothing is there yet
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_, is_not, itemgetter
from typing import Any, Literal

import numpy as np
import polars as pl

from ..errors import SourceError, SourceExpiredError, SourceUnavailableError, SpecError
from ._base import Chunk, FieldPlan
from ._kafka_log import CLIENT_LOG, RECEIVE_MAX_BYTES, note_trouble
from ._kafka_prefetch import Prefetcher, prefetch_depth
from ._live import MESSAGE_KEY, MESSAGE_TIMESTAMP, ValueParser, empty_chunk

StartMode = Literal["earliest", "latest", "time"]
StopMode = Literal["never", "end"]

DEFAULT_FAIL_AFTER_MS = 30_000
_PROBE_MS = 1_000  # a disconnected partition asks the broker at most this often
_QUERY_TIMEOUT_S = 5.0
#: how long the read-ahead thread waits for a message when the partition has none
_FETCH_WAIT_MS = 100
#: an unanswered group commit holds newer ones back at most this long
_COMMIT_PATIENCE_S = 30.0

#: client settings sealstream sets itself (a user's value would break a guarantee)
_RESERVED = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "auto.offset.reset",
        "isolation.level",
        "enable.partition.eof",
        "error_cb",
    }
)


@dataclass(frozen=True)
class KafkaSettings:
    """What a ``kind = "kafka"`` source reads, and how.

    ``client`` holds extra librdkafka settings passed through as they are (for
    example ``security.protocol``, ``sasl.mechanism``, ``fetch.max.bytes``); the
    settings that carry sealstream's guarantees (``_RESERVED``) are refused.
    """

    bootstrap: str
    topic: str
    group: str | None = None
    start: StartMode = "earliest"
    start_time_ms: int | None = None
    stop: StopMode = "never"
    client: Mapping[str, str] = field(default_factory=dict)
    fail_after_ms: int = DEFAULT_FAIL_AFTER_MS

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise SpecError("kafka source: 'bootstrap' is required (host:port)")
        if not self.topic:
            raise SpecError("kafka source: 'topic' is required")
        if self.start not in ("earliest", "latest", "time"):
            raise SpecError(
                f"kafka source: start = {self.start!r} is not one of earliest, latest, time"
            )
        if (self.start == "time") != (self.start_time_ms is not None):
            raise SpecError("kafka source: start = \"time\" needs start_time_ms (and only it)")
        if self.stop not in ("never", "end"):
            raise SpecError(f"kafka source: stop = {self.stop!r} is not one of never, end")
        if self.fail_after_ms <= 0:
            raise SpecError(f"kafka source: fail_after_ms = {self.fail_after_ms} must be > 0")
        reserved = sorted(_RESERVED & set(self.client))
        if reserved:
            raise SpecError(
                f"kafka source: client setting {reserved[0]!r} is set by sealstream "
                "(positions live in the checkpoint; reads are read_committed)"
            )

    def consumer_config(self, group: str | None = None) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "receive.message.max.bytes": RECEIVE_MAX_BYTES,  # _kafka_log: why
            **dict(self.client),
            "bootstrap.servers": self.bootstrap,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
        conf["group.id"] = group or self.group or "sealstream-reader"
        return conf


def partition_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_partition_name(name: str) -> tuple[str, int]:
    topic, _, num = name.rpartition("/")
    if not topic or not num.isdigit():
        raise SourceError(f"{name!r} is not a Kafka partition name (topic/number)")
    return topic, int(num)


class _Link:
    """Whether a client reaches its broker, from librdkafka's error callback and
    from the answers it gets; the time since it was last connected."""

    def __init__(self, bootstrap: str, fail_after_ms: int) -> None:
        self.bootstrap = bootstrap
        self.fail_after_ms = fail_after_ms
        self.connected = True
        self.lost_at: float | None = None
        self.last_error = ""
        self.last_probe = 0.0

    def on_error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        code = err.code()
        if code in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE):
            self.lost(str(err.str()))

    def lost(self, why: str) -> None:
        note_trouble("kafka source", self.bootstrap, why)
        if self.connected or self.lost_at is None:
            self.lost_at = time.monotonic()
        self.connected = False
        self.last_error = why

    def ok(self) -> None:
        self.connected = True
        self.lost_at = None

    def check(self, what: str) -> None:
        """Raise once the broker has been unreachable for ``fail_after_ms``."""
        if self.connected or self.lost_at is None:
            return
        gone_ms = (time.monotonic() - self.lost_at) * 1000
        if gone_ms >= self.fail_after_ms:
            raise SourceUnavailableError(
                f"kafka broker {self.bootstrap} unreachable for {gone_ms / 1000:.1f} s "
                f"({what}; fail_after_ms = {self.fail_after_ms}): {self.last_error or 'no answer'}"
            )


def _consumer(conf: dict[str, Any], link: _Link) -> Any:
    from confluent_kafka import Consumer, KafkaException

    try:
        return Consumer({**conf, "error_cb": link.on_error, "logger": CLIENT_LOG})
    except KafkaException as e:
        raise SpecError(f"kafka source: the client settings are refused: {_why(e)}") from None


def _why(e: Exception) -> str:
    err: Any = e.args[0] if e.args else None
    return str(err.str()) if err is not None and hasattr(err, "str") else str(e)


def _until(link: _Link, what: str, attempt: Any) -> Any:
    """Call ``attempt()`` until it answers, for at most ``fail_after_ms``, with back-off."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + link.fail_after_ms / 1000
    delay = 0.05
    while True:
        left = deadline - time.monotonic()
        try:
            out = attempt(max(0.1, min(_QUERY_TIMEOUT_S, left)))
        except KafkaException as e:
            link.lost(_why(e))
            out = None
        if out is not None:
            link.ok()
            return out
        if time.monotonic() >= deadline:
            link.lost(link.last_error or "no answer")
            started = deadline - link.fail_after_ms / 1000
            link.lost_at = min(link.lost_at or time.monotonic(), started)
            link.check(what)
            raise SourceUnavailableError(f"kafka broker {link.bootstrap} unreachable ({what})")
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)



_SECOND = itemgetter(1)


def message_times(msgs: list[Any]) -> np.ndarray[Any, Any]:
    """The messages' timestamps (ms) as int64: ``Message.timestamp()`` gives (type, ms)
    pairs; map and itemgetter run in C, with no Python frame per record."""
    from confluent_kafka import Message

    return np.fromiter(map(_SECOND, map(Message.timestamp, msgs)), np.int64, count=len(msgs))


class KafkaPartition:
    """One topic partition, read from a position. See the module docstring."""

    def __init__(
        self,
        settings: KafkaSettings,
        name: str,
        parser: ValueParser,
        position: int | None,
        from_start: bool = False,
        prefetch: int = 0,
    ) -> None:
        """``prefetch``: chunks read ahead on a thread of its own (0, the default:
        none, every poll fetches and parses on the caller's thread)."""
        from confluent_kafka import TopicPartition

        self.name = name
        self._settings = settings
        self._topic, self._num = parse_partition_name(name)
        self._parser = parser
        self._want_keys = parser.key_from_message
        self._want_ts = parser.time_from_message
        self._link = _Link(settings.bootstrap, settings.fail_after_ms)
        self._consumer = _consumer(settings.consumer_config(), self._link)
        #: the client of the offset queries (a shared consumer's partition: one that
        #: fetches nothing, :mod:`._kafka_shared`)
        self._queries: Any = self._consumer
        self._tp = TopicPartition(self._topic, self._num)
        try:
            low, high = self._watermarks()
            if position is None:
                position = self._start_position(low, high, from_start)
            elif position < low:
                raise self._expired(position, low)
            self._position = position
            self._consumer.assign([TopicPartition(self._topic, self._num, position)])
        except BaseException:
            self._consumer.close()
            raise
        self._end_seen: int | None = high
        #: the position after what :meth:`poll` handed out (``_position`` is the
        #: fetch's: ahead of it by what waits in the read-ahead queue)
        self._handed = self._position
        self._depth = prefetch
        self._ahead = self._new_prefetcher()
        #: the (low, high) just read at open: what ``earliest``/``end`` answer until the
        #: first poll or seek (a query after ``assign`` waits behind the first fetch,
        #: up to a second per partition on a loaded broker)
        self._marks_at_open: tuple[int, int] | None = (low, high)
        self.closed = False
        #: ``[archive]``: called with each poll's raw messages (one frame: position,
        #: key, timestamp_ms, value) before they are parsed (sealstream.archive)
        self.raw_tap: Callable[[pl.DataFrame], None] | None = None

    # -- the contract ---------------------------------------------------------
    @property
    def position(self) -> int:
        """The offset of the next record to read."""
        return self._handed

    @property
    def connected(self) -> bool:
        return self._link.connected

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        """Up to ``max_records`` records from the position: a Chunk (empty when
        nothing is there yet; never None: a topic does not end).

        With read-ahead (``prefetch`` > 0), the next chunks were fetched and parsed on
        the partition's thread while the caller worked (:mod:`._kafka_prefetch`):
        this hands out the oldest one, waiting at most ``timeout_ms`` for one."""
        if self._ahead is None:
            chunk, raw = self._fetch(max_records, timeout_ms)
        else:
            got = self._ahead.take(max_records, timeout_ms / 1000)
            if got is None:
                return empty_chunk(self._parser.plan, self._handed)
            chunk, raw = got
        if raw is not None and self.raw_tap is not None:
            self.raw_tap(raw)
        self._handed = chunk.position.offset
        return chunk

    def _fetch_ahead(self, max_records: int) -> tuple[Chunk, pl.DataFrame | None] | None:
        """One fetch of the read-ahead thread; None when it brought nothing new."""
        before = self._position
        chunk, raw = self._fetch(max_records, _FETCH_WAIT_MS)
        if chunk.last_offset is None and chunk.position.offset == before:
            return None
        return chunk, raw

    def _fetch(self, max_records: int, timeout_ms: int) -> tuple[Chunk, pl.DataFrame | None]:
        """Consume and parse up to ``max_records`` records from the fetch position;
        with them, their raw frame when the archive taps this partition."""
        from confluent_kafka import KafkaError, Message

        # what the client holds now; when it holds nothing, wait (at most timeout_ms)
        # for the first message only, then take what came with it (consume(n, t) would
        # wait the whole timeout for n messages)
        self._marks_at_open = None
        want = max(1, max_records)
        msgs = self._consumer.consume(want, 0)
        if not msgs and timeout_ms > 0:
            msgs = self._consumer.consume(1, timeout_ms / 1000)
            if msgs and want > 1:
                msgs += self._consumer.consume(want - 1, 0)
        if not msgs:
            self._probe()
            return self._empty(), None
        # per message, only C-level calls (map over the method descriptors): no Python
        # frame per record
        errors = list(map(Message.error, msgs))
        # (not errors.count(None): a KafkaError compared with None raises inside C)
        errs: list[Any] = []
        if any(map(is_not, errors, repeat(None))):
            # the end of a partition comes as an error message after its last record
            # (every backfill's last fetch): split with C-level iterators, not a Python
            # frame per record
            errs = list(compress(msgs, map(is_not, errors, repeat(None))))
            msgs = list(compress(msgs, map(is_, errors, repeat(None))))
            for m in errs:
                self._message_error(m)
        self._link.ok()
        eof = [m.offset() for m in errs if m.error().code() == KafkaError._PARTITION_EOF]
        if not msgs:
            if eof:  # the end of what is readable: skip markers and aborted records
                self._position = max(self._position, max(eof))
                self._end_seen = max(self._end_seen or 0, self._position)
            return self._empty(), None
        offsets = np.fromiter(map(Message.offset, msgs), dtype=np.int64, count=len(msgs))
        values = list(map(Message.value, msgs))
        keys = list(map(Message.key, msgs)) if self._want_keys else None
        stamps = None
        if self._want_ts:
            stamps = message_times(msgs)
        if int(offsets[0]) > self._position:  # a gap: markers, or records deleted unread?
            low = self.earliest()
            if low is not None and low > self._position:
                raise self._expired(self._position, low)
        self._position = int(offsets[-1]) + 1
        if eof:
            self._position = max(self._position, max(eof))
        raw = None
        if self.raw_tap is not None:
            raw = pl.DataFrame({
                "position": offsets,
                "key": pl.Series(keys if keys is not None else list(map(Message.key, msgs)),
                                 dtype=pl.Binary),
                "timestamp_ms": stamps if stamps is not None else message_times(msgs),
                "value": pl.Series(values, dtype=pl.Binary),
            })
        return self._parser.parse(values, offsets, self._position, keys, stamps), raw

    def _message_error(self, m: Any) -> None:
        """An error message of this partition's: nothing for the end of the partition
        (the caller takes its offset) or a lost link (retried); else raised, one line
        naming the partition and the offset."""
        from confluent_kafka import KafkaError

        code = m.error().code()
        if code == KafkaError._PARTITION_EOF:
            return
        if code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            self._out_of_range()
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
            raise SourceError(
                f"kafka partition {self.name} no longer exists on "
                f"{self._settings.bootstrap} (at offset {self._position}): "
                "the topic was deleted or re-created"
            )
        if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
            self._link.lost(str(m.error().str()))
            return
        raise SourceError(
            f"kafka partition {self.name} at offset {self._position}: {m.error().str()}"
        )

    def tell(self) -> int:
        """The offset of the next record to read."""
        return self._handed

    def seek(self, position: int) -> None:
        from confluent_kafka import TopicPartition

        self._stop_ahead()  # what was read ahead is dropped; the thread starts again
        self._ahead = self._new_prefetcher()
        self._marks_at_open = None  # a seek asks the broker afresh
        low = self.earliest()
        if low is not None and position < low:
            raise self._expired(position, low)
        self._consumer.assign([TopicPartition(self._topic, self._num, position)])
        self._position = self._handed = position

    def earliest(self) -> int | None:
        """The log start offset, or None when the broker does not answer now."""
        marks = self._try_watermarks()
        return None if marks is None else marks[0]

    def end(self) -> int | None:
        """The last stable offset (read_committed), or None when the broker does not
        answer now."""
        marks = self._try_watermarks()
        return None if marks is None else marks[1]

    def lag(self) -> int | None:
        """Records available after the position (from the broker's end offset)."""
        end = self.end()
        return None if end is None else max(0, end - self._handed)

    def cached_lag(self) -> int | None:
        """Records after the position, from the end offset the client last saw (no
        request to the broker: cheap enough for every refresh of a progress panel)."""
        from confluent_kafka import KafkaException

        try:
            marks = self._consumer.get_watermark_offsets(self._tp, cached=True)
        except (KafkaException, RuntimeError):
            return None
        if marks is None or int(marks[1]) < 0:
            return None
        return max(0, int(marks[1]) - self._handed)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._stop_ahead():
                self._consumer.close()
            # else: the thread is stuck in the client past its bound; closing the
            # consumer under it could crash the process: the process exit frees it

    def prefetched(self) -> int:
        """Chunks fetched ahead, waiting to be handed out (0 without read-ahead)."""
        return 0 if self._ahead is None else self._ahead.queued()

    @property
    def prefetcher(self) -> Prefetcher[tuple[Chunk, pl.DataFrame | None]] | None:
        return self._ahead

    # -- helpers --------------------------------------------------------------
    def _new_prefetcher(self) -> Prefetcher[tuple[Chunk, pl.DataFrame | None]] | None:
        if self._depth <= 0:
            return None
        return Prefetcher(self._fetch_ahead, self._depth, self.name)

    def _stop_ahead(self) -> bool:
        return True if self._ahead is None else self._ahead.stop()

    def _empty(self) -> Chunk:
        return empty_chunk(self._parser.plan, self._position)

    def _watermarks(self) -> tuple[int, int]:
        out = _until(
            self._link,
            f"reading the offsets of {self.name}",
            lambda t: self._queries.get_watermark_offsets(self._tp, timeout=t),
        )
        return int(out[0]), int(out[1])

    def _try_watermarks(self) -> tuple[int, int] | None:
        from confluent_kafka import KafkaException

        if self._marks_at_open is not None:
            return self._marks_at_open

        try:
            out = self._queries.get_watermark_offsets(self._tp, timeout=_QUERY_TIMEOUT_S)
        except KafkaException as e:
            self._link.lost(_why(e))
            return None
        if out is None:
            self._link.lost("no answer to a query of the partition's offsets")
            return None
        self._link.ok()
        return int(out[0]), int(out[1])

    def _probe(self) -> None:
        """With nothing read: while disconnected, ask the broker now and then, and
        fail once it has been gone for ``fail_after_ms``."""
        if self._link.connected:
            return
        now = time.monotonic()
        if now - self._link.last_probe >= _PROBE_MS / 1000:
            self._link.last_probe = now
            self._try_watermarks()
        self._link.check(f"reading {self.name} at offset {self._position}")

    def _start_position(self, low: int, high: int, from_start: bool) -> int:
        mode = "earliest" if from_start else self._settings.start
        if mode == "earliest":
            return low
        if mode == "latest":
            return high
        from confluent_kafka import TopicPartition

        assert self._settings.start_time_ms is not None
        want = [TopicPartition(self._topic, self._num, self._settings.start_time_ms)]
        found = _until(
            self._link,
            f"finding the offset of time {self._settings.start_time_ms} in {self.name}",
            lambda t: self._queries.offsets_for_times(want, timeout=t),
        )
        off = int(found[0].offset)
        return high if off < 0 else max(off, low)

    def _out_of_range(self) -> None:
        low = self.earliest()
        if low is not None and self._position < low:
            raise self._expired(self._position, low)
        raise SourceError(
            f"kafka partition {self.name}: offset {self._position} is out of range on "
            f"{self._settings.bootstrap} (earliest {low}); the log was truncated or re-created"
        )

    def _expired(self, saved: int, low: int) -> SourceExpiredError:
        return SourceExpiredError(
            f"kafka partition {self.name}: offset {saved} to read from is no longer on "
            f"{self._settings.bootstrap} (earliest retained offset {low}; records "
            f"{saved}..{low - 1} were deleted before they were read). Ways forward: replay --from "
            f"{self.name}={low} into an isolated destination, or run with --start-over"
        )


class KafkaSource:
    """A topic's partitions. See the module docstring.

    ``plan.key`` may be ``"@key"`` (the message key) and ``plan.time``
    ``"@timestamp"`` (the message timestamp); other names are fields of the
    JSON value.
    """

    def __init__(self, settings: KafkaSettings, plan: FieldPlan) -> None:
        self.settings = settings
        self.plan = plan
        self._parser = ValueParser(plan)
        self._link = _Link(settings.bootstrap, settings.fail_after_ms)
        self._meta: Any = None
        self._known: list[int] | None = None
        self._initial: set[str] = set()
        self._parts: list[KafkaPartition] = []
        self._committer: Any = None
        #: when the group's unanswered commit went out (monotonic), and the newest
        #: positions waiting for it to be answered
        self._commit_inflight: float | None = None
        self._commit_next: list[Any] | None = None
        #: chunks each partition reads ahead (0: none, the default; see
        #: :mod:`._kafka_prefetch` and ``SEALSTREAM_KAFKA_PREFETCH``)
        self.prefetch = prefetch_depth()
        #: the one consumer of the partitions (:mod:`._kafka_shared`), made at the
        #: first open
        self._reader: Any = None

    def _shared_ok(self) -> bool:
        from ._kafka_shared import shared_wanted

        return shared_wanted()

    @property
    def connected(self) -> bool:
        """Whether the broker answers: the metadata client and every open partition."""
        self._parts = [p for p in self._parts if not p.closed]
        return self._link.connected and all(p.connected for p in self._parts)

    def _client(self) -> Any:
        if self._meta is None:
            self._meta = _consumer(self.settings.consumer_config(), self._link)
        return self._meta

    def discover(self) -> list[str]:
        """The topic's partitions now, in partition order. The first call waits
        for the broker (at most ``fail_after_ms``); a topic that disappeared or
        shrank since an earlier call is a :class:`SourceError`."""
        topic = self.settings.topic
        first = self._known is None
        if first:
            md = _until(
                self._link,
                f"reading the metadata of topic {topic!r}",
                lambda t: self._client().list_topics(topic, timeout=t),
            )
        else:
            from confluent_kafka import KafkaException

            try:
                md = self._client().list_topics(topic, timeout=_QUERY_TIMEOUT_S)
                self._link.ok()
            except KafkaException as e:
                self._link.lost(_why(e))
                self._link.check(f"reading the metadata of topic {topic!r}")
                assert self._known is not None
                return [partition_name(topic, p) for p in self._known]
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None:
            if first:
                raise SourceError(
                    f"kafka topic {topic!r} does not exist on {self.settings.bootstrap}"
                    + (f" ({tmd.error.str()})" if tmd is not None and tmd.error else "")
                )
            raise SourceError(
                f"kafka topic {topic!r} disappeared from {self.settings.bootstrap} during the run"
            )
        parts = sorted(tmd.partitions)
        if self._known is not None and not set(self._known) <= set(parts):
            gone = sorted(set(self._known) - set(parts))
            raise SourceError(
                f"kafka topic {topic!r} on {self.settings.bootstrap} lost partition(s) "
                f"{', '.join(partition_name(topic, p) for p in gone)}: it was deleted and "
                "re-created; positions no longer name the same records"
            )
        self._known = parts
        names = [partition_name(topic, p) for p in parts]
        if first:
            self._initial = set(names)
        return names

    def open(self, name: str, position: int | None, from_start: bool = False
             ) -> KafkaPartition:
        """Open ``name`` at ``position`` (None: by the start mode; at its beginning
        when ``from_start``, or when it appeared after the first :meth:`discover`)."""
        if self._known is None:
            self.discover()
        if not self.prefetch and self._shared_ok():
            from ._kafka_shared import SharedPartition, SharedReader

            if self._reader is None or self._reader.consumer is None:
                self._reader = SharedReader(self.settings, self._parser,
                                            _Link(self.settings.bootstrap,
                                                  self.settings.fail_after_ms),
                                            self._client())
            _, num = parse_partition_name(name)
            if not self._reader.has(num):
                shared = SharedPartition(self._reader, name, position,
                                         from_start=from_start or name not in self._initial)
                self._parts.append(shared)
                return shared
            # (the partition is open already, e.g. a probe: a consumer of its own)
        part = KafkaPartition(
            # a parser of its own: partitions parse on their read-ahead threads, and a
            # parser learns its JSON reader's types as it goes
            self.settings, name, ValueParser(self.plan) if self.prefetch else self._parser,
            position, from_start=from_start or name not in self._initial,
            prefetch=self.prefetch,
        )
        self._parts.append(part)
        return part

    def commit_group(self, positions: Mapping[str, int]) -> None:
        """Hand ``positions`` to the consumer group (for lag tools; best effort: a
        failure is ignored, the checkpoint holds the truth).

        Never blocks the run: the offsets go out as an asynchronous offset commit of a
        consumer of its own (``group.id`` = the group, assigned nothing, never
        subscribed: no rebalancing), whose answer is served by its callbacks; while
        one is unanswered (at most :data:`_COMMIT_PATIENCE_S`), newer positions wait
        and the newest goes out after it. Not an admin request: librdkafka aborts the
        process (``rd_kafka_enq_once_del_source_return``) when a broker restart
        outlives an ``AlterConsumerGroupOffsets`` request, and a synchronous commit
        would hang the run for as long as the broker is away."""
        if not self.settings.group or not positions:
            return
        from confluent_kafka import TopicPartition

        offs = []
        for name, pos in sorted(positions.items()):
            topic, num = parse_partition_name(name)
            offs.append(TopicPartition(topic, num, int(pos)))
        self._commit_next = offs
        self._send_commit()

    def _on_commit(self, err: Any, partitions: Any) -> None:
        self._commit_inflight = None

    def _send_commit(self) -> None:
        from confluent_kafka import KafkaException

        group = self.settings.group
        if not group:
            return
        try:
            if self._committer is None:
                self._committer = _consumer(
                    {**self.settings.consumer_config(group), "on_commit": self._on_commit},
                    _Link(self.settings.bootstrap, self.settings.fail_after_ms))
            self._committer.poll(0)  # serves the commit callbacks (nothing is assigned)
            sent = self._commit_inflight
            if sent is not None and time.monotonic() - sent < _COMMIT_PATIENCE_S:
                return
            offs, self._commit_next = self._commit_next, None
            if offs is None:
                return
            self._commit_inflight = time.monotonic()
            self._committer.commit(offsets=offs, asynchronous=True)
        except (KafkaException, RuntimeError, ValueError, TypeError):
            self._commit_inflight = None

    def _finish_commits(self) -> None:
        """At close, while the broker answers: the group gets the last positions
        (waiting at most a request timeout for the answers; not at all once the broker
        is known to be away)."""
        try:
            deadline = time.monotonic() + _QUERY_TIMEOUT_S
            while self._committer is not None and self.connected and \
                    time.monotonic() < deadline:
                if self._commit_inflight is None and self._commit_next is None:
                    return
                self._send_commit()
                with contextlib.suppress(Exception):
                    self._committer.poll(0.05)
        finally:
            self._commit_inflight = self._commit_next = None

    def close(self) -> None:
        self._finish_commits()
        committer, self._committer = self._committer, None
        if committer is not None:
            # librdkafka's close waits about 40 s for a group coordinator that is gone;
            # the group only serves lag tools, so the run waits a request timeout at most
            closer = threading.Thread(target=_close_quietly, args=(committer,),
                                      daemon=True, name="kafka-group-close")
            closer.start()
            closer.join(_QUERY_TIMEOUT_S)
        reader, self._reader = self._reader, None
        if reader is not None and not reader.views and reader.consumer is not None:
            reader.consumer.close()  # (a partition still open closes it with itself)
            reader.consumer = None
        if self._meta is not None:
            self._meta.close()
            self._meta = None


def _close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.close()


def is_message_field(name: str) -> bool:
    return name in (MESSAGE_KEY, MESSAGE_TIMESTAMP)


__all__ = ["KafkaPartition", "KafkaSettings", "KafkaSource", "partition_name"]


def end_offsets(settings: KafkaSettings, names: list[str],
                timeout_ms: int = 3_000) -> dict[str, int] | None:
    """The broker's end offsets (last stable offsets) of partitions ``names``, or None
    when the broker does not answer within ``timeout_ms`` (for ``checkpoints inspect``)."""
    from confluent_kafka import KafkaException, TopicPartition

    link = _Link(settings.bootstrap, timeout_ms)
    c = _consumer(settings.consumer_config(), link)
    out: dict[str, int] = {}
    try:
        for name in names:
            topic, num = parse_partition_name(name)
            marks = c.get_watermark_offsets(TopicPartition(topic, num), timeout=timeout_ms / 1000)
            if marks is None:
                return None
            out[name] = int(marks[1])
    except (KafkaException, SourceError):
        return None
    finally:
        c.close()
    return out

