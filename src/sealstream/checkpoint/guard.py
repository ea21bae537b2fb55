"""The checkpoint guard: a pure function from what was read to a verdict.

:func:`judge` never touches a disk. The store gathers :class:`Evidence` (the
manifest's bytes, facts about each file, what the state file's metadata
says, the parsed receipts) and the guard decides:

* ``PARTIAL_CHECKPOINT_REJECT`` — a component is missing or unreadable: no or
  truncated manifest (or one over the size or nesting bound of
  :func:`~sealstream.checkpoint.manifest.load_json`), no signature, a referenced
  file absent or cut short (shorter than recorded and not a whole file), no emission
  receipts. Recovery falls back to the previous one.
* ``INCONSISTENT_STATE`` — everything is present but does not cohere: a hash
  mismatch, a signature that does not verify (wrong key, tampering, unsigned
  while a key is set, signed but read without the key), a manifest watermark
  that differs from the state's, receipts for windows the watermark has not
  closed, positions or watermark lower than the parent's, another pipeline's
  checkpoint, a different pipeline fingerprint, or older than a freshness
  limit; an encrypted file that does not decrypt (no key, another key, altered)
  or a plaintext one while encryption is required; a file name no writer produces
  (``FILE_PATH_INVALID``: absolute, ``..``, another checkpoint's own file), a name
  that holds no regular file (``NOT_A_REGULAR_FILE``), an Arrow file with an
  extension type or a type no state has (``STATE_SCHEMA``). Recovery rejects it and
  falls back.
* ``ATOMIC_CHECKPOINT`` — every component present and verified, signature
  valid: resume from it.

Checks run in that order (presence before coherence), so the reason given is
the first problem found; except that when the store was given the key and found
the signature bad, it read no file the manifest names (``Evidence.unread``), and
the verdict is the signature's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sealstream.checkpoint import emission_log, signing
from sealstream.checkpoint.manifest import (
    RECEIPTS_NAME,
    ROOTS_FIELD,
    load_json,
    path_problem,
    signature_ok,
)

ATOMIC = "ATOMIC_CHECKPOINT"
PARTIAL = "PARTIAL_CHECKPOINT_REJECT"
INCONSISTENT = "INCONSISTENT_STATE"

REQUIRED_FIELDS = (
    "format",
    "id",
    "pipeline",
    "fingerprint",
    "watermark",
    "positions",
    "files",
    "receipts",
    "sinks",
)


@dataclass(frozen=True)
class FileFact:
    """What the store saw of one file: existence, size and SHA-256."""

    exists: bool
    size: int = 0
    sha256: str = ""
    #: (reason code, message) when an encrypted file could not be opened; ``size`` is
    #: then the plaintext size its envelope would hold (so truncation stays visible)
    problem: tuple[str, str] | None = None
    #: the bytes form a whole file of their kind (an Arrow stream up to its end
    #: marker, a JSON document): shorter than recorded, such a file is another
    #: file (say, copied from another checkpoint), not a write cut short
    whole: bool = False


@dataclass(frozen=True)
class Evidence:
    """Everything read for one checkpoint."""

    checkpoint_id: int
    manifest: bytes | None
    files: Mapping[str, FileFact] = field(default_factory=dict)
    state_meta: Mapping[str, Any] | None = None
    state_error: str | None = None
    receipts: Mapping[str, Any] | None = None
    #: (reason code, message) when the manifest could not be decrypted (``manifest``
    #: is then None) or is plaintext although encryption is required
    manifest_problem: tuple[str, str] | None = None
    #: the signature's reason code when the store, given the key, found that the
    #: manifest's signature does not verify and so read none of the files it names
    unread: str | None = None
    #: why an Arrow file (state, base, delta, suppression) has columns a state does
    #: not have (an extension type, an unexpected type): "<path>: <problem>"
    schema_error: str | None = None
    #: (reason code, message) when a segment of the emission log that ``receipts``
    #: names is missing or altered (checkpoint.log_segments); ``receipts["log"]`` is
    #: otherwise the whole log, segments resolved
    log_problem: tuple[str, str] | None = None


#: ``store.evidence(cid, key=UNCHECKED)``: read the files without checking the
#: signature first (the guard still checks it)
UNCHECKED: Any = type("Unchecked", (), {"__repr__": lambda self: "UNCHECKED"})()


#: Reasons the store gives for files it could not decrypt (see checkpoint.crypto).
ENCRYPTION_REASONS = (
    "ENCRYPTED_WITHOUT_KEY",
    "KEY_MISMATCH",
    "DECRYPTION_FAILED",
    "PLAINTEXT_WHEN_ENCRYPTED",
)


@dataclass(frozen=True)
class Policy:
    """What the reader expects: key, pipeline identity, freshness."""

    key: bytes | None = None
    pipeline: str | None = None
    fingerprint: str | None = None
    max_age_ms: int | None = None
    now_ms: int | None = None
    #: a checkpoint must sign its epoch's Merkle receipt root (``[checkpoint]
    #: require_receipts``); one written before Merkle receipts is PARTIAL
    require_receipt_roots: bool = False


@dataclass(frozen=True)
class Verdict:
    """The guard's decision about one checkpoint."""

    checkpoint_id: int
    verdict: str
    reason: str
    message: str
    manifest: Mapping[str, Any] | None = None
    digest: str = ""
    #: the rebuildable components (roles) that are missing or damaged while everything
    #: else verified (:func:`judge_resumable`): recovery resumes and rebuilds them
    rebuild: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.verdict == ATOMIC

    @property
    def resumable(self) -> bool:
        """ATOMIC, or PARTIAL with only rebuildable components missing or damaged."""
        return self.ok or bool(self.rebuild)

    @property
    def watermark_ms(self) -> int | None:
        if self.manifest is None or not self.resumable:
            return None
        return int(self.manifest["watermark"]["global_ms"])

    @property
    def signer(self) -> str | None:
        if self.manifest is None:
            return None
        sig = self.manifest.get("signature")
        return str(sig.get("alg")) if isinstance(sig, dict) else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.checkpoint_id,
            "verdict": self.verdict,
            "reason": self.reason,
            "message": self.message,
            "digest": self.digest,
        }
        if self.rebuild:
            out["rebuild"] = list(self.rebuild)
        return out


