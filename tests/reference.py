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
* Transforms (docs/transforms.md): derived fields are Python functions of the
  record (the test maps each SQL expression it uses to one), computed in order;
  the key and the time may be derived. The filter runs after the watermark:
  an event it drops still advances its partition's watermark, and is neither
  aggregated nor late. Late output shows the original record.
* Newer aggregates: ``count_distinct`` (numbers by value, a string never equals
  a number), ``approx_count_distinct`` (the exact count, compared within the
  sketch's error), ``median``/``quantile(f, q)`` (linear interpolation between
  the sorted values, a float), ``stddev``/``variance`` (sample, None below two
  values), ``count_if(c)`` (records whose condition is true).
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

_AGG_RE = re.compile(r"^\s*([a-z_]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)
_FUNCS = {"count", "sum", "min", "max", "mean", "first", "last", "count_distinct",
          "approx_count_distinct", "median", "quantile", "stddev", "variance", "count_if"}
APPROX_REL = 0.05
"""approx_count_distinct must be within 5 % (or 1) of the exact count."""

Record = dict[str, Any]
Fn = Any  # Callable[[Record], Any]


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


@dataclass(frozen=True)
class Approx:
    """An integer answer within ``APPROX_REL`` (or 1) of ``value``."""

    value: int


@dataclass
class Event:
    seq: int  # position in the global read order (arrival order)
    partition: str  # the partition's name (its path as written in the spec)
    offset: int  # 0-based line index in its file
    t: int  # event time, ms
    key: Any  # the key's JSON value (int or str)
    record: dict[str, Any]  # the parsed JSON object (as the late output shows it)
    values: dict[str, Any] = field(default_factory=dict)  # with the derived fields
    kept: bool = True  # the filter keeps it


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
    """``(function, argument)``: the field, ``"f, q"`` for quantile, the condition's
    text for count_if."""
    m = _AGG_RE.match(expr)
    if not m or m.group(1) not in _FUNCS:
        raise ValueError(f"unknown aggregate {expr!r}")
    return m.group(1), (m.group(2) or "").strip() or None


def read_events(
    partitions: Sequence[tuple[str, str]], key: str | list[str], time: str,
    fields: dict[str, Fn] | None = None, where: Fn | None = None,
) -> tuple[list[Event], list[int]]:
    """All events in global read order, and each partition's number of records."""
    per_partition: list[list[tuple[int, dict[str, Any]]]] = []
    for _name, text in partitions:
        records = []
        for offset, line in enumerate(text.split("\n")):
            if line.strip() == "":
                continue  # blank lines are not records (but count as lines)
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError(f"bad record (not modelled): {line!r}")
            values = dict(obj)
            for name, fn in (fields or {}).items():
                values[name] = fn(values)
            keys = [key] if isinstance(key, str) else key
            if any(values.get(k) is None for k in keys) or values.get(time) is None:
                raise ValueError(f"bad record (not modelled): {line!r}")
            records.append((offset, obj, values))
        per_partition.append(records)

    order = []
    for p, records in enumerate(per_partition):
        for offset, obj, values in records:
            order.append((offset, p, obj, values))
    order.sort(key=lambda x: (x[0], x[1]))

    events = []
    for seq, (offset, p, obj, values) in enumerate(order):
        k = values[key] if isinstance(key, str) else tuple((f, values[f]) for f in key)
        for part in (k,) if isinstance(key, str) else (v for _, v in k):
            if type(part) not in (int, str):
                raise ValueError(f"key {part!r}: only integer and string keys are modelled")
        kept = where is None or where(values) is True
        events.append(Event(seq, partitions[p][0], offset, parse_time(values[time]), k, obj,
                            values, kept))
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


def _distinct_id(v: Any) -> tuple[str, Any]:
    if type(v) in (int, float):
        return ("n", float(v))
    return ("j", json.dumps(v, sort_keys=True))


def _quantile(values: list[float], q: float) -> float:
    a = sorted(float(v) for v in values)
    pos = q * (len(a) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(a) - 1)
    return a[lo] + (a[hi] - a[lo]) * (pos - lo)


def aggregate(func: str, fld: str | None, events: list[Event],
              conditions: dict[str, Fn] | None = None) -> Any:
    if func == "count":
        return len(events)
    assert fld is not None
    if func == "count_if":
        cond = (conditions or {})[fld]
        return sum(1 for e in events if cond(e.values) is True)
    q = 0.5
    if func == "quantile":
        fld, q_text = (x.strip() for x in fld.rsplit(",", 1))
        q = float(q_text)
    # non-null values with (event time, arrival order), nulls and missing fields ignored
    vals = [(e.t, e.seq, e.values[fld]) for e in events if e.values.get(fld) is not None]
    if func in ("count_distinct", "approx_count_distinct"):
        n = len({_distinct_id(v) for _, _, v in vals})
        return n if func == "count_distinct" else Approx(n)
    if not vals:
        return None
    values = [v for _, _, v in vals]
    if func in ("sum", "min", "max", "mean", "median", "quantile", "stddev", "variance"):
        for v in values:
            if type(v) not in (int, float):
                raise ValueError(f"non-numeric value {v!r} (a bad record, not modelled)")
    if func in ("median", "quantile"):
        return _quantile(values, q)
    if func in ("stddev", "variance"):
        if len(values) < 2:
            return None
        mean = math.fsum(values) / len(values)
        var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
        return math.sqrt(var) if func == "stddev" else var
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
    key: Any, start: int, end: int, events: list[Event], aggregates: dict[str, str],
    conditions: dict[str, Fn] | None = None,
) -> dict[str, Any]:
    if isinstance(key, tuple):  # a compound key: each field under its own name
        out: dict[str, Any] = dict(key)
        out.update({"window_start": start, "window_end": end})
    else:
        out = {"key": key, "window_start": start, "window_end": end}
    for name, expr in aggregates.items():
        func, fld = parse_aggregate(expr)
        out[name] = aggregate(func, fld, events, conditions)
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
    key: str | list[str],
    time: str,
    max_delay_ms: int,
    window: WindowDef,
    aggregates: dict[str, str],
    fields: dict[str, Fn] | None = None,
    where: Fn | None = None,
    conditions: dict[str, Fn] | None = None,
) -> ReferenceOutput:
    """Run the model. ``partitions`` are ``(name as written in the spec, file text)``;
    ``fields`` (derived fields), ``where`` (the filter) and ``conditions`` (count_if's,
    by their text) are Python functions of a record."""
    events, n_records = read_events(partitions, key, time, fields, where)
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
        if not e.kept:
            pass  # filtered out after the watermark saw it
        elif window.kind in ("tumbling", "sliding"):
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
                result_record(s.events[0].key, s.start, s.end, s.events, aggregates, conditions)
            )
    else:
        for (_kid, start, end), (k, evs) in contents.items():
            out.results.append(result_record(k, start, end, evs, aggregates, conditions))
    return out
