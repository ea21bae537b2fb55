"""Exactly-once output into a Kafka topic: one transaction per epoch.

Selected in the spec (for ``[sink]``, ``[late]`` and ``[errors]``)::

    [sink]
    kind = "kafka"
    bootstrap = "127.0.0.1:9092"
    topic = "page-views-per-minute"
    # path = ".sealstream-staging/results"   # local staging directory (optional)
    [sink.settings]                          # librdkafka settings, passed through
    "transaction.timeout.ms" = "60000"

Each row becomes one message: key = the result's key (a compound key's fields as
one JSON object, ``{"tenant":"acme","user":7}``; for late events and bad
records: the name of the source partition they came from), value = the row as
JSON (the line the JSON Lines sink writes), headers ``sealstream-id`` (the
row's identity as JSON: key, key-is-integer, window start and end; or source
partition and offset) and ``sealstream-token`` (the epoch's commit token,
``<epoch:012d>-<run>``).

The protocol (the two-phase contract of :mod:`sealstream.sinks._base`):

1. ``write``: rows are kept in memory, already shaped as (key, value, id).
2. ``prepare``: the epoch's rows are written to a local Arrow IPC file
   (``.part-<token>.arrow`` in the staging directory), fsynced, before the
   checkpoint refers to the token. Nothing reaches Kafka yet.
3. the checkpoint manifest is published (the commit point of the epoch).
4. ``commit``: one Kafka transaction produces every row of the staged file and
   commits; then the staged file is deleted. The transaction is opened here and
   lives only as long as it takes to produce one epoch.

**Order: manifest first, Kafka commit second.** A crash before the manifest
leaves only a staged file that no checkpoint names (recovery deletes it, the
replay produces the rows again). A crash after the manifest and before (or
during) the Kafka commit leaves the staged file that the restored checkpoint
names: recovery produces it.

**How recovery learns what Kafka holds.** Each checkpoint records, as the
output's ``path`` entry, the topic and the end offset of each partition after
the previous epoch was committed (``{"topic": ..., "offsets": {"0": 120}}``).
At start the sink (a) creates its transactional producer, whose
``init_transactions`` fences any older instance and completes or aborts the
transaction it left open, then (b) reads the topic back with
``isolation.level=read_committed`` from those offsets to its end, collecting
the ``sealstream-token`` and ``sealstream-id`` headers. A prepared token found
there is committed already and is not produced again; tokens of later epochs
(committed after a checkpoint that was then lost or rejected) are listed by
:meth:`KafkaSink.committed` so that the engine suppresses their rows during the
replay. A run without a checkpoint reads the topic from its beginning.

**Fencing.** The ``transactional.id`` is stable per job and output
(``sealstream-<pipeline>-<output>``, or ``transactional.id`` in the settings).
A second instance of the job fences the first at its start; the fenced one's
open transaction is aborted and its next commit fails, so the run stops with a
:class:`SinkError` and none of its later results become visible. A fenced instance
whose call met the broker away (a retriable error: it is not told) sees the other
instance's epochs when its retry reads the topic back, and stops the same way
instead of taking the transactional id back with a new producer. Recovery also
fences the producers of a scale-out run's workers (``<id>-w<i>``,
:mod:`sealstream.distributed._kafka_sinks`) that staged files or prepared tokens name,
so that one process resuming such a run is safe from them too.

**Transaction timeouts.** Unlike Flink's KafkaSink (which writes into a
transaction during the whole checkpoint interval and must commit it after a
restart, losing it when ``transaction.timeout.ms`` passed meanwhile), the
rows wait in the staged file, not in an open transaction: a transaction that
outlives the broker's timeout is aborted by the broker, which fences the
producer; this run stops with a clear error and the next run produces the
staged epoch again. Nothing is lost and nothing is doubled.

**Broker faults** (connection lost, timeouts, a retriable or abortable
transaction error): the producer is thrown away, a new one is created
(``init_transactions`` settles what the old one left), then the topic is read
back from the last known end to see whether the epoch made it, and the epoch is
produced again if not; for ``retry_s`` seconds at most (default 60, or
``SEALSTREAM_KAFKA_RETRY_S``), then a
one-line :class:`SinkError` naming the topic and the broker's reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from sealstream._env import seconds
from sealstream.errors import SinkError
from sealstream.sinks._base import JSON_LINE, CommittedFile, Sink, SinkRole
from sealstream.sinks._files import (
    check_epoch,
    check_role,
    check_run_token,
    ensure_dir,
    fsync_dir,
    id_schema,
    os_reason,
    write_new,
)
from sealstream.sources._kafka_log import (
    CLIENT_LOG,
    RECEIVE_MAX_BYTES,
    is_unanswered,
    note_trouble,
)

__all__ = ["ID_HEADER", "TOKEN_HEADER", "KafkaSink", "parse_location"]

ID_HEADER = "sealstream-id"
TOKEN_HEADER = "sealstream-token"
_TOKEN_RE = re.compile(r"([0-9]{12,})-([A-Za-z0-9]{1,64})")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: a token of worker ``i`` of a scale-out run (``<epoch>-<run>w<i>``)
_WORKER_TOKEN_RE = re.compile(r"[0-9]{12,}-[A-Za-z0-9]*w([0-9]+)")
_STAGED_RE = re.compile(r"\.part-([0-9]{12,}-[A-Za-z0-9]{1,64})\.arrow")
#: consumer settings taken over from the output's settings (connection and security)
_SHARED_PREFIXES = ("security.", "sasl.", "ssl.", "socket.", "broker.", "client.",
                    "metadata.", "api.version", "reconnect.", "retry.backoff")
_log = logging.getLogger("sealstream.kafka")
_log.addHandler(logging.NullHandler())  # the retry notes (stderr: note_trouble)


def _token_epoch(token: str) -> int | None:
    m = _TOKEN_RE.fullmatch(token)
    if m is None or f"{int(m.group(1)):012d}" != m.group(1):
        return None
    return int(m.group(1))


def parse_location(value: object) -> tuple[str, dict[int, int]] | None:
    """The (topic, partition -> offset) a checkpoint recorded for a Kafka output,
    or None when ``value`` is not such a record (checked, never trusted)."""
    if not isinstance(value, str) or not value.startswith("{"):
        return None
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("topic"), str):
        return None
    offsets = doc.get("offsets")
    if not isinstance(offsets, dict):
        return None
    out: dict[int, int] = {}
    for p, o in offsets.items():
        if not (isinstance(p, str) and p.isdigit() and isinstance(o, int)
                and not isinstance(o, bool) and o >= 0):
            return None
        out[int(p)] = o
    return str(doc["topic"]), out


def retry_seconds() -> float:
    """How long broker faults are retried: ``SEALSTREAM_KAFKA_RETRY_S``, default 60."""
    return seconds("SEALSTREAM_KAFKA_RETRY_S", 60.0)


class KafkaSink(Sink):
    """Rows of each epoch produced to ``topic`` in one Kafka transaction.

    ``staging`` is a local directory for the prepared epochs (it must survive a
    crash, like the checkpoint directory). ``settings`` are librdkafka settings
    for the producer (connection and security ones also serve the read-back
    consumer). See the module docstring for the protocol.

    >>> # sink = KafkaSink("127.0.0.1:9092", "out", "results", "run1", Path("stage"))
    >>> # sink.recover({}); sink.write(1, frame); sink.commit(1, sink.prepare(1))
    """

    def __init__(self, bootstrap: str, topic: str, role: SinkRole, run_token: str,
                 staging: str | os.PathLike[str], settings: Mapping[str, str] | None = None,
                 *, transactional_id: str | None = None, retry_s: float | None = None,
                 shared_staging: bool = False) -> None:
        if not _TOPIC_RE.fullmatch(topic) or topic in (".", ".."):
            raise SinkError(f"topic: {topic!r} is not a valid Kafka topic name "
                            "(letters, digits, '.', '_', '-')")
        self.role = check_role(role)
        self.run_token = check_run_token(run_token)
        self.bootstrap = bootstrap
        self.topic = topic
        self.path = Path(staging)
        #: ``staging`` is the default one every job writing ``topic`` from this folder
        #: would use: :meth:`set_job` moves it into a folder of the job's own
        self._shared_staging = shared_staging
        self._legacy: Path | None = None  # where an older version staged (read only)
        self.settings = {str(k): str(v) for k, v in (settings or {}).items()}
        self.retry_s = retry_seconds() if retry_s is None else retry_s
        self._tid = self.settings.pop("transactional.id", "") or transactional_id \
            or f"sealstream-{topic}-{role}"
        try:
            ensure_dir(self.path)
        except OSError as exc:
            raise SinkError(f"cannot create the Kafka staging directory {self.path}: "
                            f"{os_reason(exc)}") from None
        self._buffers: dict[int, list[pl.DataFrame]] = {}
        self._prepared: dict[int, str | None] = {}  # epoch -> token (None: no rows)
        self._producer: Any = None
        self._meta: Any = None  # a consumer for metadata and offsets
        #: where the read-back starts (None: the beginning), and what it found
        self._floor: dict[int, int] | None = None
        self._known: dict[str, int] | None = None  # token -> epoch, committed in Kafka
        self._ids: pl.DataFrame | None = None  # token + id columns of what was read back
        self._end: dict[int, int] | None = None  # end offsets after our last commit
        self._end_stale = True
        self._reconnected = False  # the producer's connection dropped (error events)
        #: a compound key's fields (results only): the message key is then the JSON
        #: object of the fields, ``{"tenant":"acme","user":7}``
        self.key_fields: tuple[str, ...] | None = None
        #: one of several producers of a run (the scale-out job's, one per worker:
        #: :mod:`sealstream.distributed._kafka_sinks`): the run's base token; tokens
        #: ``<epoch>-<family>`` and ``<epoch>-<family>w<i>`` are the run's own, not
        #: another instance's
        self.family: str | None = None
        #: a worker's producer: nothing to learn from the topic at its start (the
        #: coordinator recovered it); read-backs start at the ends of its first commit
        self.from_end = False
        #: recovery fences the workers' producers ``<id>-w<i>`` below this index (and
        #: below those named by staged files and prepared tokens)
        self.fence_below = 0

    # ------------------------------------------------------------ naming
    def set_job(self, pipeline: str, output: str, owner: str | None = None) -> None:
        """Name the transactional id after the job and its output (unless the
        settings name one). Call before anything is produced.

        ``owner``: where the job keeps its checkpoints. The default staging folder
        (``.sealstream-staging/kafka-<topic>``, shared by every instance started from
        that folder) then gets a sub-folder of the job's own, named by the pipeline
        and its checkpoint store, so that an instance with another store (a copy of
        the job) never removes this one's staged epochs at its start; instances of
        one store cannot run at once (the store's lock)."""
        if "transactional.id" not in self.settings and self._producer is None:
            self._tid = f"sealstream-{pipeline}-{output}"
        if self._shared_staging and self._producer is None and self._known is None:
            import hashlib

            tag = hashlib.sha256(f"{pipeline}\0{owner or ''}".encode()).hexdigest()[:12]
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", pipeline)[:64] or "job"
            self._legacy, self.path = self.path, self.path / f"{safe}-{tag}"
            self._shared_staging = False
            try:
                ensure_dir(self.path)
            except OSError as exc:
                raise SinkError(f"cannot create the Kafka staging directory {self.path}: "
                                f"{os_reason(exc)}") from None

    @property
    def transactional_id(self) -> str:
        return self._tid

    def _token(self, epoch: int) -> str:
        return f"{epoch:012d}-{self.run_token}"

    def _staged(self, token: str) -> Path:
        return self.path / f".part-{token}.arrow"

    # ------------------------------------------------------------ clients
    def _error(self, what: str, exc: BaseException, more: str = "") -> SinkError:
        shown = _reason(exc)
        return SinkError(f"cannot {what} Kafka topic {self.topic!r} at {self.bootstrap}: "
                         f"{shown.strip().splitlines()[0] if shown.strip() else type(exc).__name__}"
                         f"{more}")

    def _base_conf(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "logger": CLIENT_LOG}

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        conf: dict[str, Any] = {
            **self._base_conf(),
            "transactional.id": self._tid,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "partitioner": "murmur2_random",  # as Java clients: keys co-partitioned
            "transaction.timeout.ms": 60_000,
        }
        conf.update(self.settings)
        conf["error_cb"] = self._on_client_error
        p = Producer(conf)
        p.init_transactions(self._timeout())
        return p

    def _on_client_error(self, err: Any) -> None:
        """The producer's error events: a lost connection is remembered (the guard of
        :meth:`_produce` against a broker that forgets a transaction on restart)."""
        from confluent_kafka import KafkaError

        if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                          KafkaError._RESOLVE):
            self._reconnected = True

    def _consumer(self, isolation: str = "read_committed") -> Any:
        from confluent_kafka import Consumer

        conf: dict[str, Any] = {
            **self._base_conf(),
            "group.id": f"sealstream-readback-{uuid.uuid4().hex}",
            "receive.message.max.bytes": RECEIVE_MAX_BYTES,
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
        conf.update({k: v for k, v in self.settings.items() if k.startswith(_SHARED_PREFIXES)})
        return Consumer(conf)

    def _timeout(self) -> float:
        """Seconds one request (metadata, offsets, init_transactions) may take."""
        return max(1.0, min(10.0, self.retry_s))

    def _commit_timeout(self) -> float:
        """Seconds a transaction's commit (which flushes its rows) may take: as long as
        the broker lets the transaction live."""
        try:
            return max(1.0, int(self.settings.get("transaction.timeout.ms", "60000")) / 1000)
        except ValueError:
            return 60.0

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, again with back-off while the broker fails, for ``retry_s`` at most."""
        from confluent_kafka import KafkaError, KafkaException

        deadline = time.monotonic() + self.retry_s
        delay = 0.1
        while True:
            try:
                try:
                    return fn()
                except SystemError as sys_exc:
                    # a client call that failed inside a callback (a fence met during
                    # flush()) surfaces as "SystemError: <built-in function ...>
                    # returned a result with an exception set", caused by the
                    # KafkaException: handle that one
                    inner = _kafka_cause(sys_exc)
                    if inner is None:
                        raise
                    raise inner from None
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() in (
                        KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                        KafkaError.TOPIC_AUTHORIZATION_FAILED,
                        KafkaError.UNKNOWN_TOPIC_OR_PART):
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise SinkError(f"topic {self.topic!r} does not exist at "
                                        f"{self.bootstrap}: create it first (sealstream "
                                        "does not create output topics)") from None
                    more = ""
                    if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
                        more = (f" (transactional.id {self._tid!r} was taken over by another "
                                "instance of this job, or the broker aborted a transaction "
                                "that outlived transaction.timeout.ms; this run stops, the "
                                "next run produces its prepared epochs again)")
                    raise self._error(what, exc, more) from None
                self._drop_producer()
                text = _reason(exc)
                if time.monotonic() + delay > deadline:
                    if is_unanswered(text):
                        raise SinkError(
                            f"cannot {what} Kafka topic {self.topic!r}: the broker at "
                            f"{self.bootstrap} did not answer for {self.retry_s:g} s "
                            f"(retried for {self.retry_s:g} s; {text})") from None
                    raise self._error(what, exc, f" (retried for {self.retry_s:g} s)") from None
                note_trouble("kafka sink", self.bootstrap, text)
                _log.warning("kafka sink: cannot %s %s: %s; retrying", what, self.topic, exc)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _drop_producer(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            with contextlib.suppress(Exception):
                p.purge()

    def _ensure_producer(self) -> Any:
        if self._producer is None:
            self._producer = self._new_producer()
        return self._producer

    def _partitions(self, consumer: Any) -> list[int]:
        md = consumer.list_topics(self.topic, timeout=self._timeout())
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            from confluent_kafka import KafkaError, KafkaException

            raise KafkaException(t.error if t is not None and t.error is not None
                                 else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                 "the topic does not exist"))
        return sorted(t.partitions)

    def _ends(self) -> dict[int, int]:
        """Each partition's end offset now."""
        from confluent_kafka import TopicPartition

        def ask() -> dict[int, int]:
            if self._meta is None:
                self._meta = self._consumer()
            out = {}
            for p in self._partitions(self._meta):
                _, hi = self._meta.get_watermark_offsets(TopicPartition(self.topic, p),
                                                         timeout=self._timeout(), cached=False)
                out[p] = int(hi)
            return out

        result: dict[int, int] = self._retrying("read the offsets of", ask)
        return result

    # ------------------------------------------------------------ read-back
    def _read_back(self, start: dict[int, int] | None) -> tuple[pl.DataFrame, dict[int, int]]:
        """(token, id) of every sealstream message committed from ``start`` (partition
        -> offset; None: the beginning) to the end, and the end offsets."""
        result: tuple[pl.DataFrame, dict[int, int]] = self._retrying(
            "read back", lambda: self._read_back_once(start))
        return result

    def _read_back_once(self, start: dict[int, int] | None) -> tuple[pl.DataFrame,
                                                                       dict[int, int]]:
        """One read-back (see :meth:`_read_back`), robust to a broker that hides
        committed messages from a ``read_committed`` consumer starting after an aborted
        transaction of the same producer (one that lists, in its fetch responses,
        aborted transactions ending before the fetch offset: the client then drops the
        producer's later messages, waiting for an abort marker it never reads; the
        test broker noida-db 0.2.3 does this). Kafka lists only the aborted
        transactions overlapping the fetch, so there both scans agree.

        The tokens a ``read_uncommitted`` scan finds from ``start`` are compared with
        the committed ones; when some are missing (aborted, or hidden that way), the
        committed messages are read again from each partition's beginning, and those
        from ``start`` on are kept. After a run killed inside a transaction this costs
        one full read of the topic at the next start."""
        frame, ends = self._scan(start, "read_committed")
        if start is None or not any(start.values()):
            return frame, ends  # read from the beginning: nothing before to hide it
        seen, _ = self._scan(start, "read_uncommitted", ends)
        missing = set(seen.get_column("token").unique().to_list()) - set(
            frame.get_column("token").unique().to_list())
        if not missing:
            return frame, ends
        _log.info("kafka sink: %s: tokens %s not committed after the recorded offsets; "
                  "reading the topic from its beginning", self.topic, sorted(missing))
        full, _ = self._scan(None, "read_committed", ends, keep_from=start)
        return full, ends

    def _scan(self, start: dict[int, int] | None, isolation: str,
              ends: dict[int, int] | None = None, keep_from: dict[int, int] | None = None,
              ) -> tuple[pl.DataFrame, dict[int, int]]:
        """(token, id) of every sealstream message of the topic from ``start``
        (partition -> offset; None: the beginning) to ``ends`` (None: the end now),
        as an ``isolation`` consumer sees them (only those at or after ``keep_from``),
        and the end offsets."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        c = self._consumer(isolation)
        try:
            upto: dict[int, int] = {}
            assign = []
            for p in self._partitions(c):
                lo, hi = c.get_watermark_offsets(TopicPartition(self.topic, p),
                                                 timeout=self._timeout(), cached=False)
                upto[p] = int(hi) if ends is None else min(int(hi), ends.get(p, 0))
                begin = max(int(lo), (start or {}).get(p, 0))
                if begin < upto[p]:
                    assign.append(TopicPartition(self.topic, p, begin))
            tokens: list[str] = []
            ids: list[bytes] = []
            if assign:
                c.assign(assign)
                pending = {tp.partition for tp in assign}
                deadline = time.monotonic() + max(self.retry_s, 10.0)
                while pending:
                    if time.monotonic() > deadline:
                        raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                                        "reading the topic back timed out"))
                    for m in c.consume(10_000, 0.5):
                        err = m.error()
                        part = m.partition()
                        if err is not None:
                            if err.code() == KafkaError._PARTITION_EOF:
                                pending.discard(part)
                                continue
                            raise KafkaException(err)
                        if part not in pending or m.offset() >= upto[part]:
                            pending.discard(part)
                            continue
                        if m.offset() + 1 >= upto[part]:
                            pending.discard(part)
                        if keep_from is not None and m.offset() < keep_from.get(part, 0):
                            continue
                        tok = idv = None
                        for name, value in m.headers() or ():
                            if name == TOKEN_HEADER:
                                tok = value
                            elif name == ID_HEADER:
                                idv = value
                        if tok is not None and idv is not None:
                            tokens.append(tok.decode("utf-8", "replace"))
                            ids.append(idv)
        finally:
            c.close()
        frame = pl.DataFrame({"token": tokens, "id": pl.Series(ids, dtype=pl.Binary)})
        return frame, upto

    def _load(self, floor: dict[int, int] | None) -> None:
        """Fence older instances (settling their open transaction), then learn which
        tokens the topic holds from ``floor`` on."""
        self._retrying("start a transactional producer for", self._ensure_producer)
        frame, ends = self._read_back(floor)
        self._floor = floor
        self._ids = frame
        self._known = {}
        for token in frame.get_column("token").unique().to_list():
            epoch = _token_epoch(token)
            if epoch is not None:
                self._known[token] = epoch
        self._end = ends
        self._end_stale = False

    def _ensure_loaded(self) -> dict[str, int]:
        if self._known is None and self.from_end:
            # the producer first (it settles what an earlier holder of the id left),
            # then the ends: this run's tokens are not in the topic before them
            self._retrying("start a transactional producer for", self._ensure_producer)
            self._end = self._floor = self._ends()
            self._known, self._end_stale = {}, False
            self._ids = pl.DataFrame({"token": [], "id": []},
                                     schema={"token": pl.String, "id": pl.Binary})
        if self._known is None:
            self._load(self._floor)
        assert self._known is not None
        return self._known

    # ------------------------------------------------------------ two phases
    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        check_epoch(epoch)
        if epoch in self._prepared:
            raise ValueError(f"epoch {epoch} was prepared; it takes no more rows")
        if not frame.height:
            return
        if self.role == "results":
            key = pl.col("key").cast(pl.String)
            ident = pl.struct(key.alias("key"), pl.col("__kint").cast(pl.Boolean),
                              pl.col("window_start").cast(pl.Int64),
                              pl.col("window_end").cast(pl.Int64))
            if self.key_fields is not None:  # the key text is the fields' JSON members
                key = pl.concat_str([pl.lit("{"), key, pl.lit("}")])
        else:
            key = pl.col("_partition").cast(pl.String)
            ident = pl.struct(pl.col("_partition").cast(pl.String),
                              pl.col("_offset").cast(pl.Int64))
        shaped = frame.select(key.alias("k"), pl.col(JSON_LINE).alias("v"),
                              ident.struct.json_encode().alias("id"))
        self._buffers.setdefault(epoch, []).append(shaped)

    def prepare_deferred(self, epoch: int) -> tuple[list[str], Callable[[], None]]:
        check_epoch(epoch)
        if epoch in self._prepared:
            token = self._prepared[epoch]
            return ([token] if token else []), _nothing
        frames = self._buffers.pop(epoch, [])
        if not frames:
            self._prepared[epoch] = None
            return [], _nothing
        token = self._token(epoch)
        self._prepared[epoch] = token
        table = pl.concat(frames).to_arrow()
        path = self._staged(token)

        def durable() -> None:
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
            try:
                write_new(path, sink.getvalue().to_pybytes())
            except FileExistsError:
                pass  # made durable by an earlier call
            except OSError as exc:
                raise SinkError(f"cannot stage {self.role} for Kafka topic {self.topic!r} "
                                f"in {path}: {os_reason(exc)}") from None

        return [token], durable

    def prepare(self, epoch: int) -> list[str]:
        tokens, durable = self.prepare_deferred(epoch)
        durable()
        return tokens

    def _read_staged(self, token: str) -> pa.Table:
        path = self._staged(token)
        if not path.exists() and self._legacy is not None:
            older = self._legacy / path.name  # staged by a version without job folders
            if older.exists():
                path = older
        try:
            with pa.memory_map(str(path)) as f:
                return ipc.open_file(f).read_all()
        except FileNotFoundError:
            raise _StagedGone(path) from None
        except (OSError, pa.ArrowInvalid) as exc:
            raise SinkError(f"cannot read the staged {self.role} {path}: {exc}") from None

    def _produce(self, token: str, table: pa.Table) -> None:
        """Produce ``table`` in one transaction and commit it (retrying as the module
        docstring says); returns once the token is committed in Kafka."""
        known = self._ensure_loaded()
        keys = table.column("k").to_pylist()
        values = table.column("v").to_pylist()
        ids = table.column("id").to_pylist()
        tok = token.encode()
        topic = self.topic
        attempts = 0

        def once() -> None:
            nonlocal attempts
            attempts += 1
            if attempts > 1:
                # Another instance of the job may have taken the transactional.id over
                # while the broker could not tell us (it was away): its commits after
                # our last end say so. Then stop as fenced, before a new producer would
                # take the id back and this instance produce what the other one did.
                before, _ = self._read_back_once(self._end)
                self._stop_if_superseded(before, token, known)
                # An earlier attempt may have committed after all. First a new producer:
                # its init_transactions settles what the earlier one left (completes a
                # commit the broker was finishing, aborts an open transaction), so the
                # read-back sees the final state; read before, a commit completed after
                # it would be produced twice. Then look after our last end.
                self._ensure_producer()
                frame, _ = self._read_back_once(self._end)
                if token in frame.get_column("token").to_list():
                    return
                self._stop_if_superseded(frame, token, known)
            p = self._ensure_producer()
            self._reconnected = False
            p.begin_transaction()
            produce = p.produce
            # one produce() per row: the client's produce_batch() takes no headers, and
            # every message carries its identity; the columns were made lists once above
            tok_header = (TOKEN_HEADER, tok)
            for k, v, i in zip(keys, values, ids, strict=True):
                headers = [(ID_HEADER, i), tok_header]
                try:
                    produce(topic, v, k, headers=headers)
                except BufferError:
                    p.flush(self._commit_timeout())
                    produce(topic, v, k, headers=headers)
            # the rows reach the broker inside the open transaction here (the commit
            # would flush them anyway): the crash point below is then the instant
            # between produce and commit that the broker sees, not rows still queued
            # in this process
            p.flush(self._commit_timeout())
            _sink_point("kafka_in_transaction")
            p.commit_transaction(self._commit_timeout())
            p.poll(0)  # serves the error events of the transaction's time
            if self._reconnected:
                # the connection dropped during the transaction: a broker that restarted
                # may have forgotten it and still acknowledged the commit (noida-db
                # 0.2.3 does). Read the token back; missing, the retry produces it again
                frame, _ = self._read_back_once(self._end)
                if token not in frame.get_column("token").to_list():
                    from confluent_kafka import KafkaError, KafkaException

                    _log.warning("kafka sink: %s: epoch %s was acknowledged but is not in "
                                 "the topic after a reconnect; producing it again",
                                 self.topic, token)
                    raise KafkaException(KafkaError(
                        KafkaError._TRANSPORT, "the broker lost a committed transaction "
                        "across a reconnect"))

        self._retrying("commit a transaction to", once)
        known[token] = _token_epoch(token) or 0
        self._end_stale = True

    def _stop_if_superseded(self, frame: pl.DataFrame, token: str,
                            known: dict[str, int]) -> None:
        """Raise the fenced error when ``frame`` (read back after our last end) holds
        epochs this instance neither found at its start nor committed: another
        instance of the job (the topic is the job's own) has been committing."""
        others = sorted(t for t in set(frame.get_column("token").unique().to_list())
                        - set(known) - {token} if not self._ours(t))
        if others:
            raise SinkError(
                f"cannot commit a transaction to Kafka topic {self.topic!r} at "
                f"{self.bootstrap}: epoch {others[0]} was committed by another instance "
                f"(transactional.id {self._tid!r} was taken over by another instance of "
                "this job while the broker was unreachable; this run stops, the next run "
                "produces its prepared epochs again)")

    def _ours(self, token: str) -> bool:
        """A token of another producer of this run (see :attr:`family`)."""
        if self.family is None:
            return False
        run = token.partition("-")[2]
        return run == self.family or re.fullmatch(f"{re.escape(self.family)}w[0-9]+",
                                                  run) is not None

    def fence(self, transactional_ids: list[str]) -> None:
        """Fence every producer holding one of ``transactional_ids`` (another run's
        workers, say): ``init_transactions`` under each id aborts the transaction its
        holder left open, and its holder's later commit fails. Retried as any call."""
        from confluent_kafka import Producer

        def once(tid: str) -> None:
            conf: dict[str, Any] = {**self._base_conf(), "enable.idempotence": True,
                                    "acks": "all", "transaction.timeout.ms": 60_000}
            conf.update(self.settings)
            conf["transactional.id"] = tid
            p = Producer(conf)
            p.init_transactions(self._timeout())
            p.flush(0)

        from functools import partial

        for tid in transactional_ids:
            self._retrying(f"fence the producer {tid!r} of", partial(once, tid))

    def _fence_workers(self, prepared: dict[int, list[str]]) -> None:
        """Before the read-back: fence the producers of a scale-out run's workers
        (``<id>-w<i>``) that may hold a transaction of this job: every index below
        :attr:`fence_below` and below the largest one a staged file or a prepared token
        names (a run with more workers, or a single process resuming one). A producer
        left inside a transaction (killed, or a zombie cut off from its coordinator)
        then has it aborted and can never commit."""
        seen = [self.fence_below - 1]
        try:
            names = os.listdir(self.path)
        except OSError:
            names = []  # reported by the recovery's own listing
        staged = [m.group(1) for m in map(_STAGED_RE.fullmatch, names) if m is not None]
        for token in staged + [t for ts in prepared.values() for t in ts]:
            m = _WORKER_TOKEN_RE.fullmatch(token)
            if m is not None:
                seen.append(int(m.group(1)))
        self.fence([f"{self._tid}-w{i}" for i in range(max(seen) + 1)])

    def moved(self) -> None:
        """Other producers of this run committed to the topic: the next
        :meth:`location` reads the ends again."""
        self._end_stale = True

    def commit(self, epoch: int, tokens: list[str]) -> None:
        check_epoch(epoch)
        for token in tokens:
            if _token_epoch(token) != epoch:
                raise SinkError(f"Kafka topic {self.topic!r}: token {token!r} does not belong "
                                f"to epoch {epoch}")
            if token not in self._ensure_loaded():
                try:
                    table = self._read_staged(token)
                except _StagedGone as gone:
                    raise SinkError(f"cannot commit {self.role} {token} to Kafka topic "
                                    f"{self.topic!r}: the staged rows are gone "
                                    f"({gone.path})") from None
                self._produce(token, table)
            self._remove_staged(token)
        self._prepared.pop(epoch, None)

    def _finish_prepared(self, token: str) -> None:
        """At recovery: produce the prepared epoch ``token`` that the topic does not
        hold, except the rows whose identity it holds already (under another token:
        another instance of the job committed them after the checkpoint; identities
        are unique in a job's output). Staged rows that are gone: when other epochs
        were committed after the checkpoint (by another instance, which produced the
        same results), the run goes on with their rows standing in; otherwise the
        rows are lost and the run refuses with the way forward."""
        known = self._ensure_loaded()
        try:
            table = self._read_staged(token)
        except _StagedGone as gone:
            others = sorted(set(known) - {token})
            if others:
                _warn(f"kafka sink: the staged {self.role} of epoch {token} are gone "
                      f"({gone.path}); epochs {', '.join(others[:3])} were committed to "
                      f"{self.topic!r} after this checkpoint by another instance of the "
                      "job: its rows stand in, the run goes on")
                return
            raise SinkError(
                f"cannot commit {self.role} {token} to Kafka topic {self.topic!r}: the "
                f"staged rows are gone ({gone.path}) and the topic does not hold them; "
                "run again with --start-over (the topic is read back and what it holds "
                "is not produced again), or restore the staging folder") from None
        if self._ids is not None and self._ids.height and table.num_rows:
            held = self._ids.get_column("id")
            ids = pl.from_arrow(table.column("id"))
            assert isinstance(ids, pl.Series)
            fresh = ~ids.cast(pl.Binary).is_in(held)
            if not fresh.all():
                table = table.filter(fresh.to_arrow())
                if not table.num_rows:
                    known[token] = _token_epoch(token) or 0
                    return
        self._produce(token, table)

    def _remove_staged(self, token: str) -> None:
        path = self._staged(token)
        for folder in (self.path, self._legacy):
            if folder is None:
                continue
            path = folder / path.name
            try:
                os.unlink(path)
                fsync_dir(folder)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise SinkError(f"cannot remove the staged {path}: {os_reason(exc)}") from None

    def recover(self, prepared: dict[int, list[str]]) -> None:
        self._recover(None, prepared)

    def recover_at(self, staged_at: object, prepared: dict[int, list[str]]) -> None:
        loc = parse_location(staged_at)
        self._recover(loc[1] if loc is not None and loc[0] == self.topic else None, prepared)

    def _recover(self, floor: dict[int, int] | None, prepared: dict[int, list[str]]) -> None:
        self._buffers.clear()
        self._prepared.clear()
        self._drop_producer()
        self._fence_workers(prepared)
        self._load(floor)
        keep: set[str] = set()
        for epoch, tokens in sorted(prepared.items()):
            check_epoch(epoch)
            for token in tokens:
                if _token_epoch(token) != epoch:
                    raise SinkError(f"Kafka topic {self.topic!r}: token {token!r} does not "
                                    f"belong to epoch {epoch}")
                if token not in self._ensure_loaded():
                    self._finish_prepared(token)
                self._remove_staged(token)
            keep.update(tokens)
        try:
            names = os.listdir(self.path)
        except OSError as exc:
            raise SinkError(f"cannot list the Kafka staging directory {self.path}: "
                            f"{os_reason(exc)}") from None
        for name in names:
            m = _STAGED_RE.fullmatch(name)
            if m is not None and m.group(1) not in keep:
                self._remove_staged(m.group(1))

    def location(self) -> str | None:
        if self._end is None or self._end_stale:
            self._end = self._ends()
            self._end_stale = False
        return json.dumps({"topic": self.topic,
                           "offsets": {str(p): o for p, o in sorted(self._end.items())}},
                          sort_keys=True)

    def committed(self) -> list[CommittedFile]:
        known = self._ensure_loaded()
        return [CommittedFile(e, t) for t, e in sorted(known.items(), key=lambda x: (x[1], x[0]))]

    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        schema = id_schema(self.role)
        wanted = {f.token for f in files}
        if not wanted:
            return pl.DataFrame(schema=schema)
        frame = self._ids
        if frame is None or not wanted <= set(frame.get_column("token").unique().to_list()):
            frame, _ = self._read_back(self._floor)
            self._ids = frame
        got = frame.filter(pl.col("token").is_in(list(wanted)))
        if not got.height:
            return pl.DataFrame(schema=schema)
        decoded = got.get_column("id").cast(pl.String).str.json_decode(
            pl.Struct(schema))
        return decoded.struct.unnest().select(
            [pl.col(c).cast(t) for c, t in schema.items()])

    def close(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            with contextlib.suppress(Exception):
                p.flush(0)
        m, self._meta = self._meta, None
        if m is not None:
            with contextlib.suppress(Exception):
                m.close()


def _nothing() -> None:
    return None


def _reason(exc: BaseException) -> str:
    """The client's own text of a KafkaException (else the exception's text)."""
    reason = exc.args[0] if exc.args else exc
    text = getattr(reason, "str", None)
    return str(text() if callable(text) else reason)


def _kafka_cause(exc: BaseException) -> BaseException | None:
    """The KafkaException a SystemError of the client was raised from, if any."""
    from confluent_kafka import KafkaException

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, KafkaException):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


class _StagedGone(SinkError):
    """The staged rows of a prepared epoch are not in the staging folder."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"the staged rows are gone ({path})")
        self.path = path


def _warn(line: str) -> None:
    """One line on stderr, in our words (the run goes on)."""
    import sys

    print(f"sealstream: warning: {line}", file=sys.stderr, flush=True)


_points: Any = None


def _sink_point(name: str) -> None:
    """The sink's own crash/pause point (``kafka_in_transaction``: the epoch's rows are
    produced and flushed to the broker, the transaction is not committed yet), driven
    by the same environment variables as :mod:`sealstream._runtime.crash`."""
    global _points
    if _points is None:
        if not (os.environ.get("SEALSTREAM_CRASH_AT") or os.environ.get("SEALSTREAM_PAUSE_AT")):
            _points = False
            return
        from sealstream._runtime.crash import CrashPoints

        _points = CrashPoints()
    if _points:
        _points(name)
