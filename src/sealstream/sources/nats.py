"""NATS JetStream source: each subject (filter) of one stream is a partition.

``[source] kind = "nats"`` reads the JetStream stream ``stream`` on ``servers``;
each entry of ``subjects`` (a subject, or a filter with wildcards such as
``"orders.*"``) is one partition, named by that text. A partition's position is
the next *stream sequence* to read for it: after reading the message at stream
sequence ``s`` the position is ``s + 1``. Positions have gaps (other subjects'
messages sit in between); the runtime only compares them.

Reading
    Each partition reads through its own ephemeral JetStream pull consumer
    (``filter_subject`` = the partition, ``deliver_policy = by_start_sequence``
    at the position, no acknowledgements, memory storage), asked with pull requests
    answered at a private inbox (:class:`~sealstream.sources._nats_client.Pull`: one
    request outstanding, the next full batch asked for while one is parsed). One
    poll's values, subjects and reply subjects are gathered into lists once, the
    stream sequences and timestamps are cut out of the reply subjects as Polars
    columns, and the values are typed in one go by
    :class:`~sealstream.sources._live.ValueParser` (the JSONL parser).

    ``key = "@key"`` takes the message's subject as the key (useful with a
    wildcard filter: ``"orders.*"`` keys by ``orders.eu``, ``orders.us``...);
    ``time = "@timestamp"`` takes the time JetStream stored the message at (ms).

Quiet subjects
    When a poll finds nothing, the partition checks (at most every
    :data:`QUIET_CHECK_S`) that the stream holds no message of the subject between
    its position and the stream's last sequence, and then moves its position to
    just after that last sequence (an empty chunk with the new position). So a
    quiet subject of a busy stream keeps up with the stream, and the expiry check
    below does not mistake other subjects' removed messages for its own.

Expiry and gaps (semantics section 10)
    JetStream silently starts a consumer at the first sequence it still retains,
    and a consumer silently passes over messages removed before it reached them.
    sealstream therefore checks itself, with the stream's state (first sequence,
    interior deletions): at open, a saved position below the stream's first
    sequence refuses; during the run, whenever the next message delivered is not
    at the expected position, the sequences in between are checked, and if any of
    them was removed (below the first sequence, or an interior deletion) the run
    refuses with :class:`~sealstream.errors.SourceExpiredError`. JetStream does not
    say which subject a removed message had: sealstream refuses whenever it cannot
    prove that none of the partition's messages was removed (a removed message of
    another subject in that range refuses too). Nothing is ever skipped silently.

Faults
    The server unreachable at start fails within ``fail_after_ms`` with
    :class:`~sealstream.errors.SourceUnavailableError` naming the servers. Lost
    mid-run, the client reconnects by itself; meanwhile polls return "nothing yet"
    and :attr:`NatsSource.connected` is False, and the consumers are created again
    at their positions once it is back. Past ``fail_after_ms`` without the server
    the poll raises :class:`~sealstream.errors.SourceUnavailableError`.

Threads
    nats-py is asyncio-only. A :class:`NatsSource` runs one private event loop on
    one daemon thread ("sealstream-nats") holding the connection; the runtime calls
    the synchronous methods here, each of which runs a coroutine on that loop and
    waits for it with a deadline. The loop never runs user code.

Consumer groups
    JetStream has no consumer-group offsets like Kafka's; ``commit_group`` does
    nothing. Recovery never reads positions from the server anyway.

>>> settings = NatsSettings.from_table(
...     {"servers": "nats://127.0.0.1:4222", "stream": "ORDERS", "subjects": ["orders.*"]})
>>> settings.subjects, settings.start
(('orders.*',), 'earliest')
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import polars as pl

from ..errors import (
    SourceChangedError,
    SourceError,
    SourceExpiredError,
    SourceUnavailableError,
    SpecError,
)
from ._base import Chunk, FieldPlan
from ._live import ValueParser, empty_chunk
from ._nats_client import REQUEST_TIMEOUT_S, Loop, Pull, noop, reply_fields, why

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

T = TypeVar("T")

DEFAULT_FAIL_AFTER_MS = 30_000
"""How long a server may stay unreachable (at start, or mid-run) before the run fails."""
QUIET_CHECK_S = 0.5
"""At most this often, an empty poll moves a quiet partition's position up to the stream's end."""
CONSUMER_IDLE_S = 60.0
"""The server removes a partition's consumer this long after its reader went away."""
_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
START_MODES = ("earliest", "latest")