def _verdict(
    ev: Evidence, verdict: str, reason: str, message: str, doc: Mapping[str, Any] | None = None
) -> Verdict:
    sig = ""
    if doc is not None and isinstance(doc.get("signature"), dict):
        sig = str(doc["signature"].get("value", ""))
    blob = json.dumps([ev.checkpoint_id, verdict, reason, sig]).encode()
    message = " ".join(message.split())  # always one line
    return Verdict(
        ev.checkpoint_id, verdict, reason, message, doc, hashlib.sha256(blob).hexdigest()
    )


def judge(ev: Evidence, parent: Mapping[str, Any] | None, policy: Policy) -> Verdict:
    """Classify one checkpoint. ``parent`` is the parsed manifest of the
    checkpoint it names as parent, when that one is still readable.

    Never raises: a manifest whose values have the wrong shape is rejected.
    """
    try:
        return _judge(ev, parent, policy)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError,
            RecursionError) as exc:
        doc = None
        try:
            parsed = load_json(ev.manifest or b"")
            doc = parsed if isinstance(parsed, dict) else None
        except ValueError:
            pass
        return _verdict(ev, INCONSISTENT, "MANIFEST_MALFORMED",
                        f"checkpoint {ev.checkpoint_id}: manifest has a malformed value "
                        f"({type(exc).__name__}: {exc})", doc)


