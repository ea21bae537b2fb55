"""The checkpoint guard, judged exhaustively without a disk (semantics section 7).

Every test builds a checkpoint the way ``Job._checkpoint`` does (the same
manifest body, sealed by :func:`manifest.seal`), the :class:`Evidence` a store
would gather for it, and then breaks exactly one thing. The story of each case
is "this checkpoint, with this one defect, gets this verdict and this reason".
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sealstream.checkpoint import guard
from sealstream.checkpoint.guard import (
    ATOMIC,
    INCONSISTENT,
    PARTIAL,
    REQUIRED_FIELDS,
    Evidence,
    FileFact,
    Policy,
    Verdict,
    judge,
)
from sealstream.checkpoint.manifest import (
    RECEIPTS_NAME,
    STATE_NAME,
    SUPPRESS_NAME,
    canonical,
    seal,
)

KEY = b"correct horse battery staple"
OTHER_KEY = b"incorrect horse"
CID = 7
PIPELINE = "payments"
FINGERPRINT = "f" * 64
NOW_MS = 1_700_000_100_000
CREATED_MS = 1_700_000_000_000
VERDICTS = (ATOMIC, PARTIAL, INCONSISTENT)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dirname(cid: int) -> str:
    return f"cp-{cid:012d}"


def default_watermark() -> dict[str, Any]:
    # two partitions, max_delay 1000: W_p = max_time - 1000, W = min_p W_p
    return {
        "max_delay_ms": 1000,
        "max_time": [50_000, 42_000],
        "exhausted": [False, False],
        "global_ms": 41_000,
        "partition_ms": [49_000, 41_000],
    }


def default_positions() -> list[dict[str, Any]]:
    return [
        {"partition": "in/p0.jsonl", "next_offset": 120,
         "resume": {"offset": 100, "byte": 4096, "identity": "dev:1:ino:2"}},
        {"partition": "in/p1.jsonl", "next_offset": 80,
         "resume": {"offset": 80, "byte": 2048, "identity": "dev:1:ino:3"}},
    ]


def default_summary() -> dict[str, Any]:
    return {"results": 14, "late": 2, "errors": 0, "digest": "d" * 64, "last_epoch": 3}


def default_epochs() -> list[dict[str, Any]]:
    return [{
        "epoch": 3,
        # 30_000 + lateness 2_000 <= W = 41_000: those windows really were closed
        "results": {"count": 5, "digest": "a" * 64, "tokens": ["part-3.jsonl"],
                    "max_window_end": 30_000},
        "late": {"count": 1, "digest": "b" * 64, "tokens": ["late-3.jsonl"]},
        "errors": {"count": 0, "digest": sha(b""), "tokens": []},
    }]


SAME = object()  # "the state holds the manifest's watermark"


@dataclass
class Ckpt:
    """One checkpoint as the engine writes it; every part can be changed."""

    cid: int = CID
    parent: int | None = CID - 1
    key: bytes | None = None
    watermark: dict[str, Any] = field(default_factory=default_watermark)
    positions: list[dict[str, Any]] = field(default_factory=default_positions)
    lateness_ms: int = 2_000
    summary: dict[str, Any] = field(default_factory=default_summary)
    epochs: list[dict[str, Any]] = field(default_factory=default_epochs)
    state_bytes: bytes = b"ARROW1\x00\x00" + bytes(range(256)) * 3
    suppress_bytes: bytes | None = None
    created_ms: int = CREATED_MS
    state_watermark: Any = SAME

    # -- the files, as written
    def receipts_doc(self) -> dict[str, Any]:
        return {"summary": self.summary, "epochs": self.epochs}

    def receipts_bytes(self) -> bytes:
        return json.dumps(self.receipts_doc(), sort_keys=True, indent=1).encode()

    def file_bytes(self) -> dict[str, bytes]:
        out = {STATE_NAME: self.state_bytes, RECEIPTS_NAME: self.receipts_bytes()}
        if self.suppress_bytes is not None:
            out[SUPPRESS_NAME] = self.suppress_bytes
        return out

    def path(self, name: str) -> str:
        return f"{dirname(self.cid)}/{name}"

    # -- the manifest
    def body(self) -> dict[str, Any]:
        files = self.file_bytes()
        entries = {}
        for role, name in (("state", STATE_NAME), ("receipts", RECEIPTS_NAME),
                           ("suppress", SUPPRESS_NAME)):
            if name in files:
                entries[role] = {"path": self.path(name), "sha256": sha(files[name]),
                                 "bytes": len(files[name])}
        return {
            "format": 1,
            "id": self.cid,
            "parent": self.parent,
            "pipeline": PIPELINE,
            "fingerprint": FINGERPRINT,
            "definition": {"format": 1, "pipeline": PIPELINE,
                           "window": {"kind": "tumbling", "size_ms": 10_000,
                                      "lateness_ms": self.lateness_ms}},
            "created_ms": self.created_ms,
            "epoch": 3,
            "lateness_ms": self.lateness_ms,
            "watermark": copy.deepcopy(self.watermark),
            "positions": copy.deepcopy(self.positions),
            "files": entries,
            "state": {"open_windows": 4, "sha256": entries["state"]["sha256"]},
            "receipts": copy.deepcopy(self.summary),
            "sinks": {"results": {"epoch": 3, "tokens": ["part-3.jsonl"]},
                      "late": {"epoch": 3, "tokens": ["late-3.jsonl"]}},
            "counters": {"events": 200, "late_events": 2, "bad_records": 0, "results": 14},
        }

    def manifest(self) -> bytes:
        return seal(self.body(), self.key)

    # -- what a store reads back
    def facts(self) -> dict[str, FileFact]:
        return {self.path(n): FileFact(True, len(b), sha(b)) for n, b in self.file_bytes().items()}

    def evidence(self, **changes: Any) -> Evidence:
        wm = self.watermark if self.state_watermark is SAME else self.state_watermark
        ev = Evidence(
            checkpoint_id=self.cid,
            manifest=self.manifest(),
            files=self.facts(),
            state_meta={"watermark": copy.deepcopy(wm)},
            state_error=None,
            receipts=json.loads(self.receipts_bytes()),
        )
        return replace(ev, **changes)

    def policy(self, **changes: Any) -> Policy:
        return replace(Policy(key=self.key), **changes)


def parent_of(c: Ckpt, **changes: Any) -> dict[str, Any]:
    """The parsed manifest of ``c``'s parent: one epoch earlier, everything lower."""
    wm = default_watermark()
    wm.update(max_time=[40_000, 30_000], global_ms=29_000, partition_ms=[39_000, 29_000])
    pos = default_positions()
    pos[0]["next_offset"], pos[1]["next_offset"] = 90, 60
    p = Ckpt(cid=c.cid - 1, parent=c.cid - 2, key=c.key, watermark=wm, positions=pos)
    for k, v in changes.items():
        setattr(p, k, v)
    return json.loads(p.manifest())