# ---------------------------------------------------------------------- settings
@dataclass(frozen=True)
class NatsSettings:
    """The ``[source]`` settings of ``kind = "nats"``.

    ``start``: ``"earliest"`` (the stream's first retained message), ``"latest"``
    (only messages published after the run starts) or a time in ms since the epoch
    (the first message JetStream stored at or after it, per subject).
    """

    servers: tuple[str, ...]
    stream: str
    subjects: tuple[str, ...]
    start: str | int = "earliest"
    fail_after_ms: int = DEFAULT_FAIL_AFTER_MS

    @property
    def address(self) -> str:
        return ",".join(self.servers)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "[source] ") -> NatsSettings:
        """Validate the source table (:class:`~sealstream.errors.SpecError` naming the
        setting). ``servers`` is a URL or a list of URLs; ``subjects`` a list of
        subjects or filters, one partition each, no duplicates."""
        servers = table.get("servers", "nats://127.0.0.1:4222")
        if isinstance(servers, str):
            servers = [s.strip() for s in servers.split(",") if s.strip()]
        if not isinstance(servers, list) or not servers or not all(
            isinstance(s, str) and s for s in servers
        ):
            raise SpecError(f"{where}servers must be a NATS URL or a list of URLs, "
                            f"e.g. \"nats://127.0.0.1:4222\"; got {table.get('servers')!r}")
        stream = table.get("stream")
        if not isinstance(stream, str) or not stream or any(c in stream for c in " .*>\t"):
            raise SpecError(f"{where}stream must name a JetStream stream (no spaces, '.', "
                            f"'*' or '>'); got {stream!r}")
        subjects = table.get("subjects")
        if isinstance(subjects, str):
            subjects = [subjects]
        if not isinstance(subjects, list) or not subjects or not all(
            isinstance(s, str) and s and " " not in s for s in subjects
        ):
            raise SpecError(f"{where}subjects must be a list of subjects (wildcards allowed), "
                            f"one partition each; got {table.get('subjects')!r}")
        if len(set(subjects)) != len(subjects):
            raise SpecError(f"{where}subjects lists a subject twice: {subjects!r}")
        start = table.get("start", "earliest")
        start_value: str | int
        if isinstance(start, bool) or not isinstance(start, (str, int)):
            raise SpecError(f"{where}start must be \"earliest\", \"latest\", an ISO-8601 time "
                            f"or ms since the epoch; got {start!r}")
        if isinstance(start, int):
            start_value = start
        elif start in START_MODES:
            start_value = start
        else:
            start_value = _iso_to_ms(start, where)
        fail_after = table.get("fail_after_ms", DEFAULT_FAIL_AFTER_MS)
        if isinstance(fail_after, bool) or not isinstance(fail_after, int) or fail_after <= 0:
            raise SpecError(f"{where}fail_after_ms must be a positive integer (ms); "
                            f"got {fail_after!r}")
        return cls(tuple(servers), stream, tuple(subjects), start_value, fail_after)


def _iso_to_ms(text: str, where: str) -> int:
    from ._parse import iso_ms

    if text.strip().lstrip("-").isdigit():
        return int(text)
    ms = iso_ms(pl.Series([text.strip()])).to_list()[0]
    if ms is None:
        raise SpecError(f"{where}start must be \"earliest\", \"latest\", an ISO-8601 time or "
                        f"ms since the epoch; got {text!r}")
    return int(ms)


@dataclass(frozen=True)
class _StreamState:
    first_seq: int
    last_seq: int
    num_deleted: int
    messages: int = 0


