"""JSONL partitions: offsets, typing per value, bad records, chunking, positions."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from _files import PLAN, LineFormat
from _helpers import read_chunks, with_raw
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.errors import SourceChangedError, SourceError
from sealstream.sources import (
    BAD_SCHEMA,
    FieldPlan,
    PartitionPosition,
    float_col,
    int_col,
    json_col,
    open_partition,
)
from sealstream.sources.files.jsonl import JsonlReader

JSONL = LineFormat(JsonlReader, "p.jsonl")
read_all, write = JSONL.read_all, JSONL.write


def ms(dt: datetime) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


# -- offsets, blank lines, eof -----------------------------------------------------------


def test_offsets_count_blank_lines_and_crlf(tmp_path: Path) -> None:
    text = '{"user":"a","ts":1}\r\n\n   \t \r\n{"user":"b","ts":2}\n\r\n  {"user":"c","ts":3}  \n'
    events, bad, chunks = read_all(write(tmp_path, text), chunk=1)
    assert events["__off"].to_list() == [0, 3, 5]
    assert events["__raw"].to_list() == [
        '{"user":"a","ts":1}',
        '{"user":"b","ts":2}',
        '  {"user":"c","ts":3}  ',
    ]
    assert bad.height == 0
    assert [c.eof for c in chunks] == [False, False, True]
    assert [c.last_offset for c in chunks] == [0, 3, 5]
    assert chunks[-1].position.byte_offset == len(text.encode())
    assert chunks[-1].position.offset == 6


@pytest.mark.parametrize("chunk", [1, 2, 10])
def test_a_byte_order_mark_opening_the_file_is_skipped(tmp_path: Path, chunk: int) -> None:
    """Some Windows tools open every text file with a UTF-8 BOM: line 1 is its record
    (as a CSV header is), offsets and resuming are unchanged; a BOM anywhere else stays
    part of its line (a bad record there)."""
    body = '{"user":"a","ts":1}\n{"user":"b","ts":2}\n\ufeff{"user":"c","ts":3}\n'
    path = write(tmp_path, b"\xef\xbb\xbf" + body.encode())
    events, bad, chunks = read_all(path, chunk=chunk)
    assert events["__off"].to_list() == [0, 1]
    assert events["__raw"].to_list() == ['{"user":"a","ts":1}', '{"user":"b","ts":2}']
    assert bad["_offset"].to_list() == [2]
    assert chunks[-1].position.byte_offset == len(body.encode()) + 3
    # resuming after the first record, and from the very start, reads the same
    first = next(c for c in chunks if c.last_offset is not None and c.last_offset >= 0)
    if first.last_offset == 0:
        rest, _, _ = read_all(path, chunk=chunk, position=first.position)
        assert rest["__off"].to_list() == [1]
    again, _, _ = read_all(path, chunk=chunk, position=PartitionPosition())
    assert again["__off"].to_list() == [0, 1]


def test_eof_on_last_record_with_trailing_blank_lines(tmp_path: Path) -> None:
    text = '{"user":"a","ts":1}\n{"user":"b","ts":2}\n\n  \n\n'
    _, _, chunks = read_all(write(tmp_path, text), chunk=2)
    assert len(chunks) == 1
    assert chunks[0].eof and chunks[0].last_offset == 1
    assert chunks[0].position.offset == 5
    assert chunks[0].position.byte_offset == len(text)


def test_eof_without_trailing_newline(tmp_path: Path) -> None:
    text = '{"user":"a","ts":1}\n{"user":"b","ts":2}'
    events, _, chunks = read_all(write(tmp_path, text), chunk=1)
    assert [c.eof for c in chunks] == [False, True]
    assert events["__raw"].to_list()[-1] == '{"user":"b","ts":2}'
    assert chunks[-1].position == PartitionPosition(2, len(text), chunks[-1].position.identity)


@pytest.mark.parametrize("text", ["", "\n", "  \n\r\n\t", "\n\n\n"])
def test_empty_or_blank_file_gives_one_empty_eof_chunk(tmp_path: Path, text: str) -> None:
    reader = open_partition("jsonl", "p", write(tmp_path, text), PLAN)
    try:
        chunk = reader.next_chunk(10)
        assert chunk is not None
        assert chunk.eof and chunk.last_offset is None
        assert chunk.events.schema == PLAN.event_schema()
        assert chunk.bad.schema == BAD_SCHEMA
        assert reader.next_chunk(10) is None
    finally:
        reader.close()


def test_chunk_never_exceeds_max_records(tmp_path: Path) -> None:
    lines = [json.dumps({"user": f"u{i}", "ts": i}) if i % 3 else "not json" for i in range(50)]
    text = "\n\n".join(lines) + "\n"
    for n in (1, 2, 3, 7, 50, 1000):
        events, bad, chunks = read_all(write(tmp_path, text), chunk=n)
        assert all(c.events.height + c.bad.height <= n for c in chunks)
        assert events.height + bad.height == 50
        assert sum(c.eof for c in chunks) == 1 and chunks[-1].eof


def test_missing_file_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="nope.jsonl"):
        open_partition("jsonl", "nope.jsonl", tmp_path / "nope.jsonl", PLAN)


# -- bad records ---------------------------------------------------------------------------

BAD_CASES = [
    ("{not json", "invalid JSON"),
    ('{"user":"a","ts":1,}', "invalid JSON"),
    ('{"user":"a","ts":NaN}', "invalid JSON"),
    ("[1, 2]", "record is not a JSON object"),
    ("3", "record is not a JSON object"),
    ('"text"', "record is not a JSON object"),
    ("null", "record is not a JSON object"),
    ('{"ts":1}', "missing key field 'user'"),
    ('{"user":null,"ts":1}', "missing key field 'user'"),
    ('{"user":"a"}', "missing time field 'ts'"),
    ('{"user":"a","ts":null}', "missing time field 'ts'"),
    ('{"user":"a","ts":1.5}', "time field 'ts' is not an integer or ISO-8601 string: 1.5"),
    ('{"user":"a","ts":true}', "time field 'ts' is not an integer or ISO-8601 string: true"),
    (
        '{"user":"a","ts":"yesterday"}',
        "time field 'ts' is not an integer or ISO-8601 string: \"yesterday\"",
    ),
    ('{"user":"a","ts":"1000"}', "time field 'ts' is not an integer or ISO-8601 string: \"1000\""),
    ('{"user":"a","ts":"2024-02-30"}', "time field 'ts' is not an integer or ISO-8601 string"),
    ('{"user":"a","ts":{"a":1}}', "time field 'ts' is not an integer or ISO-8601 string"),
    ('{"user":"a","ts":1,"amount":"abc"}', "non-numeric value in field 'amount': \"abc\""),
    ('{"user":"a","ts":1,"amount":"12"}', "non-numeric value in field 'amount': \"12\""),
    ('{"user":"a","ts":1,"amount":true}', "non-numeric value in field 'amount': true"),
    ('{"user":"a","ts":1,"amount":[1]}', "non-numeric value in field 'amount'"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_CASES)
def test_bad_record_reasons(tmp_path: Path, line: str, reason: str) -> None:
    text = f'{{"user":"ok","ts":5}}\n\n{line}\n{{"user":"ok2","ts":6}}\n'
    events, bad, _ = read_all(write(tmp_path, text))
    assert events["__off"].to_list() == [0, 3]
    assert bad.schema == BAD_SCHEMA
    assert bad.rows() == [(2, 3, bad["_reason"][0], line)]
    assert bad["_reason"][0].startswith(reason), bad["_reason"][0]


def test_invalid_utf8_line_is_bad_and_others_survive(tmp_path: Path) -> None:
    text = b'{"user":"a","ts":1}\n{"user":"\xff","ts":2}\n{"user":"\xc3\xa9","ts":3}\n'
    events, bad, _ = read_all(write(tmp_path, text))
    assert events["__key"].to_list() == ["a", "é"]
    assert bad["_offset"].to_list() == [1]
    assert "UTF-8" in bad["_reason"][0]


def test_strings_are_allowed_in_any_fields(tmp_path: Path) -> None:
    text = (
        '{"user":"a","ts":1,"x":"abc"}\n'
        '{"user":"a","ts":2,"x":"q\\"uote\\u00e9"}\n'
        '{"user":"a","ts":3,"x":true}\n'
        '{"user":"a","ts":4,"x":{"a":1}}\n'
        '{"user":"a","ts":5,"x":7}\n'
        '{"user":"a","ts":6,"x":null}\n'
        '{"user":"a","ts":7,"x":"12"}\n'
    )
    events, bad, _ = read_all(write(tmp_path, text))
    assert bad.height == 0
    s = events[json_col("x")].to_list()
    assert s[0] == '"abc"'
    assert json.loads(s[1]) == 'q"uoteé'
    assert s[2] == "true"
    assert json.loads(s[3]) == {"a": 1}
    assert s[4:6] == [None, None]
    assert s[6] == '"12"'
    assert events[int_col("x")].to_list() == [None, None, None, None, 7, None, None]


# -- typing per value -----------------------------------------------------------------------


def test_int_and_float_are_told_apart_per_value(tmp_path: Path) -> None:
    values = ["2", "2.0", "2.5", "1e3", "-0", "-7", "1E2", "9007199254740993", "0.10"]
    text = "".join(f'{{"user":"a","ts":{i},"amount":{v}}}\n' for i, v in enumerate(values))
    events, bad, _ = read_all(write(tmp_path, text))
    assert bad.height == 0
    assert events[int_col("amount")].to_list() == [
        2,
        None,
        None,
        None,
        0,
        -7,
        None,
        9007199254740993,
        None,
    ]
    assert events[float_col("amount")].to_list() == [
        None,
        2.0,
        2.5,
        1000.0,
        None,
        None,
        100.0,
        None,
        0.1,
    ]


def test_ints_mixed_with_strings_in_one_column(tmp_path: Path) -> None:
    text = (
        '{"user":"a","ts":1,"x":1}\n'
        '{"user":"b","ts":2,"x":"1"}\n'
        '{"user":"c","ts":3,"x":2.0}\n'
        '{"user":"d","ts":4,"x":"s"}\n'
    )
    events, _, _ = read_all(write(tmp_path, text))
    assert events[int_col("x")].to_list() == [1, None, None, None]
    assert events[float_col("x")].to_list() == [None, None, 2.0, None]
    assert events[json_col("x")].to_list() == [None, '"1"', None, '"s"']


def test_key_types(tmp_path: Path) -> None:
    keys = ['"u1"', "12", '"12"', "2.50", "true", "-0", "18446744073709551616"]
    text = "".join(f'{{"user":{k},"ts":1}}\n' for k in keys)
    events, bad, _ = read_all(write(tmp_path, text))
    assert bad.height == 0
    assert events["__key"].to_list() == [
        "u1",
        "12",
        "12",
        "2.50",
        "true",
        "0",
        "18446744073709551616",
    ]
    assert events["__kint"].to_list() == [False, True, False, False, False, True, False]


def test_integral_float_time_is_accepted(tmp_path: Path) -> None:
    text = '{"user":"a","ts":1000.0}\n{"user":"a","ts":-5}\n{"user":"a","ts":1e3}\n'
    events, bad, _ = read_all(write(tmp_path, text))
    assert bad.height == 0
    assert events["__t"].to_list() == [1000, -5, 1000]


def test_field_name_repeated_in_a_nested_object(tmp_path: Path) -> None:
    text = (
        '{"meta":{"amount":"x"},"user":"a","ts":1,"amount":2}\n'
        '{"user":"b","ts":2,"amount":3.0,"meta":{"amount":4}}\n'
        '{"user":"c","ts":3,"amount":4.5}\n'
    )
    events, bad, _ = read_all(write(tmp_path, text))
    assert bad.height == 0
    assert events[int_col("amount")].to_list() == [2, None, None]
    assert events[float_col("amount")].to_list() == [None, 3.0, 4.5]


ISO_CASES = [
    "2024-03-05T06:07:08Z",
    "2024-03-05T06:07:08.123Z",
    "2024-03-05T06:07:08.123456+05:30",
    "2024-03-05T06:07:08-08:00",
    "2024-03-05T06:07:08.9-0800",
    "2024-03-05T06:07:08+01",
    "2024-03-05T06:07",
    "2024-03-05 06:07:08",
    "2024-03-05",
    "2024-02-29T23:59:59.999Z",
    "1969-12-31T23:59:59.5Z",
    "2000-01-01T00:00:00+00:00",
    "1900-03-01",
    "9999-12-31T23:59:59Z",
]


def reference_ms(text: str) -> int:
    m = re.fullmatch(
        r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?"
        r"(Z|[+-]\d{2}(?::?\d{2})?)?)?",
        text,
    )
    assert m, text
    y, mo, d, h, mi, s, frac, tz = m.groups()
    micro = int((frac or "0")[:6].ljust(6, "0"))
    dt = datetime(
        int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0), micro, tzinfo=UTC
    )
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        dt -= sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    return ms(dt)


def test_iso_8601_times_match_python_datetime(tmp_path: Path) -> None:
    text = "".join(f'{{"user":"a","ts":"{t}"}}\n' for t in ISO_CASES)
    events, bad, _ = read_all(write(tmp_path, text))
    assert bad.height == 0, bad["_reason"].to_list()
    assert events["__t"].to_list() == [reference_ms(t) for t in ISO_CASES]
    # the reference itself agrees with datetime.fromisoformat where that applies
    for t in ISO_CASES:
        expected = datetime.fromisoformat(t.replace("Z", "+00:00"))
        assert reference_ms(t) == ms(expected)


@pytest.mark.parametrize(
    "bad_time",
    [
        "2024-13-01",
        "2024-00-10",
        "2023-02-29",
        "2024-04-31",
        "2024-01-01T24:00",
        "2024-01-01T10:60",
        "2024-01-01T10:00:61",
        "2024-1-01",
        "20240101",
        "2024-01-01T10",
        "2024-01-01T10:00+24:00",
        "2024-01-01Z",
        "0000-01-01",
        " 2024-01-01",
    ],
)
def test_invalid_iso_strings_are_bad(tmp_path: Path, bad_time: str) -> None:
    events, bad, _ = read_all(write(tmp_path, json.dumps({"user": "a", "ts": bad_time}) + "\n"))
    assert events.height == 0
    assert bad["_reason"][0].startswith("time field 'ts' is not an integer or ISO-8601 string")


# -- chunking and blocks never change results ------------------------------------------------

KEY_TOKENS = ['"u1"', '"12"', "12", "-3", "2.50", "true", "null", "18446744073709551616", None]
TIME_TOKENS = [
    "1000",
    "-5",
    "1000.0",
    "1.5",
    "true",
    "null",
    '"1000"',
    '"2024-01-02T03:04:05.678+02:00"',
    '"2024-01-02"',
    '"2024-02-30"',
    '"x"',
    "{}",
    "9223372036854775808",
    None,
]
VALUE_TOKENS = [
    "2",
    "2.0",
    "2.5",
    "1e3",
    "-0",
    '"abc"',
    '"12"',
    "true",
    "false",
    "null",
    '{"a":[1,2]}',
    "[1]",
    "123456789012345678901",
    None,
]
JUNK = ["{oops", "[1,2]", "42", '"s"', "", "   ", "\t"]


def classify(tok: str) -> tuple[str, Any]:
    v = json.loads(tok)
    if v is None:
        return "null", None
    if isinstance(v, bool):
        return "bool", tok
    if isinstance(v, int):
        return ("int", v) if -(2**63) <= v < 2**63 else ("float", float(v))
    if isinstance(v, float):
        return "float", v
    if isinstance(v, str):
        return "str", v
    return "other", v


def reference(lines: list[str], plan: FieldPlan) -> tuple[dict[int, Any], dict[int, str]]:
    """A per-record Python model of the typing rules: events and bad reasons."""
    events: dict[int, Any] = {}
    bad: dict[int, str] = {}
    for off, line in enumerate(lines):
        if line.strip(" \t\r") == "":
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad[off] = "invalid JSON"
            continue
        if not isinstance(obj, dict):
            bad[off] = "record is not a JSON object"
            continue
        toks = tokens_of[line]
        kk = classify(toks[plan.key]) if plan.key in toks else ("null", None)
        kt = classify(toks[plan.time]) if plan.time in toks else ("null", None)
        if kk[0] == "null":
            bad[off] = "missing key field"
            continue
        if kt[0] == "null":
            bad[off] = "missing time field"
            continue
        t = None
        if kt[0] == "int":
            t = kt[1]
        elif (
            kt[0] == "float"
            and math.isfinite(kt[1])
            and kt[1] == int(kt[1])
            and abs(kt[1]) < 9.2e18
        ):
            t = int(kt[1])
        elif kt[0] == "str" and re.fullmatch(r"\d{4}-\d{2}-\d{2}.*", kt[1]):
            try:
                datetime.fromisoformat(kt[1])
                t = reference_ms(kt[1])
            except ValueError:
                t = None
        if t is None:
            bad[off] = "time field"
            continue
        row: dict[str, Any] = {"t": t, "kint": kk[0] == "int"}
        if kk[0] == "int":
            row["key"] = str(kk[1])
        elif kk[0] == "str":
            row["key"] = kk[1]
        else:
            row["key"] = toks[plan.key]
        reason = None
        for name in sorted(plan.fields):
            kind, v = classify(toks[name]) if name in toks else ("null", None)
            row[f"i:{name}"] = v if kind == "int" else None
            row[f"f:{name}"] = v if kind == "float" else None
            if plan.fields[name] == "numeric" and kind in ("str", "bool", "other"):
                reason = reason or "non-numeric value"
            if plan.fields[name] == "any":
                row[f"s:{name}"] = (
                    None if kind in ("null", "int", "float") else json.loads(toks[name])
                )
        if reason:
            bad[off] = reason
        else:
            events[off] = row
    return events, bad


tokens_of: dict[str, dict[str, str]] = {}


@st.composite
def jsonl_lines(draw: st.DrawFn) -> list[str]:
    n = draw(st.integers(0, 40))
    lines = []
    for _ in range(n):
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.sampled_from(JUNK)))
            continue
        fields = {
            "user": draw(st.sampled_from(KEY_TOKENS)),
            "ts": draw(st.sampled_from(TIME_TOKENS)),
            "amount": draw(st.sampled_from(VALUE_TOKENS)),
            "x": draw(st.sampled_from(VALUE_TOKENS)),
        }
        toks = {k: v for k, v in fields.items() if v is not None}
        parts = [f'"{k}":{v}' for k, v in toks.items()]
        if draw(st.booleans()):
            parts.insert(draw(st.integers(0, len(parts))), '"meta":{"amount":"n","x":1}')
        parts = draw(st.permutations(parts))
        sep = draw(st.sampled_from([",", ", ", " , "]))
        line = "{" + sep.join(parts) + "}"
        if draw(st.booleans()):
            line += "\r"
        tokens_of[line] = toks
        tokens_of[line.rstrip("\r")] = toks
        lines.append(line)
    return lines


def frames_to_rows(events: pl.DataFrame, plan: FieldPlan) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for r in events.iter_rows(named=True):
        row: dict[str, Any] = {"t": r["__t"], "kint": r["__kint"], "key": r["__key"]}
        for name in sorted(plan.fields):
            row[f"i:{name}"] = r[int_col(name)]
            row[f"f:{name}"] = r[float_col(name)]
            if plan.fields[name] == "any":
                s = r[json_col(name)]
                row[f"s:{name}"] = None if s is None else json.loads(s)
        out[r["__off"]] = row
    return out


@settings(max_examples=40, deadline=None)
@given(
    lines=jsonl_lines(),
    chunk=st.integers(1, 7),
    block=st.integers(1, 300),
    trailing_newline=st.booleans(),
)
def test_chunking_never_changes_results_and_matches_a_reference(
    lines: list[str], chunk: int, block: int, trailing_newline: bool
) -> None:
    text = "\n".join(lines) + ("\n" if trailing_newline and lines else "")
    ev, bad, whole_chunks, chunks = JSONL.read_both_ways(text, chunk, block)
    assert chunks[-1].position.offset == whole_chunks[-1].position.offset
    expected_events, expected_bad = reference(text.split("\n"), PLAN)
    assert frames_to_rows(ev, PLAN) == expected_events
    got_bad = dict(zip(bad["_offset"].to_list(), bad["_reason"].to_list(), strict=True))
    assert set(got_bad) == set(expected_bad)
    for off, reason in got_bad.items():
        assert reason.startswith(expected_bad[off]) or expected_bad[off] in reason, (off, reason)
    assert bad["_line"].to_list() == [o + 1 for o in bad["_offset"].to_list()]
    lines_of = text.split("\n")
    assert bad["_raw"].to_list() == [
        lines_of[o].removesuffix("\r") for o in bad["_offset"].to_list()
    ]
    assert ev["__raw"].to_list() == [lines_of[o].removesuffix("\r") for o in ev["__off"].to_list()]


def test_types_widen_across_blocks(tmp_path: Path) -> None:
    """Blocks first see ints, then floats, then strings: results stay per value."""
    lines = [f'{{"user":{i},"ts":{i},"amount":{i}}}' for i in range(50)]
    lines += [f'{{"user":"{i}","ts":"2024-01-01","amount":{i}.5}}' for i in range(50)]
    lines += [f'{{"user":{i}.0,"ts":{i}.0,"amount":"{i}","x":{i}}}' for i in range(50)]
    text = "\n".join(lines) + "\n"
    path = write(tmp_path, text)
    plan = FieldPlan("user", "ts", {"amount": "any", "x": "numeric"})
    whole, whole_bad, _ = read_all(path, plan)
    for block in (64, 700, 5000):
        ev, bad, _ = read_all(path, plan, chunk=13, block_bytes=block)
        assert ev.equals(whole) and bad.equals(whole_bad)
    assert whole_bad.height == 0
    assert whole["__kint"].to_list() == [True] * 50 + [False] * 100
    assert whole["__key"][120] == "20.0"
    assert whole[int_col("amount")].to_list()[:50] == list(range(50))
    assert whole[float_col("amount")].to_list()[50:100] == [i + 0.5 for i in range(50)]
    assert whole[json_col("amount")].to_list()[100:] == [f'"{i}"' for i in range(50)]


# -- positions and identity --------------------------------------------------------------------


def sample_text(n: int = 30) -> str:
    out = []
    for i in range(n):
        out.append(json.dumps({"user": f"u{i % 4}", "ts": 1000 + i, "amount": i / 2}))
        if i % 5 == 0:
            out.append("")
        if i % 7 == 0:
            out.append("oops")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("stop_after", [1, 3, 6, 11])
def test_resume_from_a_position_equals_continuing(tmp_path: Path, stop_after: int) -> None:
    path = write(tmp_path, sample_text())
    whole_ev, whole_bad, _ = read_all(path, chunk=4)
    _, _, first = read_all(path, chunk=4)
    head = first[:stop_after]
    pos = PartitionPosition.from_json(json.loads(json.dumps(head[-1].position.to_json())))
    rest_ev, rest_bad, _ = read_all(path, chunk=3, position=pos)
    ev = pl.concat([with_raw(c) for c in head] + [rest_ev])
    bad = pl.concat([c.bad for c in head] + [rest_bad])
    assert ev.equals(whole_ev)
    assert bad.equals(whole_bad)


def test_resume_at_end_gives_an_empty_eof_chunk(tmp_path: Path) -> None:
    path = write(tmp_path, sample_text(5))
    _, _, chunks = read_all(path)
    ev, bad, again = read_all(path, position=chunks[-1].position)
    assert len(again) == 1 and again[0].eof and again[0].last_offset is None
    assert again[0].position == chunks[-1].position


def test_truncated_file_is_detected(tmp_path: Path) -> None:
    text = sample_text()
    path = write(tmp_path, text)
    _, _, chunks = read_all(path, chunk=5)
    pos = chunks[2].position
    path.write_bytes(text.encode()[: pos.byte_offset - 10])
    with pytest.raises(
        SourceChangedError, match=r"p\.jsonl.*shorter.*replay from an earlier position"
    ):
        open_partition("jsonl", str(path), path, PLAN, pos)


def test_replaced_file_is_detected(tmp_path: Path) -> None:
    text = sample_text()
    path = write(tmp_path, text)
    _, _, chunks = read_all(path, chunk=5)
    pos = chunks[2].position
    path.write_bytes(text.replace("u1", "v1").encode())  # same length, other bytes
    with pytest.raises(SourceChangedError, match="differ"):
        open_partition("jsonl", "p.jsonl", path, PLAN, pos)
    rotated = sample_text(60)[::-1]
    path.write_text(rotated)
    with pytest.raises(SourceChangedError):
        open_partition("jsonl", "p.jsonl", path, PLAN, pos)


def test_append_after_a_checkpoint_continues(tmp_path: Path) -> None:
    text = sample_text(10)
    path = write(tmp_path, text)
    _, _, chunks = read_all(path)
    pos = chunks[-1].position
    extra = '\n{"user":"new","ts":5}\n'
    path.write_text(text + extra)
    ev, bad, rest = read_all(path, position=pos)
    full_ev, _, _ = read_all(path)
    assert ev["__off"].to_list() == [full_ev["__off"][-1]] == [pos.offset + 1]
    assert rest[-1].eof


def test_append_to_a_file_without_trailing_newline(tmp_path: Path) -> None:
    path = write(tmp_path, '{"user":"a","ts":1}\n{"user":"b","ts":2}')
    _, _, chunks = read_all(path)
    pos = chunks[-1].position
    assert pos.offset == 2
    path.write_text('{"user":"a","ts":1}\n{"user":"b","ts":2}\n{"user":"c","ts":3}\n')
    ev, _, _ = read_all(path, position=pos)
    assert ev["__off"].to_list() == [2]
    assert ev["__key"].to_list() == ["c"]


def test_size_hint_tracks_consumption(tmp_path: Path) -> None:
    text = sample_text()
    path = write(tmp_path, text)
    reader = open_partition("jsonl", "p", path, PLAN)
    try:
        assert reader.size_hint() == (0, len(text))
        chunk = reader.next_chunk(3)
        assert chunk is not None
        assert reader.size_hint() == (chunk.position.byte_offset, len(text))
        while (c := reader.next_chunk(100)) is not None:
            chunk = c
        assert reader.size_hint() == (len(text), len(text))
    finally:
        reader.close()


# -- a final line without a newline --------------------------------------------------------


def test_a_half_written_last_line_that_grew_is_refused_on_resume(tmp_path: Path) -> None:
    """A bounded run reads the line being written when the file was opened as it
    was (here a bad record). Resuming after the file grew must not read the rest
    of that line as if it were a new one: the record was read incomplete."""
    path = write(tmp_path, '{"user":"a","ts":1}\n{"user":"b","ts":2,"amo')
    _, bad, chunks = read_all(path)
    assert bad["_offset"].to_list() == [1]  # half a line: a bad record
    pos = chunks[-1].position
    path.write_text('{"user":"a","ts":1}\n{"user":"b","ts":2,"amount":5}\n{"user":"c","ts":3}\n')
    with pytest.raises(SourceChangedError, match=r"p\.jsonl.*had no newline when it was read"
                                                 r" and has grown since.*read incomplete"):
        open_partition("jsonl", "p.jsonl", path, PLAN, pos)


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_a_complete_last_line_whose_newline_came_later_resumes_exactly(
    tmp_path: Path, eol: str
) -> None:
    head = '{"user":"a","ts":1}\n{"user":"b","ts":2}'
    path = write(tmp_path, head)
    _, _, chunks = read_all(path)
    pos = chunks[-1].position
    path.write_text(head + eol + '{"user":"c","ts":3}' + eol)
    ev, bad, _ = read_all(path, position=pos)
    assert ev["__key"].to_list() == ["c"] and ev["__off"].to_list() == [2]
    assert bad.height == 0


def test_a_reader_that_waits_never_reads_an_unterminated_last_line(tmp_path: Path) -> None:
    """``read_unterminated=False`` (a file still being written): the last line
    without a newline stays unread, the position at its start; once complete it
    is read whole, exactly once."""
    done = '{"user":"a","ts":1}\n\n{"user":"b","ts":2}\n'
    path = write(tmp_path, done + '{"user":"c","ts":3,"amo')

    def read_waiting(position: PartitionPosition | None) -> tuple[pl.DataFrame, list[Any]]:
        reader = JsonlReader("p.jsonl", path, PLAN, position, block_bytes=16,
                             read_unterminated=False)
        ev, bad, chunks = read_chunks(reader, 1)
        assert bad.height == 0
        return ev, chunks

    ev, chunks = read_waiting(None)
    assert ev["__key"].to_list() == ["a", "b"]
    pos = chunks[-1].position
    assert (pos.offset, pos.byte_offset) == (3, len(done))
    path.write_text(done + '{"user":"c","ts":3,"amount":4}\n{"user":"d","ts":5}')
    ev, chunks = read_waiting(pos)
    assert ev["__key"].to_list() == ["c"] and ev["__off"].to_list() == [3]
    assert ev[float_col("amount")].to_list() + ev[int_col("amount")].to_list() in (
        [None, 4], [4.0, None])
    assert chunks[-1].position.offset == 4  # "d" has no newline yet: it waits


# -- lone surrogate escapes ----------------------------------------------------------------


@pytest.mark.parametrize(("line", "field"), [
    (r'{"user": "\ud800u01944", "ts": 1}', "user"),  # polars reads "\u0000u01944"
    (r'{"user": "a\udc00b", "ts": 1}', "user"),
    (r'{"user": "\ud800\ud800\udc00", "ts": 1}', "user"),
    (r'{"user": "a", "ts": 1, "x": "\ud800"}', "x"),
    (r'{"user": "a", "ts": 1, "x": {"y": ["\uDFFF"]}}', "x"),
])
def test_a_lone_surrogate_in_a_read_field_is_a_bad_record(
    tmp_path: Path, line: str, field: str
) -> None:
    """Never a key (or value) changed silently: the record is bad, with a reason."""
    ok = '{"user": "b", "ts": 2}'
    events, bad, _ = read_all(write(tmp_path, f"{ok}\n{line}\n{ok}\n"))
    assert events["__key"].to_list() == ["b", "b"]
    assert bad.rows() == [(1, 2, f"field {field!r} holds a lone surrogate escape (\\ud800-\\udfff "
                           "without its pair), which is not a Unicode character", line)]


@pytest.mark.parametrize(("line", "key"), [
    (r'{"user": "\ud83d\ude00", "ts": 1}', "\U0001f600"),  # a pair: one character
    (r'{"user": "\\ud800", "ts": 1}', "\\ud800"),  # an escaped backslash: plain text
    (r'{"user": "a", "ts": 1, "other": "\ud800"}', "a"),  # a field no one reads
])
def test_surrogate_pairs_and_look_alikes_are_kept_exactly(
    tmp_path: Path, line: str, key: str
) -> None:
    events, bad, _ = read_all(write(tmp_path, line + "\n"))
    assert bad.height == 0
    assert events["__key"].to_list() == [key] and events["__raw"].to_list() == [line]