def sealed(body: dict[str, Any], key: bytes | None = None) -> bytes:
    return seal(body, key)


def one_line(text: str) -> bool:
    return "\n" not in text and "\r" not in text


def assert_well_formed(v: Verdict, cid: int = CID) -> None:
    assert isinstance(v, Verdict)
    assert v.checkpoint_id == cid
    assert v.verdict in VERDICTS
    assert v.reason and one_line(v.reason) and v.reason == v.reason.strip()
    assert one_line(v.message), v.message
    assert f"checkpoint {cid}" in v.message, v.message
    assert len(v.digest) == 64 and int(v.digest, 16) >= 0
    assert v.ok is (v.verdict == ATOMIC)


# ======================================================================= the case table
# name -> builds (evidence, parent, policy); expected (verdict, reason).

Build = Callable[[], tuple[Evidence, dict[str, Any] | None, Policy]]


def _keyed() -> Ckpt:
    return Ckpt(key=KEY)


def _without_signature() -> tuple[Evidence, Any, Policy]:
    c = Ckpt()
    return c.evidence(manifest=json.dumps(c.body()).encode()), None, c.policy()


def _bad_signature_object(sig: Any) -> Build:
    def build() -> tuple[Evidence, Any, Policy]:
        c = Ckpt()
        doc = c.body()
        doc["signature"] = sig
        return c.evidence(manifest=json.dumps(doc).encode()), None, c.policy()
    return build


def _missing_field(name: str) -> Build:
    def build() -> tuple[Evidence, Any, Policy]:
        c = Ckpt()
        body = c.body()
        del body[name]
        return c.evidence(manifest=sealed(body)), None, c.policy()
    return build


def _body_change(change: Callable[[dict[str, Any]], None], key: bytes | None = None) -> Build:
    """Re-seal a changed body (the writer itself wrote it that way)."""
    def build() -> tuple[Evidence, Any, Policy]:
        c = Ckpt(key=key)
        body = c.body()
        change(body)
        return c.evidence(manifest=sealed(body, key)), None, c.policy()
    return build


def _file_fact(name: str, fact: Callable[[FileFact], FileFact]) -> Build:
    def build() -> tuple[Evidence, Any, Policy]:
        c = Ckpt(suppress_bytes=b"SUPPRESS" * 10)
        facts = dict(c.facts())
        facts[c.path(name)] = fact(facts[c.path(name)])
        return c.evidence(files=facts), None, c.policy()
    return build


def _no_file(name: str) -> Build:
    def build() -> tuple[Evidence, Any, Policy]:
        c = Ckpt(suppress_bytes=b"SUPPRESS" * 10)
        facts = dict(c.facts())
        del facts[c.path(name)]
        return c.evidence(files=facts), None, c.policy()
    return build