def _judge(ev: Evidence, parent: Mapping[str, Any] | None, policy: Policy) -> Verdict:
    cid = ev.checkpoint_id
    # ---------------------------------------------------------------- presence
    if ev.manifest_problem is not None:
        code, text = ev.manifest_problem
        if code == "FILE_TRUNCATED":
            return _verdict(ev, PARTIAL, "MANIFEST_UNREADABLE",
                            f"checkpoint {cid}: encrypted manifest is truncated ({text})")
        return _verdict(ev, INCONSISTENT, code, f"checkpoint {cid}: manifest: {text}")
    if ev.manifest is None:
        return _verdict(ev, PARTIAL, "NO_MANIFEST", f"checkpoint {cid} has no manifest "
                        "(its writer stopped before publishing it)")
    try:
        doc = load_json(ev.manifest, "manifest")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _verdict(ev, PARTIAL, "MANIFEST_UNREADABLE",
                        f"checkpoint {cid}: manifest is truncated or unreadable")
    except ValueError as exc:  # over the size or nesting bound: never a writer's
        return _verdict(ev, PARTIAL, "MANIFEST_UNREADABLE", f"checkpoint {cid}: {exc}")
    if not isinstance(doc, dict):
        return _verdict(ev, PARTIAL, "MANIFEST_UNREADABLE",
                        f"checkpoint {cid}: manifest is not a JSON object")
    if "signature" not in doc:
        if signing.trusted_keys():  # no downgrade: a stripped signature is not "partial"
            return _signature_verdict(ev, cid, signing.REQUIRED, doc)
        return _verdict(ev, PARTIAL, "NO_SIGNATURE", f"checkpoint {cid}: manifest has no signature",
                        doc)
    missing = [f for f in REQUIRED_FIELDS if f not in doc]
    if missing:
        return _verdict(ev, PARTIAL, "MANIFEST_INCOMPLETE",
                        f"checkpoint {cid}: manifest lacks {', '.join(missing)}", doc)
    files = doc["files"]
    if not isinstance(files, dict):
        return _verdict(ev, PARTIAL, "MANIFEST_INCOMPLETE",
                        f"checkpoint {cid}: manifest's file list is malformed", doc)
    for role, entry in sorted(files.items()):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("path"), str)
            or not isinstance(entry.get("sha256"), str)
            or isinstance(entry.get("bytes"), bool)
            or not isinstance(entry.get("bytes"), int)
        ):
            return _verdict(ev, PARTIAL, "MANIFEST_INCOMPLETE",
                            f"checkpoint {cid}: file entry {role!r} is malformed", doc)
    if ev.unread is not None:
        # the store found the signature bad and read nothing the manifest names
        ok, code = signature_ok(doc, policy.key)
        if ok:
            return _verdict(ev, PARTIAL, "FILES_UNREAD",
                            f"checkpoint {cid}: files were not read (the store checked the "
                            "signature with another key)", doc)
        return _signature_verdict(ev, cid, code, doc)
    for role, entry in sorted(files.items()):
        bad_path = path_problem(cid, str(role), entry["path"])
        if bad_path is not None or entry["bytes"] < 0:
            why = bad_path or "has a negative size"
            return _verdict(ev, INCONSISTENT, "FILE_PATH_INVALID",
                            f"checkpoint {cid}: {role} file {entry['path'][:200]!r} {why}", doc)
    for role, entry in sorted(files.items()):
        fact = ev.files.get(str(entry["path"]), FileFact(False))
        if fact.problem is not None and fact.problem[0] == "NOT_A_REGULAR_FILE":
            return _verdict(ev, INCONSISTENT, "NOT_A_REGULAR_FILE",
                            f"checkpoint {cid}: {role} file {fact.problem[1]}", doc)
        if not fact.exists:
            code = "NO_RECEIPTS" if str(entry["path"]).endswith(RECEIPTS_NAME) else "FILE_MISSING"
            what = "emission receipts" if code == "NO_RECEIPTS" else f"{role} file"
            return _verdict(ev, PARTIAL, code,
                            f"checkpoint {cid}: {what} {entry['path']} is missing", doc)
        if fact.size < int(entry.get("bytes", 0)) and not fact.whole:
            return _verdict(ev, PARTIAL, "FILE_TRUNCATED",
                            f"checkpoint {cid}: {entry['path']} is truncated "
                            f"({fact.size} of {entry['bytes']} bytes)", doc)
    if "receipts" not in files:
        return _verdict(ev, PARTIAL, "NO_RECEIPTS",
                        f"checkpoint {cid}: no emission receipts recorded", doc)
    # ---------------------------------------------------------------- coherence
    ok, code = signature_ok(doc, policy.key)
    if not ok:
        return _signature_verdict(ev, cid, code, doc)
    named = doc.get("parent")
    if named is not None and (isinstance(named, bool) or not isinstance(named, int)
                              or not 1 <= named < cid):
        # a checkpoint continues from an older one; itself, a newer one or a value that
        # is no id would make itself (or nothing) the yardstick of its own coherence
        return _verdict(ev, INCONSISTENT, "MANIFEST_MALFORMED",
                        f"checkpoint {cid}: its parent {str(named)[:40]!r} is not the id of "
                        "an older checkpoint", doc)
    for role, entry in sorted(files.items()):
        problem = ev.files[str(entry["path"])].problem
        if problem is not None:
            code, text = problem
            verdict = PARTIAL if code == "FILE_TRUNCATED" else INCONSISTENT
            return _verdict(ev, verdict, code, f"checkpoint {cid}: {role} file: {text}", doc)
    for role, entry in sorted(files.items()):
        fact = ev.files[str(entry["path"])]
        if fact.size != int(entry.get("bytes", -1)) or fact.sha256 != entry.get("sha256"):
            return _verdict(ev, INCONSISTENT, "HASH_MISMATCH",
                            f"checkpoint {cid}: {role} file {entry['path']} does not match its "
                            "SHA-256 in the manifest", doc)
    if ev.schema_error is not None:
        return _verdict(ev, INCONSISTENT, "STATE_SCHEMA",
                        f"checkpoint {cid}: {ev.schema_error}", doc)
    if ev.state_error is not None or ev.state_meta is None:
        return _verdict(ev, PARTIAL, "STATE_UNREADABLE",
                        f"checkpoint {cid}: state cannot be read ({ev.state_error})", doc)
    if ev.receipts is None:
        return _verdict(ev, PARTIAL, "NO_RECEIPTS",
                        f"checkpoint {cid}: emission receipts cannot be read", doc)
    wm = doc["watermark"]
    if doc["id"] != cid:
        return _verdict(ev, INCONSISTENT, "ID_MISMATCH",
                        f"checkpoint {cid}: its manifest says it is checkpoint {doc['id']} "
                        "(a manifest copied from elsewhere)", doc)
    state_wm = ev.state_meta.get("watermark")
    if state_wm != wm:
        def g(w: Any) -> Any:
            return w.get("global_ms") if isinstance(w, dict) else w

        return _verdict(ev, INCONSISTENT, "WATERMARK_MISMATCH",
                        f"checkpoint {cid}: manifest watermark {g(wm)} differs from "
                        f"the state's {g(state_wm)}", doc)
    if ev.receipts.get("summary") != doc["receipts"]:
        return _verdict(ev, INCONSISTENT, "RECEIPTS_MISMATCH",
                        f"checkpoint {cid}: receipts do not match the manifest's summary", doc)
    roots = doc.get(ROOTS_FIELD)
    if roots is not None:
        last = (ev.receipts.get("epochs") or [{}])[-1]
        res = last.get("results", {}) if isinstance(last, dict) else {}
        if not isinstance(roots, dict) or roots.get("epoch") != last.get("epoch") \
                or roots.get("results") != {"count": res.get("count"), "root": res.get("root")}:
            return _verdict(ev, INCONSISTENT, "RECEIPTS_MISMATCH",
                            f"checkpoint {cid}: the signed receipt root does not match the "
                            "epoch's receipts", doc)
    signed_log = doc.get(emission_log.LOG_FIELD)
    if ev.log_problem is not None:
        code, text = ev.log_problem
        return _verdict(ev, PARTIAL if code == "LOG_SEGMENT_MISSING" else INCONSISTENT, code,
                        f"checkpoint {cid}: {text}", doc)
    if signed_log is not None:
        log_why = emission_log.problem(ev.receipts.get(emission_log.LEAVES_KEY), signed_log,
                                       roots)
        if log_why is not None:
            return _verdict(ev, INCONSISTENT, "EMISSION_LOG_MISMATCH",
                            f"checkpoint {cid}: {log_why}", doc)
    if roots is None and policy.require_receipt_roots:
        return _verdict(ev, PARTIAL, "NO_RECEIPT_ROOTS",
                        f"checkpoint {cid} predates Merkle receipts: its manifest signs no "
                        "receipt root, and receipts are required", doc)
    lateness = int(doc.get("lateness_ms", 0))
    w_global = _closing_ms(wm)
    for rec in ev.receipts.get("epochs", []):
        end = rec.get("results", {}).get("max_window_end")
        if end is not None and int(end) + lateness > w_global:
            return _verdict(ev, INCONSISTENT, "RECEIPT_FOR_OPEN_WINDOW",
                            f"checkpoint {cid}: epoch {rec.get('epoch')} emitted a window ending "
                            f"at {end}, which watermark {w_global} has not closed", doc)
    if policy.pipeline is not None and doc["pipeline"] != policy.pipeline:
        return _verdict(ev, INCONSISTENT, "OTHER_PIPELINE",
                        f"checkpoint {cid} belongs to pipeline {doc['pipeline']!r}, "
                        f"not {policy.pipeline!r}", doc)
    if policy.fingerprint is not None and doc["fingerprint"] != policy.fingerprint:
        return _verdict(ev, INCONSISTENT, "FINGERPRINT_MISMATCH",
                        f"checkpoint {cid} was written by a different pipeline definition "
                        "(window, aggregates, source or watermark changed)", doc)
    if parent is not None and signed_log is not None:
        log_why = emission_log.extends(ev.receipts.get(emission_log.LEAVES_KEY),
                                       parent.get(emission_log.LOG_FIELD))
        if log_why is not None:
            return _verdict(ev, INCONSISTENT, "EMISSION_LOG_REWRITTEN",
                            f"checkpoint {cid}: {log_why}", doc)
    if parent is not None:
        problem = _regression(doc, parent)
        if problem is not None:
            code, text = problem
            return _verdict(ev, INCONSISTENT, code, f"checkpoint {cid}: {text}", doc)
    if policy.max_age_ms is not None and policy.now_ms is not None:
        age = policy.now_ms - int(doc.get("created_ms", 0))
        if age > policy.max_age_ms:
            return _verdict(ev, INCONSISTENT, "STALE",
                            f"checkpoint {cid} is {age} ms old, over the limit of "
                            f"{policy.max_age_ms} ms", doc)
    return _verdict(ev, ATOMIC, "OK", f"checkpoint {cid} is complete and verified", doc)


