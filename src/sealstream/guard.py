"""The window-level guard: the window-commit-invariants API over sealstream checkpoints.

Code written against the window-commit-invariants specification runs unchanged::

    from sealstream.guard import ResumePolicy, WindowCheckpointGuard, window_checkpoint

    cp = window_checkpoint("ckpt", key="u1", start_ms=0, end_ms=60_000)  # a real checkpoint
    m = WindowCheckpointGuard.evaluate_checkpoint(
        cp, ResumePolicy(require_output_emission_receipt=True,
                         max_checkpoint_age_sec=3600, current_epoch=time.time()))
    print(m.verdict, m.directive)   # CheckpointVerdict.ATOMIC_CHECKPOINT PROCEED: ...

It is a thin layer over the pure checkpoint guard (:mod:`sealstream.checkpoint.guard`),
not a second one. Where it is stricter than the specification's sketch:

* the ``atomicity_signature`` is *verified*, with the store's key
  (``SEALSTREAM_CHECKPOINT_KEY``, or ``key=``), not merely checked for presence;
* a watermark or epoch that does not cohere with the state hash gives
  ``INCONSISTENT_STATE`` (the window's fields are recomputed from the verified
  checkpoint and compared);
* a missing receipt gives ``PARTIAL_CHECKPOINT_REJECT`` when the policy requires one;
* a checkpoint older than ``max_checkpoint_age_sec`` is refused (``INCONSISTENT_STATE``,
  reason ``STALE``, as ``checkpoints verify --max-age`` says);
* the ``manifest_digest`` covers the receipt too;
* the directive is a runbook line: ``PROCEED: resume window W at watermark T``,
  ``PROCEED WITH REBUILD: ...``, ``FALL BACK: ... to checkpoint N``, ``REJECT: ...``.

Units: ``watermark_epoch`` is event time in milliseconds (sealstream's watermark);
``checkpoint_epoch`` and ``current_epoch`` are wall-clock seconds since the Unix
epoch; the *emission epoch* inside a receipt is the number of the epoch (the output
between two checkpoints) in which the window's result was committed.

A :class:`WindowCheckpoint` built by hand (no ``source``) is judged on its own fields:
its ``atomicity_signature`` must be :func:`sign_window` of them under the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import polars as pl

from sealstream.checkpoint import guard as _guard
from sealstream.checkpoint import receipts as _receipts
from sealstream.checkpoint.manifest import (
    ALG_HMAC,
    ALG_PLAIN,
    checkpoint_key,
    path_problem,
    signature_ok,
)
from sealstream.checkpoint.stores import CheckpointStore, LocalCheckpointStore
from sealstream.errors import CheckpointError, SpecError
from sealstream.sources._base import KEY, KEY_IS_INT
from sealstream.state import incremental
from sealstream.watermark import json_ms
from sealstream.windows.aggregates import WEND, WSTART

__all__ = [
    "CheckpointManifest",
    "CheckpointVerdict",
    "ResumePolicy",
    "WindowCheckpoint",
    "WindowCheckpointGuard",
    "sign_window",
    "window_checkpoint",
]

_FROM_ENV: Any = object()


class CheckpointVerdict(Enum):
    """The three verdicts (their values are the strings ``checkpoints verify`` prints)."""

    ATOMIC_CHECKPOINT = _guard.ATOMIC
    PARTIAL_CHECKPOINT_REJECT = _guard.PARTIAL
    INCONSISTENT_STATE = _guard.INCONSISTENT


@dataclass(frozen=True)
class CheckpointSource:
    """Where a :class:`WindowCheckpoint` was read: the guard re-reads and verifies it."""

    store: CheckpointStore
    checkpoint_id: int
    start_ms: int
    end_ms: int
    key: str


@dataclass(frozen=True)
class WindowCheckpoint:
    """One window as a checkpoint records it (the specification's fields).

    ``window_id`` is the result id ``key|key_is_int|window_start|window_end``;
    ``aggregation_state_hash`` the SHA-256 of the window's state row (or of its
    absence, once emitted) bound to the watermark and the state file's hash;
    ``output_emission_receipt`` the compact JSON of an inclusion proof that the result
    was committed (None while the window is open); ``atomicity_signature`` the
    checkpoint manifest's signature, ``alg:hex``."""

    window_id: str
    watermark_epoch: float
    aggregation_state_hash: str
    output_emission_receipt: str | None
    atomicity_signature: str
    checkpoint_epoch: float
    source: CheckpointSource | None = field(default=None, compare=False)
    #: what the view found out while building it (e.g. a checkpoint without roots)
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: "open" (in the state), "emitted" (a receipt found), "absent" (neither: never seen,
    #: or emitted before every retained checkpoint), "unknown" (state unreadable), or
    #: "" for a hand-built one
    status: str = field(default="", compare=False)


@dataclass(frozen=True)
class ResumePolicy:
    """What the successor requires. ``max_checkpoint_age_sec`` and ``current_epoch`` are
    wall-clock seconds."""

    require_output_emission_receipt: bool
    max_checkpoint_age_sec: float
    current_epoch: float


@dataclass(frozen=True)
class CheckpointManifest:
    """The guard's decision for one window checkpoint."""

    verdict: CheckpointVerdict
    resume_watermark: float | None
    directive: str
    manifest_digest: str
    reason: str = ""
    checkpoint_id: int | None = None
    #: the checkpoint to fall back to (FALL BACK / REJECT), when one verifies
    fallback_id: int | None = None
    rebuild: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "resume_watermark": self.resume_watermark,
            "directive": self.directive,
            "manifest_digest": self.manifest_digest,
            "checkpoint_id": self.checkpoint_id,
            "fallback_id": self.fallback_id,
            "rebuild": list(self.rebuild),
        }