def _simple(make: Callable[[], Ckpt], ev: Callable[[Ckpt], dict[str, Any]] | None = None,
            parent: Callable[[Ckpt], dict[str, Any] | None] | None = None,
            policy: Callable[[Ckpt], dict[str, Any]] | None = None) -> Build:
    def build() -> tuple[Evidence, Any, Policy]:
        c = make()
        return (c.evidence(**(ev(c) if ev else {})), parent(c) if parent else None,
                c.policy(**(policy(c) if policy else {})))
    return build


def _truncated(c: Ckpt) -> dict[str, Any]:
    m = c.manifest()
    return {"manifest": m[: len(m) // 2]}


def _lower_global(c: Ckpt) -> dict[str, Any]:
    # the child's watermark is lower than the parent's (both of its own files agree)
    return parent_of(c, watermark={**default_watermark(), "global_ms": 41_001})


def _lower_partition(c: Ckpt) -> dict[str, Any]:
    wm = default_watermark()
    wm["partition_ms"] = [49_001, 41_000]
    return parent_of(c, watermark=wm)


def _lower_position(c: Ckpt) -> dict[str, Any]:
    pos = default_positions()
    pos[1]["next_offset"] = 81
    return parent_of(c, positions=pos)


def _lower_resume(c: Ckpt) -> dict[str, Any]:
    pos = default_positions()
    pos[0]["resume"]["offset"] = 101  # same next_offset, but it resumed further on
    return parent_of(c, positions=pos)


def _state_watermark(change: Callable[[dict[str, Any]], None]) -> Callable[[], Ckpt]:
    def make() -> Ckpt:
        wm = default_watermark()
        change(wm)
        return Ckpt(state_watermark=wm)
    return make


def _receipts_summary_mismatch(c: Ckpt) -> dict[str, Any]:
    doc = c.receipts_doc()
    doc = {**doc, "summary": {**doc["summary"], "results": 15}}
    return {"receipts": doc}


def _open_window(end: int) -> Callable[[], Ckpt]:
    def make() -> Ckpt:
        c = Ckpt()
        c.epochs = default_epochs()
        c.epochs[0]["results"]["max_window_end"] = end
        return c
    return make


W, LATE = 41_000, 2_000

CASES: dict[str, tuple[Build, str, str]] = {
    # ----------------------------------------------------------------- ATOMIC
    "valid unkeyed": (_simple(Ckpt), ATOMIC, "OK"),
    "valid keyed": (_simple(_keyed), ATOMIC, "OK"),
    "valid with suppress file": (
        _simple(lambda: Ckpt(suppress_bytes=b"S" * 33)), ATOMIC, "OK"),
    "valid, first checkpoint (no parent)": (_simple(lambda: Ckpt(parent=None)), ATOMIC, "OK"),
    "valid against its parent and the full policy": (
        _simple(_keyed, parent=parent_of,
                policy=lambda c: {"pipeline": PIPELINE, "fingerprint": FINGERPRINT,
                                  "max_age_ms": NOW_MS - CREATED_MS, "now_ms": NOW_MS}),
        ATOMIC, "OK"),
    "positions and watermark equal to the parent's": (
        _simple(Ckpt, parent=lambda c: json.loads(Ckpt(cid=c.cid - 1).manifest())),
        ATOMIC, "OK"),
    "receipt exactly at the boundary (end + lateness == W)": (
        _simple(_open_window(W - LATE)), ATOMIC, "OK"),
    "freshness exactly at the limit": (
        _simple(Ckpt, policy=lambda c: {"max_age_ms": NOW_MS - CREATED_MS, "now_ms": NOW_MS}),
        ATOMIC, "OK"),
    "unreadable parent is judged on its own": (
        _simple(Ckpt, parent=lambda c: {"watermark": "garbage"}), ATOMIC, "OK"),
    "facts about unrelated paths are ignored": (
        _simple(Ckpt, ev=lambda c: {"files": {**c.facts(), "cp-x/other": FileFact(False)}}),
        ATOMIC, "OK"),
    # ---------------------------------------------------------------- PARTIAL
    "no manifest": (_simple(Ckpt, ev=lambda c: {"manifest": None}), PARTIAL, "NO_MANIFEST"),
    "truncated manifest": (_simple(Ckpt, ev=_truncated), PARTIAL, "MANIFEST_UNREADABLE"),
    "empty manifest": (_simple(Ckpt, ev=lambda c: {"manifest": b""}),
                       PARTIAL, "MANIFEST_UNREADABLE"),
    "manifest not UTF-8": (_simple(Ckpt, ev=lambda c: {"manifest": b"\xff\xfe{}"}),
                           PARTIAL, "MANIFEST_UNREADABLE"),
    "manifest is a JSON list": (_simple(Ckpt, ev=lambda c: {"manifest": b"[1, 2]"}),
                                PARTIAL, "MANIFEST_UNREADABLE"),
    "manifest is a JSON number": (_simple(Ckpt, ev=lambda c: {"manifest": b"42"}),
                                  PARTIAL, "MANIFEST_UNREADABLE"),
    "manifest is a JSON string": (_simple(Ckpt, ev=lambda c: {"manifest": b'"x"'}),
                                  PARTIAL, "MANIFEST_UNREADABLE"),
    "manifest is JSON null": (_simple(Ckpt, ev=lambda c: {"manifest": b"null"}),
                              PARTIAL, "MANIFEST_UNREADABLE"),
    "no signature": (_without_signature, PARTIAL, "NO_SIGNATURE"),
    "signature is null": (_bad_signature_object(None), PARTIAL, "NO_SIGNATURE"),
    "signature without value": (_bad_signature_object({"alg": "sha256"}),
                                PARTIAL, "NO_SIGNATURE"),
    "signature is a string": (_bad_signature_object("abc"), PARTIAL, "NO_SIGNATURE"),
    **{f"missing field {f}": (_missing_field(f), PARTIAL, "MANIFEST_INCOMPLETE")
       for f in REQUIRED_FIELDS},
    "file list is not an object": (
        _body_change(lambda b: b.__setitem__("files", [])), PARTIAL, "MANIFEST_INCOMPLETE"),
    "file entry without path": (
        _body_change(lambda b: b["files"]["state"].pop("path")), PARTIAL, "MANIFEST_INCOMPLETE"),
    "file entry not an object": (
        _body_change(lambda b: b["files"].__setitem__("state", "x")),
        PARTIAL, "MANIFEST_INCOMPLETE"),
    "missing state file": (_no_file(STATE_NAME), PARTIAL, "FILE_MISSING"),
    "state file reported absent": (
        _file_fact(STATE_NAME, lambda f: FileFact(False)), PARTIAL, "FILE_MISSING"),
    "missing suppress file": (_no_file(SUPPRESS_NAME), PARTIAL, "FILE_MISSING"),
    "missing receipts file": (_no_file(RECEIPTS_NAME), PARTIAL, "NO_RECEIPTS"),
    "no receipts entry in the manifest": (
        _body_change(lambda b: b["files"].pop("receipts")), PARTIAL, "NO_RECEIPTS"),
    "state file shorter than recorded": (
        _file_fact(STATE_NAME, lambda f: replace(f, size=f.size - 1, sha256=sha(b"short"))),
        PARTIAL, "FILE_TRUNCATED"),
    "state file empty": (
        _file_fact(STATE_NAME, lambda f: FileFact(True, 0, sha(b""))), PARTIAL, "FILE_TRUNCATED"),
    "receipts file shorter than recorded": (
        _file_fact(RECEIPTS_NAME, lambda f: replace(f, size=1, sha256=sha(b"{"))),
        PARTIAL, "FILE_TRUNCATED"),
    "suppress file shorter than recorded": (
        _file_fact(SUPPRESS_NAME, lambda f: replace(f, size=f.size - 5)),
        PARTIAL, "FILE_TRUNCATED"),
    # shorter but whole (say, another checkpoint's file copied over it): not a write
    # cut short, a file that does not cohere with its manifest
    "receipts file swapped for a shorter whole one": (
        _file_fact(RECEIPTS_NAME, lambda f: replace(f, size=2, sha256=sha(b"{}"), whole=True)),
        INCONSISTENT, "HASH_MISMATCH"),
    "state file swapped for a shorter whole one": (
        _file_fact(STATE_NAME, lambda f: replace(f, size=f.size - 9, sha256=sha(b"s"),
                                                 whole=True)),
        INCONSISTENT, "HASH_MISMATCH"),
    "state unreadable": (
        _simple(Ckpt, ev=lambda c: {"state_meta": None,
                                    "state_error": "not a readable Arrow IPC stream: boom"}),
        PARTIAL, "STATE_UNREADABLE"),
    "state error with metadata present": (
        _simple(Ckpt, ev=lambda c: {"state_error": "state metadata is not JSON"}),
        PARTIAL, "STATE_UNREADABLE"),
    "state metadata absent": (_simple(Ckpt, ev=lambda c: {"state_meta": None}),
                              PARTIAL, "STATE_UNREADABLE"),
    "receipts unparseable": (_simple(Ckpt, ev=lambda c: {"receipts": None}),
                             PARTIAL, "NO_RECEIPTS"),
    # ----------------------------------------------------------- INCONSISTENT
    "state hash mismatch (same size)": (
        _file_fact(STATE_NAME, lambda f: replace(f, sha256=sha(b"other"))),
        INCONSISTENT, "HASH_MISMATCH"),
    "receipts hash mismatch (same size)": (
        _file_fact(RECEIPTS_NAME, lambda f: replace(f, sha256=sha(b"other"))),
        INCONSISTENT, "HASH_MISMATCH"),
    "suppress hash mismatch (same size)": (
        _file_fact(SUPPRESS_NAME, lambda f: replace(f, sha256=sha(b"other"))),
        INCONSISTENT, "HASH_MISMATCH"),
    "state file bigger than recorded": (
        _file_fact(STATE_NAME, lambda f: replace(f, size=f.size + 1)),
        INCONSISTENT, "HASH_MISMATCH"),
    "receipts file bigger (hash also differs)": (
        _file_fact(RECEIPTS_NAME, lambda f: FileFact(True, f.size + 10, sha(b"x"))),
        INCONSISTENT, "HASH_MISMATCH"),
    "signature value altered": (
        _simple(Ckpt, ev=lambda c: {"manifest": c.manifest().replace(
            json.loads(c.manifest())["signature"]["value"].encode(), b"0" * 64)}),
        INCONSISTENT, "SIGNATURE_MISMATCH"),
    "wrong key": (_simple(_keyed, policy=lambda c: {"key": OTHER_KEY}),
                  INCONSISTENT, "SIGNATURE_MISMATCH"),
    "unsigned checkpoint while a key is set": (
        _simple(Ckpt, policy=lambda c: {"key": KEY}), INCONSISTENT, "UNSIGNED_WITH_KEY"),
    "signed checkpoint read without key": (
        _simple(_keyed, policy=lambda c: {"key": None}), INCONSISTENT, "SIGNED_WITHOUT_KEY"),
    "unknown signature algorithm": (
        _bad_signature_object({"alg": "md5", "value": "0" * 32}),
        INCONSISTENT, "UNKNOWN_SIGNATURE_ALG"),
    "watermark differs from the state's (global)": (
        _simple(_state_watermark(lambda w: w.__setitem__("global_ms", 40_000))),
        INCONSISTENT, "WATERMARK_MISMATCH"),
    "watermark differs from the state's (one partition)": (
        _simple(_state_watermark(lambda w: w["partition_ms"].__setitem__(0, 48_000))),
        INCONSISTENT, "WATERMARK_MISMATCH"),
    "watermark differs from the state's (exhaustion)": (
        _simple(_state_watermark(lambda w: w["exhausted"].__setitem__(1, True))),
        INCONSISTENT, "WATERMARK_MISMATCH"),
    "receipts summary mismatch": (
        _simple(Ckpt, ev=_receipts_summary_mismatch),
        INCONSISTENT, "RECEIPTS_MISMATCH"),
    "receipt for a window the watermark has not closed": (
        _simple(_open_window(W - LATE + 1)), INCONSISTENT, "RECEIPT_FOR_OPEN_WINDOW"),
    "receipt far in the future": (
        _simple(_open_window(10**12)), INCONSISTENT, "RECEIPT_FOR_OPEN_WINDOW"),
    "watermark lower than the parent's": (
        _simple(Ckpt, parent=_lower_global), INCONSISTENT, "WATERMARK_REGRESSION"),
    "a partition watermark lower than the parent's": (
        _simple(Ckpt, parent=_lower_partition), INCONSISTENT, "WATERMARK_REGRESSION"),
    "a position lower than the parent's": (
        _simple(Ckpt, parent=_lower_position), INCONSISTENT, "POSITION_REGRESSION"),
    "a resume position lower than the parent's": (
        _simple(Ckpt, parent=_lower_resume), INCONSISTENT, "POSITION_REGRESSION"),
    "another pipeline's checkpoint": (
        _simple(Ckpt, policy=lambda c: {"pipeline": "refunds"}), INCONSISTENT, "OTHER_PIPELINE"),
    "pipeline fingerprint differs": (
        _simple(Ckpt, policy=lambda c: {"fingerprint": "0" * 64}),
        INCONSISTENT, "FINGERPRINT_MISMATCH"),
    "older than the freshness limit": (
        _simple(Ckpt, policy=lambda c: {"max_age_ms": NOW_MS - CREATED_MS - 1, "now_ms": NOW_MS}),
        INCONSISTENT, "STALE"),
    # -------------------------------------------------- order: presence first
    "missing file beats a bad signature": (
        _simple(_keyed, ev=lambda c: {"files": {c.path(RECEIPTS_NAME): c.facts()[
            c.path(RECEIPTS_NAME)]}}, policy=lambda c: {"key": OTHER_KEY}),
        PARTIAL, "FILE_MISSING"),
    "truncated file beats a hash mismatch elsewhere": (
        _simple(Ckpt, ev=lambda c: {"files": {
            c.path(STATE_NAME): FileFact(True, 1, sha(b"x")),
            c.path(RECEIPTS_NAME): FileFact(True, 10**6, sha(b"y"))}}),
        PARTIAL, "FILE_TRUNCATED"),
    "signature checked before hashes": (
        _simple(Ckpt, ev=lambda c: {"files": {
            **c.facts(), c.path(STATE_NAME): replace(c.facts()[c.path(STATE_NAME)],
                                                     sha256=sha(b"x"))}},
            policy=lambda c: {"key": KEY}),
        INCONSISTENT, "UNSIGNED_WITH_KEY"),
}


def _judge_case(name: str) -> Verdict:
    build, _, _ = CASES[name]
    ev, parent, policy = build()
    return judge(ev, parent, policy)


@pytest.mark.parametrize("name", list(CASES))
def test_verdict(name: str) -> None:
    _, verdict, reason = CASES[name]
    v = _judge_case(name)
    assert (v.verdict, v.reason) == (verdict, reason), v.message
    assert_well_formed(v)


@pytest.mark.parametrize("name", list(CASES))
def test_digest_is_deterministic(name: str) -> None:
    assert _judge_case(name).digest == _judge_case(name).digest
    assert _judge_case(name) == _judge_case(name)


def test_digests_differ_between_verdicts() -> None:
    by_outcome: dict[tuple[str, str], set[str]] = {}
    for name in CASES:
        v = _judge_case(name)
        by_outcome.setdefault((v.verdict, v.reason), set()).add(v.digest)
    seen: dict[str, tuple[str, str]] = {}
    for outcome, digests in by_outcome.items():
        for d in digests:
            assert d not in seen, f"{outcome} and {seen[d]} share a digest"
            seen[d] = outcome
    assert len({o[0] for o in by_outcome}) == 3


def test_digest_depends_on_the_checkpoint_id() -> None:
    a, b = Ckpt(cid=7), Ckpt(cid=8)
    va, vb = judge(a.evidence(), None, a.policy()), judge(b.evidence(), None, b.policy())
    assert va.verdict == vb.verdict == ATOMIC
    assert va.digest != vb.digest


def test_verdict_accessors() -> None:
    c = _keyed()
    ok = judge(c.evidence(), None, c.policy())
    assert ok.ok and ok.watermark_ms == W and ok.signer == "hmac-sha256"
    assert ok.manifest is not None and ok.manifest["id"] == CID
    assert ok.to_json() == {"id": CID, "verdict": ATOMIC, "reason": "OK",
                            "message": ok.message, "digest": ok.digest}
    bad = judge(c.evidence(), None, c.policy(key=None))
    assert not bad.ok and bad.watermark_ms is None and bad.signer == "hmac-sha256"
    plain = Ckpt()
    assert judge(plain.evidence(), None, plain.policy()).signer == "sha256"
    none = judge(c.evidence(manifest=None), None, c.policy())
    assert none.manifest is None and none.signer is None and none.watermark_ms is None


def test_judge_reads_nothing_but_its_arguments() -> None:
    """Same evidence, same verdict; the evidence is not modified."""
    c = Ckpt()
    ev = c.evidence()
    before = copy.deepcopy((dict(ev.files), dict(ev.state_meta or {}), dict(ev.receipts or {})))
    v1 = judge(ev, parent_of(c), c.policy())
    v2 = judge(ev, parent_of(c), c.policy())
    assert v1 == v2
    assert before == (dict(ev.files), dict(ev.state_meta or {}), dict(ev.receipts or {}))


# ================================================================ signature binds every field

def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        target: Any = body
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
    return change


TAMPERING: dict[str, Callable[[dict[str, Any]], None]] = {
    "format": _set(("format",), 2),
    "id": _set(("id",), CID + 1),
    "parent": _set(("parent",), CID - 2),
    "pipeline": _set(("pipeline",), "refunds"),
    "fingerprint": _set(("fingerprint",), "0" * 64),
    "definition": _set(("definition", "window", "size_ms"), 20_000),
    "created_ms": _set(("created_ms",), CREATED_MS + 1),
    "epoch": _set(("epoch",), 4),
    "lateness_ms": _set(("lateness_ms",), 0),
    "watermark.global_ms": _set(("watermark", "global_ms"), 41_001),
    "watermark.partition_ms": _set(("watermark", "partition_ms", 0), 49_001),
    "watermark.max_time": _set(("watermark", "max_time", 1), 42_001),
    "watermark.exhausted": _set(("watermark", "exhausted", 0), True),
    "watermark.max_delay_ms": _set(("watermark", "max_delay_ms"), 0),
    "positions.next_offset": _set(("positions", 0, "next_offset"), 121),
    "positions.partition": _set(("positions", 1, "partition"), "in/p9.jsonl"),
    "positions.resume": _set(("positions", 0, "resume", "byte"), 4097),
    "files.state.sha256": _set(("files", "state", "sha256"), "0" * 64),
    "files.receipts.bytes": _set(("files", "receipts", "bytes"), 1),
    "state.open_windows": _set(("state", "open_windows"), 5),
    "receipts.results": _set(("receipts", "results"), 15),
    "receipts.digest": _set(("receipts", "digest"), "e" * 64),
    "sinks.tokens": _set(("sinks", "results", "tokens"), ["part-4.jsonl"]),
    "counters.events": _set(("counters", "events"), 201),
    "a field added": _set(("extra",), 1),
    "a field removed (parent)": lambda b: b.pop("parent"),
    "a field removed (counters)": lambda b: b.pop("counters"),
    "integer written as float": _set(("epoch",), 3.0),
}


def test_tampering_table_covers_every_field() -> None:
    covered = {name.split(".")[0] for name in TAMPERING}
    assert set(Ckpt().body()) <= covered


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("field_name", list(TAMPERING))
def test_changing_any_field_breaks_the_signature(field_name: str, key: bytes | None) -> None:
    c = Ckpt(key=key)
    doc = json.loads(c.manifest())
    TAMPERING[field_name](doc)
    ev = c.evidence(manifest=json.dumps(doc, sort_keys=True, indent=1).encode())
    v = judge(ev, None, c.policy())
    assert (v.verdict, v.reason) == (INCONSISTENT, "SIGNATURE_MISMATCH"), v.message
    assert_well_formed(v)


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_reformatting_the_manifest_keeps_it_valid(key: bytes | None) -> None:
    """The signature covers the content, not the layout of the file."""
    c = Ckpt(key=key)
    doc = json.loads(c.manifest())
    compact = json.dumps(dict(reversed(list(doc.items())))).encode()
    v = judge(c.evidence(manifest=compact), None, c.policy())
    assert v.verdict == ATOMIC, v.message


# ================================================================ truncation and corruption

@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_every_truncation_of_the_manifest_is_partial(key: bytes | None) -> None:
    c = Ckpt(key=key)
    full = c.manifest()
    content = len(full.rstrip())  # what follows is the trailing newline only
    assert full[content:] == b"\n"
    ev, policy = c.evidence(), c.policy()
    for n in range(content):
        v = judge(replace(ev, manifest=full[:n]), None, policy)
        assert v.verdict == PARTIAL, (n, v.reason)
        assert v.reason == "MANIFEST_UNREADABLE"
        assert_well_formed(v)
    # cutting only the trailing newline leaves the same JSON document
    v = judge(c.evidence(manifest=full[:content]), None, c.policy())
    assert v.verdict == ATOMIC


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_every_single_byte_corruption_that_changes_the_manifest_is_rejected(
    key: bytes | None,
) -> None:
    c = Ckpt(key=key)
    full = c.manifest()
    original = json.loads(full)
    ev, policy = c.evidence(), c.policy()
    checked = 0
    for i in range(len(full)):
        for bit in (0x01, 0x04, 0x20, 0x80):
            mutated = bytearray(full)
            mutated[i] ^= bit
            try:
                same = json.loads(bytes(mutated)) == original
            except ValueError:
                same = False
            if same:
                continue
            v = judge(replace(ev, manifest=bytes(mutated)), None, policy)
            assert v.verdict != ATOMIC, (i, bit, bytes(mutated[max(0, i - 20):i + 20]))
            checked += 1
    assert checked > len(full) * 3


# ================================================================ garbage never raises

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=8,
)
field_names = st.sampled_from(
    [*REQUIRED_FIELDS, "signature", "parent", "lateness_ms", "created_ms", "id"]
)
garbage_docs = st.dictionaries(field_names | st.text(max_size=6), json_values, max_size=12)
garbage_policy = st.builds(
    Policy, key=st.sampled_from([None, KEY]), pipeline=st.none() | st.just(PIPELINE),
    fingerprint=st.none() | st.just(FINGERPRINT),
    max_age_ms=st.none() | st.integers(0, 10**6), now_ms=st.none() | st.integers(0, 10**13),
)


@settings(max_examples=100, deadline=None)
@given(manifest=st.binary(max_size=300), policy=garbage_policy)
def test_random_bytes_as_manifest(manifest: bytes, policy: Policy) -> None:
    c = Ckpt()
    v = judge(c.evidence(manifest=manifest), None, policy)
    assert v.verdict != ATOMIC
    assert_well_formed(v)


@settings(max_examples=60, deadline=None)
@given(doc=garbage_docs, policy=garbage_policy, parent=st.none() | garbage_docs)
def test_random_json_objects_as_manifest(
    doc: dict[str, Any], policy: Policy, parent: dict[str, Any] | None
) -> None:
    c = Ckpt()
    v = judge(c.evidence(manifest=json.dumps(doc).encode()), parent, policy)
    assert v.verdict != ATOMIC
    assert_well_formed(v)


@settings(max_examples=100, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(sorted(Ckpt().body())), json_values,
                              min_size=1, max_size=3),
       key=st.sampled_from([None, KEY]))
