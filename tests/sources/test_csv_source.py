"""CSV partitions: header, quoting, offsets, text typing, chunking, positions."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import polars as pl
import pytest
from _files import PLAN, LineFormat
from _helpers import with_raw
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.errors import SourceChangedError
from sealstream.sources import (
    BAD_SCHEMA,
    float_col,
    int_col,
    json_col,
    open_partition,
)
from sealstream.sources.files.csv import CsvReader

CSV = LineFormat(CsvReader, "p.csv")
read_all, write = CSV.read_all, CSV.write


def test_header_quotes_offsets_and_raw(tmp_path: Path) -> None:
    text = (
        'user,ts,amount,x\r\na,1000,2,s\r\n\r\n"b,c",2000,2.5,"two\nlines"\nd,3000,,"say ""hi"""\n'
    )
    events, bad, chunks = read_all(write(tmp_path, text), chunk=1)
    assert bad.height == 0
    assert events["__off"].to_list() == [0, 2, 4]
    assert events["__key"].to_list() == ["a", "b,c", "d"]
    assert events["__kint"].to_list() == [False, False, False]
    assert events["__t"].to_list() == [1000, 2000, 3000]
    assert events[int_col("amount")].to_list() == [2, None, None]
    assert events[float_col("amount")].to_list() == [None, 2.5, None]
    assert events[json_col("x")].to_list() == ['"s"', '"two\\nlines"', '"say \\"hi\\""']
    assert [json.loads(r) for r in events["__raw"].to_list()] == [
        {"user": "a", "ts": "1000", "amount": "2", "x": "s"},
        {"user": "b,c", "ts": "2000", "amount": "2.5", "x": "two\nlines"},
        {"user": "d", "ts": "3000", "amount": "", "x": 'say "hi"'},
    ]
    assert [c.eof for c in chunks] == [False, False, True]
    assert chunks[-1].position.byte_offset == len(text)


def test_text_typing(tmp_path: Path) -> None:
    rows = [
        ("12", "-5", "1e3", "true"),
        ("a", "2024-01-01T00:00:00+01:00", "+7", "-0.5"),
        ("b", "2024-01-01", ".5", ""),
        ("c", "7", "007", "{}"),
    ]
    text = "user,ts,amount,x\n" + "".join(",".join(r) + "\n" for r in rows)
    events, bad, _ = read_all(write(tmp_path, text))
    assert bad.height == 0
    assert events["__key"].to_list() == ["12", "a", "b", "c"]
    assert events["__kint"].to_list() == [False] * 4
    assert events["__t"].to_list() == [-5, 1704063600000, 1704067200000, 7]
    assert events[int_col("amount")].to_list() == [None, 7, None, 7]
    assert events[float_col("amount")].to_list() == [1000.0, None, 0.5, None]
    assert events[float_col("x")].to_list() == [None, -0.5, None, None]
    assert events[json_col("x")].to_list() == ['"true"', None, None, '"{}"']


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (",1,1,x", "missing key field 'user'"),
        ("a,,1,x", "missing time field 'ts'"),
        ("a,1.5,1,x", "time field 'ts' is not an integer or ISO-8601 string: \"1.5\""),
        ("a,1000.0,1,x", "time field 'ts' is not an integer or ISO-8601 string"),
        ("a,soon,1,x", "time field 'ts' is not an integer or ISO-8601 string: \"soon\""),
        ("a,2024-13-01,1,x", "time field 'ts' is not an integer or ISO-8601 string"),
        ("a,1,abc,x", "non-numeric value in field 'amount': \"abc\""),
        ("a,1,inf,x", "non-numeric value in field 'amount': \"inf\""),
        ("a,1,1", "row has 3 fields but the header has 4"),
        ("a,1,1,x,y", "row has 5 fields but the header has 4"),
        ('a,1,1,"unclosed', "invalid CSV row"),
    ],
)
def test_bad_rows(tmp_path: Path, row: str, reason: str) -> None:
    text = f"user,ts,amount,x\nok,1,1,x\n\n{row}\n"
    events, bad, _ = read_all(write(tmp_path, text))
    assert events["__off"].to_list() == [0]
    assert bad.schema == BAD_SCHEMA
    assert bad["_offset"].to_list() == [2]
    assert bad["_line"].to_list() == [4]
    assert bad["_reason"][0].startswith(reason), bad["_reason"][0]
    assert bad["_raw"][0] == row