# --------------------------------------------------------------------------- signing
def _window_body(cp: WindowCheckpoint) -> bytes:
    return json.dumps({
        "window": cp.window_id, "watermark": cp.watermark_epoch,
        "aggregation": cp.aggregation_state_hash, "receipt": cp.output_emission_receipt,
        "checkpoint_epoch": cp.checkpoint_epoch,
    }, sort_keys=True, separators=(",", ":")).encode()


def sign_window(cp: WindowCheckpoint, key: bytes | None) -> str:
    """The ``atomicity_signature`` of a hand-built window checkpoint: ``hmac-sha256:HEX``
    over all its other fields under ``key`` (``sha256:HEX`` without a key, which detects
    corruption only)."""
    data = _window_body(cp)
    if key is None:
        return f"{ALG_PLAIN}:{hashlib.sha256(data).hexdigest()}"
    return f"{ALG_HMAC}:{hmac.new(key, data, hashlib.sha256).hexdigest()}"


def _sig_text(doc: Mapping[str, Any]) -> str:
    sig = doc.get("signature")
    if not isinstance(sig, dict):
        return ""
    return f"{sig.get('alg')}:{sig.get('value')}"


# --------------------------------------------------------------------------- the view
def _num(value: Any) -> float:
    value = json_ms(int(value)) if isinstance(value, int) else value
    if value == "-inf":
        return -math.inf
    if value == "+inf":
        return math.inf
    return float(value)


def _fmt(wm: float) -> str:
    return ("+inf" if wm > 0 else "-inf") if math.isinf(wm) else f"{wm:.0f}"


def _state_hash(window_id: str, row: str | None, watermark: Any, state_sha: Any) -> str:
    body = {"window": window_id, "row": row, "watermark": watermark, "state_sha256": state_sha}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _open_store(store: CheckpointStore | str | Path) -> CheckpointStore:
    if isinstance(store, CheckpointStore):
        return store
    path = Path(store)
    if not path.is_dir():
        raise SpecError(f"checkpoint directory {path} does not exist")
    return LocalCheckpointStore(path)


def _newest(store: CheckpointStore) -> int:
    ids = [c for c in store.ids() if store.has_manifest(c)]
    if not ids:
        raise SpecError(f"no published checkpoint in {store.location}")
    return ids[-1]


def _trusted(doc: Mapping[str, Any], cid: int, key: bytes | None) -> str | None:
    """Why the files ``doc`` names must not be read (None: they may): its signature does
    not verify under ``key``, or it names a file no writer produces."""
    ok, code = signature_ok(dict(doc), key)
    if not ok:
        return f"{code}: checkpoint {cid}'s manifest does not verify; its files were not read"
    files = doc.get("files")
    if not isinstance(files, dict):
        return f"MANIFEST_INCOMPLETE: checkpoint {cid} names no files"
    for role, entry in files.items():
        rel = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(rel, str) or path_problem(cid, str(role), rel) is not None:
            return f"FILE_PATH_INVALID: checkpoint {cid} names an unexpected {role} file"
    return None