def test_random_fields_in_an_otherwise_valid_manifest_still_fail_signature(
    fields: dict[str, Any], key: bytes | None
) -> None:
    """Garbage written over fields after signing: never ATOMIC, never an exception."""
    c = Ckpt(key=key)
    doc = json.loads(c.manifest())
    doc.update(fields)
    v = judge(c.evidence(manifest=json.dumps(doc).encode()), None, c.policy())
    if canonical(doc) == canonical(json.loads(c.manifest())):
        assert v.verdict == ATOMIC
    else:
        assert v.verdict != ATOMIC
    assert_well_formed(v)


# Garbage that carries a valid signature: the writer (or anyone, for the unkeyed
# digest) produced it. The guard must still answer with a verdict, not raise.
_SIGNED_GARBAGE_BUG = (
    "guard.judge raises (AttributeError/TypeError/ValueError) on a well-signed manifest "
    "or evidence with malformed values instead of returning a verdict"
)


@settings(max_examples=100, deadline=None)
@example(fields={"watermark": []}, key=None)
@given(fields=st.dictionaries(st.sampled_from(sorted(Ckpt().body())), json_values,
                              min_size=1, max_size=3),
       key=st.sampled_from([None, KEY]))
def test_signed_garbage_fields_never_raise(fields: dict[str, Any], key: bytes | None) -> None:
    c = Ckpt(key=key)
    body = c.body()
    body.update(fields)
    v = judge(c.evidence(manifest=sealed(body, key)), None, c.policy())
    assert_well_formed(v)


