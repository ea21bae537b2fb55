"""Property tests: two-source joins (inner and left; tumbling, sliding and session
windows; lateness; several partitions per source; batch sizes and checkpoint
intervals) through ``sealstream run``, against the reference model plus the join
rule written out in Python (tests/joins/_join_case.py)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _join_case import JoinCase, run_engine  # noqa: E402

import reference as ref  # noqa: E402
from helpers import assert_same_output  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

KEYS = ["a", "b", "c", 1]


def windows() -> st.SearchStrategy[ref.WindowDef]:
    lateness = st.sampled_from([0, 0, 3, 10])
    return st.one_of(
        st.builds(lambda s, lt: ref.WindowDef("tumbling", size_ms=s, allowed_lateness_ms=lt),
                  st.sampled_from([5, 10, 20]), lateness),
        st.builds(lambda s, d, lt: ref.WindowDef("sliding", size_ms=s, slide_ms=s // d,
                                                 allowed_lateness_ms=lt),
                  st.sampled_from([10, 20]), st.sampled_from([1, 2, 4]), lateness),
        st.builds(lambda g, lt: ref.WindowDef("session", gap_ms=g, allowed_lateness_ms=lt),
                  st.sampled_from([3, 8]), lateness),
    )


def records() -> st.SearchStrategy[list[tuple[Any, int, Any] | None]]:
    value = st.one_of(st.none(), st.integers(-5, 9), st.sampled_from([0.5, 2.25, -1.5]))
    rec = st.tuples(st.sampled_from(KEYS), st.integers(0, 60), value)
    return st.lists(st.one_of(rec, rec, rec, st.none()), min_size=0, max_size=8)


@st.composite
def join_cases(draw: st.DrawFn) -> JoinCase:
    files: dict[str, list[tuple[str, list[tuple[Any, int, Any] | None]]]] = {}
    for src in ("clicks", "views"):
        n = draw(st.integers(1, 2))
        files[src] = [(f"{src}/p{i}.jsonl", draw(records())) for i in range(n)]
    every = draw(st.sampled_from([None, 1, 3, 7]))
    return JoinCase(
        files=files,
        window=draw(windows()),
        join=draw(st.sampled_from(["inner", "left"])),
        left=draw(st.sampled_from(["clicks", "views"])),
        max_delay_ms=draw(st.sampled_from([0, 0, 2, 5])),
        batch_size=draw(st.sampled_from([1, 2, 3, 64])),
        checkpoint_every=every,
    )


@SETTINGS
@given(join_cases())
def test_joins_match_the_reference(case: JoinCase) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        actual = run_engine(case, Path(tmp))
    assert_same_output(case.expected(), actual)


def test_a_pinned_left_join_with_a_late_event(tmp_path: Path) -> None:
    """Views on the left: a window clicks alone saw is dropped; one views alone saw has
    null click aggregates; a click behind the watermark is late (its window closed)."""
    case = JoinCase(
        files={"clicks": [("c.jsonl", [("a", 1, 1), ("b", 2, None), ("a", 12, 2)])],
               "views": [("v.jsonl", [("a", 3, 5), ("c", 4, 1.5), ("a", 25, 1),
                                      ("a", 26, 1)])]},
        window=ref.WindowDef("tumbling", size_ms=10), join="left", left="views")
    # read order: offset 0 of c then v, offset 1 of both, ...: the click at t=12 is read
    # after the view at t=4 and before the view at t=25, so it is on time
    expected = case.expected()
    assert [(r["key"], r["window_start"], r["clicks.n"], r["views.n"], r["ctr"])
            for r in sorted(expected.results, key=lambda r: (str(r["key"]),
                                                              r["window_start"]))] == [
        ("a", 0, 1, 1, 1.0), ("a", 20, None, 2, None), ("c", 0, None, 1, None)]
    assert_same_output(expected, run_engine(case, tmp_path))