def _find_receipt(store: CheckpointStore, upto: int, pipeline: Any, window_id: str,
                  key: bytes | None) -> tuple[str | None, list[str]]:
    """The proof (compact JSON) of ``window_id`` from the newest retained checkpoint
    at or before ``upto`` whose receipt ids hold it; notes on what could not be read."""
    notes: list[str] = []
    for cid in reversed([c for c in store.ids() if c <= upto]):
        doc = store.read_manifest(cid)
        if not isinstance(doc, dict):
            continue
        roots = doc.get(_receipts.ROOTS_FIELD)
        files = doc.get("files") if isinstance(doc.get("files"), dict) else {}
        assert isinstance(files, dict)
        if not isinstance(roots, dict):
            notes.append(f"NO_RECEIPT_ROOTS: checkpoint {cid} predates Merkle receipts")
            continue
        untrusted = _trusted(doc, cid, key)
        if untrusted is not None:
            notes.append(untrusted)
            continue
        entry = files.get("receipt_ids")
        if not isinstance(entry, dict):
            continue  # an epoch without results
        try:
            data = store.read(str(entry["path"]))
            if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
                raise ValueError("does not match its SHA-256")
            ids = _receipts.decode_ids(data)
        except (OSError, ValueError) as exc:
            notes.append(f"RECEIPT_IDS_UNREADABLE: checkpoint {cid}: {exc}")
            continue
        hit = ids.to_frame().with_row_index("i").filter(pl.col("id") == window_id)
        if hit.height:
            index = int(hit["i"][0])
            tree = [s.to_list() for s in _receipts.levels(ids)]
            proof = _receipts.make_proof(str(pipeline), cid, int(roots["epoch"]), window_id,
                                         index, ids.len(), _receipts.path(tree, index))
            return _receipts.proof_bytes(proof).decode(), notes
    return None, notes


def window_checkpoint(store: CheckpointStore | str | Path, *, key: str, start_ms: int,
                      end_ms: int, checkpoint_id: int | None = None,
                      signing_key: bytes | None | Any = _FROM_ENV) -> WindowCheckpoint:
    """The :class:`WindowCheckpoint` of window ``[start_ms, end_ms)`` of ``key`` in a real
    checkpoint (default: the newest published one): open (its state row's hash and the
    watermark) or emitted (its receipt: an inclusion proof from the checkpoint whose epoch
    committed it). Reads what it can; :meth:`WindowCheckpointGuard.evaluate_checkpoint`
    verifies it. A numeric ``key`` matches an integer key, else the string.

    Nothing the manifest names is read unless its signature verifies under
    ``signing_key`` (default: ``SEALSTREAM_CHECKPOINT_KEY``) and every name is one a
    writer produces; each file's SHA-256 is checked before it is parsed."""
    sk: bytes | None = checkpoint_key() if signing_key is _FROM_ENV else signing_key
    st = _open_store(store)
    cid = _newest(st) if checkpoint_id is None else checkpoint_id
    doc = st.read_manifest(cid)
    if not isinstance(doc, dict):
        raise CheckpointError(f"checkpoint {cid} in {st.location} has no readable manifest")
    wm = doc.get("watermark", {}).get("global_ms") if isinstance(doc.get("watermark"),
                                                                  dict) else None
    notes: list[str] = []
    row_json: str | None = None
    kint = "false"
    try:
        untrusted = _trusted(doc, cid, sk)
        if untrusted is not None:
            raise ValueError(untrusted)
        state, _meta = incremental.load_chain(doc["files"], st.read)
        rows = state.filter((pl.col(KEY) == key) & (pl.col(WSTART) == start_ms)
                            & (pl.col(WEND) == end_ms))
        if rows.height > 1:
            rows = rows.filter(pl.col(KEY_IS_INT) == key.lstrip("-").isdigit())
        if rows.height:
            kint = "true" if bool(rows[KEY_IS_INT][0]) else "false"
            row_json = rows.head(1).write_json()
        elif key.lstrip("-").isdigit():
            kint = "true"
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError) as exc:
        notes.append(f"STATE_UNREADABLE: {exc}")
        row_json = "<unreadable>"
    window_id = f"{key}|{kint}|{start_ms}|{end_ms}"
    receipt = None
    if row_json is None:
        receipt, more = _find_receipt(st, cid, doc.get("pipeline"), window_id, sk)
        notes.extend(more)
    state_sha = doc.get("state", {}).get("sha256") if isinstance(doc.get("state"),
                                                                   dict) else None
    return WindowCheckpoint(
        window_id=window_id,
        watermark_epoch=_num(wm) if wm is not None else math.nan,
        aggregation_state_hash=_state_hash(window_id, row_json, wm, state_sha),
        output_emission_receipt=receipt,
        atomicity_signature=_sig_text(doc),
        checkpoint_epoch=float(doc.get("created_ms", 0)) / 1000,
        source=CheckpointSource(st, cid, start_ms, end_ms, key),
        notes=tuple(notes),
        status=("unknown" if row_json == "<unreadable>" else "open" if row_json is not None
                else "emitted" if receipt is not None else "absent"),
    )