@settings(max_examples=100, deadline=None)
@example(state_meta={"watermark": None}, epochs=[])
@given(state_meta=st.none() | st.dictionaries(st.just("watermark") | st.text(max_size=4),
                                              json_values, max_size=2),
       epochs=json_values)
def test_garbage_evidence_never_raises(state_meta: dict[str, Any] | None, epochs: Any) -> None:
    c = Ckpt()
    c.epochs = epochs
    v = judge(c.evidence(state_meta=state_meta), None, c.policy())
    assert_well_formed(v)


@settings(max_examples=60, deadline=None)
@given(parent=garbage_docs)
def test_garbage_parent_never_raises(parent: dict[str, Any]) -> None:
    c = Ckpt()
    v = judge(c.evidence(), parent, c.policy())
    assert_well_formed(v)


@settings(max_examples=60, deadline=None)
@given(
    parent_wm=st.dictionaries(st.sampled_from(["global_ms", "partition_ms"]), json_values),
    parent_pos=json_values,
)
@example(parent_wm={"global_ms": 0, "partition_ms": [None]}, parent_pos=[])
def test_garbage_parent_watermark_never_raises(parent_wm: dict[str, Any], parent_pos: Any) -> None:
    """A parent manifest is read unverified (it may be corrupt): judge the child anyway."""
    c = Ckpt()
    v = judge(c.evidence(), {"watermark": parent_wm, "positions": parent_pos}, c.policy())
    assert_well_formed(v)


