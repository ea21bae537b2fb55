"""The agent checkpoint guard: a pure function from what was read to a verdict.

Same vocabulary and rules as the stream guard (:mod:`sealstream.checkpoint.guard`):
presence before coherence, the first problem found is the reason, never raises on
garbage. The store gathers :class:`CheckpointEvidence` (plaintext rows, or why a
row could not be opened) and :func:`judge` decides:

* ``PARTIAL_CHECKPOINT_REJECT`` — something is missing or unreadable: no manifest
  (``NO_MANIFEST``), a truncated one (``MANIFEST_UNREADABLE``), no signature, a
  missing or short channel blob (``FILE_MISSING``, ``FILE_TRUNCATED``), a missing
  writes index (``NO_WRITES_INDEX``) or a pending write it lists (``WRITE_MISSING``),
  an unreadable row (``ROW_UNREADABLE``).
* ``INCONSISTENT_STATE`` — all present but not coherent: a signature that does not
  verify (``SIGNATURE_MISMATCH``, ``UNSIGNED_WITH_KEY``, ``SIGNED_WITHOUT_KEY``), a
  row bound to another execution, namespace or checkpoint (``ROW_MISMATCH``), a
  blob or write that differs from its recorded SHA-256 (``HASH_MISMATCH``), a write
  the index does not list (``UNLISTED_WRITE``), an envelope that does not open
  (``KEY_MISMATCH``, ``DECRYPTION_FAILED``, ``ENCRYPTED_WITHOUT_KEY``,
  ``PLAINTEXT_WHEN_ENCRYPTED``).
* ``ATOMIC_CHECKPOINT`` — every row present and verified: resume from it.

:func:`judge_history` adds what only the whole history shows: a checkpoint the
signed head names, or a parent above the retention floor, that is gone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sealstream.agents._seal import KeyRing, SignKey
from sealstream.checkpoint import signing
from sealstream.checkpoint.guard import ATOMIC, INCONSISTENT, PARTIAL
from sealstream.checkpoint.manifest import signature_ok

__all__ = [
    "ATOMIC",
    "INCONSISTENT",
    "PARTIAL",
    "AgentVerdict",
    "CheckpointEvidence",
    "RowRead",
    "judge",
    "judge_history",
    "judge_row",
]

REQUIRED = ("format", "kind", "execution", "ns", "id", "parent", "created_ms", "blobs",
            "writes", "body", "row")

_SIGNATURE_TEXT = {
    "UNSIGNED_WITH_KEY": "is unsigned (sha256) but SEALSTREAM_CHECKPOINT_KEY is set",
    "SIGNED_WITHOUT_KEY": "is signed (hmac-sha256) but SEALSTREAM_CHECKPOINT_KEY is not set",
    "SIGNATURE_MISMATCH": "signature does not verify (wrong key or altered row)",
    "UNKNOWN_SIGNATURE_ALG": "uses an unknown signature algorithm",
    "NO_SIGNATURE": "has a malformed signature",
    **signing.MESSAGES,
}


@dataclass(frozen=True)
class RowRead:
    """One row as the store read it: its address, its plaintext (None when absent
    or unopenable) and, when it could not be opened, ``(reason code, message)``."""

    addr: tuple[str, str, str, str]
    data: bytes | None
    problem: tuple[str, str] | None = None


@dataclass(frozen=True)
class CheckpointEvidence:
    """Everything read for one agent checkpoint."""

    manifest: RowRead
    blobs: Mapping[str, RowRead] = field(default_factory=dict)
    writes_index: RowRead | None = None
    writes: Mapping[str, RowRead] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentVerdict:
    """The guard's decision about one agent checkpoint (or one ledger row)."""

    execution: str
    ns: str
    checkpoint_id: str
    verdict: str
    reason: str
    message: str
    manifest: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == ATOMIC

    def to_json(self) -> dict[str, Any]:
        return {"execution": self.execution, "ns": self.ns, "id": self.checkpoint_id,
                "verdict": self.verdict, "reason": self.reason, "message": self.message}


def _v(addr: Sequence[str], verdict: str, reason: str, message: str,
       doc: Mapping[str, Any] | None = None) -> AgentVerdict:
    return AgentVerdict(addr[1], addr[2], addr[3], verdict, reason, " ".join(message.split()),
                        doc)


def _what(addr: Sequence[str]) -> str:
    return f"{addr[0]} row {addr[3]!r} of {addr[1]!r}/{addr[2]!r}"


def judge_row(row: RowRead, key: SignKey, *, missing: str = "ROW_MISSING",
              unreadable: str = "ROW_UNREADABLE") -> tuple[AgentVerdict | None,
                                                           dict[str, Any] | None]:
    """Presence and coherence of one signed row: (a rejection or None, its document).

    Presence problems come back first only for this row; callers that combine rows
    use :func:`_presence` and :func:`_coherence` separately.
    """
    bad = _presence(row, missing, unreadable)
    if bad is not None:
        return bad, None
    doc = _parse(row) if row.problem is None else None
    bad = _coherence(row, doc, key)
    return bad, doc


