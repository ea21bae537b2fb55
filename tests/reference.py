"""A small, per-event, pure-Python reference model of sealstream's semantics.

This is the correctness oracle for sections 1-5 of ``docs/semantics.md``
(JSONL sources only). It favours clarity over speed: one loop over the events in
the engine's documented read order, recomputing the watermark before every event.

Decisions modelled (taken by the engine, see the test brief):

* Read order: events are processed in order of ``(offset, partition index)``;
  the offset is the 0-based line index in its file (blank lines count as lines
  but are not records). A partition with fewer lines simply drops out.
* Watermark before event ``e``: every partition ``q`` has
  ``W_q = max(event time of q's events already processed) - max_delay_ms``
  (``-inf`` when none yet), or ``+inf`` once ``q``'s last record has been
  processed (a partition without records is exhausted from the start).
  ``W = min_q W_q``, never decreasing. ``e`` itself is not included.
* Tumbling/sliding: an (event, window) pair is late iff
  ``window_end + lateness <= W``; an event all of whose windows are late goes
  to the late output. Every window that received a contribution fires once.
* Sessions (per key): before each event, every open session (any key) with
  ``end + lateness <= W`` is closed forever. The event's ``[t, t + gap)`` merges
  with the key's open sessions it overlaps or touches; if it touches none and
  ``t + gap + lateness <= W`` the event is late; otherwise the merged session
  stays open. ``window_start`` = first event time, ``window_end`` = last event
  time + gap. At the end of input every open session fires.
* Aggregates ignore nulls and missing fields; ``count`` counts records; a sum of
  integers is an integer, a sum that meets a float is a float; ``mean`` is a
  float; ``min``/``max`` keep the winner's type; ``first``/``last`` are by event
  time, ties by arrival order; an aggregate over nothing but nulls is null.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

INF = math.inf

_AGG_RE = re.compile(r"^\s*(count|sum|min|max|mean|first|last)\s*(?:\(\s*([^()\s]*)\s*\))?\s*$")


@dataclass(frozen=True)
class WindowDef:
    """``kind`` is ``tumbling`` (size), ``sliding`` (size, slide) or ``session`` (gap)."""

    kind: str
    size_ms: int | None = None
    slide_ms: int | None = None
    gap_ms: int | None = None
    allowed_lateness_ms: int = 0


class OneOf(tuple[Any, ...]):
    """Several acceptable answers (``min``/``max`` tie between ``2`` and ``2.0``)."""

    __slots__ = ()


@dataclass
class Event:
    seq: int  # position in the global read order (arrival order)
    partition: str  # the partition's name (its path as written in the spec)
    offset: int  # 0-based line index in its file
    t: int  # event time, ms
    key: Any  # the key's JSON value (int or str)
    record: dict[str, Any]  # the parsed JSON object


@dataclass
class ReferenceOutput:
    results: list[dict[str, Any]] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)


def key_id(key: Any) -> tuple[str, Any]:
    """Keys keep their JSON type: 1 and "1" are different keys."""
    return (type(key).__name__, key)


def parse_time(value: Any) -> int:
    """An integer (ms since the epoch) or an ISO-8601 string (UTC when no offset)."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        dt = datetime.fromisoformat(value)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    raise ValueError(f"bad event time {value!r}")


def parse_aggregate(expr: str) -> tuple[str, str | None]:
    m = _AGG_RE.match(expr)
    if not m:
        raise ValueError(f"unknown aggregate {expr!r}")
    return m.group(1), m.group(2) or None


def read_events(
    partitions: Sequence[tuple[str, str]], key: str, time: str
) -> tuple[list[Event], list[int]]:
    """All events in global read order, and each partition's number of records."""
    per_partition: list[list[tuple[int, dict[str, Any]]]] = []
    for _name, text in partitions:
        records = []
        for offset, line in enumerate(text.split("\n")):
            if line.strip() == "":
                continue  # blank lines are not records (but count as lines)
            obj = json.loads(line)
            if not isinstance(obj, dict) or obj.get(key) is None or obj.get(time) is None:
                raise ValueError(f"bad record (not modelled): {line!r}")
            records.append((offset, obj))
        per_partition.append(records)

    order = []
    for p, records in enumerate(per_partition):
        for offset, obj in records:
            order.append((offset, p, obj))
    order.sort(key=lambda x: (x[0], x[1]))

    events = []
    for seq, (offset, p, obj) in enumerate(order):
        k = obj[key]
        if type(k) not in (int, str):
            raise ValueError(f"key {k!r}: only integer and string keys are modelled")
        events.append(Event(seq, partitions[p][0], offset, parse_time(obj[time]), k, obj))
    return events, [len(r) for r in per_partition]


