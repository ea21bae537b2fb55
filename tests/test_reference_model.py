"""Hand-computed examples for the reference model (tests/reference.py).

Each example states the watermark reasoning in a comment so it can be checked
by hand against docs/semantics.md.
"""

from __future__ import annotations

from typing import Any

import pytest

import reference as ref
from helpers import jsonl

T10 = ref.WindowDef("tumbling", size_ms=10)


def run(
    parts: list[list[dict[str, Any] | None]],
    window: ref.WindowDef,
    aggs: dict[str, str] | None = None,
    delay: int = 0,
) -> ref.ReferenceOutput:
    partitions = [(f"p{i}.jsonl", jsonl(recs)) for i, recs in enumerate(parts)]
    return ref.run(
        partitions,
        key="k",
        time="ts",
        max_delay_ms=delay,
        window=window,
        aggregates=aggs if aggs is not None else {"n": "count"},
    )


def ev(t: Any, k: Any = "a", **values: Any) -> dict[str, Any]:
    return {"k": k, "ts": t, **values}


def by_id(out: ref.ReferenceOutput) -> dict[tuple[Any, ...], dict[str, Any]]:
    table = {}
    for r in out.results:
        rid = (r["key"], r["window_start"], r["window_end"])
        assert rid not in table
        table[rid] = {k: v for k, v in r.items() if k not in ("key", "window_start", "window_end")}
    return table


def late_times(out: ref.ReferenceOutput) -> list[Any]:
    return [r["ts"] for r in out.late]


# ----------------------------------------------------------------- windows


def test_tumbling_basic() -> None:
    out = run([[ev(1, v=1), ev(5, v=2), ev(12, v=3)]], T10, {"n": "count", "s": "sum(v)"})
    assert by_id(out) == {("a", 0, 10): {"n": 2, "s": 3}, ("a", 10, 20): {"n": 1, "s": 3}}
    assert out.late == []


def test_tumbling_negative_time_floors() -> None:
    out = run([[ev(-1), ev(-10), ev(-11)]], T10, delay=100)
    assert by_id(out) == {("a", -10, 0): {"n": 2}, ("a", -20, -10): {"n": 1}}


def test_windows_of_sliding() -> None:
    w = ref.WindowDef("sliding", size_ms=10, slide_ms=5)
    assert ref.windows_of(7, w) == [(0, 10), (5, 15)]
    assert ref.windows_of(3, w) == [(-5, 5), (0, 10)]
    assert ref.windows_of(5, w) == [(0, 10), (5, 15)]
    # slide not dividing size
    w = ref.WindowDef("sliding", size_ms=10, slide_ms=4)
    assert ref.windows_of(7, w) == [(0, 10), (4, 14)]
    assert ref.windows_of(1, w) == [(-8, 2), (-4, 6), (0, 10)]
    assert ref.windows_of(8, w) == [(0, 10), (4, 14), (8, 18)]
    # slide == size is tumbling
    w = ref.WindowDef("sliding", size_ms=10, slide_ms=10)
    assert ref.windows_of(19, w) == [(10, 20)]
    # slide 1
    w = ref.WindowDef("sliding", size_ms=3, slide_ms=1)
    assert ref.windows_of(0, w) == [(-2, 1), (-1, 2), (0, 3)]


def test_sliding_partial_lateness() -> None:
    w = ref.WindowDef("sliding", size_ms=10, slide_ms=5)
    # t=12 -> [5,15),[10,20). Then W=12: t=7 -> [0,10) late (10<=12), [5,15) on time.
    # t=3 -> [-5,5),[0,10): both late -> late output.
    out = run([[ev(12), ev(7), ev(3)]], w)
    assert by_id(out) == {("a", 5, 15): {"n": 2}, ("a", 10, 20): {"n": 1}}
    assert late_times(out) == [3]
    assert out.late[0] == {"k": "a", "ts": 3, "_partition": "p0.jsonl", "_offset": 2}


# ----------------------------------------------------------------- lateness