# ---------------------------------------------------------------------- the source
class NatsSource:
    """A JetStream stream's subjects as live partitions (see the module docstring).

    Connecting raises :class:`~sealstream.errors.SourceUnavailableError` when no
    server answers within ``fail_after_ms``, and
    :class:`~sealstream.errors.SourceError` when the stream does not exist.
    """

    def __init__(self, settings: NatsSettings, plan: FieldPlan) -> None:
        self.settings = settings
        self.plan = plan
        self._loop = Loop()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._generation = 0  # bumped on every reconnection: consumers are made again
        self._down_since: float | None = None
        self._partitions: list[NatsPartition] = []
        try:
            self._connect()
            self._state_retrying()  # the stream must exist
        except BaseException:
            self._loop.close()
            raise

    # -- connection ----------------------------------------------------------
    def _connect(self) -> None:
        import nats

        deadline = time.monotonic() + self.settings.fail_after_ms / 1000
        attempt = 0
        last: BaseException | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break

            async def connect(timeout_s: float) -> Client:
                async def reconnected() -> None:
                    self._generation += 1

                return await nats.connect(
                    servers=list(self.settings.servers),
                    connect_timeout=timeout_s,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.2,
                    error_cb=noop,
                    disconnected_cb=noop,
                    reconnected_cb=reconnected,
                    closed_cb=noop,
                )

            try:
                # nats-py retries the first connection itself too: the deadline cuts it
                t = max(0.2, min(2.0, remaining))
                self._nc = self._loop.run(connect(t), max(0.2, remaining))
                self._js = self._nc.jetstream(timeout=REQUEST_TIMEOUT_S)
                return
            except Exception as e:  # noqa: BLE001 - any failure to connect is retried
                last = e
            time.sleep(min(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)],
                           max(0.0, deadline - time.monotonic())))
            attempt += 1
        raise SourceUnavailableError(
            f"NATS source: cannot reach {self.settings.address} within "
            f"{self.settings.fail_after_ms} ms ({why(last)}); start the server or fix "
            "[source] servers"
        )

    @property
    def connected(self) -> bool:
        """Whether the connection to the server is up now (progress and metrics)."""
        return self._nc is not None and bool(self._nc.is_connected)

    def _call(self, make: Callable[[], Awaitable[T]], timeout_s: float = REQUEST_TIMEOUT_S) -> T:
        async def run() -> T:
            return await make()

        return self._loop.run(run(), timeout_s + 1.0)

    def _request(self, subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A JetStream API request; the reply as JSON (an ``error`` key on failure)."""
        nc = self._nc
        if nc is None or not nc.is_connected:
            raise ConnectionError(f"not connected to {self.settings.address}")

        async def req() -> dict[str, Any]:
            msg = await nc.request(subject, json.dumps(payload).encode(),
                                   timeout=REQUEST_TIMEOUT_S)
            data: dict[str, Any] = json.loads(msg.data or b"{}")
            return data

        return self._call(req)

    def _state(self) -> _StreamState:
        """The stream's first and last sequences (raises when the stream is missing)."""
        stream = self.settings.stream
        reply = self._request(f"$JS.API.STREAM.INFO.{stream}", {})
        if "error" in reply:
            err = reply["error"]
            if err.get("code") == 404:
                raise SourceError(f"NATS source: stream {stream!r} does not exist on "
                                  f"{self.settings.address}; create it or fix [source] stream")
            raise SourceError(f"NATS source: stream {stream!r} on {self.settings.address}: "
                              f"{err.get('description', err)}")
        st = reply.get("state", {})
        return _StreamState(int(st.get("first_seq", 0)), int(st.get("last_seq", 0)),
                            int(st.get("num_deleted", 0) or 0), int(st.get("messages", 0) or 0))

    def _state_retrying(self) -> _StreamState:
        """:meth:`_state`, retried with back-off while the server cannot be reached
        (:class:`~sealstream.errors.SourceUnavailableError` after ``fail_after_ms``)."""
        attempt = 0
        while True:
            try:
                st = self._state()
            except SourceError:
                raise
            except Exception as e:  # noqa: BLE001 - connection faults are retried, bounded
                self._trouble(e)
                time.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
                attempt += 1
                continue
            self._fine()
            return st

    def _deleted(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The stream's deleted sequences above its first one (sorted)."""
        reply = self._request(f"$JS.API.STREAM.INFO.{self.settings.stream}",
                              {"deleted_details": True})
        return np.sort(np.asarray(reply.get("state", {}).get("deleted") or [], dtype=np.int64))

    def _deleted_between(self, lo: int, hi: int) -> int | None:
        """The first interior-deleted stream sequence in ``[lo, hi)``, or None."""
        deleted = self._deleted()
        hit = deleted[(deleted >= lo) & (deleted < hi)]
        return int(hit.min()) if len(hit) else None

    def _retained_end(self, st: _StreamState) -> int:
        """The sequence after the stream's last *retained* message: deleted messages at
        the stream's tail (JetStream keeps ``last_seq`` at a deleted one) are not part
        of what a ``stop = "end"`` run must reach."""
        end = st.last_seq + 1
        if st.messages == 0:
            return max(st.first_seq, 1)
        if not st.num_deleted:
            return end
        deleted = self._deleted()
        tail = deleted[deleted <= st.last_seq][::-1]
        run = np.flatnonzero(tail != st.last_seq - np.arange(len(tail), dtype=np.int64))
        trailing = int(run[0]) if len(run) else len(tail)
        return max(end - trailing, st.first_seq)

    def _count_from(self, subject: str, seq: int) -> int:
        """How many messages of ``subject`` the stream holds at or after ``seq`` now
        (a throw-away consumer's pending count)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        js = self._js
        assert js is not None
        cfg = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, seq),
            ack_policy=AckPolicy.NONE, filter_subject=subject, mem_storage=True,
            num_replicas=1, inactive_threshold=CONSUMER_IDLE_S,
        )

        async def count() -> int:
            info = await js.add_consumer(self.settings.stream, cfg)
            with contextlib.suppress(Exception):
                await js.delete_consumer(self.settings.stream, info.name)
            return int(info.num_pending or 0)

        return self._call(count)

    def _whose(self, removed: int, finder: NatsPartition) -> list[str]:
        """The partitions a deleted ``removed`` may have belonged to, proven owners
        first: JetStream keeps no subject for a deleted message, but a partition that
        was told (by the pending count of its last delivery) of more messages after
        its position than the stream now holds lost one of its own. Without such
        proof, every partition that has not read past ``removed`` is named."""
        open_ = [p for p in self._partitions if not p._closed and p.position <= removed]
        if finder not in open_:
            open_.insert(0, finder)
        proven = []
        for p in open_:
            told = p._lag
            if told and self._count_from(p.name, p.position) < told:
                proven.append(p.name)
        return proven or [p.name for p in open_]

    def _next_of_subject(self, subject: str, seq: int) -> int | None:
        """The stream sequence of the first message of ``subject`` at or after ``seq``."""
        reply = self._request(f"$JS.API.STREAM.MSG.GET.{self.settings.stream}",
                              {"seq": seq, "next_by_subj": subject})
        if "error" in reply:
            if reply["error"].get("code") == 404:
                return None
            raise SourceError(f"NATS source: stream {self.settings.stream!r}: "
                              f"{reply['error'].get('description', reply['error'])}")
        return int(reply["message"]["seq"])

    # -- the contract ----------------------------------------------------------
    def discover(self) -> list[str]:
        """The configured subjects, in the order written (they never change)."""
        return list(self.settings.subjects)

    def open(self, name: str, position: int | None, from_start: bool = False
             ) -> NatsPartition:
        """Partition ``name`` at ``position`` (None: by ``start``; the stream's first
        retained message when ``from_start``), checked against the stream's retained
        sequences (:class:`~sealstream.errors.SourceExpiredError`)."""
        if name not in self.settings.subjects:
            raise SourceError(f"NATS source: {name!r} is not one of [source] subjects "
                              f"{list(self.settings.subjects)!r}")
        st = self._state_retrying()
        if position is None:
            position = max(1, st.first_seq) if from_start else self._start_position(name, st)
        else:
            self._check_resume(name, position, st)
        part = NatsPartition(self, name, position)
        self._partitions.append(part)
        return part

    def _start_position(self, name: str, st: _StreamState) -> int:
        start = self.settings.start
        if start == "earliest":
            return max(1, st.first_seq)
        if start == "latest":
            return st.last_seq + 1
        assert isinstance(start, int)
        return self._seq_at_time(name, start, st.last_seq + 1)

    def _seq_at_time(self, name: str, start_ms: int, fallback: int) -> int:
        """The sequence of the first message of ``name`` stored at or after ``start_ms``."""
        from datetime import UTC, datetime

        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        js = self._js
        assert js is not None
        when = datetime.fromtimestamp(start_ms / 1000, tz=UTC)
        cfg = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=when,
            ack_policy=AckPolicy.NONE, filter_subject=name, mem_storage=True,
            num_replicas=1, inactive_threshold=CONSUMER_IDLE_S,
        )

        async def probe() -> int | None:
            info = await js.add_consumer(self.settings.stream, cfg)
            try:
                sub = await js.pull_subscribe_bind(durable=info.name, stream=self.settings.stream)
                try:
                    msgs = await sub.fetch(1, timeout=1.0)
                except TimeoutError:
                    return None
                finally:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
                return int(reply_fields([msgs[0].reply])[0][0]) if msgs else None
            finally:
                with contextlib.suppress(Exception):
                    await js.delete_consumer(self.settings.stream, info.name)

        found = self._call(probe, REQUEST_TIMEOUT_S + 2.0)
        return fallback if found is None else found

    def _check_resume(self, name: str, position: int, st: _StreamState) -> None:
        if position > st.last_seq + 1:
            raise SourceChangedError(
                f"NATS partition {name!r}: the saved position {position} (next stream sequence) "
                f"is beyond the end of stream {self.settings.stream!r} (last sequence "
                f"{st.last_seq}): the stream was deleted and created again; resuming would "
                "skip or repeat records - start over, or replay into an isolated destination"
            )
        if position < st.first_seq:
            raise self._expired(name, position, st.first_seq, "at start")
        # interior deletions ahead are found when reading reaches them (_check_gaps)

    def _expired(self, name: str, saved: int, earliest: int, when: str,
                 removed: int | None = None, first: int | None = None,
                 others: list[str] | None = None) -> SourceExpiredError:
        """``earliest``: where the partition can go on (its next retained message);
        ``first``: the stream's first retained sequence, when it differs; ``others``:
        further partitions the deleted message ``removed`` may have belonged to."""
        what = (f"stream sequence {removed} was deleted" if removed is not None else
                f"the stream's first retained sequence is {first or earliest}")
        if others:
            what += (" (JetStream keeps no subject for a deleted message: it may also have "
                     f"been one of {', '.join(repr(o) for o in others)})")
        lead = ("the saved position" if when == "at start" else "the next position to read")
        return SourceExpiredError(
            f"NATS partition {name!r} (stream {self.settings.stream!r}): {lead} {saved} "
            f"(next stream sequence) is no longer retained - {what}, earliest available "
            f"{earliest}; messages removed by the stream's limits (max_msgs, max_age, "
            "max_bytes) or a purge before they were read cannot be processed. Ways forward: "
            f"replay --from {name}={earliest} into an isolated destination, or start over "
            "(--start-over); sealstream never skips them silently"
        )

    def commit_group(self, positions: dict[str, int]) -> None:
        """Nothing: JetStream has no consumer-group offsets (see the module docstring)."""
        return None

    def close(self) -> None:
        for part in list(self._partitions):
            part.close()
        nc, self._nc = self._nc, None
        if nc is not None:
            async def close_nc() -> None:
                await nc.close()

            with contextlib.suppress(Exception):
                self._loop.run(close_nc(), 5.0)
        self._loop.close()

    # -- faults ------------------------------------------------------------------
    def _trouble(self, e: BaseException | None) -> None:
        """Record a failed request; past ``fail_after_ms`` without success, fail."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        elif (now - self._down_since) * 1000 > self.settings.fail_after_ms:
            raise SourceUnavailableError(
                f"NATS source: lost {self.settings.address} for more than "
                f"{self.settings.fail_after_ms} ms ({why(e)}); what was committed stays "
                "committed - restart the run once the server is back"
            )

    def _fine(self) -> None:
        self._down_since = None


class NatsPartition:
    """One subject (filter) of the stream, read from a stream sequence."""

    def __init__(self, source: NatsSource, name: str, position: int) -> None:
        self.name = name
        self._src = source
        self._pos = position
        self._parser = ValueParser(source.plan)
        self._sub: Any = None
        self._stale = False  # the consumer must be made again at the position
        self._pull = Pull()
        self._consumer: str | None = None
        self._gen = -1
        self._last_quiet_check = 0.0
        self._lag: int | None = None  # messages of the subject after the last one read
        self._closed = False
        #: ``[archive]``: called with each delivery's raw messages (one frame: position,
        #: key, timestamp_ms, value) before they are parsed (sealstream.archive)
        self.raw_tap: Callable[[pl.DataFrame], None] | None = None

    @property
    def position(self) -> int:
        """The stream sequence of the next message to read."""
        return self._pos

    @property
    def connected(self) -> bool:
        """Whether the source's connection is up (progress and metrics)."""
        return self._src.connected

    def cached_lag(self) -> int | None:
        """Messages of the subject after the last one read, as JetStream counted them
        when it delivered that one (0 once a quiet subject caught up; None: unknown)."""
        return self._lag

    # -- consumer ----------------------------------------------------------------
    def _subscribe(self) -> None:
        """A new consumer at the position, and a new inbox its messages arrive at."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        src = self._src
        js, nc = src._js, src._nc
        assert js is not None and nc is not None
        self._drop_consumer()
        cfg = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._pos,
            ack_policy=AckPolicy.NONE, filter_subject=self.name, mem_storage=True,
            num_replicas=1, inactive_threshold=CONSUMER_IDLE_S,
        )
        stream = src.settings.stream
        pull = Pull()

        async def make() -> tuple[str, Any]:
            pull.event = asyncio.Event()
            info = await js.add_consumer(stream, cfg)
            sub = await nc.subscribe(nc.new_inbox(), cb=pull.on_msg,
                                     pending_msgs_limit=-1, pending_bytes_limit=-1)
            return str(info.name), sub

        gen = src._generation
        self._consumer, self._sub = src._call(make)
        self._pull = pull
        self._gen = gen
        self._stale = False

    def _drop_consumer(self) -> None:
        """Forget the consumer: its inbox always, the consumer on the server when it can
        be reached (else the server removes it after :data:`CONSUMER_IDLE_S`)."""
        sub, name, self._sub, self._consumer = self._sub, self._consumer, None, None
        if sub is None:
            return
        js = self._src._js
        connected = self._src.connected
        stream = self._src.settings.stream

        async def drop() -> None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if name is not None and connected and js is not None:
                with contextlib.suppress(Exception):
                    await js.delete_consumer(stream, name)

        with contextlib.suppress(Exception):
            self._src._call(drop, 2.0)

    # -- the contract ------------------------------------------------------------
    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        """Up to ``max_records`` messages from the position (see the module docstring
        for quiet subjects, gaps and faults)."""
        src = self._src
        plan = src.plan
        try:
            if not src.connected:
                raise ConnectionError("not connected")
            if self._sub is None or self._stale or self._gen != src._generation:
                self._subscribe()
            msgs = self._fetch(max(1, max_records), max(0.001, timeout_ms / 1000))
            if not msgs:
                self._quiet()
                src._fine()
                return empty_chunk(plan, self._pos)
            chunk = self._chunk(msgs)
            src._fine()
            return chunk
        except SourceError:
            raise
        except Exception as e:  # noqa: BLE001 - faults of the connection: retried, bounded
            self._stale = True
            src._trouble(e)
            time.sleep(min(0.2, timeout_ms / 1000))
            return empty_chunk(plan, self._pos)

    def _fetch(self, n: int, timeout_s: float) -> list[Msg]:
        nc, pull, sub = self._src._nc, self._pull, self._sub
        assert nc is not None and sub is not None
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self._src.settings.stream}.{self._consumer}"
        if pull.gone:
            self._stale = True
            raise ConnectionError(f"the consumer of {self.name!r} is gone: {pull.gone}")
        return self._src._loop.run(pull.take(nc, subject, sub.subject, n, timeout_s),
                                   timeout_s + REQUEST_TIMEOUT_S)

    def _chunk(self, msgs: list[Msg]) -> Chunk:
        seqs, ts_ms, pending = reply_fields([m.reply for m in msgs])
        self._lag = int(pending)
        values = [m.data for m in msgs]
        keys = ([m.subject.encode() for m in msgs] if self._parser.key_from_message else None)
        keep = seqs >= self._pos  # a redelivery below the position is never served twice
        if not keep.all():
            idx = np.flatnonzero(keep)
            seqs, ts_ms = seqs[idx], ts_ms[idx]
            values = [values[i] for i in idx.tolist()]
            keys = None if keys is None else [keys[i] for i in idx.tolist()]
            if not len(seqs):
                return empty_chunk(self._src.plan, self._pos)
        self._check_gaps(seqs)
        nxt = int(seqs[-1]) + 1
        if self.raw_tap is not None:  # [archive]: the raw messages, before parsing
            self.raw_tap(pl.DataFrame({
                "position": seqs,
                "key": pl.Series(keys, dtype=pl.Binary) if keys is not None else
                pl.repeat(self.name.encode(), len(seqs), dtype=pl.Binary, eager=True),
                "timestamp_ms": ts_ms, "value": pl.Series(values, dtype=pl.Binary)}))
        chunk = self._parser.parse(values, seqs, nxt, keys=keys, timestamps_ms=ts_ms)
        self._pos = nxt
        return chunk

    def _check_gaps(self, seqs: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        """Refuse when a sequence the consumer passed over may be a removed message of
        this subject: any gap in ``[position, last delivered]`` holding a removed
        sequence (below the stream's first one, or an interior deletion)."""
        expected = np.empty(len(seqs), np.int64)
        expected[0] = self._pos
        expected[1:] = seqs[:-1] + 1
        gaps = np.flatnonzero(seqs != expected)
        if not len(gaps):
            return
        src = self._src
        st = src._state()
        first_gap = int(expected[gaps[0]])
        if st.first_seq > first_gap:
            raise src._expired(self.name, first_gap, int(seqs[gaps[0]]), "during the run",
                               first=st.first_seq)
        if st.num_deleted:
            hit = src._deleted_between(first_gap, int(seqs[-1]))
            if hit is not None:
                at = int(np.searchsorted(seqs, hit))
                before = int(expected[at]) if at < len(seqs) else first_gap
                raise self._removed(hit, before, int(seqs[min(at, len(seqs) - 1)]))

    def _removed(self, hit: int, before: int, next_ok: int) -> SourceExpiredError:
        """The refusal for the deleted stream sequence ``hit`` found by this partition
        (its next position ``before``, its next retained message ``next_ok``), naming
        the partition proven to have lost it, or else every partition that may have."""
        src = self._src
        names = src._whose(hit, self)
        if names[0] == self.name:
            return src._expired(self.name, before, next_ok, "during the run", removed=hit,
                                others=names[1:])
        owner = next(p for p in src._partitions if p.name == names[0])
        after = src._next_of_subject(owner.name, hit + 1) or hit + 1
        return src._expired(owner.name, owner.position, after, "during the run",
                            removed=hit, others=names[1:])

    def _quiet(self) -> None:
        """Nothing was delivered: move a quiet subject up to the stream's end, once
        no message of it is in between and nothing in between was removed."""
        now = time.monotonic()
        if now - self._last_quiet_check < QUIET_CHECK_S:
            return
        self._last_quiet_check = now
        src = self._src
        before = src._state()
        if before.last_seq + 1 <= self._pos:
            return
        if src._next_of_subject(self.name, self._pos) is not None:
            return  # a message is there: the consumer delivers it soon
        after = src._state()
        if after.first_seq > self._pos:
            raise src._expired(self.name, self._pos, after.first_seq, "during the run")
        hit = (src._deleted_between(self._pos, before.last_seq + 1) if after.num_deleted
               else None)
        if hit is None:
            self._pos = before.last_seq + 1
            self._lag = 0
        elif hit > self._pos:
            # none of the subject's messages up to the deletion: go that far (the
            # pending count of the last delivery stays, the proof of whose it was)
            self._pos = hit
        else:
            # a deleted sequence at the position and no later message of the subject:
            # nothing will ever settle it (a deleted tail), so refuse now, as a
            # delivery after it would (_check_gaps)
            raise self._removed(hit, self._pos, hit + 1)
        self._stale = True  # the consumer starts again from the new position

    def tell(self) -> int:
        """The stream sequence of the next message to read."""
        return self._pos

    def seek(self, position: int) -> None:
        """Read from stream sequence ``position`` on (checked like a resume)."""
        src = self._src
        src._check_resume(self.name, position, src._state_retrying())
        self._pos = position
        self._stale = True

    def earliest(self) -> int | None:
        """The stream's first retained sequence (None when it cannot be asked now)."""
        try:
            return max(1, self._src._state().first_seq)
        except (SourceError, Exception):  # noqa: BLE001 - unknown while the server is away
            return None

    def end(self) -> int | None:
        """The sequence after the stream's last retained message (deleted messages at
        the tail do not count: a ``stop = "end"`` run is not held by them); None when
        it cannot be asked now."""
        try:
            src = self._src
            return src._retained_end(src._state())
        except (SourceError, Exception):  # noqa: BLE001 - unknown while the server is away
            return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_consumer()
        with contextlib.suppress(ValueError):
            self._src._partitions.remove(self)


__all__ = ["DEFAULT_FAIL_AFTER_MS", "NatsPartition", "NatsSettings", "NatsSource"]
