"""The emission log's leaf hashes as every check computes them (issue: a long log was
rehashed with one ``json.dumps`` per leaf in every check): the same bytes as the
canonical :func:`emission_log.leaf_bytes` for every entry, and a long log (80,000
epochs) still rejected when one entry deep inside it is altered, dropped or moved."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.checkpoint import emission_log as el
from sealstream.checkpoint import log_segments, proofs

_ints = st.integers(-(2**70), 2**70)
_entry = st.one_of(
    st.tuples(_ints, _ints, st.text()).map(list),  # any root text: escaped as JSON
    st.lists(st.one_of(_ints, st.booleans(), st.floats(allow_nan=False), st.text(),
                       st.none()), max_size=4))


def _reference(entries: list[Any]) -> list[bytes] | str:
    """The hashes the definition gives (leaf_of then hash_leaf), or the error."""
    try:
        return [el.hash_leaf(el.leaf_of(e)) for e in entries]
    except ValueError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(_entry, max_size=6))
def test_leaf_hashes_are_the_canonical_leaves(entries: list[Any]) -> None:
    try:
        got: list[bytes] | str = el.leaf_hashes(entries)
    except ValueError as exc:
        got = str(exc)
    assert got == _reference(entries)


def test_non_ascii_and_int_subclass_entries_hash_as_defined() -> None:
    class Epoch(int):
        pass

    entries: list[Any] = [[1, 2, "é\"\\\n\u2028"], [Epoch(3), 4, "ab"], [True, 1, "x"]]
    assert el.leaf_hashes(entries[:2]) == [
        hashlib.sha256(b"\x00" + el.leaf_bytes(1, 2, "é\"\\\n\u2028")).digest(),
        hashlib.sha256(b"\x00" + el.leaf_bytes(3, 4, "ab")).digest()]
    with pytest.raises(ValueError, match="is not \\[epoch, count, root\\]"):
        el.leaf_hashes(entries)


N = 80_000


def _log() -> list[Any]:
    return [[i, 1 + i % 7, hashlib.sha256(str(i).encode()).hexdigest()] for i in range(N)]


@pytest.fixture(scope="module")
def signed() -> tuple[dict[str, Any], dict[str, Any]]:
    """The signed heads of the 80,000-epoch log and of its first 70,000 epochs."""
    log = _log()
    return el.head(log), el.head(log[:70_000])


def _last(log: list[Any]) -> dict[str, Any]:
    e = log[-1]
    return {"epoch": e[0], "results": {"count": e[1], "root": e[2]}}


def _tampered() -> dict[str, list[Any]]:
    root = _log()
    root[61_234][2] = root[61_234][2][:-1] + ("0" if root[61_234][2][-1] != "0" else "1")
    count = _log()
    count[50_001][1] += 1
    epoch = _log()
    epoch[40_000][0] = 39_999
    dropped = _log()
    del dropped[33_333]
    swapped = _log()
    swapped[20_000], swapped[20_001] = swapped[20_001], swapped[20_000]
    boolean = _log()
    assert boolean[65_002][1] == 1
    boolean[65_002][1] = True  # count 1 written as true: equal in Python, not an int
    early = _log()
    early[5][2] = early[5][2].upper()
    return {"root": root, "count": count, "epoch": epoch, "dropped": dropped,
            "swapped": swapped, "bool": boolean, "early": early,
            "truncated": _log()[:-1], "extended": _log() + [[N, 1, "00" * 32]]}


def test_an_untouched_long_log_verifies(signed: tuple[dict[str, Any], dict[str, Any]]
                                        ) -> None:
    log = _log()
    whole, prefix = signed
    assert el.problem(log, whole, _last(log)) is None
    assert el.extends(log, prefix) is None
    assert proofs.consistency({"id": 1, el.LOG_FIELD: prefix}, {"id": 2, el.LOG_FIELD: whole},
                              log)["ok"]


@pytest.mark.parametrize("how", sorted(_tampered()))
def test_one_entry_altered_deep_in_a_long_log_is_caught(
        how: str, signed: tuple[dict[str, Any], dict[str, Any]]) -> None:
    log = _tampered()[how]
    whole, prefix = signed
    why = el.problem(log, whole, _last(_log()))
    assert why is not None and ("does not match the signed log" in why
                                or "is not [epoch, count, root]" in why), why
    if how in ("truncated", "extended", "dropped"):
        return  # the prefix may be intact; the signed head above caught it
    if how == "bool":
        assert el.extends(log, prefix) is None  # malformed: judged on its own (problem)
        return
    assert el.extends(log, prefix) is not None
    res = proofs.consistency({"id": 1, el.LOG_FIELD: prefix}, {"id": 2, el.LOG_FIELD: whole},
                             log)
    assert not res["ok"] and res["reason"] == "EMISSION_LOG_MISMATCH", res


def test_a_byte_altered_in_a_deep_segment_of_a_long_log_is_caught() -> None:
    log = _log()
    names, new, tail = log_segments.split(log, [])
    store = {log_segments.segment_name(s): d for s, d in new}
    receipts = {log_segments.SEGMENTS_KEY: [s for s, _ in names], "log": tail}
    assert log_segments.resolve(receipts, store.get)[0] == log
    victim = log_segments.segment_name(names[60][0])
    store[victim] = store[victim].replace(b",1,", b",2,", 1)
    with pytest.raises(log_segments.SegmentError) as err:
        log_segments.resolve(receipts, store.get)
    assert err.value.code == log_segments.MISMATCH
