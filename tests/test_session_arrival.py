"""The session merge's one-sort path (``windows/_sessions.py``: ``_arrival_sessions``)
against Flink's session rules applied one event at a time.

Each example feeds a few batches, as the engine cuts them (a range of offsets of
every partition, read partition after partition; the sequence is
``offset * partitions + partition``; the watermark before each event never goes
down in arrival order), through ``WindowOperator.process``, firing what each
batch's watermark closes. Sessions bridge batches (a state session grows or
merges), arrive out of order (an event before its key's latest session), and sit
at the lateness boundary (``end + lateness`` equal to or one past the watermark).
The fired sessions (key, start, end, count, sum) and the late events must equal a
literal model written here: before each event, sessions with ``end + lateness <=
W`` close; the event merges with every open session of its key it touches
(closed intervals), else it is late when ``t + gap + lateness <= W``, else it
opens a session.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference as ref
from helpers import Case, write_case
from sealstream.pipeline import Pipeline
from sealstream.pipeline.spec import load_spec
from sealstream.sources._base import KEY, KEY_IS_INT, TIME
from sealstream.watermark import POS_INF, WATERMARK
from sealstream.windows import _sessions
from sealstream.windows.aggregates import SEQ, WEND, WSTART
from sealstream.windows.operator import WindowOperator

KEYS = [("a", False), ("1", False), ("1", True), ("b", False)]


def _pipeline(gap: int, lat: int) -> Pipeline:
    case = Case(
        partitions=[("p0.jsonl", '{"k": "a", "ts": 1, "v": 1}\n')],
        window=ref.WindowDef("session", gap_ms=gap, allowed_lateness_ms=lat),
        aggregates={"n": "count", "s": "sum(v)"},
        max_delay_ms=0,
        batch_size=64,
    )
    with tempfile.TemporaryDirectory() as tmp:
        return load_spec(write_case(case, Path(tmp)))


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Events as the engine hands them to the operator."""
    return pl.DataFrame(
        {
            KEY: [r["k"][0] for r in rows],
            KEY_IS_INT: [r["k"][1] for r in rows],
            TIME: [r["t"] for r in rows],
            "__i:v": [r["v"] for r in rows],
            "__f:v": [None for _ in rows],
            SEQ: [r["seq"] for r in rows],
            WATERMARK: [r["w"] for r in rows],
        },
        schema={KEY: pl.String, KEY_IS_INT: pl.Boolean, TIME: pl.Int64, "__i:v": pl.Int64,
                "__f:v": pl.Float64, SEQ: pl.Int64, WATERMARK: pl.Int64},
    )


def _model(
    batches: list[list[dict[str, Any]]], ends: list[int], gap: int, lat: int
) -> tuple[list[tuple[Any, ...]], list[int]]:
    """Flink's rules one event at a time: every session fired, and the late events' seq."""
    open_: dict[Any, list[list[int]]] = {}  # key -> [start, end, n, sum]
    fired: list[tuple[Any, ...]] = []
    late: list[int] = []

    def fire(w: int) -> None:
        for k, sessions in open_.items():
            for o in [o for o in sessions if o[1] + lat <= w]:
                sessions.remove(o)
                fired.append((k, o[0], o[1], o[2], o[3]))

    for rows, w_end in zip(batches, ends, strict=True):
        for r in sorted(rows, key=lambda r: r["seq"]):
            fire(r["w"])
            s, e = r["t"], r["t"] + gap
            sessions = open_.setdefault(r["k"], [])
            touching = [o for o in sessions if o[0] <= e and s <= o[1]]
            if not touching and e + lat <= r["w"]:
                late.append(r["seq"])
                continue
            merged = [min([s, *(o[0] for o in touching)]), max([e, *(o[1] for o in touching)]),
                      1 + sum(o[2] for o in touching), r["v"] + sum(o[3] for o in touching)]
            for o in touching:
                sessions.remove(o)
            sessions.append(merged)
        fire(w_end)
    return sorted(fired), sorted(late)


