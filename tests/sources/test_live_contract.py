"""The live source contract: message values become typed chunks in one go."""

from __future__ import annotations

import numpy as np

from sealstream.sources import FieldPlan, ValueParser, empty_chunk, is_nothing_yet

PLAN = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})


def test_values_are_typed_like_jsonl_lines_with_their_positions() -> None:
    values = [
        b'{"user":"a","ts":5,"amount":1}',
        b"oops",
        b"",
        b'{"user":"b",\n"ts":"2020-01-01T00:00:00Z","amount":2.5}',
    ]
    chunk = ValueParser(PLAN).parse(values, np.array([7, 9, 10, 12]), next_position=13)
    assert chunk.events["__off"].to_list() == [7, 12]
    assert chunk.events["__t"].to_list() == [5, 1577836800000]
    assert chunk.bad["_offset"].to_list() == [9, 10]
    assert chunk.bad["_raw"].to_list() == ["oops", ""]
    assert chunk.last_offset == 12 and chunk.position.offset == 13 and not chunk.eof
    assert chunk.raw is not None
    assert chunk.raw.texts(np.array([12]))[0].startswith('{"user":"b"')


def test_message_key_and_timestamp() -> None:
    parser = ValueParser(FieldPlan(key="@key", time="@timestamp", fields={"amount": "numeric"}))
    chunk = parser.parse(
        [b'{"amount":1}', b'{"amount":2}'], np.array([0, 1]), 2,
        keys=[b"k", None], timestamps_ms=np.array([100, 200]),
    )
    assert chunk.events.select("__off", "__key", "__t").rows() == [(0, "k", 100)]
    assert chunk.bad["_offset"].to_list() == [1]
    assert "no key" in chunk.bad["_reason"][0]


def test_nothing_yet() -> None:
    chunk = empty_chunk(PLAN, 42)
    assert is_nothing_yet(chunk) and chunk.position.offset == 42 and not chunk.eof
    assert ValueParser(PLAN).parse([], np.array([], np.int64), 42).position.offset == 42


def test_a_raw_newline_inside_a_string_is_a_bad_record() -> None:
    """JSON forbids raw control characters in strings: never mended into a space."""
    values = [
        b'{"user":"a\nb","ts":5,"amount":1}',  # inside a string: invalid JSON
        b'{"user":"c",\r\n"ts":6,"amount":2}',  # between tokens: whitespace, valid
        b'{"user":"d","ts":7,"amount":3}',
    ]
    chunk = ValueParser(PLAN).parse(values, np.array([3, 4, 5]), next_position=6)
    assert chunk.events["__off"].to_list() == [4, 5]
    assert chunk.bad["_offset"].to_list() == [3]
    assert "control character" in chunk.bad["_reason"][0]
    assert chunk.bad["_raw"][0] == '{"user":"a\nb","ts":5,"amount":1}'


def test_a_message_without_a_broker_timestamp_is_a_bad_record() -> None:
    parser = ValueParser(FieldPlan(key="user", time="@timestamp", fields={"amount": "numeric"}))
    chunk = parser.parse(
        [b'{"user":"a","amount":1}', b'{"user":"b","amount":2}'], np.array([10, 11]), 12,
        timestamps_ms=np.array([-1, 200]),
    )
    assert chunk.events.select("__off", "__t").rows() == [(11, 200)]
    assert chunk.bad["_offset"].to_list() == [10]
    assert "no timestamp" in chunk.bad["_reason"][0]