def test_invalid_utf8_row_is_bad_and_others_survive(tmp_path: Path) -> None:
    text = b'user,ts,amount,x\na,1,1,x\nc,3,\xff,x\nd,4,4,"q"\n'
    events, bad, _ = read_all(write(tmp_path, text))
    assert events["__key"].to_list() == ["a", "d"]
    assert events[json_col("x")].to_list() == ['"x"', '"q"']
    assert bad["_offset"].to_list() == [1]
    assert "UTF-8" in bad["_reason"][0]


def test_stray_quote_makes_one_bad_record_up_to_the_next_quote(tmp_path: Path) -> None:
    text = 'user,ts,amount,x\na,1,1,x\nb,2,1,ab"c\nc,3,1,x"\nd,4,4,y\n'
    events, bad, _ = read_all(write(tmp_path, text))
    assert events["__key"].to_list() == ["a", "d"]
    assert events["__off"].to_list() == [0, 3]
    assert bad.rows() == [(1, 3, bad["_reason"][0], 'b,2,1,ab"c\nc,3,1,x"')]
    assert bad["_reason"][0].startswith("invalid CSV row")


@pytest.mark.parametrize("text", ["", "\n\n", "  \n"])
def test_a_file_without_a_header_is_an_empty_partition(tmp_path: Path, text: str) -> None:
    """Empty, or blank lines only: no header, no records (as an empty JSONL file)."""
    events, bad, chunks = read_all(write(tmp_path, text))
    assert events.height == 0 and bad.height == 0
    assert len(chunks) == 1 and chunks[0].eof and chunks[0].last_offset is None
    # and it resumes from its end position, with nothing more to read
    events, bad, _ = read_all(tmp_path / "p.csv", position=chunks[0].position)
    assert events.height == 0 and bad.height == 0


def test_header_without_the_key_or_time_column_makes_bad_records(tmp_path: Path) -> None:
    # the contract: a record lacking the key or time field is bad (to [errors], or
    # the run stops naming the file and line), whatever the format
    events, bad, _ = read_all(write(tmp_path, "name,ts\na,1\nb,2\n"))
    assert events.height == 0
    assert bad["_line"].to_list() == [2, 3]
    assert set(bad["_reason"]) == {"missing key field 'user'"}
    assert bad["_raw"].to_list() == ["a,1", "b,2"]
    events, bad, _ = read_all(write(tmp_path, "user,when\na,1\n"))
    assert events.height == 0 and bad["_reason"].to_list() == ["missing time field 'ts'"]


def test_header_only_gives_one_empty_eof_chunk(tmp_path: Path) -> None:
    for text in ("user,ts", "user,ts\n", "user,ts\n\n"):
        events, bad, chunks = read_all(write(tmp_path, text))
        assert len(chunks) == 1 and chunks[0].eof and chunks[0].last_offset is None
        assert events.drop("__raw").schema == PLAN.event_schema()


def test_value_column_missing_from_header_is_null(tmp_path: Path) -> None:
    events, bad, _ = read_all(write(tmp_path, "user,ts\na,1\n"))
    assert bad.height == 0
    assert events[int_col("amount")].to_list() == [None]
    assert events[json_col("x")].to_list() == [None]


# -- chunking ----------------------------------------------------------------------------------

CELLS = ["", "a", "12", "-3", "2.5", "1e3", "x,y", 'say "hi"', "two\nlines", "2024-01-01", "true"]


@st.composite
def csv_text(draw: st.DrawFn) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
    w.writerow(["user", "ts", "amount", "x"])
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            out.write(draw(st.sampled_from(["\n", "  \n", "a,1\n", "a,1,2,3,4\n"])))
            continue
        w.writerow([draw(st.sampled_from(CELLS)) for _ in range(4)])
    text = out.getvalue()
    if draw(st.booleans()):
        text = text.rstrip("\r\n")
    return text


