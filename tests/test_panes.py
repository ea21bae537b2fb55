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


def engine(case: Case) -> Output:
    with tempfile.TemporaryDirectory() as tmp:
        return run_engine(case, Path(tmp))


@SETTINGS
@given(cases())
def test_sliding_matches_reference(case: Case) -> None:
    assert_same_output(run_reference(case), engine(case), case)


@SETTINGS
@given(cases(), st.sampled_from([1, 2, 7, 64]))
def test_sliding_output_does_not_depend_on_batch_size(case: Case, other: int) -> None:
    case.checkpoint_every = None
    first = engine(case)
    case.batch_size = other if other != case.batch_size else 3
    assert_same_output(first, engine(case), case)


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
            got = engine(case)
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