def _parse(row: RowRead) -> dict[str, Any] | None:
    try:
        doc = json.loads(row.data or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _presence(row: RowRead, missing: str, unreadable: str) -> AgentVerdict | None:
    a = row.addr
    if row.problem is not None:
        code, text = row.problem
        if code == "FILE_TRUNCATED":
            return _v(a, PARTIAL, unreadable, f"{_what(a)} is truncated ({text})")
        return None  # an envelope that does not open is a coherence problem
    if row.data is None:
        return _v(a, PARTIAL, missing, f"{_what(a)} is missing")
    doc = _parse(row)
    if doc is None:
        return _v(a, PARTIAL, unreadable, f"{_what(a)} is truncated or unreadable")
    if "signature" not in doc:
        return _v(a, PARTIAL, "NO_SIGNATURE", f"{_what(a)} has no signature", doc)
    return None


def _coherence(row: RowRead, doc: Mapping[str, Any] | None, key: SignKey
               ) -> AgentVerdict | None:
    a = row.addr
    if row.problem is not None:
        code, text = row.problem
        return _v(a, INCONSISTENT, code, f"{_what(a)}: {text}")
    assert doc is not None
    if isinstance(key, KeyRing):
        known, chosen = key.for_row(doc)
        if not known:
            return _v(a, INCONSISTENT, "UNKNOWN_KEY_ID",
                      f"{_what(a)} is signed with key id {doc.get('kid', key.unnamed)!r}, "
                      f"which is not in the key ring ({', '.join(sorted(key.keys))})", doc)
        key = chosen
    ok, code = signature_ok(dict(doc), key)
    if not ok:
        verdict = PARTIAL if code == "NO_SIGNATURE" else INCONSISTENT
        return _v(a, verdict, code, f"{_what(a)} {_SIGNATURE_TEXT[code]}", doc)
    if doc.get("row") != list(a):
        return _v(a, INCONSISTENT, "ROW_MISMATCH",
                  f"{_what(a)} was written for {doc.get('row')!r} (a row moved or copied "
                  "from another execution, namespace or checkpoint)", doc)
    return None


def judge(ev: CheckpointEvidence, key: SignKey) -> AgentVerdict:
    """Classify one agent checkpoint. Never raises."""
    try:
        return _judge(ev, key)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        return _v(ev.manifest.addr, INCONSISTENT, "MANIFEST_MALFORMED",
                  f"checkpoint {ev.manifest.addr[3]!r}: a malformed value "
                  f"({type(exc).__name__}: {exc})")


def _judge(ev: CheckpointEvidence, key: SignKey) -> AgentVerdict:
    m = ev.manifest
    a = m.addr
    cid = a[3]
    # ---------------------------------------------------------------- presence
    bad = _presence(m, "NO_MANIFEST", "MANIFEST_UNREADABLE")
    if bad is not None:
        return bad
    doc = _parse(m) if m.problem is None else None
    if doc is not None:
        lacking = [f for f in REQUIRED if f not in doc]
        if lacking:
            return _v(a, PARTIAL, "MANIFEST_INCOMPLETE",
                      f"checkpoint {cid!r}: manifest lacks {', '.join(lacking)}", doc)
        blobs = doc["blobs"]
        if not isinstance(blobs, dict):
            return _v(a, PARTIAL, "MANIFEST_INCOMPLETE",
                      f"checkpoint {cid!r}: blob list is malformed", doc)
        for name, entry in sorted(blobs.items()):
            if (not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str)
                    or isinstance(entry.get("bytes"), bool)
                    or not isinstance(entry.get("bytes"), int)):
                return _v(a, PARTIAL, "MANIFEST_INCOMPLETE",
                          f"checkpoint {cid!r}: blob entry {name!r} is malformed", doc)
            blob = ev.blobs.get(name)
            if blob is None or (blob.data is None and blob.problem is None):
                return _v(a, PARTIAL, "FILE_MISSING",
                          f"checkpoint {cid!r}: channel blob {name!r} is missing", doc)
            if blob.problem is not None and blob.problem[0] == "FILE_TRUNCATED":
                return _v(a, PARTIAL, "FILE_TRUNCATED",
                          f"checkpoint {cid!r}: channel blob {name!r} is truncated", doc)
            if blob.data is not None and len(blob.data) < entry["bytes"]:
                return _v(a, PARTIAL, "FILE_TRUNCATED",
                          f"checkpoint {cid!r}: channel blob {name!r} is truncated "
                          f"({len(blob.data)} of {entry['bytes']} bytes)", doc)
        index: dict[str, Any] | None = None
        if doc["writes"]:
            if ev.writes_index is None:
                return _v(a, PARTIAL, "NO_WRITES_INDEX",
                          f"checkpoint {cid!r}: its writes index was not read", doc)
            bad = _presence(ev.writes_index, "NO_WRITES_INDEX", "ROW_UNREADABLE")
            if bad is not None:
                return _v(a, bad.verdict, bad.reason, bad.message, doc)
            index = _parse(ev.writes_index) if ev.writes_index.problem is None else None
            listed = index.get("writes", {}) if index is not None else {}
            if not isinstance(listed, dict):
                return _v(a, PARTIAL, "ROW_UNREADABLE",
                          f"checkpoint {cid!r}: writes index is malformed", doc)
            for name in sorted(listed):
                row = ev.writes.get(name, RowRead(("w", a[1], a[2], name), None))
                bad = _presence(row, "WRITE_MISSING", "ROW_UNREADABLE")
                if bad is not None:
                    return _v(a, bad.verdict, bad.reason,
                              f"checkpoint {cid!r}: pending write: {bad.message}", doc)
    # ---------------------------------------------------------------- coherence
    bad = _coherence(m, doc, key)
    if bad is not None:
        return bad
    assert doc is not None
    if doc["id"] != cid or doc["execution"] != a[1] or doc["ns"] != a[2]:
        return _v(a, INCONSISTENT, "ROW_MISMATCH",
                  f"checkpoint {cid!r}: its manifest names another checkpoint", doc)
    for name, entry in sorted(doc["blobs"].items()):
        blob = ev.blobs[name]
        if blob.problem is not None:
            code, text = blob.problem
            return _v(a, INCONSISTENT, code, f"checkpoint {cid!r}: blob {name!r}: {text}", doc)
        data = blob.data or b""
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            return _v(a, INCONSISTENT, "HASH_MISMATCH",
                      f"checkpoint {cid!r}: channel blob {name!r} does not match its "
                      "SHA-256 in the manifest", doc)
    if doc["writes"]:
        assert ev.writes_index is not None
        idx = _parse(ev.writes_index) if ev.writes_index.problem is None else None
        bad = _coherence(ev.writes_index, idx, key)
        if bad is not None:
            return _v(a, bad.verdict, bad.reason, f"checkpoint {cid!r}: {bad.message}", doc)
        assert idx is not None
        listed = idx["writes"]
        for name, row in sorted(ev.writes.items()):
            if name not in listed:
                return _v(a, INCONSISTENT, "UNLISTED_WRITE",
                          f"checkpoint {cid!r}: pending write {name!r} is not in the signed "
                          "writes index (inserted behind the saver's back)", doc)
            wdoc = _parse(row) if row.problem is None else None
            bad = _coherence(row, wdoc, key)
            if bad is not None:
                return _v(a, bad.verdict, bad.reason,
                          f"checkpoint {cid!r}: pending write: {bad.message}", doc)
            digest = hashlib.sha256(row.data or b"").hexdigest()
            if digest != listed[name]:
                return _v(a, INCONSISTENT, "HASH_MISMATCH",
                          f"checkpoint {cid!r}: pending write {name!r} differs from its "
                          "SHA-256 in the writes index (replaced by another signed row)", doc)
    return _v(a, ATOMIC, "OK", f"checkpoint {cid!r} is complete and verified", doc)


