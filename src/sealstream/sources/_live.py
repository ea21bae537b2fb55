"""The live source contract: partitions that grow, positions, "nothing yet" vs "ended".

Every source (files, Kafka-protocol topics, NATS JetStream subjects) is a
:class:`LiveSource`: a set of named partitions, each an ordered, replayable
sequence of records read through a :class:`LivePartition`.

Positions
    A position is an integer: the position of the next record to read (a Kafka
    offset, a NATS stream sequence of the subject, a file's line offset). Positions
    increase along a partition but may have gaps (transaction markers, blank lines,
    other subjects' sequences). A record's identity is ``(partition name, position)``.

Partition names
    Stable strings: ``"orders/0"`` (Kafka topic/partition), the subject (NATS),
    the path as written or matched (files). :meth:`LiveSource.discover` lists them
    in a stable order; a name, once seen, keeps meaning the same partition.

Polling
    :meth:`LivePartition.poll` returns

    * a :class:`~sealstream.sources._base.Chunk` with records from the current
      position (``chunk.position.offset`` is the position after them;
      ``chunk.last_offset`` the position of the last record, or None),
    * an EMPTY chunk (no events, no bad records, ``eof`` False): nothing yet,
    * ``None``: the partition has ended (a bounded source at its end, or past a
      stop position); it never delivers again.

    A chunk's events are already typed (``sources/_base`` columns) and its bad
    records carry their position in ``_offset`` (and in ``_line`` for sources
    without lines) and a one-sentence reason. Brokers build chunks with
    :class:`ValueParser`: one poll's message values become one column, parsed in
    one go, never a Python loop per message beyond what the client forces.

The runtime's step plan (see ``sealstream._runtime.plans``) records, per
partition, the range ``[from, to)`` a step read. On recovery the runtime seeks to
``from`` and polls until the position reaches ``to``; records at or after ``to``
in the last chunk are left for the next step. A partition must therefore
deliver the same records for the same range every time it is read (replayable),
or report that it cannot (:class:`~sealstream.errors.SourceExpiredError`).

Errors
    :class:`~sealstream.errors.SourceExpiredError` (a position to read is below
    the earliest retained one, at open or mid-run: never skip silently) and
    :class:`~sealstream.errors.SourceUnavailableError` (the broker cannot be
    reached within the bounded retry) both exit 1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt
import polars as pl

from ._base import (
    BAD_SCHEMA,
    KEY,
    KEY_IS_INT,
    OFFSET,
    RAW,
    TIME,
    Chunk,
    FieldPlan,
    PartitionPosition,
    RawSpan,
    RawTexts,
)

MESSAGE_KEY = "@key"
"""``key = "@key"``: the message key (its bytes as UTF-8 text) instead of a field."""
MESSAGE_TIMESTAMP = "@timestamp"
"""``time = "@timestamp"``: the broker's timestamp (ms since the epoch)."""

I64Array = npt.NDArray[np.int64]