# --------------------------------------------------------------------------- the guard
class WindowCheckpointGuard:
    """Evaluates a :class:`WindowCheckpoint` against a :class:`ResumePolicy`."""

    @classmethod
    def evaluate_checkpoint(cls, cp: WindowCheckpoint, policy: ResumePolicy, *,
                            key: bytes | None | Any = _FROM_ENV) -> CheckpointManifest:
        """The verdict, the watermark to resume at, a runbook directive and a digest
        over all of it (receipt included). ``key``: the store's signing key (default:
        ``SEALSTREAM_CHECKPOINT_KEY``). Never raises for a bad checkpoint."""
        k: bytes | None = checkpoint_key() if key is _FROM_ENV else key
        return _Evaluation(cp, policy, k).run()


class _Evaluation:
    def __init__(self, cp: WindowCheckpoint, policy: ResumePolicy, key: bytes | None) -> None:
        self.cp, self.policy, self.key = cp, policy, key
        self.cid = cp.source.checkpoint_id if cp.source is not None else None
        self.what = (f"window {cp.window_id}" + (f" of checkpoint {self.cid}"
                                                  if self.cid is not None else ""))

    def _manifest(self, verdict: CheckpointVerdict, reason: str, directive: str,
                  resume: float | None = None, fallback: int | None = None,
                  rebuild: tuple[str, ...] = ()) -> CheckpointManifest:
        cp = self.cp
        body = {"verdict": verdict.value, "reason": reason, "window": cp.window_id,
                "watermark": str(cp.watermark_epoch), "aggregation": cp.aggregation_state_hash,
                "receipt": cp.output_emission_receipt, "atomicity": cp.atomicity_signature,
                "checkpoint_epoch": str(cp.checkpoint_epoch), "checkpoint": self.cid,
                "resume_watermark": None if resume is None else str(resume),
                "rebuild": list(rebuild)}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return CheckpointManifest(verdict, resume, " ".join(directive.split()), digest,
                                  reason, self.cid, fallback, rebuild)

    def _fallback(self) -> tuple[int | None, str]:
        src = self.cp.source
        if src is None:
            return None, "the previous atomic checkpoint"
        pol = _guard.Policy(key=self.key)
        for cid in reversed([c for c in src.store.ids() if c < src.checkpoint_id]):
            v = _guard.judge(src.store.evidence(cid, self.key),
                             src.store.verified_parent(cid, self.key), pol)
            if v.ok:
                return cid, f"checkpoint {cid} (watermark {v.watermark_ms})"
        return None, "no older checkpoint verifies: start from the beginning"

    def _refuse(self, verdict: CheckpointVerdict, reason: str, why: str) -> CheckpointManifest:
        fb, where = self._fallback()
        if verdict is CheckpointVerdict.PARTIAL_CHECKPOINT_REJECT:
            text = f"FALL BACK: {self.what} is partial ({reason}: {why}); resume from {where}"
        else:
            text = (f"REJECT: {self.what} is inconsistent ({reason}: {why}); re-process from "
                    f"the last known-good watermark: {where}")
        if fb is None and verdict is CheckpointVerdict.PARTIAL_CHECKPOINT_REJECT \
                and self.cp.source is not None:
            text = f"FALL BACK: {self.what} is partial ({reason}: {why}); {where}"
        return self._manifest(verdict, reason, text, fallback=fb)

    def run(self) -> CheckpointManifest:
        cp, pol = self.cp, self.policy
        P, INC = CheckpointVerdict.PARTIAL_CHECKPOINT_REJECT, CheckpointVerdict.INCONSISTENT_STATE
        # ---- presence (decision rule 2)
        if not cp.atomicity_signature:
            return self._refuse(P, "NO_SIGNATURE", "no atomicity signature")
        if not cp.aggregation_state_hash:
            return self._refuse(P, "NO_STATE_HASH", "no aggregation state hash")
        if cp.watermark_epoch is None or math.isnan(cp.watermark_epoch):
            return self._refuse(P, "NO_WATERMARK", "no watermark epoch")
        if pol.require_output_emission_receipt and not cp.output_emission_receipt:
            return self._refuse(P, "NO_RECEIPT", "no output emission receipt, and the "
                                "policy requires one (the window is open or its receipt "
                                "is not retained)")
        rebuild: tuple[str, ...] = ()
        # ---- the checkpoint, then the window's coherence with it (decision rule 3)
        if cp.source is not None:
            src = cp.source
            v = _guard.judge_resumable(src.store.evidence(src.checkpoint_id, self.key),
                                       src.store.verified_parent(src.checkpoint_id, self.key),
                                       _guard.Policy(key=self.key))
            if not v.resumable:
                return self._refuse(CheckpointVerdict(v.verdict), v.reason, v.message)
            rebuild = v.rebuild
            assert v.manifest is not None
            if cp.atomicity_signature != _sig_text(v.manifest):
                return self._refuse(INC, "SIGNATURE_MISMATCH", "the atomicity signature is "
                                    "not the checkpoint's")
            fresh = window_checkpoint(src.store, key=src.key, start_ms=src.start_ms,
                                      end_ms=src.end_ms, checkpoint_id=src.checkpoint_id,
                                      signing_key=self.key)
            if fresh.watermark_epoch != cp.watermark_epoch:
                return self._refuse(INC, "WATERMARK_INCOHERENT",
                                    f"watermark {cp.watermark_epoch} is not the checkpoint's "
                                    f"{fresh.watermark_epoch}")
            if fresh.aggregation_state_hash != cp.aggregation_state_hash:
                return self._refuse(INC, "STATE_HASH_MISMATCH", "the aggregation state hash "
                                    "does not match the window's state in the checkpoint")
            if fresh.checkpoint_epoch != cp.checkpoint_epoch:
                return self._refuse(INC, "EPOCH_INCOHERENT",
                                    f"checkpoint epoch {cp.checkpoint_epoch} is not the "
                                    f"checkpoint's {fresh.checkpoint_epoch}")
            if cp.output_emission_receipt is not None:
                problem = self._receipt_problem(src.store)
                if problem is not None:
                    return self._refuse(INC, *problem)
                if fresh.output_emission_receipt is None:
                    return self._refuse(INC, "RECEIPT_FOR_OPEN_WINDOW", "a receipt for a "
                                        "window the checkpoint holds open")
        else:
            ok = hmac.compare_digest(cp.atomicity_signature, sign_window(cp, self.key))
            if not ok:
                return self._refuse(INC, "SIGNATURE_MISMATCH", "the atomicity signature does "
                                    "not verify over the window's fields (wrong key, or a "
                                    "field changed after signing)")
            parts = cp.window_id.split("|")
            if cp.output_emission_receipt and len(parts) >= 2 and parts[-1].lstrip(
                    "-").isdigit() and float(parts[-1]) > cp.watermark_epoch:
                return self._refuse(INC, "RECEIPT_FOR_OPEN_WINDOW",
                                    f"a receipt for a window ending at {parts[-1]}, which "
                                    f"watermark {cp.watermark_epoch} has not closed")
        # ---- freshness
        age = pol.current_epoch - cp.checkpoint_epoch
        if age > pol.max_checkpoint_age_sec:
            return self._refuse(INC, "STALE", f"the checkpoint is {age:.0f} s old, over "
                                f"max_checkpoint_age_sec {pol.max_checkpoint_age_sec:g}")
        wm = cp.watermark_epoch
        done = (" (its result was emitted: do not emit it again)"
                if cp.output_emission_receipt else
                " (the checkpoint holds no state and no retained receipt for it: never seen, "
                "or emitted before every retained checkpoint)" if cp.status == "absent"
                else "")
        if rebuild:
            return self._manifest(
                P, _guard.REBUILDABLE_REASON,
                f"PROCEED WITH REBUILD: resume window {cp.window_id} at watermark {_fmt(wm)} "
                f"from checkpoint {self.cid}, rebuilding its {', '.join(rebuild)}{done}",
                resume=wm, rebuild=rebuild)
        return self._manifest(CheckpointVerdict.ATOMIC_CHECKPOINT, "OK",
                              f"PROCEED: resume window {cp.window_id} at watermark {_fmt(wm)}"
                              f"{done}", resume=wm)

    def _receipt_problem(self, store: CheckpointStore) -> tuple[str, str] | None:
        try:
            proof = json.loads(self.cp.output_emission_receipt or "")
            pcid = int(proof["checkpoint"])
        except (ValueError, KeyError, TypeError):
            return "RECEIPT_MALFORMED", "the receipt is not an inclusion proof"
        if proof.get("id") != self.cp.window_id:
            return "RECEIPT_MISMATCH", "the receipt proves another window"
        doc = store.read_manifest(pcid) if pcid in store.ids() else None
        if doc is None:
            return "RECEIPT_NOT_RETAINED", f"checkpoint {pcid}, which signs it, is gone"
        check = _receipts.verify_proof(proof, doc, self.key)
        if not check.ok:
            return check.reason, check.message
        ok, code = signature_ok(doc, self.key)
        return None if ok else (code, "the receipt's checkpoint does not verify")