@pytest.mark.parametrize(
    ("delay", "lateness", "first", "late"),
    [
        (0, 0, 10, True),  # W = 10, end + lateness = 10 <= 10: late
        (0, 0, 9, False),  # W = 9 < 10
        (1, 0, 10, False),  # W = 10 - 1 = 9
        (1, 0, 11, True),  # W = 10
        (0, 2, 12, True),  # 10 + 2 <= 12
        (0, 2, 11, False),  # 12 > 11
    ],
)
def test_tumbling_lateness_boundary(delay: int, lateness: int, first: int, late: bool) -> None:
    w = ref.WindowDef("tumbling", size_ms=10, allowed_lateness_ms=lateness)
    out = run([[ev(first), ev(9)]], w, delay=delay)
    table = by_id(out)
    if late:
        assert late_times(out) == [9]
        assert ("a", 0, 10) not in table
    else:
        assert out.late == []
        assert table[("a", 0, 10)] == {"n": 1 if first >= 10 else 2}


def test_own_event_not_in_watermark() -> None:
    # a single event is judged against W = -inf, never against itself
    out = run([[ev(5)]], T10)
    assert by_id(out) == {("a", 0, 10): {"n": 1}}


def test_watermark_never_decreases_and_uses_max() -> None:
    # W before t=3 is max(20, 4) - 0 = 20, not the last event's time
    out = run([[ev(20), ev(4), ev(3)]], T10)
    assert late_times(out) == [4, 3]


# ----------------------------------------------------------------- sessions

S5 = ref.WindowDef("session", gap_ms=5)


def test_session_touching_merges() -> None:
    # [0,5) and [5,10) touch (5 <= 5); 11 does not touch [0,10)
    out = run([[ev(0), ev(5), ev(11)]], S5, delay=100)
    assert by_id(out) == {("a", 0, 10): {"n": 2}, ("a", 11, 16): {"n": 1}}


def test_session_out_of_order_start_is_first_event_time() -> None:
    out = run([[ev(8), ev(4), ev(6)]], S5, {"n": "count", "f": "first(ts)"}, delay=100)
    assert by_id(out) == {("a", 4, 13): {"n": 3, "f": 4}}


def test_session_bridges_two_open_sessions() -> None:
    # [0,5) and [10,15) are both open; t=5 -> [5,10) touches both -> [0,15)
    out = run([[ev(0), ev(10), ev(5)]], S5, {"n": "count", "l": "last(ts)"}, delay=100)
    assert by_id(out) == {("a", 0, 15): {"n": 3, "l": 10}}


def test_session_keys_are_separate() -> None:
    out = run([[ev(0, "a"), ev(3, "b"), ev(4, "a")]], S5, delay=100)
    assert by_id(out) == {("a", 0, 9): {"n": 2}, ("b", 3, 8): {"n": 1}}


@pytest.mark.parametrize(("b_time", "fired"), [(5, True), (4, False)])
def test_fired_session_not_reopened(b_time: int, fired: bool) -> None:
    # a@0 opens [0,5). b@b_time moves W to b_time. Before a@5: if W = 5 >= 5 + 0,
    # [0,5) has fired and a@5 opens a new session [5,10) (not late: 10 > 5);
    # with W = 4 it has not, and a@5 merges into [0,10).
    out = run([[ev(0, "a"), ev(b_time, "b"), ev(5, "a")]], S5)
    table = by_id(out)
    if fired:
        assert table == {
            ("a", 0, 5): {"n": 1},
            ("a", 5, 10): {"n": 1},
            ("b", 5, 10): {"n": 1},
        }
    else:
        assert table == {("a", 0, 10): {"n": 2}, ("b", 4, 9): {"n": 1}}
    assert out.late == []


def test_fired_session_touching_event_is_late_when_its_own_window_is() -> None:
    # a@0 [0,5) fires at W=20; a@4 -> [4,9) touches only the closed session; 9 <= 20: late
    out = run([[ev(0, "a"), ev(20, "b"), ev(4, "a")]], S5)
    assert by_id(out) == {("a", 0, 5): {"n": 1}, ("b", 20, 25): {"n": 1}}
    assert late_times(out) == [4]