@runtime_checkable
class LivePartition(Protocol):
    """One partition, read from a position. Not thread-safe: one reader each."""

    name: str

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        """At most ``max_records`` records from the current position, waiting at most
        ``timeout_ms`` for the first. An empty chunk means "nothing yet"; None means
        the partition ended. Raises :class:`~sealstream.errors.SourceExpiredError`
        when records between the current position and the next one delivered were
        deleted before they were read."""
        ...

    def seek(self, position: int) -> None:
        """Read from ``position`` on (the next poll starts there)."""
        ...

    def tell(self) -> int:
        """The position of the next record to read (where a poll starts now)."""
        ...

    def earliest(self) -> int | None:
        """The earliest position still retained (for the expiry check); None: unknown."""
        ...

    def end(self) -> int | None:
        """The position after the last record available now (``stop = "end"``, lag);
        None: unknown."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class LiveSource(Protocol):
    """A set of partitions discovered at open and while running."""

    def discover(self) -> list[str]:
        """The current partitions' names, in a stable order; new names mean growth.
        A name that disappears stops the run (the source raises
        :class:`~sealstream.errors.SourceError` naming it)."""
        ...

    def open(self, name: str, position: int | None, from_start: bool = False
             ) -> LivePartition:
        """Open partition ``name`` at ``position``. Without a position: at its
        beginning (the earliest position retained) when ``from_start``, else per the
        start mode. The runtime asks ``from_start`` for every partition but those of a
        job's very first run: one the job did not know when it last checkpointed was
        created after the job began (partition growth), and starting it "latest"
        would skip its records. Raises :class:`~sealstream.errors.SourceExpiredError`
        when ``position`` is below :meth:`LivePartition.earliest`."""
        ...

    def commit_group(self, positions: dict[str, int]) -> None:
        """Best effort, after each checkpoint: tell the broker's consumer group the
        positions (for its lag tools only; recovery never reads them back)."""
        ...

    def close(self) -> None: ...


#: the empty frames of each plan (by identity; the plan is kept so its id is not
#: reused): a live source hands out a "nothing yet" chunk at every poll that finds no
#: record, and building the two frames took ~0.27 ms each time (Polars frames are not
#: changed in place here, so one pair serves every such chunk)
_EMPTY: dict[int, tuple[FieldPlan, pl.DataFrame, pl.DataFrame]] = {}


def empty_chunk(plan: FieldPlan, position: int) -> Chunk:
    """A "nothing yet" chunk at ``position``."""
    known = _EMPTY.get(id(plan))
    if known is None or known[0] is not plan:
        known = (plan, pl.DataFrame(schema=plan.event_schema()),
                 pl.DataFrame(schema=BAD_SCHEMA))
        if len(_EMPTY) > 64:  # plans of long-gone sources, in a long-lived process
            _EMPTY.clear()
        _EMPTY[id(plan)] = known
    return Chunk(
        events=known[1],
        bad=known[2],
        last_offset=None,
        position=PartitionPosition(offset=position),
        eof=False,
    )


def is_nothing_yet(chunk: Chunk) -> bool:
    """True for a chunk that holds no record (good or bad)."""
    return chunk.last_offset is None and not chunk.events.height and not chunk.bad.height


class ValueParser:
    """Message values -> a typed :class:`Chunk`, in one go per poll.

    The values of one poll (bytes, each one JSON record as in a JSONL line) are
    joined and parsed by the same columnar JSON parser the JSONL files use, so a
    message is typed exactly as the same text in a file would be. An empty value is
    a bad record ("empty message"); a raw newline between tokens is whitespace
    (read as a space), one inside a JSON string a bad record (JSON forbids raw
    control characters there). With ``time = "@timestamp"`` a message without a
    broker timestamp (-1) is a bad record.

    ``key = "@key"`` / ``time = "@timestamp"`` in the plan take the message key /
    the broker timestamp passed to :meth:`parse` instead of a field; a message
    without a key is then a bad record.

    >>> plan = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})
    >>> p = ValueParser(plan)
    >>> values = [b'{"user":"a","ts":5,"amount":1}', b'oops']
    >>> c = p.parse(values, np.array([7, 9]), next_position=10)
    >>> c.events[OFFSET].to_list(), c.bad["_offset"].to_list(), c.position.offset
    ([7], [9], 10)
    """

    def __init__(self, plan: FieldPlan) -> None:
        from .files.jsonl import JsonlReader

        self.plan = plan
        self.key_from_message = plan.key == MESSAGE_KEY
        self.time_from_message = plan.time == MESSAGE_TIMESTAMP
        inner = FieldPlan(
            key=plan.key,
            time=plan.time,
            fields=dict(plan.fields),
            decimals=dict(plan.decimals),
            derived_key=plan.derived_key or self.key_from_message,
            derived_time=plan.derived_time or self.time_from_message,
        )
        self._reader = JsonlReader.for_values(inner)

    def parse(
        self,
        values: Sequence[bytes | None],
        positions: I64Array,
        next_position: int,
        keys: Sequence[bytes | None] | None = None,
        timestamps_ms: I64Array | None = None,
    ) -> Chunk:
        """A chunk of the records ``values`` at ``positions`` (ascending);
        ``next_position`` is where reading resumes after them. ``keys`` /
        ``timestamps_ms`` (one per value) are needed for ``@key`` / ``@timestamp``."""
        n = len(values)
        positions = np.asarray(positions, dtype=np.int64)
        if n == 0:
            return empty_chunk(self.plan, next_position)
        if len(positions) != n:
            raise ValueError(f"{n} values but {len(positions)} positions")
        # an empty value is a bad record: "null" keeps its line (all() is a C loop)
        vals: list[bytes] = (cast("list[bytes]", list(values)) if all(values)
                             else [v if v else b"null" for v in values])
        buf = b"\n".join(vals) + b"\n"
        broken: dict[int, str] = {}  # value index -> reason (raw newline in a string)
        if buf.count(b"\n") != n or b"\r" in buf:
            broken = _raw_newlines(vals)
            vals = [b"null" if i in broken else v.replace(b"\r", b" ").replace(b"\n", b" ")
                    for i, v in enumerate(vals)]
            vals = [v if v.strip() else b"null" for v in vals]
            buf = b"\n".join(vals) + b"\n"
        else:
            buf = _fill_blank(buf, vals)
        events, bad, texts = self._reader.parse_values_block(buf)
        if broken:
            at = pl.Series(list(broken), dtype=pl.Int64)
            is_broken = pl.col("_offset").is_in(at)
            reasons = pl.DataFrame({"_offset": at, "_why": list(broken.values()),
                                    "_text": [values[i].decode("utf-8", "replace")  # type: ignore[union-attr]
                                              for i in broken]})
            bad = bad.join(reasons, on="_offset", how="left").with_columns(
                pl.when(is_broken).then(pl.col("_why")).otherwise(pl.col("_reason"))
                .alias("_reason"),
                pl.when(is_broken).then(pl.col("_text")).otherwise(pl.col("_raw"))
                .alias("_raw"),
            ).drop("_why", "_text")
        if bad.height and not all(v and v.strip() for v in values):
            blank = np.flatnonzero([not (v and v.strip()) for v in values])
            is_blank = pl.col("_offset").is_in(pl.Series(blank, dtype=pl.Int64))
            bad = bad.with_columns(
                pl.when(is_blank).then(pl.lit("empty message")).otherwise(pl.col("_reason"))
                .alias("_reason"),
                pl.when(is_blank).then(pl.lit("")).otherwise(pl.col("_raw")).alias("_raw"),
            )
        # line index -> position
        events = events.with_columns(
            pl.Series(OFFSET, positions[events[OFFSET].to_numpy()], dtype=pl.Int64)
        )
        if bad.height:
            at = pl.Series("_offset", positions[bad["_offset"].to_numpy()], dtype=pl.Int64)
            bad = bad.with_columns(at, at.alias("_line"), pl.col("_raw").fill_null(""))
        if self.key_from_message or self.time_from_message:
            events, bad = self._from_message(events, bad, positions, keys, timestamps_ms, texts)

        def raw_texts(offs: I64Array) -> pl.Series:
            idx = np.searchsorted(positions, np.asarray(offs, dtype=np.int64))
            return texts(idx.astype(np.int64, copy=False)).rename(RAW)

        raw = (
            RawSpan(int(events[OFFSET][0]), int(events[OFFSET][-1]), raw_texts)
            if events.height
            else None
        )
        return Chunk(
            events=events,
            bad=bad,
            last_offset=int(positions[-1]),
            position=PartitionPosition(offset=next_position),
            eof=False,
            raw=raw,
        )

    def _from_message(
        self,
        events: pl.DataFrame,
        bad: pl.DataFrame,
        positions: I64Array,
        keys: Sequence[bytes | None] | None,
        timestamps_ms: I64Array | None,
        texts: RawTexts,
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        idx = pl.Series(np.searchsorted(positions, events[OFFSET].to_numpy()), dtype=pl.Int64)
        cols: list[pl.Series] = []
        missing = pl.Series([False] * events.height, dtype=pl.Boolean)
        if self.key_from_message:
            if keys is None:
                raise ValueError("key = '@key' needs the message keys")
            ks = pl.Series(
                [k.decode("utf-8", "replace") if k is not None else None for k in keys],
                dtype=pl.String,
            ).gather(idx)
            cols += [ks.alias(KEY), pl.Series(KEY_IS_INT, [False] * events.height)]
            missing = missing | ks.is_null()
        no_time = pl.Series([False] * events.height, dtype=pl.Boolean)
        if self.time_from_message:
            if timestamps_ms is None:
                raise ValueError("time = '@timestamp' needs the message timestamps")
            ts = pl.Series(TIME, np.asarray(timestamps_ms, dtype=np.int64)).gather(idx)
            cols.append(ts)
            no_time = ts < 0  # the broker's "no timestamp" (-1): never a time
        events = events.with_columns(cols)
        missing = missing | no_time
        if missing.any():
            lost = events.filter(missing)
            lost_no_time = no_time.filter(missing)
            events = events.filter(~missing)
            no_key = "the message has no key (key = \"@key\")"
            no_ts = "the message has no timestamp from the broker (time = \"@timestamp\")"
            extra = pl.DataFrame(
                {
                    "_offset": lost[OFFSET],
                    "_line": lost[OFFSET],
                    "_reason": [no_ts if t else no_key for t in lost_no_time],
                    "_raw": texts(
                        np.searchsorted(positions, lost[OFFSET].to_numpy()).astype(np.int64)
                    ),
                },
                schema=BAD_SCHEMA,
            )
            bad = pl.concat([bad, extra]).sort("_offset")
        return events, bad


def _raw_newlines(vals: list[bytes]) -> dict[int, str]:
    """The values (by index) whose raw CR/LF sits inside a JSON string - invalid JSON
    (control characters must be escaped there), never mended into a space. Only the
    rare values holding a raw CR/LF are looked at; one between tokens is whitespace."""
    out: dict[int, str] = {}
    for i, v in enumerate(vals):
        if b"\n" not in v and b"\r" not in v:
            continue
        try:
            json.loads(v)  # strict: a raw control character in a string is an error
        except ValueError as exc:
            if "control character" in str(exc):
                out[i] = ("invalid JSON: a raw control character (newline) inside a string "
                          f"({exc.__class__.__name__}: {exc})")
    return out


def _fill_blank(buf: bytes, vals: list[bytes]) -> bytes:
    """Whitespace-only values would be blank lines (not records): make them null.

    ``buf`` is ``vals`` joined, one newline after each, and holds no other newline
    and no empty value (the caller's checks): a blank line can only be a value of
    spaces or tabs, which ends in one before its newline. (No search for an empty
    line: each newline would be a candidate, a slow scan of every poll's buffer.)"""
    if b" \n" not in buf and b"\t\n" not in buf:
        return buf
    vals = [v if v.strip() else b"null" for v in vals]
    return b"\n".join(vals) + b"\n"


__all__ = [
    "MESSAGE_KEY",
    "MESSAGE_TIMESTAMP",
    "LivePartition",
    "LiveSource",
    "ValueParser",
    "empty_chunk",
    "is_nothing_yet",
]
