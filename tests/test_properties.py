"""Property tests: the engine (through ``sealstream run``) against tests/reference.py.

Random JSONL partitions (1-3 files, 0-40 lines each, blank lines, small key sets,
disordered times so that lateness happens), random watermark delay, lateness,
window kind and size, aggregates over int/float/null/missing values, batch size
and checkpoint interval. The committed output must equal the reference model's,
and must not depend on the batch size.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference as ref
from helpers import Case, Output, assert_same_output, jsonl, run_engine, run_reference

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MISSING = object()
KEY_POOL = ["a", "b", "c", 1, 2, "1"]
BATCH_SIZES = [1, 2, 3, 7, 64]
AGG_EXPRS = [
    "count",
    "sum(v)",
    "min(v)",
    "max(v)",
    "mean(v)",
    "first(v)",
    "last(v)",
    "first(s)",
    "last(s)",
    "count_distinct(s)",
    "count_distinct(v)",
    "approx_count_distinct(s)",
    "median(v)",
    "quantile(v, 0.25)",
    "stddev(v)",
    "variance(v)",
    "count_if(v > 1)",
]


def _num(v: Any) -> bool:
    return type(v) in (int, float)


#: the Python meaning of every SQL expression these tests use (SQL's nulls included)
MEANING: dict[str, Any] = {
    "v > 1": lambda r: r["v"] > 1 if _num(r.get("v")) else None,
    "v > 2": lambda r: r["v"] > 2 if _num(r.get("v")) else None,
    "s = 'y' or v is null": lambda r: r.get("s") == "y" or r.get("v") is None,
    "coalesce(v, 0) >= 0": lambda r: (r["v"] if _num(r.get("v")) else 0) >= 0,
    "v * 2": lambda r: r["v"] * 2 if _num(r.get("v")) else None,
    "lower(s)": lambda r: r["s"].lower() if isinstance(r.get("s"), str) else None,
    "concat(k, '-x')": lambda r: f"{r['k']}-x",
    "ts + 5": lambda r: r["ts"] + 5,
    "coalesce(s, 'none')": lambda r: r["s"] if isinstance(r.get("s"), str) else "none",
}

# floats are multiples of 0.25 (exact sums, whatever the summation order)
floats = st.integers(-20, 40).map(lambda i: i / 4)
numbers = st.one_of(st.integers(-5, 10), floats)
num_values = st.one_of(st.just(MISSING), st.none(), numbers, numbers)
any_values = st.one_of(st.just(MISSING), st.none(), st.sampled_from(["x", "y", "z"]), numbers)


@st.composite
def windows(draw: st.DrawFn) -> ref.WindowDef:
    kind = draw(st.sampled_from(["tumbling", "sliding", "session"]))
    lateness = draw(st.one_of(st.just(0), st.integers(0, 15)))
    if kind == "tumbling":
        return ref.WindowDef(kind, size_ms=draw(st.integers(1, 30)), allowed_lateness_ms=lateness)
    if kind == "sliding":
        size = draw(st.integers(1, 30))
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        slide = draw(st.one_of(st.sampled_from(divisors), st.integers(1, size)))
        return ref.WindowDef(kind, size_ms=size, slide_ms=slide, allowed_lateness_ms=lateness)
    return ref.WindowDef(kind, gap_ms=draw(st.integers(1, 20)), allowed_lateness_ms=lateness)


@st.composite
def partition_records(
    draw: st.DrawFn, keys: list[Any], disorder: int, start: int, allow_empty: bool = True
) -> list[dict[str, Any] | None]:
    rows = draw(
        st.lists(
            st.tuples(
                st.integers(0, 9),  # 0 -> blank line
                st.sampled_from(keys),
                st.integers(0, 4),  # how far the "clock" advances
                st.integers(0, disorder),  # how far behind the clock this event is
                num_values,
                any_values,
            ),
            max_size=40,
        )
    )
    clock = start + draw(st.integers(0, 30))
    records: list[dict[str, Any] | None] = []
    for blank, k, step, behind, v, s in rows:
        if blank == 0:
            records.append(None)
            continue
        clock += step
        rec: dict[str, Any] = {"k": k, "ts": clock - behind}
        if v is not MISSING:
            rec["v"] = v
        if s is not MISSING:
            rec["s"] = s
        records.append(rec)
    if not allow_empty and all(r is None for r in records):
        records.append({"k": keys[0], "ts": clock})
    return records


@st.composite
def cases(draw: st.DrawFn, start: int = 20, allow_empty: bool = True) -> Case:
    """A random pipeline; ``allow_empty=False`` gives every partition a record."""
    n_parts = draw(st.integers(1, 3))
    keys = draw(st.lists(st.sampled_from(KEY_POOL), min_size=1, max_size=3, unique=True))
    disorder = draw(st.sampled_from([0, 3, 10, 25]))
    prefix = draw(st.sampled_from(["", "in/"]))
    partitions = []
    for i in range(n_parts):
        text = jsonl(draw(partition_records(keys, disorder, start, allow_empty)))
        if text and draw(st.booleans()):
            text = text[:-1]  # no final newline
        partitions.append((f"{prefix}p{i}.jsonl", text))
    exprs = draw(st.lists(st.sampled_from(AGG_EXPRS), min_size=1, max_size=5))
    return Case(
        partitions=partitions,
        window=draw(windows()),
        aggregates={f"a{i}": e for i, e in enumerate(exprs)},
        max_delay_ms=draw(st.one_of(st.just(0), st.integers(0, 20))),
        batch_size=draw(st.sampled_from(BATCH_SIZES)),
        checkpoint_every=draw(st.one_of(st.none(), st.integers(1, 20))),
        meaning=MEANING,
    )


text_values = st.one_of(st.just(MISSING), st.none(), st.sampled_from(["X", "y", "Z"]))
T_AGGS = ["count", "sum(v)", "count_distinct(s)", "approx_count_distinct(v)", "median(v)",
          "quantile(v, 0.9)", "stddev(v)", "variance(v)", "count_if(v > 1)"]
T_DERIVED_AGGS = {"w": ["sum(w)", "median(w)", "max(w)", "variance(w)"],
                  "u": ["first(u)", "count_distinct(u)", "approx_count_distinct(u)"]}


@st.composite
def transform_cases(draw: st.DrawFn) -> Case:
    """A random pipeline with a filter, derived fields, and maybe a derived key or time;
    ``s`` is text (or null) so that no expression fails."""
    case = draw(cases())
    parts = []
    for name, text in case.partitions:
        lines = []
        for line in text.split("\n"):
            if line.strip():
                rec = json.loads(line)
                s = draw(text_values)
                rec.pop("s", None)
                if s is not MISSING:
                    rec["s"] = s
                line = json.dumps(rec)
            lines.append(line)
        parts.append((name, "\n".join(lines)))
    case.partitions = parts
    derived = draw(st.lists(st.sampled_from(["w", "u"]), unique=True))
    case.fields = {"w": "v * 2", "u": "lower(s)"}
    case.fields = {n: t for n, t in case.fields.items() if n in derived}
    key_kind = draw(st.sampled_from(["k", "derived", "compound"]))
    if key_kind == "derived":
        case.fields["kk"] = "concat(k, '-x')"
        case.key = "kk"
    elif key_kind == "compound":  # each key field under its own name
        case.fields["g"] = "coalesce(s, 'none')"
        case.key = ["k", "g"]
    if draw(st.booleans()):
        case.fields["t2"] = "ts + 5"
        case.time = "t2"
    case.where = draw(st.sampled_from([None, "v > 2", "s = 'y' or v is null",
                                       "coalesce(v, 0) >= 0"]))
    pool = T_AGGS + [a for n in derived for a in T_DERIVED_AGGS[n]]
    exprs = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=5))
    case.aggregates = {f"a{i}": e for i, e in enumerate(exprs)}
    return case


@SETTINGS
@given(cases())
def test_engine_matches_reference(case: Case) -> None:
    assert_same_output(run_reference(case), run_engine(case), case)


@SETTINGS
@given(transform_cases())
def test_transforms_match_reference(case: Case) -> None:
    """Filters (after the watermark), derived fields, derived keys and times, and the
    newer aggregates: the engine agrees with the reference for every window kind."""
    assert_same_output(run_reference(case), run_engine(case), case)


@SETTINGS
@given(transform_cases(), st.sampled_from(BATCH_SIZES))
def test_transforms_do_not_depend_on_batch_size(case: Case, b: int) -> None:
    case.checkpoint_every = None
    first = run_engine(case)
    case.batch_size = b if b != case.batch_size else 1
    assert_same_output(first, run_engine(case), case)


@SETTINGS
@given(transform_cases(), st.sampled_from(BATCH_SIZES), st.data())
def test_records_that_break_an_expression_do_not_depend_on_the_batch(
        case: Case, b: int, data: st.DataObject) -> None:
    """Some values of v are strings, so ``v * 2``, ``v > 2`` and ``median(v)`` fail or
    do not fit on them: the same records are bad, and the same results come out, for any
    batch size (a batch is evaluated in groups of one value type each)."""
    from helpers import read_jsonl_dir, write_case

    parts = []
    for name, text in case.partitions:
        lines = []
        for line in text.split("\n"):
            if line.strip() and data.draw(st.integers(0, 4)) == 0:
                rec = json.loads(line)
                rec["v"] = data.draw(st.sampled_from(["x", "7", True, [1]]))
                line = json.dumps(rec)
            lines.append(line)
        parts.append((name, "\n".join(lines)))
    case.partitions, case.errors, case.checkpoint_every = parts, True, None
    from sealstream.cli import main

    outs = []
    for size in (case.batch_size, b if b != case.batch_size else 1):
        case.batch_size = size
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            assert main(["run", str(write_case(case, d)), "--quiet", "--max-bad-ratio", "1"]) == 0
            outs.append((Output(read_jsonl_dir(d / "out"), read_jsonl_dir(d / "late")),
                         sorted(json.dumps(r, sort_keys=True)
                                for r in read_jsonl_dir(d / "errors"))))
    assert_same_output(outs[0][0], outs[1][0], case)
    assert outs[0][1] == outs[1][1]


@SETTINGS
@given(cases(), st.sampled_from(BATCH_SIZES), st.sampled_from(BATCH_SIZES))
def test_batch_size_does_not_change_output(case: Case, b1: int, b2: int) -> None:
    case.batch_size, case.checkpoint_every = b1, None
    first = run_engine(case)
    case.batch_size = b2 if b2 != b1 else (1 if b1 != 1 else 64)
    second = run_engine(case)
    assert_same_output(first, second, case)


@SETTINGS
@given(cases(start=-60))
def test_negative_event_times(case: Case) -> None:
    assert_same_output(run_reference(case), run_engine(case), case)


EPOCH_2023 = 1_700_000_000_000


def iso(ms: int, style: int) -> str:
    """``ms`` as ISO-8601: style 0 with ``Z``, 1 without offset (UTC), else an offset."""
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    if style == 0:
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if style == 1:
        return dt.replace(tzinfo=None).isoformat(timespec="milliseconds")
    return dt.astimezone(timezone(timedelta(hours=style - 3))).isoformat(timespec="milliseconds")


@SETTINGS
@given(cases(), st.data())
def test_iso_times(case: Case, data: st.DataObject) -> None:
    """Some event times written as ISO-8601 strings (Z, no offset, other offsets)."""
    parts = []
    for name, text in case.partitions:
        lines = []
        for line in text.split("\n"):
            if line.strip():
                rec = json.loads(line)
                ms = EPOCH_2023 + rec["ts"]
                style = data.draw(st.integers(-1, 5))
                rec["ts"] = ms if style < 0 else iso(ms, style)
                line = json.dumps(rec)
            lines.append(line)
        parts.append((name, "\n".join(lines)))
    case.partitions = parts
    assert_same_output(run_reference(case), run_engine(case), case)


# ----------------------------------------------------- pinned examples (debugging aids)


def _ev(k: Any, t: int, **values: Any) -> dict[str, Any]:
    return {"k": k, "ts": t, **values}


def _res(k: Any, start: int, end: int, **aggs: Any) -> dict[str, Any]:
    return {"key": k, "window_start": start, "window_end": end, **aggs}


PINNED: dict[str, tuple[Case, Output]] = {
    # p0 is exhausted after its only record: before p1's t=5, W = min(+inf, 20) = 20
    "tumbling_exhausted_partition": (
        Case(
            partitions=[
                ("p0.jsonl", jsonl([_ev("a", 0, v=1)])),
                ("p1.jsonl", jsonl([_ev("a", 20, v=2.5), _ev("a", 5, v=3), _ev(1, 21, v=None)])),
            ],
            window=ref.WindowDef("tumbling", size_ms=10),
            aggregates={"n": "count", "s": "sum(v)", "m": "mean(v)", "f": "first(v)"},
        ),
        Output(
            results=[
                _res("a", 0, 10, n=1, s=1, m=1.0, f=1),
                _res("a", 20, 30, n=1, s=2.5, m=2.5, f=2.5),
                _res(1, 20, 30, n=1, s=None, m=None, f=None),
            ],
            late=[{"k": "a", "ts": 5, "v": 3, "_partition": "p1.jsonl", "_offset": 1}],
        ),
    ),
    # int + float sums, nulls, first/last ties by arrival
    "aggregates": (
        Case(
            partitions=[
                (
                    "p0.jsonl",
                    jsonl([_ev("a", 3, v=1), _ev("a", 1, v=None), _ev("a", 3, v=2), _ev("a", 2)])
                    + jsonl([_ev("b", 1, v=1), _ev("b", 2, v=2.0), _ev("b", 0, v=-0.5)]),
                )
            ],
            window=ref.WindowDef("tumbling", size_ms=100),
            aggregates={
                "n": "count",
                "s": "sum(v)",
                "lo": "min(v)",
                "hi": "max(v)",
                "m": "mean(v)",
                "f": "first(v)",
                "l": "last(v)",
            },
            max_delay_ms=50,
        ),
        Output(
            results=[
                _res("a", 0, 100, n=4, s=3, lo=1, hi=2, m=1.5, f=1, l=2),
                _res("b", 0, 100, n=3, s=2.5, lo=-0.5, hi=2.0, m=2.5 / 3, f=-0.5, l=2.0),
            ],
            late=[],
        ),
    ),
    # slide 4 does not divide size 10; windows may start before 0
    "sliding": (
        Case(
            partitions=[("p0.jsonl", jsonl([_ev("a", 1), None, _ev("a", 8)]))],
            window=ref.WindowDef("sliding", size_ms=10, slide_ms=4),
            aggregates={"n": "count"},
        ),
        Output(
            results=[
                _res("a", -8, 2, n=1),
                _res("a", -4, 6, n=1),
                _res("a", 0, 10, n=2),
                _res("a", 4, 14, n=1),
                _res("a", 8, 18, n=1),
            ],
            late=[],
        ),
    ),
    # [0,5) and [10,15) are bridged by t=5 into [0,15)
    "session_bridge": (
        Case(
            partitions=[("p0.jsonl", jsonl([_ev("a", 0), _ev("a", 10), _ev("a", 5)]))],
            window=ref.WindowDef("session", gap_ms=5),
            aggregates={"n": "count"},
            max_delay_ms=100,
        ),
        Output(results=[_res("a", 0, 15, n=3)], late=[]),
    ),
    # b@5 moves W to 5: a's [0,5) fires (5 >= 5 + 0); a@5 opens a new session
    "session_fired_not_reopened": (
        Case(
            partitions=[("p0.jsonl", jsonl([_ev("a", 0), _ev("b", 5), _ev("a", 5), _ev("a", 1)]))],
            window=ref.WindowDef("session", gap_ms=5),
            aggregates={"n": "count"},
        ),
        Output(
            results=[_res("a", 0, 5, n=1), _res("a", 1, 10, n=2), _res("b", 5, 10, n=1)],
            late=[],
        ),
    ),
    # p0 holds no record, so it is exhausted from the start (W_p0 = +inf):
    # before p1's t=19, W = min(+inf, 20) = 20 and [19,20) is late
    "empty_partition_is_exhausted": (
        Case(
            partitions=[("p0.jsonl", ""), ("p1.jsonl", jsonl([_ev("a", 20), _ev("a", 19)]))],
            window=ref.WindowDef("tumbling", size_ms=1),
            aggregates={"n": "count"},
        ),
        Output(
            results=[_res("a", 20, 21, n=1)],
            late=[{"k": "a", "ts": 19, "_partition": "p1.jsonl", "_offset": 1}],
        ),
    ),
    # W = 20: y@15 -> [15,20), 20 <= 20 late; y@16 -> [16,21) on time
    "session_lateness_boundary": (
        Case(
            partitions=[("p0.jsonl", jsonl([_ev("x", 20), _ev("y", 15), _ev("y", 16)]))],
            window=ref.WindowDef("session", gap_ms=5),
            aggregates={"n": "count"},
        ),
        Output(
            results=[_res("x", 20, 25, n=1), _res("y", 16, 21, n=1)],
            late=[{"k": "y", "ts": 15, "_partition": "p0.jsonl", "_offset": 1}],
        ),
    ),
}


def test_pinned_examples_reference() -> None:
    for name, (case, expected) in PINNED.items():
        try:
            assert_same_output(expected, run_reference(case), case)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


@pytest.mark.parametrize("name", sorted(PINNED))
@pytest.mark.parametrize("batch_size", [1, 64])
def test_pinned_examples_engine(name: str, batch_size: int, tmp_path: Path) -> None:
    case, expected = PINNED[name]
    case = replace(case, batch_size=batch_size)
    assert_same_output(expected, run_engine(case, tmp_path), case)
