"""Message values that are empty or blank (spaces, tabs) are bad records at their own
offsets ("empty message"); a value with blanks around its JSON parses; the records
around them keep their positions. Guards the columnar fast paths of
``ValueParser.parse`` (no Python loop per value when every value is non-empty and
none is blank)."""

from __future__ import annotations

import numpy as np
import pytest

from sealstream.sources import FieldPlan
from sealstream.sources._live import ValueParser

PLAN = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})


def rec(user: str, ts: int) -> bytes:
    return f'{{"user":"{user}","ts":{ts},"amount":1}}'.encode()


@pytest.mark.parametrize("blank", [b"", b" ", b"\t", b"  \t ", None])
def test_an_empty_or_blank_value_is_a_bad_record_at_its_offset(blank: bytes | None) -> None:
    values = [rec("a", 1), blank, rec("b", 2), blank, blank, rec("c", 3)]
    chunk = ValueParser(PLAN).parse(values, np.array([10, 11, 12, 13, 14, 15]), 16)
    assert chunk.events.select("__off", "__key").rows() == [(10, "a"), (12, "b"), (15, "c")]
    assert chunk.bad["_offset"].to_list() == [11, 13, 14]
    assert set(chunk.bad["_reason"].to_list()) == {"empty message"}
    assert chunk.position.offset == 16 and chunk.last_offset == 15


def test_a_blank_value_first_or_last() -> None:
    values = [b" ", rec("a", 1), b"\t"]
    chunk = ValueParser(PLAN).parse(values, np.array([0, 1, 2]), 3)
    assert chunk.events["__off"].to_list() == [1]
    assert chunk.bad["_offset"].to_list() == [0, 2]


def test_blanks_around_a_record_are_whitespace() -> None:
    values = [b" " + rec("a", 1) + b" ", b"\t" + rec("b", 2), rec("c", 3) + b"\t"]
    chunk = ValueParser(PLAN).parse(values, np.array([5, 6, 7]), 8)
    assert chunk.events.select("__off", "__key").rows() == [(5, "a"), (6, "b"), (7, "c")]
    assert chunk.bad.height == 0


def test_many_values_without_blanks_parse_in_order() -> None:
    values = [rec(f"u{i % 7}", i) for i in range(5000)]
    chunk = ValueParser(PLAN).parse(values, np.arange(100, 5100), 5100)
    assert chunk.events["__off"].to_list() == list(range(100, 5100))
    assert chunk.events["__t"].to_list() == list(range(5000))
    assert chunk.bad.height == 0