# ================================================================ minimal reproductions of bugs

def test_state_without_watermark_metadata_is_a_verdict_not_an_exception() -> None:
    # LocalCheckpointStore.evidence gives {"watermark": None} for a state file
    # whose Arrow schema lacks the sealstream.watermark key.
    c = Ckpt()
    v = judge(c.evidence(state_meta={"watermark": None}), None, c.policy())
    assert v.verdict == INCONSISTENT and v.reason == "WATERMARK_MISMATCH"
    assert_well_formed(v)


def test_non_integer_file_size_in_manifest_is_a_verdict() -> None:
    c = Ckpt()
    body = c.body()
    body["files"]["state"]["bytes"] = "many"
    v = judge(c.evidence(manifest=sealed(body)), None, c.policy())
    assert v.verdict == PARTIAL and v.reason == "MANIFEST_INCOMPLETE"
    assert_well_formed(v)


def test_malformed_receipt_epoch_is_a_verdict() -> None:
    c = Ckpt()
    c.epochs = ["garbage"]  # type: ignore[list-item]
    v = judge(c.evidence(), None, c.policy())
    assert v.verdict != ATOMIC
    assert_well_formed(v)


def test_corrupt_parent_partition_watermark_is_ignored() -> None:
    c = Ckpt()
    parent = parent_of(c)
    parent["watermark"]["partition_ms"] = [None, None]
    v = judge(c.evidence(), parent, c.policy())
    assert v.verdict == ATOMIC
    assert_well_formed(v)