_SIGNATURE_MESSAGES = {
    "UNSIGNED_WITH_KEY": "is unsigned (sha256) but SEALSTREAM_CHECKPOINT_KEY is set",
    "SIGNED_WITHOUT_KEY": "is signed (hmac-sha256) but SEALSTREAM_CHECKPOINT_KEY is not set",
    "SIGNATURE_MISMATCH": "signature does not verify (wrong key or altered manifest)",
    "UNKNOWN_SIGNATURE_ALG": "uses an unknown signature algorithm",
    "NO_SIGNATURE": "has a malformed signature",
    **signing.MESSAGES,
}


def _signature_verdict(ev: Evidence, cid: int, code: str, doc: Mapping[str, Any]) -> Verdict:
    verdict = PARTIAL if code == "NO_SIGNATURE" else INCONSISTENT
    return _verdict(ev, verdict, code, f"checkpoint {cid}: {_SIGNATURE_MESSAGES[code]}", doc)


#: sealstream.watermark.POS_INF (not imported: the guard stays free of numpy/polars)
_POS_INF = 2**62


def _closing_ms(wm: Mapping[str, Any]) -> int:
    """The watermark that decides which windows are closed: the global one, or the
    ``closed_ms`` an end-of-input flush left (docs/semantics.md), when higher."""
    closed = wm.get("closed_ms")
    return int(wm["global_ms"]) if closed is None else max(int(wm["global_ms"]), int(closed))


