"""The emission log (RFC 6962 Merkle tree of epoch roots) against a small, obviously
correct reference: the recursive definition of the tree hash, and proofs checked by
recomputing roots from the leaves they claim."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.checkpoint import emission_log as log


def ref_mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 section 2.1, word for word."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + ref_mth(leaves[:k]) + ref_mth(leaves[k:])).digest()


leaves_st = st.lists(st.binary(min_size=0, max_size=8), min_size=0, max_size=40)


@settings(max_examples=150, deadline=None)
@given(leaves_st)
def test_root_is_the_rfc_tree_hash(leaves: list[bytes]) -> None:
    assert log.root_of([log.hash_leaf(x) for x in leaves]) == ref_mth(leaves)


@settings(max_examples=150, deadline=None)
@given(leaves_st.filter(bool), st.data())
def test_inclusion_proofs_verify_and_a_flipped_byte_fails(leaves: list[bytes],
                                                         data: st.DataObject) -> None:
    hashes = [log.hash_leaf(x) for x in leaves]
    n, root = len(hashes), ref_mth(leaves)
    m = data.draw(st.integers(0, n - 1))
    path = log.inclusion_path(hashes, m)
    assert len(path) <= max(1, (n - 1).bit_length())
    assert log.verify_inclusion(hashes[m], m, n, path, root)
    # another leaf, index or size, or any flipped byte of the path, fails
    assert not log.verify_inclusion(log.hash_leaf(leaves[m] + b"x"), m, n, path, root)
    if n > 1:
        other = data.draw(st.integers(0, n - 1).filter(lambda i: i != m))
        assert not log.verify_inclusion(hashes[m], other, n, path, root) \
            or hashes[other] == hashes[m] and leaves[other] == leaves[m]
    if path:
        i = data.draw(st.integers(0, len(path) - 1))
        b = data.draw(st.integers(0, 31))
        bad = list(path)
        bad[i] = bad[i][:b] + bytes([bad[i][b] ^ 1]) + bad[i][b + 1:]
        assert not log.verify_inclusion(hashes[m], m, n, bad, root)
        assert not log.verify_inclusion(hashes[m], m, n, path[:-1], root)


@settings(max_examples=150, deadline=None)
@given(leaves_st, st.data())
def test_consistency_proofs_verify_only_for_a_prefix(leaves: list[bytes],
                                                     data: st.DataObject) -> None:
    hashes = [log.hash_leaf(x) for x in leaves]
    n = len(hashes)
    m = data.draw(st.integers(0, n))
    old, new = ref_mth(leaves[:m]), ref_mth(leaves)
    path = log.consistency_path(hashes, m)
    assert log.verify_consistency(m, n, old, new, path)
    if 0 < m < n:
        # a rewritten old leaf: the old root is not a prefix of the new log any more
        changed = list(leaves)
        j = data.draw(st.integers(0, m - 1))
        changed[j] = changed[j] + b"!"
        assert not log.verify_consistency(m, n, ref_mth(changed[:m]), new, path)
        assert not log.verify_consistency(m, n, old, ref_mth(changed), path)
        i = data.draw(st.integers(0, len(path) - 1))
        bad = list(path)
        bad[i] = bytes([bad[i][0] ^ 1]) + bad[i][1:]
        assert not log.verify_consistency(m, n, old, new, bad)
    if m < n:
        # a log that dropped a leaf does not extend the old one (when the leaves differ)
        dropped = leaves[:m - 1] + leaves[m:] if m else leaves[1:]
        if dropped[:m] != leaves[:m]:
            dh = [log.hash_leaf(x) for x in dropped]
            assert not log.verify_consistency(m, len(dh), old, ref_mth(dropped),
                                              log.consistency_path(dh, m)) \
                or m > len(dh)


def test_checkpoint_log_entries_are_checked() -> None:
    entries = [[1, 2, "aa"], [2, 5, "bb"]]
    head = log.head(entries)
    assert head["size"] == 2
    roots = {"epoch": 2, "results": {"count": 5, "root": "bb"}}
    assert log.problem(entries, head, roots) is None
    assert log.problem(entries[:1], head, roots) is not None
    assert log.problem([[1, 2, "aa"], [2, 1, "bb"]], head, roots) is not None
    assert log.extends(entries, log.head(entries[:1])) is None
    assert log.extends([[1, 3, "aa"], [2, 5, "bb"]], log.head(entries[:1])) is not None


def test_an_epoch_that_committed_nothing_adds_no_leaf() -> None:
    """Quiet checkpoints (no result) leave the log as it was: the log's last leaf is an
    older epoch's, and a leaf claiming the empty epoch is refused."""
    entries = [[1, 2, "aa"]]
    empty = {"epoch": 2, "results": {"count": 0, "root": log.EMPTY.hex()}}
    assert log.problem(entries, log.head(entries), empty) is None
    assert log.problem([], log.head([]), empty) is None
    padded = [[1, 2, "aa"], [2, 0, log.EMPTY.hex()]]
    assert log.problem(padded, log.head(padded), empty) is not None
    assert log.problem(entries, log.head(padded), empty) is not None  # head must match
