"""Message values -> typed columns, with the shared JSONL parser.

Brokers hand over a list of message values (bytes) with their positions. They
are joined into one block of lines and parsed by the same columnar code as a
JSONL file (:class:`~sealstream.sources.jsonl.JsonlReader`), then the line
numbers are mapped back to the messages' positions, so a message is bad for
exactly the reasons a line of a JSONL file is.

A value is one JSON object. What a line cannot hold is settled before the join,
on the few messages concerned: a value holding a newline is valid JSON only if
every newline is whitespace between tokens (a raw newline inside a string is
invalid JSON), so a value that ``json`` accepts has its newlines turned into
spaces and one that it refuses is a bad record; a missing (null) or blank value
is a bad record too ("message has no value").

The key and the time may come from the message instead of the value
(``@key``: the message key as UTF-8 text; ``@timestamp``: the broker's or
producer's timestamp in ms): the parser is then told that the field is derived
and the column is filled from the message's metadata.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import polars as pl

from ._base import KEY, KEY_IS_INT, OFFSET, TIME, FieldPlan, RawTexts
from ._parse import BAD_SCHEMA, I64Array, bad_frame, empty_bad, empty_events
from .jsonl import JsonlReader, _line_problem

MESSAGE_KEY = "@key"
MESSAGE_TIMESTAMP = "@timestamp"
NO_VALUE = "message has no value (null or blank)"
NO_KEY = "message has no key (the pipeline's key is @key)"
NO_TIMESTAMP = "message has no timestamp (the pipeline's time is @timestamp)"


class _BlockParser(JsonlReader):
    """The JSONL block parser without a file (only its parsing half is used)."""

    def __init__(self, plan: FieldPlan) -> None:  # noqa: D107 - no file to open
        from ._parse import Typer, cls_schema, roles

        self.name = "<messages>"
        self._plan = plan
        self._roles = roles(plan)
        self._typer = Typer(plan, 0)
        self._dtypes = None
        self._schema = cls_schema(len(self._roles))

    def close(self) -> None:
        return None


class ValueParser:
    """Parses batches of message values of one partition into a Chunk's columns.

    >>> p = ValueParser(FieldPlan(key="user", time="ts", fields={"n": "numeric"}))
    >>> ev, bad, _ = p.parse([b'{"user":"a","ts":5,"n":1}', b"oops"], np.array([7, 9]))
    >>> ev["__off"].to_list(), bad["_offset"].to_list()
    ([7], [9])
    """

    def __init__(self, plan: FieldPlan) -> None:
        self.key_from_message = plan.key == MESSAGE_KEY
        self.time_from_message = plan.time == MESSAGE_TIMESTAMP
        self.plan = plan
        inner = plan
        if self.key_from_message:
            inner = replace(inner, derived_key=True)
        if self.time_from_message:
            inner = replace(inner, derived_time=True)
        self._inner = _BlockParser(inner)
        self._empty_events = empty_events(plan)

    def empty_events(self) -> pl.DataFrame:
        return self._empty_events

    def empty_bad(self) -> pl.DataFrame:
        return empty_bad()

    def parse(
        self,
        values: Sequence[bytes | None],
        offsets: I64Array,
        keys: Sequence[bytes | None] | None = None,
        timestamps_ms: I64Array | None = None,
    ) -> tuple[pl.DataFrame, pl.DataFrame, RawTexts]:
        """``(events, bad, texts)`` of messages at ``offsets`` (ascending).

        ``keys`` are needed when the key is ``@key``; ``timestamps_ms`` (-1: none)
        when the time is ``@timestamp``. Bad records carry the offset both as
        ``_offset`` and as ``_line`` (a message has no line)."""
        n = len(values)
        if n == 0:
            return self._empty_events, empty_bad(), _no_texts
        pre_off: list[int] = []
        pre_reason: list[str] = []
        pre_raw: list[str] = []
        clean: list[bytes | None] = list(values)
        if None in clean:
            clean = [b"" if v is None else v for v in clean]
        buf = b"\n".join(clean)  # type: ignore[arg-type]
        if buf.count(b"\n") != n - 1:  # some values hold newlines: settle them alone
            for i, v in enumerate(clean):
                if v is not None and b"\n" in v:
                    problem = _line_problem(v)
                    if problem is None:
                        clean[i] = v.replace(b"\r\n", b"  ").replace(b"\n", b" ")
                    else:
                        pre_off.append(int(offsets[i]))
                        pre_reason.append(problem)
                        pre_raw.append(v.decode("utf-8", "replace"))
                        clean[i] = b""
            buf = b"\n".join(clean)  # type: ignore[arg-type]
        buf += b"\n"
        block = self._inner._parse_block(
            buf, 0, 0, True, b"", self._inner._prepare(lambda k: buf[:k])
        )
        events, bad = block.events, block.bad
        line_texts = block.texts
        offs = np.asarray(offsets, dtype=np.int64)
        if events.height:
            idx = events[OFFSET].to_numpy()
            events = events.with_columns(pl.Series(OFFSET, offs[idx], dtype=pl.Int64))
        if bad.height:
            b_off = offs[bad["_offset"].to_numpy()]
            bad = bad.with_columns(
                pl.Series("_offset", b_off, dtype=pl.Int64), pl.Series("_line", b_off, dtype=pl.Int64)
            )
        # blank (or null) values are no line to the parser: they are bad records here
        seen = np.zeros(n, dtype=bool)
        if block.events.height:
            seen[block.events[OFFSET].to_numpy()] = True
        if block.bad.height:
            seen[block.bad["_offset"].to_numpy()] = True
        missing = np.flatnonzero(~seen)
        extra: list[pl.DataFrame] = []
        if len(missing):
            pre = set(pre_off)
            m_off = [int(offs[i]) for i in missing if int(offs[i]) not in pre]
            if m_off:
                m_raw = [_text(values[int(i)]) for i in missing if int(offs[i]) not in pre]
                extra.append(bad_frame(m_off, m_off, [NO_VALUE] * len(m_off), m_raw))
        if pre_off:
            extra.append(bad_frame(pre_off, pre_off, pre_reason, pre_raw))
        if self.key_from_message or self.time_from_message:
            events, more = self._from_message(events, offs, keys, timestamps_ms, line_texts)
            if more is not None:
                extra.append(more)
        if extra:
            bad = pl.concat([bad, *extra]).cast(BAD_SCHEMA).sort("_offset")  # type: ignore[arg-type]

        def texts(at: I64Array) -> pl.Series:
            return line_texts(np.searchsorted(offs, at).astype(np.int64, copy=False))

        return events, bad, texts

    def _from_message(
        self,
        events: pl.DataFrame,
        offs: I64Array,
        keys: Sequence[bytes | None] | None,
        timestamps_ms: I64Array | None,
        line_texts: RawTexts,
    ) -> tuple[pl.DataFrame, pl.DataFrame | None]:
        """Fill ``__key`` / ``__t`` from the messages; events lacking them become bad."""
        if not events.height:
            return events, None
        rows = np.searchsorted(offs, events[OFFSET].to_numpy())
        cols: list[pl.Series] = []
        bad_mask = np.zeros(events.height, dtype=bool)
        reasons = np.full(events.height, "", dtype=object)
        if self.key_from_message:
            if keys is None:
                raise ValueError("ValueParser: @key needs the messages' keys")
            key_col = pl.Series(KEY, [keys[i] for i in rows.tolist()], dtype=pl.Binary)
            no_key = key_col.is_null().to_numpy()
            text = key_col.cast(pl.String, strict=False)  # invalid UTF-8 -> null
            bad_key = no_key | text.is_null().to_numpy()
            reasons[bad_key] = NO_KEY
            reasons[bad_key & ~no_key] = "message key is not valid UTF-8"
            bad_mask |= bad_key
            cols += [text.alias(KEY), pl.Series(KEY_IS_INT, np.zeros(len(rows), bool))]
        if self.time_from_message:
            if timestamps_ms is None:
                raise ValueError("ValueParser: @timestamp needs the messages' timestamps")
            ts = np.asarray(timestamps_ms, dtype=np.int64)[rows]
            no_ts = ts < 0
            reasons[no_ts & ~bad_mask] = NO_TIMESTAMP
            bad_mask |= no_ts
            cols.append(pl.Series(TIME, ts, dtype=pl.Int64))
        events = events.with_columns(cols)
        if not bad_mask.any():
            return events, None
        mask = pl.Series(bad_mask)
        gone = events.filter(mask)[OFFSET].to_numpy().astype(np.int64)
        raws = line_texts(np.searchsorted(offs, gone).astype(np.int64))
        bad = pl.DataFrame(
            {
                "_offset": gone,
                "_line": gone,
                "_reason": pl.Series(reasons[bad_mask].tolist(), dtype=pl.String),
                "_raw": raws,
            },
            schema=BAD_SCHEMA,
        )
        return events.filter(~mask), bad


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", "replace")


def _no_texts(at: I64Array) -> pl.Series:
    if len(at):
        raise KeyError("no record has a text in an empty batch")
    return pl.Series("__raw", [], dtype=pl.String)