def judge_history(execution: str, ns: str, verdicts: Sequence[AgentVerdict],
                  parents: Mapping[str, str | None], meta: RowRead | None,
                  key: SignKey) -> list[AgentVerdict]:
    """Verdicts for what is *gone* from a history, given the checkpoints present
    (their ids and parents) and the signed head/retention marker ``meta``.

    A checkpoint named by the head, or a parent at or above the retention floor
    and not recorded as deliberately dropped, that is absent is
    ``PARTIAL_CHECKPOINT_REJECT`` / ``NO_MANIFEST``. A marker that
    does not verify is reported with its own verdict. Never raises.
    """
    out: list[AgentVerdict] = []
    present = {v.checkpoint_id for v in verdicts}
    head, floor, dropped = None, "", set()
    if meta is not None and (meta.data is not None or meta.problem is not None):
        bad, doc = judge_row(meta, key)
        if bad is not None:
            out.append(bad)
        elif doc is not None:
            head = str(doc["head"]) if isinstance(doc.get("head"), str) else None
            floor = str(doc["floor"]) if isinstance(doc.get("floor"), str) else ""
            if isinstance(doc.get("dropped"), list):
                dropped = {str(d) for d in doc["dropped"]}
    elif present:
        out.append(AgentVerdict(execution, ns, "(head)", PARTIAL, "NO_MANIFEST",
                                f"history {execution!r}/{ns!r}: its signed head marker is "
                                "missing"))
    gone: set[str] = set()
    if head and head not in present:
        gone.add(head)
    for parent in parents.values():
        if parent and parent not in present and parent >= str(floor) \
                and parent not in dropped:
            gone.add(parent)
    for cid in sorted(gone):
        out.append(AgentVerdict(execution, ns, cid, PARTIAL, "NO_MANIFEST",
                                f"checkpoint {cid!r} of {execution!r}/{ns!r} is referenced "
                                "by the history but its rows are gone"))
    return out