def windows_of(t: int, w: WindowDef) -> list[tuple[int, int]]:
    """The ``[start, end)`` windows an event at ``t`` belongs to (tumbling/sliding)."""
    if w.kind == "tumbling":
        assert w.size_ms is not None
        start = (t // w.size_ms) * w.size_ms
        return [(start, start + w.size_ms)]
    assert w.kind == "sliding" and w.size_ms is not None and w.slide_ms is not None
    out = []
    k = (t - w.size_ms) // w.slide_ms - 1
    while k * w.slide_ms <= t:
        start = k * w.slide_ms
        if start <= t < start + w.size_ms:
            out.append((start, start + w.size_ms))
        k += 1
    return out


def aggregate(func: str, fld: str | None, events: list[Event]) -> Any:
    if func == "count":
        return len(events)
    assert fld is not None
    # non-null values with (event time, arrival order), nulls and missing fields ignored
    vals = [(e.t, e.seq, e.record[fld]) for e in events if e.record.get(fld) is not None]
    if not vals:
        return None
    values = [v for _, _, v in vals]
    if func in ("sum", "min", "max", "mean"):
        for v in values:
            if type(v) not in (int, float):
                raise ValueError(f"non-numeric value {v!r} (a bad record, not modelled)")
    if func == "sum":
        if all(type(v) is int for v in values):
            return sum(values)
        return math.fsum(values)
    if func == "mean":
        if all(type(v) is int for v in values):
            return sum(values) / len(values)
        return math.fsum(values) / len(values)
    if func in ("min", "max"):
        best = min(values) if func == "min" else max(values)
        winners = []
        for v in values:
            if v == best and not any(type(w) is type(v) for w in winners):
                winners.append(v)
        return winners[0] if len(winners) == 1 else OneOf(winners)
    if func == "first":
        return min(vals, key=lambda x: (x[0], x[1]))[2]
    if func == "last":
        return max(vals, key=lambda x: (x[0], x[1]))[2]
    raise ValueError(func)


def result_record(
    key: Any, start: int, end: int, events: list[Event], aggregates: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "window_start": start, "window_end": end}
    for name, expr in aggregates.items():
        func, fld = parse_aggregate(expr)
        out[name] = aggregate(func, fld, events)
    return out


def late_record(e: Event) -> dict[str, Any]:
    return {**e.record, "_partition": e.partition, "_offset": e.offset}


@dataclass(eq=False)
class _Session:
    start: int  # first (smallest) event time
    end: int  # last (largest) event time + gap
    events: list[Event]


def run(
    partitions: Sequence[tuple[str, str]],
    *,
    key: str,
    time: str,
    max_delay_ms: int,
    window: WindowDef,
    aggregates: dict[str, str],
) -> ReferenceOutput:
    """Run the model. ``partitions`` are ``(name as written in the spec, file text)``."""
    events, n_records = read_events(partitions, key, time)
    lateness = window.allowed_lateness_ms
    out = ReferenceOutput()

    n_parts = len(partitions)
    max_t: list[int | None] = [None] * n_parts
    remaining = list(n_records)
    part_index = {name: i for i, (name, _) in enumerate(partitions)}
    wm = -INF

    # tumbling / sliding: (key id, start, end) -> [key, contributing events]
    contents: dict[tuple[Any, int, int], tuple[Any, list[Event]]] = {}
    # sessions: key id -> open sessions; closed (fired) sessions
    open_sessions: dict[Any, list[_Session]] = {}
    fired: list[tuple[Any, _Session]] = []

    for e in events:
        # the watermark before e (e's own time not included)
        per_part = []
        for q in range(n_parts):
            if remaining[q] == 0:
                per_part.append(INF)
            elif max_t[q] is None:
                per_part.append(-INF)
            else:
                per_part.append(max_t[q] - max_delay_ms)
        wm = max(wm, min(per_part))

        kid = key_id(e.key)
        if window.kind in ("tumbling", "sliding"):
            accepted = False
            for start, end in windows_of(e.t, window):
                if end + lateness <= wm:
                    continue  # a late pair contributes nothing
                accepted = True
                contents.setdefault((kid, start, end), (e.key, []))[1].append(e)
            if not accepted:
                out.late.append(late_record(e))
        elif window.kind == "session":
            gap = window.gap_ms
            assert gap is not None
            # fire every open session (of any key) that the watermark has passed
            for k, sessions in open_sessions.items():
                still_open = []
                for s in sessions:
                    if s.end + lateness <= wm:
                        fired.append((k, s))
                    else:
                        still_open.append(s)
                open_sessions[k] = still_open
            sessions = open_sessions.setdefault(kid, [])
            lo, hi = e.t, e.t + gap
            touching = [s for s in sessions if s.start <= hi and lo <= s.end]
            if not touching and hi + lateness <= wm:
                out.late.append(late_record(e))
            else:
                merged = _Session(
                    start=min([e.t] + [s.start for s in touching]),
                    end=max([hi] + [s.end for s in touching]),
                    events=[x for s in touching for x in s.events] + [e],
                )
                # (_Session has eq=False: "not in" compares by identity)
                open_sessions[kid] = [s for s in sessions if s not in touching] + [merged]
        else:
            raise ValueError(f"unknown window kind {window.kind!r}")

        p = part_index[e.partition]
        max_t[p] = e.t if max_t[p] is None else max(max_t[p], e.t)
        remaining[p] -= 1

    # end of input: W = +inf, everything fires
    if window.kind == "session":
        for k, sessions in open_sessions.items():
            fired.extend((k, s) for s in sessions)
        for _kid, s in fired:
            out.results.append(
                result_record(s.events[0].key, s.start, s.end, s.events, aggregates)
            )
    else:
        for (_kid, start, end), (k, evs) in contents.items():
            out.results.append(result_record(k, start, end, evs, aggregates))
    return out
