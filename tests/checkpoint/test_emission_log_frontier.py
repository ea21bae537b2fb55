"""The emission log's head as a log grows (issue: every checkpoint rehashed the whole
log two or three times: the writer's head, the guard's read-back, "extends its
parent"). The root kept as a frontier of perfect subtrees must be the RFC 6962 root
(``root_of``, the reference) at every size, however the leaves arrive; a log that is
the known one plus new entries hashes only the new ones; and an entry that is not the
very object hashed before (read again, altered, or equal in Python but not a leaf) is
always hashed again."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.checkpoint import emission_log as el


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=12))
def test_the_frontier_root_is_the_rfc_root_at_every_size(chunks: list[int]) -> None:
    hashes = [hashlib.sha256(str(i).encode()).digest() for i in range(sum(chunks))]
    f, at = el.Frontier(), 0
    assert f.root() == el.root_of([])
    for n in chunks:
        f = f.extended(hashes[at:at + n])
        at += n
        assert f.size == at
        assert f.root() == el.root_of(hashes[:at])


def _entry(i: int) -> list[Any]:
    return [i, 1 + i % 5, hashlib.sha256(b"%d" % i).hexdigest()]


def _reference_head(entries: list[Any]) -> dict[str, Any]:
    hashes = [el.hash_leaf(el.leaf_of(e)) for e in entries]
    return {"size": len(hashes), "root": el.root_of(hashes).hex()}


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many leaves each call of leaf_hashes hashed."""
    counts: list[int] = []
    real = el.leaf_hashes

    def counting(entries: Any) -> list[bytes]:
        counts.append(len(entries))
        return real(entries)

    monkeypatch.setattr(el, "leaf_hashes", counting)
    return counts


def test_a_growing_log_hashes_only_its_new_entries(hashed: list[int]) -> None:
    log = [_entry(i) for i in range(5000)]
    assert el.head(log) == _reference_head(log)
    parent = el.head(log)
    for step in range(3):
        log.extend(_entry(5000 + 10 * step + j) for j in range(10))
        hashed.clear()
        assert el.head(log) == _reference_head(log)
        assert el.extends(log, parent) is None
        assert el.problem(log, el.head(log), {"epoch": log[-1][0], "results": {
            "count": log[-1][1], "root": log[-1][2]}}) is None
        assert sum(hashed) == 10, hashed  # the ten new entries, once
        parent = el.head(log)


def test_an_entry_that_is_not_the_object_hashed_before_is_hashed_again(
        hashed: list[int]) -> None:
    log = [_entry(i) for i in range(3000)]
    assert log[1235][1] == 1  # so that True is equal to it in Python
    signed = el.head(log)
    # read again: equal values, new objects: the same head, from a full hash
    again = [list(e) for e in log]
    hashed.clear()
    assert el.head(again) == signed and sum(hashed) == 3000
    # a deep entry replaced by one of another value, or by one equal in Python but
    # not a leaf (1.0 for 1, True for 1): never the cached head
    for bad in ([log[1235][0], log[1235][1] + 1, log[1235][2]],
                [float(log[1235][0]), log[1235][1], log[1235][2]],
                [log[1235][0], True, log[1235][2]]):
        altered = list(log)
        altered[1235] = bad
        try:
            got: Any = el.head(altered)
        except ValueError as exc:
            got = str(exc)
        assert got != signed, bad
        assert el.problem(altered, signed, None) is not None
    # the untouched log still verifies, and extends its own prefix
    assert el.problem(log, signed, None) is None
    assert el.extends(log, el.head(log[:2000])) is None
    assert el.extends(log[:1999] + [_entry(99_999)] + log[2000:], el.head(log[:2000]))