def test_manifest_under_another_checkpoint_id_is_inconsistent() -> None:
    old = Ckpt(cid=5, parent=4)
    ev = replace(old.evidence(), checkpoint_id=9)  # cp-5's files, published as cp-9
    v = judge(ev, None, old.policy())
    assert v.verdict == INCONSISTENT
    assert_well_formed(v, cid=9)


def test_message_stays_one_line_with_a_multiline_state_error() -> None:
    c = Ckpt()
    v = judge(c.evidence(state_error="Invalid IPC stream\nextra detail"), None, c.policy())
    assert v.verdict == PARTIAL
    assert one_line(v.message)


def test_guard_module_is_pure() -> None:
    """No file system or environment access in the guard module."""
    src = guard.__file__
    with open(src, encoding="utf-8") as f:
        text = f.read()
    for forbidden in ("import os", "open(", "pathlib", "environ", "read_bytes"):
        assert forbidden not in text, forbidden


def test_canonical_body_matches_signed_bytes() -> None:
    """Sanity check of the fixture: the sealed manifest signs the body we built."""
    c = Ckpt()
    doc = json.loads(c.manifest())
    sig = doc.pop("signature")
    assert sig == {"alg": "sha256", "value": sha(canonical(c.body()))}
    assert doc == c.body()