@settings(max_examples=30, deadline=None)
@given(text=csv_text(), chunk=st.integers(1, 6), block=st.integers(1, 200))
def test_chunking_never_changes_csv_results(text: str, chunk: int, block: int) -> None:
    ev, bad, _, _ = CSV.read_both_ways(text, chunk, block)
    # offsets are physical lines minus the header; _line points at the row's first line
    lines = text.split("\n")
    for off, raw in zip(bad["_offset"].to_list(), bad["_raw"].to_list(), strict=True):
        assert lines[off + 1].removesuffix("\r") == raw.split("\n")[0].removesuffix("\r")
    rows = list(csv.reader(io.StringIO(text, newline="")))[1:]
    good = [r for r in rows if len(r) == 4]
    assert ev.height + bad.height >= 0
    assert ev.height <= len(good)


# -- positions ---------------------------------------------------------------------------------


def sample(n: int = 20) -> str:
    rows = ["user,ts,amount,x"]
    for i in range(n):
        rows.append(
            f'u{i % 3},{1000 + i},{i},"v\n{i}"' if i % 4 == 0 else f"u{i % 3},{1000 + i},{i},v"
        )
        if i % 6 == 0:
            rows.append("")
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("stop_after", [1, 2, 5])
def test_csv_resume_equals_continuing(tmp_path: Path, stop_after: int) -> None:
    path = write(tmp_path, sample())
    whole_ev, whole_bad, _ = read_all(path, chunk=3)
    _, _, first = read_all(path, chunk=3)
    head = first[:stop_after]
    rest_ev, rest_bad, _ = read_all(path, chunk=2, position=head[-1].position)
    assert pl.concat([with_raw(c) for c in head] + [rest_ev]).equals(whole_ev)
    assert pl.concat([c.bad for c in head] + [rest_bad]).equals(whole_bad)


def test_csv_identity_and_append(tmp_path: Path) -> None:
    text = sample()
    path = write(tmp_path, text)
    _, _, chunks = read_all(path, chunk=4)
    mid, end = chunks[1].position, chunks[-1].position
    path.write_text(text + "late,5,5,5\n")
    ev, _, _ = read_all(path, position=end)
    assert ev["__key"].to_list() == ["late"]
    path.write_text(text.replace("u1", "u9"))
    with pytest.raises(SourceChangedError, match=r"p\.csv"):
        open_partition("csv", str(path), path, PLAN, mid)
    path.write_text(text[: mid.byte_offset - 3])
    with pytest.raises(SourceChangedError, match="shorter"):
        open_partition("csv", str(path), path, PLAN, mid)


def test_a_half_written_last_row_that_grew_is_refused_on_resume(tmp_path: Path) -> None:
    path = write(tmp_path, "user,ts,amount,x\na,1,2,q\nb,2,3")
    _, _, chunks = read_all(path)
    pos = chunks[-1].position
    path.write_text("user,ts,amount,x\na,1,2,q\nb,2,35,r\nc,3,1,s\n")
    with pytest.raises(SourceChangedError, match="had no newline when it was read and has grown"):
        open_partition("csv", "p.csv", path, PLAN, pos)
    path.write_text("user,ts,amount,x\na,1,2,q\nb,2,3\nc,3,1,s\n")  # it had ended there
    ev, _, _ = read_all(path, position=pos)
    assert ev["__key"].to_list() == ["c"]


def test_a_surrogate_in_a_csv_key_is_kept_as_text_or_bad_as_utf8(tmp_path: Path) -> None:
    # CSV has no escapes: "\ud800" is six characters of text, kept exactly; a
    # surrogate encoded in the bytes (CESU-8 "\xed\xa0\x80") is invalid UTF-8
    path = write(tmp_path, b"user,ts,amount,x\n\\ud800,1,2,q\n\xed\xa0\x80,2,3,r\nb,3,4,s\n")
    events, bad, _ = read_all(path)
    assert events["__key"].to_list() == ["\\ud800", "b"]
    assert bad["_offset"].to_list() == [1] and "invalid UTF-8" in bad["_reason"][0]