def _regression(doc: Mapping[str, Any], parent: Mapping[str, Any]) -> tuple[str, str] | None:
    """A watermark or position lower than the parent's. After an end-of-input flush
    (the child has ``closed_ms``) the watermark goes back to what the data reached:
    the closing watermark never decreases, and a partition the parent had at +inf
    (ended) may be finite again."""
    try:
        pw = _closing_ms(parent["watermark"])
        ppos = {p["partition"]: int(p["next_offset"]) for p in parent["positions"]}
        pwm = [int(x) for x in parent["watermark"].get("partition_ms", [])]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a malformed parent is judged on its own, not used as a yardstick
    w = _closing_ms(doc["watermark"])
    reopened = "closed_ms" in doc["watermark"]
    pos = {p["partition"]: int(p["next_offset"]) for p in doc["positions"]}
    if w < pw and not (reopened and pw >= _POS_INF):
        return "WATERMARK_REGRESSION", f"watermark {w} is lower than its parent's {pw}"
    for i, (a, b) in enumerate(zip(doc["watermark"].get("partition_ms", []), pwm, strict=False)):
        if int(a) < int(b) and not (reopened and b >= _POS_INF):
            return "WATERMARK_REGRESSION", (
                f"partition {i} watermark {a} is lower than its parent's {b}"
            )
    for name, off in sorted(ppos.items()):
        if name in pos and pos[name] < off:
            return "POSITION_REGRESSION", (
                f"position {pos[name]} of partition {name!r} is lower than its parent's {off}"
            )
    # where a reader resumes (before the oldest buffered chunk) only moves forward too
    presume = {p["partition"]: _resume_offset(p) for p in parent["positions"]}
    for p in doc["positions"]:
        now, before = _resume_offset(p), presume.get(p["partition"])
        if now is not None and before is not None and now < before:
            return "POSITION_REGRESSION", (
                f"resume position {now} of partition {p['partition']!r} is lower than its "
                f"parent's {before}"
            )
    return None