def test_session_lateness_boundary() -> None:
    # W = 20 before y@15 and y@16: [15,20) 20 <= 20 late; [16,21) 21 > 20 on time
    out = run([[ev(20, "x"), ev(15, "y"), ev(16, "y")]], S5)
    assert by_id(out) == {("x", 20, 25): {"n": 1}, ("y", 16, 21): {"n": 1}}
    assert out.late == [{"k": "y", "ts": 15, "_partition": "p0.jsonl", "_offset": 1}]


def test_session_late_event_merging_into_open_session_is_not_late() -> None:
    # a@20 open [20,25); W = 20: a@15 -> [15,20) touches [20,25) -> merged [15,25), on time
    out = run([[ev(20), ev(15)]], S5)
    assert by_id(out) == {("a", 15, 25): {"n": 2}}
    assert out.late == []


def test_session_allowed_lateness_delays_firing() -> None:
    # lateness 3: [0,5) fires only at W >= 8. b@7 -> W=7 before a@5: still open, merges.
    w = ref.WindowDef("session", gap_ms=5, allowed_lateness_ms=3)
    out = run([[ev(0, "a"), ev(7, "b"), ev(5, "a")]], w)
    assert by_id(out) == {("a", 0, 10): {"n": 2}, ("b", 7, 12): {"n": 1}}


# ----------------------------------------------------------------- partitions


def test_multi_partition_watermark_is_min() -> None:
    # order: p0@0 t=100, p1@0 t=0, p0@1 t=5, p1@1 t=3
    # before p0 t=5: W = min(100, 0) = 0 -> on time; before p1 t=3: p0 exhausted (+inf),
    # p1 = 0 -> W = 0 -> on time.
    out = run([[ev(100), ev(5)], [ev(0), ev(3)]], T10)
    assert by_id(out) == {("a", 0, 10): {"n": 3}, ("a", 100, 110): {"n": 1}}
    assert out.late == []
    # the same events in one partition: W = 100 before t=5
    single = run([[ev(100), ev(0), ev(5), ev(3)]], T10)
    assert late_times(single) == [0, 5, 3]


def test_exhausted_partition_is_plus_infinity() -> None:
    # p0 holds one record: after it, W_p0 = +inf. Before p1's t=5: W = min(inf, 20) = 20.
    out = run([[ev(0)], [ev(20), ev(5)]], T10)
    assert out.late == [{"k": "a", "ts": 5, "_partition": "p1.jsonl", "_offset": 1}]
    # p0's second record is on line 2 (a blank line in between), read after p1's line 1:
    # p0 is not exhausted, W = min(0, 20) = 0 -> t=5 is on time.
    out = run([[ev(0), None, ev(30)], [ev(20), ev(5)]], T10)
    assert out.late == []
    assert by_id(out)[("a", 0, 10)] == {"n": 2}


def test_empty_partition_does_not_hold_back_the_watermark() -> None:
    out = run([[], [ev(20), ev(5)]], T10)
    assert late_times(out) == [5]
    out = run([[None, None], [ev(20), ev(5)]], T10)
    assert late_times(out) == [5]


def test_trailing_blank_lines_do_not_delay_exhaustion() -> None:
    # p0's last record is on line 0; blank lines after it do not matter
    out = run([[ev(0), None, None, None], [ev(20), ev(5)]], T10)
    assert late_times(out) == [5]


def test_offsets_count_blank_lines() -> None:
    out = run([[None, ev(20), None, ev(1)]], T10)
    assert out.late == [{"k": "a", "ts": 1, "_partition": "p0.jsonl", "_offset": 3}]


# ----------------------------------------------------------------- aggregates

ALL = {
    "n": "count",
    "s": "sum(v)",
    "lo": "min(v)",
    "hi": "max(v)",
    "m": "mean(v)",
    "f": "first(v)",
    "l": "last(v)",
}