def _engine(
    batches: list[list[dict[str, Any]]], ends: list[int], gap: int, lat: int
) -> tuple[list[tuple[Any, ...]], list[int]]:
    op = WindowOperator(_pipeline(gap, lat))
    fired: list[tuple[Any, ...]] = []
    late: list[int] = []
    for rows, w_end in zip(batches, ends, strict=True):
        out = op.process(_frame(rows), w_end)
        res = op.finalize(out.fired)
        fired += [((k, kint), s, e, n, v) for k, kint, s, e, n, v in zip(
            res["key"], res[KEY_IS_INT], res[WSTART], res[WEND], res["n"], res["s"], strict=True)]
        late += out.late[SEQ].to_list()
    assert op.state.height == 0  # the last watermark closes every session
    return sorted(fired), sorted(late)


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[list[dict[str, Any]]], list[int], int, int]:
    gap = draw(st.integers(1, 8))
    lat = draw(st.sampled_from([0, 0, 1, 3, 8]))
    n_parts = draw(st.integers(1, 3))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    raw = draw(st.lists(st.tuples(st.integers(0, n_parts - 1), st.sampled_from(keys),
                                  st.integers(0, 4), st.integers(0, 12), st.integers(-3, 9)),
                        min_size=1, max_size=40))
    offsets = [0] * n_parts
    events = []
    clock = 0
    for p, k, step, behind, v in raw:
        clock += step
        events.append({"p": p, "off": offsets[p], "k": k, "t": clock - behind, "v": v})
        offsets[p] += 1
    for r in events:
        r["seq"] = r["off"] * n_parts + r["p"]
    events.sort(key=lambda r: r["seq"])
    # the watermark before each event: never down in arrival order, near the clock
    w = draw(st.integers(-15, 0))
    for r in events:
        w = max(w, r["t"] - draw(st.sampled_from([0, 1, 2, 5, 10, 20])))
        r["w"] = w
    # batches: ranges of offsets, every partition's; read partition after partition
    cuts = sorted(draw(st.sets(st.integers(1, max(offsets)), max_size=3)))
    bounds = [0, *cuts, max(offsets) + 1]
    batches = [sorted((r for r in events if a <= r["off"] < b), key=lambda r: (r["p"], r["off"]))
               for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    batches = [b for b in batches if b]
    # each batch ends with a watermark up to the next batch's first one
    ends = []
    for i, b in enumerate(batches):
        last = max(r["w"] for r in b)
        nxt = min(r["w"] for r in batches[i + 1]) if i + 1 < len(batches) else last + 40
        ends.append(draw(st.integers(last, max(last, nxt))))
    ends[-1] = POS_INF
    return batches, ends, gap, lat


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_sessions_match_the_rules_one_event_at_a_time(
    run: tuple[list[list[dict[str, Any]]], list[int], int, int],
) -> None:
    batches, ends, gap, lat = run
    assert _engine(batches, ends, gap, lat) == _model(batches, ends, gap, lat)


def _no_replay(*args: Any) -> Any:
    raise AssertionError("the one-sort path should have handled this batch")


def _row(k: tuple[str, bool], t: int, seq: int, w: int, v: int = 1) -> dict[str, Any]:
    return {"k": k, "t": t, "seq": seq, "w": w, "v": v}


@pytest.mark.parametrize(("w_last", "replayed"), [(12, False), (13, True)])
def test_bridge_across_batches(
    monkeypatch: pytest.MonkeyPatch, w_last: int, replayed: bool
) -> None:
    """Gap 5, lateness 0. The first batch leaves a's session [0, 10) open (b's
    [3, 8) fires at W = 9); the second grows it to [0, 13), an event arriving out
    of order lands inside it, and a last event at t = 11 extends it to [0, 16)
    while W = 12 < 13: the one-sort path handles all of it, no replay. At W = 13
    the session is closed for that event, which opens [11, 16): the path hands
    the key to the replay, and the outcome is the rules'."""
    a, b = ("a", False), ("1", True)
    batches = [
        [_row(a, 0, 0, 0), _row(a, 5, 2, 0), _row(b, 3, 1, 0)],
        [_row(a, 8, 4, 9), _row(a, 6, 6, 9), _row(b, 30, 5, 9), _row(a, 11, 8, w_last)],
    ]
    ends = [9, POS_INF]
    calls = {"n": 0}
    replay = _sessions._replayed_labels

    def counting(*args: Any) -> Any:
        calls["n"] += 1
        return replay(*args)

    monkeypatch.setattr(_sessions, "_replayed_labels", counting)
    got = _engine(batches, ends, 5, 0)
    assert got == _model(batches, ends, 5, 0)
    assert bool(calls["n"]) == replayed
    if replayed:
        assert got[0] == sorted([(a, 0, 13, 4, 4), (a, 11, 16, 1, 1), (b, 3, 8, 1, 1),
                                 (b, 30, 35, 1, 1)])
    else:
        assert got[0] == sorted([(a, 0, 16, 5, 5), (b, 3, 8, 1, 1), (b, 30, 35, 1, 1)])


def test_lateness_boundary_is_replayed() -> None:
    """At W = 11 an event with ``t + gap + lateness == W`` is late; one a
    millisecond later is not and opens a session, which an event touching it and
    the fired session [0, 5) joins. The one-sort path hands the key to the
    replay; the outcome is the rules'."""
    a = ("a", False)
    for lat in (0, 2):
        batches = [
            [_row(a, 0, 0, 0)],
            [_row(a, 20, 3, 11), _row(a, 6 - lat, 6, 11), _row(a, 7 - lat, 9, 11),
             _row(a, 3, 12, 11)],
        ]
        ends = [0, POS_INF]
        got = _engine(batches, ends, 5, lat)
        assert got == _model(batches, ends, 5, lat)
        assert got[1] == [6]  # t = 6 - lat: 6 - lat + 5 + lat = 11 <= W
        assert sorted(r[1:4] for r in got[0]) == [(0, 5, 1), (3, 12 - lat, 2), (20, 25, 1)]


def test_arrival_order_merges_partition_runs() -> None:
    """``_arrival_order`` equals NumPy's lexsort by (code, seq), on a few ascending
    runs (timsort) and on many (the general sort)."""
    rng = np.random.default_rng(7)
    for runs_ in (1, 3, 200):
        seq = np.concatenate([np.sort(rng.integers(0, 10**6, 500)) for _ in range(runs_)])
        seq = np.concatenate([np.full(40, -1), seq])
        code = rng.integers(0, 50, seq.size)
        assert np.array_equal(_sessions._arrival_order(code, seq), np.lexsort((seq, code)))
