"""Sliding windows on panes, against tests/reference.py.

The window operator keeps sliding-window state as fragments: a pane
``[p, p + slide)`` for the events all of whose windows were open for them, and
the window itself for the pairs judged one by one (an event late for its older
windows but on time for its newer ones, or every event when
``size % slide != 0``). These properties aim at that split: little
``max_delay_ms`` against a lot of disorder, so that many events are late for
some of their windows and not for others, several partitions, batch sizes
1..64, checkpoints, and runs stopped after a checkpoint and resumed from it
(the fragment state goes through the Arrow checkpoint file).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference as ref
from helpers import (
    Case,
    Output,
    assert_same_output,
    jsonl,
    read_jsonl_dir,
    run_engine,
    run_reference,
    write_case,
)
from sealstream._runtime.crash import CrashPoints
from sealstream._runtime.engine import Job
from sealstream.pipeline import load_spec

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

AGGS = ["count", "sum(v)", "min(v)", "max(v)", "mean(v)", "first(v)", "last(v)"]
values = st.one_of(st.none(), st.integers(-5, 10), st.integers(-20, 40).map(lambda i: i / 4))


@st.composite
def sliding(draw: st.DrawFn) -> ref.WindowDef:
    slide = draw(st.integers(1, 8))
    if draw(st.booleans()):
        size = slide * draw(st.integers(1, 6))  # panes
    else:
        size = draw(st.integers(slide, 30))  # any size: panes only when it divides
    lateness = draw(st.sampled_from([0, 0, 1, 3, 10]))
    return ref.WindowDef("sliding", size_ms=size, slide_ms=slide, allowed_lateness_ms=lateness)


@st.composite
def partition(draw: st.DrawFn, keys: list[Any], disorder: int) -> str:
    rows = draw(
        st.lists(
            st.tuples(st.sampled_from(keys), st.integers(0, 4), st.integers(0, disorder), values),
            max_size=40,
        )
    )
    clock = draw(st.integers(-20, 30))
    records: list[dict[str, Any] | None] = []
    for k, step, behind, v in rows:
        clock += step
        rec: dict[str, Any] = {"k": k, "ts": clock - behind}
        if v is not None or draw(st.booleans()):
            rec["v"] = v
        records.append(rec)
    return jsonl(records)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_parts = draw(st.integers(1, 3))
    keys = draw(st.lists(st.sampled_from(["a", "b", 1, "1"]), min_size=1, max_size=3, unique=True))
    disorder = draw(st.sampled_from([3, 10, 25, 40]))
    exprs = draw(st.lists(st.sampled_from(AGGS), min_size=1, max_size=4))
    return Case(
        partitions=[(f"p{i}.jsonl", draw(partition(keys, disorder))) for i in range(n_parts)],
        window=draw(sliding()),
        aggregates={f"a{i}": e for i, e in enumerate(exprs)},
        max_delay_ms=draw(st.sampled_from([0, 0, 2, 5])),
        batch_size=draw(st.sampled_from([1, 2, 3, 5, 8, 16, 64])),
        checkpoint_every=draw(st.one_of(st.none(), st.integers(1, 15))),
    )


@SETTINGS
@given(cases())
def test_sliding_matches_reference(case: Case) -> None:
    assert_same_output(run_reference(case), run_engine(case), case)


@SETTINGS
@given(cases(), st.sampled_from([1, 2, 7, 64]))
def test_sliding_output_does_not_depend_on_batch_size(case: Case, other: int) -> None:
    case.checkpoint_every = None
    first = run_engine(case)
    case.batch_size = other if other != case.batch_size else 3
    assert_same_output(first, run_engine(case), case)


def _stop_and_resume(case: Case, directory: Path, stops: int) -> Output:
    """Run, stopping after ``stops`` checkpoints in turn; resume from each until done."""
    spec = write_case(case, directory)
    quiet = CrashPoints("")
    for _ in range(200):
        seen = {"n": 0}

        def stop(_job: Job, seen: dict[str, int] = seen) -> bool:
            seen["n"] += 1
            return seen["n"] >= stops

        job = Job(load_spec(spec), crash=quiet, stop_when=stop)
        job.run()
        if not job.stopped_early:
            break
    return Output(read_jsonl_dir(directory / "out"), read_jsonl_dir(directory / "late"))


@SETTINGS
@given(cases(), st.integers(1, 3))
def test_sliding_resumed_from_checkpoints_matches_reference(case: Case, stops: int) -> None:
    """Fragments (panes with their windows that already fired) survive a restore."""
    case.checkpoint_every = case.checkpoint_every or 4
    with tempfile.TemporaryDirectory() as tmp:
        got = _stop_and_resume(case, Path(tmp), stops)
    assert_same_output(run_reference(case), got, case)


def _case(window: ref.WindowDef, records: list[dict[str, Any]], batch: int, **kw: Any) -> Case:
    return Case(
        partitions=[("p0.jsonl", jsonl(list(records)))],
        window=window,
        aggregates={"n": "count", "s": "sum(v)", "f": "first(v)", "l": "last(v)"},
        batch_size=batch,
        **kw,
    )


def test_event_late_for_its_older_windows_only() -> None:
    """size 10, slide 5: t=12 belongs to [5, 15) and [10, 20). After t=17 (W = 17) the
    pair with [5, 15) is late, the pair with [10, 20) is not: t=12 counts in [10, 20)
    only, and t=3 (whose windows [0, 10) and [-5, 5) are both closed) is a late event."""
    w = ref.WindowDef("sliding", size_ms=10, slide_ms=5, allowed_lateness_ms=0)
    recs = [
        {"k": "a", "ts": 6, "v": 1},
        {"k": "a", "ts": 17, "v": 2},
        {"k": "a", "ts": 12, "v": 4},
        {"k": "a", "ts": 3, "v": 8},
        {"k": "a", "ts": 13, "v": 16},
    ]
    for batch in (1, 2, 5, 64):
        for ck in (None, 1, 2):
            case = _case(w, recs, batch, checkpoint_every=ck)
            got = run_engine(case)
            assert_same_output(run_reference(case), got, case)
            by_window = {(r["window_start"], r["window_end"]): r for r in got.results}
            assert by_window[(5, 15)]["n"] == 1  # only t=6
            assert by_window[(10, 20)]["s"] == 2 + 4 + 16
            assert [r["ts"] for r in got.late] == [3]


def test_open_windows_counts_windows_not_panes() -> None:
    from sealstream.pipeline import Sliding
    from sealstream.windows.operator import WindowOperator

    with tempfile.TemporaryDirectory() as tmp:
        case = _case(
            ref.WindowDef("sliding", size_ms=10, slide_ms=5),
            [{"k": "a", "ts": 1, "v": 1}],
            64,
        )
        p = load_spec(write_case(case, Path(tmp)))
    assert isinstance(p.window, Sliding)
    op = WindowOperator(p)
    import polars as pl

    from sealstream.sources._base import KEY, KEY_IS_INT
    from sealstream.windows.aggregates import WEND, WSTART

    # one pane [0, 5) of key "a" belongs to the windows [-5, 5) and [0, 10)
    row = {c: None for c in op.schema} | {KEY: "a", KEY_IS_INT: False, WSTART: 0, WEND: 5,
                                          "#n": 3}
    op.state = pl.DataFrame([row], schema=op.schema)
    assert op.open_windows == 2
    table = op.open_window_table()
    assert sorted(table[WSTART].to_list()) == [-5, 0]
    assert table["#n"].to_list() == [3, 3]
    assert op.state.height == 1  # looking does not fire anything


# ------------------------------------------------------------- fast paths
# The operator fires pane-pattern sliding windows over sorted ranges of panes
# (``_fire_panes``), merges partials with one join (``_merge``), and orders
# results with integer sorts (``result_order``). Each has a general path kept
# for the other cases; these tests check both give the same answer.


def _merge_by_group_by(self: Any, partial: Any) -> None:
    """``WindowOperator._merge`` through its general path (a group-by)."""
    import polars as pl

    from sealstream.windows.aggregates import WSTART

    if not partial.height:
        return
    partial = partial.select(list(self.schema)).cast(self.schema)
    if not self.state.height:
        self.state = partial
        return
    hit = pl.col(WSTART).is_in(partial.get_column(WSTART).unique().implode())
    self._merge_grouped(self.state.filter(hit), partial)


def _differential(case: Case, monkeypatch: Any) -> tuple[Output, Output, int]:
    """The engine's output, the output with every fast path off, and how many
    firings took the pane fast path."""
    from sealstream.windows import aggregates, operator

    taken = {"n": 0}
    fire_panes = operator.WindowOperator._fire_panes

    def counting(self: Any, cand: Any, last: int) -> Any:
        out = fire_panes(self, cand, last)
        taken["n"] += out is not None
        return out

    with monkeypatch.context() as m:
        m.setattr(operator.WindowOperator, "_fire_panes", counting)
        fast = run_engine(case)
    with monkeypatch.context() as m:
        m.setattr(operator.WindowOperator, "_fire_panes", lambda *_: None)
        m.setattr(operator.WindowOperator, "_merge", _merge_by_group_by)
        m.setattr(aggregates, "key_words", lambda _frame: None)
        slow = run_engine(case)
    return fast, slow, taken["n"]


@SETTINGS
@given(cases())
def test_fast_paths_match_general_paths(case: Case) -> None:
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        fast, slow, _ = _differential(case, mp)
    assert_same_output(slow, fast, case)
    assert_same_output(run_reference(case), fast, case)


def test_pane_fast_path_is_taken_and_exact() -> None:
    """Many keys and panes, windows firing batch after batch, pairs late for their
    older windows: the fast path fires (and agrees with the reference)."""
    import random

    import pytest

    rnd = random.Random(7)
    recs: list[dict[str, Any]] = []
    clock = 0
    for _ in range(400):
        clock += rnd.randint(0, 3)
        key = rnd.choice(["a", "b", "c\u00e9", "d\x00", 7, "7"])
        value = rnd.choice([1, -2, 2**62, 0.25, None])
        recs.append({"k": key, "ts": clock - rnd.randint(0, 6), "v": value})
    w = ref.WindowDef("sliding", size_ms=20, slide_ms=4, allowed_lateness_ms=1)
    case = Case(
        partitions=[("p0.jsonl", jsonl(list(recs)))],
        window=w,
        aggregates={"n": "count", "s": "sum(v)", "lo": "min(v)", "hi": "max(v)", "m": "mean(v)"},
        max_delay_ms=3,
        batch_size=16,
        checkpoint_every=5,
    )
    with pytest.MonkeyPatch.context() as mp:
        fast, slow, taken = _differential(case, mp)
    assert taken > 5
    assert_same_output(slow, fast, case)
    assert_same_output(run_reference(case), fast, case)


keys_text = st.text(
    alphabet=st.sampled_from(["a", "b", "\x00", "\u00e9", "z", "\U0001f600", '"', "\\"]),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(keys_text, st.booleans(), st.sampled_from([-5, 0, 5, 10, 2**40]),
                  st.sampled_from([3, 10])),
        min_size=1,
        max_size=40,
    )
)
def test_result_order_is_polars_sort(rows: list[tuple[str, bool, int, int]]) -> None:
    import polars as pl

    from sealstream.sources._base import KEY, KEY_IS_INT
    from sealstream.windows.aggregates import WEND, WSTART, in_result_order, result_order

    frame = pl.DataFrame(
        [(k, i, s, s + d) for k, i, s, d in rows],
        schema={KEY: pl.String, KEY_IS_INT: pl.Boolean, WSTART: pl.Int64, WEND: pl.Int64},
        orient="row",
    )
    cols = [WEND, WSTART, KEY]
    ours = frame[result_order(frame)]
    assert ours.select(cols).equals(frame.sort(cols, maintain_order=True).select(cols))
    assert in_result_order(ours)
    expected = sorted(rows, key=lambda r: (r[2] + r[3], r[2], r[0].encode()))
    assert [(k, s) for k, _, s, _ in expected] == list(
        zip(ours[KEY].to_list(), ours[WSTART].to_list(), strict=True)
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=6), min_size=1, max_size=10))
def test_plain_keys_are_their_own_json(keys: list[str]) -> None:
    import json

    import polars as pl

    from sealstream.windows.aggregates import _NOT_PLAIN, _json_string

    frame = pl.DataFrame({"k": keys})
    flagged = frame.select(pl.col("k").str.contains(_NOT_PLAIN)).to_series().to_list()
    encoded = frame.select(_json_string(pl.col("k"))).to_series().to_list()
    for key, bad, text in zip(keys, flagged, encoded, strict=True):
        assert json.loads(text) == key
        if not bad:
            assert text == '"' + key + '"'


def test_combine_ranges_exact_int128_nulls_and_nan() -> None:
    import numpy as np
    import polars as pl

    from sealstream.pipeline import Aggregate
    from sealstream.sources._base import FieldPlan
    from sealstream.windows.aggregates import Accumulators

    aggs = (Aggregate("s", "sum", "v"), Aggregate("lo", "min", "v"), Aggregate("hi", "max", "v"))
    acc = Accumulators(aggs, FieldPlan(key="k", time="ts", fields={"v": "numeric"}))
    big = 2**100
    frags = pl.DataFrame(
        {
            "#n": [1, 2, 3, 4],
            "#si:v": [big, -1, big, 5],
            "#sf:v": [0.1, 0.2, 0.0, 0.3],
            "#ni:v": [1, 1, 1, 1],
            "#nf:v": [0, 1, 0, 1],
            "#mini:v": [None, -3, None, 9],
            "#minf:v": [None, None, None, float("inf")],
            "#maxi:v": [None, -3, None, 9],
            "#maxf:v": [None, None, None, float("-inf")],
        },
        schema=acc.schema(),
    )
    order = np.array([3, 2, 1, 0])  # rows in sorted order: 3, 2, 1, 0
    r0, r1 = np.array([0, 1, 1, 3]), np.array([4, 2, 3, 4])
    out = acc.combine_ranges(frags, order, r0, r1)
    assert out is not None
    got = pl.DataFrame(out)
    assert got["#n"].to_list() == [10, 3, 5, 1]
    assert got["#si:v"].to_list() == [2 * big + 4, big, big - 1, big]
    assert got["#sf:v"].to_list() == [((0.0 + 0.3) + 0.0 + 0.2) + 0.1, 0.0, 0.2, 0.1]
    assert got["#mini:v"].to_list() == [-3, None, -3, None]
    assert got["#minf:v"].to_list() == [float("inf"), None, None, None]
    assert got["#maxf:v"].to_list() == [float("-inf"), None, None, None]
    nan = frags.with_columns(pl.lit(float("nan")).alias("#minf:v"))
    assert acc.combine_ranges(nan, order, r0, r1) is None