def one_window(records: list[dict[str, Any]], aggs: dict[str, str] = ALL) -> dict[str, Any]:
    table = by_id(run([records], ref.WindowDef("tumbling", size_ms=100), aggs, delay=1000))
    assert len(table) == 1
    return next(iter(table.values()))


def test_int_sums_stay_int() -> None:
    r = one_window([ev(1, v=1), ev(2, v=2)])
    assert r == {"n": 2, "s": 3, "lo": 1, "hi": 2, "m": 1.5, "f": 1, "l": 2}
    assert type(r["s"]) is int and type(r["lo"]) is int


def test_sum_meeting_float_is_float() -> None:
    r = one_window([ev(1, v=1), ev(2, v=2.0)])
    assert type(r["s"]) is float and r["s"] == 3.0
    assert type(r["lo"]) is int and type(r["hi"]) is float
    assert type(r["l"]) is float


def test_mean_is_float() -> None:
    r = one_window([ev(1, v=2), ev(2, v=2)])
    assert type(r["m"]) is float and r["m"] == 2.0


def test_min_max_tie_between_int_and_float_accepts_either() -> None:
    r = one_window([ev(1, v=2), ev(2, v=2.0), ev(3, v=1)])
    assert isinstance(r["hi"], ref.OneOf) and set(map(type, r["hi"])) == {int, float}
    assert r["lo"] == 1 and type(r["lo"]) is int


def test_nulls_and_missing_fields_are_ignored() -> None:
    r = one_window([ev(1, v=None), ev(2), ev(3, v=4), ev(4, v=None)])
    assert r == {"n": 4, "s": 4, "lo": 4, "hi": 4, "m": 4.0, "f": 4, "l": 4}


def test_only_nulls_give_null() -> None:
    r = one_window([ev(1, v=None), ev(2)])
    assert r == {"n": 2, "s": None, "lo": None, "hi": None, "m": None, "f": None, "l": None}


def test_first_last_by_event_time_not_arrival() -> None:
    r = one_window([ev(7, v="x"), ev(3, v="y"), ev(5, v="z")], {"f": "first(v)", "l": "last(v)"})
    assert r == {"f": "y", "l": "x"}


def test_first_last_ties_by_arrival() -> None:
    r = one_window([ev(5, v=1), ev(5, v=2), ev(5, v=3)], {"f": "first(v)", "l": "last(v)"})
    assert r == {"f": 1, "l": 3}


def test_first_last_ties_across_partitions_follow_read_order() -> None:
    # read order: p1@0 (v=20) before p0@1 (v=10)
    out = run(
        [[ev(1, v=None), ev(5, v=10)], [ev(5, v=20)]],
        ref.WindowDef("tumbling", size_ms=100),
        {"f": "first(v)", "l": "last(v)"},
        delay=1000,
    )
    assert by_id(out) == {("a", 0, 100): {"f": 20, "l": 10}}


def test_keys_keep_their_json_type() -> None:
    out = run([[ev(1, 1), ev(2, "1"), ev(3, 1)]], T10)
    results = sorted(out.results, key=lambda r: repr(r["key"]))
    assert [(type(r["key"]), r["n"]) for r in results] == [(str, 1), (int, 2)]


def test_iso_times() -> None:
    assert ref.parse_time("1970-01-01T00:00:00.005Z") == 5
    assert ref.parse_time("1970-01-01T01:00:00+01:00") == 0
    assert ref.parse_time("1970-01-01T00:00:01") == 1000
    assert ref.parse_time(1_700_000_000_000) == 1_700_000_000_000


def test_late_record_keeps_fields() -> None:
    out = run([[ev(50, v=1.5, x={"y": [1]}), ev(3, v=2.0, x=None)]], T10)
    assert out.late == [
        {"k": "a", "ts": 3, "v": 2.0, "x": None, "_partition": "p0.jsonl", "_offset": 1}
    ]