def _resume_offset(position: Mapping[str, Any]) -> int | None:
    resume = position.get("resume")
    if not isinstance(resume, Mapping) or isinstance(resume.get("offset"), bool):
        return None
    try:
        return int(resume["offset"])
    except (KeyError, TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- rebuildable
#: Components a resume can do without, rebuilding them, when everything else verifies
#: (the fourth decision rule: watermark and state are a coherent pair; only secondary
#: state is missing or damaged):
#:
#: * ``suppress``: the outputs still to suppress after a fall-back; rebuilt by
#:   reading every committed output's identity back from the sinks;
#: * ``receipt_ids``: the epoch's sorted result ids (the leaves of its Merkle
#:   receipt); a resume does not read them (the signed root stays in the manifest),
#:   only inclusion proofs of that epoch do.
REBUILDABLE = ("suppress", "receipt_ids")
REBUILDABLE_REASON = "REBUILDABLE_COMPONENT"
_DAMAGE_REASONS = ("FILE_MISSING", "FILE_TRUNCATED", "HASH_MISMATCH", "STATE_SCHEMA",
                   "DECRYPTION_FAILED")


def judge_resumable(ev: Evidence, parent: Mapping[str, Any] | None, policy: Policy) -> Verdict:
    """:func:`judge`, except that a checkpoint whose only problems are missing or
    damaged :data:`REBUILDABLE` components is ``PARTIAL_CHECKPOINT_REJECT`` with reason
    ``REBUILDABLE_COMPONENT`` and ``rebuild`` naming them (recovery resumes from it and
    rebuilds them). Everything else, the signature included, must verify: the
    checkpoint is judged again as if those files were intact."""
    v = judge(ev, parent, policy)
    doc = v.manifest
    if v.ok or doc is None or v.reason not in _DAMAGE_REASONS:
        return v
    files = doc.get("files")
    if not isinstance(files, dict):
        return v
    facts = dict(ev.files)
    damaged: list[str] = []
    for role in REBUILDABLE:
        entry = files.get(role)
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            continue
        rel = entry["path"]
        fact = facts.get(rel, FileFact(False))
        if fact.exists and fact.problem is None and fact.sha256 == entry.get("sha256") \
                and fact.size == entry.get("bytes"):
            continue
        if fact.problem is not None and fact.problem[0] == "NOT_A_REGULAR_FILE":
            return v
        damaged.append(role)
        facts[rel] = FileFact(True, int(entry.get("bytes", 0)), str(entry.get("sha256")))
    if not damaged:
        return v
    paths = {str(files[r]["path"]) for r in damaged}
    schema_error = ev.schema_error
    if schema_error is not None and schema_error.split(":", 1)[0] in paths:
        schema_error = None
    again = judge(replace(ev, files=facts, schema_error=schema_error), parent, policy)
    if not again.ok:
        return v
    cid = ev.checkpoint_id
    what = ", ".join(damaged)
    return replace(
        _verdict(ev, PARTIAL, REBUILDABLE_REASON,
                 f"checkpoint {cid}: only its rebuildable {what} file is missing or damaged "
                 f"({v.reason}); watermark and state verify: resume from it and rebuild "
                 f"{what}", doc),
        rebuild=tuple(damaged),
    )
