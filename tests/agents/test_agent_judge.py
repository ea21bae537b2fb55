"""The agent guard is pure and total: exhaustive small cases without a disk, and
random garbage never makes it raise."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.agents._seal import Keys, seal_plain
from sealstream.agents.judge import (
    ATOMIC,
    INCONSISTENT,
    PARTIAL,
    CheckpointEvidence,
    RowRead,
    judge,
    judge_history,
)

KEY = b"judge-key"
KEYS = Keys(KEY, None)


def _manifest(blobs: dict[str, bytes], writes: bool = False, cid: str = "c1") -> RowRead:
    addr = ("cp", "e", "", cid)
    entries = {n: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
               for n, d in blobs.items()}
    doc = {"format": 1, "kind": "agent", "execution": "e", "ns": "", "id": cid,
           "parent": None, "created_ms": 1, "blobs": entries, "writes": writes, "body": {}}
    return RowRead(addr, seal_plain(KEYS, addr, doc))


def _blobs(data: dict[str, bytes]) -> dict[str, RowRead]:
    return {n: RowRead(("blob", "e", "", n), d) for n, d in data.items()}


def test_atomic_when_everything_is_there() -> None:
    ev = CheckpointEvidence(_manifest({"x": b"abc"}), _blobs({"x": b"abc"}))
    v = judge(ev, KEY)
    assert (v.verdict, v.reason) == (ATOMIC, "OK") and v.ok


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6).filter(lambda k: k not in ("row", "signature")),
                       st.none() | st.booleans() | st.integers() | st.text(max_size=6)
                       | st.lists(st.text(max_size=3), max_size=3), max_size=5),
       st.sampled_from([None, KEY]))
def test_rows_sealed_once_or_pretty_printed_both_verify(body: dict[str, object],
                                                        key: bytes | None) -> None:
    # rows are written in canonical JSON with the signature spliced in (one
    # encoding); rows an earlier version wrote pretty-printed must still verify
    from sealstream.agents.judge import judge_row
    from sealstream.checkpoint.manifest import seal

    addr = ("wi", "e", "", "c1")
    new = seal_plain(Keys(key, None), addr, body)
    old = seal({**body, "row": list(addr)}, key)
    assert json.loads(new) == json.loads(old)
    for data in (new, old):
        bad, doc = judge_row(RowRead(addr, data), key)
        assert bad is None and doc is not None and doc["row"] == list(addr)
    other = seal_plain(Keys(key, None), addr, {**body, "x-extra": 1})
    forged = json.loads(new)
    forged["x-extra"] = 1
    bad, _ = judge_row(RowRead(addr, json.dumps(forged).encode()), key)
    assert bad is not None and bad.reason == "SIGNATURE_MISMATCH"
    assert json.loads(other)["signature"] != json.loads(new)["signature"]


def test_presence_is_judged_before_coherence() -> None:
    # a missing blob AND a bad signature: the missing blob is reported
    m = _manifest({"x": b"abc", "y": b"d"})
    forged = RowRead(m.addr, (m.data or b"").replace(b'"created_ms":1', b'"created_ms":2'))
    v = judge(CheckpointEvidence(forged, _blobs({"x": b"abc"})), KEY)
    assert (v.verdict, v.reason) == (PARTIAL, "FILE_MISSING")
    v = judge(CheckpointEvidence(forged, _blobs({"x": b"abc", "y": b"d"})), KEY)
    assert (v.verdict, v.reason) == (INCONSISTENT, "SIGNATURE_MISMATCH")


def test_every_manifest_shape_problem() -> None:
    addr = ("cp", "e", "", "c1")
    cases = {
        None: (PARTIAL, "NO_MANIFEST"),
        b"{": (PARTIAL, "MANIFEST_UNREADABLE"),
        b"[1]": (PARTIAL, "MANIFEST_UNREADABLE"),
        b'{"a": 1}': (PARTIAL, "NO_SIGNATURE"),
        b'{"signature": {}}': (PARTIAL, "MANIFEST_INCOMPLETE"),
    }
    for data, expected in cases.items():
        v = judge(CheckpointEvidence(RowRead(addr, data)), KEY)
        assert (v.verdict, v.reason) == expected, data
    v = judge(CheckpointEvidence(RowRead(addr, None, ("FILE_TRUNCATED", "short"))), KEY)
    assert (v.verdict, v.reason) == (PARTIAL, "MANIFEST_UNREADABLE")
    v = judge(CheckpointEvidence(RowRead(addr, None, ("KEY_MISMATCH", "other key"))), KEY)
    assert (v.verdict, v.reason) == (INCONSISTENT, "KEY_MISMATCH")


def test_a_manifest_under_another_address_is_refused() -> None:
    m = _manifest({}, cid="c1")
    moved = RowRead(("cp", "e", "", "c2"), m.data)
    v = judge(CheckpointEvidence(moved), KEY)
    assert (v.verdict, v.reason) == (INCONSISTENT, "ROW_MISMATCH")
    other_ns = RowRead(("cp", "e", "child:1", "c1"), m.data)
    assert judge(CheckpointEvidence(other_ns), KEY).reason == "ROW_MISMATCH"


def test_history_reports_what_is_gone_but_respects_retention() -> None:
    addr = ("meta", "e", "", "history")
    meta = RowRead(addr, seal_plain(KEYS, addr, {"head": "c5", "floor": "c3"}))
    verdicts = [judge(CheckpointEvidence(_manifest({}, cid=c)), KEY) for c in ("c3", "c5")]
    gone = judge_history("e", "", verdicts, {"c3": "c2", "c5": "c4"}, meta, KEY)
    assert [(v.checkpoint_id, v.reason) for v in gone] == [("c4", "NO_MANIFEST")]
    gone = judge_history("e", "", verdicts[:1], {"c3": "c2"}, meta, KEY)
    assert [(v.checkpoint_id, v.reason) for v in gone] == [("c5", "NO_MANIFEST")]
    gone = judge_history("e", "", verdicts, {}, None, KEY)
    assert [(v.checkpoint_id, v.reason) for v in gone] == [("(head)", "NO_MANIFEST")]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=4),
    max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                 st.dictionaries(st.sampled_from(["format", "kind", "execution", "ns", "id",
                                                  "parent", "created_ms", "blobs", "writes",
                                                  "body", "row", "signature"]),
                                 json_values).map(lambda d: json.dumps(d).encode())),
       st.dictionaries(st.text(max_size=4), st.binary(max_size=8), max_size=3),
       st.booleans())
def test_garbage_never_raises(data: bytes, blobs: dict[str, bytes], with_index: bool) -> None:
    addr = ("cp", "e", "", "c1")
    index = RowRead(("wi", "e", "", "c1"), data) if with_index else None
    v = judge(CheckpointEvidence(RowRead(addr, data), _blobs(blobs), index,
                                 {"w": RowRead(("w", "e", "", "w"), data)}), KEY)
    assert v.verdict in (PARTIAL, INCONSISTENT)
    judge_history("e", "", [v], {"c1": "c0"}, RowRead(("meta", "e", "", "history"), data), KEY)
